"""Split-K decode attention over a contiguous or paged KV cache (flash-decoding), in Triton.

One program per (sequence, kv head, row block, split): it reads its share of that sequence's keys
and values once for every query head of the GQA group and every new query token (the rows of its
tile: ``group x seqlen_q``, in blocks of ``BLOCK_R`` when a group is large, e.g. MLA's 128 heads on
one latent head), and keeps an online softmax per row; a combine kernel merges the splits.
Paged caches are read through the page table one key block at a time (a block never straddles a
page: ``BLOCK_N`` divides the page size). Masks are bottom-right aligned: with ``L`` keys (the
cache and the new tokens) query ``i`` of ``seqlen_q`` sits at position ``L - seqlen_q + i``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _split_kernel(
    Q, K, V, Lens, Table, MidO, MidM, MidL,
    stride_qb, stride_qs, stride_qh,
    stride_kblk, stride_kpos, stride_kh,
    stride_vblk, stride_vpos, stride_vh,
    stride_tb,
    stride_ob, stride_oh, stride_os, stride_osp,
    stride_mb, stride_mh, stride_ms,
    sm_scale, softcap, chunk,
    HK: tl.constexpr, RBLOCKS: tl.constexpr, G: tl.constexpr, SQ: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    LEFT: tl.constexpr, RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rb = pid % RBLOCKS
    hk = (pid // RBLOCKS) % HK
    b = pid // (RBLOCKS * HK)
    L = tl.load(Lens + b)
    start = split * chunk
    end = tl.minimum(start + chunk, L)
    if LEFT >= 0:  # a sliding window: skip the key blocks no row sees (block-aligned: pages hold whole blocks)
        start = tl.maximum(start, (tl.maximum(L - SQ - LEFT, 0) // BLOCK_N) * BLOCK_N)

    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    g = r // SQ
    i = r % SQ
    row_ok = r < G * SQ
    head = hk * G + g
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * stride_qb + i[:, None] * stride_qs + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
    pos_q = L - SQ + i  # each row's position among the keys

    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        key_ok = n < end
        if PAGED:
            blk = tl.load(Table + b * stride_tb + n0 // PAGE)  # one page per block: BLOCK_N divides PAGE
            off = n % PAGE
        else:
            blk = b
            off = n
        k = tl.load(K + blk * stride_kblk + off[:, None] * stride_kpos + hk * stride_kh + d[None, :],
                    mask=key_ok[:, None] & (d[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
        if HAS_SOFTCAP:
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)  # softcap * tanh(s / softcap)
        vis = row_ok[:, None] & key_ok[None, :]
        if RIGHT >= 0:  # causal is RIGHT = 0
            vis = vis & (n[None, :] <= pos_q[:, None] + RIGHT)
        if LEFT >= 0:
            vis = vis & (n[None, :] >= pos_q[:, None] - LEFT)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        lsum = lsum * alpha + tl.sum(p, 1)
        v = tl.load(V + blk * stride_vblk + off[:, None] * stride_vpos + hk * stride_vh + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < DV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    o_ptr = MidO + b * stride_ob + head[:, None] * stride_oh + i[:, None] * stride_os + split * stride_osp
    tl.store(o_ptr + dv[None, :], acc, mask=row_ok[:, None] & (dv[None, :] < DV))
    ml = b * stride_mb + head * stride_mh + i * stride_ms + split
    tl.store(MidM + ml, m, mask=row_ok)
    tl.store(MidL + ml, lsum, mask=row_ok)


@triton.jit
def _combine_kernel(
    MidO, MidM, MidL, Out, Lse,
    stride_ob, stride_oh, stride_os, stride_osp,
    stride_mb, stride_mh, stride_ms,
    stride_yb, stride_ys, stride_yh,
    stride_lb, stride_lh,
    n_splits,
    HQ: tl.constexpr, SQ: tl.constexpr, DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    pid = tl.program_id(0)  # (b, head, i)
    i = pid % SQ
    head = (pid // SQ) % HQ
    b = pid // (SQ * HQ)
    sp = tl.arange(0, BLOCK_S)
    ok = sp < n_splits
    ml = b * stride_mb + head * stride_mh + i * stride_ms + sp
    m = tl.load(MidM + ml, mask=ok, other=float("-inf"))
    lsum = tl.load(MidL + ml, mask=ok, other=0.0)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp(m - m_safe)
    total = tl.sum(lsum * w, 0)
    dv = tl.arange(0, BLOCK_DV)
    o = tl.load(MidO + b * stride_ob + head * stride_oh + i * stride_os + sp[:, None] * stride_osp + dv[None, :],
                mask=ok[:, None] & (dv[None, :] < DV), other=0.0)
    acc = tl.sum(o * w[:, None], 0)
    live = total > 0
    out = tl.where(live, acc / tl.where(live, total, 1.0), 0.0)
    tl.store(Out + b * stride_yb + i * stride_ys + head * stride_yh + dv, out.to(Out.dtype.element_ty), mask=dv < DV)
    lse = tl.where(live, m_safe + tl.log(tl.where(live, total, 1.0)), float("-inf"))
    tl.store(Lse + b * stride_lb + head * stride_lh + i, lse)
