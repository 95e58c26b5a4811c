"""Host overhead per call of the in-repo kernels and their peers (issue 16): host microseconds to
launch one call against the device microseconds of its kernels, with the budgets of
``harness/perf/overhead.py`` (forward 25 us, backward 50 us).

    python benchmarks/host_overhead.py [--backends A,B] [--cases ID,ID] [--modes fwd,bwd] [--out DIR]

Default cases: the FA sweep's causal S=1k hd128 point (where the bench flags the in-repo forward as
launch-bound), the attention-layer report's MQA D64, GQA 32/8 D64 and MQA H40/1 D128 (small
backwards that were host-bound), a decode step and the linear preset at T=4k. Each softmax case
starts with the autograd floor (``overhead.AutogradFloor``: autograd and the allocator, no kernel),
what any differentiable call pays before its own launches; each in-repo kernel's row is followed by
its launch path alone (its launchers called directly: launch, autotune lookup, descriptor set-up,
the part issue 16's budgets are about), then by its launches alone (the same replayed launches with the
tensors of one earlier call: the launch path less its allocations and Python). On a GPU the run starts
with the host's floors: one ``torch.empty`` on the device and one replayed launch of a one-pointer Triton
kernel, what any launch path is made of (hosts differ: session 13's read the forward's launch path at 16 us,
session 26's at 20-32 us for the same code); each launch path is then timed in windows interleaved with the
floors' own (``overhead.host_times_interleaved``), which price it and give it in launch floors: a host
drifting within the run (session 27: floors 2.0-4.9 / 6.2-8.6 us in one call) moves both alike.
``--pin-cpu N`` runs on CPU core N alone (the scheduler cannot move the process between cores mid-loop). Writes overhead.json and overhead.md to --out and prints
the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.adapters import registry  # noqa: E402
from harness.cases import case_from_id, make_inputs  # noqa: E402
from harness.perf import overhead  # noqa: E402

DEFAULT_CASES = (
    "B16-H16-S1024x1024-D128-causal-bf16",
    "B2-H16/1-S2048x2048-D64-bf16",
    "B2-H32/8-S2048x2048-D64-bf16",
    "B1-H40/1-S2048x2048-D128-bf16",
    "B32-H32/8-Q1-L4096r-P64-new-D128-bf16",
    "B4-H32-T4096-K64V64-g_gamma(n=1)-fp16",
)
DEFAULT_BACKENDS = ("triton_fa", "sdpa_flash", "sdpa_cudnn", "flash_attn_cute", "triton_la_chunk", "fla_chunk",
                    "fla_fused_chunk", "triton_decode", "flash_attn_cute_decode")


def launch_path_call(backend: str, case, mode: str, device):
    """``(call, caches)``: one call of an in-repo kernel's own launch path (its launchers called
    directly with their replay caches, kernels/launcher.py; no adapter, no autograd) and the replay
    caches it fills (name -> dict of Launches). None for other backends and for cases whose call form
    the path does not cover (varlen, strided layouts, FP8). A decode step's path: ``decode_attention`` as a
    serving loop calls it (its signature lookup included)."""
    if case.layout != "contiguous" or getattr(case, "fp8", "") or getattr(case, "is_varlen", False):
        return None
    x = make_inputs(case, 0, device)
    fwd_cache, bwd_cache = {}, {}
    if backend == "triton_fa" and case.family == "softmax":
        from kernels.flash_attn.bwd import flash_attn_bwd
        from kernels.flash_attn.fwd import flash_attn_fwd

        left, right = case.window
        kw = dict(softmax_scale=case.scale or case.d ** -0.5, causal=case.causal, window_left=left,
                  window_right=right, softcap=case.softcap)
        if mode == "fwd":
            call = lambda: flash_attn_fwd(x.q, x.k, x.v, **kw, launches=fwd_cache)
        else:
            out, lse = flash_attn_fwd(x.q, x.k, x.v, **kw)
            call = lambda: flash_attn_bwd(x.grad_out, x.q, x.k, x.v, out, lse, **kw, launches=bwd_cache)
    elif backend == "triton_la_chunk" and case.family == "linear":
        from kernels.linear_attn.chunk import chunk_linear_attn_bwd, chunk_linear_attn_fwd

        g = x.g if case.gate == "g" else None
        g_gamma = x.g_gamma if case.gate == "g_gamma" else None
        scale = case.scale or case.d_k ** -0.5
        if mode == "fwd":
            call = lambda: chunk_linear_attn_fwd(x.q, x.k, x.v, g, g_gamma, scale, x.initial_state, True, 64,
                                                 launches=fwd_cache)
        else:
            call = lambda: chunk_linear_attn_bwd(x.q, x.k, x.v, g, g_gamma, scale, x.initial_state, x.grad_out,
                                                 x.grad_final_state, 64, g is not None, launches=bwd_cache)
    elif backend == "triton_decode" and case.family == "decode" and mode == "fwd":
        # a serving loop's step (validate=False, as the adapter calls it): the signature lookup, then the plan's
        # replays (split and combine; the append first where the config does not fuse it). Its launches are those
        # of the one plan its first call leaves in the emptied signature cache (found so in earlier trees' kernels
        # too: host_ab.py compares them)
        from kernels.decode import interface as decode

        kw = dict(cache_seqlens=x.cache_seqlens, block_table=x.block_table, causal=case.causal,
                  softmax_scale=case.scale, window_size=tuple(case.window), softcap=case.softcap)
        call = lambda: decode.decode_attention(x.q, x.k_cache, x.v_cache, x.k, x.v, **kw, return_lse=True,
                                               validate=False)
        decode._SIGNATURES._d.clear()
        call()
        plans = list(decode._SIGNATURES._d.values())
        return (call, plans[0].launches) if len(plans) == 1 else None
    else:
        return None
    return call, (fwd_cache if mode == "fwd" else bwd_cache)


class _Recorder:
    """A Launch that keeps the tensors of the last call it replayed (see :func:`launches_alone`)."""

    def __init__(self, launch):
        self.launch, self.tensors = launch, None

    def __call__(self, tensors) -> bool:
        self.tensors = tensors
        return self.launch(tensors)


def _record(cache: dict) -> list:
    """Wrap every Launch of a launch path's cache (a value, or the last item of a tuple such as the backward's
    plan ``(atomic, split, layout, launches)``) in a :class:`_Recorder`, in place; the recorders in launch order."""
    from kernels.launcher import Launch

    recorders = []
    for key, value in list(cache.items()):
        if isinstance(value, Launch):
            recorders.append(_Recorder(value))
            cache[key] = recorders[-1]
        elif isinstance(value, tuple) and value and isinstance(value[-1], tuple) and value[-1] and all(
                isinstance(x, Launch) for x in value[-1]):
            wrapped = tuple(_Recorder(x) for x in value[-1])
            recorders.extend(wrapped)
            cache[key] = (*value[:-1], wrapped)
    return recorders


def launches_alone(made):
    """A call replaying only the launches of a launch path (``made``: :func:`launch_path_call`'s pair)
    with the tensors an earlier call gave them: no allocation, no argument handling. None where the path
    left nothing to replay (the interpreter compiles nothing). Its ``launches`` attribute: how many
    kernels one call launches."""
    call, cache = made
    call()  # the signature's first call fills the cache
    recorders = _record(cache)
    if not recorders:
        return None
    call()  # the recorders keep this call's tensors (alive as long as they are)
    pairs = [(r.launch, r.tensors) for r in recorders]

    def alone():
        for launch, tensors in pairs:
            launch(tensors)

    alone.launches = len(pairs)
    return alone


def allocations_per_call(call, device, calls: int = 20) -> float | None:
    """How many device allocations one ``call()`` asks torch's caching allocator for (its own count of
    requests, over ``calls`` calls after a warm one); None off CUDA."""
    if device.type != "cuda":
        return None
    call()
    before = torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)
    for _ in range(calls):
        call()
    return (torch.cuda.memory_stats(device).get("allocation.all.allocated", 0) - before) / calls


#: The host's floors (:func:`host_floors`) by name.
FLOOR_EMPTY = "one torch.empty (1 MiB)"
FLOOR_LAUNCH = "one replayed Triton launch (1 pointer)"


def floor_calls(device) -> dict:
    """The host's floors as calls (name -> zero-argument callable): one ``torch.empty`` of 1 MiB on ``device``
    (with its free), and one replayed launch (kernels/launcher.py, as the in-repo kernels launch) of a Triton
    kernel with a single pointer argument. Empty on a CPU."""
    if device.type != "cuda":
        return {}
    import triton
    import triton.language as tl

    from kernels import launcher

    @triton.jit
    def _one_store(X):
        tl.store(X, 1.0)

    x = torch.empty(1, device=device)
    calls = {FLOOR_EMPTY: lambda: torch.empty(1 << 18, device=device)}
    made = launcher.launch(_one_store, (1,), {"X": x})
    if made is not None:
        calls[FLOOR_LAUNCH] = lambda: made({"X": x})
    return calls


def host_floors(floor_fns: dict, device, calls: int) -> dict[str, float]:
    """The host's own costs in microseconds (median call) that any launch path is made of (``floor_fns``:
    :func:`floor_calls`), measured once for the run's header. Empty on a CPU."""
    return {name: statistics.median(overhead.host_times(fn, device, calls)) for name, fn in floor_fns.items()}


