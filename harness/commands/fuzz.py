"""``python -m harness fuzz (--backends NAMES | --impl MODULE:CALLABLE) [--family] [--device] [--dtypes]
[--budget 10m] [--max-cases N] [--seed N] [--out DIR]``: random edge cases inside each backend's
declared support, each checked against the FP64 oracle with the tolerance rule and the property
checks, the candidate in a child process (a crash or a hang is a failed case, not a dead run).
``--backends all``: every registered backend of the family that supports some drawn case on this
device and dtypes; those that support none (not installed, CUDA only, FP8 only) sit out with their
reason, printed and in the report.

Every case goes to ``fuzz.jsonl`` as it finishes (a run stopped by a time limit keeps what it
did); ``report.md`` / ``report.json`` list every failure with its case id, seed and the command
that shrinks it (``python -m harness shrink``). A run is reproducible from its seed. Exit status:
0 when nothing failed, 1 when something did (a recorded third-party defect counts as "known", not
as a failure), 2 on bad arguments.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from harness.check import fuzz as F
from harness.check.known_issues import explaining


def _budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m:
        raise ValueError(f"--budget: expected a duration such as 90s, 10m or 1h, got {text!r}")
    return float(m[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[m[2]]


def add_arguments(p) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--backends", default=None, metavar="NAMES",
                     help="comma-separated registered backends, or 'all': every backend of the family that runs "
                          "some drawn case here (the others are listed with their reason)")
    who.add_argument("--impl", default=None, metavar="MODULE:CALLABLE", help="a callable (the adapters' contract)")
    p.add_argument("--family", choices=("softmax", "linear", "decode"), default="softmax")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--dtypes", default=None, help="comma-separated (default: fp32,fp16 on CPU; bf16,fp16 on CUDA)")
    p.add_argument("--budget", default="2m", help="how long to draw cases (default 2m; e.g. 90s, 10m, 1h)")
    p.add_argument("--max-cases", type=int, default=None, help="stop after this many cases per backend")
    p.add_argument("--seed", type=int, default=None, help="reproduce a run (default: drawn, in the report)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case before the child is killed")
    p.add_argument("--out", type=Path, default=None, help="report directory (default reports/fuzz-<timestamp>)")


def _usage(msg: str) -> int:
    print(f"python -m harness fuzz: error: {msg}", file=sys.stderr)
    return 2


def main(args) -> int:
    import os

    import torch

    from harness.accept.isolation import ChildFailed
    from harness.accept.remote import RemoteVerifier
    from harness.adapters import registry
    from harness.cases import DTYPES

    try:
        budget = _budget(args.budget)
    except ValueError as e:
        return _usage(str(e))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        return _usage("--device cuda: torch.cuda.is_available() is False on this machine")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the in-repo kernels on the CPU
    dtypes = [d for d in (args.dtypes or ("bf16,fp16" if device == "cuda" else "fp32,fp16")).split(",") if d]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        return _usage(f"--dtypes: unknown {', '.join(bad)}; known: {', '.join(DTYPES)}")
    if not args.backends and not args.impl:
        return _usage("give --backends NAMES or --impl MODULE:CALLABLE")
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    out = Path(args.out or Path("reports") / f"fuzz-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    limits = F.GPU_LIMITS if device == "cuda" else F.CPU_LIMITS
    every = (args.backends or "").strip() == "all"
    names = (registry.names(args.family) if every
             else [n.strip() for n in (args.backends or "").split(",") if n.strip()])
    for n in names:
        try:
            a = registry.get(n)
        except KeyError as e:
            return _usage(f"--backends: {e.args[0]}")
        if a.family != args.family:
            return _usage(f"--backends: {n} is a {a.family}-attention backend; this run is --family {args.family}")
    specs = [("backend", n) for n in names] or [("impl", args.impl)]
    runners, streams, skipped_backends = [], [], {}
    for kind, name in specs:
        if every:  # a backend that supports none of the draws (not installed, another device or dtype) sits out
            declared = registry.get(name)
            try:
                next(F.cases_for(declared, family=args.family, dtypes=dtypes, device=torch.device(device),
                                 seed=seed, limits=limits))
            except ValueError:
                probe = F.draw(random.Random(seed), args.family, dtypes, limits)
                skipped_backends[name] = declared.supports(probe, torch.device(device)) or "no drawn case supported"
                continue
        r = RemoteVerifier(out / "work", family=args.family, device=device, timeout=args.timeout,
                           **{kind: name}, threads=None)
        try:
            adapter = r.adapter()
        except ChildFailed as e:
            if every:
                skipped_backends[name] = f"its child did not start: {e.outcome.reason}"
                continue
            return _usage(f"{name}: {e.outcome.reason}")
        runners.append(r)
        streams.append(F.cases_for(adapter, family=args.family, dtypes=dtypes, device=torch.device(device),
                                   seed=seed, limits=limits))
    if not runners:
        return _usage(f"no {args.family} backend runs any drawn case on {device} in {', '.join(dtypes)}: "
                      + "; ".join(f"{n}: {why}" for n, why in skipped_backends.items()))
    for n, why in skipped_backends.items():
        print(f"fuzz: {n} sits out: {why}", file=sys.stderr)
    from tqdm import tqdm

    from harness.interrupts import SigtermInterrupt

    log = (out / "fuzz.jsonl").open("w")
    t0 = time.perf_counter()
    done, failures, known, rejected = 0, [], 0, 0
    bar = tqdm(desc="fuzz", unit="case", file=sys.stderr, dynamic_ncols=True, disable=None)
    per_backend = {r.name: {"cases": 0, "pass": 0, "fail": 0, "error": 0, "unsupported": 0, "known": 0}
                   for r in runners}
    sigterm = SigtermInterrupt()  # an outer time limit's SIGTERM: stop and still write the report
    interrupted = False
    sigterm.install()
    print(f"fuzz: {', '.join(r.name for r in runners)} on {device} in {', '.join(dtypes)}, seed {seed}, budget "
          f"{budget:.0f} s; Ctrl-C or SIGTERM stops and writes the report of what finished", file=sys.stderr, flush=True)
    try:
        while time.perf_counter() - t0 < budget:
            progressed = False
            for r, stream in zip(runners, streams):
                if args.max_cases is not None and per_backend[r.name]["cases"] >= args.max_cases:
                    continue
                if time.perf_counter() - t0 >= budget:
                    break
                drawn, skipped = next(stream)
                rejected += skipped
                res = r.verify(drawn.case, drawn.seed, backward=True)
                issue = explaining(r.name, drawn.case, device, res.status, res.reason)
                outcome = "known" if issue else res.status
                per_backend[r.name]["cases"] += 1
                per_backend[r.name][outcome] += 1
                rec = {"backend": r.name, "index": drawn.index, "case": drawn.case.id, "seed": drawn.seed,
                       "status": outcome, "reason": res.reason, "failures": res.failures,
                       "seconds": round(res.seconds, 3), "known_issue": issue.describe() if issue else ""}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                done += 1
                progressed = True
                if outcome in ("fail", "error"):
                    failures.append(rec)
                known += outcome == "known"
                rate = done / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix_str(f"{rate:.2f} cases/s, {len(failures)} failures", refresh=False)
                bar.update(1)
            if not progressed:
                break
    except KeyboardInterrupt as e:
        interrupted = True
        print(f"\ninterrupted{' (SIGTERM)' if str(e) == 'SIGTERM' else ''}: reporting what finished", file=sys.stderr)
    finally:
        sigterm.armed = False  # from here on a SIGTERM waits for the report
        bar.close()
        log.close()
        for r in runners:
            r.close(now=interrupted)
    try:
        return _report(args, out, device, dtypes, seed, time.perf_counter() - t0, done, rejected, per_backend,
                       skipped_backends, failures, known)
    finally:
        sigterm.restore()


def _report(args, out, device, dtypes, seed, seconds, done, rejected, per_backend, skipped_backends, failures,
            known) -> int:
    who = f"--backends {args.backends}" if args.backends else f"--impl {args.impl}"
    replay = (f"python -m harness fuzz {who} --family {args.family} --device {device} --dtypes {','.join(dtypes)} "
              f"--seed {seed}" + (f" --max-cases {args.max_cases}" if args.max_cases else f" --budget {args.budget}"))
    for f in failures:
        target = f"--backend {f['backend']}" if args.backends else f"--impl {args.impl}"
        f["shrink"] = (f"python -m harness shrink {target} --family {args.family} --device {device} "
                       f"--case '{f['case']}' --seed {f['seed']}")
    rep = {"seed": seed, "device": device, "dtypes": dtypes, "seconds": round(seconds, 1), "cases": done,
           "rejected_draws": rejected, "per_backend": per_backend, "skipped_backends": skipped_backends,
           "failures": failures, "known": known,
           "replay": replay}
    (out / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    (out / "report.md").write_text(_markdown(rep))
    print(f"fuzz: {done} cases in {seconds:.0f} s ({done / max(seconds, 1e-9):.2f}/s), {len(failures)} failures, "
          f"{known} known third-party defects; seed {seed}")
    for f in failures[:20]:
        print(f"  {f['status'].upper()} {f['backend']} {f['case']} seed {f['seed']}: {f['reason'][:160]}")
    print(f"report: {out / 'report.md'}")
    return 1 if failures else 0


def _markdown(rep: dict) -> str:
    L = ["# Fuzz run", "",
         f"{rep['cases']} cases in {rep['seconds']} s on {rep['device']} ({', '.join(rep['dtypes'])}), seed "
         f"{rep['seed']}: **{len(rep['failures'])} failures**, {rep['known']} known third-party defects. "
         f"Replay: `{rep['replay']}`", "",
         "| backend | cases | pass | fail | error | unsupported | known |", "|---|---|---|---|---|---|---|"]
    for name, c in rep["per_backend"].items():
        L.append(f"| {name} | {c['cases']} | {c['pass']} | {c['fail']} | {c['error']} | {c['unsupported']} | {c['known']} |")
    if rep.get("skipped_backends"):
        L += ["", "Not run here: " + "; ".join(f"{n} ({why})" for n, why in rep["skipped_backends"].items()) + "."]
    if rep["failures"]:
        L += ["", "## Failures", "", "| backend | case | seed | status | reason | shrink |", "|---|---|---|---|---|---|"]
        for f in rep["failures"]:
            L.append(f"| {f['backend']} | `{f['case']}` | {f['seed']} | {f['status']} | "
                     f"{f['reason'][:300].replace('|', '/')} | `{f['shrink']}` |")
    return "\n".join(L) + "\n"
