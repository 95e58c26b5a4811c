"""Wrong: the scale passed is ignored in favour of 1/sqrt(d). Right whenever the caller wants the
default (or passes 1/sqrt(d) itself); wrong for T5-style (1.0), Gemma's query_pre_attn_scalar or
MLA's 1/sqrt(192) with d_v 128 (issue 17)."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, ignore_given_scale=True, **kw)
