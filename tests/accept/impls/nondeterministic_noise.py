"""Wrong: one element in a hundred is bumped by one ulp at random (unseeded), as a race between
thread blocks would: numerically within tolerance, but two calls differ."""

import math

import torch

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    out, lse = _ref(q, k, v, **kw)
    base = out.detach()
    flip = (torch.rand(out.shape, device=out.device) < 0.01) & (base != 0)
    bumped = torch.nextafter(base, torch.full_like(base, math.inf))
    return out + (bumped - base) * flip, lse
