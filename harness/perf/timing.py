"""Timing: device time of one adapter on one case, in one mode, as a list of per-repetition times.

Method on CUDA (``clock = "cuda-events"``), the same as ``triton.testing.do_bench``:

1. **Warm-up** outside the numbers: at least :data:`WARMUP_MIN_CALLS` calls and
   :data:`WARMUP_MS` of wall time, so JIT compilation, autotuning, ``torch.compile`` and handle
   creation are over before the first timed repetition. Then, on CUDA, **settling**: windows of
   back-to-back repetitions (:data:`SETTLE_WINDOW_MS` each, timed as below) for at least
   :data:`SETTLE_MIN_MS`, then until one window's median is within :data:`SETTLE_TOL` of the
   previous window's (at most :data:`SETTLE_MAX_MS` in all),
   so the clocks have ramped up after whatever idled the device before (the warm-up synchronises
   after every call; verification and memory runs come between cells). The window medians are
   kept (``Timing.settle_ms``).
2. **Per repetition**: (untimed) zero a buffer of :data:`L2_FLUSH_FACTOR` x the device's L2 when
   the working set is small enough to stay cached (:data:`FLUSH_BELOW_L2_MULTIPLE`); then a CUDA
   event, the work, a CUDA event, all enqueued on the current stream without synchronising, so
   the events time the device, not the host. One ``torch.cuda.synchronize`` after the last
   repetition; ``start.elapsed_time(end)`` gives each repetition's device milliseconds.
   The flush kernel keeps the device busy while the host enqueues the work, so launch latency
   does not land between the events -- unless the host is slower than the kernels. The loop
   therefore also takes the host's enqueue time and the flush's device time per repetition (and
   how much work was still queued when the host finished), and
   :attr:`Timing.launch_bound` says when the number is mostly launch latency (reports mark it,
   give it no speedup and leave it out of plots); ``cuda_graph=True`` removes the launches.
3. **Input rotation**: when the working set fits in L2, :data:`ROTATE_SETS` seeded input sets
   are used in turn, so even a partially effective flush cannot leave a repetition's own inputs
   hot, and values differ between repetitions (never zeros).
4. **Repetitions**: enough for :data:`TARGET_MS` of timed work (estimated from a short probe),
   between :data:`MIN_REPS` and :data:`MAX_REPS`; the median and the interquartile range
   (spread = IQR / median) summarise them; the raw times are kept.

Modes: ``fwd`` (forward with autograd recording, as in training), ``bwd`` (backward alone: each
input set's forward and its autograd graph are built *before* timing; every repetition calls
``torch.autograd.grad(..., retain_graph=True)`` on it), ``fwd+bwd``.

On a CPU the same loop runs with ``time.perf_counter`` (``clock = "host"``): that is *host
time*, labelled so in every report; the CPU path exists for the CPU tests and dry runs.

pytest-benchmark: :func:`record_in_benchmark` hands the measured device times to the
``benchmark`` fixture through :func:`device_time_replay`, a timer that replays them; see there.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from harness import fp8
from harness.adapters.base import fp8_backward_reason
from harness.cases import RUN_INPUT_NAMES, Case, LinearCase, apply_layout, make_inputs
from harness.perf import flops as flop_model

MODES = flop_model.MODES
CLOCK_DEVICE = "cuda-events"
CLOCK_HOST = "host"  # time.perf_counter around each call: host time, not device time


def clock_of(device) -> str:
    """The clock this module times ``device`` with: :data:`CLOCK_DEVICE` on CUDA, :data:`CLOCK_HOST` elsewhere."""
    return CLOCK_DEVICE if torch.device(device).type == "cuda" else CLOCK_HOST

#: Wall time spent warming up (do_bench's default), and the fewest warm-up calls: the first call
#: compiles / autotunes, the next ones reach steady state (allocator caches, cuDNN plans).
WARMUP_MS = 25.0
WARMUP_MIN_CALLS = 3
#: Timed work aimed at per (case, backend, mode): 100 ms is do_bench's default; long kernels get
#: fewer repetitions (at least MIN_REPS: below 5 the interquartile range means little).
TARGET_MS = 100.0
MIN_REPS = 5
MAX_REPS = 200
#: The L2 flush zeroes this many times the L2's size: writing exactly L2's size can leave lines
#: resident (hashed set mapping, partitioned L2 on H100).
L2_FLUSH_FACTOR = 2
#: Flush (and rotate inputs) when the working set is below this multiple of L2: above it a
#: repetition evicts its own data; below it the previous repetition leaves part of it hot.
FLUSH_BELOW_L2_MULTIPLE = 4
#: Input sets used in turn when the working set fits in L2 (seeds seed, seed + 1, ...).
ROTATE_SETS = 4
#: L2 size used when torch cannot report it (H100 SXM: 50 MiB).
FALLBACK_L2_BYTES = 50 << 20
#: Settling (CUDA): an H100 ran a forward at 0.47 ms for the first ~20 repetitions of a loop, then
#: at 0.367 ms for the rest (FLA's kernel in the same run: 0.46 then 0.408), a 13% interquartile
#: range and a median 28% high: the device was not yet in its steady state after idling. Windows
#: of SETTLE_WINDOW_MS of back-to-back repetitions run for at least SETTLE_MIN_MS, then until a
#: window's median is within SETTLE_TOL of the previous window's, or SETTLE_MAX_MS have gone. The
#: minimum: with agreement alone (session 5) the slow phase outlasted two 10 ms windows once
#: (FLA's kernel at T=16k: windows 0.459, 0.460 ms, then the timed loop went from 0.46 to 0.40).
SETTLE_WINDOW_MS = 10.0
SETTLE_MIN_MS = 100.0
SETTLE_TOL = 0.02
SETTLE_MAX_MS = 400.0
SETTLE_MAX_WINDOW_REPS = 500
#: Warm-up iterations on a side stream before CUDA-graph capture (torch's documented recipe).
GRAPH_WARMUP_CALLS = 3
#: A repetition is launch-bound when the host's time to enqueue it, less the flush the device runs
#: meanwhile, reaches this fraction of the time measured: the device then waits for launches
#: between the events, and the number is mostly host time (see Timing.launch_bound).
LAUNCH_BOUND_FRACTION = 0.8
#: ... and when the device had caught up with the host by the end of the loop: less than this many
#: repetitions (or LAUNCH_BOUND_MIN_DRAIN_MS) still queued when the host finished enqueueing. A host
#: far ahead blocks on a full launch queue, which inflates its enqueue time without any idle device.
LAUNCH_BOUND_MAX_DRAIN_REPS = 2
LAUNCH_BOUND_MIN_DRAIN_MS = 0.1


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Timing:
    """Per-repetition times of one (case, backend, mode) and how they were taken.

    ``times_ms``: one entry per repetition, milliseconds (device time when ``clock`` is
    "cuda-events", host time when "host"). ``cuda_graph``: True when replayed from a graph, False
    when not asked, or the reason the capture failed.
    """

    mode: str
    clock: str
    times_ms: list[float]
    warmup_calls: int = 0
    flush_l2: bool = False
    rotate: int = 1
    cuda_graph: bool | str = False
    enqueue_ms: float | None = None  # median host time to enqueue one repetition's work (CUDA)
    flush_ms: float | None = None  # median device time of the L2 flush before each repetition
    drain_ms: float | None = None  # host time from the loop's last enqueue to the device finishing
    settle_ms: list[float] = field(default_factory=list)  # median of each settling window (CUDA), in order
    #: host time of the first warm-up call, synchronised: what a user's first call costs (compilation,
    #: JIT, autotuning), apart from the repetitions
    first_call_ms: float | None = None

    @property
    def reps(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    def quartiles(self) -> tuple[float, float]:
        """(q1, q3) in ms, linear interpolation between order statistics."""
        if len(self.times_ms) < 2:
            return self.times_ms[0], self.times_ms[0]
        q = statistics.quantiles(self.times_ms, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def iqr_ms(self) -> float:
        q1, q3 = self.quartiles()
        return q3 - q1

    @property
    def spread(self) -> float:
        """Run-to-run spread: IQR / median (dimensionless)."""
        m = self.median_ms
        return self.iqr_ms / m if m > 0 else math.inf

    @property
    def is_device_time(self) -> bool:
        return self.clock == CLOCK_DEVICE

    @property
    def launch_bound(self) -> str | None:
        """Why the median is mostly launch latency, or None.

        The device runs ahead of the host only while the host enqueues faster than the device
        works. Per repetition the host spends ``enqueue_ms`` launching the work while the device
        has only the flush (``flush_ms``) to run; when what is left, ``enqueue - flush``, reaches
        :data:`LAUNCH_BOUND_FRACTION` of the measured time, the device waited for launches between
        the two events -- provided the device had caught up by the loop's end (``drain_ms``: a
        host far ahead blocks on the full launch queue, which inflates its enqueue time while the
        device never waits). The number is then an upper bound of the device time (the host's cost
        per call, real for a loop that launches this way), not the kernels' speed: time it with
        CUDA graphs (``--cuda-graphs``) for device time."""
        if self.clock != CLOCK_DEVICE or self.enqueue_ms is None or self.cuda_graph is True:
            return None
        m, left = self.median_ms, self.enqueue_ms - (self.flush_ms or 0.0)
        if m <= 0 or left < LAUNCH_BOUND_FRACTION * m:
            return None
        if self.drain_ms is not None and self.drain_ms > max(LAUNCH_BOUND_MAX_DRAIN_REPS * m, LAUNCH_BOUND_MIN_DRAIN_MS):
            return None  # the host was ahead (blocked on a full queue), the device never waited
        flush = f" while the device flushed L2 for {self.flush_ms:.3g} ms" if self.flush_ms else ""
        hint = (f"CUDA graphs were asked for, {self.cuda_graph}" if isinstance(self.cuda_graph, str)
                 else "time with CUDA graphs for device time")
        return (f"launch-bound: the host took {self.enqueue_ms:.3g} ms to enqueue each repetition{flush}, "
                f"against {m:.3g} ms measured; the number is mostly launch latency ({hint})")

    @property
    def unsteady(self) -> str | None:
        """Why the device may not have been steady when the timed loop began, or None: settling
        ran out of time (SETTLE_MAX_MS) before two windows agreed within SETTLE_TOL."""
        w = self.settle_ms
        if len(w) < 2 or _windows_agree(w):
            return None
        return (f"unsteady: settling stopped at its time limit with its last two windows at {w[-2]:.3g} and "
                f"{w[-1]:.3g} ms ({len(w)} windows); the median may mix device states (clocks, power, "
                "other work on the device)")

    def to_dict(self) -> dict:
        q1, q3 = self.quartiles()
        d = asdict(self)
        d.update(
            median_ms=self.median_ms, q1_ms=q1, q3_ms=q3, iqr_ms=q3 - q1, spread=self.spread,
            min_ms=min(self.times_ms), mean_ms=statistics.fmean(self.times_ms), reps=self.reps,
            launch_bound=self.launch_bound, unsteady=self.unsteady,
        )
        return d


# --------------------------------------------------------------------------------------------
# Device facts
# --------------------------------------------------------------------------------------------


def l2_bytes(device: torch.device) -> int:
    """The device's L2 size in bytes (:data:`FALLBACK_L2_BYTES` when torch does not say)."""
    props = torch.cuda.get_device_properties(device)
    size = getattr(props, "L2_cache_size", 0) or getattr(props, "l2_cache_size", 0)
    return int(size) or FALLBACK_L2_BYTES


