"""``python -m harness bench``: correctness first, then honest timings, memory and reports.

The runner and its rules are :mod:`harness.perf.bench`; this module reads the options, selects the
cases and backends, runs them case-major with a progress bar (and a partial JSON after each case,
what survives a time limit), and writes the reports. ``--merge`` joins the results.json files of
several runs into one report instead.

Exit status: 0 when the report was written (failed or flagged cells are results, in the report),
2 on bad arguments, 130 when Ctrl-C or an outer time limit's SIGTERM stopped the run: the report of what
finished is written first, the cells not reached (and the one cut short) read "not run: the bench was
interrupted (SIGTERM | Ctrl-C)".
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

from harness.cases import Case
from harness.interrupts import SigtermInterrupt
from harness.perf import roofline
from harness.perf.bench import (
    DEFAULT_BACKENDS,
    DEFAULT_BASELINE,
    Bench,
    add_speedups,
    case_params,
    merge,
    report_data,
)
from harness.perf.timing import MODES, SETTLE_MIN_MS, SETTLE_TOL, SETTLE_WINDOW_MS, TimerOptions, clock_of


def _split(v: str | None) -> list[str]:
    return [x.strip() for x in (v or "").split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from harness.presets import PRESETS

    p.add_argument("--preset", default=None, metavar="NAMES",
                   help=f"comma-separated presets (default: small, or none with --case); known: {', '.join(PRESETS)}")
    p.add_argument("--case", default=None, metavar="IDS",
                   help="comma-separated case ids as the harness prints them (e.g. B6-H16-S2048x2048-D64-causal-bf16): "
                        "shapes of your own, run beside --preset's cases (alone when --preset is not given)")
    p.add_argument("--backends", default=None, metavar="NAMES",
                   help="comma-separated registered backends (default on CUDA: "
                        f"{','.join(DEFAULT_BACKENDS['cuda'])}; on CPU: {','.join(DEFAULT_BACKENDS['cpu'])})")
    p.add_argument("--modes", default=",".join(MODES), metavar="MODES", help="comma-separated among fwd,bwd,fwd+bwd")
    p.add_argument("--dtypes", default=None, metavar="DTYPES", help="replace each case's dtype (comma-separated)")
    p.add_argument("--cases", default=None, metavar="REGEX",
                   help="only cases whose id matches this regex (one starting with - as --cases=-D64-causal)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--baseline", default=None, metavar="NAMES",
                   help="speedup baseline: the first of these in the case's family (default: "
                        f"{DEFAULT_BASELINE['cuda']} on CUDA, {DEFAULT_BASELINE['cpu']} on CPU)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0); rotated sets use seed+1, ...")
    p.add_argument("--out", default=None, metavar="DIR", help="report folder (default ./reports/bench-<timestamp>)")
    p.add_argument("--target-ms", type=float, default=TimerOptions.target_ms,
                   help=f"timed work per cell, ms (default {TimerOptions.target_ms:g}): sets the repetitions")
    p.add_argument("--warmup-ms", type=float, default=TimerOptions.warmup_ms, help="warm-up per cell, ms")
    p.add_argument("--settle-max-ms", type=float, default=TimerOptions.settle_max_ms, metavar="MS",
                   help="most time spent settling before each timed loop (harness/perf/timing.py; 0: none)")
    p.add_argument("--min-reps", type=int, default=TimerOptions.min_reps)
    p.add_argument("--max-reps", type=int, default=TimerOptions.max_reps)
    p.add_argument("--reps", type=int, default=None, help="fixed repetitions (overrides --target-ms)")
    p.add_argument("--flush-l2", choices=("auto", "always", "never"), default="auto",
                   help="flush L2 before each repetition: auto = when the working set could stay cached")
    p.add_argument("--cuda-graphs", action="store_true", help="replay CUDA graphs (removes launch overhead)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--remeasure-peaks", action="store_true", help="measure the device's ceilings again")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="start no new (case, backend) after this many seconds; the rest read 'not run' "
                        "(keeps a run inside a machine's per-command limit with its report written)")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="time every cell in N passes over all (case, backend) pairs (the first checks and times, "
                        "each later one times again) and report the median of the passes' medians: on a machine "
                        "whose speed drifts by the minute each backend then sees its slow and fast spells alike; "
                        "default 1. --time-limit ends the passes early (each cell's JSON lists the ones it got)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="run nothing: merge these results.json files (e.g. fetched from the GPU machine) into one "
                        "report in --out (markdown, JSON, plots)")


def _presets(args) -> list[str]:
    """The presets a run takes: --preset's, else "small" unless --case names the cases."""
    if args.preset is not None:
        return _split(args.preset)
    return [] if _split(args.case) else ["small"]


