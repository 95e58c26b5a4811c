"""Wrong: the output is torch.empty and the last partial tile of query rows (Sq % 16 rows) is never
written, as when the grid is computed with floor instead of ceil division."""

import torch

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


TILE = 16


def flash_attn_func(q, k, v, **kw):
    full, lse = _ref(q, k, v, **kw)
    n = (q.shape[1] // TILE) * TILE
    out = torch.empty_like(full)
    out[:, :n] = full[:, :n]
    return out, lse
