"""One child process per case, serving the judge's requests, with a deadline: a crash or a hang
becomes a result, not our death.

Start method. ``forkserver`` (the default of CPU runs): a server process is started once, imports
torch and the harness (it runs no op), and forks a fresh child per case in ~0.2 s. ``spawn`` (the
default of CUDA runs, chosen by the command) starts a fresh interpreter per case (~3 s of imports):
no driver state can be inherited, which matters more than 3 s next to a GPU case's own cost.
Either way a case gets its own process: a CUDA context poisoned by an illegal memory access, a
leaked cache or an abort in one case cannot reach the next.

Exchange (:mod:`harness.accept.exchange`): :meth:`Isolator.open` starts a child
(:func:`harness.accept.runner.child_main`) with a JSON *hello* and one end of a pipe; the child
imports the callable and answers with what it declares; then :meth:`ChildSession.ask` sends a JSON
request and waits for the JSON answer. Tensors travel in safetensors files named in the messages.
No pickle is ever read from the child: what it sends cannot run code in the parent. The child's
stdout and stderr go to a log file per session, whose tail explains a crash.

Outcomes (:class:`ChildOutcome`, carried by :class:`ChildFailed` when a session ends badly):
``crash`` (killed by a signal, e.g. SIGABRT / SIGSEGV, or exited without answering), ``timeout``
(no answer before the session's deadline: killed with SIGKILL), ``exception`` (the child's own code
raised; the traceback is kept), ``usage_error`` (the callable does not import), ``interrupted`` (the
run was stopped, :meth:`Isolator.interrupt`: the child was killed, or never started).

Interrupts. An outer time limit (GNU ``timeout``, a CI job's cancel) or Ctrl-C stops the command:
:meth:`Isolator.interrupt` (called by the command, from any thread) refuses every later session and
kills every running child, whose waiting thread then gets ``interrupted``. GNU timeout also
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

from harness.check.pool import FORKSERVER_PRELOAD

#: Per-case limit, seconds. A GPU case JIT-compiles forward and backward kernels in a fresh process
#: (flash-attn-4's CuTe kernels: tens of seconds per shape and dtype) and runs 3 seeds of fwd+bwd
#: against an FP64 oracle; five minutes is several times that, and a hang is anything beyond.
DEFAULT_TIMEOUT_S = 300.0
#: Seconds to wait for a killed child to be reaped.
KILL_GRACE_S = 10.0
#: Seconds a child told "bye" gets to exit on its own before it is killed.
BYE_GRACE_S = 5.0
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


def _kill_fork_server() -> None:
    """SIGKILL this process's multiprocessing fork server, if it runs: a start waiting for it then fails at once
    (multiprocessing keeps its pid privately; a later start makes a new server)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _kill(proc) -> None:
    try:
        proc.kill()
    except (OSError, ValueError, AttributeError):  # already reaped / closed / not started
        pass


class ChildFailed(Exception):
    """A session ended without the answer asked for; ``outcome`` says how (crash, timeout, ...)."""

    def __init__(self, outcome: ChildOutcome):
        super().__init__(outcome.reason)
        self.outcome = outcome


