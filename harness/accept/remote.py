"""A candidate verified case after case in one child process, judged here: the fuzzer's and the
shrinker's way to run a callable (``--impl``) or a registered backend (``--backend``) with the
acceptance check's isolation (:mod:`harness.accept.isolation`, :mod:`harness.accept.judge`).

A crash, a hang past the per-case timeout or an exception of the child's own code becomes an
"error" result for that case ("crash: the child process was killed by SIGSEGV", ...), and the next
case gets a fresh child; so does a case after which the child's CUDA context is lost (a sticky error
such as an illegal memory access: the child reports it with the case's result and exits, instead of
failing every later case with it).
"""

from __future__ import annotations

import torch

from harness.accept import judge as J
from harness.accept.isolation import ChildFailed, Isolator
from harness.check.results import CaseResult


class RemoteVerifier:
    """``verify(case, seed)`` -> :class:`CaseResult`, the candidate running in a child.

    ``impl``: MODULE:CALLABLE, or ``backend``: a registered adapter name (exactly one); the parent
    never imports ``impl``. ``timeout``: seconds per case."""

    def __init__(self, workdir, *, family: str, device, impl: str | None = None, backend: str | None = None,
                 timeout: float = 120.0, start_method: str | None = None, threads: int | None = None):
        if (impl is None) == (backend is None):
            raise ValueError("RemoteVerifier: give exactly one of impl and backend")
        self.device = torch.device(device)
        self.family, self.impl, self.backend, self.timeout = family, impl, backend, timeout
        method = start_method or ("spawn" if self.device.type == "cuda" else None)
        self.iso = Isolator(workdir, start_method=method)
        self.hello = {"impl": impl, "backend": backend, "family": family, "device": str(self.device),
                      "threads": threads}
        self.session = None
        self.declared = None
        self.starts = 0
        self.name = backend or impl

    def _open(self):
        if self.session is None or self.session.closed:  # a child that lost its CUDA context ended itself
            self.starts += 1
            self.session = self.iso.open(self.hello, timeout=self.timeout, name=f"{self.name}-{self.starts}")
            if self.declared is None:
                if self.backend:
                    from harness.adapters import registry

                    self.declared = registry.get(self.backend)
                else:
                    probe = self.session.probe
                    self.declared = J.declared_adapter(probe["adapter"], self.family, probe.get("capabilities") or {})
        return self.session

    def adapter(self):
        """What the candidate declares (its ``supports``); starts the child on first use."""
        self._open()
        return self.declared

    def verify(self, case, seed: int, *, backward: bool = True) -> CaseResult:
        base = J.baseline(case, seed, self.device)
        try:
            session = self._open()
            session.renew(self.timeout)
            result = J.Judge(session, self.declared, self.device).verify(base, want_grad=backward)
        except ChildFailed as e:
            self.session = None
            o = e.outcome
            result = CaseResult(backend=self.name, case=case.id, family=case.family, dtype=case.dtype,
                                device=str(self.device), seed=seed, status="error", reason=f"{o.kind}: {o.reason}",
                                error_traceback=o.traceback or o.log_tail[-2000:])
        return result

    def close(self, *, now: bool = False) -> None:
        """End the child. ``now`` (the run was interrupted): kill it at once instead of asking it to
        exit, which waits up to BYE_GRACE_S twice for a child busy with (or hung in) a task."""
        if now:
            self.iso.interrupt("interrupted")
        if self.session is not None:
            self.session.close()
            self.session = None
        self.iso.cleanup()