@dataclass
class PathTimes:
    """An in-repo kernel's launch path measured (:func:`launch_path`): host microseconds of every timed call of
    the path and of its launches alone, how many kernels a call launches and allocations it asks for."""

    path: list[float]
    alone: list[float] | None
    launches: int | None
    allocations: float | None
    #: the host's floors (median call) measured in windows interleaved with the path's (:func:`launch_path`)
    beside: dict[str, float] | None = None

    def floor_model_us(self, floors: dict[str, float]) -> float | None:
        """What the host's floors price the call's launches and allocations at (each allocation with its free):
        the path's time less this is its own Python. The floors measured beside the path where there are
        (the same moments of a drifting host), else ``floors`` (the run's). None without floors or counts."""
        floors = self.beside or floors
        launch, alloc = floors.get(FLOOR_LAUNCH), floors.get(FLOOR_EMPTY)
        if None in (launch, alloc, self.launches, self.allocations):
            return None
        return self.launches * launch + self.allocations * alloc

    def in_launch_floors(self) -> float | None:
        """The path's median call over the one-pointer launch floor measured beside it: a host's drift moves
        both alike, so this compares trees (and runs) where the microseconds do not. None without it."""
        launch = (self.beside or {}).get(FLOOR_LAUNCH)
        return statistics.median(self.path) / launch if launch else None


