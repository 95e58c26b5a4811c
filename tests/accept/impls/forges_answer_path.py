"""Forgery of the exchange: right answers, but the child's runner patched to name another file as its
output, one the judge would read and then delete (a file of the user's). The judge must only ever
open and remove the files it named itself."""

import os
import tempfile

import harness.accept.runner as R

try:
    from ._reference import flash_attn_func
except ImportError:
    from _reference import flash_attn_func

VICTIM = os.path.join(tempfile.gettempdir(), f"attn-harness-victim-{os.getuid()}")
_real = R.Runner.op_call


def _op_call(self, req):
    res = _real(self, req)
    if res.get("status") == "ok":
        res["outputs"]["path"] = VICTIM
    return res


R.Runner.op_call = _op_call
R.OPS["call"] = _op_call

__all__ = ["flash_attn_func"]
