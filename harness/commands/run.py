"""``python -m harness run``: the main job.

1. Oracle self-checks: the FP64 oracles (forward and analytic gradients) against the independent
   naive formulas of :mod:`harness.oracle.naive` (autograd) on tiny cases; OK / FAIL each.
2. Every registered adapter that supports a case on this machine, across the presets (default
   ``small`` and ``small-linear``) and dtypes, judged by :func:`harness.check.verify.verify` with the
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
import os
import platform
import sys
import time
from pathlib import Path

from harness.check.matrix import (
    format_table,
    mark_known_issues,
    run_all,
    start_workers,
    summary,
    timing_lines,
    write_reports,
)
from harness.check.selfcheck import self_checks
from harness.interrupts import SigtermInterrupt

DEFAULT_PRESETS = ("small", "small-linear", "small-decode", "small-fp8")
DEFAULT_DTYPES_CPU = ("fp32", "fp16")
DEFAULT_DTYPES_CUDA = ("fp16", "bf16", "fp32")


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
        default="auto",
        help="worker processes verifying (backend, case) pairs at once (default auto: one on a CPU; with "
        "GPUs, one per CPU core up to 16 per GPU: compiles are CPU-bound, so workers sharing a GPU finish sooner)",
    )
    parser.add_argument(
        "--autotune", action="store_true",
        help="let kernels autotune (default: pinned configs, as correctness does not depend on the tile and "
        "tuning every new shape costs seconds to minutes)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (and no per-result lines when not on a terminal)"
    )


#: Environment variables that pin kernels' tuned configs (kernels/flash_attn/configs.py,
#: kernels/linear_attn/configs.py, harness/adapters/fla.py); set unless --autotune or already set.
PIN_TUNING = {"FLASH_ATTN_AUTOTUNE": "0", "KERNELS_LINEAR_ATTN_AUTOTUNE": "0", "ATTN_HARNESS_FLA_AUTOTUNE": "0"}
#: Compile caches the main job turns on unless the environment says otherwise: flash-attn-4 keeps
#: its JIT-compiled kernels on disk (by default it compiles each one again in every process: ~145 s
#: summed over the workers of a warm run on the H100), shared by the workers and by later runs.
COMPILE_CACHES = {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"}
#: With several workers, inductor compiles inside each (the workers are the parallelism): its own pool
#: of compile processes per worker would start one per CPU core in every worker.
WORKER_COMPILE = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
#: Workers per GPU at most with --jobs auto. Compiles are CPU-bound and most pairs are small, so
#: workers sharing a GPU finish sooner: on the H100 box (16 cores) the cold main job took 137-147 s
#: with 12 workers and 117 s with 16 (session 9; 274 s with 8 in session 8, before the pool fix).
MAX_JOBS_PER_GPU = 16


def auto_jobs(cpus: int | None, gpus: int) -> tuple[int, str]:
    """(worker count, why) for --jobs auto."""
    cpus = cpus or 1
    if gpus <= 0:
        return 1, f"1 (auto: no GPU; {cpus} CPU cores run one verification at a time)"
    n = max(1, min(cpus, MAX_JOBS_PER_GPU * gpus))
    return n, f"{n} (auto: {cpus} CPU cores, {gpus} GPU(s): one per core, at most {MAX_JOBS_PER_GPU} per GPU)"


def _setdefault_env(values: dict[str, str]) -> list[str]:
    """Set each variable the environment does not set already; the names set (to restore later)."""
    set_here = [k for k in values if k not in os.environ]
    for k in set_here:
        os.environ[k] = values[k]
    return set_here


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


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def main(args) -> int:
    import torch

    if not torch.cuda.is_available():
        # Read by Triton when the kernels are defined: must precede the first kernel import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # read when the kernels and backends are imported: before any adapter runs (workers inherit them)
    pinned = [] if args.autotune else _setdefault_env(PIN_TUNING)
    restore = pinned + _setdefault_env(COMPILE_CACHES)
    try:
        cases, adapters, seed, out = _parse(args)
        if str(args.jobs) == "auto":
            jobs, jobs_why = auto_jobs(os.cpu_count(), torch.cuda.device_count() if torch.cuda.is_available() else 0)
        else:
            jobs = int(args.jobs) if str(args.jobs).isdigit() and int(args.jobs) >= 1 else None
            jobs_why = f"{jobs} (--jobs)"
        if jobs is None:
            raise ValueError(f"--jobs: expected a positive integer or auto, got {args.jobs!r}")
    except ValueError as e:
        print(f"python -m harness run: error: {e}", file=sys.stderr)
        for k in restore:
            os.environ.pop(k, None)
        return 2
    if jobs > 1:
        restore += _setdefault_env(WORKER_COMPILE)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    started = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    # the workers start (imports, a CUDA context: seconds each) while the self-checks run here
    n_pairs = sum(a.family == c.family for c in cases for a in adapters)
    pool = start_workers(min(jobs, n_pairs), device) if min(jobs, n_pairs) > 1 else None
    try:
        return _checks_and_pairs(args, jobs, jobs_why, pinned, cases, adapters, seed, out, device, started, t0, pool)
    finally:
        if pool is not None:
            pool.close()
        for k in restore:  # an in-process caller (tests) gets its environment back
            os.environ.pop(k, None)


def _checks_and_pairs(args, jobs, jobs_why, pinned, cases, adapters, seed, out, device, started, t0, pool) -> int:
    """The self-checks, every (backend, case) pair (on ``pool``'s workers when given), the reports."""
    print("Oracle self-checks (oracle vs naive formulas, float64):")
    checks = self_checks()
    for c in checks:
        print(
            f"  {'OK  ' if c.ok else 'FAIL'} {c.name}  (max rel error {c.max_rel_error:.2e})"
            f"{'  ' + c.detail if c.detail else ''}"
        )
    tuning = ("kernels autotune (--autotune)" if args.autotune else
              "kernel configs pinned, no autotuning (--autotune to tune)"
              + ("" if pinned else ": set by the environment"))
    if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") == "1":
        tuning += "; flash-attn-4 JIT cache on disk"
    print(
        f"\n{len(adapters)} backends x {len(cases)} cases on {device}, seed {seed}"
        f"{' (Triton interpreter)' if os.environ.get('TRITON_INTERPRET') == '1' else ''}; workers: {jobs_why}; "
        f"{tuning}:",
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
            pool=pool,
        )
        mark_known_issues(results, cases, device)
        print(format_table(results))
        print()
        print("\n".join(timing_lines(results)))
        counts = summary(results)
        failed = counts["fail"] + counts["error"] + sum(not c.ok for c in checks)
        exit_code = 1 if failed else 0
        meta = _meta(args, device, seed, cases, adapters, started, time.perf_counter() - t0)
        meta.update(workers=jobs_why, tuning=tuning)
        md, js = write_reports(out, meta, checks, results, exit_code)
        print(
            f"\n{counts['pass']} pass, {counts['fail']} fail, {counts['error']} error, "
            f"{counts['unsupported']} unsupported, {counts['known']} known third-party defects "
            f"(harness/check/known_issues.py); self-checks {sum(c.ok for c in checks)}/{len(checks)} OK"
        )
        print(f"reports: {md} and {js}")
        print("verdict: " + ("PASS" if exit_code == 0 else "FAIL (something that should pass did not)"))
        return exit_code
    finally:
        sigterm.restore()
