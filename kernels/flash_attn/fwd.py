"""Forward flash-attention kernel (Triton) and its launcher.

One program per (query block, batch * query head), or per two query blocks (TILES = 2: under a
causal mask the heaviest with the lightest, see configs.fwd_keep). It streams the key/value blocks
that the mask lets the query block see, keeping the running max `m` and sum `l` of the online softmax in
base 2 (the scale is folded with log2(e) so each score costs one multiply-add before exp2).

The key range splits into at most three loops: masked blocks left of the window, blocks that every
query row of the tile sees in full (no mask, no bounds check), and masked blocks on the right
(the causal diagonal, the window's right edge, the last partial key block). Only the masked loops
pay for the index arithmetic. Where BLOCK_M < BLOCK_N (the FP8 64 x 128 tile) the right-hand masked loop
steps BLOCK_M keys at a time (configs.fwd_narrow_diagonal). The FP8 forward reads V transposed, its keys in
the order P's MMA registers hold them (v_layout's MMA order, _keys_in_mma_order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .. import launcher
from . import configs

LOG2E = 1.4426950408889634


@triton.jit
def _sequence(CuSeqQ, CuSeqK, b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """Where sequence ``b`` starts in the rows and how long it is: (q_start, k_start, seqlen_q,
    seqlen_k). Packed varlen batches read them from the cumulative lengths; dense batches start
    at row 0 with the launch's lengths. Shared by the forward and both backward kernels."""
    if IS_VARLEN:
        q_start = tl.load(CuSeqQ + b)
        k_start = tl.load(CuSeqK + b)
        seqlen_q = tl.load(CuSeqQ + b + 1) - q_start
        seqlen_k = tl.load(CuSeqK + b + 1) - k_start
    else:
        q_start = tl.full([], 0, tl.int32)
        k_start = tl.full([], 0, tl.int32)
    return q_start, k_start, seqlen_q, seqlen_k


@triton.jit
def _head_rows(X, b64, h, row0, stride_b, stride_h, stride_s):
    """``X`` at head ``h``, row ``row0`` of sequence ``b64``; 64-bit offsets (tensors over 2**31
    elements). Shared by the forward and both backward kernels."""
    return X + b64 * stride_b + h.to(tl.int64) * stride_h + row0.to(tl.int64) * stride_s


