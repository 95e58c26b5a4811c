"""The main job's second step: every backend on every case it supports, and its report.

:func:`run_all` verifies each same-family (adapter, case) pair with :func:`harness.check.verify.verify`
(serially, or in ``jobs`` worker processes), building each case's oracle and reference once
per process; :func:`mark_known_issues` labels failures that match a recorded third-party defect;
:func:`format_table` and :func:`write_reports` give the table and ``report.md`` / ``report.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from harness.check.selfcheck import SelfCheck


def _supports(adapter, case, device) -> str | None:
    try:
        return adapter.supports(case, device)
    except Exception:
        return None  # let verify run it and report the exception as an error


class _Progress:
    """A tqdm bar on a terminal; one line per finished (backend, case) otherwise (logs, CI)."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm

        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.lines = enabled and not sys.stderr.isatty()
        self.bar = tqdm(total=total, desc="verify", unit="run", disable=True if (not enabled or self.lines) else None,
                        file=sys.stderr, dynamic_ncols=True)

    def skip(self, n: int) -> None:
        self.done += n
        self.bar.update(n)

    def result(self, r, seconds: float) -> None:
        self.done += 1
        self.bar.set_postfix_str(f"{r.backend} {r.case}", refresh=False)
        self.bar.update(1)
        if self.lines and r.status != "unsupported":
            elapsed = time.perf_counter() - self.t0
            print(f"[{self.done}/{self.total} {elapsed:6.0f}s] {r.backend} {r.case}: {r.status} ({seconds:.1f} s)",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def _pairs(cases, adapters):
    """(case index, adapter index) of every same-family pair, case-major (the report's order)."""
    return [(ci, ai) for ci, c in enumerate(cases) for ai, a in enumerate(adapters) if a.family == c.family]


_BASELINES: dict = {}  # per process: (case id, seed, device) -> Baseline


def _verify_one(adapter, case, seed, device, check_backward):
    from harness.check.verify import CaseResult, prepare, verify

    reason = _supports(adapter, case, device)
    if reason:
        return CaseResult(adapter.name, case.id, case.family, case.dtype, str(device), seed, "unsupported", str(reason))
    key = (case.id, seed, str(device))
    built = None
    if key not in _BASELINES:
        _BASELINES.clear()  # case-major order: the previous case's oracle is no longer needed
        t0 = time.perf_counter()
        base = prepare(case, seed=seed, device=device)
        base.reference_errors  # noqa: B018 - built here, so that its cost is the baseline's, not a judge's
        _BASELINES[key] = base
        built = time.perf_counter() - t0
    result = verify(adapter, case, baseline=_BASELINES[key], check_backward=check_backward)
    if built is not None:  # the first backend of a case pays for its oracle and reference
        result.timings["baseline_s"] = built
    return result


#: Set in a worker process when a pair lost its CUDA context (a sticky error such as a misaligned
#: address: every later CUDA call in the process fails); the process is then replaced.
_LOST: str | None = None


def context_lost(device) -> str | None:
    """Why this process's CUDA context is unusable (a sticky error from the last pair), or None."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as e:  # torch.AcceleratorError / RuntimeError: "CUDA error: ..."
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return None


def _worker(task):
    """One (adapter, case) in a worker process (:func:`worker_start`): (result, seconds)."""
    global _LOST
    import torch

    from harness.adapters import registry

    name, case, seed, device, check_backward = task
    t0 = time.perf_counter()
    r = _verify_one(registry.get(name), case, seed, torch.device(device), check_backward)
    _LOST = context_lost(device)
    if _LOST:
        r.reason = (f"{r.reason}; " if r.reason else "") + (
            f"the CUDA context was lost in this pair ({_LOST}): its worker process was replaced")
    return r, time.perf_counter() - t0


def _lost() -> str | None:
    """Checked in a worker after each pair (harness.check.pool): a lost context retires the process."""
    return f"a worker lost its CUDA context: {_LOST}" if _LOST else None


def _warm_up(device: str) -> None:
    """A worker's set-up before its first pair: the imports and a CUDA context with cuBLAS."""
    import torch

    import harness.adapters.registry  # noqa: F401 - every adapter module
    import harness.check.verify  # noqa: F401

    dev = torch.device(device)
    if dev.type == "cuda":
        x = torch.ones(8, 8, device=dev)
        (x @ x).sum().item()


def worker_start(device) -> dict:
    """How the worker processes start (harness.check.pool): spawned for a CUDA device, where each
    needs a process that never forked with a CUDA context or a driver touched by an import; forked
    from a server that imported torch and the verifier once (``pool.FORKSERVER_PRELOAD``) on a CPU,
    where spawning repeats those imports (4-5 s of CPU) in every worker and every replacement."""
    import multiprocessing as mp

    import torch

    if torch.device(device).type == "cuda" or "forkserver" not in mp.get_all_start_methods():
        return {"start_method": "spawn"}
    return {"start_method": "forkserver"}


def start_workers(jobs: int, device):
    """The main job's worker processes, started (and warming up) now: give them to :func:`run_all`
    as ``pool``, and close them (a context manager) when done."""
    from harness.check.pool import Pool

    return Pool(jobs, _worker, unusable=_lost, warm=_warm_up, warm_arg=str(device), **worker_start(device))


def run_all(cases, adapters, *, seed: int, device, check_backward: bool = True, progress: bool = True,
            jobs: int = 1, worker=None, pool=None):
    """Verify every (adapter, case): the oracle and reference of a case are built once (per worker),
    only when some adapter supports it. Returns a list of CaseResult, case-major. ``jobs`` > 1:
    in that many worker processes (``pool``: ones already started by :func:`start_workers`). An
    interrupt (Ctrl-C, SIGTERM from a time limit) stops the run and returns what finished, each
    missing pair as an "error" saying it was not run."""
    from harness.check.verify import CaseResult

    pairs = _pairs(cases, adapters)
    bar = _Progress(len(cases) * len(adapters), progress)
    bar.skip(len(cases) * len(adapters) - len(pairs))
    done: dict[tuple[int, int], object] = {}
    try:
        if jobs <= 1:
            for ci, ai in pairs:
                t0 = time.perf_counter()
                done[ci, ai] = _verify_one(adapters[ai], cases[ci], seed, device, check_backward)
                bar.result(done[ci, ai], time.perf_counter() - t0)
        else:
            _run_parallel(pairs, cases, adapters, seed, device, check_backward, jobs, done, bar, worker, pool)
    except KeyboardInterrupt:
        print("\ninterrupted: reporting what finished", file=sys.stderr, flush=True)
    finally:
        bar.close()
    results = []
    for ci, ai in pairs:
        c, a = cases[ci], adapters[ai]
        results.append(done.get((ci, ai)) or CaseResult(
            a.name, c.id, c.family, c.dtype, str(device), seed, "error", "not run: the run was interrupted first"))
    return results


def submission_order(pairs, cases, adapters, device):
    """Recorded crashes first (harness.check.known_issues: the worker they take down is replaced
    while the run is young, its start-up hidden behind the other workers' work), then the pairs
    whose first call compiles (case-major among themselves, so that the first workers compile
    different backends' kernels rather than one kernel many times), then the rest: the cheap
    pairs fill the end instead of one late compile keeping the whole run waiting."""
    from harness.check.known_issues import lookup

    def key(p):
        ci, ai = p
        known = lookup(adapters[ai].name, cases[ci], device)
        return (not (known and known.crash), not adapters[ai].compiles_per_shape)

    return sorted(pairs, key=key)


def _run_parallel(pairs, cases, adapters, seed, device, check_backward, jobs, done, bar, worker=None, pool=None):
    """``pairs`` on ``jobs`` workers (harness.check.pool; or on ``pool``), results into ``done``. A worker
    whose CUDA context was lost, or that died, is replaced alone; a pair whose worker died running
    it is an error saying so."""
    from harness.adapters import registry
    from harness.check.pool import run_tasks
    from harness.check.verify import CaseResult

    local = [a.name for a in adapters if a.name not in registry.names()]
    if local:
        raise ValueError(f"--jobs: adapters registered only in this process cannot run in workers: {local}")

    def finished(i, value):
        ci, ai = pairs[i]
        r, seconds = value
        done[ci, ai] = r
        bar.result(r, seconds)

    def failed(i, why):
        ci, ai = pairs[i]
        c = cases[ci]
        done[ci, ai] = CaseResult(adapters[ai].name, c.id, c.family, c.dtype, str(device), seed, "error", why)
        bar.result(done[ci, ai], 0.0)

    def replaced(why):
        print(f"\nworker process replaced ({why})", file=sys.stderr, flush=True)

    pairs = submission_order(pairs, cases, adapters, device)
    tasks = [(adapters[ai].name, cases[ci], seed, str(device), check_backward) for ci, ai in pairs]
    if pool is not None:
        pool.run(tasks, done=finished, failed=failed, replaced=replaced)
    else:
        run_tasks(tasks, jobs, worker or _worker, done=finished, failed=failed, unusable=_lost, replaced=replaced,
                  **worker_start(device))


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def _ratio(r) -> str:
    m = r.max_ratio
    if m is None:
        return ""
    return "inf" if m == float("inf") else f"{m:.2f}"


def _rows(results) -> list[tuple[str, str, str, str, str]]:
    """(backend, case, status, max ratio, reason); a backend unsupported on every case collapses
    into one row per distinct reason."""
    by_backend: dict[str, list] = {}
    for r in results:
        by_backend.setdefault(r.backend, []).append(r)
    rows = []
    for backend, rs in by_backend.items():
        if all(r.status == "unsupported" for r in rs):
            reasons = sorted({r.reason for r in rs})
            for reason in reasons:
                n = sum(r.reason == reason for r in rs)
                rows.append(
                    (backend, f"(all {n} cases)" if len(reasons) == 1 else f"({n} cases)", "skip", "", reason)
                )
            continue
        for r in rs:
            status = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "unsupported": "skip", "known": "known"}[_outcome(r)]
            reason = "" if r.status == "pass" else (f"{r.reason}; {r.known_issue}" if r.known_issue else r.reason)
            rows.append((backend, r.case, status, _ratio(r), reason))
    return rows


