"""Correct on plain multi-head attention (as many kv heads as query heads), hangs on GQA / MQA:
a run whose first case finishes and whose next one never does (interrupt tests)."""

import time

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


#: printed (into the child's log) once the call hangs: tests wait for it instead of guessing a delay
HANGING = "hangs_unless_mha: hanging now"


def flash_attn_func(q, k, v, **kw):
    if k.shape[-2] != q.shape[-2]:  # (batch, seq, heads, dim): fewer kv heads
        print(HANGING, flush=True)
        while True:
            time.sleep(60)
    return _ref(q, k, v, **kw)
