"""Where the host time of one backend call goes: cProfile over many calls (issue 16's overhead).

    python benchmarks/host_profile.py BACKEND CASE_ID [--calls 200] [--mode fwd] [--top 25]

The calls run back to back as in a timed loop (after three warm-up calls that compile and fill the
caches); the device is not synchronised inside the profiled loop, so the profile is host work
(Python, argument checks, launches) and not waiting. Prints the functions by cumulative time and
the host microseconds per call.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.adapters import registry  # noqa: E402
from harness.cases import case_from_id, make_inputs  # noqa: E402
from harness.perf.timing import Workload, synchronize  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backend")
    ap.add_argument("case")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--mode", default="fwd")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        adapter, case = registry.get(args.backend), case_from_id(args.case)
    except (KeyError, ValueError) as e:
        print(f"host_profile: {e}", file=sys.stderr)
        return 2
    reason = adapter.supports(case, device)
    if reason:
        print(f"host_profile: {adapter.name} does not run {case.id}: {reason}", file=sys.stderr)
        return 2
    work = Workload(adapter, case, [make_inputs(case, 0, device)], args.mode)
    work.prepare()
    for _ in range(3):
        work.call(0)
    synchronize(device)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(args.calls):
        work.call(0)
    prof.disable()
    host_us = (time.perf_counter() - t0) / args.calls * 1e6
    synchronize(device)
    work.release()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(args.top)
    print(buf.getvalue())
    print(f"{adapter.name} on {case.id} ({args.mode}): {host_us:.1f} us of host time per call, profiled "
          f"(cProfile adds its own cost; benchmarks/host_overhead.py measures without it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