def launch_path(backend: str, case, mode: str, device, calls: int, floors: dict | None = None) -> PathTimes | None:
    """An in-repo kernel's own launch path (issue 16's budgets: launch, autotune lookup, descriptor set-up;
    :func:`launch_path_call`) and its launches alone (:func:`launches_alone`), timed; with ``floors``
    (:func:`floor_calls`) the path's windows interleaved with theirs (``PathTimes.beside``). None for other
    backends."""
    made = launch_path_call(backend, case, mode, device)
    if made is None:
        return None
    if floors:
        times = overhead.host_times_interleaved({"path": made[0], **floors}, device, calls)
        path = times.pop("path")
        beside = {name: statistics.median(t) for name, t in times.items()}
    else:
        path, beside = overhead.host_times(made[0], device, calls), None
    allocations = allocations_per_call(made[0], device)
    alone = launches_alone(made)
    return PathTimes(path, None if alone is None else overhead.host_times(alone, device, calls),
                     getattr(alone, "launches", None), allocations, beside)


def decomposition(rows: list[tuple[str, str, str, PathTimes]], floors: dict[str, float]) -> list[str]:
    """A table of the launch paths against the host's floors: each path's median call, its launches and
    allocations per call, the floors measured beside it (interleaved windows; else the run's), what they price
    the launches and allocations at, the rest (the path's own Python), and the call in launch floors."""
    lines = ["| launch path | case | mode | host us / call | launches | allocations | floors beside (empty / launch) | "
             "at those floors | the path's own | in launch floors |", "|---|---|---|---|---|---|---|---|---|---|"]
    for backend, case, mode, t in rows:
        host = statistics.median(t.path)
        model = t.floor_model_us(floors)
        used = t.beside or floors
        ratio = t.in_launch_floors()
        cells = ["-" if t.launches is None else str(t.launches),
                 "-" if t.allocations is None else f"{t.allocations:g}",
                 " / ".join(f"{used[k]:.1f}" if k in used else "-" for k in (FLOOR_EMPTY, FLOOR_LAUNCH))
                 + ("" if t.beside else " (run's)"),
                 "-" if model is None else f"{model:.1f}", "-" if model is None else f"{host - model:.1f}",
                 "-" if ratio is None else f"{ratio:.2f}"]
        lines.append(f"| {backend} | {case} | {mode} | {host:.1f} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default=",".join(DEFAULT_BACKENDS))
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated case ids")
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--device", default=None)
    ap.add_argument("--calls", type=int, default=overhead.CALLS)
    ap.add_argument("--out", default="reports/host-overhead")
    ap.add_argument("--no-floor", action="store_true", help="leave out the autograd-floor row per softmax case")
    ap.add_argument("--no-launch-path", action="store_true",
                    help="leave out the in-repo kernels' launch-path rows (launchers called directly)")
    ap.add_argument("--pin-cpu", type=int, default=None, metavar="N",
                    help="run on CPU core N alone (os.sched_setaffinity), so the scheduler cannot move the loop")
    args = ap.parse_args(argv)
    if args.pin_cpu is not None:
        try:
            os.sched_setaffinity(0, {args.pin_cpu})
        except (AttributeError, OSError, ValueError) as e:
            print(f"host_overhead: --pin-cpu {args.pin_cpu}: {e}", file=sys.stderr)
            return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        cases = [case_from_id(c) for c in args.cases.split(",") if c]
        adapters = [registry.get(b) for b in args.backends.split(",") if b]
    except (KeyError, ValueError) as e:
        print(f"host_overhead: {e}", file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    rows, skipped, paths = [], [], []
    floor_fns = floor_calls(device)
    floors = host_floors(floor_fns, device, args.calls)
    for name, us in floors.items():
        print(f"host floor: {name:40s} {us:8.1f} us", flush=True)
    for case in cases:
        # the floor first: autograd and the allocator alone, what every differentiable call pays
        floor = [overhead.AutogradFloor()] if case.family == "softmax" and not args.no_floor else []
        for a in floor + adapters:
            reason = a.supports(case, device) if hasattr(a, "supports") else None
            if reason:
                if a.family == case.family:
                    skipped.append(f"{a.name} on {case.id}: {reason}")
                continue
            for mode in modes:
                if mode != "fwd" and not a.differentiable:
                    continue
                try:
                    r = overhead.measure(a, case, mode, device=device, calls=args.calls)
                except Exception as e:  # a backend that fails is reported, the run goes on
                    skipped.append(f"{a.name} on {case.id} {mode}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    continue
                rows.append(r)
                first = len(rows) - 1
                made = launch_path(a.name, case, mode, device, args.calls, floor_fns) \
                    if not args.no_launch_path else None
                if made is not None:
                    paths.append((a.name, case.id, mode, made))
                for label, times in (("launch path", made.path), ("launches alone", made.alone)) if made else ():
                    if times is not None:  # the same kernels: the adapter row's device time
                        rows.append(overhead.Overhead(f"{a.name} ({label})", case.id, mode, statistics.median(times),
                                                      r.device_us, r.device_clock, r.budget_us, times))
                for x in rows[first:]:
                    print(f"{x.backend:30s} {case.id:45s} {mode:4s} host {x.host_us:8.1f} us  device "
                          f"{x.device_us if x.device_us is not None else float('nan'):8.1f} us", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps({"device": str(device), "rows": [r.to_dict() for r in rows],
                                                   "skipped": skipped, "budgets_us": overhead.HOST_BUDGET_US,
                                                   "host_floors_us": floors, "pinned_cpu": args.pin_cpu,
                                                   "launch_paths": [{"backend": b, "case": c, "mode": m,
                                                                     "launches": t.launches,
                                                                     "allocations": t.allocations,
                                                                     "floor_model_us": t.floor_model_us(floors),
                                                                     "host_us": statistics.median(t.path),
                                                                     "floors_beside_us": t.beside,
                                                                     "in_launch_floors": t.in_launch_floors()}
                                                                    for b, c, m, t in paths]},
                                                  indent=1) + "\n")
    md = ["# Host overhead per call", "", f"device: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}",
          "", *overhead.markdown(rows), ""]
    if paths:
        md += ["The launch paths against the host's floors (each allocation priced with its free):", "",
               *decomposition(paths, floors), ""]
    if floors:
        md += [f"The host's floors{f' (pinned to CPU {args.pin_cpu})' if args.pin_cpu is not None else ''}: "
               + "; ".join(f"{name} {us:.1f} us" for name, us in floors.items()) + ".", ""]
    if skipped:
        md += ["Not measured:", "", *[f"- {s}" for s in skipped], ""]
    (out / "overhead.md").write_text("\n".join(md))
    print("\n".join(overhead.markdown(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
