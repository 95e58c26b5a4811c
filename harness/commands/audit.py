"""``python -m harness audit CLAIMS... [--measure] [--as-gpu NAME] [--tolerance 10%] [--out DIR]``:
published benchmark claims checked for consistency, against the named GPU's datasheet, and (with
``--measure``, on that GPU) against measurements.

The claims format is :mod:`harness.perf.claims`; the rules are :mod:`harness.perf.audit`. The report
(``report.md``, ``report.json``; one line per claim, verdict first) goes to ``--out``. Exit status:
0 when nothing is impossible or contradicted, 1 otherwise, 2 for a malformed claims file (the
message names the file, the line and the field) or bad options.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.perf import audit as A
from harness.perf.claims import ClaimsError, load

DEFAULT_OUT = "audit-report"


def add_arguments(p) -> None:
    p.add_argument("claims", nargs="+", metavar="CLAIMS", help="claims files (CSV; see harness/perf/claims.py)")
    p.add_argument("--measure", action="store_true",
                   help="measure every configuration the harness can run on the GPU here (claims of another GPU: "
                        "ordering checks)")
    p.add_argument("--as-gpu", default=None, metavar="NAME",
                   help="with --measure: take the device here for NAME (e.g. 'H100 SXM') when matching claims")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--tolerance", default="10%", help="how far two numbers may disagree (default 10%%), "
                                                    "beyond the rounding of the printed numbers")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"report directory (default {DEFAULT_OUT}/)")


def main(args) -> int:
    try:
        tol = A.tolerance_arg(args.tolerance)
        claims = [c for path in args.claims for c in load(path)]
    except (ClaimsError, ValueError) as e:
        print(f"python -m harness audit: error: {e}", file=sys.stderr)
        return 2
    device = None
    if args.measure:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rep = A.audit(claims, tolerance=tol, measure_on=device, as_gpu=args.as_gpu,
                  log=lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    (out / "report.md").write_text(A.markdown(rep))
    s = rep["summary"]
    print(", ".join(f"{s[v]} {v}" for v in A.SEVERITY if s[v]) + f" (of {s['claims']} claims)")
    for r in rep["claims"]:
        if r["verdict"] in A.FAILING:
            first = next(f for f in r["findings"] if f["kind"] == r["verdict"])
            print(f"  {r['verdict'].upper()} {r['where']}: {r['claim']}: {first['text']}")
    print(f"report: {out / 'report.md'} and {out / 'report.json'}")
    return 1 if s["fails"] else 0