_FLUSH_BUFFERS: dict[str, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    key = str(device)
    if key not in _FLUSH_BUFFERS:
        n = L2_FLUSH_FACTOR * l2_bytes(device) // 4
        _FLUSH_BUFFERS[key] = torch.empty(n, dtype=torch.int32, device=device)
    return _FLUSH_BUFFERS[key]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------
# Work: what one repetition runs, per mode
# --------------------------------------------------------------------------------------------


_GRAD_INPUTS = ("q", "k", "v", "g", "g_gamma", "initial_state")


def loss_pairs(case: Case, output, inputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(outputs, their incoming gradients) of the training loss: <out, dO> (+ <h_T, dh_T>)."""
    outs, grads = [output.out], [inputs.grad_out]
    final = getattr(output, "final_state", None)
    if isinstance(case, LinearCase) and final is not None and getattr(inputs, "grad_final_state", None) is not None:
        outs.append(final)
        grads.append(inputs.grad_final_state.to(final.dtype))
    pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
    return [o for o, _ in pairs], [g for _, g in pairs]


class Workload:
    """One (adapter, case, mode) on ``n`` input sets: ``prepare()`` (untimed) then ``call(i)``.

    ``fwd``: ``adapter.run`` with autograd recording (inputs require grad when the adapter is
    differentiable). ``bwd``: ``prepare`` runs each set's forward once and keeps the graph;
    ``call(i)`` is ``torch.autograd.grad(..., retain_graph=True)`` on set i's graph. ``fwd+bwd``:
    both in one call.
    """

    def __init__(self, adapter, case: Case, input_sets: list, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        differentiable = bool(getattr(adapter, "differentiable", True))
        if mode != "fwd" and not differentiable and not getattr(case, "fp8", ""):
            raise ValueError(f"mode: {adapter.name} is inference-only; only 'fwd' can be timed")
        #: FP8 cases time the backend's explicit FP8 backward (run_fp8_backward), never autograd
        self.fp8_backward = bool(getattr(case, "fp8", "")) and fp8_backward_reason(adapter, case) is None
        if mode != "fwd" and getattr(case, "fp8", "") and not self.fp8_backward:
            raise ValueError(f"mode: {fp8_backward_reason(adapter, case)}; only 'fwd' can be timed ({case.id})")
        self.adapter, self.case, self.mode = adapter, case, mode
        self.grad = differentiable and not getattr(case, "fp8", "")  # FP8 cases: no autograd
        # Inputs the adapter declares constant (e.g. a decay it gives no gradient) stay leaves
        # without grad, as in harness.check.verify.
        constant = set(getattr(adapter, "nondifferentiable_inputs", ()))
        self.sets = []
        for inputs in input_sets:
            t = inputs.tensors()
            run_in = {}
            for n in RUN_INPUT_NAMES:
                if n in t:
                    x = t[n].detach()
                    if self.grad and n in _GRAD_INPUTS and n not in constant and x.is_floating_point():
                        x = x.clone().requires_grad_(True)
                    run_in[n] = x
            self.sets.append((inputs, run_in))
        #: what the adapter receives: the case's memory layout of the same tensors (leaves above)
        self._passed = [apply_layout(case, run_in) if case.layout != "contiguous" else run_in for _, run_in in self.sets]
        self._graphs: list = [None] * len(self.sets)
        #: CUDA stream the bwd-mode forward graphs are built on (set for CUDA-graph capture: the
        #: backward runs on its forward's stream, which must then be the capturing stream).
        self.stream = None

    def __len__(self) -> int:
        return len(self.sets)

    def _leaves(self, run_in: dict) -> list[torch.Tensor]:
        return [x for x in run_in.values() if x.requires_grad]

    def forward(self, i: int):
        with torch.set_grad_enabled(self.grad):
            passed = self._passed[i]
            if passed is not self.sets[i][1]:  # a laid-out view of the leaves: rebuilt per call (its graph)
                passed = apply_layout(self.case, self.sets[i][1])
            return self.adapter.run(self.case, **passed)

    def _fp8_backward(self, i: int, output):
        inputs = self.sets[i][0]
        extra = {n: getattr(inputs, n) for n in ("grad_out",) + fp8.GRAD_DESCALE_NAMES}
        return self.adapter.run_fp8_backward(self.case, output, **self._passed[i], **extra)

    def prepare(self) -> None:
        """bwd: build every set's forward graph (outside the timed region); FP8: run its forward."""
        if self.mode == "bwd" and self.fp8_backward:
            self._graphs = [self.forward(i) for i in range(len(self.sets))]
        elif self.mode == "bwd":
            ctx = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
            with ctx:
                for i, (inputs, run_in) in enumerate(self.sets):
                    output = self.forward(i)
                    outs, grads = loss_pairs(self.case, output, inputs)
                    self._graphs[i] = (output, outs, grads, self._leaves(run_in))
            if self.stream is not None:
                torch.cuda.current_stream().wait_stream(self.stream)

    def release(self) -> None:
        self._graphs = [None] * len(self.sets)

    def call(self, i: int):
        if self.mode == "fwd":
            return self.forward(i)
        if self.fp8_backward:
            return self._fp8_backward(i, self._graphs[i] if self.mode == "bwd" else self.forward(i))
        if self.mode == "bwd":
            _, outs, grads, leaves = self._graphs[i]
            return torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)
        inputs, run_in = self.sets[i]
        output = self.forward(i)
        outs, grads = loss_pairs(self.case, output, inputs)
        return torch.autograd.grad(outs, self._leaves(run_in), grads, allow_unused=True)


def input_sets(case: Case, seed: int, device, n: int, first=None) -> list:
    """``n`` seeded input sets (seeds seed, seed + 1, ...); ``first`` replaces the first one."""
    sets = [first] if first is not None else []
    while len(sets) < n:
        sets.append(make_inputs(case, seed + len(sets), device))
    return sets


# --------------------------------------------------------------------------------------------
# The timer
# --------------------------------------------------------------------------------------------


@dataclass
class TimerOptions:
    """Knobs of :func:`time_workload` (defaults: the module constants)."""

    warmup_ms: float = WARMUP_MS
    target_ms: float = TARGET_MS
    min_reps: int = MIN_REPS
    max_reps: int = MAX_REPS
    reps: int | None = None  # fixed number of repetitions (overrides target_ms)
    flush_l2: str = "auto"  # "auto" (when the working set is small), "always", "never"
    cuda_graph: bool = False
    settle_max_ms: float = SETTLE_MAX_MS  # 0: no settling windows
    extra: dict = field(default_factory=dict)


def wants_flush(case: Case, device: torch.device, flush_l2: str = "auto") -> bool:
    """Whether repetitions of ``case`` flush L2 first (CUDA only)."""
    if device.type != "cuda" or flush_l2 == "never":
        return False
    if flush_l2 == "always":
        return True
    return flop_model.working_set_bytes(case) < FLUSH_BELOW_L2_MULTIPLE * l2_bytes(device)


def rotation_count(case: Case, device: torch.device, flush_l2: str = "auto") -> int:
    return ROTATE_SETS if wants_flush(case, device, flush_l2) else 1


@dataclass
class _Loop:
    times: list[float]  # per repetition, ms (device on CUDA, host on a CPU)
    enqueue_ms: float | None = None  # median host time spent in call() (CUDA)
    flush_ms: float | None = None  # median device time of the flush (CUDA, when flushing)
    drain_ms: float | None = None  # host time from the last enqueue to the device finishing (CUDA)


def _time_loop(call: Callable[[int], object], n_sets: int, reps: int, device: torch.device, flush) -> _Loop:
    """Per-repetition times in ms: CUDA events on CUDA, perf_counter on a CPU. On CUDA it also
    takes the host time spent enqueueing each repetition and the device time of each flush
    (one more event, recorded before the flush), for Timing.launch_bound."""
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        before = [torch.cuda.Event(enable_timing=True) for _ in range(reps)] if flush is not None else None
        enqueue = []
        torch.cuda.synchronize(device)
        for r in range(reps):
            if flush is not None:
                before[r].record()
                flush.zero_()
            starts[r].record()
            t0 = time.perf_counter()
            call(r % n_sets)
            enqueue.append((time.perf_counter() - t0) * 1e3)
            ends[r].record()
        t0 = time.perf_counter()
        torch.cuda.synchronize(device)
        drain_ms = (time.perf_counter() - t0) * 1e3
        flush_ms = statistics.median(b.elapsed_time(s) for b, s in zip(before, starts)) if before else None
        return _Loop([s.elapsed_time(e) for s, e in zip(starts, ends)], statistics.median(enqueue), flush_ms,
                     drain_ms)
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        call(r % n_sets)
        times.append((time.perf_counter() - t0) * 1e3)
    return _Loop(times)


def _windows_agree(medians: list[float]) -> bool:
    """The settling rule: the last window's median is within SETTLE_TOL of the one before."""
    return len(medians) >= 2 and abs(medians[-1] - medians[-2]) <= SETTLE_TOL * medians[-2]


def _settle(call: Callable[[int], object], n_sets: int, device: torch.device, flush, est_ms: float,
            max_ms: float) -> tuple[list[float], int]:
    """Settling windows (see the module docstring): (each window's median ms, calls made)."""
    if device.type != "cuda" or max_ms <= 0:
        return [], 0
    # (a call longer than a window is a window by itself: slow backends pay two calls, not six)
    reps = int(min(SETTLE_MAX_WINDOW_REPS, max(1, math.ceil(SETTLE_WINDOW_MS / max(est_ms, 1e-4)))))
    medians: list[float] = []
    calls, t0 = 0, time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < max_ms:
        medians.append(statistics.median(_time_loop(call, n_sets, reps, device, flush).times))
        calls += reps
        if (time.perf_counter() - t0) * 1e3 >= min(SETTLE_MIN_MS, max_ms) and _windows_agree(medians):
            break
    return medians, calls


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream CUDA graphs are captured on, one per device for the process: cuBLAS keeps a
    32 MiB workspace per (handle, stream) that lives as long as the process, so a new stream per
    timed case grows memory by that much each time (seen as ~33 MB per case on the H100)."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device]


def _capture_graphs(work: Workload, device: torch.device):
    """One CUDA graph per input set, or raise. torch's recipe: warm up on a side stream first, and
    capture on it (``work.stream``: the bwd-mode forward graphs were built there)."""
    stream = work.stream or capture_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for i in range(len(work)):
            for _ in range(GRAPH_WARMUP_CALLS):
                work.call(i)
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graphs, keep = [], []
    try:
        for i in range(len(work)):
            g = torch.cuda.CUDAGraph()
            graphs.append(g)
            with torch.cuda.graph(g, stream=stream):
                keep.append(work.call(i))  # outputs live in the graph's pool; kept alive with it
    except Exception:
        # a failed capture keeps its private memory pool while its graph lives: free both, or a
        # run of many cases runs out of memory
        keep.clear()
        for g in graphs:
            with contextlib.suppress(Exception):  # a graph whose capture broke may refuse a reset too
                g.reset()
        graphs.clear()
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        raise
    torch.cuda.synchronize(device)
    return graphs, keep


def time_workload(work: Workload, device, options: TimerOptions | None = None) -> Timing:
    """Warm up, then time ``work`` (see the module docstring); returns a :class:`Timing`."""
    opt = options or TimerOptions()
    device = torch.device(device)
    flush = _flush_buffer(device) if (device.type == "cuda" and wants_flush(work.case, device, opt.flush_l2)) else None
    n = len(work)
    call = work.call
    graph_state: bool | str = False
    keep = None
    if opt.cuda_graph and device.type == "cuda":
        work.stream = capture_stream(device)
    try:
        work.prepare()
        # Warm-up: compile, autotune, steady state. Host clock with a sync: only to bound its length.
        calls, t0 = 0, time.perf_counter()
        first_ms = None
        while calls < WARMUP_MIN_CALLS or (time.perf_counter() - t0) * 1e3 < opt.warmup_ms:
            call(calls % n)
            calls += 1
            synchronize(device)
            if first_ms is None:
                first_ms = (time.perf_counter() - t0) * 1e3
        no_graph = getattr(work.adapter, "no_cuda_graph", None)
        if opt.cuda_graph and device.type == "cuda" and no_graph:
            graph_state = f"not captured: {no_graph}"
        elif opt.cuda_graph and device.type == "cuda":
            try:
                graphs, keep = _capture_graphs(work, device)
                call = lambda i: graphs[i].replay()
                graph_state = True
                for i in range(n):
                    graphs[i].replay()
                synchronize(device)
            except Exception as e:  # capture is an option: report why it was not used
                torch.cuda.synchronize(device)
                graph_state = f"capture failed: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            if isinstance(graph_state, str):
                # the exception's frames held the capture's tensors (in its private pool) until the
                # except block ended; they sit in reference cycles: collect them and return the pool,
                # or a run of many cases runs out of memory
                gc.collect()
                torch.cuda.empty_cache()
        reps, settled, more = _repetitions(call, n, device, flush, opt)
        loop = _time_loop(call, n, reps, device, flush)
    finally:
        work.release()
        del keep
    return Timing(
        mode=work.mode, clock=clock_of(device), times_ms=loop.times,
        warmup_calls=calls + more, flush_l2=flush is not None, rotate=n, cuda_graph=graph_state,
        enqueue_ms=loop.enqueue_ms, flush_ms=loop.flush_ms, drain_ms=loop.drain_ms, settle_ms=settled,
        first_call_ms=first_ms,
    )


def _repetitions(call, n: int, device: torch.device, flush, opt: TimerOptions) -> tuple[int, list[float], int]:
    """How many timed repetitions (fixed, or TARGET_MS over a probe's estimate), after settling on
    CUDA: (reps, the settling windows' medians, calls made by the probe and the windows)."""
    if opt.reps is not None and device.type != "cuda":
        return max(1, int(opt.reps)), [], 0
    probe = _time_loop(call, n, min(3, opt.max_reps), device, flush)
    settled, more = _settle(call, n, device, flush, statistics.median(probe.times), opt.settle_max_ms)
    est = max(settled[-1] if settled else statistics.median(probe.times), 1e-4)
    if opt.reps is not None:
        reps = max(1, int(opt.reps))
    else:
        reps = int(min(opt.max_reps, max(opt.min_reps, math.ceil(opt.target_ms / est))))
    return reps, settled, len(probe.times) + more


def time_adapter(adapter, case: Case, mode: str, *, seed: int = 0, device=None, inputs=None,
                 options: TimerOptions | None = None) -> Timing:
    """Time ``adapter`` on ``case`` in ``mode`` with seeded inputs (rotated when they fit in L2)."""
    opt = options or TimerOptions()
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    n = rotation_count(case, device, opt.flush_l2)
    sets = input_sets(case, seed, device, n, first=inputs)
    return time_workload(Workload(adapter, case, sets, mode), device, opt)


def time_callable(fn: Callable[[], object], device, *, mode: str = "fwd", options: TimerOptions | None = None,
                  flush: bool = False) -> Timing:
    """Time a plain zero-argument callable with the same loop (the roofline calibration uses it)."""
    opt = options or TimerOptions()
    device = torch.device(device)
    buf = _flush_buffer(device) if (flush and device.type == "cuda") else None
    calls, t0 = 0, time.perf_counter()
    while calls < WARMUP_MIN_CALLS or (time.perf_counter() - t0) * 1e3 < opt.warmup_ms:
        fn()
        calls += 1
        synchronize(device)
    reps, settled, more = _repetitions(lambda i: fn(), 1, device, buf, opt)
    loop = _time_loop(lambda i: fn(), 1, reps, device, buf)
    return Timing(mode=mode, clock=clock_of(device), times_ms=loop.times,
                  warmup_calls=calls + more, flush_l2=buf is not None, enqueue_ms=loop.enqueue_ms, flush_ms=loop.flush_ms,
                  drain_ms=loop.drain_ms, settle_ms=settled)


# --------------------------------------------------------------------------------------------
# pytest-benchmark
# --------------------------------------------------------------------------------------------


class _Replay:
    """State of :func:`device_time_replay`: a queue of durations (seconds) and a fake clock."""

    def __init__(self):
        self.queue: collections.deque[float] = collections.deque()
        self.now = 0.0
        self.started = False


_REPLAY = _Replay()


def device_time_replay() -> float:
    """A pytest-benchmark timer that replays durations measured by :func:`time_workload`.

    Why: pytest-benchmark times ``target()`` between two calls of its timer, on the host. Around
    an asynchronous CUDA launch that measures the launch, not the kernel. So the harness measures
    with CUDA events itself and hands the per-repetition device times to pytest-benchmark through
    its public API: the test is marked ``@pytest.mark.benchmark(timer=device_time_replay)`` and
    :func:`record_in_benchmark` calls ``benchmark.pedantic(noop, rounds=len(times))``; for each
    round, this clock returns ``t`` on the first call and ``t + duration`` on the second, so the
    round's "duration" is exactly the measured device time. pytest-benchmark then computes and
    stores its statistics (min, median, IQR, ...) of device times, and ``--benchmark-autosave``,
    ``--benchmark-compare`` and ``--benchmark-compare-fail`` work unchanged. The saved JSON names
    this timer in ``options.timer``, so a reader knows the numbers are replayed device times.
    """
    st = _REPLAY
    if not st.started:
        st.started = True
        return st.now
    st.started = False
    if not st.queue:
        raise RuntimeError("device_time_replay: no measured duration queued (use harness.perf.timing.record_in_benchmark)")
    st.now += st.queue.popleft()
    return st.now


def _noop() -> None:
    return None


def record_in_benchmark(benchmark, timing: Timing) -> None:
    """Store ``timing``'s per-repetition times as the ``benchmark`` fixture's rounds (see
    :func:`device_time_replay`). The test must carry ``@pytest.mark.benchmark(timer=device_time_replay)``."""
    st = _REPLAY
    st.queue = collections.deque(t / 1e3 for t in timing.times_ms)
    st.started = False
    try:
        benchmark.pedantic(_noop, rounds=len(timing.times_ms), iterations=1, warmup_rounds=0)
        left = len(st.queue)
    finally:
        st.queue.clear()
        st.started = False
    if left and getattr(benchmark, "enabled", True):
        benchmark.has_error = True  # what it stored is host time of a no-op: keep it out of the files
        raise RuntimeError(
            "record_in_benchmark: pytest-benchmark did not use harness.perf.timing.device_time_replay as its "
            "timer; mark the test with @pytest.mark.benchmark(timer=device_time_replay)"
        )
