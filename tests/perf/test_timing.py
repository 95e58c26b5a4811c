"""The timer: statistics, what each mode times, the CPU host clock, and the pytest-benchmark bridge.

GPU tests prove the stored numbers are device time: the median pytest-benchmark stores agrees with
a plain CUDA-event loop over the same work within 3% (work of >= 100 us).
"""

import dataclasses
import statistics
import time

import pytest
import torch

from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput, default_scale
from harness.adapters.eager import eager_attention
from harness.cases import SoftmaxCase, make_inputs
from harness.perf import timing

# host-clock measurements: run alone (the README's test command runs `-m timing` serially)
pytestmark = pytest.mark.timing

CASE = SoftmaxCase(1, 2, 2, 16, 16, 8)
FAST = timing.TimerOptions(warmup_ms=0.0, reps=4)


@pytest.fixture(autouse=True)
def one_thread():
    # Host timings of tiny ops on a shared 2-core machine are dominated by OpenMP threads
    # waiting for each other; one thread keeps these tests fast and stable.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Counting(SoftmaxAdapter):
    name = "counting"

    def __init__(self, differentiable=True):
        self.calls = 0
        self.differentiable = differentiable

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        self.calls += 1
        out, lse = eager_attention(q, k, v, causal=case.causal, softmax_scale=default_scale(case))
        return SoftmaxOutput(out, lse)


def skip_unless_enabled(benchmark):
    if not benchmark.enabled:
        pytest.skip("pytest-benchmark is disabled here (pytest-xdist or --benchmark-disable)")


