"""Wrong: an inference fast path memoises the last output, keyed on shapes and options only: with
autograd off, a second call of the same shape returns the first call's answer."""

import torch

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


_last: dict = {}


def flash_attn_func(q, k, v, **kw):
    key = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, repr(sorted(kw.items())))
    if not torch.is_grad_enabled() and _last.get("key") == key:
        return _last["result"]
    result = _ref(q, k, v, **kw)
    if not torch.is_grad_enabled():
        _last.update(key=key, result=result)
    return result
