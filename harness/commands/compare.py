"""``python -m harness compare OLD.json NEW.json``: per-case changes with a spread-aware verdict.

The rule and its reasons live in :mod:`harness.perf.reports.compare`. Exit status 1 with
``--fail-on-regression`` when any cell got slower, or a timed cell lost its number; 2 on
unreadable input.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.perf.reports.compare import K_SPREAD, THRESHOLD, compare, load, render


def add_arguments(p) -> None:
    p.add_argument("old", help="benchmark JSON (results.json) of the reference run")
    p.add_argument("new", help="benchmark JSON of the run to judge")
    p.add_argument("--threshold", type=float, default=THRESHOLD,
                   help=f"smallest relative change that counts (default {THRESHOLD:g})")
    p.add_argument("--k", type=float, default=K_SPREAD,
                   help=f"a change must also exceed k x the combined spread IQR/median (default {K_SPREAD:g})")
    p.add_argument("--all", action="store_true", help="list unchanged cells too")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when anything got slower or lost its number")


def main(args) -> int:
    try:
        old, new = load(args.old), load(args.new)
    except (OSError, ValueError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    rows = compare(old, new, threshold=args.threshold, k=args.k)
    text = render(rows, old, new, threshold=args.threshold, k=args.k, show_all=args.all)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    regressed = any(r["verdict"] == "slower" or r.get("lost") for r in rows)
    return 1 if (args.fail_on_regression and regressed) else 0
