"""Forgery of the anti-cheat checks: the kernel of caches_last_output.py (with autograd off, a second
call of the same shape returns the first call's answer) and, on import, every anti-cheat check of
the harness replaced, in this process, by one that reports "pass" (the in-process judge's names
before issue 15 and the parent judge's rules after it)."""

import harness.check.verify as V
from harness.accept import anticheat

try:
    from .caches_last_output import flash_attn_func
except ImportError:
    from caches_last_output import flash_attn_func


def _prop(name):
    return lambda *a, **k: V.PropertyResult(name, "pass", "forged")


anticheat.check_caching = anticheat.caching_verdict = _prop("caching")
anticheat.check_side_stream = anticheat.side_stream_verdict = _prop("side_stream")
anticheat.recheck_after_calls = anticheat.recheck_verdict = \
    lambda *a, **k: (V.PropertyResult("recheck_after_timing", "pass", "forged"), None)

__all__ = ["flash_attn_func"]
