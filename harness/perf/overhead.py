"""Host overhead of a backend call: what the host spends launching one call, against the device
time the call's kernels take.

A call costs the host its Python, argument checks, autotune lookup, descriptor set-up and kernel
launches. When that exceeds the kernels' device time, the device idles between calls and a model
runs at the host's pace (the "launch-bound" cells of the bench). Two numbers per (backend, case,
mode), taken in one run:

* **host time per call**: ``WINDOWS`` loops of ``CALLS`` calls enqueued back to back without a
  synchronisation (the device drained before each loop), the host clock around each call; the
  median call counts. A call that finds the launch queue full waits for the device, and then its
  host time is device time: on the H100 a forward with 188 us of kernels averaged 66 us per call
  over 300 back-to-back calls, 16.5 us in loops of 50 (``benchmarks/launch_probe.py``), and loops
  of 50 calls of a 170 us forward averaged 29 us where its neighbours, with the same Python
  (cProfile), took 16 us. Hence short loops (10 calls: at most 30 launches queued by a 3-launch
  backward) and many of them, and the median call; the loop's mean, reported beside it, shows
  what waits are left (a mean well above the median: calls waited on the device, the host was
  not the bottleneck).
* **device time per call**: the same calls replayed from a CUDA graph (no host in the loop), timed
  with CUDA events; when capture fails, the timer's plain device time (then an upper bound).

On a CPU there is no device to run ahead: the host time is the whole call (compute included) and
the device time is not measured; the report says so.

Budgets (issue 16): a forward call at most :data:`HOST_BUDGET_US` ["fwd"], a backward at most
["bwd"].
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from harness.cases import Case, make_inputs
from harness.perf.timing import TimerOptions, Workload, synchronize, time_workload

#: Host microseconds one call may cost, per mode.
HOST_BUDGET_US = {"fwd": 25.0, "bwd": 50.0, "fwd+bwd": 75.0}
#: Calls per host-timed loop and loops per measurement (the median call of all of them counts).
#: Short loops keep the launch queue from filling (see the module docstring).
CALLS = 10
WINDOWS = 25


@dataclass
class Overhead:
    backend: str
    case: str
    mode: str
    host_us: float  # host time per call, the median call (on a CPU: the whole call)
    device_us: float | None  # device time per call (CUDA graph replay when it captured)
    device_clock: str  # "cuda-graph", "cuda-events" (capture failed: an upper bound) or "none (CPU)"
    budget_us: float
    calls_us: list[float]  # every timed call's host microseconds, in order

    @property
    def mean_us(self) -> float:
        """The loops' mean per call: above the median where calls waited on a full launch queue."""
        return statistics.fmean(self.calls_us) if self.calls_us else self.host_us

    @property
    def over_budget(self) -> bool | None:
        """None on a CPU, where the host time is the whole call."""
        return None if self.device_clock.startswith("none") else self.host_us > self.budget_us

    @property
    def host_bound(self) -> bool | None:
        """True when the host's cost per call exceeds the device's: the device would idle."""
        return None if self.device_us is None else self.host_us > self.device_us

    def to_dict(self) -> dict:
        return asdict(self) | {"mean_us": self.mean_us, "over_budget": self.over_budget,
                               "host_bound": self.host_bound}


def host_times(call, device, calls: int = CALLS, windows: int = WINDOWS) -> list[float]:
    """Host microseconds of every ``call()`` in ``windows`` loops of ``calls`` back-to-back calls (the
    device drained before each loop, not inside it), after three calls that compile and fill caches
    (not what a steady call costs)."""
    return host_times_interleaved({"call": call}, device, calls, windows)["call"]


def host_times_interleaved(calls_by_name: dict, device, calls: int = CALLS, windows: int = WINDOWS) -> dict:
    """:func:`host_times` of several callables with their windows interleaved (name -> microseconds of every call):
    three warm-up calls each, then window ``w`` of each in turn, the order rotated each window, so that a host whose
    speed drifts during the run (session 27 read one host's floors at 2.0-4.9 us in one device call) slows each of
    them alike and their ratios hold where their absolute times do not."""
    fns = list(calls_by_name.items())
    for _, fn in fns:
        for _ in range(3):
            fn()
    clock = time.perf_counter
    out = {name: [] for name, _ in fns}
    for w in range(windows):
        for name, fn in fns[w % len(fns):] + fns[:w % len(fns)]:
            synchronize(device)
            times = out[name]
            for _ in range(calls):
                t0 = clock()
                fn()
                times.append((clock() - t0) * 1e6)
    synchronize(device)
    return out


def measure(adapter, case: Case, mode: str = "fwd", *, device=None, seed: int = 0, calls: int = CALLS,
            windows: int = WINDOWS) -> Overhead:
    """Host and device time per call of ``adapter`` on ``case`` in ``mode`` (see the module docstring)."""
    if mode not in HOST_BUDGET_US:
        raise ValueError(f"mode: expected one of {', '.join(HOST_BUDGET_US)}, got {mode!r}")
    if calls < 1 or windows < 1:
        raise ValueError(f"calls and windows: expected positive counts, got {calls} and {windows}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    work = Workload(adapter, case, [make_inputs(case, seed, device)], mode)
    work.prepare()
    try:
        per_call = host_times(lambda: work.call(0), device, calls, windows)
    finally:
        work.release()
    device_us, clock = None, "none (CPU)"
    if device.type == "cuda":
        t = time_workload(Workload(adapter, case, [make_inputs(case, seed, device)], mode), device,
                          TimerOptions(cuda_graph=True, flush_l2="never"))
        device_us = t.median_ms * 1e3
        clock = "cuda-graph" if t.cuda_graph is True else "cuda-events"
    return Overhead(adapter.name, case.id, mode, statistics.median(per_call), device_us, clock,
                    HOST_BUDGET_US[mode], per_call)


class _Null(torch.autograd.Function):
    """What every differentiable attention call pays besides its kernels: autograd's node, the
    output and the three gradients allocated; no kernel launched."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.new_empty((*q.shape[:-1], v.shape[-1]))

    @staticmethod
    def backward(ctx, dout):
        return torch.empty_like(dout), None, None


class AutogradFloor:
    """A stand-in backend for the floor row of the host-overhead table: ``torch.autograd`` and the
    allocator alone (forward: one node and one output; backward: autograd's pass and one gradient).
    A kernel's host time above it is its own; the 25 / 50 us budgets include the floor."""

    name = "autograd floor"
    family = "softmax"
    differentiable = True

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        from harness.adapters.base import SoftmaxOutput

        return SoftmaxOutput(_Null.apply(q, k, v), None)


def markdown(rows: list[Overhead]) -> list[str]:
    """A table: host and device microseconds per call, the budget, and what the ratio means."""
    lines = ["| backend | case | mode | host us / call | loop mean | device us / call | host / device | budget | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.host_us / r.device_us:.2f}" if r.device_us else "-"
        dev = f"{r.device_us:.1f} ({r.device_clock})" if r.device_us is not None else r.device_clock
        verdict = {None: "no budget on a CPU (host time = the whole call)", True: "over budget",
                   False: "within budget"}[r.over_budget]
        if r.host_bound:
            verdict += ", host-bound (the device idles between calls)"
        lines.append(f"| {r.backend} | {r.case} | {r.mode} | {r.host_us:.1f} | {r.mean_us:.1f} | {dev} | {ratio} | "
                     f"{r.budget_us:g} | {verdict} |")
    return lines