def format_table(results, *, width: int = 100) -> str:
    rows = [("backend", "case", "status", "ratio", "reason")] + _rows(results)
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for i, r in enumerate(rows):
        reason = r[4] if len(r[4]) <= width else r[4][: width - 3] + "..."
        lines.append(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}  {reason}".rstrip())
        if i == 0:
            lines.append("-" * min(200, sum(w) + 8 + min(width, max(len(x[4]) for x in rows))))
    return "\n".join(lines)


def _outcome(r) -> str:
    """A result's status, with "known" for a failure or crash that is a recorded third-party defect."""
    return "known" if (r.status in ("fail", "error") and r.known_issue) else r.status


def summary(results) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "error": 0, "unsupported": 0, "known": 0}
    for r in results:
        out[_outcome(r)] += 1
    return out


def mark_known_issues(results, cases, device) -> None:
    """Failures and crashes that are a recorded third-party defect (harness.check.known_issues) get its
    text; a crash only when its error carries the recorded signature."""
    from harness.check.known_issues import explaining

    by_id = {c.id: c for c in cases}
    for r in results:
        if r.status in ("fail", "error") and r.case in by_id:
            issue = explaining(r.backend, by_id[r.case], device, r.status, r.reason)
            if issue:
                r.known_issue = issue.describe()