def test_statistics_of_a_timing():
    t = timing.Timing(mode="fwd", clock=timing.CLOCK_HOST, times_ms=[1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_ms == 3.0
    assert t.quartiles() == (2.0, 4.0)
    assert t.spread == pytest.approx(2.0 / 3.0)
    d = t.to_dict()
    assert d["times_ms"] == [1.0, 2.0, 3.0, 4.0, 100.0] and d["reps"] == 5 and d["min_ms"] == 1.0


def test_cpu_timer_is_labelled_host_time():
    t = timing.time_callable(lambda: time.sleep(0.002), "cpu", options=FAST)
    assert t.clock == "host" and not t.is_device_time
    assert t.reps == 4 and t.median_ms >= 2.0


def test_backward_mode_times_no_forward():
    a = Counting()
    sets = timing.input_sets(CASE, 0, "cpu", 2)
    work = timing.Workload(a, CASE, sets, "bwd")
    work.prepare()
    assert a.calls == 2  # one forward per input set, built before timing
    grads = [work.call(i % 2) for i in range(5)]
    assert a.calls == 2  # the timed calls ran only the backward (retain_graph)
    assert all(g[0].shape == sets[0].q.shape for g in grads)
    assert not torch.equal(grads[0][0], grads[1][0])  # two distinct input sets, rotated


def test_forward_and_fwd_bwd_modes_run_the_forward_each_time():
    for mode in ("fwd", "fwd+bwd"):
        a = Counting()
        t = timing.time_adapter(a, CASE, mode, device="cpu", options=FAST)
        assert t.mode == mode and t.reps == 4
        assert a.calls == t.warmup_calls + 4  # warm-up then the timed calls, nothing hidden


def test_inference_only_backend_has_no_backward_mode():
    with pytest.raises(ValueError, match="inference-only"):
        timing.Workload(Counting(differentiable=False), CASE, [make_inputs(CASE)], "bwd")


def test_no_flush_or_rotation_on_cpu():
    assert not timing.wants_flush(CASE, torch.device("cpu"), "always")
    assert timing.rotation_count(CASE, torch.device("cpu")) == 1


@pytest.mark.benchmark(timer=timing.device_time_replay)
def test_pytest_benchmark_stores_exactly_the_measured_times(benchmark):
    skip_unless_enabled(benchmark)
    measured = timing.Timing(mode="fwd", clock=timing.CLOCK_DEVICE, times_ms=[0.5, 0.25, 1.0, 0.75, 2.0])
    timing.record_in_benchmark(benchmark, measured)
    stats = benchmark.stats.stats
    assert stats.rounds == 5
    assert stats.median == pytest.approx(measured.median_ms / 1e3)
    assert stats.min == pytest.approx(0.25e-3) and stats.max == pytest.approx(2e-3)


def test_pytest_benchmark_without_the_replay_timer_is_refused(benchmark):
    skip_unless_enabled(benchmark)
    measured = timing.Timing(mode="fwd", clock=timing.CLOCK_DEVICE, times_ms=[0.5, 0.25])
    with pytest.raises(RuntimeError, match="device_time_replay"):
        timing.record_in_benchmark(benchmark, measured)


def test_settling_runs_windows_until_two_agree(monkeypatch):
    # the H100's pattern (session 5): slow windows while the clocks ramp, then steady ones
    windows = iter([[0.47] * 5, [0.40] * 5, [0.367] * 5, [0.366] * 5, [0.2] * 5])
    monkeypatch.setattr(timing, "_time_loop", lambda call, n, reps, device, flush: timing._Loop(next(windows)))
    monkeypatch.setattr(timing, "SETTLE_MIN_MS", 0.0)
    medians, calls = timing._settle(lambda i: None, 1, torch.device("cuda"), None, est_ms=2.0, max_ms=1e4)
    assert medians == [0.47, 0.40, 0.367, 0.366]  # stops at the first window within 2% of the previous
    assert calls == 4 * 5  # 10 ms windows of a 2 ms call


def test_settling_lasts_at_least_its_minimum(monkeypatch):
    # two slow windows that agree (a slow phase longer than two windows) do not end it early
    def loop(call, n, reps, device, flush):
        time.sleep(0.004)
        loop.k += 1
        return timing._Loop([0.46 if loop.k <= 3 else 0.40] * reps)
    loop.k = 0
    monkeypatch.setattr(timing, "_time_loop", loop)
    monkeypatch.setattr(timing, "SETTLE_MIN_MS", 30.0)
    medians, _ = timing._settle(lambda i: None, 1, torch.device("cuda"), None, est_ms=2.0, max_ms=1e4)
    assert medians[:3] == [0.46] * 3 and medians[-2:] == [0.40, 0.40]


def test_settling_is_bounded_in_time_and_off_on_request(monkeypatch):
    def never_steady(call, n, reps, device, flush):
        time.sleep(0.002)
        never_steady.k += 1
        return timing._Loop([1.0 if never_steady.k % 2 else 2.0] * reps)
    never_steady.k = 0
    monkeypatch.setattr(timing, "_time_loop", never_steady)
    t0 = time.perf_counter()
    medians, _ = timing._settle(lambda i: None, 1, torch.device("cuda"), None, est_ms=1.0, max_ms=20)
    assert 3 <= len(medians) == never_steady.k and time.perf_counter() - t0 < 1.0  # ran until max_ms
    assert timing._settle(lambda i: None, 1, torch.device("cuda"), None, est_ms=1.0, max_ms=0) == ([], 0)
    assert timing._settle(lambda i: None, 1, torch.device("cpu"), None, est_ms=1.0, max_ms=100) == ([], 0)


def test_launch_bound_rule():
    # the device waits for launches when the host's enqueue, less the flush the device runs
    # meanwhile, reaches LAUNCH_BOUND_FRACTION of the measured time
    def t(enqueue, flush=None, clock=timing.CLOCK_DEVICE, graph=False, drain=0.05):
        return timing.Timing(mode="fwd", clock=clock, times_ms=[0.1] * 5, enqueue_ms=enqueue, flush_ms=flush,
                             cuda_graph=graph, drain_ms=drain)

    assert "launch-bound" in t(0.2).launch_bound and "0.2 ms to enqueue" in t(0.2).launch_bound
    assert t(0.2).to_dict()["launch_bound"] == t(0.2).launch_bound
    assert t(0.05).launch_bound is None  # the host runs ahead: device time
    assert t(0.2, flush=0.15).launch_bound is None  # the flush covered the launches
    assert "flushed L2 for 0.05 ms" in t(0.2, flush=0.05).launch_bound
    assert t(0.2, graph=True).launch_bound is None  # a graph replay is one launch
    assert t(0.2, clock=timing.CLOCK_HOST).launch_bound is None  # host time is labelled as such anyway
    assert t(None).launch_bound is None
    # a host 100 repetitions ahead blocks on the full launch queue: its enqueue time grows, but
    # the device never waited
    assert t(0.2, drain=10.0).launch_bound is None


# --------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------


REF_REPS = 50  # repetitions of each round of the hand-written reference (and of the harness's)


def _event_times(fn, reps=REF_REPS, flush=True):
    """A plain CUDA-event loop (the reference): L2 flushed before each repetition, one sync."""
    buf = torch.empty(timing.L2_FLUSH_FACTOR * timing.l2_bytes(torch.device("cuda")) // 4, dtype=torch.int32,
                      device="cuda")
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        if flush:
            buf.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def _interleaved(fn, harness_timing, reference_times, rounds=5, heat_ms=300):
    """(the harness's Timing over all rounds, the reference's median): the card is first brought
    to its steady clock (``fn`` run for ``heat_ms``), then the two measurements alternate in rounds
    of the same length, so the clock's drift (a power-bound matmul on an H200 slowed by 3-5%
    between a run measured first and one measured second) moves both alike."""
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < heat_ms:
        fn()
        torch.cuda.synchronize()
    runs, ref = [], []
    for _ in range(rounds):
        runs.append(harness_timing())
        ref += reference_times()
    return dataclasses.replace(runs[0], times_ms=[x for t in runs for x in t.times_ms]), statistics.median(ref)


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.benchmark(timer=timing.device_time_replay)
def test_stored_median_matches_cuda_events_matmul(benchmark):
    skip_unless_enabled(benchmark)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    fn = lambda: a @ b
    same = timing.TimerOptions(reps=REF_REPS, warmup_ms=0)
    t, ref = _interleaved(fn, lambda: timing.time_callable(fn, "cuda", options=same, flush=True), lambda: _event_times(fn))
    timing.record_in_benchmark(benchmark, t)
    stored = benchmark.stats.stats.median * 1e3
    assert t.clock == "cuda-events"
    assert ref >= 0.1, f"the work must take >= 100 us for this check (took {ref:.3f} ms)"
    assert stored == pytest.approx(ref, rel=0.03), f"stored {stored:.4f} ms vs CUDA events {ref:.4f} ms"


@pytest.mark.gpu
@pytest.mark.timing
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
@pytest.mark.benchmark(timer=timing.device_time_replay)
def test_stored_median_matches_cuda_events_attention(benchmark, mode):
    from harness.adapters import registry

    skip_unless_enabled(benchmark)
    case = SoftmaxCase(4, 16, 16, 2048, 2048, 128, dtype="bf16")
    adapter = registry.get("sdpa_flash")
    reason = adapter.supports(case, torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    # The reference times the same work by hand: forward, or backward on a graph built outside.
    inputs = make_inputs(case, 0, "cuda")
    q, k, v = (x.clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    if mode == "fwd":
        fn = lambda: adapter.run(case, q=q, k=k, v=v)
    else:
        out = adapter.run(case, q=q, k=k, v=v).out
        fn = lambda: torch.autograd.grad(out, (q, k, v), inputs.grad_out, retain_graph=True)
    same = timing.TimerOptions(reps=REF_REPS, warmup_ms=0)
    t, ref = _interleaved(fn, lambda: timing.time_adapter(adapter, case, mode, device="cuda", options=same),
                          lambda: _event_times(fn, flush=timing.wants_flush(case, torch.device("cuda"))))
    timing.record_in_benchmark(benchmark, t)
    stored = benchmark.stats.stats.median * 1e3
    assert ref >= 0.1, f"the work must take >= 100 us for this check (took {ref:.3f} ms)"
    assert stored == pytest.approx(ref, rel=0.03), f"stored {stored:.4f} ms vs CUDA events {ref:.4f} ms"


@pytest.mark.gpu
@pytest.mark.timing
def test_cuda_graph_option_replays_or_says_why():
    case = SoftmaxCase(2, 4, 4, 256, 256, 64, dtype="bf16")
    t = timing.time_adapter(Counting(), case, "fwd", device="cuda",
                            options=timing.TimerOptions(cuda_graph=True, reps=10, warmup_ms=0))
    assert t.cuda_graph is True or (isinstance(t.cuda_graph, str) and t.cuda_graph.startswith("capture failed"))
    assert t.reps == 10 and t.clock == "cuda-events"
    assert t.settle_ms and t.warmup_calls > 3  # settling windows ran before the timed loop


@pytest.mark.gpu
@pytest.mark.timing
def test_launch_bound_is_detected_on_the_device():
    # a call that spends 2 ms on the host before one tiny launch is host time; a 4096^3 matmul
    # (~0.2 ms of device work enqueued in microseconds) is device time
    x = torch.randn(1024, device="cuda")
    slow_host = lambda: (time.sleep(0.002), x.add_(1.0))
    t = timing.time_callable(slow_host, "cuda", options=timing.TimerOptions(reps=10, warmup_ms=0))
    assert t.enqueue_ms >= 2.0 and t.launch_bound and "launch-bound" in t.launch_bound
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t = timing.time_callable(lambda: a @ a, "cuda", options=timing.TimerOptions(reps=20, warmup_ms=0), flush=True)
    assert t.flush_ms is not None and t.flush_ms > 0
    assert t.launch_bound is None, t.launch_bound


@pytest.mark.gpu
@pytest.mark.timing
def test_a_failed_capture_frees_its_memory_and_a_host_synchronising_adapter_is_not_captured():
    """A call that reads a device value on the host cannot be captured; the failed capture must not
    keep its memory pool (a decode run of 19 cases ran out of 80 GB that way), and an adapter that
    says it synchronises (``no_cuda_graph``) is not captured at all, with its reason."""
    from harness.adapters import registry
    from harness.cases import DecodeCase

    class Syncing(Counting):
        def run(self, case, **kw):
            out = super().run(case, **kw)
            float(out.out.sum())  # a host read: the capture fails
            return out

    case = SoftmaxCase(2, 4, 4, 256, 256, 64, dtype="bf16")
    opts = timing.TimerOptions(cuda_graph=True, reps=5, warmup_ms=0)
    timing.time_adapter(Syncing(), case, "fwd", device="cuda", options=opts)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(3):
        t = timing.time_adapter(Syncing(), case, "fwd", device="cuda", options=opts)
        assert isinstance(t.cuda_graph, str) and t.cuda_graph.startswith("capture failed"), t.cuda_graph
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + 1024**2, "failed captures kept memory"
    dec = DecodeCase(2, 8, 2, 1, 256, 64, page_size=16, dtype="bf16")
    t = timing.time_adapter(registry.get("decode_sdpa"), dec, "fwd", device="cuda", options=opts)
    assert isinstance(t.cuda_graph, str) and t.cuda_graph.startswith("not captured: it gathers")
