"""Wrong: the default scale (softmax_scale omitted) is 1/d instead of 1/sqrt(d); a scale passed
explicitly is used right. Every call that omits the keyword, as users' calls do, is wrong; a
harness that always passes 1/sqrt(d) never sees it (issue 17)."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, default_power=1.0, **kw)
