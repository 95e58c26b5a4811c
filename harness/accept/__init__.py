"""``python -m harness accept``: the vendor-kernel acceptance check, one command, one verdict.

    python -m harness accept --impl MODULE:CALLABLE [--family softmax|linear|decode] [--device cpu|cuda]
        [--dtypes ...] [--profile NAME] [--out DIR] [--case ID] [--seed N] [--timeout S] ...

The callable follows the adapters' contract (flash-attn's signature for softmax, FLA's for linear,
flash-attn's ``flash_attn_with_kvcache`` for decode; :mod:`harness.adapters.user`).

Who decides. This process is the judge and never imports the callable. Every case of the profile
gets its own child process (:mod:`.isolation`), which imports the callable and makes the calls the
judge asks for (:mod:`.runner`); the judge (:mod:`.judge`) computes inputs, the FP64 oracle and the
tolerance verdict itself, on several fresh seeds, and judges the raw tensors that come back:
forward, every gradient, the contract, determinism (two calls compared here), and the anti-cheat
checks (:mod:`.anticheat`). On CUDA the speed section follows (:mod:`.speed`), with the parent's
own clock against the candidate's claimed times. The report (:mod:`.report`) goes to ``--out`` as
report.md and report.json. What a candidate can still influence is written down in the README
("The trust boundary").

Exit status: 0 accepted, 1 rejected or incomplete, 2 usage error (bad arguments, a callable that
does not import; the message says which).

Interrupts. An outer time limit (GNU ``timeout``, a CI job's cancel: SIGTERM) or Ctrl-C stops the
run as the main job's does (``harness/commands/run.py``): no case starts any more, the running ones'
children are killed, and the report is still written, the finished cases as they are and every
other case "not run"; its verdict is INCOMPLETE (never ACCEPTED) and the exit status 1. Only the
first signal interrupts, taken by the main thread between two short waits
(``harness/interrupts.py``, :class:`PolledInterrupt`); the previous SIGTERM and SIGINT handlers are
back when :func:`main` returns.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path

from harness.accept import report as R
from harness.accept.exchange import ExchangeError
from harness.accept.isolation import DEFAULT_TIMEOUT_S, ChildFailed, ChildOutcome, Isolator
from harness.accept.profiles import resolve
from harness.interrupts import PolledInterrupt
from harness.provenance import source_digest

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2
#: An interrupted run (SIGTERM, Ctrl-C): 1, as the main job's (``python -m harness run``).
EXIT_INCOMPLETE = EXIT_REJECTED
DEFAULT_PROFILE = "training-gqa"
DEFAULT_OUT = "accept-report"
#: --seed bound: seeds are drawn below this so any seed fits an int64 with offsets added.
MAX_SEED = 2**31


class _Usage(Exception):
    pass


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise _Usage("--device cuda: torch.cuda.is_available() is False on this machine")
    return name


def _git_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=False, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes" if dirty else "")


def _command(args, *, case: str | None = None, seed: int | None = None, base_seed: int | None = None,
             out: Path | None = None) -> str:
    parts = ["python", "-m", "harness", "accept", "--impl", args.impl, "--family", args.family,
             "--device", args.device_resolved, "--profile", args.profile]
    if args.dtypes:
        parts += ["--dtypes", ",".join(args.dtypes)]
    if args.timeout != DEFAULT_TIMEOUT_S:
        parts += ["--timeout", f"{args.timeout:g}"]
    if case is not None:
        parts += ["--case", case]
    elif args.case:
        for c in args.case:
            parts += ["--case", c]
    if seed is not None:
        parts += ["--seed", str(seed)]
    elif base_seed is not None:
        parts += ["--base-seed", str(base_seed)]
        if args.seeds:
            parts += ["--seeds", str(args.seeds)]
    parts += ["--out", str(out if out is not None else args.out)]
    return shlex.join(parts)


def _say(msg: str) -> None:
    print(msg, flush=True)


def main(args) -> int:
    stop = PolledInterrupt()
    try:
        with _judge_imports():
            return _main(args, stop)
    except _Usage as e:
        print(f"python -m harness accept: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        stop.restore()


@contextlib.contextmanager
def _judge_imports():
    """While the judge runs, modules it imports come from the installed packages, never from the
    current directory: that is where a vendor runs the command from, and a file there named like a
    module the judge imports later (``safetensors.py``, ``matplotlib.py``) would otherwise run in
    the judge. The directory that holds ``harness`` stays reachable (a source checkout); children
    put the current directory back to import the callable."""
    import harness

    saved = list(sys.path)
    here = {"", ".", os.getcwd()}
    root = str(Path(harness.__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if p not in here and os.path.abspath(p or ".") != os.getcwd()]
    if root not in sys.path:
        sys.path.append(root)
    try:
        yield
    finally:
        sys.path[:] = saved


def _main(args, stop: PolledInterrupt) -> int:
    t_start = time.perf_counter()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    # The judge's own sources, before any child runs: a candidate process runs as the same user and
    # could rewrite them on disk for modules imported later (or for the next run).
    digest_before = source_digest()
    device = _device(args.device)
    args.device_resolved = device
    profile, note = resolve(args.profile, device)
    cases = profile.cases(args.family, args.dtypes)
    if args.list:
        if note:
            _say(note)
        for c in cases:
            tag = "required" if profile.is_required(c) else f"optional ({', '.join(profile.optional_features(c))})"
            _say(f"{c.id}  [{tag}]")
        return 0
    if not args.impl:
        raise _Usage("--impl MODULE:CALLABLE is required")
    if args.impl.count(":") != 1 or not all(p.strip() for p in args.impl.split(":")):
        raise _Usage(f"--impl: expected MODULE:CALLABLE (e.g. mykernel:attention), got {args.impl!r}")
    if args.case:
        known = {c.id: c for c in cases}
        missing = [c for c in args.case if c not in known]
        if missing:
            raise _Usage(
                f"--case: {', '.join(repr(m) for m in missing)} not in profile {profile.name!r} "
                f"({args.family}{', dtypes ' + ','.join(args.dtypes) if args.dtypes else ''}); "
                f"its cases: {', '.join(known)}"
            )
        cases = [known[c] for c in dict.fromkeys(args.case)]
    if not cases:
        raise _Usage(f"profile {profile.name!r} has no {args.family} case")
    if device == "cpu":
        # The in-repo Triton kernels run on CPU tensors only under Triton's interpreter, which
        # Triton reads when a kernel is defined: set before any child imports them.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    # CUDA runs spawn each child: a fork server that ever touched the CUDA driver (an import
    # calling cuInit) would hand its children a broken driver, and a GPU case's own cost (context,
    # JIT, oracle) dwarfs spawn's ~3 s. CPU runs fork from a preloaded server: ~0.2 s a case.
    method = args.start_method or ("spawn" if device == "cuda" else None)
    iso = Isolator(out_dir, start_method=method)

    n_seeds = 1 if args.seed is not None else (args.seeds or profile.seeds)
    base_seed = args.base_seed if args.base_seed is not None else secrets.randbelow(MAX_SEED)
    seeds = [args.seed] if args.seed is not None else [base_seed + i for i in range(n_seeds)]
    # CPU cases are tiny: one thread per parallel child avoids oversubscribing the cores.
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if device == "cpu" else None

    def replay_of(case):
        def replay(seed):
            return _command(args, case=case.id, seed=seeds[0] if seed is None else seed, out=out_dir / "replay")
        return replay

    hello = {"impl": args.impl, "family": args.family, "device": device, "threads": threads}
    declared = None  # the callable's declarations, from the probe

    def run_case(i_case):
        i, case = i_case
        from harness.accept import judge as J

        try:
            with iso.open(hello, timeout=args.timeout, name=f"{i:03d}-{case.id}") as session:
                raw = J.run_case(J.Judge(session, declared, device), case, seeds, backward=profile.backward)
            outcome = session.outcome_ok(raw)
        except ChildFailed as e:
            outcome = e.outcome
        except ExchangeError as e:  # an output file that does not read back: the child's doing
            outcome = ChildOutcome("exception", None, f"the candidate's process returned {e}", None, 0.0,
                                   session.log_path)
        except Exception as e:  # noqa: BLE001 - the judge itself failed (e.g. out of memory): no verdict on the case
            import traceback

            outcome = ChildOutcome("exception", None, f"the judge could not check this case: {type(e).__name__}: {e}",
                                   None, 0.0, "", traceback=traceback.format_exc())
        if outcome.kind == "interrupted":
            entry = R.not_run_case(case, profile, outcome.reason, replay_of(case), seconds=outcome.seconds)
        else:
            entry = R.judge_case(case, outcome, profile, replay_of(case))
        entry["log"] = None
        if outcome.log_path:
            try:
                entry["log"] = os.path.relpath(outcome.log_path, out_dir)
            except ValueError:
                entry["log"] = outcome.log_path
        if outcome.kind != "interrupted" or outcome.seconds:
            _say(f"[{i + 1}/{len(cases)}] {case.id}: {entry['status'].upper()}"
                 + (f" - {entry['reason'][:160]}" if entry["reason"] else "") + f" ({outcome.seconds:.1f} s)")
        return entry

    info: dict = {}
    device_words = f"{device} (not probed: the run was interrupted first)"
    futures: list = []  # index i: case i's
    speed = None
    interrupted = None
    pool = ThreadPoolExecutor(max_workers=args.jobs)

    def finish(futures_to_wait):
        """Wait for ``futures_to_wait``; a signal becomes KeyboardInterrupt here, between two short waits
        (the main thread runs nothing else: the probe, the cases and the speed section run in the pool)."""
        pending = set(futures_to_wait)
        while pending:
            _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            stop.check()

    try:
        # A time limit (timeout, a CI job's cancel) sends SIGTERM: report what finished instead of nothing.
        stop.install()
        # The callable is imported in a child only: a module that crashes or hangs on import cannot
        # take the command down, and nothing of it runs in this process, the judge.

        def probe_child():
            with iso.open(hello, timeout=args.timeout, name="probe") as probe:
                return probe.probe

        probing = pool.submit(probe_child)
        finish([probing])
        try:
            info = probing.result()
        except ChildFailed as e:
            o = e.outcome
            if o.kind == "usage_error":
                raise _Usage(f"--impl {args.impl}: {o.reason}") from None
            raise _Usage(f"--impl {args.impl}: loading the callable failed: {o.reason}"
                         + (f"\n{o.traceback.strip()}" if o.traceback else f"\n{o.log_tail}")) from None
        from harness.accept.judge import declared_adapter

        declared = declared_adapter(info["adapter"], args.family, info.get("capabilities") or {})
        dev = info["device"]
        device_words = (f"{dev['name']} ({dev.get('capability', '')}, cuda)" if dev["type"] == "cuda"
                        else f"cpu ({dev['name']})")
        _say(f"accept {args.impl} ({args.family}) on {device_words}: profile {profile.name}, {len(cases)} case(s), "
             f"seeds {seeds if len(seeds) < 4 else f'{seeds[0]}..{seeds[-1]}'}")
        if note:
            _say(note)

        for ic in enumerate(cases):
            futures.append(pool.submit(run_case, ic))
        finish(futures)
        measuring = pool.submit(_speed_section, args, iso, profile, device, base_seed, out_dir, hello, declared)
        finish([measuring])
        speed = measuring.result()
        stop.armed = False  # done: a signal from now on is ignored while the report is written
    except KeyboardInterrupt as e:
        stop.armed = False  # a later signal must not break the report
        why = str(e.args[0]) if e.args else ""
        interrupted = why if why.startswith("interrupted") else \
            "interrupted (SIGTERM)" if why == "SIGTERM" else "interrupted (Ctrl-C)"
        iso.interrupt(interrupted)  # no case starts any more; the running children are killed
        _say(f"\n{interrupted}: stopping; the report marks every unfinished case as not run")
    except _Usage:
        raise  # (the probe's answer: no child runs)
    except BaseException:
        # The judge itself failed: no running child may keep the command alive.
        iso.interrupt("the judge stopped on an error")
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    entries = []
    for i, case in enumerate(cases):
        f = futures[i] if i < len(futures) else None
        if f is not None and f.done() and not f.cancelled() and (interrupted is None or f.exception() is None):
            entries.append(f.result())
        else:
            why = f"not run: {interrupted}" if f is None or f.cancelled() or f.exception() is None else \
                f"not run: {interrupted} ({type(f.exception()).__name__}: {f.exception()})"
            entries.append(R.not_run_case(case, profile, why, replay_of(case)))
    if speed is None:
        speed = {"status": "not measured", "reason": interrupted or "not run"}
    dev = info.get("device") or {"type": device, "name": "not probed"}
    run = {
        "impl": args.impl, "family": args.family, "device": device, "device_words": device_words,
        "device_info": dev, "profile_requested": args.profile, "profile_note": note,
        "dtypes": args.dtypes, "base_seed": base_seed, "seeds": seeds, "seeds_per_case": len(seeds),
        "filters": ", ".join(f for f in (
            f"--case {' '.join(args.case)}" if args.case else "", f"--seed {args.seed}" if args.seed is not None else "",
        ) if f),
        "command": _command(args, base_seed=None if args.seed is not None else base_seed),
        "argv": sys.argv, "cwd": os.getcwd(), "timeout_s": args.timeout, "start_method": iso.start_method,
        "started": started, "seconds": round(time.perf_counter() - t_start, 1),
        "versions": info.get("versions") or {}, "harness": f"attn-harness {_harness_version()}, git {_git_commit()}, source {digest_before}",
        "module_file": info.get("module_file"), "module_sha256": info.get("module_sha256"),
        "module_version": info.get("module_version"), "capabilities": info.get("capabilities"),
        "differentiable": info.get("differentiable"), "interrupted": interrupted,
    }
    digest_after = source_digest()
    integrity = [] if digest_after == digest_before else [
        f"the harness's own sources (harness/, kernels/) changed on disk during the run (source digest "
        f"{digest_before} before, {digest_after} after): the verdict of a run whose judge may have been "
        "rewritten is not given; rerun from a clean checkout"]
    rep = R.build(run=run, profile=profile, cases=entries, speed=speed, interrupted=interrupted, integrity=integrity)
    j, m = R.write(out_dir, rep)
    iso.cleanup()
    _say(f"{rep['verdict']}" + (f" ({len(rep['reasons'])} reason(s))" if rep["reasons"] else "") + f"; report: {m} and {j}")
    for r in rep["reasons"][:10]:
        _say(f"  - {r[:300]}")
    if rep["verdict"] == R.ACCEPTED:
        return EXIT_ACCEPTED
    return EXIT_INCOMPLETE if rep["verdict"] == R.INCOMPLETE else EXIT_REJECTED


def _harness_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("attn-harness")
    except md.PackageNotFoundError:
        return "(source checkout)"


def _speed_section(args, iso, profile, device, base_seed, out_dir, hello, declared) -> dict:
    if device != "cuda" and not args.speed:
        return {"status": "not measured", "reason": "CPU run: the speed section needs CUDA (device time); --speed runs it with host time"}
    if args.no_speed:
        return {"status": "not measured", "reason": "--no-speed"}
    if (args.case or args.seed is not None) and not args.speed:
        return {"status": "not measured", "reason": "filtered replay run (--case / --seed; --speed measures anyway)"}
    from harness.accept import speed

    cases = profile.bench_cases(args.family, args.dtypes)
    if not cases:
        return {"status": "not measured", "reason": f"the {profile.name} profile has no benchmark cases for "
                f"the {args.family} family yet"}
    return speed.run_speed(
        iso, hello=hello, declared=declared, family=args.family, device=device, cases=cases, backward=profile.backward,
        base_seed=base_seed, timeout=max(args.timeout, speed.BENCH_TIMEOUT_S), out_dir=out_dir, log=_say,
    )
