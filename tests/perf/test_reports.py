"""Reports: markdown cells say what each non-number is, the header says which clock, the JSON is
strict, and the plots draw a sweep."""

import json
import math

import pytest

from harness.perf import timing
from harness.perf.reports import group_of, markdown, write_json, write_reports


def rec(backend, seqlen, status="ok", modes=None, reason="", memory=None, d=64, causal=False):
    params = {"batch": 16384 // seqlen, "heads_q": 2048 // d, "heads_k": 2048 // d, "seqlen_q": seqlen,
              "seqlen_k": seqlen, "d": d, "d_v": d, "causal": causal, "window": [-1, -1], "softcap": 0.0,
              "dtype": "bf16", "varlen": None}
    case = f"B{params['batch']}-H{params['heads_q']}-S{seqlen}x{seqlen}-D{d}{'-causal' if causal else ''}-bf16"
    return {"case": case, "family": "softmax", "dtype": "bf16", "params": params, "backend": backend,
            "status": status, "reason": reason, "modes": modes or {}, "memory": memory, "verify": {},
            "baseline": "sdpa_flash"}


def ok(ms, tflops, speedup=1.0):
    return {"status": "ok", "median_ms": ms, "spread": 0.02, "tflops": tflops, "speedup": speedup}


def sweep(clock="cuda-events"):
    results = []
    for s in (512, 1024, 2048):
        mem = {"fwd_peak_mib": 10.0 * s / 512, "bwd_peak_mib": 20.0, "saved_mib": 1.0, "peak_mib": 20.0 * s / 512}
        results.append(rec("sdpa_flash", s, modes={m: ok(1.0, 300.0 + s / 100) for m in markdown.MODES}, memory=mem))
        results.append(rec("eager", s, modes={"fwd": ok(2.0, 40.0, 0.5), "bwd": {"status": "oom", "reason":
                            "OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB"},
                            "fwd+bwd": {"status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}}))
        results.append(rec("mykernel", s, status="not-timed", reason="failed correctness: out: error 3.1e-2 > allowed 4e-3"))
        results.append(rec("flex", s, status="unsupported", reason="flex fell back to eager: graph break"))
    return {"schema": "attn-harness-bench", "schema_version": 1, "created": "now", "command": "python -m harness bench",
            "device": {"name": "NVIDIA H100 80GB HBM3", "capability": "sm90", "sm_count": 132, "memory_gib": 79.1,
                       "clocks": {"source": "nvidia-smi", "sm_mhz": "1980"}},
            "versions": {"torch": "2.11.0"}, "settings": {"clock": clock, "modes": list(markdown.MODES),
                                                          "baseline": ["sdpa_flash"], "seed": 0},
            "peaks": {"matmul_tflops": {"bf16": 780.0}, "copy_gbps": 2900.0, "measured_at": "x"}, "results": results}


def test_cells_say_what_they_are():
    md = markdown.render(sweep())
    assert "OOM: OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB" in md
    assert "not timed: failed correctness: out: error 3.1e-2 > allowed 4e-3" in md
    assert "unsupported: flex fell back to eager: graph break" in md
    assert "**device time**" in md and "HOST TIME" not in md
    assert "sm_mhz 1980" in md
    assert "0.50x" in md  # eager's fwd speedup


def test_host_clock_is_labelled_everywhere():
    md = markdown.render(sweep(clock="host"))
    assert "HOST TIME" in md and "fwd ms (host time)" in md


def test_sweep_summary_has_one_column_per_seqlen():
    lines = markdown.summary_tables(sweep())
    head = next(i for i, line in enumerate(lines) if line.startswith("### TFLOP/s, hd64 H32 non-causal bf16, fwd"))
    assert lines[head + 2] == "| backend | 512 | 1024 | 2048 |"
    assert any(line.startswith("| eager | 40.0 | 40.0 | 40.0 |") for line in lines)
    assert group_of(sweep()["results"][0]) == ("hd64 H32 non-causal bf16", 512)


def test_json_is_strict(tmp_path):
    p = write_json({"a": math.inf, "b": [math.nan, 1.0], "c": (1, 2)}, tmp_path / "x.json")
    assert json.loads(p.read_text()) == {"a": "inf", "b": ["nan", 1.0], "c": [1, 2]}


def test_reports_with_plots(tmp_path):
    pytest.importorskip("matplotlib")
    paths = write_reports(sweep(), tmp_path)
    names = {p.name for p in paths.values()}
    assert {"results.json", "report.md", "tflops_vs_seqlen.png", "bars_fwd.png", "memory_vs_seqlen.png"} <= names
    assert all(p.stat().st_size > 0 for p in paths.values())
    assert "![memory_vs_seqlen](memory_vs_seqlen.png)" in (tmp_path / "report.md").read_text()


def test_launch_bound_numbers_are_marked_not_plotted_and_get_no_speedup():
    # T=1k-4k linear attention on an H100: FLA's fwd+bwd took the same 1.5 ms at 1k, 2k and 4k
    # (the host's launches, not the kernels): such a number must not read as device speed
    from harness.perf.bench import add_speedups
    from harness.perf.reports.plots import _tflops

    why = "launch-bound: the host took 1.5 ms to enqueue each repetition, against 1.55 ms measured"
    base = rec("sdpa_flash", 512, modes={"fwd": {**ok(1.55, 10.0), "launch_bound": why}})
    mine = rec("mykernel", 512, modes={"fwd": ok(0.5, 31.0)})
    add_speedups([base, mine], ["sdpa_flash"])
    assert mine["modes"]["fwd"]["speedup"] is None and mine["modes"]["fwd"]["speedup_launch_bound"]
    notes = []
    cell = base["modes"]["fwd"]
    assert markdown.cell_text(cell, "ms", notes) == "1.55 ±1% launch-bound [1]" and notes == [why]
    assert markdown.cell_text(cell, "tflops").startswith(">=")
    assert markdown.cell_text(mine["modes"]["fwd"], "speedup") == "launch-bound"
    assert _tflops("fwd")(base) is None and _tflops("fwd")(mine) == 31.0
    data = sweep()
    data["results"] += [base, mine]
    md = markdown.render(data)
    assert "- launch-bound: " in md and why in md


def test_unsteady_cells_keep_their_number_with_a_note():
    # settling that ran out of time before two windows agreed: the number is shown, with why
    t = timing.Timing(mode="fwd", clock=timing.CLOCK_DEVICE, times_ms=[0.40, 0.41, 0.40],
                      settle_ms=[0.47, 0.46, 0.40])
    assert t.unsteady and "0.46 and 0.4 ms" in t.unsteady
    assert timing.Timing(mode="fwd", clock=timing.CLOCK_DEVICE, times_ms=[0.4], settle_ms=[0.47, 0.401, 0.40]).unsteady is None
    assert timing.Timing(mode="fwd", clock=timing.CLOCK_DEVICE, times_ms=[0.4], settle_ms=[0.47]).unsteady is None
    cell = {**ok(0.40, 10.0), "unsteady": t.unsteady}
    notes = []
    assert markdown.cell_text(cell, "ms", notes) == "0.4 ±1% unsteady [1]" and notes == [t.unsteady]
    assert markdown.cell_text(cell, "tflops") == markdown.fmt_rate(10.0)
    assert t.to_dict()["unsteady"] == t.unsteady


def test_header_says_how_the_device_was_settled():
    base = {"clock": "cuda-events", "warmup_ms": 25, "target_ms": 100, "min_reps": 5, "max_reps": 200}
    words = markdown._clock_words({"settings": {**base, "settle": {"window_ms": 10.0, "min_ms": 100.0,
                                                                    "tol": 0.02, "max_ms": 400.0}}})
    assert "10 ms windows" in words and "within 2%" in words and "at most 400 ms" in words
    assert "settling off" in markdown._clock_words({"settings": {**base, "settle": {"max_ms": 0}}})
    assert "no settling windows" in markdown._clock_words({"settings": base})  # older reports
