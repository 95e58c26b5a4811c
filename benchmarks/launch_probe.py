"""Where an in-repo launch path's host microseconds go (issue 16's budgets), one case at a time.

    python benchmarks/launch_probe.py [--cases ID,ID] [--modes fwd,bwd] [--calls 300]

For each case and mode, on the launch path of ``benchmarks/host_overhead.py`` (the in-repo
launchers called directly with their replay caches): whether steady calls replay (how many full
launches the calls after warm-up made: 0 expected), each cached Launch (grid, global scratch bytes,
direct C launcher or Triton's Python wrapper), the host microseconds of a whole call and of each
replay alone (``harness.perf.overhead.host_times``: the median call, and the loops' mean, which is
above it where calls waited on a full launch queue), and a cProfile of the call (top functions by own
time). A GPU run; it prints everything it measured.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.host_overhead import launch_path_call  # noqa: E402
from harness.cases import case_from_id  # noqa: E402
from harness.perf import overhead  # noqa: E402
from kernels import launcher  # noqa: E402
from kernels.flash_attn import configs as fa_configs  # noqa: E402

CASES = ("B2-H16/1-S2048x2048-D64-bf16", "B2-H32/8-S2048x2048-D64-bf16", "B1-H40/1-S2048x2048-D128-bf16",
         "B16-H16-S1024x1024-D128-causal-bf16")


def per_call_us(fn, calls: int) -> str:
    """Host microseconds per call of ``fn`` over 5 loops of ``calls`` back-to-back calls: the median
    call and the loops' mean."""
    times = overhead.host_times(fn, "cuda", calls, windows=5)  # long loops: they show queue waits
    return f"{statistics.median(times):.1f} us (mean {statistics.fmean(times):.1f})"


def full_launches(call, calls: int) -> int:
    """How many launches of ``calls`` calls took the full (non-replayed) path."""
    count = [0]
    originals = fa_configs.launch, launcher.launch

    def counting(orig):
        def wrapped(*a, **k):
            count[0] += 1
            return orig(*a, **k)
        return wrapped

    fa_configs.launch, launcher.launch = counting(originals[0]), counting(originals[1])
    try:
        for _ in range(calls):
            call()
    finally:
        fa_configs.launch, launcher.launch = originals
    return count[0]


def describe(name: str, launch) -> str:
    if not isinstance(launch, launcher.Launch):
        return f"{name}: {launch!r}"
    return (f"{name}: grid {launch.grid}, scratch {launch._scratch_bytes} B, "
            f"{'direct C launcher' if launch._launch is not None else 'Triton wrapper'}, "
            f"{len(launch.slots)} tensor slots of {len(launch.template)} arguments")


def probe(case_id: str, mode: str, calls: int) -> None:
    case = case_from_id(case_id)
    made = launch_path_call("triton_fa" if case.family == "softmax" else "triton_la_chunk", case, mode, "cuda")
    if made is None:
        print(f"{case_id} {mode}: no launch path")
        return
    call, cache = made
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    print(f"== {case_id} {mode}")
    print(f"  full launches in {calls} steady calls: {full_launches(call, calls)} (0: every call replays)")
    for name, launch in cache.items():
        print("  " + describe(name, launch))
    print(f"  whole call: {per_call_us(call, calls)}")
    captured = _captured_tensors(call)  # the tensors each replay was called with, from one more call
    for name, launch in cache.items():
        if isinstance(launch, launcher.Launch) and id(launch) in captured:
            alone = per_call_us(functools.partial(launch, captured[id(launch)]), calls)
            print(f"  replay {name} alone: {alone}")
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    print(f"  cProfile, {calls} calls (own time; cProfile adds its own cost):")
    for line in text.getvalue().splitlines():
        if line.strip() and (line.lstrip()[0].isdigit() or "ncalls" in line):
            print("    " + line)


def _captured_tensors(call) -> dict:
    """id(Launch) -> the tensors it replayed with during one ``call()`` (Launch.__call__ wrapped for
    that call only, so the timings above and below run the real one)."""
    seen, orig = {}, launcher.Launch.__call__

    def remembering(self, tensors):
        seen[id(self)] = dict(tensors)
        return orig(self, tensors)

    launcher.Launch.__call__ = remembering
    try:
        kept = call()  # kept alive while the replays alone run with its tensors
    finally:
        launcher.Launch.__call__ = orig
    seen["kept"] = kept
    return seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default="fwd,bwd")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    for c in args.cases.split(","):
        for m in args.modes.split(","):
            probe(c, m, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
