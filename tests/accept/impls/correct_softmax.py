"""Correct: plain torch, fp32 softmax, varlen by a per-sequence loop. Declares varlen support."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, **kw)


flash_attn_func.attn_capabilities = {"varlen": True}
