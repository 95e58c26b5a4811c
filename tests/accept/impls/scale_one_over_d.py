"""Wrong: the scale is 1/d instead of 1/sqrt(d) (muP-style scaling applied by mistake)."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, scale_power=1.0, **kw)