@triton.jit
def _key_range(m0, seqlen_q, seqlen_k, off, left, right,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key blocks seen by query rows [m0, m0 + BLOCK_M): [lo, hi), and the unmasked part [mid_lo, mid_hi).

    Query i sees key j iff i + off - left <= j <= i + off + right (flash-attn's bottom-right window).
    """
    return _keys_of_rows(m0, tl.minimum(m0 + BLOCK_M, seqlen_q) - 1, seqlen_k, off, left, right,
                         BLOCK_N, HAS_LEFT, HAS_RIGHT)


@triton.jit
def _keys_of_rows(q_first, q_last, seqlen_k, off, left, right,
                  BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key blocks seen by rows whose queries span [q_first, q_last]: [lo, hi), and the part
    [mid_lo, mid_hi) every one of them sees in full (no mask, no bounds check). Shared with the wide
    kernels (wide.py), whose row tiles pack several heads' queries."""
    lo = 0
    hi = seqlen_k
    full_lo = 0
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = (tl.maximum(q_first + off - left, 0) // BLOCK_N) * BLOCK_N
        full_lo = ((tl.maximum(q_last + off - left, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(hi, tl.maximum(q_last + off + right + 1, 0))
        full_hi = tl.minimum(full_hi, (tl.maximum(q_first + off + right + 1, 0) // BLOCK_N) * BLOCK_N)
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    mid_hi = tl.maximum(tl.minimum(full_hi, hi), mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _visible(qi, keys, seqlen_k, off, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[rows, keys] bool: query qi sees key j (bottom-right aligned window; keys past seqlen_k never).
    Shared with the wide kernels (wide.py)."""
    keep = keys[None, :] < seqlen_k
    if HAS_RIGHT:
        keep = keep & (keys[None, :] <= qi[:, None] + off + right)
    if HAS_LEFT:
        keep = keep & (keys[None, :] >= qi[:, None] + off - left)
    return keep


@triton.jit
def _softmax_block(s, m_i, sc, keep):
    """One key block of the online softmax in base 2: scores ``s`` (to be scaled by ``sc``), the rows'
    running max ``m_i``, ``keep`` the block's visibility mask (None: every row sees every key of the
    block). Returns (p, alpha, m_new): the block's unnormalised probabilities, the factor that
    rescales what came before, the new running max. Shared with the wide kernels (wide.py)."""
    if keep is not None:
        # The scale after the select, so that it and the max's subtraction are one FMA per score, as in
        # the unmasked branch (868 -> 806 SASS instructions per FP8 block). It needs sc > 0: -inf x 0 is
        # NaN, so the kernels raise a zero scale (a zero FP8 descale) to the smallest normal float first.
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * sc)
        # A row with nothing visible yet keeps m = -inf; subtract 0 there so exp2 gives 0, not NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s * sc - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * sc)
        p = tl.math.exp2(s * sc - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, m_new


@triton.jit
def _make_desc(base, nrows, stride, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
               USE_TMA: tl.constexpr):
    """A TMA descriptor over one (batch, head)'s [nrows, HEAD_DIM] rows when USE_TMA, else the pointer.
    The descriptor's bounds are this sequence's: TMA zero-fills rows past nrows and columns past
    HEAD_DIM on loads and drops them on stores, so no mask is computed."""
    if USE_TMA:
        out = tl.make_tensor_descriptor(base, shape=[nrows, HEAD_DIM], strides=[stride, 1],
                                        block_shape=[BLOCK_R, BLOCK_D])
    else:
        out = base
    return out


@triton.jit
def _make_desc_t(base, ncols, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NROWS: tl.constexpr,
                 USE_TMA: tl.constexpr):
    """A TMA descriptor over a [NROWS, ncols] row-major matrix (a transposed V) when USE_TMA, else the pointer."""
    if USE_TMA:
        out = tl.make_tensor_descriptor(base, shape=[NROWS, ncols], strides=[stride, 1], block_shape=[BLOCK_R, BLOCK_C])
    else:
        out = base
    return out


@triton.jit
def _load_rows(base, desc, row0, nrows, stride, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
               HEAD_DIM: tl.constexpr, MASK_ROWS: tl.constexpr, USE_TMA: tl.constexpr, COL0: tl.constexpr = 0):
    """Rows [row0, row0 + BLOCK_R) x columns [COL0, COL0 + BLOCK_D) of one (batch, head); zeros outside
    the tensor. COL0 > 0 reads the second part of a split head dim (``desc``: that part's descriptor);
    a first part that ends before HEAD_DIM has no column outside the tensor and no column mask."""
    if USE_TMA:
        x = desc.load([row0, COL0])
    else:
        offs_r = row0 + tl.arange(0, BLOCK_R)
        offs_d = COL0 + tl.arange(0, BLOCK_D)
        ptrs = base + offs_r[:, None] * stride + offs_d[None, :]
        if MASK_ROWS:
            if COL0 + BLOCK_D < HEAD_DIM:
                x = tl.load(ptrs, mask=offs_r[:, None] < nrows, other=0.0)
            else:
                x = tl.load(ptrs, mask=(offs_r[:, None] < nrows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        elif COL0 + BLOCK_D > HEAD_DIM:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _capped(s, sm_scale, softcap):
    """Softcapped scores in base-2 units, ``softcap * tanh(s * sm_scale / softcap) * log2(e)``, and
    the tanh (its derivative 1 - tanh**2 enters the backward). tanh as 2 / (1 + exp(-2x)) - 1: no
    NaN at either end."""
    t = 2.0 / (1.0 + tl.math.exp2(s * (-2.0 * 1.4426950408889634 * sm_scale / softcap))) - 1.0
    return t * (softcap * 1.4426950408889634), t


@triton.jit
def _load_cols(base, desc, col0, ncols, stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NROWS: tl.constexpr,
               MASK_COLS: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [0, BLOCK_R) x columns [col0, col0 + BLOCK_C) of a [NROWS, ncols] row-major matrix (a
    transposed V: rows are value dims, columns keys); zeros outside."""
    if USE_TMA:
        x = desc.load([0, col0])
    else:
        offs_r = tl.arange(0, BLOCK_R)
        offs_c = col0 + tl.arange(0, BLOCK_C)
        ptrs = base + offs_r[:, None] * stride + offs_c[None, :]
        if MASK_COLS:
            x = tl.load(ptrs, mask=(offs_r[:, None] < NROWS) & (offs_c[None, :] < ncols), other=0.0)
        else:
            x = tl.load(ptrs, mask=offs_r[:, None] < NROWS, other=0.0)
    return x


@triton.jit
def _round_to_e4m3(p):
    """Non-negative fp32 values rounded to the nearest e4m3 value (ties to even; subnormals below
    2**-6 on their 2**-9 grid), still in fp32: their cast to e4m3 is then exact. Used under the
    Triton interpreter only, whose fp32 -> e4m3 cast loses the carry into the exponent (0.496 ->
    0.25); the GPU's conversion rounds correctly by itself."""
    bits = p.to(tl.int32, bitcast=True)
    normal = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # 3 mantissa bits kept
    sub = tl.floor(p * 512.0 + 0.5) / 512.0
    return tl.where(p >= 0.015625, normal.to(tl.float32, bitcast=True), sub)


@triton.jit
def _round_to_e4m3_signed(x):
    """``_round_to_e4m3`` for values of either sign within e4m3's range (the FP8 output, under the
    interpreter)."""
    r = _round_to_e4m3(tl.minimum(tl.abs(x), 448.0))
    return tl.where(x < 0, -r, r)


@triton.jit
def _round_to_e5m2_signed(x):
    """fp32 values rounded to the nearest e5m2 value (2 mantissa bits, ties to even; subnormals below
    2**-14 on their 2**-16 grid), saturated at its largest finite value 57344 as the GPU's
    ``cvt.rn.satfinite`` does, still in fp32. Interpreter only (see _round_to_e4m3: its fp32 -> e5m2
    cast loses the carry too, 7.5 -> 4)."""
    a = tl.minimum(tl.abs(x), 57344.0)
    bits = a.to(tl.int32, bitcast=True)
    normal = (bits + 0xFFFFF + ((bits >> 21) & 1)) & -2097152  # 2 mantissa bits kept
    r = tl.where(a >= 6.103515625e-05, normal.to(tl.float32, bitcast=True), tl.floor(a * 65536.0 + 0.5) / 65536.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def _exact_fp8(x, dtype: tl.constexpr):
    """``x`` (fp32) rounded as the GPU's saturating cast to the FP8 ``dtype`` rounds it, still in fp32
    (under the interpreter, whose own cast drops carries; see _round_to_e4m3)."""
    if dtype == tl.float8e5:
        out = _round_to_e5m2_signed(x)
    else:
        out = _round_to_e4m3_signed(x)
    return out


@triton.jit
def _copy_len(n, MMA_ORDER: tl.constexpr):
    """How many positions of a sequence-contiguous copy (v_layout) a kernel reads for a sequence of ``n``:
    ``n``, or in the MMA order ``n`` rounded up to a whole group of 16 (a real position of the last group may
    sit in its padding, which the copy fills with zeros)."""
    if MMA_ORDER:
        n = tl.cdiv(n, 16) * 16
    return n


@triton.jit
def _keys_in_mma_order(p):
    """P's key columns in the MMA order of each group of 16 (v_layout.mma_order_position): key 8b + 2c + r to
    column 4c + 2b + r. On Hopper these are the columns a thread already holds, in the order the FP8
    MMA's A operand reads them: the relabelling compiles to nothing, where P in key order took 16
    shuffles and 16 byte permutes per 64 x 128 block (sm_90a SASS). V's keys come in the same order."""
    rows: tl.constexpr = p.shape[0]
    keys: tl.constexpr = p.shape[1]
    tl.static_assert(keys % 16 == 0, "the MMA order permutes groups of 16 keys")
    p = tl.reshape(p, [rows, keys // 16, 2, 4, 2])
    p = tl.permute(p, [0, 1, 3, 2, 4])
    return tl.reshape(p, [rows, keys])


@triton.jit
def _fwd_inner(acc, m_i, l_i, q, q_b, k_base, v_base, k_desc, k_desc_b, v_desc, stride_kn, stride_vn,
               start_n, end_n, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               PRECISION: tl.constexpr, USE_TMA: tl.constexpr, EXACT_P_CAST: tl.constexpr = False,
               V_T: tl.constexpr = False, QK_IMPRECISE: tl.constexpr = 0, PV_IMPRECISE: tl.constexpr = 0,
               BLOCK_DB: tl.constexpr = 0, NO_LICM: tl.constexpr = True, V_MMA_ORDER: tl.constexpr = False):
    """BLOCK_DB > 0: the head dim is split (see configs.block_db): q and the K tiles hold columns
    [0, BLOCK_D), q_b and the K_b tiles [BLOCK_D, BLOCK_D + BLOCK_DB), and S is the sum of two dots."""
    offs_n0 = tl.arange(0, BLOCK_N)
    # NO_LICM: masked loops keep their index arithmetic inside; hoisted out of the loop (Triton's
    # default), the mask's per-element indices stay live across the whole kernel
    # (configs.fwd_masked_no_licm says where that costs occupancy).
    for start in tl.range(start_n, end_n, BLOCK_N, disable_licm=MASKED and NO_LICM):
        offs_n = start + offs_n0
        k = _load_rows(k_base, k_desc, start, seqlen_k, stride_kn, BLOCK_N, BLOCK_D, HEAD_DIM, MASKED, USE_TMA)
        if BLOCK_DB:
            k_b = _load_rows(k_base, k_desc_b, start, seqlen_k, stride_kn, BLOCK_N, BLOCK_DB, HEAD_DIM, MASKED,
                             USE_TMA, BLOCK_D)
        if V_T:  # V stored transposed, [Dv, Sk] per (batch, head): the P V dot's B operand is K-major
            v = tl.trans(_load_cols(v_base, v_desc, start, _copy_len(seqlen_k, V_MMA_ORDER), stride_vn, BLOCK_DV,
                                    BLOCK_N, HEAD_DIM_V, MASKED, USE_TMA))
        else:
            v = _load_rows(v_base, v_desc, start, seqlen_k, stride_vn, BLOCK_N, BLOCK_DV, HEAD_DIM_V, MASKED, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION, max_num_imprecise_acc=QK_IMPRECISE)
        if BLOCK_DB:
            s = tl.dot(q_b, tl.trans(k_b), s, input_precision=PRECISION, max_num_imprecise_acc=QK_IMPRECISE)
        sc = qk_scale
        if HAS_SOFTCAP:
            s, _ = _capped(s, sm_scale, softcap)
            sc = 1.0
        if MASKED:
            p, alpha, m_new = _softmax_block(s, m_i, sc, _visible(offs_m, offs_n, seqlen_k, off, left, right,
                                                                  HAS_LEFT, HAS_RIGHT))
        else:
            p, alpha, m_new = _softmax_block(s, m_i, sc, None)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if EXACT_P_CAST:  # FP8 under the interpreter (see _round_to_e4m3)
            p = _round_to_e4m3(p)
        p = p.to(v.dtype)
        if V_MMA_ORDER:  # V^T's keys in the MMA order: P's follow (see _keys_in_mma_order)
            p = _keys_in_mma_order(p)
        acc = tl.dot(p, v, acc, input_precision=PRECISION,  # FP8 inputs: P quantised to e4m3
                     max_num_imprecise_acc=PV_IMPRECISE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _wait_ready(flag, need, ASM: tl.constexpr):
    """Spin until ``flag`` (int32) reaches ``need``, with acquire semantics (v_layout's signalling copy releases it
    per tile), then order what this program's tensor-memory (TMA) loads read after it (fence.proxy.async: the copy
    wrote with ordinary stores). ASM: the PTX fence (off under the interpreter)."""
    seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    while seen < need:
        seen = tl.atomic_add(flag, 0, sem="acquire", scope="gpu")
    if ASM:
        tl.inline_asm_elementwise("fence.proxy.async.global; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fwd_kernel(Q, K, V, Out, Lse, CuSeqQ, CuSeqK, QDescale, KDescale, VDescale, VReady, v_tiles, stride_dsb,
                stride_qb, stride_qs, stride_qh,
                stride_kb, stride_ks, stride_kh,
                stride_vb, stride_vs, stride_vh,
                stride_ob, stride_os, stride_oh,
                stride_lb, stride_lh,
                seqlen_q, seqlen_k, num_heads, group, left, right, sm_scale, softcap,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr,
                SEQ_BUCKET, FILL_BUCKET, ARCH,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
                IS_FP8: tl.constexpr = False, EXACT_P_CAST: tl.constexpr = False, V_T: tl.constexpr = False,
                QK_IMPRECISE: tl.constexpr = 0, PV_IMPRECISE: tl.constexpr = 0, BLOCK_DB: tl.constexpr = 0,
                TILES: tl.constexpr = 1, NO_LICM: tl.constexpr = True, V_MMA_ORDER: tl.constexpr = False,
                NARROW_DIAGONAL: tl.constexpr = True, V_WAIT: tl.constexpr = 0):
    # BLOCK_DB > 0: q / k's head dim split in two power-of-two parts (configs.block_db: 192 = 128 + 64)
    # instead of padded to BLOCK_D; the first part is BLOCK_D // 2 wide, every column of it real.
    BLOCK_DA: tl.constexpr = BLOCK_D // 2 if BLOCK_DB else BLOCK_D
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // group
    if IS_FP8:  # e4m3 q, k, v (flash-attn 3's convention): real value = fp8 value x its (batch, kv head) descale
        ds_off = b.to(tl.int64) * stride_dsb + hk
        sm_scale = sm_scale * tl.load(QDescale + ds_off) * tl.load(KDescale + ds_off)
    else:
        ds_off = 0
    q_start, k_start, seqlen_q, seqlen_k = _sequence(CuSeqQ, CuSeqK, b, seqlen_q, seqlen_k, IS_VARLEN)
    n_m = tl.cdiv(seqlen_q, BLOCK_M)
    if pid_m >= tl.cdiv(n_m, TILES):
        return
    off = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    q_base = _head_rows(Q, b64, h, q_start, stride_qb, stride_qh, stride_qs)
    k_base = _head_rows(K, b64, hk, k_start, stride_kb, stride_kh, stride_ks)
    if V_T:  # [B, Hk, Dv, Sk]: stride_vs steps between value dims, keys are contiguous (dense only)
        v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    else:
        v_base = _head_rows(V, b64, hk, k_start, stride_vb, stride_vh, stride_vs)
    o_base = _head_rows(Out, b64, h, q_start, stride_ob, stride_oh, stride_os)
    l_base = Lse + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
    q_desc = _make_desc(q_base, seqlen_q, stride_qs, BLOCK_M, BLOCK_DA, HEAD_DIM, USE_TMA)
    k_desc = _make_desc(k_base, seqlen_k, stride_ks, BLOCK_N, BLOCK_DA, HEAD_DIM, USE_TMA)
    if V_T:
        v_cols = _copy_len(seqlen_k, V_MMA_ORDER)
        v_desc = _make_desc_t(v_base, v_cols, stride_vs, BLOCK_DV, BLOCK_N, HEAD_DIM_V, USE_TMA)
    else:
        v_desc = _make_desc(v_base, seqlen_k, stride_vs, BLOCK_N, BLOCK_DV, HEAD_DIM_V, USE_TMA)
    if BLOCK_DB:  # the second part: its own descriptors (block width BLOCK_DB), read at column BLOCK_DA
        q_desc_b = _make_desc(q_base, seqlen_q, stride_qs, BLOCK_M, BLOCK_DB, HEAD_DIM, USE_TMA)
        k_desc_b = _make_desc(k_base, seqlen_k, stride_ks, BLOCK_N, BLOCK_DB, HEAD_DIM, USE_TMA)
    else:
        q_desc_b = q_desc
        k_desc_b = k_desc
    # The right-hand masked keys (the causal diagonal) in BLOCK_M-wide blocks where BLOCK_M < BLOCK_N: a query
    # block then skips the part of a BLOCK_N block past its diagonal (see _fwd_tile).
    NARROW: tl.constexpr = NARROW_DIAGONAL and HAS_RIGHT and BLOCK_M < BLOCK_N and BLOCK_DB == 0
    if NARROW:
        k_desc_n = _make_desc(k_base, seqlen_k, stride_ks, BLOCK_M, BLOCK_DA, HEAD_DIM, USE_TMA)
        if V_T:
            v_desc_n = _make_desc_t(v_base, v_cols, stride_vs, BLOCK_DV, BLOCK_M, HEAD_DIM_V, USE_TMA)
        else:
            v_desc_n = _make_desc(v_base, seqlen_k, stride_vs, BLOCK_M, BLOCK_DV, HEAD_DIM_V, USE_TMA)
    else:
        k_desc_n = k_desc
        v_desc_n = v_desc
    o_desc = _make_desc(o_base, seqlen_q, stride_os, BLOCK_M, BLOCK_DV, HEAD_DIM_V, USE_TMA)
    if V_WAIT == 3:  # V written by the kernel launched before this one, which let it start early (v_after_copy)
        gdc_wait()
    elif V_WAIT:  # V still being copied by the kernel before this one (v_ready): this head's copy first
        _wait_ready(VReady + b64 * (num_heads // group) + hk, v_tiles, V_WAIT == 1)
    # at least the smallest normal float: _softmax_block's masked branch multiplies -inf by it
    qk_scale = tl.maximum(sm_scale * 1.4426950408889634, 1.1754943508222875e-38)
    if TILES == 1:
        # Heaviest query blocks first under a causal mask (they see the most keys): less tail at the end.
        tile = n_m - 1 - pid_m if HAS_RIGHT else pid_m
        _fwd_tile(tile * BLOCK_M, q_base, k_base, v_base, o_base, l_base, q_desc, q_desc_b, k_desc, k_desc_b, v_desc,
                  k_desc_n, v_desc_n, o_desc, VDescale, ds_off, Out, stride_qs, stride_ks, stride_vs, stride_os,
                  seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap, HEAD_DIM, BLOCK_DA, HEAD_DIM_V,
                  BLOCK_DV, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, PRECISION, BLOCK_M, BLOCK_N, USE_TMA, IS_FP8,
                  EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE, BLOCK_DB, NO_LICM, V_MMA_ORDER, NARROW)
    else:
        # Two query blocks per program. Under a causal mask the heaviest with the lightest (n_m - 1 - p
        # then p): every program sees about n_m key blocks, so no long program is left for the tail and
        # the per-program set-up (descriptors) is paid once for two blocks; otherwise 2p and 2p + 1.
        if HAS_RIGHT:
            n_tiles = tl.where(n_m - 1 - pid_m == pid_m, 1, 2)
        else:
            n_tiles = tl.minimum(n_m - 2 * pid_m, 2)
        for t in range(0, n_tiles):
            if HAS_RIGHT:
                tile = tl.where(t == 0, n_m - 1 - pid_m, pid_m)
            else:
                tile = 2 * pid_m + t
            _fwd_tile(tile * BLOCK_M, q_base, k_base, v_base, o_base, l_base, q_desc, q_desc_b, k_desc, k_desc_b,
                      v_desc, k_desc_n, v_desc_n, o_desc, VDescale, ds_off, Out, stride_qs, stride_ks, stride_vs,
                      stride_os, seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap, HEAD_DIM,
                      BLOCK_DA, HEAD_DIM_V, BLOCK_DV, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, PRECISION, BLOCK_M, BLOCK_N,
                      USE_TMA, IS_FP8, EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE, BLOCK_DB, NO_LICM, V_MMA_ORDER,
                      NARROW)


@triton.jit
def _fwd_tile(m0, q_base, k_base, v_base, o_base, l_base, q_desc, q_desc_b, k_desc, k_desc_b, v_desc, k_desc_n,
              v_desc_n, o_desc,
              VDescale, ds_off, Out, stride_qs, stride_ks, stride_vs, stride_os, seqlen_q, seqlen_k, off, left, right,
              qk_scale, sm_scale, softcap, HEAD_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, HEAD_DIM_V: tl.constexpr,
              BLOCK_DV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
              IS_FP8: tl.constexpr, EXACT_P_CAST: tl.constexpr, V_T: tl.constexpr, QK_IMPRECISE: tl.constexpr,
              PV_IMPRECISE: tl.constexpr, BLOCK_DB: tl.constexpr, NO_LICM: tl.constexpr = True,
              V_MMA_ORDER: tl.constexpr = False, NARROW: tl.constexpr = False):
    """Query rows [m0, m0 + BLOCK_M) of one (batch, head): load Q, stream the key blocks the mask lets
    them see, store out and lse."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q = _load_rows(q_base, q_desc, m0, seqlen_q, stride_qs, BLOCK_M, BLOCK_DA, HEAD_DIM, True, USE_TMA)
    if BLOCK_DB:
        q_b = _load_rows(q_base, q_desc_b, m0, seqlen_q, stride_qs, BLOCK_M, BLOCK_DB, HEAD_DIM, True, USE_TMA,
                         BLOCK_DA)
    else:
        q_b = q
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    lo, mid_lo, mid_hi, hi = _key_range(m0, seqlen_q, seqlen_k, off, left, right,
                                        BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if HAS_LEFT:
        acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, q_b, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks, stride_vs,
                                   lo, mid_lo, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                                   True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V,
                                   PRECISION, USE_TMA, EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE, BLOCK_DB, NO_LICM,
                                   V_MMA_ORDER)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, q_b, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks, stride_vs,
                               mid_lo, mid_hi, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                               False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V,
                               PRECISION, USE_TMA, EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE, BLOCK_DB, NO_LICM,
                               V_MMA_ORDER)
    if NARROW:  # the diagonal's keys in BLOCK_M-wide blocks: none past the tile's last row's diagonal is read
        acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, q_b, k_base, v_base, k_desc_n, k_desc_n, v_desc_n, stride_ks,
                                   stride_vs, mid_hi, hi, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                                   True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_M, BLOCK_DA, HEAD_DIM, BLOCK_DV,
                                   HEAD_DIM_V, PRECISION, USE_TMA, EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE,
                                   BLOCK_DB, NO_LICM, V_MMA_ORDER)
    else:
        acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, q_b, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks, stride_vs,
                                   mid_hi, hi, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                                   True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV,
                                   HEAD_DIM_V, PRECISION, USE_TMA, EXACT_P_CAST, V_T, QK_IMPRECISE, PV_IMPRECISE,
                                   BLOCK_DB, NO_LICM, V_MMA_ORDER)

    # Fully masked rows (l = 0): out 0, lse -inf, the oracle's convention.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    acc = acc / l_safe[:, None]
    if IS_FP8:
        if Out.dtype.element_ty == tl.float8e4nv:
            # FP8 output: out x v_descale is the real value, so the values stay in V's units (|out| <=
            # max|V| <= 448, the format's range); the caller hands v_descale on as out's descale.
            if EXACT_P_CAST:
                acc = _round_to_e4m3_signed(acc)
        else:
            acc = acc * tl.load(VDescale + ds_off)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    row_ok = offs_m < seqlen_q
    tl.store(l_base + offs_m, lse, mask=row_ok)
    if USE_TMA:
        o_desc.store([m0, 0], acc.to(Out.dtype.element_ty))
    else:
        offs_dv = tl.arange(0, BLOCK_DV)
        o_mask = (offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V)
        tl.store(o_base + offs_m[:, None] * stride_os + offs_dv[None, :], acc.to(Out.dtype.element_ty),
                 mask=o_mask)


_fwd_kernel_tuned = configs.autotuned(configs.FWD_SPACE, configs.prune_fwd)(_fwd_kernel)


def arch_of(t: torch.Tensor) -> int:
    if t.is_cuda:
        major, minor = torch.cuda.get_device_capability(t.device)
        return major * 10 + minor
    return 0


def precision_of(dtype: torch.dtype, allow_tf32: bool) -> str:
    # fp32 inputs use a full-precision (ieee) dot unless tf32 is asked for; fp16/bf16 ignore it.
    if dtype == torch.float32 and not allow_tf32:
        return "ieee"
    return "tf32"


def _imprecise(setting) -> dict:
    """The two dots' ``max_num_imprecise_acc`` constexprs from one setting or a (Q K^T, P V) pair."""
    qk, pv = setting if isinstance(setting, tuple) else (setting, setting)
    return {"QK_IMPRECISE": qk, "PV_IMPRECISE": pv}


_CONTIGUOUS = torch.contiguous_format


def flash_attn_fwd(q, k, v, *, softmax_scale, causal, window_left, window_right, softcap=0.0, allow_tf32=False,
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, descales=None,
                   out_dtype=None, v_transposed=False, v_mma_order=False, max_num_imprecise_acc=None, launches=None,
                   v_ready=None, v_after_copy=False):
    """Launch the forward kernel. Inputs already validated by the public function.

    Dense: q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] -> out [B, Sq, Hq, Dv], lse [B, Hq, Sq] fp32.
    Varlen: q [Tq, Hq, D], k [Tk, Hk, D], v [Tk, Hk, Dv], cu_seqlens [B+1] int32 -> out [Tq, Hq, Dv], lse [Hq, Tq].
    window_left / window_right: -1 for unbounded; causal is window_right = 0.
    FP8 (dense only): q, k, v in float8_e4m3fn, ``descales`` = (q_descale, k_descale, v_descale), each
    (B, Hk) float32; P is quantised to e4m3 for P V; out in ``out_dtype``. ``v_transposed`` (dense
    only): v is [B, Hk, Dv, Sk] (keys contiguous), the layout Hopper's FP8 MMA wants for P V;
    ``v_mma_order``: its keys also in the MMA order (``v_layout.v_keys_contiguous(v, mma_order=True)``).
    ``max_num_imprecise_acc``: Triton's knob for FP8 dots on sm90 (see :func:`flash_attn_fp8_func`), one
    value for both dots or a (Q K^T, P V) pair; None (the default, as flash_attn_fp8_func's) never
    promotes, 0 promotes after every MMA (about half the speed).
    ``launches``: a dict this call may replay its launch from and leave it in (see
    :mod:`kernels.launcher`); the caller keys it on the call's signature.
    ``v_ready`` (with ``v_transposed``): (counters, tiles): V is still being written by the kernel launched just
    before, ``v_layout.v_keys_contiguous(..., ready=counters)``; this launch starts while it runs (programmatic
    dependent launch on a GPU) and each program waits for its (batch, kv head) counter to reach ``tiles``.
    ``v_after_copy`` (with ``v_transposed``): V is written by the kernel launched just before,
    ``v_keys_contiguous(..., launch_dependents=True)``; this launch starts while that one ends (programmatic
    dependent launch) and every program waits for it (griddepcontrol.wait) before reading anything.
    """
    varlen = cu_seqlens_q is not None
    if v_transposed and varlen:
        raise ValueError("v_transposed: dense inputs only")
    if v_mma_order and not v_transposed:
        raise ValueError("v_mma_order: only for a transposed V (v_transposed=True)")
    dv = v.shape[2] if v_transposed else v.shape[-1]
    # a launch to replay exists only for a signature first launched here (not the wide kernels', not an empty
    # call's): a replay skips those checks (the host time of every call: issue 16's budget)
    replay = launches.get("fwd") if launches is not None else None
    if replay is None and (dv > configs.MAX_HEAD_DIM or q.shape[-1] > configs.MAX_HEAD_DIM):  # absorbed MLA, wider
        from .wide import wide_fwd

        return wide_fwd(q, k, v, softmax_scale=softmax_scale, causal=causal, window_left=window_left,
                        window_right=window_right, softcap=softcap, allow_tf32=allow_tf32, cu_seqlens_q=cu_seqlens_q,
                        descales=descales, out_dtype=out_dtype, v_transposed=v_transposed)
    if varlen:
        total_q, hq, d = q.shape
        out = torch.empty((total_q, hq, dv), device=q.device, dtype=out_dtype or q.dtype)
        lse = torch.empty((hq, total_q), device=q.device, dtype=torch.float32)
        cuq, cuk = cu_seqlens_q, cu_seqlens_k
    else:
        batch, sq, hq, d = q.shape
        # contiguous (empty_like with a memory format where the shapes agree: ~2/3 of new_empty's host cost)
        out = torch.empty_like(q, dtype=out_dtype or q.dtype, memory_format=_CONTIGUOUS) if dv == d else \
            q.new_empty((batch, sq, hq, dv), dtype=out_dtype or q.dtype)
        # a replay: like the first call's template (launcher.shape_template)
        like = launches.get("lse_like") if replay is not None else None
        lse = torch.empty_like(like, memory_format=_CONTIGUOUS) if like is not None else \
            q.new_empty((batch, hq, sq), dtype=torch.float32)
        cuq = cuk = None  # IS_VARLEN is a constexpr: None is one too, no slot for a replay to fill
    if replay is None and out.numel() == 0:
        return out, lse
    fp8 = descales is not None
    qds, kds, vds = descales if fp8 else (None, None, None)  # (IS_FP8 a constexpr, as IS_VARLEN)
    if (v_ready is not None or v_after_copy) and not v_transposed:
        raise ValueError("v_ready, v_after_copy: only for a transposed V (v_transposed=True)")
    if v_ready is not None and v_after_copy:
        raise ValueError("v_ready and v_after_copy: one or the other")
    tensors = {"Q": q, "K": k, "V": v, "Out": out, "Lse": lse, "CuSeqQ": cuq, "CuSeqK": cuk,
               "QDescale": qds, "KDescale": kds, "VDescale": vds, "VReady": None if v_ready is None else v_ready[0]}
    if replay is not None and replay(tensors):
        return out, lse
    # the first call of a signature (or every call without a replay cache): every argument worked out
    ws = None if v_ready is not None or v_after_copy else configs.gluon_ws_fwd(
        q, k, v, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap, varlen=varlen,
        fp8=fp8 or v_transposed)
    if ws is not None:  # hd 128, MLA's 192 / 128, hd 64's routed cells; bf16 / fp16: the warp-specialised Gluon kernel
        from .fp8_gluon import ws16_launch

        launch = ws16_launch(q, k, v, out, lse, softmax_scale, causal, **ws)
        if launches is not None and launch is not None:  # its slots are Q, K, V, Out, Lse: replayed as below
            launches["fwd"] = launch
            launches["lse_like"] = launcher.shape_template(lse)
        return out, lse
    if varlen:
        batch = cu_seqlens_q.numel() - 1
        hk = k.shape[1]
        sq, sk = int(max_seqlen_q), int(max_seqlen_k)
        sqb, sqs, sqh = 0, q.stride(0), q.stride(1)
        skb, sks, skh = 0, k.stride(0), k.stride(1)
        svb, svs, svh = 0, v.stride(0), v.stride(1)
        sob, sos, soh = 0, out.stride(0), out.stride(1)
        slb, slh = 0, lse.stride(0)
    else:
        sk, hk = k.shape[1], k.shape[2]
        sqb, sqs, sqh = q.stride(0), q.stride(1), q.stride(2)
        skb, sks, skh = k.stride(0), k.stride(1), k.stride(2)
        svb, svs, svh = v.stride(0), v.stride(1), v.stride(2)
        if v_transposed:  # [B, Hk, Dv, Sk]: "stride_vs" steps between value dims
            svb, svh, svs = v.stride(0), v.stride(1), v.stride(2)
        sob, sos, soh = out.stride(0), out.stride(1), out.stride(2)
        slb, slh = lse.stride(0), lse.stride(1)
    right = 0 if causal else window_right
    args = {
        "stride_qb": sqb, "stride_qs": sqs, "stride_qh": sqh,
        "stride_kb": skb, "stride_ks": sks, "stride_kh": skh,
        "stride_vb": svb, "stride_vs": svs, "stride_vh": svh,
        "stride_ob": sob, "stride_os": sos, "stride_oh": soh,
        "stride_lb": slb, "stride_lh": slh,
        "seqlen_q": sq, "seqlen_k": sk, "num_heads": hq, "group": hq // hk,
        "left": max(window_left, 0), "right": max(right, 0), "sm_scale": float(softmax_scale),
        "softcap": float(softcap or 0.0), "HAS_SOFTCAP": bool(softcap),
        "HEAD_DIM": d, "BLOCK_D": configs.block_d(d), "HEAD_DIM_V": dv, "BLOCK_DV": configs.block_d(dv),
        "BLOCK_DB": configs.block_db(d, q.element_size()),
        "IS_CAUSAL": bool(causal), "HAS_LEFT": window_left >= 0, "HAS_RIGHT": right >= 0,
        "IS_VARLEN": varlen, "PRECISION": precision_of(q.dtype, allow_tf32),
        "SEQ_BUCKET": configs.seq_bucket(sq, sk), "FILL_BUCKET": configs.fill_bucket(batch * hq * max(sq, sk)),
        "ARCH": arch_of(q),
    }
    args.update(stride_dsb=qds.stride(0) if fp8 else 0, IS_FP8=fp8, EXACT_P_CAST=fp8 and configs.interpreting(),
                V_T=bool(v_transposed), **_imprecise(max_num_imprecise_acc if fp8 else 0))
    args["NO_LICM"] = configs.fwd_masked_no_licm(d, q.element_size())
    args["V_MMA_ORDER"] = bool(v_mma_order)
    args["NARROW_DIAGONAL"] = configs.fwd_narrow_diagonal(d)
    args["v_tiles"] = v_ready[1] if v_ready is not None else 0
    pdl = (v_ready is not None or v_after_copy) and not configs.interpreting()
    # 1 / 2: the per-head counters with / without the PTX fence (the interpreter); 3: griddepcontrol.wait
    args["V_WAIT"] = (1 if pdl else 2) if v_ready is not None else 3 if pdl else 0
    options = {"launch_pdl": True} if pdl else {}
    interpreted_tiles = 1
    if configs.interpreting():  # no config list there: TILES is an argument (1 unless forced)
        interpreted_tiles = args["TILES"] = configs.FWD_TILES_FORCE or 1
    launch = configs.launch(_fwd_kernel, _fwd_kernel_tuned, configs.FWD_SPACE, configs.prune_fwd,
                            lambda bm, bn, tiles=interpreted_tiles: (triton.cdiv(triton.cdiv(sq, bm), tiles),
                                                                     batch * hq),
                            dict(tensors, **args), options=options)
    if pdl:  # beside the copy (v_layout): the same carveout, or it waits for the copy to leave
        launcher.prefer_max_shared_memory(launch)
    if launches is not None and launch is not None:
        launches["fwd"] = launch
        if not varlen:  # what a replay allocates its lse like
            launches["lse_like"] = launcher.shape_template(lse)
    return out, lse
