"""Split-K decode attention over a contiguous or paged KV cache (flash-decoding), in Triton.

One program per (sequence, kv head, row block, split): it reads its share of that sequence's keys
and values once for every query head of the GQA group and every new query token (the rows of its
tile: ``group x seqlen_q``, in blocks of ``BLOCK_R`` when a group is large, e.g. MLA's 128 heads on
one latent head), and keeps an online softmax per row; a combine kernel merges the splits.
Paged caches are read through the page table: one table entry per key block when ``BLOCK_N``
divides the page size, else (pages smaller than a block, e.g. vLLM's 16) one entry per key, so the
tile stays ``BLOCK_N`` keys deep whatever the page size (``PAGE_GATHER``). Sliding windows start at
the window's first block, and the splits share the window's keys, not the whole cache. Scores are
kept in base 2 (``exp2``; the scale carries log2(e)); the partial results' maxima too, which the
combine converts back to the natural-log lse. A head dim that is not a power of two (absorbed
MLA's 576, DeepSeek's 192) is read as a power-of-two part plus a tail (512 + 64, 128 + 64), not
padded to the next power (1024, 256). With one split the split kernel writes the output and lse
itself (``DIRECT``), without the combine. New tokens go into the cache from the split kernel itself
with ``FUSE_APPEND`` (the default config's: read from the new tensors, written by one program each), or with
``_append_kernel`` (one launch before it: absorbed MLA's wide config). Offsets into the cache are 64-bit (a pool
above 2**31 elements is common). Masks are bottom-right aligned: with ``L`` keys (the cache and the new tokens)
query ``i`` of ``seqlen_q`` sits at position ``L - seqlen_q + i``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _slot(Table, b, pos, stride_tb, PAGE: tl.constexpr, PAGED: tl.constexpr):
    """Where key ``pos`` of sequence ``b`` lives in the cache: (page or sequence row as int64, its offset there)."""
    if PAGED:
        return tl.load(Table + b * stride_tb + pos // PAGE).to(tl.int64), pos % PAGE
    return b.to(tl.int64), pos


@triton.jit
def _append_kernel(
    K, V, KC, VC, Seqlens, Table,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_cblk, stride_cpos, stride_ch, stride_dblk, stride_dpos, stride_dh, stride_tb,
    SQ: tl.constexpr, HK: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """One program per (sequence, new token): its keys and values (every kv head) into the slot at
    cache_seqlens + token, through the page table when paged."""
    pid = tl.program_id(0)
    i = pid % SQ
    b = pid // SQ
    blk, off = _slot(Table, b, tl.load(Seqlens + b) + i, stride_tb, PAGE, PAGED)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    dv = tl.arange(0, BLOCK_DV)[None, :]
    x = tl.load(K + b * stride_kb + i * stride_ks + h * stride_kh + d, mask=(h < HK) & (d < D))
    tl.store(KC + blk * stride_cblk + off * stride_cpos + h * stride_ch + d, x, mask=(h < HK) & (d < D))
    y = tl.load(V + b * stride_vb + i * stride_vs + h * stride_vh + dv, mask=(h < HK) & (dv < DV))
    tl.store(VC + blk * stride_dblk + off * stride_dpos + h * stride_dh + dv, y, mask=(h < HK) & (dv < DV))


@triton.jit
def _block_update(q, qt, k, kt, v, n, key_ok, row_ok, pos_q, m, lsum, acc, sm_scale, softcap,
                  LEFT: tl.constexpr, RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, BLOCK_DT: tl.constexpr,
                  PRECISION: tl.constexpr):
    """One key block into the rows' online softmax (base 2): the scores of ``q`` (and its tail ``qt``) against the
    keys ``k`` (``kt``) at positions ``n``, masked, then ``v`` weighted into ``acc``. Returns m, lsum, acc."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if BLOCK_DT > 0:
        s += tl.dot(qt, tl.trans(kt), input_precision=PRECISION)
    s = s * sm_scale
    if HAS_SOFTCAP:  # softcap * tanh(s / softcap), in natural units
        s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
    s = s * LOG2E
    vis = row_ok[:, None] & key_ok[None, :]
    if RIGHT >= 0:  # causal is RIGHT = 0
        vis = vis & (n[None, :] <= pos_q[:, None] + RIGHT)
    if LEFT >= 0:
        vis = vis & (n[None, :] >= pos_q[:, None] - LEFT)
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    lsum = lsum * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, lsum, acc


