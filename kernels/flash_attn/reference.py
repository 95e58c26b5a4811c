"""Plain-torch attention reference (materialises the score matrix; small shapes only).

Same conventions as the kernels and the FP64 oracle: layout [B, S, H, D], GQA by heads_k dividing
heads_q, flash-attn's bottom-right window (query i sees key j iff
i + off - left <= j <= i + off + right, off = seqlen_k - seqlen_q, -1 unbounded, causal = right 0),
fully masked rows give out 0 and lse -inf.
"""

from __future__ import annotations

import math

import torch


def visible_mask(seqlen_q: int, seqlen_k: int, *, causal: bool = False, window_size=(-1, -1),
                 device=None) -> torch.Tensor:
    """[Sq, Sk] bool: True where query i may attend to key j."""
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    off = seqlen_k - seqlen_q
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= j <= i + off + right
    if left >= 0:
        keep &= j >= i + off - left
    return keep


def attention_ref(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), upcast=True):
    """q [B, Sq, Hq, D], k/v [B, Sk, Hk, D] -> (out [B, Sq, Hq, D] in q's dtype, lse [B, Hq, Sq] fp32).

    upcast=True: everything in fp32 (inputs upcast). upcast=False: the "plain torch in the same
    dtype" baseline of the tests: matmuls in the input dtype, softmax in fp32, P rounded to the
    input dtype before P @ V (what a fused kernel does). Differentiable through autograd.
    """
    _, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    group = hq // hk
    mm = torch.float32 if upcast else q.dtype
    qc = q.to(mm).transpose(1, 2)                                   # B Hq Sq D
    kc = k.to(mm).transpose(1, 2).repeat_interleave(group, dim=1)   # B Hq Sk D
    vc = v.to(mm).transpose(1, 2).repeat_interleave(group, dim=1)
    s = torch.matmul(qc, kc.transpose(-1, -2)).float() * scale
    keep = visible_mask(sq, sk, causal=causal, window_size=window_size, device=q.device)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                  # B Hq Sq
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse)[..., None])
    p = p.masked_fill(~keep, 0.0)
    out = torch.matmul(p.to(mm), vc).transpose(1, 2)
    return out.to(q.dtype), lse
