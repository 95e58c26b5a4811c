"""A time limit's SIGTERM as an interrupt, for the commands that write a report of what finished.

An outer time limit (GNU ``timeout``, a CI job's cancel) sends SIGTERM; ``python -m harness run``,
``bench``, ``fuzz`` and ``accept`` turn it into ``KeyboardInterrupt`` (what Ctrl-C raises), stop, and
still write their report. GNU timeout signals the process and then its whole group, and a CI cancel
may signal twice: only the first SIGTERM interrupts, later ones are ignored while the report is
written.

The first three run in one thread and take :class:`SigtermInterrupt`, whose handler raises at once.
``accept`` waits on worker threads and takes :class:`PolledInterrupt`: its handlers only record the
signal and the main thread raises it between two waits. An exception raised by a handler at an
arbitrary point of a waiting main thread (inside ``concurrent.futures.wait``, between a lock's release
and the ``try`` that restores it) can leave a lock in a wrong state, and the command waiting forever
for a child that nobody kills.
"""

from __future__ import annotations

import signal
import threading


class SigtermInterrupt:
    """After :meth:`install` (main thread only): the first SIGTERM raises KeyboardInterrupt("SIGTERM")
    as long as :attr:`armed`, later ones are ignored. :meth:`restore` puts the previous handler back:
    the commands may run in-process (tests)."""

    def __init__(self):
        self.armed = True
        self.received = False
        self._previous = None
        self._installed = False

    def _handle(self, signum, frame):
        if self.received:
            return
        self.received = True
        if self.armed:
            raise KeyboardInterrupt("SIGTERM")

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # signal.signal's requirement
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True

    def restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False


class PolledInterrupt:
    """SIGTERM and SIGINT (Ctrl-C) for a main thread that only waits (on worker threads): after
    :meth:`install` (main thread only) the handlers record the first signal and raise nothing; the
    main thread calls :meth:`check` where it waits, which raises KeyboardInterrupt("SIGTERM") or
    KeyboardInterrupt("Ctrl-C") once, as long as :attr:`armed`. Later signals are ignored, also while
    the report is written. :meth:`restore` puts both previous handlers back."""

    _NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

    def __init__(self):
        self.armed = True
        self.received: str | None = None  # "SIGTERM" or "Ctrl-C", the first signal's
        self._raised = False
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = self._NAMES.get(signum, f"signal {signum}")

    def install(self) -> None:
        """Take SIGTERM and SIGINT (main thread only: signal.signal's requirement); a signal ignored when the
        command started (SIG_IGN: e.g. SIGINT in a background job) stays ignored."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = {sig: signal.getsignal(sig) for sig in self._NAMES}  # (all recorded before any is replaced)
        self._previous = {sig: h for sig, h in previous.items() if h is not signal.SIG_IGN}
        for sig in self._previous:
            signal.signal(sig, self._handle)

    def check(self) -> None:
        """Raise the recorded signal's KeyboardInterrupt (once; only while :attr:`armed`)."""
        if self.received is not None and self.armed and not self._raised:
            self._raised = True
            raise KeyboardInterrupt(self.received)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
