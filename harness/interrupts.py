"""A time limit's SIGTERM as an interrupt, for the commands that write a report of what finished.

An outer time limit (GNU ``timeout``, a CI job's cancel) sends SIGTERM; ``python -m harness run``
and ``python -m harness accept`` turn it into ``KeyboardInterrupt`` (what Ctrl-C raises), stop, and
still write their report. GNU timeout signals the process and then its whole group, and a CI cancel
may signal twice: only the first SIGTERM interrupts, later ones are ignored while the report is
written.
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
