"""Re-check recorded cases many times: is a fuzz finding repeatable, and how does it move with size?

Each (backend, case) is verified ``--repeat`` times with the harness's own check (FP64 oracle on the
case's seeded inputs, poisoned memory, the forward run twice for determinism), in this process. One
line per check: status, the failed checks, and every compared tensor's error as a multiple of the
reference's (the tolerance rule's ratio; the bound beside it). ``--sdpa`` re-runs each check with
torch SDPA restricted to one backend at a time (``default`` = torch's own choice), to name the SDPA
kernel behind a finding of an SDPA-based adapter.

    python benchmarks/replay_case.py --backend decode_sdpa --seed 202000607 --repeat 20 \\
        --case B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16 --sdpa default,efficient,cudnn,math

Exit status: 0 (the lines are the result; nothing is judged here).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys

import torch

_SDPA = {"default": None, "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
         "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


def _sdpa_context(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if _SDPA[name] is None:
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, _SDPA[name])])


def main(argv=None) -> int:
    from harness.cases import case_from_id
    from harness.check.verify import prepare, verify

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", required=True, help="registered backend name(s), comma-separated")
    p.add_argument("--case", action="append", required=True, metavar="ID", help="a case id (repeatable)")
    p.add_argument("--seed", required=True, help="input seed(s), comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--sdpa", default="default", help=f"comma-separated subset of {sorted(_SDPA)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    sdpa = args.sdpa.split(",")
    bad = [s for s in sdpa if s not in _SDPA]
    if bad:
        p.error(f"--sdpa: unknown {bad}; choose from {sorted(_SDPA)}")
    tally: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for seed, case_id in ((int(s), c) for s in args.seed.split(",") for c in args.case):
        case = case_from_id(case_id)
        baseline = prepare(case, seed=seed, device=args.device)
        for backend in args.backend.split(","):
            for s in sdpa:
                for i in range(args.repeat):
                    try:
                        with _sdpa_context(s):
                            r = verify(backend, case, baseline=baseline)
                    except RuntimeError as e:  # a restricted SDPA with no kernel for the case
                        print(f"{backend:18} {s:9} {case_id} s{seed} #{i}: refused: {str(e).splitlines()[0][:90]}")
                        tally[(backend, s, case_id, seed)]["refused"] += 1
                        break
                    ratios = " ".join(f"{t.name}={t.ratio:.2f}x/{t.factor:g}x" for t in r.tensors)
                    print(f"{backend:18} {s:9} {case_id} s{seed} #{i}: {r.status:11} {','.join(r.failures) or '-':12} {ratios}"
                          + (f" | {r.reason[:110]}" if r.status != "pass" else ""), flush=True)
                    tally[(backend, s, case_id, seed)][r.status] += 1
    print("\nsummary (backend, sdpa, case, seed: statuses over the repeats)")
    for (backend, s, case_id, seed), c in tally.items():
        print(f"  {backend:18} {s:9} {case_id} s{seed}: {dict(c)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