@triton.jit
def _split_kernel(
    Q, K, V, Seqlens, Table, MidO, MidM, MidL, Out, Lse, KNew, VNew,
    stride_qb, stride_qs, stride_qh,
    stride_kblk, stride_kpos, stride_kh,
    stride_vblk, stride_vpos, stride_vh,
    stride_tb,
    stride_ob, stride_oh, stride_os, stride_osp,
    stride_mb, stride_mh, stride_ms,
    stride_yb, stride_ys, stride_yh,
    stride_lb, stride_lh,
    stride_knb, stride_kns, stride_knh, stride_vnb, stride_vns, stride_vnh,
    sm_scale, softcap, chunk,
    HK: tl.constexpr, RBLOCKS: tl.constexpr, G: tl.constexpr, SQ: tl.constexpr, NEW: tl.constexpr,
    PAGE: tl.constexpr, PAGED: tl.constexpr, PAGE_GATHER: tl.constexpr, DIRECT: tl.constexpr,
    LEFT: tl.constexpr, RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DT: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
    FUSE_APPEND: tl.constexpr = False, BLOCK_NEW: tl.constexpr = 16,
):
    """FUSE_APPEND (NEW tokens given as KNew / VNew): the cache's keys are read up to its length before the
    step, the new tokens from KNew / VNew in an epilogue of BLOCK_NEW keys (the new tokens' count to a power of
    two, at least 16: a tile of the key loop's depth would be held in registers there, not staged by its
    asynchronous copies), and row block 0 of the split whose range holds a new token writes it into the cache
    (no program reads the cache there this step): no append launch. Without it the append kernel has written
    them before this kernel runs."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rb = pid % RBLOCKS
    hk = (pid // RBLOCKS) % HK
    b = pid // (RBLOCKS * HK)
    cached = tl.load(Seqlens + b)
    L = cached + NEW  # keys this step: the cache and the NEW tokens appended
    lo = 0
    if LEFT >= 0:  # a sliding window: the splits share the keys some row sees (from a block start)
        lo = (tl.maximum(L - SQ - LEFT, 0) // BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, L)

    r = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    g = r // SQ
    i = r % SQ
    row_ok = r < G * SQ
    head = hk * G + g
    d = tl.arange(0, BLOCK_D)  # the head dim's power-of-two part (all of it when D is a power of two)
    dv = tl.arange(0, BLOCK_DV)
    q_row = Q + b * stride_qb + i[:, None] * stride_qs + head[:, None] * stride_qh
    q = tl.load(q_row + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
    if BLOCK_DT > 0:  # the rest of the head dim (BLOCK_DT = 0: none)
        dt = BLOCK_D + tl.arange(0, BLOCK_DT)
        qt = tl.load(q_row + dt[None, :], mask=row_ok[:, None] & (dt[None, :] < D), other=0.0)
    pos_q = L - SQ + i  # each row's position among the keys

    if BLOCK_DT == 0:  # (no tail: a placeholder the block update never reads)
        qt = q
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    cache_end = tl.minimum(end, cached) if FUSE_APPEND else end  # FUSE_APPEND: the new tokens after the loop
    for n0 in range(start, cache_end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        key_ok = n < cache_end
        if PAGE_GATHER:  # pages smaller than a block: each key's own page
            blk = tl.load(Table + b * stride_tb + n // PAGE, mask=key_ok, other=0).to(tl.int64)[:, None]
            off = n % PAGE
        elif PAGED:
            blk = tl.load(Table + b * stride_tb + n0 // PAGE).to(tl.int64)  # one page per block: BLOCK_N divides PAGE
            off = n % PAGE
        else:
            blk = b.to(tl.int64)
            off = n
        k_row = K + blk * stride_kblk + off[:, None] * stride_kpos + hk * stride_kh
        k = tl.load(k_row + d[None, :], mask=key_ok[:, None] & (d[None, :] < D), other=0.0)
        kt = k
        if BLOCK_DT > 0:
            kt = tl.load(k_row + dt[None, :], mask=key_ok[:, None] & (dt[None, :] < D), other=0.0)
        v = tl.load(V + blk * stride_vblk + off[:, None] * stride_vpos + hk * stride_vh + dv[None, :],
                    mask=key_ok[:, None] & (dv[None, :] < DV), other=0.0)
        m, lsum, acc = _block_update(q, qt, k, kt, v, n, key_ok, row_ok, pos_q, m, lsum, acc, sm_scale, softcap,
                                     LEFT, RIGHT, HAS_SOFTCAP, BLOCK_DT, PRECISION)
    if FUSE_APPEND:  # this split's share of the new tokens: blocks of BLOCK_NEW >= NEW keys (one), not pipelined
        new_lo = tl.maximum(start, cached)
        if rb == 0:  # one program per (sequence, kv head) writes them into the cache, a row at a time
            for p in range(new_lo, end):
                j = p - cached
                blk, off = _slot(Table, b, p, stride_tb, PAGE, PAGED)
                c_row = K + blk * stride_kblk + off * stride_kpos + hk * stride_kh
                n_row = KNew + b * stride_knb + j * stride_kns + hk * stride_knh
                tl.store(c_row + d, tl.load(n_row + d, mask=d < D), mask=d < D)
                if BLOCK_DT > 0:
                    tl.store(c_row + dt, tl.load(n_row + dt, mask=dt < D), mask=dt < D)
                tl.store(V + blk * stride_vblk + off * stride_vpos + hk * stride_vh + dv,
                         tl.load(VNew + b * stride_vnb + j * stride_vns + hk * stride_vnh + dv, mask=dv < DV),
                         mask=dv < DV)
        for n0 in tl.range(new_lo, end, BLOCK_NEW, num_stages=1):
            n = n0 + tl.arange(0, BLOCK_NEW)
            key_ok = n < end
            j = (n - cached)[:, None]  # the new token's index
            k_row = KNew + b * stride_knb + j * stride_kns + hk * stride_knh
            k = tl.load(k_row + d[None, :], mask=key_ok[:, None] & (d[None, :] < D), other=0.0)
            kt = k
            if BLOCK_DT > 0:
                kt = tl.load(k_row + dt[None, :], mask=key_ok[:, None] & (dt[None, :] < D), other=0.0)
            v = tl.load(VNew + b * stride_vnb + j * stride_vns + hk * stride_vnh + dv[None, :],
                        mask=key_ok[:, None] & (dv[None, :] < DV), other=0.0)
            m, lsum, acc = _block_update(q, qt, k, kt, v, n, key_ok, row_ok, pos_q, m, lsum, acc, sm_scale,
                                         softcap, LEFT, RIGHT, HAS_SOFTCAP, BLOCK_DT, PRECISION)
    if DIRECT:  # one split: this program's rows are final
        live = lsum > 0
        out = tl.where(live[:, None], acc / tl.where(live, lsum, 1.0)[:, None], 0.0)
        y = Out + b * stride_yb + i[:, None] * stride_ys + head[:, None] * stride_yh + dv[None, :]
        tl.store(y, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < DV))
        lse = tl.where(live, (m + tl.log2(tl.where(live, lsum, 1.0))) * LN2, float("-inf"))
        tl.store(Lse + b * stride_lb + head * stride_lh + i, lse, mask=row_ok)
    else:
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
    w = tl.exp2(m - m_safe)  # the splits' maxima are in base 2
    total = tl.sum(lsum * w, 0)
    dv = tl.arange(0, BLOCK_DV)
    o = tl.load(MidO + b * stride_ob + head * stride_oh + i * stride_os + sp[:, None] * stride_osp + dv[None, :],
                mask=ok[:, None] & (dv[None, :] < DV), other=0.0)
    acc = tl.sum(o * w[:, None], 0)
    live = total > 0
    out = tl.where(live, acc / tl.where(live, total, 1.0), 0.0)
    tl.store(Out + b * stride_yb + i * stride_ys + head * stride_yh + dv, out.to(Out.dtype.element_ty), mask=dv < DV)
    lse = tl.where(live, (m_safe + tl.log2(tl.where(live, total, 1.0))) * LN2, float("-inf"))
    tl.store(Lse + b * stride_lb + head * stride_lh + i, lse)
