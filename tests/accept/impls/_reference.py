"""A correct plain-torch attention in flash-attn's signature, with the knobs the wrong ones turn.

Materialised scores in float32 (matmuls in the input dtype, softmax in float32), bottom-right
aligned masks, GQA by ``repeat_interleave``, rows that see no key give out 0 and lse -inf. The
deliberately wrong implementations beside it each turn exactly one knob.
"""

from __future__ import annotations

import math

import torch


def _as_if_contiguous(t):
    """The bug of a kernel that indexes its input as a dense array from the tensor's storage start:
    right for a contiguous tensor at offset 0, wrong for any other view of the same values."""
    strides, n = [], 1
    for size in reversed(t.shape):
        strides.insert(0, n)
        n *= size
    return torch.as_strided(t, t.shape, strides, 0)


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              mask_shift=0, gqa="interleave", acc_dtype=None, ignore_scale=False, scale_power=0.5,
              default_power=0.5, ignore_given_scale=False, contiguous_only=False):
    """q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv) -> (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)).

    Knobs (all off by default): mask_shift moves the causal diagonal right; gqa="repeat" maps query
    head h to kv head h % Hk; acc_dtype accumulates P V one key at a time in that dtype;
    ignore_scale uses scale 1; scale_power replaces every scale (given or default) by
    d ** -scale_power; default_power sets only the default (softmax_scale omitted) to
    d ** -default_power; ignore_given_scale uses d ** -0.5 whatever scale is given; contiguous_only
    reads q, k, v as dense arrays from their storage's start (strides and offsets ignored).
    """
    if contiguous_only:
        q, k, v = (_as_if_contiguous(t) for t in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    G = Hq // Hk
    if softmax_scale is None:
        softmax_scale = D ** -default_power
    if scale_power != 0.5 or ignore_given_scale:
        softmax_scale = D ** -scale_power
    scale = 1.0 if ignore_scale else float(softmax_scale)
    if G > 1:
        if gqa == "interleave":
            k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        else:
            k, v = k.repeat(1, 1, G, 1), v.repeat(1, 1, G, 1)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k).float() * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(Sq, device=q.device).unsqueeze(1) + (Sk - Sq)
    j = torch.arange(Sk, device=q.device).unsqueeze(0)
    mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if right >= 0:
        mask &= j <= i + right + (mask_shift if causal else 0)
    if left >= 0:
        mask &= j >= i - left
    live = mask.any(-1)
    s = s.masked_fill(~(mask | ~live.unsqueeze(-1)), -math.inf)
    p = torch.softmax(s, dim=-1) * live.unsqueeze(-1)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~live, -math.inf)
    if acc_dtype is None:
        out = torch.einsum("bhqk,bkhd->bqhd", p.to(q.dtype), v)
        return out, lse
    pv = p.to(acc_dtype)
    acc = torch.zeros(B, Hq, Sq, v.shape[-1], dtype=acc_dtype, device=q.device)
    vv = v.to(acc_dtype).transpose(1, 2)
    for jj in range(Sk):
        acc = acc + pv[..., jj : jj + 1] * vv[:, :, jj : jj + 1, :]  # rounded to acc_dtype each step
    return acc.transpose(1, 2).to(q.dtype), lse


def attention_varlen(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, **kw):
    """Packed (total, H, D) inputs, one :func:`attention` per sequence; lse (Hq, total_q)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, ks, vs = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        if qs.shape[0] == 0:
            outs.append(q.new_zeros(0, q.shape[1], v.shape[2]))
            lses.append(torch.zeros(q.shape[1], 0, device=q.device))
            continue
        if ks.shape[0] == 0:  # no key at all: every row is dead
            outs.append(torch.zeros(qs.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device))
            lses.append(torch.full((q.shape[1], qs.shape[0]), -math.inf, device=q.device))
            continue
        o, l_ = attention(qs[None], ks[None], vs[None], **kw)
        outs.append(o[0])
        lses.append(l_[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, **knobs):
    """flash-attn's signature; varlen when cu_seqlens are given. Returns (out, lse)."""
    kw = dict(causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap, **knobs)
    if cu_seqlens_q is not None:
        return attention_varlen(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **kw)
    return attention(q, k, v, **kw)
