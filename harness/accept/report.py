"""The acceptance report: a verdict first, then every failed check with what is needed to act on it.

:func:`judge_case` turns one child's outcome into a case entry (status, failed checks, each with
its replay command), :func:`not_run_case` the entry of a case an interrupt (SIGTERM, Ctrl-C) left
unfinished; :func:`build` assembles the run (verdict ACCEPTED, REJECTED, or INCOMPLETE when it was
interrupted: never an acceptance); :func:`write` writes ``report.json`` and
``report.md`` (and the speed plot on GPU) into ``--out``. Everything needed to reproduce a run is in
the report: the command line, the seeds, versions, the device and the callable's file hash.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.accept.profiles import FEATURES, Profile, case_features
from harness.check.tolerance import _json_number
from harness.check.verify import CaseResult

ACCEPTED = "ACCEPTED"
REJECTED = "REJECTED"
#: The run was interrupted (a time limit's SIGTERM, Ctrl-C) before every case finished: not an acceptance.
INCOMPLETE = "INCOMPLETE"

#: Case statuses that reject the implementation.
FAILING = ("fail", "error", "crash", "timeout")
#: Status of a case that an interrupt left unfinished (never started, or its child was killed).
NOT_RUN = "not run"

#: Rows of the failed-checks table in the markdown (all of them are in the JSON).
MD_MAX_FAILED_ROWS = 60


def _num(x):
    if isinstance(x, float):
        return _json_number(x)
    if isinstance(x, dict):
        return {k: _num(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_num(v) for v in x]
    return x


def _tensor_check(r: CaseResult, t, replay) -> dict:
    w = t.worst
    return {
        "check": t.name, "kind": "tensor", "seed": r.seed, "tensor": t.name,
        "detail": t.reason or t.summary(),
        "error": t.error, "allowed": t.allowed, "bound_ratio": t.budget, "reference_error": t.reference_error,
        "reference_ratio": t.ratio, "factor": t.factor, "floor": t.floor, "nonfinite": t.nonfinite,
        "worst": None if w is None else {
            "index": list(w.index), "value": w.value, "expected": w.expected, "abs_error": w.abs_error,
        },
        "replay": replay(r.seed),
    }


def _first_bad_tensor(d: dict | None):
    """(CaseResult, TensorReport) of the first failed tensor of a nested CaseResult dict."""
    if not d:
        return None, None
    r = CaseResult.from_dict(d)
    bad = [t for t in r.tensors if not t.passed]
    return r, (bad[0] if bad else None)


def judge_case(case, outcome, profile: Profile, replay) -> dict:
    """One case's entry. ``outcome``: a :class:`~harness.accept.isolation.ChildOutcome`;
    ``replay(seed) -> str``: the command replaying this case with that seed."""
    required = profile.is_required(case)
    entry = {
        "case": case.id, "family": case.family, "dtype": case.dtype,
        "features": sorted(case_features(case)), "required": required,
        "optional_because": profile.optional_features(case),
        "status": "pass", "reason": "", "failed_checks": [], "unsupported": None,
        "seeds": [], "anticheat": [], "seconds": round(outcome.seconds, 3), "log": outcome.log_path,
        "replay": replay(None),
    }
    checks = entry["failed_checks"]
    if outcome.kind != "ok":
        kind = {"timeout": "timeout", "crash": "crash"}.get(outcome.kind, "error")
        checks.append({
            "check": kind, "kind": "isolation", "seed": None, "detail": outcome.reason,
            "log_tail": outcome.log_tail[-1500:], "traceback": outcome.traceback[-3000:], "replay": replay(None),
        })
        entry.update(status=kind, reason=f"{kind}: {outcome.reason}")
        return entry
    raw = outcome.result
    results = [CaseResult.from_dict(d) for d in raw["seeds"]]
    entry["seeds"] = raw["seeds"]
    entry["anticheat"] = raw["anticheat"]
    unsupported = next((r for r in results if r.status == "unsupported"), None)
    if unsupported is not None:
        entry["unsupported"] = unsupported.reason
        if required:
            needs = sorted(case_features(case)) or ["the dense base case"]
            checks.append({
                "check": "unsupported_required", "kind": "support", "seed": unsupported.seed,
                "detail": f"declared unsupported ({unsupported.reason}) but profile {profile.name!r} requires "
                          f"this case ({', '.join(needs)})",
                "replay": replay(unsupported.seed),
            })
    if raw.get("unsupported_feature") == "backward":
        entry["unsupported"] = raw.get("unsupported_reason")
        if "backward" in profile.required:
            checks.append({
                "check": "unsupported_required", "kind": "support", "seed": None,
                "detail": f"{raw.get('unsupported_reason')}; profile {profile.name!r} requires backward",
                "replay": replay(None),
            })
    for r in results:
        if r.status == "error":
            checks.append({
                "check": "error", "kind": "exception", "seed": r.seed, "detail": r.reason,
                "traceback": r.error_traceback[-3000:], "replay": replay(r.seed),
            })
        elif r.status == "fail":
            for t in r.tensors:
                if not t.passed:
                    checks.append(_tensor_check(r, t, replay))
            for p in r.properties:
                if p.failed:
                    checks.append({
                        "check": p.name, "kind": "property", "seed": r.seed, "detail": p.detail,
                        "replay": replay(r.seed),
                    })
    first_seed = raw["seeds"][0]["seed"] if raw["seeds"] else None
    for a in raw["anticheat"]:
        if a.get("status") != "fail":
            continue
        c = {"check": a["name"], "kind": "anticheat", "seed": first_seed, "detail": a["detail"],
             "replay": replay(first_seed)}
        sub, t = _first_bad_tensor(a.get("result"))
        if t is not None:
            tc = _tensor_check(sub, t, replay)
            c.update({k: tc[k] for k in ("tensor", "error", "allowed", "bound_ratio", "reference_ratio", "worst",
                                          "nonfinite")})
        if a.get("traceback"):
            c["traceback"] = a["traceback"][-3000:]
        checks.append(c)
    if any(c["kind"] == "exception" for c in checks):
        entry["status"] = "error"
    elif checks:
        entry["status"] = "fail"
    elif unsupported is not None or raw.get("unsupported_feature"):
        entry["status"] = "unsupported"
    if checks:
        c = checks[0]
        others = sorted({x["check"] for x in checks[1:]} - {c["check"]})
        text = c["detail"] if c["detail"].startswith(f"{c['check']}:") else f"{c['check']}: {c['detail']}"
        entry["reason"] = text + (f" (also failed: {', '.join(others)})" if others else "")
    elif entry["status"] == "unsupported":
        entry["reason"] = f"unsupported (not required by {profile.name}: " \
                          f"{', '.join(profile.optional_features(case)) or 'optional'}): {entry['unsupported']}"
    return entry


def not_run_case(case, profile: Profile, reason: str, replay, *, seconds: float = 0.0) -> dict:
    """The entry of a case that did not finish: the run was interrupted before it started, or while
    it ran (its child was killed). ``reason``: why, e.g. "not run: interrupted (SIGTERM)"."""
    return {
        "case": case.id, "family": case.family, "dtype": case.dtype,
        "features": sorted(case_features(case)), "required": profile.is_required(case),
        "optional_because": profile.optional_features(case),
        "status": NOT_RUN, "reason": reason, "failed_checks": [], "unsupported": None,
        "seeds": [], "anticheat": [], "seconds": round(seconds, 3), "log": None, "replay": replay(None),
    }


def verdict_of(cases: list[dict], speed: dict | None, interrupted: str | None = None,
               integrity: list[str] | None = None) -> tuple[str, list[str]]:
    """(ACCEPTED | REJECTED | INCOMPLETE, reasons). Rejected when any case fails, errors, crashes or
    hangs, a required feature is unsupported, the speed section's checks fail, nothing passed, or
    ``integrity`` names a problem with the run itself (the judge's sources changed during it).
    Incomplete when the run was ``interrupted`` (why, e.g. "interrupted (SIGTERM)") or a case did not
    run, whatever the finished cases say: its reasons start with that, then list what failed so far."""
    reasons = list(integrity or []) + [f"{c['case']}: {c['reason']}" for c in cases if c["status"] in FAILING]
    for s in (speed or {}).get("failed_checks", []):
        reasons.append(f"speed {s.get('case', '')}: {s['check']}: {s['detail']}")
    not_run = sum(c["status"] == NOT_RUN for c in cases)
    if interrupted or not_run:
        done = len(cases) - not_run
        head = (f"{interrupted or 'incomplete run'}: {done} of {len(cases)} case(s) finished, {not_run} not run"
                + (f"; {len(reasons)} failure(s) among what finished (listed below)" if reasons else "")
                + ": not an acceptance run (every case must finish)")
        return INCOMPLETE, [head, *reasons]
    if not reasons and not any(c["status"] == "pass" for c in cases):
        reasons.append("no case passed (every case was unsupported)")
    return (REJECTED if reasons else ACCEPTED), reasons


def build(*, run: dict, profile: Profile, cases: list[dict], speed: dict | None,
          interrupted: str | None = None, integrity: list[str] | None = None) -> dict:
    """The report. ``interrupted``: why the run stopped early (e.g. "interrupted (SIGTERM)"), or None;
    ``integrity``: problems with the run itself, each of which rejects."""
    verdict, reasons = verdict_of(cases, speed, interrupted, integrity)
    counts: dict[str, int] = {}
    for c in cases:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    failed = [dict(c, case=e["case"]) for e in cases for c in e["failed_checks"]]
    return _num({
        "verdict": verdict,
        "reasons": reasons,
        "interrupted": interrupted,
        "counts": counts,
        "failed_checks": failed,
        "run": run,
        "profile": profile.summary(),
        "cases": cases,
        "speed": speed,
    })


# --------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------


def _f(x, fmt=".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, fmt)


def _worst(w) -> str:
    if not w:
        return "-"
    return f"{w['index']}: got {_f(w['value'], '.6g')}, expected {_f(w['expected'], '.6g')}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _excerpt(text: str, n: int = 14) -> list[str]:
    """The telling part of a log: from a fatal error's first line (its stack starts with the
    frame that crashed), else the last lines."""
    lines = text.strip().splitlines()
    start = next((i for i, ln in enumerate(lines) if "Fatal Python error" in ln or ln.startswith("Thread ")), None)
    return lines[start:start + n] if start is not None else lines[-n:]


def markdown(rep: dict) -> str:
    run, prof = rep["run"], rep["profile"]
    n = len(rep["cases"])
    bad = sum(1 for c in rep["cases"] if c["status"] in FAILING)
    L = [f"# Acceptance check: {rep['verdict']}", ""]
    head = f"**{rep['verdict']}**: `{run['impl']}` ({run['family']}) on {run['device_words']}, profile `{prof['name']}`"
    if rep["verdict"] == REJECTED:
        head += f": {bad} of {n} case(s) failed." if bad else "."
    elif rep["verdict"] == INCOMPLETE:
        not_run = rep["counts"].get(NOT_RUN, 0)
        head += (f": {rep.get('interrupted') or 'the run did not finish'}; {n - not_run} of {n} case(s) finished, "
                 f"{not_run} not run" + (f", {bad} failed" if bad else "") + ". Not an acceptance run.")
    else:
        head += f": {rep['counts'].get('pass', 0)} of {n} case(s) passed every check."
    L += [head, ""]
    for r in rep["reasons"][:20]:
        L.append(f"- {_cell(r)[:400]}")
    if len(rep["reasons"]) > 20:
        L.append(f"- ... {len(rep['reasons']) - 20} more in report.json")
    if run.get("profile_note"):
        L += ["", f"> {run['profile_note']}"]
    if run.get("filters"):
        L += ["", f"> Filtered run: {run['filters']} (not a full acceptance run)."]
    L.append("")

    failed = rep["failed_checks"]
    if failed:
        L += ["## Failed checks", "",
              "| case | seed | check | tensor | error | allowed | error / allowed | worst element | replay |",
              "|---|---|---|---|---|---|---|---|---|"]
        for c in failed[:MD_MAX_FAILED_ROWS]:
            L.append("| " + " | ".join([
                f"`{c['case']}`", _f(c.get("seed"), "d"), c["check"], c.get("tensor") or "-",
                _f(c.get("error")), _f(c.get("allowed")), _f(c.get("bound_ratio"), ".3g") + ("x" if c.get("bound_ratio") is not None else ""),
                _cell(_worst(c.get("worst"))), f"`{_cell(c['replay'])}`",
            ]) + " |")
        if len(failed) > MD_MAX_FAILED_ROWS:
            L.append(f"\n{len(failed) - MD_MAX_FAILED_ROWS} more failed checks in report.json.")
        L += ["", "Details:", ""]
        shown = set()
        for c in failed[:MD_MAX_FAILED_ROWS]:
            key = (c["case"], c["check"], c.get("seed"))
            if key in shown:
                continue
            shown.add(key)
            seed = "" if c.get("seed") is None else f", seed {c['seed']}"
            L.append(f"- `{c['case']}`{seed}: **{c['check']}** ({c['kind']}): {_cell(c['detail'])[:600]}")
            for k in ("log_tail", "traceback"):
                if c.get(k):
                    L += ["", "  ```", *("  " + ln for ln in _excerpt(c[k])), "  ```"]
        L.append("")

    unsup = [c for c in rep["cases"] if c.get("unsupported")]
    if unsup:
        L += ["## Unsupported", "", "| case | required by the profile | reason |", "|---|---|---|"]
        for c in unsup:
            req = "yes (rejects)" if c["required"] else f"no (optional: {', '.join(c['optional_because'])})"
            L.append(f"| `{c['case']}` | {req} | {_cell(c['unsupported'])} |")
        L.append("")

    not_run = [c for c in rep["cases"] if c["status"] == NOT_RUN]
    if not_run:
        L += ["## Not run", "", f"The run was {rep.get('interrupted') or 'stopped'} before these case(s) finished; "
              "each row's command runs it alone.", "", "| case | reason | replay |", "|---|---|---|"]
        for c in not_run:
            L.append(f"| `{c['case']}` | {_cell(c['reason'])} | `{_cell(c['replay'])}` |")
        L.append("")

    L += ["## Cases", "", "| case | features | required | status | seeds | max error / allowed | anti-cheat | time (s) |",
          "|---|---|---|---|---|---|---|---|"]
    for c in rep["cases"]:
        budgets = [t.get("budget") for s in c["seeds"] for t in s.get("tensors", []) if t.get("budget") is not None]
        budgets = [b if not isinstance(b, str) else math.inf for b in budgets]
        seeds = ", ".join(str(s["seed"]) for s in c["seeds"]) or "-"
        ac = ", ".join(f"{a['name']} {a['status']}" for a in c["anticheat"]) or "-"
        L.append(f"| `{c['case']}` | {', '.join(c['features']) or 'dense'} | {'yes' if c['required'] else 'no'} | "
                 f"{c['status']} | {seeds} | {_f(max(budgets)) if budgets else '-'} | {ac} | {c['seconds']} |")
    L.append("")
    L += [("Checks per case and seed: every output and gradient against the FP64 oracle with the tolerance rule "
          "(`harness/check/tolerance.py`: error <= factor x the eager reference's error in the same dtype + a rounding "
          "floor), output contract (dtype, shape, device), inputs not mutated, every element written "
          "(NaN-poisoned memory), determinism (two runs bitwise), fully-masked rows. Anti-cheat per case: "
          "caching (back-to-back calls on different inputs), re-check after repeated calls, side-stream work "
          "(CUDA only)."), ""]
    if any(a["name"] == "side_stream" and a["status"] == "skipped" for c in rep["cases"] for a in c["anticheat"]):
        L += ["Side-stream check: not applicable on CPU (no streams); it runs on CUDA only.", ""]

    L += ["## Speed", ""]
    sp = rep.get("speed") or {}
    if sp.get("status") != "measured":
        L += [f"Not measured: {sp.get('reason', 'no speed section in this run')}.", ""]
    else:
        L += sp.get("markdown", [])
        L.append("")

    L += ["## Reproduce", "", "```", run["command"], "```", "",
          (f"- base seed {run['base_seed']}, seeds per case {run['seeds_per_case']} "
          f"(case seeds in the table; `--case ID --seed N` replays one)"),
          f"- device: {run['device_words']}",
          (f"- profile `{prof['name']}`: {prof['description']}; required features: "
          f"{', '.join(prof['required_features']) or 'none'}; gradients checked: {'yes' if prof['backward'] else 'no'}"),
          (f"- callable: `{run['impl']}` from `{run.get('module_file')}` (sha256 {run.get('module_sha256')}); "
          f"declared capabilities: {json.dumps(run.get('capabilities'))}"),
          (f"- harness: {run.get('harness')}; isolation: one `{run['start_method']}` child per case, "
          f"timeout {run['timeout_s']} s"),
          f"- started {run['started']}, took {run['seconds']} s", "", "| package | version |", "|---|---|"]
    for k, v in (run.get("versions") or {}).items():
        L.append(f"| {k} | {v} |")
    L.append("")
    L += ["Feature words: " + "; ".join(f"{k}: {v}" for k, v in FEATURES.items()), ""]
    return "\n".join(L)


def write(out_dir: Path, rep: dict) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    j = out_dir / "report.json"
    m = out_dir / "report.md"
    j.write_text(json.dumps(rep, indent=1) + "\n")
    m.write_text(markdown(rep))
    return j, m