def time_by_backend(results) -> dict[str, dict[str, float]]:
    """Per backend: cases run, and seconds in first calls, compile / JIT / autotuning (first call less
    the second), run (second calls), and oracle + reference built for the cases it opened."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if r.status == "unsupported" or not r.timings:
            continue
        t = out.setdefault(r.backend, {"cases": 0, "seconds": 0.0, "first_call_s": 0.0, "compile_s": 0.0,
                                       "run_s": 0.0, "baseline_s": 0.0})
        t["cases"] += 1
        t["seconds"] += r.seconds + r.timings.get("baseline_s", 0.0)
        t["first_call_s"] += r.timings.get("first_call_s", 0.0)
        t["compile_s"] += r.compile_s or 0.0
        t["run_s"] += r.timings.get("second_call_s", 0.0)
        t["baseline_s"] += r.timings.get("baseline_s", 0.0)
    return out


def slowest(results, n: int = 10) -> list:
    """The ``n`` results that took longest (verification and, for the first backend of a case, its baseline)."""
    timed = [r for r in results if r.status != "unsupported"]
    return sorted(timed, key=lambda r: r.seconds + r.timings.get("baseline_s", 0.0), reverse=True)[:n]


def _where(r) -> str:
    t = r.timings
    parts = [f"{name} {t[key]:.1f} s" for key, name in (("baseline_s", "oracle + reference"),
                                                         ("first_call_s", "first call"),
                                                         ("second_call_s", "second call"), ("judge_s", "judging"))
             if key in t]
    return ", ".join(parts) or "-"


def timing_lines(results, *, n: int = 5) -> list[str]:
    """Short text for the terminal: compile vs run per backend, and the slowest cells."""
    lines = ["time per backend (compile / JIT / autotuning = first call less the second; run = the second call):"]
    for name, t in sorted(time_by_backend(results).items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(f"  {name:18s} {int(t['cases']):4d} cases  {t['seconds']:7.1f} s  compile {t['compile_s']:6.1f} s  "
                     f"run {t['run_s']:6.1f} s  oracle {t['baseline_s']:6.1f} s")
    lines.append(f"slowest {n} cells:")
    for r in slowest(results, n):
        lines.append(f"  {r.backend} {r.case}: {r.seconds + r.timings.get('baseline_s', 0.0):.1f} s ({_where(r)})")
    return lines


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def write_reports(
    out: Path, meta: dict, checks: list[SelfCheck], results, exit_code: int
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    counts = summary(results)
    doc = {
        "meta": meta,
        "self_checks": [c.to_dict() for c in checks],
        "summary": counts,
        "exit_code": exit_code,
        "results": [r.to_dict() for r in results],
    }
    json_path = out / "report.json"
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md = [
        "# attn-harness main job",
        "",
        f"- verdict: **{'PASS' if exit_code == 0 else 'FAIL'}** "
        f"({counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['error']} error, {counts['unsupported']} unsupported, "
        f"{counts['known']} known third-party defects)",
        f"- harness {meta['harness']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"python {meta['python']}",
        f"- device {meta['device']} ({meta['device_name']}), "
        f"TRITON_INTERPRET={int(meta['triton_interpret'])}",
        f"- seed {meta['seed']}, presets {', '.join(meta['presets'])}, dtypes {', '.join(meta['dtypes'])}, "
        f"backward {'checked' if meta['check_backward'] else 'not checked'}",
        f"- workers: {meta.get('workers', '-')}; {meta.get('tuning', '')}",
        f"- started {meta['started_utc']}, {meta['seconds']} s; replay: `{meta['replay']}`",
        "",
        "## Oracle self-checks (oracle vs naive formulas, float64)",
        "",
        "| check | max rel error | result |",
        "|---|---|---|",
    ]
    md += [
        f"| {_md_escape(c.name)} | {c.max_rel_error:.2e} | "
        f"{'OK' if c.ok else 'FAIL ' + _md_escape(c.detail)} |"
        for c in checks
    ]
    md += [
        "",
        "## Results",
        "",
        "ratio: the largest candidate error / reference error over the compared tensors (the reference is "
        "the eager path in the case's dtype with an fp32 softmax).",
        "",
        "| backend | case | status | ratio | reason |",
        "|---|---|---|---|---|",
    ]
    md += [
        f"| {b} | {_md_escape(c)} | {s} | {r} | {_md_escape(reason)} |"
        for b, c, s, r, reason in _rows(results)
    ]
    md += ["", "## Where the time went", "",
           "First call: the backend's first verification call on the case (compilation, JIT and autotuning land "
           "here); compile = first call less the second (the same call again); run = the second call; oracle + "
           "reference: built once per case, by the first backend that ran it.", "",
           "| backend | cases | seconds | compile / JIT | run | oracle + reference |", "|---|---|---|---|---|---|"]
    for name, t in sorted(time_by_backend(results).items(), key=lambda kv: -kv[1]["seconds"]):
        md.append(f"| {name} | {int(t['cases'])} | {t['seconds']:.1f} | {t['compile_s']:.1f} | {t['run_s']:.1f} | "
                  f"{t['baseline_s']:.1f} |")
    md += ["", "Slowest cells:", "", "| backend | case | seconds | where |", "|---|---|---|---|"]
    for r in slowest(results, 10):
        md.append(f"| {r.backend} | {_md_escape(r.case)} | {r.seconds + r.timings.get('baseline_s', 0.0):.2f} | "
                  f"{_where(r)} |")
    bad = [r for r in results if r.status in ("fail", "error")]
    if bad:
        md += ["", "## Failures", ""]
        for r in bad:
            md += [f"### {r.backend} on {r.case}", "", "```", r.message(), "```", ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    return md_path, json_path
