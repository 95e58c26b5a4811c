"""One child process per task, with a timeout: a crash or a hang becomes a result, not our death.

Start method. ``forkserver`` (the default of CPU runs): a server process is started once, imports
torch and the harness (it runs no op), and forks a fresh child per case in ~0.2 s. ``spawn`` (the
default of CUDA runs, chosen by the command) starts a fresh interpreter per case (~3 s of imports):
no driver state can be inherited, which matters more than 3 s next to a GPU case's own cost.
Either way a case gets its own process: a CUDA context poisoned by an illegal memory access, a
leaked cache or an abort in one case cannot reach the next.

Exchange: the request goes in as one JSON string; the child writes its result as a JSON file
(:func:`harness.accept.worker.child_main`). Nothing else crosses the boundary. The child's stdout
and stderr go to a log file per task, whose tail explains a crash.

Outcomes: the child's result; or ``crash`` (killed by a signal, e.g. SIGABRT / SIGSEGV, or exited
without a result), ``timeout`` (no result within the limit: killed with SIGKILL), ``exception``
(the task raised; the traceback is kept), ``interrupted`` (the run was stopped, :meth:`Isolator.interrupt`:
the child was killed, or never started).

Interrupts. An outer time limit (GNU ``timeout``, a CI job's cancel) or Ctrl-C stops the command:
:meth:`Isolator.interrupt` (called by the command, from any thread) refuses every later task and
kills every running child, whose waiting thread then returns ``interrupted``. GNU timeout also
signals the whole process group and a terminal's Ctrl-C reaches it too, so a child may die of
SIGTERM (or raise KeyboardInterrupt, or lose its fork server to that signal) a moment before the
parent has handled its own signal: such an outcome waits up to :data:`INTERRUPT_GRACE_S` for the
interrupt and is then ``interrupted``, not a crash.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: Per-task limit, seconds. A GPU case JIT-compiles forward and backward kernels in a fresh process
#: (flash-attn-4's CuTe kernels: tens of seconds per shape and dtype) and runs 3 seeds of fwd+bwd
#: against an FP64 oracle; five minutes is several times that, and a hang is anything beyond.
DEFAULT_TIMEOUT_S = 300.0
#: Seconds to wait for a killed child to be reaped.
KILL_GRACE_S = 10.0
#: Modules the fork server imports once (children inherit them). torch._inductor is what
#: torch.use_deterministic_algorithms imports on first use: ~1 s saved per case.
PRELOAD = ["torch", "torch._inductor", "harness.verify", "harness.accept.worker"]
#: Characters of the child's log kept in a failure's reason / the report.
LOG_TAIL_CHARS = 2000
#: Seconds a child that died of SIGTERM / SIGINT (or raised KeyboardInterrupt) waits for the
#: parent's own interrupt: the signal of a time limit reaches the whole process group at once.
INTERRUPT_GRACE_S = 2.0
#: Exit statuses of a child the signal of an interrupt may have stopped: SIGTERM (a time limit), SIGINT
#: (Ctrl-C), and 255: what multiprocessing reports when the fork server (in the same process group)
#: died before it could pass the child's status on.
_INTERRUPT_EXITCODES = (-signal.SIGTERM, -signal.SIGINT, 255)


@dataclass
class ChildOutcome:
    """What came back from one child. ``kind``: "ok", "usage_error", "exception", "crash", "timeout",
    "interrupted" (the run was stopped: the child was killed, or never started)."""

    kind: str
    result: dict | None
    reason: str
    exitcode: int | None
    seconds: float
    log_path: str
    log_tail: str = ""
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def default_start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")[:150]


def _tail(path: str, n: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _kill(proc) -> None:
    try:
        proc.kill()
    except (OSError, ValueError, AttributeError):  # already reaped / closed / not started
        pass


class Isolator:
    """Runs worker tasks in child processes. ``workdir`` receives logs/ and the result files."""

    def __init__(self, workdir: Path, *, start_method: str | None = None):
        self.workdir = Path(workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self._results = self.workdir / ".results"
        self._results.mkdir(parents=True, exist_ok=True)
        self.start_method = start_method or default_start_method()
        self.ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            self.ctx.set_forkserver_preload(PRELOAD)
        self._stop = threading.Event()
        self._stop_reason = ""
        self._lock = threading.Lock()
        self._live: set = set()  # children started and not yet reaped

    @property
    def interrupted(self) -> str | None:
        """Why the run was stopped (:meth:`interrupt`), or None."""
        return self._stop_reason if self._stop.is_set() else None

    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop the run, from any thread: no child starts any more, every running child is killed
        (SIGKILL; the thread waiting for it reaps it and returns an ``interrupted`` outcome)."""
        with self._lock:
            if not self._stop.is_set():
                self._stop_reason = reason
                self._stop.set()
            live = list(self._live)
        for proc in live:
            _kill(proc)

    def cleanup(self) -> None:
        """Remove the (empty) result folder; logs stay."""
        try:
            shutil.rmtree(self._results)
        except OSError:
            pass

    def run(self, request: dict, *, timeout: float, name: str) -> ChildOutcome:
        """Run ``request`` (a worker task) in a fresh child; at most ``timeout`` seconds."""
        from harness.accept.worker import child_main

        stem = safe_name(name)
        log_path = str(self.workdir / "logs" / f"{stem}.log")
        result_path = str(self._results / f"{stem}-{os.getpid()}-{time.monotonic_ns()}.json")
        for p in (log_path, result_path):
            if os.path.exists(p):
                os.unlink(p)
        # Oracle results of fresh random seeds are never looked up again: the child caches them
        # in a scratch folder removed when it ends, not in the shared harness cache.
        scratch = self._results / f"scratch-{stem}-{time.monotonic_ns()}"
        req = dict(request, log_path=log_path, result_path=result_path, timeout=timeout, scratch=str(scratch))
        t0 = time.perf_counter()
        proc = self.ctx.Process(target=child_main, args=(json.dumps(req),), name=f"accept:{stem}")
        with self._lock:  # interrupt() either sees this child in _live or stops it from starting
            if self._stop.is_set():
                return ChildOutcome("interrupted", None, f"not run: {self._stop_reason}", None, 0.0, "")
            proc.start()
            self._live.add(proc)
        try:
            proc.join(timeout)
            # Set before the child ended: interrupt() killed it (or the same signal did).
            stopped = self._stop.is_set()
            timed_out = proc.is_alive()
            if timed_out:
                proc.kill()
                proc.join(KILL_GRACE_S)
        except BaseException:  # KeyboardInterrupt while waiting in the main thread: no orphan
            _kill(proc)
            proc.join(KILL_GRACE_S)
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        finally:
            with self._lock:
                self._live.discard(proc)
        seconds = time.perf_counter() - t0
        shutil.rmtree(scratch, ignore_errors=True)
        code = proc.exitcode
        tail = _tail(log_path)
        payload = None
        if os.path.exists(result_path):
            try:
                with open(result_path) as f:
                    payload = json.load(f)
            except (OSError, ValueError):
                payload = None
            finally:
                os.unlink(result_path)
        common = {"exitcode": code, "seconds": seconds, "log_path": log_path, "log_tail": tail}
        if payload is None or "error" in payload:
            by_signal = code in _INTERRUPT_EXITCODES or str((payload or {}).get("error", "")).startswith(
                "KeyboardInterrupt")
            if (stopped and payload is None) or (by_signal and self._stop.wait(INTERRUPT_GRACE_S)):
                return ChildOutcome(
                    "interrupted", None,
                    f"not run: {self._stop_reason}; the running case was stopped after {seconds:.1f} s", **common,
                )
        if timed_out and payload is None:
            return ChildOutcome(
                "timeout", None,
                f"no result within the {timeout:g} s limit: hung; the child was killed (SIGKILL)", **common,
            )
        if payload is None:
            if code is not None and code < 0:
                why = f"the child process was killed by {_signal_name(-code)}"
            else:
                why = f"the child process exited with code {code} without a result"
            last = [ln for ln in tail.splitlines() if ln.strip()]
            hint = next((ln.strip() for ln in reversed(last) if "error" in ln.lower() or "abort" in ln.lower()), "")
            if hint:
                why += f" (log: {hint[:200]})"
            return ChildOutcome("crash", None, why, **common)
        if payload.get("ok"):
            return ChildOutcome("ok", payload["result"], "", **common)
        if "usage_error" in payload:
            return ChildOutcome("usage_error", None, payload["usage_error"], **common)
        return ChildOutcome(
            "exception", None, f"the task raised {payload.get('error', '?')}", traceback=payload.get("traceback", ""),
            **common,
        )
