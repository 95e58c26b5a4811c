"""Every backend x case x mode as a pytest-benchmark benchmark whose stored numbers are device time.

How the device time gets into pytest-benchmark: the harness times the work itself with CUDA
events (``harness.perf.timing``: warm-up, L2 flush, input rotation, median over repetitions), then
``record_in_benchmark`` replays the per-repetition device times through ``benchmark.pedantic``
with the timer ``harness.perf.timing.device_time_replay`` (set by the ``benchmark`` marker below): the
durations pytest-benchmark stores, compares (``--benchmark-compare``) and gates on
(``--benchmark-compare-fail=median:5%``) are exactly the CUDA-event times. The saved JSON names
that timer in ``options.timer`` and carries TFLOP/s, bandwidth, memory, device, clocks and
versions in ``extra_info``.

A backend is verified against the FP64 oracle before it is timed: unsupported -> skipped with the
reason; failing -> the test fails and nothing is timed. An OOM is a result (skipped "OOM: ...").
A measurement that breaks a roofline rule fails the test and is kept out of the saved file.
"""

from __future__ import annotations

import warnings

import pytest

from harness.perf.roofline import IMPLAUSIBLE
from harness.perf.timing import MODES, device_time_replay, record_in_benchmark

pytestmark = [pytest.mark.gpu, pytest.mark.benchmark(timer=device_time_replay)]


@pytest.mark.parametrize("mode", MODES)
def test_attention(benchmark, bench_session, attn_adapter, attn_case, mode):
    session, case, adapter = bench_session, attn_case, attn_adapter
    rec = session.record(adapter, case)
    if rec["status"] == "unsupported":
        pytest.skip(f"unsupported: {rec['reason']}")
    if rec["status"] == "oom":
        pytest.skip(f"OOM: {rec['reason']}")
    if rec["status"] != "ok":
        pytest.fail(f"not timed: {rec['reason']}", pytrace=False)
    peaks = session.peaks(case.dtype)
    cell, timing = session.runner.time_mode(adapter, case, mode)
    rec["modes"][mode] = cell
    if cell["status"] == "unsupported":
        pytest.skip(f"unsupported: {cell['reason']}")
    if cell["status"] == "oom":
        pytest.skip(f"OOM: {cell['reason']}")
    if cell["status"] != "ok":
        pytest.fail(f"error while timing: {cell['reason']}", pytrace=False)
    key = (adapter.name, case.id)
    if key not in session.memory_done:
        session.memory_done.add(key)
        rec["memory"] = session.runner.measure_memory(adapter, case)

    benchmark.group = f"{case.id} {mode}"
    record_in_benchmark(benchmark, timing)
    env = session.env
    benchmark.extra_info.update(
        case=case.id, backend=adapter.name, mode=mode, clock=timing.clock, tflops=cell["tflops"], gbps=cell["gbps"],
        flops=cell["flops"], min_bytes=cell["bytes"], spread=cell["spread"], reps=timing.reps,
        flush_l2=timing.flush_l2, rotate=timing.rotate, cuda_graph=timing.cuda_graph, memory=rec["memory"],
        enqueue_ms=timing.enqueue_ms, launch_bound=timing.launch_bound, settle_ms=timing.settle_ms,
        unsteady=timing.unsteady,
        verified_on=rec["verify"].get("case"), device=env["device"], versions=env["versions"],
    )

    for why in (timing.launch_bound, timing.unsteady):  # in the warnings summary; the number is still stored
        if why:
            warnings.warn(f"{case.id} {adapter.name} {mode}: {why}", stacklevel=1)

    ms = {mode: cell["median_ms"]}
    if mode != "fwd":
        ms["fwd"] = session.runner.fwd_ms(adapter, case)
    from harness.perf import roofline

    flags = roofline.check(case, ms, peaks, timing.clock).get(mode)
    if flags:
        cell.update(status="implausible", flags=flags, reason=f"{IMPLAUSIBLE}: " + "; ".join(flags))
        benchmark.extra_info["flags"] = flags
        benchmark.has_error = True  # kept out of the saved JSON and shown as an error in the table
        pytest.fail(cell["reason"], pytrace=False)

