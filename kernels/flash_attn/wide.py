"""Wide head dims (d_qk and / or d_v above 256: absorbed MLA's 576 / 512 up to 2112 / 2048), forward
and backward, in Triton.

Why not the flash kernels' structure. They keep a whole [block, head_dim] fp32 accumulator in
registers; a Hopper SM has 256 KiB of registers, so one program can hold about 32K fp32 accumulator
elements (128 per thread at 8 warps): [64, 512] at most. Splitting d_v into slices of that width,
each program recomputing S = Q K^T for its rows, costs the Q K^T FLOPs once per slice:
(n_slices * d_qk + d_v) / (d_qk + d_v) = 1.0x at 576 / 512, 1.52x at 1088 / 1024 and 2.52x at
2112 / 2048 in the forward (1.53x / 2.55x / 4.55x with 128-row, 256-wide slices). The backward has
three wide accumulators (dQ and dK over d_qk, dV over d_v); sliced the same way, every dK and dQ
slice recomputes S and dP = dO V^T and every dV slice S: 2.4x / 3.4x / 5.4x the five matmuls'
FLOPs (the FA2 split's seven are 1.4x). Table in docs/perf/flash_attn.md, session 12.

What this does instead: at these widths one (query row, key) pair costs 2 (d_qk + d_v) = 2-8 kFLOP
of matmul but only 2-4 bytes to store its score-shaped values, so the score-shaped matrices are
materialised in a bounded workspace (row chunks of at most ``workspace_bytes``, default
``WORKSPACE_BYTES``) and every wide product becomes a plain GEMM with a [block, slice] accumulator:
no FLOP is recomputed (the FA2 backward's 7-matmul split recomputes Q K^T and dO V^T; this does 5),
and every kernel moves one byte of workspace per 512-2112 FLOPs of its matmuls, far above the H100's
~300 FLOP/B ridge: the workspace costs memory, not time.

Rows. All query heads of a kv head's group are packed into the rows of one (batch, kv head):
row r = i * group + g is query i of head hk * group + g (query-major, as the decode kernels pack
them). A tile of rows thus spans few query positions (its causal key range stays tight) and every
K / V tile it loads serves all heads of the group (MQA: all heads). With a contiguous [B, S, H, D]
tensor and one kv head, the packed rows are simply consecutive rows of memory.

Forward (per row chunk):
- ``_fwd_scores_kernel``: per row tile, loop over the visible key blocks; S = Q K^T with the head
  dim in chunks of BLOCK_K (fp32 accumulation); online softmax in base 2; writes
  P~ = exp2(S - m_j) (m_j the running row max after key block j, so P~ <= 1; fp16, fp32 for fp32
  inputs) and m_j per (row, key block); at the end lse (natural log, the public [B, Hq, Sq]) and,
  per row, the final max and 1 / l.
- ``_rows_gemm_kernel`` (RESCALE): per (row tile, d_v slice): O = sum_j (P~_j * exp2(m_j - m) / l) V_j,
  the scale applied to the [rows, keys] tile before the dot (one multiply per pair and slice).
Backward (delta = rowsum(dO * O) first, ``_bwd_delta_kernel``; then per row chunk):
- ``_bwd_ds_kernel``: per (row tile, key block): S = Q K^T and dP = dO V^T (both head dims in
  chunks), P = exp2(S - lse), dS = P (dP - delta); writes P and dS (input dtype, as the flash
  kernels round them for their dots).
- ``_rows_gemm_kernel``: dQ = scale * dS K per (row tile, d_qk slice).
- ``_keys_gemm_kernel``: dK = scale * dS^T Q and dV = P^T dO in one launch (the programs of both
  fill the GPU together), per (key block, slice, row split): the sum over every query head of the
  group happens inside the program's row loop; a split of the rows (when key blocks x slices do
  not fill the SMs) and the row chunks add into fp32 partial buffers, summed on the host in a
  fixed order: deterministic, no atomics.
Masks (causal bottom-right, windows) and softcap are applied by the two producers (scores: by
element in the masked edge loops only, as the flash kernels do; dS: per tile), which write whole
tiles with zeros where a score is hidden, past seqlen_k and past the chunk; the three GEMM kernels
then read the workspace without any mask (their tiles lie inside the producers').
Refused: varlen (packed) inputs, FP8, a transposed V (see :func:`wide_reason`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import configs
from .fwd import _capped, _keys_of_rows, _softmax_block, _visible, arch_of, precision_of

# Workspace of the score-shaped matrices per launch (P~ in the forward; P and dS in the backward),
# in bytes; the packed rows are processed in chunks that fit. 1 GiB holds the 576 / 512 forward
# of the attention-layers preset in one chunk (2 x 65536 rows x 2048 keys x 2 B = 512 MiB + maxima)
# and its backward too (P and dS: 1 GiB); the larger ones take 2-4 equal chunks (each fills the GPU).
# FLASH_ATTN_WIDE_WORKSPACE (bytes) or the ``workspace_bytes`` argument overrides it.
WORKSPACE_BYTES = 1 << 30

#: The widest head dim accepted: a sanity bound, not a kernel limit. Nothing in the kernels holds a
#: whole head dim (they loop over it in chunks, or split it across programs); the sm90 configs were
#: compiled (benchmarks/wide_ptxas.py) at 576 / 512, 1088 / 1024 and 2112 / 2048.
WIDE_MAX_HEAD_DIM = 8192

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------------------------


@triton.jit
def _query_and_head(r, group):
    """Packed row r of one (batch, kv head) -> (query i, head g within the group)."""
    i = r // group
    return i, r - i * group


@triton.jit
def _rows_of_keys(n0, seqlen_k, off, left, right, group, seg_lo, seg_hi,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Row tiles (of BLOCK_M packed rows, within [seg_lo, seg_hi), seg_lo a multiple of BLOCK_M) with
    a row that sees a key of [n0, n0 + BLOCK_N): [lo, hi). The queries that see a key block form
    one interval, so every tile in between has such a row."""
    n_last = tl.minimum(n0 + BLOCK_N, seqlen_k) - 1
    lo = seg_lo
    hi = seg_hi
    if HAS_RIGHT:  # query i sees key j only if j <= i + off + right
        lo = tl.maximum(lo, tl.maximum(n0 - off - right, 0) * group)
    if HAS_LEFT:  # ... and j >= i + off - left
        hi = tl.minimum(hi, tl.maximum(n_last - off + left + 1, 0) * group)
    lo = (lo // BLOCK_M) * BLOCK_M
    return lo, tl.maximum(hi, lo)


@triton.jit
def _dot_rows(acc, a_base, a_off, b_base, b_off, DIM: tl.constexpr, BLOCK_K: tl.constexpr,
              PRECISION: tl.constexpr):
    """acc + A[a rows, :DIM] @ B[b rows, :DIM]^T: the head dim in chunks of BLOCK_K, fp32
    accumulation; a_off / b_off are the rows' int64 offsets, the head dim is contiguous. The last
    chunk is masked when BLOCK_K does not divide DIM."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptr = a_base + a_off[:, None] + offs_k[None, :]
    b_ptr = b_base + b_off[:, None] + offs_k[None, :]
    for c in tl.range(0, (DIM // BLOCK_K) * BLOCK_K, BLOCK_K):
        a = tl.load(a_ptr + c)
        b = tl.load(b_ptr + c)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    if DIM % BLOCK_K != 0:
        c0: tl.constexpr = (DIM // BLOCK_K) * BLOCK_K
        cm = (c0 + offs_k)[None, :] < DIM
        a = tl.load(a_ptr + c0, mask=cm, other=0.0)
        b = tl.load(b_ptr + c0, mask=cm, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    return acc


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------


@triton.jit
def _scores_loop(m_i, l_i, q_base, q_off, k_base, stride_ks, ws_ptr, wm_ptr, qi, start_n, end_n,
                 seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                 MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                 HEAD_DIM: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    # flatten: the key loop and the head-dim loop inside become one pipelined loop (sm90: registers
    # 154 -> 110 at 128 x 64 and no pipeline drain per key block); only a perfect nest flattens,
    # so not with a masked tail chunk (there it left every load synchronous and spilled)
    for start in tl.range(start_n, end_n, BLOCK_N, flatten=HEAD_DIM % BLOCK_K == 0):
        keys = start + offs_n0
        if MASKED:  # clamped, not masked: every load is in bounds, the scores are masked below
            k_off = tl.minimum(keys, seqlen_k - 1).to(tl.int64) * stride_ks
        else:
            k_off = keys.to(tl.int64) * stride_ks
        s = _dot_rows(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), q_base, q_off, k_base, k_off,
                      HEAD_DIM, BLOCK_K, PRECISION)
        sc = qk_scale
        if HAS_SOFTCAP:
            s, _ = _capped(s, sm_scale, softcap)
            sc = 1.0
        if MASKED:
            p, alpha, m_new = _softmax_block(s, m_i, sc, _visible(qi, keys, seqlen_k, off, left, right,
                                                                  HAS_LEFT, HAS_RIGHT))
        else:
            p, alpha, m_new = _softmax_block(s, m_i, sc, None)
        # The whole block, zeros where the mask hides a score (keys past seqlen_k too: the workspace
        # rows are padded to BLOCK_N), so the P V kernel reads it without masks. m_j stays -inf for
        # a row that has seen nothing yet: its scale exp2(m_j - m) is then 0, never inf.
        tl.store(ws_ptr + keys[None, :], p.to(ws_ptr.dtype.element_ty))
        tl.store(wm_ptr + start // BLOCK_N, m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return m_i, l_i


@triton.jit
def _fwd_scores_kernel(Q, K, Ws, WsMax, RowMax, RowInvL, Lse,
                       stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                       stride_lb, stride_lh, stride_wb, stride_wr, stride_mb, stride_mr, stride_rb,
                       r_begin, r_end, seqlen_q, seqlen_k, num_kv_heads, group, left, right, sm_scale, softcap,
                       HEAD_DIM: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per (row tile of the chunk, batch * kv head)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_kv_heads
    hk = bh % num_kv_heads
    r0 = r_begin + pid_m * BLOCK_M
    rows = r0 + tl.arange(0, BLOCK_M)
    row_ok = rows < r_end
    rows_c = tl.minimum(rows, r_end - 1)  # rows past the chunk repeat its last: loads stay in bounds
    qi, qg = _query_and_head(rows_c, group)
    q_first = r0 // group
    q_last = (tl.minimum(r0 + BLOCK_M, r_end) - 1) // group
    off = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    h0 = (hk * group).to(tl.int64)
    q_base = Q + b64 * stride_qb + h0 * stride_qh
    q_off = qi.to(tl.int64) * stride_qs + qg.to(tl.int64) * stride_qh
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    w_rows = (rows - r_begin).to(tl.int64)  # the workspace holds BLOCK_M-multiple rows: in bounds
    ws_ptr = Ws + bh.to(tl.int64) * stride_wb + w_rows[:, None] * stride_wr
    wm_ptr = WsMax + bh.to(tl.int64) * stride_mb + w_rows * stride_mr

    qk_scale = tl.maximum(sm_scale * 1.4426950408889634, 1.1754943508222875e-38)  # see _softmax_block
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    lo, mid_lo, mid_hi, hi = _keys_of_rows(q_first, q_last, seqlen_k, off, left, right,
                                           BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if HAS_LEFT:
        m_i, l_i = _scores_loop(m_i, l_i, q_base, q_off, k_base, stride_ks, ws_ptr, wm_ptr, qi, lo, mid_lo,
                                seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                                True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HEAD_DIM, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    m_i, l_i = _scores_loop(m_i, l_i, q_base, q_off, k_base, stride_ks, ws_ptr, wm_ptr, qi, mid_lo, mid_hi,
                            seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                            False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HEAD_DIM, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    m_i, l_i = _scores_loop(m_i, l_i, q_base, q_off, k_base, stride_ks, ws_ptr, wm_ptr, qi, mid_hi, hi,
                            seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                            True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HEAD_DIM, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)

    # Rows that see no key (l = 0): lse -inf, and a zero 1/l so their output is 0.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(Lse + b64 * stride_lb + (h0 + qg.to(tl.int64)) * stride_lh + qi, lse, mask=row_ok)
    r_ptr = bh.to(tl.int64) * stride_rb + rows
    tl.store(RowMax + r_ptr, tl.where(empty, 0.0, m_i), mask=row_ok)
    tl.store(RowInvL + r_ptr, tl.where(empty, 0.0, 1.0 / l_safe), mask=row_ok)


@triton.jit
def _rows_gemm_kernel(A, AMax, RowMax, RowInvL, X, Out,
                      stride_ab, stride_ar, stride_mb, stride_mr, stride_rb,
                      stride_xb, stride_xs, stride_xh, stride_ob, stride_os, stride_oh,
                      r_begin, r_end, n_slices, seqlen_q, seqlen_k, num_kv_heads, group, left, right, out_scale,
                      WIDTH: tl.constexpr, RESCALE: tl.constexpr, SCALE_BLOCK_N: tl.constexpr,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """Out[rows, slice] = out_scale * sum over the visible key blocks of A[rows, keys] X[keys, slice]:
    the forward's P V (RESCALE: A is P~, rescaled per key block) and the backward's dQ = scale dS K.
    One program per (row tile x slice of the output width, batch * kv head); the slices of one row
    tile are adjacent programs, so its A tile comes from L2 once for all of them.
    No masks: the producer kernel (scores / dS) wrote every tile this reads, zeros where the mask
    hides a score, because this kernel's tiles lie inside the producer's (the launcher checks
    BLOCK_M and BLOCK_N against it) and its key range is within theirs."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    pid_m = pid // n_slices
    w0 = (pid % n_slices) * BLOCK_W
    b = bh // num_kv_heads
    hk = bh % num_kv_heads
    r0 = r_begin + pid_m * BLOCK_M
    rows = r0 + tl.arange(0, BLOCK_M)
    row_ok = rows < r_end
    rows_c = tl.minimum(rows, r_end - 1)
    q_first = r0 // group
    q_last = (tl.minimum(r0 + BLOCK_M, r_end) - 1) // group
    off = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    bh64 = bh.to(tl.int64)
    cols = w0 + tl.arange(0, BLOCK_W)
    cmask = cols < WIDTH
    w_rows = (rows_c - r_begin).to(tl.int64)
    a_ptr = A + bh64 * stride_ab + w_rows[:, None] * stride_ar
    wm_ptr = AMax + bh64 * stride_mb + w_rows * stride_mr
    x_ptr = X + b64 * stride_xb + hk.to(tl.int64) * stride_xh + cols[None, :]
    if RESCALE:
        m_fin = tl.load(RowMax + bh64 * stride_rb + rows_c)
        inv_l = tl.load(RowInvL + bh64 * stride_rb + rows_c)
    acc = tl.zeros([BLOCK_M, BLOCK_W], dtype=tl.float32)
    lo, _, _, hi = _keys_of_rows(q_first, q_last, seqlen_k, off, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    offs_n = tl.arange(0, BLOCK_N)
    for start in tl.range(lo, hi, BLOCK_N):
        keys = start + offs_n
        a = tl.load(a_ptr + keys[None, :])
        # keys past seqlen_k (A is 0 there) read the last key's row: in bounds, finite
        x_p = x_ptr + tl.minimum(keys, seqlen_k - 1).to(tl.int64)[:, None] * stride_xs
        if WIDTH % BLOCK_W != 0:
            x = tl.load(x_p, mask=cmask[None, :], other=0.0)
        else:
            x = tl.load(x_p)
        if RESCALE:  # P = P~ exp2(m_j - m) / l, m_j the running max the scores kernel used for block j
            m_j = tl.load(wm_ptr + start // SCALE_BLOCK_N)
            a = (a.to(tl.float32) * (tl.math.exp2(m_j - m_fin) * inv_l)[:, None]).to(x.dtype)
        acc = tl.dot(a, x, acc, input_precision=PRECISION)
    acc = acc * out_scale
    qi, qg = _query_and_head(rows_c, group)
    o_ptr = (Out + b64 * stride_ob + (hk * group + qg).to(tl.int64)[:, None] * stride_oh
             + qi.to(tl.int64)[:, None] * stride_os + cols[None, :])
    tl.store(o_ptr, acc.to(Out.dtype.element_ty), mask=row_ok[:, None] & cmask[None, :])


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


@triton.jit
def _bwd_delta_kernel(Out, DO, Delta, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                      stride_tb, num_rows, num_kv_heads, group,
                      HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """delta[bh, r] = sum over the value dims of dO * O (fp32), packed rows; the value dim in chunks."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_kv_heads
    hk = bh % num_kv_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_rows
    qi, qg = _query_and_head(tl.minimum(rows, num_rows - 1), group)
    b64 = b.to(tl.int64)
    h = (hk * group + qg).to(tl.int64)
    o_ptr = Out + b64 * stride_ob + h[:, None] * stride_oh + qi.to(tl.int64)[:, None] * stride_os
    do_ptr = DO + b64 * stride_db + h[:, None] * stride_dh + qi.to(tl.int64)[:, None] * stride_ds
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for c in tl.range(0, HEAD_DIM_V, BLOCK_K):
        cm = (c + offs_k)[None, :] < HEAD_DIM_V
        o = tl.load(o_ptr + (c + offs_k)[None, :], mask=cm, other=0.0)
        do = tl.load(do_ptr + (c + offs_k)[None, :], mask=cm, other=0.0)
        acc += tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + bh.to(tl.int64) * stride_tb + rows, acc, mask=row_ok)


@triton.jit
def _bwd_ds_kernel(Q, K, V, DO, Lse, Delta, Ws,
                   stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                   stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
                   stride_lb, stride_lh, stride_tb, stride_wp, stride_wb, stride_wr,
                   r_begin, r_end, n_key_blocks, seqlen_q, seqlen_k, num_kv_heads, group, left, right,
                   sm_scale, softcap,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   HAS_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per (row tile x key block of the chunk, batch * kv head): P and dS of the tile
    into the workspace (plane 0: dS, plane 1: P). Tiles the mask hides entirely exit at once."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    pid_m = pid // n_key_blocks
    n0 = (pid % n_key_blocks) * BLOCK_N
    b = bh // num_kv_heads
    hk = bh % num_kv_heads
    r0 = r_begin + pid_m * BLOCK_M
    q_first = r0 // group
    q_last = (tl.minimum(r0 + BLOCK_M, r_end) - 1) // group
    off = seqlen_k - seqlen_q
    lo, _, _, hi = _keys_of_rows(q_first, q_last, seqlen_k, off, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if (n0 < lo) | (n0 >= hi):
        return
    rows = r0 + tl.arange(0, BLOCK_M)
    rows_c = tl.minimum(rows, r_end - 1)
    qi, qg = _query_and_head(rows_c, group)
    keys = n0 + tl.arange(0, BLOCK_N)
    keys_c = tl.minimum(keys, seqlen_k - 1)
    b64 = b.to(tl.int64)
    hk64 = hk.to(tl.int64)
    h = (hk * group + qg).to(tl.int64)
    qi64 = qi.to(tl.int64)
    s = _dot_rows(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                  Q + b64 * stride_qb, qi64 * stride_qs + h * stride_qh,
                  K + b64 * stride_kb + hk64 * stride_kh, keys_c.to(tl.int64) * stride_ks,
                  HEAD_DIM, BLOCK_K, PRECISION)
    dp = _dot_rows(tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                   DO + b64 * stride_dob, qi64 * stride_dos + h * stride_doh,
                   V + b64 * stride_vb + hk64 * stride_vh, keys_c.to(tl.int64) * stride_vs,
                   HEAD_DIM_V, BLOCK_K, PRECISION)
    lse = tl.load(Lse + b64 * stride_lb + h * stride_lh + qi)
    delta = tl.load(Delta + bh.to(tl.int64) * stride_tb + rows_c)
    # Rows that see no key carry lse = -inf; +inf makes their P exactly 0 instead of NaN.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    if HAS_SOFTCAP:
        s, t = _capped(s, sm_scale, softcap)
        p = tl.math.exp2(s - lse2[:, None])
    else:
        p = tl.math.exp2(s * (sm_scale * 1.4426950408889634) - lse2[:, None])
    # Zeros where the mask hides a score, for keys past seqlen_k and for rows past the chunk: the
    # whole tile is stored (the workspace is padded to it), and the dQ and dK / dV kernels read
    # it without masks (the dK / dV sums run over rows: a stale row there would count).
    keep = _visible(qi, keys, seqlen_k, off, left, right, HAS_LEFT, HAS_RIGHT) & (rows < r_end)[:, None]
    p = tl.where(keep, p, 0.0)
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:  # through the cap: d(c tanh(x / c)) / dx = 1 - tanh**2
        ds = ds * (1.0 - t * t)
    w_ptr = (Ws + bh.to(tl.int64) * stride_wb + (rows - r_begin).to(tl.int64)[:, None] * stride_wr
             + keys[None, :])
    tl.store(w_ptr, ds.to(Ws.dtype.element_ty))
    tl.store(w_ptr + stride_wp, p.to(Ws.dtype.element_ty))


@triton.jit
def _keys_gemm_kernel(Ws, Q, DO, Acc,
                      stride_wp, stride_wb, stride_wr,
                      stride_qb, stride_qs, stride_qh, stride_dob, stride_dos, stride_doh,
                      stride_ap, stride_ab, stride_as, stride_ah,
                      r_begin, r_end, rows_per_split, n_split, n_slices_k, n_slices, accumulate,
                      seqlen_q, seqlen_k, num_kv_heads, group, left, right,
                      HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, HAS_LEFT: tl.constexpr,
                      HAS_RIGHT: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """dK (slices [0, n_slices_k): dS^T Q, unscaled) and dV (the rest: P^T dO) for one key block:
    one program per (key block x slice, batch * kv head * row split), summing over the packed rows
    (every query head of the group) of its split of the chunk. Writes (or, after the first chunk,
    adds to) its fp32 partial [BLOCK_N, BLOCK_W] in Acc[split, b, keys, hk, :d_qk + d_v].
    No masks: the dS kernel wrote every tile this reads (its tiles contain this kernel's; the row
    tiles that see the key block form one interval), zeros where hidden and past the chunk."""
    pid = tl.program_id(0)
    pid_z = tl.program_id(1)
    n0 = (pid // n_slices) * BLOCK_N
    sl = pid % n_slices
    split = pid_z % n_split
    bh = pid_z // n_split
    b = bh // num_kv_heads
    hk = bh % num_kv_heads
    b64 = b.to(tl.int64)
    h0 = (hk * group).to(tl.int64)
    is_k = sl < n_slices_k
    x_base = tl.where(is_k, Q + b64 * stride_qb + h0 * stride_qh, DO + b64 * stride_dob + h0 * stride_doh)
    sxs = tl.where(is_k, stride_qs, stride_dos)
    sxh = tl.where(is_k, stride_qh, stride_doh)
    width = tl.where(is_k, HEAD_DIM, HEAD_DIM_V)
    c0 = tl.where(is_k, sl, sl - n_slices_k) * BLOCK_W
    cols = c0 + tl.arange(0, BLOCK_W)
    cmask = cols[None, :] < width
    keys = n0 + tl.arange(0, BLOCK_N)
    off = seqlen_k - seqlen_q
    a_ptr = (Ws + tl.where(is_k, 0, stride_wp).to(tl.int64) + bh.to(tl.int64) * stride_wb
             - r_begin.to(tl.int64) * stride_wr + keys[None, :])
    seg_lo = r_begin + split * rows_per_split
    seg_hi = tl.minimum(seg_lo + rows_per_split, r_end)
    lo, hi = _rows_of_keys(n0, seqlen_k, off, left, right, group, seg_lo, seg_hi, BLOCK_M, BLOCK_N,
                           HAS_LEFT, HAS_RIGHT)
    acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    for start in tl.range(lo, hi, BLOCK_M):
        rows = start + offs_m
        a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * stride_wr)
        qi, qg = _query_and_head(tl.minimum(rows, r_end - 1), group)  # past the chunk: A is 0 there
        x = tl.load(x_base + qi.to(tl.int64)[:, None] * sxs + qg.to(tl.int64)[:, None] * sxh + cols[None, :],
                    mask=cmask, other=0.0)
        acc = tl.dot(tl.trans(a), x, acc, input_precision=PRECISION)
    acc_ptr = (Acc + split.to(tl.int64) * stride_ap + b64 * stride_ab + keys.to(tl.int64)[:, None] * stride_as
               + hk.to(tl.int64) * stride_ah + tl.where(is_k, 0, HEAD_DIM) + cols[None, :])
    o_mask = (keys[:, None] < seqlen_k) & cmask
    if accumulate != 0:
        acc += tl.load(acc_ptr, mask=o_mask, other=0.0)
    tl.store(acc_ptr, acc, mask=o_mask)


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

# Interpreter (CPU) tiles: configs.INTERPRET_BLOCK_M / N rows and keys, head-dim chunks and output
# slices of 64 (the GPU's chunk), so that the tests' head dims (80, 96, 288, 576 ...) take several
# chunks, a masked tail chunk and a partial last slice.
INTERPRET_BLOCK_K = 64
INTERPRET_BLOCK_W = 64


def _interpret_configs() -> dict[str, dict]:
    bm, bn = configs.INTERPRET_BLOCK_M, configs.INTERPRET_BLOCK_N
    one = {"num_warps": 4, "num_stages": 1}
    return {
        "scores": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=INTERPRET_BLOCK_K, **one),
        "pv": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=INTERPRET_BLOCK_W, **one),
        "delta": dict(BLOCK_M=bm, BLOCK_K=INTERPRET_BLOCK_K, **one),
        "ds": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=INTERPRET_BLOCK_K, **one),
        "dq": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=INTERPRET_BLOCK_W, **one),
        "dkdv": dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_W=INTERPRET_BLOCK_W, **one),
    }


def block_k(*dims: int, preferred: int = 64) -> int:
    """Head-dim chunk of the Q K^T / dO V^T loops: the largest of preferred, 32, 16 that divides every
    dim (no masked tail chunk, and the scores kernel's loop nest flattens); else ``preferred`` with
    a masked tail (head dims that are multiples of 8 but not 16)."""
    for bk in (preferred, 32, 16):
        if bk <= preferred and all(d % bk == 0 for d in dims):
            return bk
    return preferred


def slice_width(width: int, rows: int = 128) -> int:
    """Output slice of a GEMM kernel (BLOCK_W): 256 or 128 columns. A [rows, w] tile does
    rows * w / (rows + w) FLOPs per byte it loads (85 at 128 x 256, 64 at 128 x 128), and the last
    slice computes padding columns: 256 only where its useful FLOPs per byte beat 128's by 15%
    (d_v 512 / 1024 / 2048: no padding; d_qk 2112: 9 slices of 256 vs 17 of 128), not at 576
    (3 slices of 256 are 25% padding: 64 vs 58, and 128 leaves room for 2 programs per SM)."""
    def useful(w):
        return rows * w / (rows + w) * width / (triton.cdiv(width, w) * w)
    return 256 if useful(256) >= 1.15 * useful(128) else 128


def wide_configs(dtype: torch.dtype, arch: int = 90, d: int = 576, dv: int = 512) -> dict[str, dict]:
    """Tiles per kernel (BLOCK_M rows, BLOCK_N keys, BLOCK_K head-dim chunk, BLOCK_W output slice)
    and Triton's num_warps / num_stages, for head dims (d, dv).

    The sm90 (H100) picks, bf16 / fp16, from benchmarks/wide_ptxas.py (registers per thread and
    spills from ptxas -v, shared memory per program, on the attention-layers absorbed shapes; table
    in docs/perf/flash_attn.md, session 12). The L2 -> SM traffic decides first: a [M, N] output
    tile reduced in steps does M N / (M + N) FLOPs per byte loaded, 64 at 128 x 128 and 85 at
    128 x 256, and at an assumed ~7 TB/s of L2 bandwidth that caps a kernel near 450 / 600 TFLOP/s,
    so every kernel takes the widest tile that compiles without spills:
    - scores: 128 x 128 on 8 warps, 3 stages, chunks of 64: 183 registers (255 causal: the masked
      loop's copy; 0 spills), 128 KiB. 128 x 64 (110) would let 2 programs share an SM but loads
      43 FLOP/B. The key and head-dim loops are flattened into one pipelined loop (see
      _scores_loop).
    - pv (P V): 128 rows x 256 value columns, keys in steps of 64, 8 warps, 3 stages: 236
      registers (the [128, 256] fp32 accumulator is 128 of them), 0 spills, 129 KiB: a GEMM's
      classic Hopper tile. 128 keys per step: 255 registers.
    - ds: 128 x 128 like scores (167 registers, 96 KiB): the dK / dV kernel's 128-key tiles must lie
      inside its tiles (their reads are mask-free).
    - dq: 128 rows x slice_width(d) columns, keys in steps of 64: at 128 columns 122 registers and
      96 KiB, so two programs share an SM; at 256, 222 registers.
    - dkdv: 128 keys x 128 columns, rows in steps of 128, 8 warps, 3 stages: 153 registers, 192 KiB.
      256 columns spill (255 registers, 100-264 B) in every variant tried.
    - delta: a bandwidth pass (64 rows, 128-wide chunks, 4 warps, 76 registers).
    fp32 (ieee dots on the FMA units, not the tensor cores): small tiles, correctness first.
    Under the interpreter: 16-row / 16-key tiles (configs.INTERPRET_BLOCK_M / N) and 64-wide chunks
    and slices, so small test head dims take several of each.
    """
    if configs.interpreting():
        return _interpret_configs()
    if dtype == torch.float32:
        one = {"num_warps": 4, "num_stages": 2}
        bk = block_k(d, dv, preferred=32)
        return {
            "scores": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=block_k(d, preferred=32), **one),
            "pv": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_W=64, **one),
            "delta": dict(BLOCK_M=32, BLOCK_K=128, **one),
            "ds": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=bk, **one),
            "dq": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_W=64, **one),
            "dkdv": dict(BLOCK_M=32, BLOCK_N=32, BLOCK_W=64, **one),
        }
    dq_w = slice_width(d)
    return {
        "scores": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k(d), num_warps=8, num_stages=3),
        "pv": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_W=slice_width(dv), num_warps=8, num_stages=3),
        "delta": dict(BLOCK_M=64, BLOCK_K=128, num_warps=4, num_stages=1),
        "ds": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k(d, dv), num_warps=8, num_stages=3),
        "dq": dict(BLOCK_M=128, BLOCK_N=64, BLOCK_W=dq_w, num_warps=8, num_stages=3),
        "dkdv": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_W=128, num_warps=8, num_stages=3),
    }


# --------------------------------------------------------------------------------------------
# What the wide path takes
# --------------------------------------------------------------------------------------------

#: Features wide_reason knows: the supported ones, and those it refuses when set.
_SUPPORTED_FEATURES = ("causal", "window_size", "window_left", "window_right", "softcap", "allow_tf32",
                       "softmax_scale", "return_lse", "deterministic")
_REFUSED_FEATURES = {
    "varlen": "varlen (packed [T, H, D]) inputs",
    "cu_seqlens_q": "varlen (packed [T, H, D]) inputs",
    "cu_seqlens_k": "varlen (packed [T, H, D]) inputs",
    "fp8": "FP8 inputs",
    "descales": "FP8 inputs",
    "v_transposed": "a transposed V",
}


def wide_reason(d: int, d_v: int | None = None, dtype: torch.dtype = torch.bfloat16, **features) -> str | None:
    """Why the wide kernels cannot run (d, d_v, dtype) with ``features``, or None when they can.

    Features (keyword = value; a value that is None, False, 0 or (-1, -1) counts as absent):
    causal, window_size / window_left / window_right, softcap, allow_tf32, softmax_scale, return_lse,
    deterministic (always true here) are supported; varlen (or cu_seqlens_q / _k), fp8 (or
    descales) and v_transposed are refused; any other set feature is refused as unknown.
    Any head dims that are multiples of 8 up to WIDE_MAX_HEAD_DIM run, also <= 256 (the dispatch
    sends only max(d, d_v) > 256 here)."""
    d_v = d if d_v is None else d_v
    if dtype not in SUPPORTED_DTYPES:
        return f"unsupported: dtype {dtype} (the wide kernels take float16, bfloat16, float32)"
    for name, dim in (("head dim", d), ("value head dim", d_v)):
        if not isinstance(dim, int) or dim < 1 or dim > WIDE_MAX_HEAD_DIM:
            return (f"unsupported: {name} {dim} (the wide kernels take 1..{WIDE_MAX_HEAD_DIM}: the range "
                    "their tiles were compiled and tested for)")
        if dim % configs.HEAD_DIM_MULTIPLE:
            return (f"unsupported: {name} {dim} is not a multiple of {configs.HEAD_DIM_MULTIPLE} "
                    "(rows must be 16-byte aligned, as in flash-attn)")
    for name, value in features.items():
        if value is None or value is False or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                               and value == 0 and name not in ("window_left", "window_right")):
            continue
        if name in _SUPPORTED_FEATURES:
            continue
        if name in _REFUSED_FEATURES:
            return (f"unsupported: {_REFUSED_FEATURES[name]} with head dims above 256 (the wide kernels "
                    "take dense [B, S, H, D] inputs in fp16 / bf16 / fp32 only)")
        return (f"unsupported: feature {name}={value!r} is unknown to the wide kernels (they know "
                f"{', '.join(_SUPPORTED_FEATURES + tuple(dict.fromkeys(_REFUSED_FEATURES)))})")
    return None


def _check_launch(q, k, v, cu_seqlens_q, descales, v_transposed, out_dtype=None):
    feats = {"varlen": cu_seqlens_q is not None, "fp8": descales is not None, "v_transposed": bool(v_transposed)}
    reason = wide_reason(q.shape[-1], v.shape[-1], q.dtype, **feats)
    if reason is None and (q.dim() != 4 or k.dim() != 4 or v.dim() != 4):
        reason = "unsupported: the wide kernels take dense [B, S, H, D] inputs"
    if reason is None and out_dtype not in (None, q.dtype):
        reason = f"unsupported: out_dtype {out_dtype} other than the inputs' {q.dtype}"
    if reason:
        raise ValueError(reason)


def _check_tiles(consumer: dict, producer: dict, cname: str, pname: str) -> None:
    """The mask-free GEMM kernels read only tiles their producer wrote whole: each of their tiles must
    lie inside one of the producer's (rows and keys: powers of two, so the smaller divides)."""
    for dim in ("BLOCK_M", "BLOCK_N"):
        if producer[dim] % consumer[dim]:
            raise ValueError(f"wide configs: {cname} {dim}={consumer[dim]} must divide {pname}'s {producer[dim]}")


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """The kernels step through the head dim with stride 1 (any other stride is taken as given)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def workspace_limit(workspace_bytes: int | None = None) -> int:
    if workspace_bytes is not None:
        return int(workspace_bytes)
    return int(os.environ.get("FLASH_ATTN_WIDE_WORKSPACE", WORKSPACE_BYTES))


def chunk_rows(num_rows: int, bytes_per_row: int, limit: int, unit: int) -> int:
    """Packed rows per chunk: a multiple of ``unit`` (the widest row tile of the kernels sharing the
    workspace), at least one unit, with as few chunks as fit in ``limit`` bytes, and those of equal
    size (a small last chunk would run as one partly filled wave: 32 programs for 132 SMs)."""
    fit = max(unit, (max(limit // max(bytes_per_row, 1), 1) // unit) * unit)
    n_chunks = triton.cdiv(num_rows, fit)
    return triton.cdiv(triton.cdiv(num_rows, n_chunks), unit) * unit


def keys_split(tiles: int, row_tiles: int, sms: int) -> int:
    """Row splits of the dK / dV launch: 1 when its (key block x slice) programs fill the SMs in
    waves at least 90% full; else the smallest split (up to 8, at most one per row tile) whose
    waves are, or the best of those."""
    if sms <= 1 or tiles <= 0:
        return 1
    best, best_eff = 1, 0.0
    for s in range(1, min(8, max(row_tiles, 1)) + 1):
        waves = tiles * s / sms
        eff = waves / triton.cdiv(tiles * s, sms)
        if eff >= 0.9 and waves >= 1:
            return s
        if eff > best_eff + 1e-9:
            best, best_eff = s, eff
    return best


def _sms(t: torch.Tensor) -> int:
    if configs.interpreting() or t.device.type != "cuda":
        return 1
    return configs.tensor_sm_count(t)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def wide_fwd(q, k, v, *, softmax_scale, causal, window_left=-1, window_right=-1, softcap=0.0, allow_tf32=False,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, descales=None,
             out_dtype=None, v_transposed=False, max_num_imprecise_acc=0, workspace_bytes=None):
    """Forward for wide head dims: q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] ->
    out [B, Sq, Hq, Dv] (q's dtype; rows that see no key are 0), lse [B, Hq, Sq] float32 (natural
    log, -inf for rows that see no key). Same conventions as :func:`fwd.flash_attn_fwd` (inputs
    validated by the caller; causal bottom-right, window -1 unbounded); varlen, FP8 and a transposed
    V raise ValueError("unsupported: ..."). ``workspace_bytes``: cap of the score workspace (default
    :data:`WORKSPACE_BYTES`; the rows are processed in chunks that fit)."""
    _check_launch(q, k, v, cu_seqlens_q, descales, v_transposed, out_dtype)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    batch, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    dv = v.shape[-1]
    out = torch.empty((batch, sq, hq, dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((batch, hq, sq), device=q.device, dtype=torch.float32)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    if sk == 0:  # no key at all: every row is empty
        return out.zero_(), lse.fill_(float("-inf"))
    group = hq // hk
    rows = group * sq
    right = 0 if causal else window_right
    has_left, has_right = window_left >= 0, right >= 0
    cfg = wide_configs(q.dtype, arch_of(q), d, dv)
    sc, pv = cfg["scores"], cfg["pv"]
    _check_tiles(pv, sc, "pv", "scores")
    ws_dtype = torch.float32 if q.dtype == torch.float32 else torch.float16
    elt = torch.finfo(ws_dtype).bits // 8
    n_blocks = triton.cdiv(sk, sc["BLOCK_N"])
    sk_pad = n_blocks * sc["BLOCK_N"]  # whole key blocks: the scores kernel writes them whole
    unit = max(sc["BLOCK_M"], pv["BLOCK_M"])
    rc = chunk_rows(rows, batch * hk * (sk_pad * elt + n_blocks * 4), workspace_limit(workspace_bytes), unit)
    bhk = batch * hk
    ws = torch.empty((bhk, rc, sk_pad), device=q.device, dtype=ws_dtype)
    ws_max = torch.empty((bhk, rc, n_blocks), device=q.device, dtype=torch.float32)
    row_max = torch.empty((bhk, rows), device=q.device, dtype=torch.float32)
    row_inv_l = torch.empty((bhk, rows), device=q.device, dtype=torch.float32)
    common = dict(seqlen_q=sq, seqlen_k=sk, num_kv_heads=hk, group=group, left=max(window_left, 0),
                  right=max(right, 0), HAS_LEFT=has_left, HAS_RIGHT=has_right,
                  PRECISION=precision_of(q.dtype, allow_tf32))
    n_slices = triton.cdiv(dv, pv["BLOCK_W"])
    for r_begin in range(0, rows, rc):
        r_end = min(rows, r_begin + rc)
        _fwd_scores_kernel[(triton.cdiv(r_end - r_begin, sc["BLOCK_M"]), bhk)](
            q, k, ws, ws_max, row_max, row_inv_l, lse,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            lse.stride(0), lse.stride(1), ws.stride(0), ws.stride(1), ws_max.stride(0), ws_max.stride(1),
            row_max.stride(0), r_begin, r_end, sm_scale=float(softmax_scale), softcap=float(softcap or 0.0),
            HEAD_DIM=d, HAS_SOFTCAP=bool(softcap), **common, **sc)
        _rows_gemm_kernel[(triton.cdiv(r_end - r_begin, pv["BLOCK_M"]) * n_slices, bhk)](
            ws, ws_max, row_max, row_inv_l, v, out,
            ws.stride(0), ws.stride(1), ws_max.stride(0), ws_max.stride(1), row_max.stride(0),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            r_begin, r_end, n_slices, out_scale=1.0, WIDTH=dv, RESCALE=True, SCALE_BLOCK_N=sc["BLOCK_N"],
            **common, **pv)
    return out, lse


def wide_bwd(do, q, k, v, out, lse, *, softmax_scale, causal, window_left=-1, window_right=-1, softcap=0.0,
             allow_tf32=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
             split=None, workspace_bytes=None):
    """Backward for wide head dims: returns dq, dk, dv shaped like q, k, v (their dtype), from the
    forward's out and lse [B, Hq, Sq]. Same conventions as :func:`bwd.flash_attn_bwd`.
    Deterministic. ``split``: row splits of the dK / dV launch (default :func:`keys_split`);
    ``workspace_bytes`` as in :func:`wide_fwd` (P and dS, two score-shaped planes)."""
    _check_launch(q, k, v, cu_seqlens_q, None, False)
    do, q, k, v, out = (_last_dim_contiguous(t) for t in (do, q, k, v, out))
    batch, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    dv_dim = v.shape[-1]
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0 or v.numel() == 0 or do.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    group = hq // hk
    rows = group * sq
    bhk = batch * hk
    right = 0 if causal else window_right
    has_left, has_right = window_left >= 0, right >= 0
    cfg = wide_configs(q.dtype, arch_of(q), d, dv_dim)
    de, ds_cfg, dq_cfg, kv_cfg = cfg["delta"], cfg["ds"], cfg["dq"], cfg["dkdv"]
    common = dict(seqlen_q=sq, seqlen_k=sk, num_kv_heads=hk, group=group, left=max(window_left, 0),
                  right=max(right, 0), HAS_LEFT=has_left, HAS_RIGHT=has_right,
                  PRECISION=precision_of(q.dtype, allow_tf32))

    delta = torch.empty((bhk, rows), device=q.device, dtype=torch.float32)
    _bwd_delta_kernel[(triton.cdiv(rows, de["BLOCK_M"]), bhk)](
        out, do, delta, out.stride(0), out.stride(1), out.stride(2), do.stride(0), do.stride(1), do.stride(2),
        delta.stride(0), rows, hk, group, HEAD_DIM_V=dv_dim, **de)

    _check_tiles(dq_cfg, ds_cfg, "dq", "ds")
    _check_tiles(kv_cfg, ds_cfg, "dkdv", "ds")
    elt = q.element_size()
    sk_pad = triton.cdiv(sk, ds_cfg["BLOCK_N"]) * ds_cfg["BLOCK_N"]  # whole key blocks, written whole
    unit = max(ds_cfg["BLOCK_M"], dq_cfg["BLOCK_M"], kv_cfg["BLOCK_M"])
    rc = chunk_rows(rows, 2 * bhk * sk_pad * elt, workspace_limit(workspace_bytes), unit)
    ws = torch.empty((2, bhk, rc, sk_pad), device=q.device, dtype=q.dtype)  # plane 0: dS, plane 1: P
    n_key_blocks = triton.cdiv(sk, ds_cfg["BLOCK_N"])
    n_slices_q = triton.cdiv(d, dq_cfg["BLOCK_W"])
    bw = kv_cfg["BLOCK_W"]
    n_slices_k, n_slices_kv = triton.cdiv(d, bw), triton.cdiv(d, bw) + triton.cdiv(dv_dim, bw)
    kv_tiles = triton.cdiv(sk, kv_cfg["BLOCK_N"]) * n_slices_kv * bhk
    if split is None:
        split = keys_split(kv_tiles, triton.cdiv(min(rc, rows), kv_cfg["BLOCK_M"]), _sms(q))
    split = max(1, int(split))
    acc = torch.empty((split, batch, sk, hk, d + dv_dim), device=q.device, dtype=torch.float32)
    for r_begin in range(0, rows, rc):
        r_end = min(rows, r_begin + rc)
        n_rows = r_end - r_begin
        _bwd_ds_kernel[(triton.cdiv(n_rows, ds_cfg["BLOCK_M"]) * n_key_blocks, bhk)](
            q, k, v, do, lse, delta, ws,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            lse.stride(0), lse.stride(1), delta.stride(0), ws.stride(0), ws.stride(1), ws.stride(2),
            r_begin, r_end, n_key_blocks, sm_scale=float(softmax_scale), softcap=float(softcap or 0.0),
            HEAD_DIM=d, HEAD_DIM_V=dv_dim, HAS_SOFTCAP=bool(softcap), **common, **ds_cfg)
        _rows_gemm_kernel[(triton.cdiv(n_rows, dq_cfg["BLOCK_M"]) * n_slices_q, bhk)](
            ws, ws, delta, delta, k, dq,  # (AMax / RowMax / RowInvL unused without RESCALE)
            ws.stride(1), ws.stride(2), 0, 0, 0,
            k.stride(0), k.stride(1), k.stride(2), dq.stride(0), dq.stride(1), dq.stride(2),
            r_begin, r_end, n_slices_q, out_scale=float(softmax_scale), WIDTH=d, RESCALE=False, SCALE_BLOCK_N=1,
            **common, **dq_cfg)
        rows_per_split = triton.cdiv(triton.cdiv(n_rows, split), kv_cfg["BLOCK_M"]) * kv_cfg["BLOCK_M"]
        _keys_gemm_kernel[(triton.cdiv(sk, kv_cfg["BLOCK_N"]) * n_slices_kv, bhk * split)](
            ws, q, do, acc, ws.stride(0), ws.stride(1), ws.stride(2),
            q.stride(0), q.stride(1), q.stride(2), do.stride(0), do.stride(1), do.stride(2),
            acc.stride(0), acc.stride(1), acc.stride(2), acc.stride(3),
            r_begin, r_end, rows_per_split, split, n_slices_k, n_slices_kv, int(r_begin > 0),
            HEAD_DIM=d, HEAD_DIM_V=dv_dim, **common, **kv_cfg)
    # fixed-order sums of the splits' fp32 partials: deterministic
    dk_sum = acc[..., :d].sum(0) if split > 1 else acc[0, ..., :d]
    dv_sum = acc[..., d:].sum(0) if split > 1 else acc[0, ..., d:]
    dk.copy_(dk_sum * softmax_scale)
    dv.copy_(dv_sum)
    return dq, dk, dv
