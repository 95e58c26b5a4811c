"""``python -m harness run``: the main job.

1. Oracle self-checks: the FP64 oracles (forward and analytic gradients) against the independent
   naive formulas of :mod:`harness.oracle.naive` (autograd) on tiny cases; OK / FAIL each.
2. Every registered adapter that supports a case on this machine, across the presets (default
   ``small`` and ``small-linear``) and dtypes, judged by :func:`harness.verify.verify` with the
   tolerance engine; a progress bar on stderr.
3. A table on stdout (backend x case: status, max error ratio, reason for skips), and
   ``report.md`` + ``report.json`` in ``--out`` (default ``reports/run-<UTC timestamp>``).

Exit status: 0 when every self-check and every supported (backend, case) passed; 1 when anything
that should pass failed or raised; 2 on bad arguments. Without CUDA the in-repo Triton kernels
run in Triton's interpreter: ``TRITON_INTERPRET=1`` is set here before any kernel is imported.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.interrupts import SigtermInterrupt

DEFAULT_PRESETS = ("small", "small-linear")
DEFAULT_DTYPES_CPU = ("fp32", "fp16")
DEFAULT_DTYPES_CUDA = ("fp16", "bf16", "fp32")
#: The oracles are float64 throughout and so are the naive formulas: they agree to rounding
#: (~1e-16); anything above this is a bug in one of them.
SELF_CHECK_RTOL = 1e-10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        default=",".join(DEFAULT_PRESETS),
        help="comma-separated case presets (default: %(default)s)",
    )
    parser.add_argument(
        "--backends", default=None, help="comma-separated registered backends (default: every registered one)"
    )
    parser.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated dtypes (default: fp32,fp16 on CPU; fp16,bf16,fp32 with CUDA)",
    )
    parser.add_argument(
        "--seed", default="0", help="input seed, a non-negative integer (default: %(default)s)"
    )
    parser.add_argument(
        "--out", default=None, type=Path, help="report directory (default: reports/run-<UTC timestamp>)"
    )
    parser.add_argument("--forward-only", action="store_true", help="do not check gradients")
    parser.add_argument(
        "--jobs",
        default="1",
        help="worker processes verifying (backend, case) pairs at once (default 1; compiles are "
        "CPU-bound, so a few workers sharing one GPU finish sooner)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (and no per-result lines when not on a terminal)"
    )


# --------------------------------------------------------------------------------------------
# Oracle self-checks
# --------------------------------------------------------------------------------------------


@dataclass
class SelfCheck:
    name: str
    max_rel_error: float
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _rel(a, b) -> float:
    import torch

    keep = torch.isfinite(b)
    if not bool((torch.isfinite(a) == keep).all()):
        return float("inf")  # non-finite in different places (e.g. lse -inf vs a number)
    a, b = a[keep], b[keep]
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _softmax_self_checks() -> list[tuple[str, float]]:
    import torch

    from harness.oracle import softmax_attention, softmax_attention_varlen
    from harness.oracle.naive import naive_softmax_attention

    gen = torch.Generator().manual_seed(1234)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    configs = [
        ("softmax B2-H2-S5x7-D4", dict(sq=5, sk=7, hq=2, hk=2, kw={})),
        ("softmax B2-H4/2-S5x7-D4-causal", dict(sq=5, sk=7, hq=4, hk=2, kw=dict(causal=True))),
        ("softmax B2-H2/1-S7x5-D4-causal (masked rows)", dict(sq=7, sk=5, hq=2, hk=1, kw=dict(causal=True))),
        ("softmax B2-H2-S9x9-D4-win2x1", dict(sq=9, sk=9, hq=2, hk=2, kw=dict(window_size=(2, 1)))),
        ("softmax B2-H2-S6x6-D4-cap2", dict(sq=6, sk=6, hq=2, hk=2, kw=dict(softcap=2.0))),
    ]
    out = []
    for name, c in configs:
        q = rnd(2, c["sq"], c["hq"], 4).requires_grad_()
        k = rnd(2, c["sk"], c["hk"], 4).requires_grad_()
        v = rnd(2, c["sk"], c["hk"], 3).requires_grad_()
        do = rnd(2, c["sq"], c["hq"], 3)
        o_ref, lse_ref = naive_softmax_attention(q, k, v, **c["kw"])
        grads = torch.autograd.grad(o_ref, (q, k, v), do)
        r = softmax_attention(q.detach(), k.detach(), v.detach(), do, **c["kw"])
        errs = [_rel(r.out, o_ref.detach()), _rel(r.lse, lse_ref.detach())]
        errs += [_rel(a, b) for a, b in zip((r.dq, r.dk, r.dv), grads)]
        out.append((name, max(errs)))
    # varlen against one naive call per sequence (a zero-length query sequence included)
    lens = [(3, 5), (0, 2), (4, 4)]
    q, k, v = rnd(7, 2, 4), rnd(11, 1, 4), rnd(11, 1, 3)
    do = rnd(7, 2, 3)
    cq = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    ck = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    r = softmax_attention_varlen(q, k, v, cq, ck, do, causal=True)
    errs = []
    for b, (lq, _lk) in enumerate(lens):
        if lq == 0:
            continue
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        o_ref, lse_ref = naive_softmax_attention(q[qs][None], k[ks][None], v[ks][None], causal=True)
        errs += [_rel(r.out[qs], o_ref[0]), _rel(r.lse[:, qs], lse_ref[0])]
    out.append(("softmax varlen[3x5,0x2,4x4]-causal (forward)", max(errs)))
    return out


def _linear_self_checks() -> list[tuple[str, float]]:
    import torch

    from harness.oracle import linear_attention
    from harness.oracle.naive import naive_linear_attention

    gen = torch.Generator().manual_seed(4321)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    B, T, H, K, V = 2, 70, 2, 4, 3  # T crosses the oracle's 64-step chunk boundary
    out = []
    for gate in ("none", "g", "g_gamma"):
        q, k, v = (
            rnd(B, T, H, K).requires_grad_(),
            rnd(B, T, H, K).requires_grad_(),
            rnd(B, T, H, V).requires_grad_(),
        )
        g = torch.nn.functional.logsigmoid(rnd(B, T, H)).requires_grad_() if gate == "g" else None
        gg = torch.nn.functional.logsigmoid(3 + rnd(H)).requires_grad_() if gate == "g_gamma" else None
        h0 = rnd(B, H, K, V).requires_grad_()
        do, dht = rnd(B, T, H, V), rnd(B, H, K, V)
        o_ref, s_ref = naive_linear_attention(q, k, v, g=g, g_gamma=gg, initial_state=h0)
        leaves = [t for t in (q, k, v, g if g is not None else gg, h0) if t is not None]
        grads = torch.autograd.grad((o_ref, s_ref), leaves, (do, dht))
        r = linear_attention(
            q.detach(),
            k.detach(),
            v.detach(),
            do,
            g=None if g is None else g.detach(),
            g_gamma=None if gg is None else gg.detach(),
            initial_state=h0.detach(),
            grad_final_state=dht,
        )
        mine = [r.dq, r.dk, r.dv] + ([r.dg] if gate != "none" else []) + [r.dh0]
        errs = [_rel(r.out, o_ref.detach()), _rel(r.final_state, s_ref.detach())]
        errs += [_rel(a, b) for a, b in zip(mine, grads)]
        out.append((f"linear B{B}-H{H}-T{T}-K{K}V{V}-{gate}-h0-dhT", max(errs)))
    return out


def self_checks() -> list[SelfCheck]:
    """The oracles against the naive formulas: forward and gradients, float64, tiny shapes."""
    results = []
    for group in (_softmax_self_checks, _linear_self_checks):
        try:
            for name, err in group():
                ok = err <= SELF_CHECK_RTOL
                results.append(
                    SelfCheck(name, err, ok, "" if ok else f"max rel error {err:.3g} > {SELF_CHECK_RTOL:g}")
                )
        except Exception as e:  # an oracle that crashes is a failed self-check, not a crashed job
            results.append(
                SelfCheck(group.__name__.strip("_"), float("inf"), False, f"{type(e).__name__}: {e}")
            )
    return results


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _parse(args) -> tuple[list, list, int, Path]:
    """Validate the arguments; raises ValueError naming the option."""
    import torch

    from harness.adapters import registry
    from harness.cases import DTYPES
    from harness.presets import PRESETS, preset

    dtypes = _split(args.dtypes) or list(
        DEFAULT_DTYPES_CUDA if torch.cuda.is_available() else DEFAULT_DTYPES_CPU
    )
    for dt in dtypes:
        if dt not in DTYPES:
            raise ValueError(f"--dtypes: unknown dtype {dt!r}; expected some of {', '.join(DTYPES)}")
    presets = _split(args.preset)
    if not presets:
        raise ValueError("--preset: give at least one preset")
    cases, seen = [], set()
    for name in presets:
        if name not in PRESETS:
            raise ValueError(f"--preset: unknown preset {name!r}; known: {', '.join(PRESETS)}")
        for c in preset(name, dtypes):
            if c.id not in seen:
                seen.add(c.id)
                cases.append(c)
    try:
        seed = int(args.seed)
        if seed < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"--seed: expected a non-negative integer, got {args.seed!r}") from None
    names = _split(args.backends)
    if names:
        known = registry.names()
        for n in names:
            if n not in known:
                raise ValueError(f"--backends: unknown backend {n!r}; known: {', '.join(known)}")
        adapters = [registry.get(n) for n in names]
    else:
        adapters = registry.all_adapters()
    out = args.out or Path("reports") / f"run-{_dt.datetime.now(_dt.UTC):%Y%m%d-%H%M%S}"
    return cases, adapters, seed, Path(out)


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
    from harness.verify import CaseResult, prepare, verify

    reason = _supports(adapter, case, device)
    if reason:
        return CaseResult(adapter.name, case.id, case.family, case.dtype, str(device), seed, "unsupported", str(reason))
    key = (case.id, seed, str(device))
    if key not in _BASELINES:
        _BASELINES.clear()  # case-major order: the previous case's oracle is no longer needed
        _BASELINES[key] = prepare(case, seed=seed, device=device)
    return verify(adapter, case, baseline=_BASELINES[key], check_backward=check_backward)


def _worker(task):
    """One (adapter, case) in a worker process (spawned: CUDA must not be forked)."""
    import torch

    from harness.adapters import registry

    name, case, seed, device, check_backward = task
    t0 = time.perf_counter()
    r = _verify_one(registry.get(name), case, seed, torch.device(device), check_backward)
    return r, time.perf_counter() - t0


def run_all(cases, adapters, *, seed: int, device, check_backward: bool = True, progress: bool = True,
            jobs: int = 1):
    """Verify every (adapter, case): the oracle and reference of a case are built once (per worker),
    only when some adapter supports it. Returns a list of CaseResult, case-major. An interrupt
    (Ctrl-C, SIGTERM from a time limit) stops the run and returns what finished, each missing
    pair as an "error" saying it was not run."""
    from harness.verify import CaseResult

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
            _run_parallel(pairs, cases, adapters, seed, device, check_backward, jobs, done, bar)
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


def _run_parallel(pairs, cases, adapters, seed, device, check_backward, jobs, done, bar):
    import concurrent.futures as cf
    import multiprocessing as mp

    from harness.adapters import registry
    from harness.verify import CaseResult

    local = [a.name for a in adapters if a.name not in registry.names()]
    if local:
        raise ValueError(f"--jobs: adapters registered only in this process cannot run in workers: {local}")
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {
            pool.submit(_worker, (adapters[ai].name, cases[ci], seed, str(device), check_backward)): (ci, ai)
            for ci, ai in pairs
        }
        try:
            for fut in cf.as_completed(futures):
                ci, ai = futures[fut]
                try:
                    r, seconds = fut.result()
                except Exception as e:  # a worker that died (crash, abort) fails its pair, not the run
                    c = cases[ci]
                    r, seconds = CaseResult(adapters[ai].name, c.id, c.family, c.dtype, str(device), seed, "error",
                                            f"worker process failed: {type(e).__name__}: {e}"), 0.0
                done[ci, ai] = r
                bar.result(r, seconds)
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


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
    """A result's status, with "known" for a failure that matches a recorded third-party defect."""
    return "known" if (r.status == "fail" and r.known_issue) else r.status