class Isolator:
    """Starts child sessions. ``workdir`` receives logs/ and the exchange folder of tensor files."""

    def __init__(self, workdir: Path, *, start_method: str | None = None):
        self.workdir = Path(workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.exchange_dir = self.workdir / ".exchange"
        self.exchange_dir.mkdir(parents=True, exist_ok=True)
        self.start_method = start_method or default_start_method()
        self.ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            self.ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self._stop = threading.Event()
        self._stop_reason = ""
        self._lock = threading.Lock()
        self._live: set = set()  # children started and not yet reaped
        self._starting = 0  # children being started (a fork server's start-up may take seconds, or hang)

    @property
    def interrupted(self) -> str | None:
        """Why the run was stopped (:meth:`interrupt`), or None."""
        return self._stop_reason if self._stop.is_set() else None

    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop the run, from any thread: no child starts any more, every running child is killed
        (SIGKILL; the thread waiting for it gets an ``interrupted`` outcome). A child being started from a
        fork server that has not answered yet (its start-up imports torch: seconds; a hung one: forever)
        stops with the fork server, which is killed too (a later run starts a new one)."""
        with self._lock:
            if not self._stop.is_set():
                self._stop_reason = reason
                self._stop.set()
            live = list(self._live)
            starting = self._starting
        for proc in live:
            _kill(proc)
        if starting and self.start_method == "forkserver":
            _kill_fork_server()

    def cleanup(self) -> None:
        """Remove the exchange folder (tensor files); logs stay."""
        shutil.rmtree(self.exchange_dir, ignore_errors=True)

    def open(self, hello: dict, *, timeout: float, name: str) -> ChildSession:
        """Start a child for ``hello`` (impl, family, device, threads) with a deadline ``timeout``
        seconds away; returns the session once the child has answered its probe. Raises
        :class:`ChildFailed` when it could not (crash, hang, import error, interrupt)."""
        return ChildSession(self, hello, timeout=timeout, name=name)


class ChildSession:
    """One child process serving requests until :meth:`close` (or until its deadline passes).

    ``probe``: what the child answered on start (the callable's declarations, versions, device).
    ``folder``: where this session's tensor files go (removed on close).
    """

    def __init__(self, iso: Isolator, hello: dict, *, timeout: float, name: str):
        from harness.accept.runner import child_main

        self.iso = iso
        self.name = safe_name(name)
        self.timeout = timeout
        self.log_path = str(iso.workdir / "logs" / f"{self.name}.log")
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)
        self.folder = iso.exchange_dir / f"{self.name}-{time.monotonic_ns()}"
        self.folder.mkdir(parents=True)
        self._files = 0
        self.t0 = time.perf_counter()
        self.deadline = time.monotonic() + timeout
        self.closed = False
        #: Set when the child reported a sticky CUDA error after a request (it then exits).
        self.context_lost: str | None = None
        full = dict(hello, log_path=self.log_path, budget_s=timeout, scratch=str(self.folder / "scratch"))
        parent_end, child_end = iso.ctx.Pipe(duplex=True)
        self.conn = parent_end
        self.proc = iso.ctx.Process(target=child_main, args=(json.dumps(full), child_end), name=f"accept:{self.name}")
        with iso._lock:  # no child starts once interrupted
            if iso._stop.is_set():
                self._remove_folder()
                raise ChildFailed(ChildOutcome("interrupted", None, f"not run: {iso._stop_reason}", None, 0.0, ""))
            iso._starting += 1
        # Started outside the lock: interrupt() must not wait for a fork server's start-up (seconds), nor for a
        # hung one; it kills the server instead, and this start fails.
        try:
            self.proc.start()
        except Exception:
            self._remove_folder()
            # (the signal of a time limit may have killed the fork server a moment before the parent's own interrupt)
            if iso._stop.is_set() or iso._stop.wait(INTERRUPT_GRACE_S):
                raise ChildFailed(ChildOutcome("interrupted", None, f"not run: {iso._stop_reason}", None, 0.0,
                                               "")) from None
            raise
        finally:
            with iso._lock:
                iso._starting -= 1
        with iso._lock:  # interrupt() either sees this child in _live or has stopped the run: then it is killed here
            iso._live.add(self.proc)
            stopped = iso._stop.is_set()
        if stopped:
            _kill(self.proc)
        child_end.close()  # the child's end lives in the child only: its death is then EOF here
        reply = self._receive()
        if not reply.get("ok"):
            self._fail_from_reply(reply, usage=True)
        self.probe: dict = reply["result"]

    # -- talking ------------------------------------------------------------------------------

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def renew(self, timeout: float) -> None:
        """A new deadline, ``timeout`` seconds from now (a long-lived child: one deadline per task)."""
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def file(self, stem: str) -> str:
        """A fresh path in this session's folder, for a tensor file."""
        self._files += 1
        return str(self.folder / f"{self._files:04d}-{safe_name(stem)}.safetensors")

    def ask(self, op: str, **fields) -> dict:
        """Send request ``op`` and return the child's ``result``. Raises :class:`ChildFailed` when the
        child crashes, hangs past the deadline, is interrupted, or its own code raises."""
        from harness.accept import exchange

        if self.closed:
            why = (f"the child's CUDA context was lost earlier ({self.context_lost}) and the child ended"
                   if self.context_lost else "the child was already closed")
            raise ChildFailed(self._outcome("crash", why))
        try:
            exchange.send(self.conn, dict(fields, op=op, budget_s=max(self.remaining(), 0.5)))
        except (OSError, ValueError):  # the child is already gone: its exit status says why
            pass
        reply = self._receive()
        if reply.get("context_lost"):  # the child ends after this reply: a later ask needs a new session
            self.context_lost = reply["context_lost"]
            self._finish(kill=False)
        if not reply.get("ok"):
            self._fail_from_reply(reply)
        return reply["result"]

    def _receive(self) -> dict:
        from harness.accept import exchange

        remaining = self.remaining()
        try:
            ready = remaining > 0 and self.conn.poll(remaining)
        except (OSError, ValueError):
            ready = True  # closed under us (interrupt): the read below says so
        if not ready:
            self._finish(kill=True)
            raise ChildFailed(self._outcome(
                "timeout", f"no result within the {self.timeout:g} s limit: hung; the child was killed (SIGKILL)"))
        try:
            return exchange.receive(self.conn)
        except (EOFError, OSError):
            self._finish(kill=False)
            raise ChildFailed(self._gone(None)) from None
        except exchange.ExchangeError as e:
            self._finish(kill=True)
            raise ChildFailed(self._outcome("crash", f"the child process sent {e}; it was killed")) from None

    def _fail_from_reply(self, reply: dict, *, usage: bool = False):
        if usage and "usage_error" in reply:
            self._finish(kill=True)
            raise ChildFailed(self._outcome("usage_error", reply["usage_error"]))
        error = str(reply.get("error", "?"))
        if error.startswith("KeyboardInterrupt"):
            self._finish(kill=True)
            raise ChildFailed(self._gone(error))
        self._finish(kill=True)
        raise ChildFailed(self._outcome("exception", f"the task raised {error}", traceback=reply.get("traceback", "")))

    # -- ending -------------------------------------------------------------------------------

    def _finish(self, *, kill: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if kill:
            _kill(self.proc)
        try:
            self.proc.join(KILL_GRACE_S)
            if self.proc.is_alive():
                _kill(self.proc)
                self.proc.join(KILL_GRACE_S)
        finally:
            with self.iso._lock:
                self.iso._live.discard(self.proc)
            try:
                self.conn.close()
            except OSError:
                pass
            self._remove_folder()

    def _remove_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        """Tell the child to exit, and make sure it has (killed after :data:`BYE_GRACE_S`)."""
        from harness.accept import exchange

        if self.closed:
            return
        try:
            exchange.send(self.conn, {"op": "bye"})
            if self.conn.poll(BYE_GRACE_S):
                exchange.receive(self.conn)
            self.proc.join(BYE_GRACE_S)
        except (OSError, EOFError, ValueError, exchange.ExchangeError):
            pass
        self._finish(kill=self.proc.is_alive())

    def __enter__(self) -> ChildSession:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None and not isinstance(exc[1], ChildFailed):
            self._finish(kill=True)  # KeyboardInterrupt or a parent error: no orphan
        else:
            self.close()

    def outcome_ok(self, result: dict) -> ChildOutcome:
        """The ``ok`` outcome of a finished session, carrying ``result``."""
        return ChildOutcome("ok", result, "", self.proc.exitcode, self.seconds, self.log_path, _tail(self.log_path))

    def _outcome(self, kind: str, reason: str, *, traceback: str = "") -> ChildOutcome:
        return ChildOutcome(kind, None, reason, self.proc.exitcode, self.seconds, self.log_path,
                            _tail(self.log_path), traceback)

    def _gone(self, error: str | None) -> ChildOutcome:
        """The outcome of a child that died (or raised KeyboardInterrupt) without answering."""
        code = self.proc.exitcode
        stopped = self.iso._stop.is_set()
        by_signal = code in _INTERRUPT_EXITCODES or error is not None
        if stopped or (by_signal and self.iso._stop.wait(INTERRUPT_GRACE_S)):
            return self._outcome(
                "interrupted",
                f"not run: {self.iso._stop_reason}; the running case was stopped after {self.seconds:.1f} s")
        if code is not None and code < 0:
            why = f"the child process was killed by {_signal_name(-code)}"
        else:
            why = f"the child process exited with code {code} without a result"
        tail = _tail(self.log_path)
        last = [ln for ln in tail.splitlines() if ln.strip()]
        hint = next((ln.strip() for ln in reversed(last) if "error" in ln.lower() or "abort" in ln.lower()), "")
        if hint:
            why += f" (log: {hint[:200]})"
        return self._outcome("crash", why)
