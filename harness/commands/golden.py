"""``python -m harness golden``: check or regenerate the golden store (``golden/``).

``--check``: every file's hash, the inputs regenerate bit for bit, the oracle reproduces every
tensor (exit 1 naming the file otherwise); ``--regenerate``: rewrite every file and the manifest
(after an intended oracle change: bump ``ORACLE_VERSION``); ``--list``: the golden cases. The store
itself is :mod:`harness.check.golden`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.check.golden import check, golden_cases, regenerate


def add_arguments(parser) -> None:
    g = parser.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="verify hashes and that the oracle reproduces every file")
    g.add_argument("--regenerate", action="store_true", help="rewrite every golden file and the manifest")
    g.add_argument("--list", action="store_true", help="list the golden cases")
    parser.add_argument("--dir", type=Path, default=None, help="golden directory (default: golden/ of the project)")


def main(args) -> int:
    if args.list:
        for case, seed in golden_cases():
            print(f"{case.id}  seed={seed}")
        return 0
    if args.regenerate:
        path = regenerate(args.dir)
        print(f"regenerated {path}")
        return 0
    problems = check(args.dir)
    for p in problems:
        print(f"FAIL {p}", file=sys.stderr)
    print("golden store: OK" if not problems else f"golden store: {len(problems)} problem(s)")
    return 0 if not problems else 1
