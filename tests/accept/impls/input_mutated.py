"""Wrong: q is pre-scaled in place by softmax_scale (saves a multiply per score) and the caller's
tensor is left scaled. Output and gradients are right; the input is not."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, *, softmax_scale=None, **kw):
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    q.mul_(scale)
    return _ref(q, k, v, softmax_scale=1.0, **kw)