def _selected_cases(args) -> list:
    """The run's cases: its presets' (:func:`_presets`), then --case's ids (harness.cases.case_from_id; --dtypes
    replaces their dtype too), each once, filtered by --cases. ValueError names an id that does not parse."""
    from harness.cases import case_from_id
    from harness.presets import in_dtypes, preset

    dtypes = _split(args.dtypes) or None
    cases: list[Case] = []
    for name in _presets(args):
        cases += preset(name, dtypes)
    for case_id in _split(args.case):
        try:
            case = case_from_id(case_id)
        except ValueError as e:
            raise ValueError(f"--case: {e}") from None
        cases += in_dtypes([case], dtypes)
    seen, unique = set(), []
    for c in cases:
        if c.id not in seen:
            seen.add(c.id)
            unique.append(c)
    if args.cases:
        rx = re.compile(args.cases)
        unique = [c for c in unique if rx.search(c.id)]
    return unique


def _settings(args, device: torch.device) -> dict:
    return {
        "presets": _presets(args), "case_ids": _split(args.case), "modes": _split(args.modes), "seed": args.seed,
        "dtypes": _split(args.dtypes) or None, "cases": args.cases,
        "target_ms": args.target_ms, "warmup_ms": args.warmup_ms, "min_reps": args.min_reps,
        "max_reps": args.max_reps, "reps": args.reps, "flush_l2": args.flush_l2, "cuda_graphs": args.cuda_graphs,
        "time_limit": args.time_limit, "rounds": args.rounds,
        "settle": {"window_ms": SETTLE_WINDOW_MS, "min_ms": SETTLE_MIN_MS, "tol": SETTLE_TOL, "max_ms": args.settle_max_ms},
        "clock": clock_of(device),
    }


