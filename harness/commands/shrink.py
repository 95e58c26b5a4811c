"""``python -m harness shrink (--backend NAME | --impl MODULE:CALLABLE) --case ID --seed N [--family]
[--device] [--out DIR]``: the smallest case that fails the same check for the same reason, what each
feature of the original did, and a standalone reproduction script.

The failing case is shrunk by :func:`harness.check.shrink.shrink` (features switched off one at a
time, then smaller sizes, fp32 last), each step verified against the FP64 oracle with the candidate
in a child process (:class:`harness.accept.remote.RemoteVerifier`). The minimal case, a table of
features (needed / dropped) and every step go to ``shrink.md`` / ``shrink.json``; ``repro_<name>.py``
(:mod:`harness.check.repro`) needs torch and the backend only and exits 1 while the defect exists.

Exit status: 0 when the case was shrunk and the script written; 1 when the case does not fail
(nothing to shrink); 2 on bad arguments.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def add_arguments(p) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--backend", default=None, metavar="NAME", help="a registered backend")
    who.add_argument("--impl", default=None, metavar="MODULE:CALLABLE", help="a callable (the adapters' contract)")
    p.add_argument("--case", required=True, metavar="ID", help="the failing case's id (as a report prints it)")
    p.add_argument("--seed", type=int, required=True, help="its input seed")
    p.add_argument("--family", choices=("softmax", "linear", "decode"), default=None, help="default: the case's")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per check before the child is killed")
    p.add_argument("--max-checks", type=int, default=400, help="stop after this many verifications")
    p.add_argument("--out", type=Path, default=Path("shrink-report"), help="report folder (default shrink-report/)")


def _usage(msg: str) -> int:
    print(f"python -m harness shrink: error: {msg}", file=sys.stderr)
    return 2


def main(args) -> int:
    import os

    import torch

    from harness.accept.isolation import ChildFailed
    from harness.accept.remote import RemoteVerifier
    from harness.cases import case_from_id
    from harness.check import repro
    from harness.check.known_issues import explaining
    from harness.check.shrink import shrink

    if not args.backend and not args.impl:
        return _usage("give --backend NAME or --impl MODULE:CALLABLE")
    try:
        case = case_from_id(args.case)
    except ValueError as e:
        return _usage(f"--case: {e}")
    family = args.family or case.family
    if family != case.family:
        return _usage(f"--family {family}: {args.case} is a {case.family} case")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        return _usage("--device cuda: torch.cuda.is_available() is False on this machine")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kind, name = ("backend", args.backend) if args.backend else ("impl", args.impl)
    verifier = RemoteVerifier(out / "work", family=family, device=device, timeout=args.timeout, **{kind: name})
    try:
        adapter = verifier.adapter()
    except ChildFailed as e:
        return _usage(f"{name}: {e.outcome.reason}")
    dev = torch.device(device)

    def check(c):
        return verifier.verify(c, args.seed)

    def supported(c):
        return not adapter.supports(c, dev)

    def known(c, r):
        if not args.backend:
            return None
        issue = explaining(args.backend, c, dev, r.status, r.reason)
        return issue.describe() if issue else None

    print(f"shrink {name} on {case.id} (seed {args.seed}, {device}):", flush=True)
    try:
        result = shrink(case, check, supported=supported, known=known, max_checks=args.max_checks,
                        log=lambda m: print(m, flush=True))
    except ValueError as e:
        print(f"shrink: {e}")
        return 1
    finally:
        verifier.close()
    minimal = result.minimal
    status, failed = result.signature
    safe = re.sub(r"[^A-Za-z0-9_]+", "_", (args.backend or args.impl.split(":")[0])).strip("_")
    script = out / f"repro_{safe}.py"
    why_no_script = repro.supported(args.backend, args.impl, family)
    if why_no_script is None:
        repro.write_repro(script, case=minimal, seed=args.seed, result=result.result, backend=args.backend,
                          impl=args.impl, device=device)
    features = result.features()
    rep = {
        "backend": name, "device": device, "seed": args.seed, "original": case.id, "minimal": minimal.id,
        "signature": {"status": status, "check": failed}, "reason": result.result.reason, "checks": result.checks,
        "features": [{"feature": f, "outcome": o} for f, o in features],
        "steps": [{"what": s.what, "kept": s.kept, "outcome": s.outcome} for s in result.steps],
        "repro": str(script) if why_no_script is None else None, "repro_missing": why_no_script,
    }
    (out / "shrink.json").write_text(json.dumps(rep, indent=1) + "\n")
    lines = [f"# Shrunk: {name}", "", f"- original: `{case.id}` (seed {args.seed}, {device})",
             f"- minimal: `{minimal.id}` — still `{status}` on `{failed}` after {result.checks} checks",
             f"- reason: {result.result.reason}",
             f"- standalone repro: `{script.name}`" if why_no_script is None else f"- no standalone repro: {why_no_script}",
             "", "| feature of the original | outcome |", "|---|---|"]
    lines += [f"| {f} | {o} |" for f, o in features] or ["| (none) | |"]
    lines += ["", "Every step:", ""] + [f"- {'kept' if s.kept else 'not kept'}: {s.what}: {s.outcome}"
                                        for s in result.steps]
    (out / "shrink.md").write_text("\n".join(lines) + "\n")
    print(f"\nminimal: {minimal.id}  ({status}: {failed})")
    for f, o in features:
        print(f"  {f}: {o}")
    print(f"repro: {script}" if why_no_script is None else f"no standalone repro: {why_no_script}")
    print(f"report: {out / 'shrink.md'}")
    return 0