def _summary(results) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "error": 0, "unsupported": 0, "known": 0}
    for r in results:
        out[_outcome(r)] += 1
    return out


def mark_known_issues(results, cases, device) -> None:
    """Failures that match a recorded third-party defect (harness.known_issues) get its text."""
    from harness.known_issues import lookup

    by_id = {c.id: c for c in cases}
    for r in results:
        if r.status == "fail" and r.case in by_id:
            issue = lookup(r.backend, by_id[r.case], device)
            if issue:
                r.known_issue = issue.describe()


def _meta(args, device, seed, cases, adapters, started, seconds) -> dict:
    import torch

    import harness

    try:
        import triton

        tri = triton.__version__
    except ImportError:
        tri = None
    return {
        "harness": harness.__version__,
        "torch": torch.__version__,
        "triton": tri,
        "python": platform.python_version(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(0)
        if device.type == "cuda"
        else f"{platform.machine()} CPU",
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "seed": seed,
        "presets": _split(args.preset),
        "dtypes": sorted({c.dtype for c in cases}),
        "backends": [a.name for a in adapters],
        "check_backward": not args.forward_only,
        "started_utc": started,
        "seconds": round(seconds, 2),
        "replay": f"python -m harness run --preset {args.preset} --seed {seed} "
        f"--dtypes {','.join(sorted({c.dtype for c in cases}))}"
        + (f" --backends {args.backends}" if args.backends else ""),
    }


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def write_reports(
    out: Path, meta: dict, checks: list[SelfCheck], results, exit_code: int
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = _summary(results)
    doc = {
        "meta": meta,
        "self_checks": [c.to_dict() for c in checks],
        "summary": summary,
        "exit_code": exit_code,
        "results": [r.to_dict() for r in results],
    }
    json_path = out / "report.json"
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md = [
        "# attn-harness main job",
        "",
        f"- verdict: **{'PASS' if exit_code == 0 else 'FAIL'}** "
        f"({summary['pass']} pass, {summary['fail']} fail, "
        f"{summary['error']} error, {summary['unsupported']} unsupported, "
        f"{summary['known']} known third-party defects)",
        f"- harness {meta['harness']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"python {meta['python']}",
        f"- device {meta['device']} ({meta['device_name']}), "
        f"TRITON_INTERPRET={int(meta['triton_interpret'])}",
        f"- seed {meta['seed']}, presets {', '.join(meta['presets'])}, dtypes {', '.join(meta['dtypes'])}, "
        f"backward {'checked' if meta['check_backward'] else 'not checked'}",
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
    bad = [r for r in results if r.status in ("fail", "error")]
    if bad:
        md += ["", "## Failures", ""]
        for r in bad:
            md += [f"### {r.backend} on {r.case}", "", "```", r.message(), "```", ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    return md_path, json_path


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main(args) -> int:
    import torch

    if not torch.cuda.is_available():
        # Read by Triton when the kernels are defined: must precede the first kernel import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        cases, adapters, seed, out = _parse(args)
        jobs = int(args.jobs) if str(args.jobs).isdigit() and int(args.jobs) >= 1 else None
        if jobs is None:
            raise ValueError(f"--jobs: expected a positive integer, got {args.jobs!r}")
    except ValueError as e:
        print(f"python -m harness run: error: {e}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()

    print("Oracle self-checks (oracle vs naive formulas, float64):")
    checks = self_checks()
    for c in checks:
        print(
            f"  {'OK  ' if c.ok else 'FAIL'} {c.name}  (max rel error {c.max_rel_error:.2e})"
            f"{'  ' + c.detail if c.detail else ''}"
        )
    print(
        f"\n{len(adapters)} backends x {len(cases)} cases on {device}, seed {seed}"
        f"{' (Triton interpreter)' if os.environ.get('TRITON_INTERPRET') == '1' else ''}:",
        flush=True,
    )
    # A time limit (timeout, a CI job's cancel) sends SIGTERM: report what finished instead of nothing.
    sigterm = SigtermInterrupt()
    sigterm.install()
    try:  # until the report is written: a second SIGTERM (timeout's to the group) must not kill it
        results = run_all(
            cases,
            adapters,
            seed=seed,
            device=device,
            check_backward=not args.forward_only,
            progress=not args.no_progress,
            jobs=jobs,
        )
        mark_known_issues(results, cases, device)
        print(format_table(results))
        summary = _summary(results)
        failed = summary["fail"] + summary["error"] + sum(not c.ok for c in checks)
        exit_code = 1 if failed else 0
        meta = _meta(args, device, seed, cases, adapters, started, time.perf_counter() - t0)
        md, js = write_reports(out, meta, checks, results, exit_code)
        print(
            f"\n{summary['pass']} pass, {summary['fail']} fail, {summary['error']} error, "
            f"{summary['unsupported']} unsupported, {summary['known']} known third-party defects "
            f"(harness/known_issues.py); self-checks {sum(c.ok for c in checks)}/{len(checks)} OK"
        )
        print(f"reports: {md} and {js}")
        print("verdict: " + ("PASS" if exit_code == 0 else "FAIL (something that should pass did not)"))
        return exit_code
    finally:
        sigterm.restore()
