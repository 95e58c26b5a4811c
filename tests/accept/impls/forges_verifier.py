"""Forgery: noise for an answer, and on import every verifier entry point and every anti-cheat
check of the harness replaced, in this process, by versions that report "pass" (the names of the
in-process judge before issue 15 and of the parent's judge after it)."""

import harness.check.verify as V
from harness.accept import anticheat

try:
    from ._forgery import noise
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _forgery import noise


def _passed(adapter, case, *args, seed=0, device=None, **kwargs):
    return V.CaseResult(backend=getattr(adapter, "name", "x"), case=case.id, family=case.family, dtype=case.dtype,
                        device=str(device), seed=seed, status="pass")


def _prop(name):
    return lambda *a, **k: V.PropertyResult(name, "pass", "forged")


V.verify = _passed
V._judge = lambda result, *a, **k: None
V.judge_runs = lambda adapter, baseline, *a, **k: _passed(adapter, baseline.case, seed=baseline.seed)
anticheat.check_caching = anticheat.caching_verdict = _prop("caching")
anticheat.check_side_stream = anticheat.side_stream_verdict = _prop("side_stream")
anticheat.recheck_after_calls = anticheat.recheck_verdict = \
    lambda *a, **k: (V.PropertyResult("recheck_after_timing", "pass", "forged"), None)


def flash_attn_func(q, k, v, **kw):
    return noise(q, k, v, **kw)
