"""Wrong: the forward is exact, dv is 1% too large (a custom autograd.Function scales it by 1.01)."""

import torch

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.01


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, _ScaleGrad.apply(v), **kw)