def main(args) -> int:
    from harness.adapters import registry

    if args.merge:
        try:
            data = merge(args.merge)
        except (OSError, ValueError) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        from harness.perf.reports import write_reports
        from harness.perf.reports.markdown import summary_lines

        paths = write_reports(data, Path(args.out or "reports/merged"), plots=not args.no_plots)
        print("\n".join(summary_lines(data)))
        for kind, path in paths.items():
            print(f"bench: {kind}: {path}")
        return 0
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench: --device cuda asked for, but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"bench: --rounds: expected a positive count, got {args.rounds}", file=sys.stderr)
        return 2
    modes = _split(args.modes)
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        print(f"bench: --modes: expected some of {','.join(MODES)}, got {args.modes!r}", file=sys.stderr)
        return 2
    try:
        cases = _selected_cases(args)
        names = _split(args.backends) or list(DEFAULT_BACKENDS["cuda" if device.type == "cuda" else "cpu"])
        adapters = []
        for n in names:
            try:
                adapters.append(registry.get(n))
            except KeyError as e:
                if args.backends:  # asked for by name: a usage error
                    raise ValueError(f"--backends: {e.args[0]}") from None
    except (ValueError, re.error) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    if not cases:
        print("bench: no case selected (check --preset / --case / --cases)", file=sys.stderr)
        return 2
    baselines = _split(args.baseline or DEFAULT_BASELINE["cuda" if device.type == "cuda" else "cpu"])
    pairs = [(c, a) for c in cases for a in adapters if a.family == c.family]
    out = Path(args.out or Path("reports") / f"bench-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    options = TimerOptions(warmup_ms=args.warmup_ms, target_ms=args.target_ms, min_reps=args.min_reps,
                           max_reps=args.max_reps, reps=args.reps, flush_l2=args.flush_l2, cuda_graph=args.cuda_graphs,
                           settle_max_ms=args.settle_max_ms)

    started = time.time()
    dtypes = sorted({c.dtype for c in cases} | {c.fp8 for c in cases if getattr(c, "fp8", "")})
    if not args.quiet:
        print(f"bench: measuring the ceilings of {roofline.device_key(device)} ({','.join(dtypes)}), cached after the first time",
              file=sys.stderr)
    peaks = roofline.device_peaks(device, dtypes, remeasure=args.remeasure_peaks)
    runner = Bench(device, seed=args.seed, options=options, peaks=peaks, memory=not args.no_memory)
    results = []
    from tqdm import tqdm

    command = ("python -m harness bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
               if sys.argv[1:2] == ["bench"] else "python -m harness bench (called from Python)")
    settings = {**_settings(args, device), "backends": [a.name for a in adapters], "baseline": baselines}
    from harness.perf.reports import write_json, write_reports

    partial = out / "results.partial.json"

    def save_partial() -> None:  # after each case: what survives a run killed without a chance to report (SIGKILL)
        write_json(report_data(results, device, {**settings, "partial": True}, peaks, command, time.time() - started),
                   partial)

    bar = tqdm(total=len(pairs), desc="bench", unit="cell", disable=args.quiet, file=sys.stderr, dynamic_ncols=True)
    # Ctrl-C, or an outer time limit's SIGTERM (timeout, a CI cancel): stop and report what finished
    sigterm = SigtermInterrupt()
    sigterm.install()
    interrupted = ""
    try:
        try:
            for i, (case, adapter) in enumerate(pairs):
                bar.set_postfix_str(f"{adapter.name} {case.id}", refresh=True)
                if args.time_limit is not None and time.time() - started > args.time_limit:
                    results.append(_not_run(case, adapter, f"not run: --time-limit {args.time_limit:g} s reached"))
                else:
                    results.append(runner.run(adapter, case, modes))
                bar.update(1)
                if i + 1 == len(pairs) or pairs[i + 1][0].id != case.id:
                    save_partial()
            bar.close()
            _more_rounds(runner, pairs, results, args, started, settings, save_partial)
        except KeyboardInterrupt as e:
            interrupted = "SIGTERM" if str(e) == "SIGTERM" else "Ctrl-C"
            print(f"\nbench: interrupted ({interrupted}): reporting what finished", file=sys.stderr, flush=True)
            results += [_not_run(c, a, f"not run: the bench was interrupted ({interrupted})")
                        for c, a in pairs[len(results):]]
        finally:
            sigterm.armed = False  # from here on a second SIGTERM (timeout's to the group) waits for the report
            bar.close()
        for (case, _), rec in zip(pairs, results):
            runner.close_rounds(rec, case)
        add_speedups(results, baselines)
        data = report_data(results, device, {**settings, **({"interrupted": interrupted} if interrupted else {})},
                           peaks, command, time.time() - started)

        paths = write_reports(data, out, plots=not args.no_plots)
        partial.unlink(missing_ok=True)
        from harness.perf.reports.markdown import summary_lines

        print("\n".join(summary_lines(data)))
        for kind, path in paths.items():
            print(f"bench: {kind}: {path}")
        return 130 if interrupted else 0
    finally:
        sigterm.restore()


def _more_rounds(runner, pairs, results, args, started, settings, save_partial) -> None:
    """Passes 2..--rounds over every timed (case, backend), in the first pass's order (Bench.add_round), each with
    its own progress bar and ``save_partial()`` after each case; none started past --time-limit. ``settings``'s
    "rounds_done" counts the passes completed (the first included) as they end, so an interrupted run's report
    says how far it got."""
    from tqdm import tqdm

    if args.rounds > 1:
        settings["rounds_done"] = 1
    for r in range(2, args.rounds + 1):
        bar = tqdm(total=len(pairs), desc=f"round {r}/{args.rounds}", unit="cell", disable=args.quiet,
                   file=sys.stderr, dynamic_ncols=True)
        try:
            for i, ((case, adapter), rec) in enumerate(zip(pairs, results)):
                if args.time_limit is not None and time.time() - started > args.time_limit:
                    print(f"bench: --time-limit {args.time_limit:g} s reached in round {r}: the cells keep the "
                          "rounds they got", file=sys.stderr)
                    return
                if rec["status"] == "ok":
                    bar.set_postfix_str(f"{adapter.name} {case.id}", refresh=True)
                    runner.add_round(rec, adapter, case)
                bar.update(1)
                if i + 1 == len(pairs) or pairs[i + 1][0].id != case.id:
                    save_partial()
        finally:
            bar.close()
        settings["rounds_done"] = r


def _not_run(case: Case, adapter, reason: str) -> dict:
    """The result of a cell the bench did not run (a time limit, an interrupt): no timings, the reason."""
    return {"case": case.id, "family": case.family, "dtype": case.dtype, "params": case_params(case),
            "backend": adapter.name, "status": "not-timed", "reason": reason, "modes": {}, "memory": None,
            "verify": {}}


