"""Wrong only when two features combine: with a causal mask *and* a softcap, the cap is applied to
the scores a second time (out drifts); either feature alone is right. The shrinker must find both
and drop every other feature of the case it starts from."""

import torch

try:
    from ._reference import attention
    from ._reference import flash_attn_func as _ref
except ImportError:
    from _reference import attention
    from _reference import flash_attn_func as _ref


def attn(q, k, v, *, causal=False, softcap=0.0, **kw):
    if causal and softcap:
        out, lse = attention(q, k, v, causal=causal, softcap=softcap * 0.5, **kw)
        return out, lse
    return _ref(q, k, v, causal=causal, softcap=softcap, **kw)


__all__ = ["attn", "torch"]
