"""Backward flash-attention kernels (Triton) and their launcher.

FA2's structure. Default ("split", deterministic, no atomics), two launches:
- `_bwd_dq_kernel` first: one program per (query block, batch * query head), looping over key
  blocks as the forward does: dQ += dS K. It also computes delta = rowsum(dO * O) for its rows
  (FUSE_DELTA) and stores it for the next kernel, so there is no separate preprocess pass.
- `_bwd_dkdv_kernel`: one program per (key block, batch * kv head). K and V stay resident; it loops
  over the query heads of its GQA group and over the query blocks that see the key block,
  recomputing P^T = exp2(K Q^T * scale - lse) and accumulating dV += P^T dO and dK += dS^T Q.
  Summing over the group inside the program is what makes GQA/MQA need no atomics.
Alternative ("atomic", FLASH_ATTN_BWD=atomic; slower on the H100, see docs/perf/flash_attn.md):
`_bwd_preprocess` computes delta and zeroes an fp32 dQ buffer (dense calls; varlen: a memset), then the dK/dV
kernel also adds dS K into it, and `_cast_dq` casts it to dQ's dtype (a replayed launch, not a torch op). The same
launches carry the fused Gluon backward (bwd_gluon.py, where configs.BWD_GLUON_FUSED routes it or
FLASH_ATTN_BWD=fused): its dK/dV kernel adds dQ by TMA reduce instead of atomics; its ordered variant (each dQ
tile's adds in a fixed order, bitwise reproducible: configs.BWD_GLUON_FUSED_ORDERED's cells for deterministic calls,
hd 128 non-causal from 8k, or FLASH_ATTN_BWD=ordered) with its add counters zeroed by the same preprocess.
Both kernels split their loop into masked / unmasked parts like the forward (see fwd._key_range).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launcher
from . import configs
from .fwd import (
    _capped,
    _copy_len,
    _exact_fp8,
    _head_rows,
    _key_range,
    _keys_in_mma_order,
    _load_cols,
    _load_rows,
    _make_desc,
    _make_desc_t,
    _round_to_e4m3,
    _sequence,
    arch_of,
    precision_of,
)

#: The FP8 backward quantises P (at most 1) to e4m3 at this scale for dV += P^T dO: e4m3's largest value,
#: as the forward's P and cuDNN's FP8 backward (its scale_s) do.
P_SCALE = tl.constexpr(448.0)


@triton.jit
def _bwd_preprocess(Out, DO, Delta, DQacc, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                    stride_lb, stride_lh, stride_zb, stride_zs, stride_zh, CuSeqQ, seqlen_q, num_heads,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_VARLEN: tl.constexpr,
                    BLOCK_M: tl.constexpr, HEAD_DIM_Q: tl.constexpr, BLOCK_DQ: tl.constexpr, Sem=None):
    """delta = rowsum(O * dO) per (row, head); with ``DQacc`` (dense calls): also zero the same rows of the fp32 dQ
    buffer the atomic / fused backward adds into (q's head dim), instead of a memset launch of its own. ``Sem``
    (dense, BLOCK_M 64: the ordered fused backward's, bwd_gluon.order_counters' layout): zero this program's query
    tile's add counter (program (0, 0) the spare one too)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if Sem is not None:
        tl.store(Sem + 1 + pid_bh * tl.num_programs(0) + pid_m, 0)
        tl.store(Sem, 0, mask=(pid_m == 0) & (pid_bh == 0))
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    if IS_VARLEN:
        q_start = tl.load(CuSeqQ + b)
        seqlen_q = tl.load(CuSeqQ + b + 1) - q_start
    else:
        q_start = tl.full([], 0, tl.int32)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    b64 = b.to(tl.int64)
    o = tl.load(Out + b64 * stride_ob + h * stride_oh + (q_start + offs_m[:, None]).to(tl.int64) * stride_os
                + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b64 * stride_db + h * stride_dh + (q_start + offs_m[:, None]).to(tl.int64) * stride_ds
                 + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, axis=1)
    tl.store(Delta + b64 * stride_lb + h * stride_lh + q_start + offs_m, delta, mask=offs_m < seqlen_q)
    if DQacc is not None:
        offs_dq = tl.arange(0, BLOCK_DQ)
        tl.store(DQacc + b64 * stride_zb + h * stride_zh + offs_m[:, None].to(tl.int64) * stride_zs + offs_dq[None, :],
                 tl.zeros([BLOCK_M, BLOCK_DQ], dtype=tl.float32),
                 mask=(offs_m[:, None] < seqlen_q) & (offs_dq[None, :] < HEAD_DIM_Q))


@triton.jit
def _query_range(n0, seqlen_q, seqlen_k, off, left, right,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Query blocks that see keys [n0, n0 + BLOCK_N): [lo, hi), unmasked part [mid_lo, mid_hi).

    Query i sees key j iff j - off - right <= i <= j - off + left. A block is unmasked only when all
    its rows are < seqlen_q and all the key block's columns are < seqlen_k.
    """
    col_last = tl.minimum(n0 + BLOCK_N, seqlen_k) - 1
    lo = 0
    hi = seqlen_q
    full_lo = 0
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    if HAS_RIGHT:
        lo = tl.maximum(n0 - off - right, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
        full_lo = tl.maximum(col_last - off - right, 0)
        full_lo = ((full_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        hi = tl.minimum(hi, tl.maximum(col_last - off + left + 1, 0))
        full_hi = tl.minimum(full_hi, (tl.maximum(n0 - off + left + 1, 0) // BLOCK_M) * BLOCK_M)
    if n0 + BLOCK_N > seqlen_k:
        full_hi = 0
    hi = tl.maximum(hi, lo)
    mid_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    mid_hi = tl.maximum(tl.minimum(full_hi, hi), mid_lo)
    return lo, mid_lo, mid_hi, hi


@triton.jit
def _dkdv_inner(dk, dk_b, dv, k, k_b, v, q_base, do_base, q_desc, q_desc_b, do_desc, lse_base, delta_base, dq_base,
                stride_qs, stride_dos, stride_dqs,
                start_m, end_m, offs_n, seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                qt_base, qt_desc, stride_qtd, dot_base, dot_desc, stride_dotd, dp_scale, ds_scale,
                MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_DB: tl.constexpr = 0,
                IS_FP8: tl.constexpr = False, EXACT_CAST: tl.constexpr = False, MMA_ORDER: tl.constexpr = False):
    """BLOCK_DB > 0 (split head dim, configs.block_db): k, q, dk and the atomic dQ hold columns
    [0, BLOCK_D); k_b, q_b, dk_b and dQ's second part [BLOCK_D, BLOCK_D + BLOCK_DB).
    IS_FP8 (see _bwd_dkdv_kernel): scores and dP^T in FP8 units (qk_scale carries the descales, dP^T is
    scaled by ``dp_scale``); P^T goes to e4m3 at P_SCALE for dV += P^T dO and dS^T to dO's format at
    ``ds_scale`` for dK += dS^T Q, both second operands read K-major from the sequence-contiguous copies
    of dO and Q (``dot_*``, ``qt_*``: [Dv or D, Sq] per head), as Hopper's FP8 MMA wants."""
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    for start in tl.range(start_m, end_m, BLOCK_M):
        offs_m = start + offs_m0
        q = _load_rows(q_base, q_desc, start, seqlen_q, stride_qs, BLOCK_M, BLOCK_D, HEAD_DIM, MASKED, USE_TMA)
        if BLOCK_DB:
            q_b = _load_rows(q_base, q_desc_b, start, seqlen_q, stride_qs, BLOCK_M, BLOCK_DB, HEAD_DIM, MASKED,
                             USE_TMA, BLOCK_D)
        do = _load_rows(do_base, do_desc, start, seqlen_q, stride_dos, BLOCK_M, BLOCK_DV, HEAD_DIM_V, MASKED,
                        USE_TMA)
        if MASKED:
            row_ok = offs_m < seqlen_q
            lse = tl.load(lse_base + offs_m, mask=row_ok, other=float("inf"))
            delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        # Fully masked rows carry lse = -inf; +inf makes their P exactly 0 instead of NaN.
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        # S^T = K Q^T: P^T is born in the accumulator layout that the dV dot takes as its A operand.
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # [BLOCK_N, BLOCK_M]
        if BLOCK_DB:
            s_t = tl.dot(k_b, tl.trans(q_b), s_t, input_precision=PRECISION)
        if HAS_SOFTCAP:
            s_t, t_t = _capped(s_t, sm_scale, softcap)
            p_t = tl.math.exp2(s_t - lse2[None, :])
        else:
            p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            keep = (offs_n[:, None] < seqlen_k) & (offs_m[None, :] < seqlen_q)
            if HAS_RIGHT:
                keep = keep & (offs_n[:, None] <= offs_m[None, :] + off + right)
            if HAS_LEFT:
                keep = keep & (offs_n[:, None] >= offs_m[None, :] + off - left)
            p_t = tl.where(keep, p_t, 0.0)
        if IS_FP8:  # P^T in e4m3 at P_SCALE; dO^T's tile [Dv, BLOCK_M] from its sequence-contiguous copy
            p8 = p_t * P_SCALE
            if EXACT_CAST:
                p8 = _round_to_e4m3(p8)
            rows_q = _copy_len(seqlen_q, MMA_ORDER)
            do_t = _load_cols(dot_base, dot_desc, start, rows_q, stride_dotd, BLOCK_DV, BLOCK_M, HEAD_DIM_V, MASKED,
                              USE_TMA)
            p8 = p8.to(k.dtype)
            if MMA_ORDER:  # the copies' queries in the MMA order: P^T's columns follow (fwd._keys_in_mma_order)
                p8 = _keys_in_mma_order(p8)
            dv = tl.dot(p8, tl.trans(do_t), dv)
        else:
            dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        if IS_FP8:  # dS^T in dO's format: the real dS (softmax scale folded in) over ds_descale
            ds_t = p_t * (dp_t * dp_scale - delta[None, :]) * ds_scale
            if EXACT_CAST:
                ds_t = _exact_fp8(ds_t, do.dtype)
            q_t = _load_cols(qt_base, qt_desc, start, rows_q, stride_qtd, BLOCK_D, BLOCK_M, HEAD_DIM, MASKED, USE_TMA)
            ds8 = ds_t.to(do.dtype)
            if MMA_ORDER:
                ds8 = _keys_in_mma_order(ds8)
            dk = tl.dot(ds8, tl.trans(q_t), dk)
        else:
            ds_t = p_t * (dp_t - delta[None, :])
            if HAS_SOFTCAP:  # through the cap: d(c tanh(x / c)) / dx = 1 - tanh**2
                ds_t = ds_t * (1.0 - t_t * t_t)
            ds_t = ds_t.to(q.dtype)
            dk = tl.dot(ds_t, q, dk, input_precision=PRECISION)
        if BLOCK_DB:
            dk_b = tl.dot(ds_t, q_b, dk_b, input_precision=PRECISION)
        if ATOMIC_DQ:
            # FA2's dQ: this key block's share dS K goes straight into an fp32 buffer (sm_scale
            # folded in here; dK gets it once at the end).
            dq_part = tl.dot(tl.trans(ds_t), k, input_precision=PRECISION) * sm_scale
            dq_ptrs = dq_base + offs_m[:, None] * stride_dqs + offs_d[None, :]
            if MASKED:
                tl.atomic_add(dq_ptrs, dq_part, mask=(offs_m[:, None] < seqlen_q) & d_mask, sem="relaxed")
            elif BLOCK_D > HEAD_DIM:
                tl.atomic_add(dq_ptrs, dq_part, mask=d_mask, sem="relaxed")
            else:
                tl.atomic_add(dq_ptrs, dq_part, sem="relaxed")
            if BLOCK_DB:  # dQ's second part: columns [BLOCK_D, HEAD_DIM) of the buffer
                dq_part_b = tl.dot(tl.trans(ds_t), k_b, input_precision=PRECISION) * sm_scale
                offs_db = BLOCK_D + tl.arange(0, BLOCK_DB)
                dq_ptrs_b = dq_base + offs_m[:, None] * stride_dqs + offs_db[None, :]
                if MASKED:
                    tl.atomic_add(dq_ptrs_b, dq_part_b, mask=(offs_m[:, None] < seqlen_q) & (offs_db[None, :] < HEAD_DIM),
                                  sem="relaxed")
                elif BLOCK_D + BLOCK_DB > HEAD_DIM:
                    tl.atomic_add(dq_ptrs_b, dq_part_b, mask=offs_db[None, :] < HEAD_DIM, sem="relaxed")
                else:
                    tl.atomic_add(dq_ptrs_b, dq_part_b, sem="relaxed")
    return dk, dk_b, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, DQacc, CuSeqQ, CuSeqK,
                     QT, DOT, QDescale, KDescale, VDescale, DODescale, DSDescale, DKDescale, DVDescale, stride_dsb,
                     stride_qtb, stride_qth, stride_qtd, stride_dotb, stride_doth, stride_dotd,
                     stride_qb, stride_qs, stride_qh,
                     stride_kb, stride_ks, stride_kh,
                     stride_vb, stride_vs, stride_vh,
                     stride_dob, stride_dos, stride_doh,
                     stride_dkb, stride_dks, stride_dkh,
                     stride_dvb, stride_dvs, stride_dvh,
                     stride_lb, stride_lh, stride_dqab, stride_dqas, stride_dqah,
                     stride_dkp, stride_dvp, group_split,
                     seqlen_q, seqlen_k, num_kv_heads, group, left, right, sm_scale, softcap,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                     IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr, RESIDENT_N: tl.constexpr,
                     SEQ_BUCKET, FILL_BUCKET, ARCH,
                     ATOMIC_DQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     USE_TMA: tl.constexpr, BLOCK_DB: tl.constexpr = 0,
                     IS_FP8: tl.constexpr = False, EXACT_CAST: tl.constexpr = False, MMA_ORDER: tl.constexpr = False):
    # BLOCK_DB > 0: q / k's head dim split in two power-of-two parts (configs.block_db, 192 = 128 + 64):
    # K, dK and the Q tiles in two column ranges, S^T and dQ as two dots, nothing padded to BLOCK_D
    # IS_FP8: q, k, v in e4m3 and dO in e4m3 / e5m2 with (batch, kv head) descales (flash_attn_fp8_bwd_func);
    # QT / DOT are Q and dO with the sequence contiguous ([B, H, D, S]); DK / DV get the real values, or
    # in FP8 (their dtype) over DKDescale / DVDescale. Dense only, no softcap, split head dim or atomics.
    BLOCK_DA: tl.constexpr = BLOCK_D // 2 if BLOCK_DB else BLOCK_D
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    # group_split > 1 (MQA / GQA with few kv heads): the query heads of a group are shared by that
    # many programs, each writing its partial dK / dV (fp32) at DK + split * stride_dkp; the host sums
    gs = pid_bh % group_split
    b = (pid_bh // group_split) // num_kv_heads
    hk = (pid_bh // group_split) % num_kv_heads
    per = tl.cdiv(group, group_split)
    g_lo = gs * per
    g_hi = tl.minimum(g_lo + per, group)
    q_start, k_start, seqlen_q, seqlen_k = _sequence(CuSeqQ, CuSeqK, b, seqlen_q, seqlen_k, IS_VARLEN)
    n_n = tl.cdiv(seqlen_k, BLOCK_N)
    if pid_n >= n_n:
        return
    n0 = pid_n * BLOCK_N
    off = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_DA)
    offs_dv = tl.arange(0, BLOCK_DV)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    v_mask = (offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V)
    k_rows = (k_start + offs_n[:, None]).to(tl.int64)
    k = tl.load(K + b64 * stride_kb + hk.to(tl.int64) * stride_kh + k_rows * stride_ks + offs_d[None, :],
                mask=kv_mask, other=0.0)
    v = tl.load(V + b64 * stride_vb + hk.to(tl.int64) * stride_vh + k_rows * stride_vs + offs_dv[None, :],
                mask=v_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_DA], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    if BLOCK_DB:
        offs_db = BLOCK_DA + tl.arange(0, BLOCK_DB)
        kb_mask = (offs_n[:, None] < seqlen_k) & (offs_db[None, :] < HEAD_DIM)
        k_b = tl.load(K + b64 * stride_kb + hk.to(tl.int64) * stride_kh + k_rows * stride_ks + offs_db[None, :],
                      mask=kb_mask, other=0.0)
        dk_b = tl.zeros([BLOCK_N, BLOCK_DB], dtype=tl.float32)
    else:
        k_b = k
        dk_b = dk
    qk_scale = sm_scale * 1.4426950408889634
    if IS_FP8:  # FP8 units in the dots; the real values by the descales (see _dkdv_inner)
        ds_off = b64 * stride_dsb + hk
        q_d = tl.load(QDescale + ds_off)
        do_d = tl.load(DODescale + ds_off)
        dsd = tl.load(DSDescale + ds_off)
        qk_scale = qk_scale * q_d * tl.load(KDescale + ds_off)
        dp_scale = tl.load(VDescale + ds_off)
        ds_scale = sm_scale * do_d / dsd
    else:
        dp_scale = 1.0
        ds_scale = 1.0
    lo, mid_lo, mid_hi, hi = _query_range(n0, seqlen_q, seqlen_k, off, left, right,
                                          BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for g in range(g_lo, g_hi):
        h = (hk * group + g).to(tl.int64)
        q_base = _head_rows(Q, b64, h, q_start, stride_qb, stride_qh, stride_qs)
        do_base = _head_rows(DO, b64, h, q_start, stride_dob, stride_doh, stride_dos)
        lse_base = Lse + b64 * stride_lb + h * stride_lh + q_start
        delta_base = Delta + b64 * stride_lb + h * stride_lh + q_start
        dq_base = _head_rows(DQacc, b64, h, q_start, stride_dqab, stride_dqah, stride_dqas)
        q_desc = _make_desc(q_base, seqlen_q, stride_qs, BLOCK_M, BLOCK_DA, HEAD_DIM, USE_TMA)
        if BLOCK_DB:
            q_desc_b = _make_desc(q_base, seqlen_q, stride_qs, BLOCK_M, BLOCK_DB, HEAD_DIM, USE_TMA)
        else:
            q_desc_b = q_desc
        do_desc = _make_desc(do_base, seqlen_q, stride_dos, BLOCK_M, BLOCK_DV, HEAD_DIM_V, USE_TMA)
        if IS_FP8:
            qt_base = QT + b64 * stride_qtb + h * stride_qth
            dot_base = DOT + b64 * stride_dotb + h * stride_doth
            rows_q = _copy_len(seqlen_q, MMA_ORDER)
            qt_desc = _make_desc_t(qt_base, rows_q, stride_qtd, BLOCK_DA, BLOCK_M, HEAD_DIM, USE_TMA)
            dot_desc = _make_desc_t(dot_base, rows_q, stride_dotd, BLOCK_DV, BLOCK_M, HEAD_DIM_V, USE_TMA)
        else:
            qt_base = QT
            dot_base = DOT
            qt_desc = QT
            dot_desc = DOT
        if HAS_RIGHT:
            dk, dk_b, dv = _dkdv_inner(dk, dk_b, dv, k, k_b, v, q_base, do_base, q_desc, q_desc_b, do_desc, lse_base,
                                       delta_base, dq_base, stride_qs,
                                 stride_dos, stride_dqas,
                                 lo, mid_lo, offs_n, seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                                 qt_base, qt_desc, stride_qtd, dot_base, dot_desc, stride_dotd, dp_scale, ds_scale,
                                 True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_M, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V,
                                 PRECISION, ATOMIC_DQ, USE_TMA, BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
        dk, dk_b, dv = _dkdv_inner(dk, dk_b, dv, k, k_b, v, q_base, do_base, q_desc, q_desc_b, do_desc, lse_base,
                                       delta_base, dq_base, stride_qs,
                             stride_dos, stride_dqas,
                             mid_lo, mid_hi, offs_n, seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                             qt_base, qt_desc, stride_qtd, dot_base, dot_desc, stride_dotd, dp_scale, ds_scale,
                             False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_M, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V,
                             PRECISION, ATOMIC_DQ, USE_TMA, BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
        dk, dk_b, dv = _dkdv_inner(dk, dk_b, dv, k, k_b, v, q_base, do_base, q_desc, q_desc_b, do_desc, lse_base,
                                       delta_base, dq_base, stride_qs,
                             stride_dos, stride_dqas,
                             mid_hi, hi, offs_n, seqlen_q, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                             qt_base, qt_desc, stride_qtd, dot_base, dot_desc, stride_dotd, dp_scale, ds_scale,
                             True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_M, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V,
                                 PRECISION, ATOMIC_DQ, USE_TMA, BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
    if IS_FP8:  # real values: dK from dS (ds_descale units) and Q, dV from P (P_SCALE units) and dO
        dk = dk * (dsd * q_d)
        dv = dv * (do_d / P_SCALE)
        if DK.dtype.element_ty.is_fp8():  # the gradients' format, over their descales (no group split)
            dk = dk / tl.load(DKDescale + ds_off)
            dv = dv / tl.load(DVDescale + ds_off)
            if EXACT_CAST:
                dk = _exact_fp8(dk, DK.dtype.element_ty)
                dv = _exact_fp8(dv, DV.dtype.element_ty)
    else:
        dk = dk * sm_scale
    dk_rows = (k_start + offs_n[:, None]).to(tl.int64)
    gs64 = gs.to(tl.int64)
    tl.store(DK + gs64 * stride_dkp + b64 * stride_dkb + hk.to(tl.int64) * stride_dkh + dk_rows * stride_dks
             + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    if BLOCK_DB:
        dk_b = dk_b * sm_scale
        tl.store(DK + gs64 * stride_dkp + b64 * stride_dkb + hk.to(tl.int64) * stride_dkh + dk_rows * stride_dks
                 + offs_db[None, :], dk_b.to(DK.dtype.element_ty), mask=kb_mask)
    tl.store(DV + gs64 * stride_dvp + b64 * stride_dvb + hk.to(tl.int64) * stride_dvh + dk_rows * stride_dvs
             + offs_dv[None, :], dv.to(DV.dtype.element_ty), mask=v_mask)


@triton.jit
def _dq_inner(dq, dq_b, q, q_b, do, lse2, delta, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks, stride_vs,
              start_n, end_n, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
              kt_base, kt_desc, stride_ktd, dp_scale, ds_scale,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_DV: tl.constexpr, HEAD_DIM_V: tl.constexpr,
              PRECISION: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_DB: tl.constexpr = 0,
              IS_FP8: tl.constexpr = False, EXACT_CAST: tl.constexpr = False, MMA_ORDER: tl.constexpr = False):
    """BLOCK_DB > 0 (split head dim, configs.block_db): q, the K tiles and dq hold columns [0, BLOCK_D);
    q_b, the K_b tiles and dq_b [BLOCK_D, BLOCK_D + BLOCK_DB).
    IS_FP8 (see _bwd_dq_kernel): as _dkdv_inner's, dS in dO's format at ``ds_scale`` for dQ += dS K, K
    read K-major from its sequence-contiguous copy (``kt_*``: [D, Sk] per kv head)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start in tl.range(start_n, end_n, BLOCK_N):
        offs_n = start + offs_n0
        k = _load_rows(k_base, k_desc, start, seqlen_k, stride_ks, BLOCK_N, BLOCK_D, HEAD_DIM, MASKED, USE_TMA)
        if BLOCK_DB:
            k_b = _load_rows(k_base, k_desc_b, start, seqlen_k, stride_ks, BLOCK_N, BLOCK_DB, HEAD_DIM, MASKED,
                             USE_TMA, BLOCK_D)
        v = _load_rows(v_base, v_desc, start, seqlen_k, stride_vs, BLOCK_N, BLOCK_DV, HEAD_DIM_V, MASKED, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if BLOCK_DB:
            s = tl.dot(q_b, tl.trans(k_b), s, input_precision=PRECISION)
        if HAS_SOFTCAP:
            s, t = _capped(s, sm_scale, softcap)
            p = tl.math.exp2(s - lse2[:, None])
        else:
            p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            keep = offs_n[None, :] < seqlen_k
            if HAS_RIGHT:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + off + right)
            if HAS_LEFT:
                keep = keep & (offs_n[None, :] >= offs_m[:, None] + off - left)
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if IS_FP8:
            ds = p * (dp * dp_scale - delta[:, None]) * ds_scale
            if EXACT_CAST:
                ds = _exact_fp8(ds, do.dtype)
            rows_k = _copy_len(seqlen_k, MMA_ORDER)
            k_t = _load_cols(kt_base, kt_desc, start, rows_k, stride_ktd, BLOCK_D, BLOCK_N, HEAD_DIM, MASKED, USE_TMA)
            ds8 = ds.to(do.dtype)
            if MMA_ORDER:  # KT's keys in the MMA order: dS's columns follow
                ds8 = _keys_in_mma_order(ds8)
            dq = tl.dot(ds8, tl.trans(k_t), dq)
        else:
            ds = p * (dp - delta[:, None])
            if HAS_SOFTCAP:
                ds = ds * (1.0 - t * t)
            dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
        if BLOCK_DB:
            dq_b = tl.dot(ds.to(k.dtype), k_b, dq_b, input_precision=PRECISION)
    return dq, dq_b


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, Out, Lse, Delta, DQ, CuSeqQ, CuSeqK,
                   KT, QDescale, KDescale, VDescale, DODescale, DSDescale, DQDescale, ODescale, stride_dsb,
                   stride_ktb, stride_kth, stride_ktd,
                   stride_qb, stride_qs, stride_qh,
                   stride_kb, stride_ks, stride_kh,
                   stride_vb, stride_vs, stride_vh,
                   stride_dob, stride_dos, stride_doh,
                   stride_dqb, stride_dqs, stride_dqh,
                   stride_ob, stride_os, stride_oh,
                   stride_lb, stride_lh,
                   seqlen_q, seqlen_k, num_heads, group, left, right, sm_scale, softcap,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                   IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                   IS_VARLEN: tl.constexpr, PRECISION: tl.constexpr, RESIDENT_N: tl.constexpr,
                   SEQ_BUCKET, FILL_BUCKET, ARCH,
                   FUSE_DELTA: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr,
                   BLOCK_DB: tl.constexpr = 0, IS_FP8: tl.constexpr = False, EXACT_CAST: tl.constexpr = False,
                   MMA_ORDER: tl.constexpr = False):
    # BLOCK_DB > 0: q / k's head dim split in two power-of-two parts (configs.block_db, 192 = 128 + 64):
    # Q, the K tiles and dQ in two column ranges, S as two dots, dQ = dS K per part
    # IS_FP8: as _bwd_dkdv_kernel's; KT is K with the sequence contiguous ([B, Hk, D, Sk]), an FP8 Out is
    # read back with ODescale, delta is kept in dO's FP8 units (rowsum(dO x O), dO's descale left out)
    BLOCK_DA: tl.constexpr = BLOCK_D // 2 if BLOCK_DB else BLOCK_D
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // group
    q_start, k_start, seqlen_q, seqlen_k = _sequence(CuSeqQ, CuSeqK, b, seqlen_q, seqlen_k, IS_VARLEN)
    n_m = tl.cdiv(seqlen_q, BLOCK_M)
    if pid_m >= n_m:
        return
    if HAS_RIGHT:
        pid_m = n_m - 1 - pid_m
    m0 = pid_m * BLOCK_M
    off = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DA)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < seqlen_q
    q_mask = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    o_mask = row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V)
    q_rows = (q_start + offs_m[:, None]).to(tl.int64)
    do = tl.load(DO + b64 * stride_dob + h64 * stride_doh + q_rows * stride_dos + offs_dv[None, :],
                 mask=o_mask, other=0.0)
    if FUSE_DELTA:
        # This kernel runs first and owns these rows: compute delta = rowsum(dO * O) here (dO is
        # already loaded) and publish it for the dK/dV kernel, instead of a separate pass.
        o = tl.load(Out + b64 * stride_ob + h64 * stride_oh + q_rows * stride_os + offs_dv[None, :],
                    mask=o_mask, other=0.0).to(tl.float32)
        if IS_FP8:
            if Out.dtype.element_ty.is_fp8():
                o = o * tl.load(ODescale + b64 * stride_dsb + hk)
        delta = tl.sum(o * do.to(tl.float32), axis=1)
        tl.store(Delta + b64 * stride_lb + h64 * stride_lh + q_start + offs_m, delta, mask=row_ok)
    else:
        delta = tl.load(Delta + b64 * stride_lb + h64 * stride_lh + q_start + offs_m, mask=row_ok, other=0.0)
    # Q after delta: O is dead by then, which keeps the peak register count down.
    q = tl.load(Q + b64 * stride_qb + h64 * stride_qh + q_rows * stride_qs + offs_d[None, :],
                mask=q_mask, other=0.0)
    if BLOCK_DB:
        offs_db = BLOCK_DA + tl.arange(0, BLOCK_DB)
        qb_mask = row_ok[:, None] & (offs_db[None, :] < HEAD_DIM)
        q_b = tl.load(Q + b64 * stride_qb + h64 * stride_qh + q_rows * stride_qs + offs_db[None, :],
                      mask=qb_mask, other=0.0)
    else:
        q_b = q
    lse = tl.load(Lse + b64 * stride_lb + h64 * stride_lh + q_start + offs_m, mask=row_ok, other=float("inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    k_base = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh + k_start.to(tl.int64) * stride_ks
    v_base = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh + k_start.to(tl.int64) * stride_vs
    k_desc = _make_desc(k_base, seqlen_k, stride_ks, BLOCK_N, BLOCK_DA, HEAD_DIM, USE_TMA)
    v_desc = _make_desc(v_base, seqlen_k, stride_vs, BLOCK_N, BLOCK_DV, HEAD_DIM_V, USE_TMA)
    qk_scale = sm_scale * 1.4426950408889634
    if IS_FP8:  # FP8 units in the dots; the real values by the descales (see _dkdv_inner)
        ds_off = b64 * stride_dsb + hk
        k_d = tl.load(KDescale + ds_off)
        dsd = tl.load(DSDescale + ds_off)
        qk_scale = qk_scale * tl.load(QDescale + ds_off) * k_d
        dp_scale = tl.load(VDescale + ds_off)
        ds_scale = sm_scale * tl.load(DODescale + ds_off) / dsd
        kt_base = KT + b64 * stride_ktb + hk.to(tl.int64) * stride_kth
        rows_k = _copy_len(seqlen_k, MMA_ORDER)
        kt_desc = _make_desc_t(kt_base, rows_k, stride_ktd, BLOCK_DA, BLOCK_N, HEAD_DIM, USE_TMA)
    else:
        dp_scale = 1.0
        ds_scale = 1.0
        kt_base = KT
        kt_desc = KT
    dq = tl.zeros([BLOCK_M, BLOCK_DA], dtype=tl.float32)
    if BLOCK_DB:
        k_desc_b = _make_desc(k_base, seqlen_k, stride_ks, BLOCK_N, BLOCK_DB, HEAD_DIM, USE_TMA)
        dq_b = tl.zeros([BLOCK_M, BLOCK_DB], dtype=tl.float32)
    else:
        k_desc_b = k_desc
        dq_b = dq
    lo, mid_lo, mid_hi, hi = _key_range(m0, seqlen_q, seqlen_k, off, left, right,
                                        BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    if HAS_LEFT:
        dq, dq_b = _dq_inner(dq, dq_b, q, q_b, do, lse2, delta, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks,
                             stride_vs,
                       lo, mid_lo, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                       kt_base, kt_desc, stride_ktd, dp_scale, ds_scale,
                       True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, PRECISION, USE_TMA,
                             BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
    dq, dq_b = _dq_inner(dq, dq_b, q, q_b, do, lse2, delta, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks,
                             stride_vs,
                   mid_lo, mid_hi, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                   kt_base, kt_desc, stride_ktd, dp_scale, ds_scale,
                   False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, PRECISION, USE_TMA,
                             BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
    dq, dq_b = _dq_inner(dq, dq_b, q, q_b, do, lse2, delta, k_base, v_base, k_desc, k_desc_b, v_desc, stride_ks,
                             stride_vs,
                   mid_hi, hi, offs_m, seqlen_k, off, left, right, qk_scale, sm_scale, softcap,
                   kt_base, kt_desc, stride_ktd, dp_scale, ds_scale,
                   True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, BLOCK_N, BLOCK_DA, HEAD_DIM, BLOCK_DV, HEAD_DIM_V, PRECISION, USE_TMA,
                             BLOCK_DB, IS_FP8, EXACT_CAST, MMA_ORDER)
    if IS_FP8:  # real values (dS in ds_descale units, K in k_descale's), or FP8 over DQDescale
        dq = dq * (dsd * k_d)
        if DQ.dtype.element_ty.is_fp8():
            dq = dq / tl.load(DQDescale + ds_off)
            if EXACT_CAST:
                dq = _exact_fp8(dq, DQ.dtype.element_ty)
    else:
        dq = dq * sm_scale
    tl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + q_rows * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=q_mask)
    if BLOCK_DB:
        dq_b = dq_b * sm_scale
        tl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + q_rows * stride_dqs + offs_db[None, :],
                 dq_b.to(DQ.dtype.element_ty), mask=qb_mask)


# The atomic variant accumulates into DQacc, so every timing run of the tuner must start from 0.
_bwd_dkdv_tuned = configs.autotuned(configs.BWD_SPACE, configs.prune_bwd, reset_to_zero=["DQacc"])(_bwd_dkdv_kernel)
_bwd_dq_tuned = configs.autotuned(configs.BWD_SPACE, configs.prune_bwd)(_bwd_dq_kernel)

# The dK/dV kernel's group split (group_split): the key block the program count is estimated with,
# and the programs per multiprocessor a split aims at.
GROUP_SPLIT_BLOCK_N = 128
GROUP_SPLIT_PROGRAMS_PER_SM = 2

# Rows per program of the delta preprocess: a pure bandwidth pass, 64 rows x D keeps loads wide. Also the ordered
# fused backward's query tile: a program zeroes one tile's add counter.
PREPROCESS_BLOCK_M = 64


def _s3(t, varlen):
    """(batch, seq, head) strides; batch stride 0 for the packed varlen layout."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _sms(q) -> int:
    """The multiprocessors of q's GPU (1 on the CPU and under the interpreter)."""
    if configs.interpreting() or q.device.type != "cuda":
        return 1
    return configs.tensor_sm_count(q)


def _persistent_filled(gluon: dict, q, k, split: int) -> dict:
    """``gluon`` (configs.gluon_bwd's launches) with each causal persistent launch's tile order as
    configs.persistent_causal says for its tiles (bwd_gluon.dq_grid's for dQ, dkdv_grid's under the group split for dK
    / dV and the fused kernel) an SM: heaviest first where they are few."""
    from .bwd_gluon import dkdv_grid, dq_grid

    out, sms = {}, _sms(q)
    for name, keywords in gluon.items():
        if keywords.get("persistent"):
            blocks, units = dq_grid(q) if name == "dq" else dkdv_grid(k, split)
            order = configs.persistent_causal(name, keywords["persistent"], blocks * units, sms)
            keywords = dict(keywords, persistent=order)
        out[name] = keywords
    return out


def group_split(batch: int, heads_k: int, group: int, seqlen_k: int, sms: int) -> int:
    """Programs sharing one GQA group's query heads in the dK/dV kernel: 1 while (batch x kv heads
    x key blocks of ``GROUP_SPLIT_BLOCK_N``) programs fill the multiprocessors; else enough to give
    about ``GROUP_SPLIT_PROGRAMS_PER_SM`` per SM (MQA with a small batch: 16-32 programs for 132
    SMs otherwise), never more than the group."""
    if group <= 1:
        return 1
    programs = batch * heads_k * triton.cdiv(max(seqlen_k, 1), GROUP_SPLIT_BLOCK_N)
    if programs >= sms:
        return 1
    split = min(group, triton.cdiv(GROUP_SPLIT_PROGRAMS_PER_SM * sms, programs))
    return triton.cdiv(group, triton.cdiv(group, split))  # no split left without a head


@triton.jit
def _sum_rows(P, D, Scale, start, numel, split, per_batch, dim, heads_k, stride_sb, BLOCK: tl.constexpr,
              SCALED: tl.constexpr, EXACT_CAST: tl.constexpr):
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < numel
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(split):  # in split order: the sum is the same on every run
        acc += tl.load(P + s * numel + offs, mask=mask, other=0.0)
    if SCALED:  # FP8 gradients: over their (batch, kv head) descale; element (b, s, hk, d) of [B, S, Hk, dim]
        acc = acc / tl.load(Scale + (offs // per_batch) * stride_sb + (offs // dim) % heads_k, mask=mask, other=1.0)
        if EXACT_CAST:
            acc = _exact_fp8(acc, D.dtype.element_ty)
    tl.store(D + offs, acc.to(D.dtype.element_ty), mask=mask)


@triton.jit
def _sum_partials(PK, PV, DKsum, DVsum, DKDescale, DVDescale, numel_k, numel_v, split, per_batch_k, per_batch_v,
                  head_dim, head_dim_v, heads_k, stride_dsb, DQacc, DQ, numel_q, scale, BLOCK: tl.constexpr,
                  SCALED: tl.constexpr = False, EXACT_CAST: tl.constexpr = False, CAST_DQ: tl.constexpr = False,
                  SCALE_DQ: tl.constexpr = False):
    """dK and dV from the group split's fp32 partials ([split, numel] each, contiguous), summed in
    split order and cast to the gradients' dtype: one launch for both (the first cdiv(numel_k, BLOCK)
    programs do dK, the next cdiv(numel_v, BLOCK) dV). SCALED: FP8 gradients, each written over its (batch, kv head)
    descale (DKDescale / DVDescale). ``CAST_DQ`` (the atomic / fused backward under a group split): the programs
    after those cast dQ's fp32 buffer as :func:`_cast_dq` does (``SCALE_DQ``: times ``scale`` first), the backward's
    last two launches in one (both wait for the dK / dV kernel; one launch's host time less a call)."""
    pid = tl.program_id(0)
    k_blocks = tl.cdiv(numel_k, BLOCK)
    v_blocks = tl.cdiv(numel_v, BLOCK)
    if pid < k_blocks:
        _sum_rows(PK, DKsum, DKDescale, pid.to(tl.int64) * BLOCK, numel_k, split, per_batch_k, head_dim, heads_k,
                  stride_dsb, BLOCK, SCALED, EXACT_CAST)
    elif pid < k_blocks + v_blocks or not CAST_DQ:
        _sum_rows(PV, DVsum, DVDescale, (pid - k_blocks).to(tl.int64) * BLOCK, numel_v, split, per_batch_v,
                  head_dim_v, heads_k, stride_dsb, BLOCK, SCALED, EXACT_CAST)
    else:
        _cast_rows(DQacc, DQ, (pid - k_blocks - v_blocks).to(tl.int64) * BLOCK, numel_q, scale, BLOCK, SCALE_DQ)


@triton.jit
def _cast_rows(DQacc, DQ, start, numel, scale, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    """``BLOCK`` elements of dQ's fp32 buffer from ``start`` (contiguous) cast to the gradient's dtype (``DQ``,
    contiguous); ``SCALE``: times ``scale`` first."""
    offs = start + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(DQacc + offs, mask=mask, other=0.0)
    if SCALE:
        acc = acc * scale
    tl.store(DQ + offs, acc.to(DQ.dtype.element_ty), mask=mask)


@triton.jit
def _cast_dq(DQacc, DQ, numel, scale, BLOCK: tl.constexpr, SCALE: tl.constexpr = False):
    """The atomic / fused backward's dQ: its fp32 buffer (contiguous) cast to the gradient's dtype (``DQ``,
    contiguous): a launch the backward's replay cache keeps with its others (no torch op dispatched per call).
    ``SCALE``: times ``scale`` first (the softmax scale, where the fused kernel added dQ's partials without it:
    configs.BWD_GLUON_FUSED_DQ_UNSCALED; one multiply an element here instead of one per partial there). Under a
    group split the sum's launch does this instead (:func:`_sum_partials`' ``CAST_DQ``)."""
    _cast_rows(DQacc, DQ, tl.program_id(0).to(tl.int64) * BLOCK, numel, scale, BLOCK, SCALE)


#: device -> a one-element fp32 tensor passed where a kernel takes a pointer it never reads.
_UNUSED: dict = {}


def _unused_buffer(device) -> torch.Tensor:
    buf = _UNUSED.get(device)
    if buf is None:
        buf = _UNUSED[device] = torch.zeros(1, device=device, dtype=torch.float32)
    return buf


_CONTIGUOUS = torch.contiguous_format


def _dq_buffer(q, varlen: bool) -> torch.Tensor:
    """The atomic / fused backward's fp32 dQ buffer, q's shape. Dense, unwritten: ``_bwd_preprocess`` zeroes it (it
    walks the same rows; one launch less than a memset); varlen, zeroed here (rows past the last sequence would
    stay unwritten)."""
    return (torch.zeros if varlen else torch.empty)(q.shape, device=q.device, dtype=torch.float32)


def _scratch_layout(lse, k, v, split: int, dq_acc_of=None) -> tuple[int, int, int, int]:
    """Byte offsets of delta (lse's shape, fp32), the split's dK / dV partials ([split, *k.shape] and
    [split, *v.shape], fp32; none without a split) and, given ``dq_acc_of`` (q, of a dense atomic / fused call),
    dQ's fp32 buffer (q's shape, contiguous; offset 0: none) in the workspace (:func:`kernels.launcher.workspace`),
    and its size: one allocation a call for all of them at most, none where the kept workspace holds them."""
    offsets, nbytes = launcher.scratch_layout([lse.numel(), split * k.numel() if split > 1 else 0,
                                               split * v.numel() if split > 1 else 0,
                                               dq_acc_of.numel() if dq_acc_of is not None else 0])
    return offsets[1], offsets[2], offsets[3] if dq_acc_of is not None else 0, nbytes


def _scratch_views(ws, lse, k, v, split: int, pk: int, pv: int, pq: int, q, dk_out, dv_out, dq_acc):
    """(delta, dK's and dV's kernel outputs, dQ's fp32 buffer) as tensors viewing the workspace ``ws``
    (:func:`_scratch_layout`'s offsets); ``dk_out`` / ``dv_out`` pass through without a split (the kernel writes the
    gradients), ``dq_acc`` where the layout holds no dQ buffer (``pq`` 0)."""
    delta = launcher.scratch_view(ws, 0, lse.shape)
    if split > 1:
        dk_out = launcher.scratch_view(ws, pk, (split, *k.shape))
        dv_out = launcher.scratch_view(ws, pv, (split, *v.shape))
    if pq:
        dq_acc = launcher.scratch_view(ws, pq, q.shape)
    return delta, dk_out, dv_out, dq_acc


# Elements per program of the partial sum: a bandwidth pass, 1024 fp32 loads in flight per split.
SUM_BLOCK = 1024


#: The FP8 backward's extra kernel arguments (flash_attn_bwd's ``fp8``): Q, K and dO with the sequence
#: contiguous ([B, H, D, S], v_layout.v_keys_contiguous), and the (batch, kv head) descales. Other calls
#: pass None there (a constexpr: nothing for a replay to fill, IS_FP8's branches compiled out).
FP8_TENSORS = ("QT", "KT", "DOT", "QDescale", "KDescale", "VDescale", "DODescale", "DSDescale", "ODescale",
               "DQDescale", "DKDescale", "DVDescale")


def flash_attn_bwd(do, q, k, v, out, lse, *, softmax_scale, causal, window_left, window_right, softcap=0.0,
                   allow_tf32=False, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                   max_seqlen_k=None, split=None, fp8=None, grad_dtype=None, fp8_mma_order=False, launches=None,
                   deterministic=True):
    """Launch the backward kernels: returns dq, dk, dv shaped like q, k, v (in ``grad_dtype``, default q's).

    lse is the forward's [B, Hq, Sq] (dense) or [Hq, Tq] (varlen) fp32 log-sum-exp. ``split``: the
    dK/dV kernel's group split (default :func:`group_split` from the GPU's multiprocessors).
    ``fp8`` (dense, no softcap, unsplit head dims; checked by interface.flash_attn_fp8_bwd_func): the
    FP8 backward, q, k, v in e4m3 and do in e4m3 / e5m2, ``fp8`` a dict of :data:`FP8_TENSORS`; the
    gradients come in ``grad_dtype``: real values in bf16 / fp16 / fp32, or in do's FP8 format over
    the DQ / DK / DV descales. Always the split mode (no atomic dQ). ``fp8_mma_order``: the copies QT, KT and
    DOT hold their sequence in the MMA order of each 16 (``v_layout.v_keys_contiguous(..., mma_order=True)``):
    dS, dS^T and P^T then go to their dots as the MMA left them (``fwd._keys_in_mma_order``).
    ``launches``: a dict this call may replay its launches from and leave them in (see
    :mod:`kernels.launcher`); the caller keys it on the call's signature (dO's included).
    ``deterministic`` False: the fused Gluon backward where configs.BWD_GLUON_FUSED routes it (dQ's partials
    added in arrival order: not bitwise reproducible); True: its ordered variant where
    configs.BWD_GLUON_FUSED_ORDERED routes it (bitwise reproducible), else the split kernels.
    """
    varlen = cu_seqlens_q is not None
    # IS_VARLEN is a constexpr: dense, None is one too, no slot for a replay to fill
    cuq, cuk = (cu_seqlens_q, cu_seqlens_k) if varlen else (None, None)
    gdt = grad_dtype or q.dtype
    # launches["plan"]: (atomic, split, the scratch layout, the Launches to replay in order, the ordered kernel's
    # counters (0: none), the fused kernel's route) after a first call that
    # could leave every one of them. Only a call launched here leaves one (not the wide kernels', not an empty
    # call's), so a replay skips those checks and the dimensions (the host time of every call: issue 16's budget)
    plan = launches.get("plan") if launches is not None else None
    if plan is None:
        if q.shape[-1] > configs.MAX_HEAD_DIM or v.shape[-1] > configs.MAX_HEAD_DIM:  # absorbed MLA and wider
            from .wide import wide_bwd

            return wide_bwd(do, q, k, v, out, lse, softmax_scale=softmax_scale, causal=causal,
                            window_left=window_left, window_right=window_right, softcap=softcap,
                            allow_tf32=allow_tf32, cu_seqlens_q=cu_seqlens_q)
        if q.numel() == 0 or k.numel() == 0:
            return (torch.zeros(q.shape, device=q.device, dtype=gdt),
                    torch.zeros(k.shape, device=q.device, dtype=gdt), torch.zeros(v.shape, device=q.device, dtype=gdt))
        batch, hq, hk, d, sq, sk = _dims(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
        # atomic: the Triton kernel's atomic mode, or the fused Gluon kernel (dQ by TMA reduce) where it is routed
        fused = None if fp8 is not None or varlen else configs.gluon_fused_bwd(
            q, k, v, do, out, lse, causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
            varlen=varlen, fp8=False, deterministic=deterministic)
        atomic = fp8 is None and (configs.bwd_mode(d, q.dtype, causal, configs.seq_bucket(sq, sk)) == "atomic" or
                                  fused is not None)
        # the ordered fused kernel's add counters (bwd_gluon.order_counters' layout; the preprocess zeroes them)
        counters = 1 + batch * hq * triton.cdiv(sq, PREPROCESS_BLOCK_M) if fused and fused.get("ordered") else 0
        if split is None:
            split = group_split(batch, hk, hq // hk, sk, _sms(q))
            if fused is not None and hq != hk:  # (configs.BWD_GLUON_FUSED_GQA_HEADS: the fused GQA programs' length)
                split = max(split, configs.fused_gqa_split(d, causal, hq // hk))
        split = max(1, min(int(split), hq // hk))
        replays = None
        # (dense atomic / fused: dQ's fp32 buffer in the workspace too, unwritten: the preprocess zeroes it)
        layout = _scratch_layout(lse, k, v, split, q if atomic and not varlen else None) if lse.is_contiguous() \
            else (0, 0, 0, 0)
        # the Gluon dK / dV kernel's own sum of the split (configs.BWD_GLUON_SPLIT_SUM): its zero-at-rest counters,
        # one a (batch, kv head, 16 key rows of each 128-key block); taken where that kernel runs (_launch_bwd)
        sum_counters = 0
        if split > 1 and fp8 is None and not varlen and d == v.shape[-1] and d in configs.BWD_GLUON_SPLIT_SUM:
            from .bwd_gluon import split_counter_count

            sum_counters = split_counter_count(k)
    else:
        atomic, split, layout, replays, counters, fused, sum_counters = plan
    # dq contiguous whatever q's layout (empty_like with a memory format: half of new_empty's host cost); atomic:
    # written by _cast_dq from the fp32 buffer
    dq = torch.empty_like(q, dtype=gdt, memory_format=_CONTIGUOUS)
    # delta and the split's partials: in the workspace (launcher.workspace); a replay takes their pointers,
    # the first call of a signature views (the kernels' strides come from them: lse's, contiguous partials)
    pk, pv, pq, nbytes = layout
    ws = launcher.workspace(q, nbytes) if nbytes else None
    if split > 1:  # partial dK / dV per split, fp32, summed by _sum_partials in a fixed order (deterministic);
        # the sum reads partials and writes dK / dV as flat arrays: all contiguous, whatever k's layout
        dk = torch.empty_like(k, dtype=gdt, memory_format=_CONTIGUOUS)
        dv = torch.empty_like(v, dtype=gdt, memory_format=_CONTIGUOUS)
        dk_out = dv_out = None  # the partials, below
    elif fp8 is not None:  # contiguous, as the FP8 inputs are
        dk_out = dk = torch.empty_like(k, dtype=gdt, memory_format=_CONTIGUOUS)
        dv_out = dv = torch.empty_like(v, dtype=gdt, memory_format=_CONTIGUOUS)
    else:
        dk_out = dk = torch.empty_like(k)
        dv_out = dv = torch.empty_like(v)
    # atomic: the dK/dV kernel also adds dS K into an fp32 dQ buffer (5 matmuls instead of 7, not
    # bitwise deterministic), in the workspace where the layout holds it (pq) or its own; split: a one-element
    # stand-in the kernel never touches. Not an alias of a live tensor: the autotuner zeroes DQacc before each trial
    # (reset_to_zero), and delta in its place got zeroed between the dQ kernel writing it and the dK/dV kernel
    # reading it (dK wrong on every first call of a tuning key, found on the H100): its own region of the workspace.
    dq_acc = None
    if ws is None:  # lse not contiguous (a caller's own): delta as lse, the partials apart
        delta = torch.empty_like(lse)
        if split > 1:
            dk_out = k.new_empty((split, *k.shape), dtype=torch.float32)
            dv_out = v.new_empty((split, *v.shape), dtype=torch.float32)
    elif replays is not None:  # pointers: no view made per call
        base = ws.data_ptr()
        delta = base
        if split > 1:
            dk_out, dv_out = base + pk, base + pv
        if pq:
            dq_acc = base + pq
    else:
        delta, dk_out, dv_out, dq_acc = _scratch_views(ws, lse, k, v, split, pk, pv, pq, q, dk_out, dv_out, None)
    if dq_acc is None:
        dq_acc = _dq_buffer(q, varlen) if atomic else _unused_buffer(q.device)
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Out": out, "Lse": lse, "Delta": delta, "DQ": dq, "CuSeqQ": cuq,
               "CuSeqK": cuk, "DK": dk_out, "DV": dv_out, "DQacc": dq_acc, "PK": dk_out, "PV": dv_out,
               "DKsum": dk, "DVsum": dv}
    if counters:  # (unwritten: the preprocess zeroes them before the kernel counts in them)
        tensors["Sem"] = torch.empty(counters, device=q.device, dtype=torch.int32)
    if sum_counters:  # (zero at rest: the kernel sets each back to 0)
        tensors["Count"] = launcher.counters(q, sum_counters)
    if fp8 is not None:  # (otherwise the FP8 arguments are None: constexprs, no slot to fill per call)
        tensors.update(fp8)
    # replays in launch order: delta (the dQ kernel or the atomic mode's preprocess) before dK/dV reads it
    refused = replays is None
    if not refused:
        for replay in replays:  # (a loop: all() over a generator costs a replay's own Python again)
            if not replay(tensors):  # another device than the first call's: none launched (each checks first)
                refused = True
                break
    if refused:
        if replays is not None and ws is not None:  # a replay refused (another device): views for a launch
            delta, dk_out, dv_out, dq_acc = _scratch_views(ws, lse, k, v, split, pk, pv, pq, q, dk_out, dv_out,
                                                           dq_acc)
            tensors.update(Delta=delta, DK=dk_out, DV=dv_out, PK=dk_out, PV=dv_out, DQacc=dq_acc)
        done = _launch_bwd(tensors, varlen, *_dims(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k), atomic, split,
                           softmax_scale, causal, window_left, window_right, softcap, allow_tf32, fp8 is not None,
                           fp8_mma_order, fused)
        if launches is not None and all(x is not None for x in done.values()):
            launches["plan"] = (atomic, split, layout, tuple(done.values()), counters, fused, sum_counters)
    return dq, dk, dv


def _dims(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k) -> tuple[int, int, int, int, int, int]:
    """(batch, query heads, kv heads, head dim, query length, key length) of a dense or varlen call (varlen: the
    longest sequences, as given)."""
    if cu_seqlens_q is not None:
        return cu_seqlens_q.numel() - 1, q.shape[1], k.shape[1], q.shape[2], int(max_seqlen_q), int(max_seqlen_k)
    return q.shape[0], q.shape[2], k.shape[2], q.shape[3], q.shape[1], k.shape[1]


def _launch_bwd(t, varlen, batch, hq, hk, d, sq, sk, atomic, split, softmax_scale, causal, window_left,
                window_right, softcap, allow_tf32, fp8=False, mma_order=False, fused=None) -> dict:
    """The backward's launches with every argument worked out (the first call of a signature, or
    every call without a replay cache): name -> its Launch (None where it cannot be replayed). ``fused``: the
    fused kernel's route as the caller found it (configs.gluon_fused_bwd, which knows whether the call asked for a
    deterministic backward; None: asked again here)."""
    q, k, v, do, out, lse = t["Q"], t["K"], t["V"], t["DO"], t["Out"], t["Lse"]
    slb, slh = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    bd = configs.block_d(d)
    dv_dim = v.shape[-1]
    bdv = configs.block_d(dv_dim)
    sob, sos, soh = _s3(out, varlen)
    sdb, sds, sdh = _s3(do, varlen)
    done = {}
    summed = None  # (the Gluon dK / dV kernel's own sum of the split: its counters and the gradients)
    if atomic:  # no dQ kernel to fold delta into; dense, the same launch zeroes dQ's fp32 buffer
        szb, szs, szh = _s3(t["DQacc"], varlen)
        done["delta"] = launcher.launch(  # O and dO: value dims; DQacc: q's
            _bwd_preprocess, (triton.cdiv(sq, PREPROCESS_BLOCK_M), batch * hq),
            dict(Out=out, DO=do, Delta=t["Delta"], DQacc=None if varlen else t["DQacc"], stride_ob=sob,
                 stride_os=sos, stride_oh=soh, stride_db=sdb, stride_ds=sds, stride_dh=sdh, stride_lb=slb,
                 stride_lh=slh, stride_zb=szb, stride_zs=szs, stride_zh=szh, CuSeqQ=t["CuSeqQ"], seqlen_q=sq,
                 num_heads=hq, HEAD_DIM=dv_dim, BLOCK_D=bdv, IS_VARLEN=varlen, BLOCK_M=PREPROCESS_BLOCK_M,
                 HEAD_DIM_Q=d, BLOCK_DQ=bd, Sem=t.get("Sem")))

    right = 0 if causal else window_right
    sqb, sqs, sqh = _s3(q, varlen)
    skb, sks, skh = _s3(k, varlen)
    svb, svs, svh = _s3(v, varlen)
    common = {
        "stride_qb": sqb, "stride_qs": sqs, "stride_qh": sqh,
        "stride_kb": skb, "stride_ks": sks, "stride_kh": skh,
        "stride_vb": svb, "stride_vs": svs, "stride_vh": svh,
        "stride_dob": sdb, "stride_dos": sds, "stride_doh": sdh,
        "stride_lb": slb, "stride_lh": slh,
        "seqlen_q": sq, "seqlen_k": sk, "group": hq // hk,
        "left": max(window_left, 0), "right": max(right, 0), "sm_scale": float(softmax_scale),
        "softcap": float(softcap or 0.0), "HAS_SOFTCAP": bool(softcap),
        "HEAD_DIM": d, "BLOCK_D": bd, "HEAD_DIM_V": dv_dim, "BLOCK_DV": bdv, "IS_CAUSAL": bool(causal), "HAS_LEFT": window_left >= 0, "HAS_RIGHT": right >= 0,
        "BLOCK_DB": configs.block_db(d, q.element_size()),
        "IS_VARLEN": varlen, "PRECISION": precision_of(q.dtype, allow_tf32),
        "SEQ_BUCKET": configs.seq_bucket(sq, sk), "FILL_BUCKET": configs.fill_bucket(batch * hq * max(sq, sk)),
        "ARCH": arch_of(q),
        "IS_FP8": fp8, "EXACT_CAST": fp8 and configs.interpreting(), "stride_dsb": t["QDescale"].stride(0) if fp8 else None,
        "MMA_ORDER": bool(fp8 and mma_order),
    }
    dk_out, dv_out = t["DK"], t["DV"]
    if split > 1:
        dkb, dks, dkh = _s3(dk_out[0], varlen)
        dvb, dvs, dvh = _s3(dv_out[0], varlen)
        dkp, dvp = dk_out.stride(0), dv_out.stride(0)
    else:
        dkb, dks, dkh = _s3(dk_out, varlen)
        dvb, dvs, dvh = _s3(dv_out, varlen)
        dkp = dvp = 0
    # the warp-specialised Gluon kernels where configs.BWD_GLUON (or FLASH_ATTN_BWD=gluon) says
    if atomic and fused is not None:
        gluon = {"fused": fused}
    else:
        gluon = configs.gluon_bwd(q, k, v, do, out, lse, causal=causal, window_left=window_left, window_right=right,
                                  softcap=softcap, varlen=varlen, fp8=fp8, atomic=atomic)
    if causal and gluon:  # (persistent launches with few causal tiles an SM: heaviest tiles first)
        gluon = _persistent_filled(gluon, q, k, split)
    if "dq" in gluon:  # dQ and delta on the Gluon kernel, before dK / dV as below
        from .bwd_gluon import dq_launch

        done["dq"] = dq_launch(q, k, v, do, out, lse, t["Delta"], t["DQ"], softmax_scale, causal, **gluon["dq"])
    elif not atomic:
        # split: the dQ kernel runs first (it also computes delta), then dK/dV. Deterministic.
        dqb, dqs, dqh = _s3(t["DQ"], varlen)
        dq_args = dict(common, stride_dqb=dqb, stride_dqs=dqs, stride_dqh=dqh, stride_ob=sob, stride_os=sos,
                       stride_oh=soh, num_heads=hq, RESIDENT_N=False, FUSE_DELTA=True,
                       **_t3("stride_kt", t.get("KT"), fp8))
        done["dq"] = configs.launch(
            _bwd_dq_kernel, _bwd_dq_tuned, configs.BWD_SPACE, configs.prune_bwd,
            lambda bm, bn: (triton.cdiv(sq, bm), batch * hq),
            dict({n: t.get(n) for n in ("Q", "K", "V", "DO", "Out", "Lse", "Delta", "DQ", "CuSeqQ", "CuSeqK", "KT",
                                        "QDescale", "KDescale", "VDescale", "DODescale", "DSDescale", "DQDescale",
                                        "ODescale")}, **dq_args))
    dq_acc = t["DQacc"]
    dqab, dqas, dqah = _s3(dq_acc, varlen) if atomic else (0, 0, 0)
    dkdv_args = dict(common, stride_dkb=dkb, stride_dks=dks, stride_dkh=dkh,
                     stride_dvb=dvb, stride_dvs=dvs, stride_dvh=dvh, num_kv_heads=hk, RESIDENT_N=True,
                     stride_dqab=dqab, stride_dqas=dqas, stride_dqah=dqah, ATOMIC_DQ=atomic,
                     stride_dkp=dkp, stride_dvp=dvp, group_split=split,
                     **_t3("stride_qt", t.get("QT"), fp8), **_t3("stride_dot", t.get("DOT"), fp8))
    if "fused" in gluon:  # the fused Gluon backward (configs.BWD_GLUON_FUSED): dK / dV, dQ added into DQacc
        from .bwd_gluon import dkdv_launch

        kw = dict(gluon["fused"])
        if kw.pop("ordered", False):  # each dQ tile's adds in a fixed order (bitwise reproducible)
            kw.update(dq_order=t["Sem"], last_first=True)
        done["dkdv"] = dkdv_launch(q, k, v, do, lse, t["Delta"], dk_out, dv_out, softmax_scale, causal, split,
                                   dq_acc=dq_acc, **kw)
    elif "dkdv" in gluon and d == 256:  # hd 256's Gluon dK / dV kernel (the head dim split between its consumers)
        from .bwd_gluon_hd256 import dkdv256_launch

        done["dkdv"] = dkdv256_launch(q, k, v, do, lse, t["Delta"], dk_out, dv_out, softmax_scale, causal, split,
                                      **gluon["dkdv"])
    elif "dkdv" in gluon:  # the warp-specialised Gluon dK / dV kernel (configs.BWD_GLUON), the same outputs
        from .bwd_gluon import dkdv_launch

        if t.get("Count") is not None:  # (its own sum of the split: no _sum_partials launch below)
            summed = (t["Count"], t["DKsum"], t["DVsum"])
        done["dkdv"] = dkdv_launch(q, k, v, do, lse, t["Delta"], dk_out, dv_out, softmax_scale, causal, split,
                                   split_sum=summed, **gluon["dkdv"])
    else:
        done["dkdv"] = configs.launch(
            _bwd_dkdv_kernel, _bwd_dkdv_tuned, configs.BWD_SPACE, configs.prune_bwd,
            lambda bm, bn: (triton.cdiv(sk, bn), batch * hk * split),
            dict({n: t.get(n) for n in ("Q", "K", "V", "DO", "Lse", "Delta", "DK", "DV", "DQacc", "CuSeqQ", "CuSeqK",
                                        "QT", "DOT", "QDescale", "KDescale", "VDescale", "DODescale", "DSDescale",
                                        "DKDescale", "DVDescale")},
                 **dkdv_args))
    # dQ from its fp32 buffer (atomic), once every partial is in (the same stream: after dK / dV's kernel); under a
    # group split, by the sum's launch (its programs after dK's and dV's): one launch fewer
    nq = t["DQ"].numel()
    unscaled = bool(gluon.get("fused", {}).get("dq_unscaled"))  # the fused kernel left the softmax scale here
    if split > 1 and summed is None:
        nk, nv = k.numel(), v.numel()
        cast = bool(atomic)
        grid = (triton.cdiv(nk, SUM_BLOCK) + triton.cdiv(nv, SUM_BLOCK) + (triton.cdiv(nq, SUM_BLOCK) if cast else 0),)
        scaled = fp8 and t["DKsum"].dtype.itemsize == 1  # FP8 gradients: written over their descales
        kwargs = dict({n: t.get(n) for n in ("PK", "PV", "DKsum", "DVsum", "DKDescale", "DVDescale", "DQacc", "DQ")},
                      numel_k=nk, numel_v=nv, split=split, per_batch_k=nk // batch, per_batch_v=nv // batch,
                      head_dim=d, head_dim_v=dv_dim, heads_k=hk, stride_dsb=common["stride_dsb"],
                      numel_q=nq if cast else 0, scale=float(softmax_scale), BLOCK=SUM_BLOCK, SCALED=scaled,
                      EXACT_CAST=scaled and configs.interpreting(), CAST_DQ=cast, SCALE_DQ=cast and unscaled)
        done["sum"] = launcher.launch(_sum_partials, grid, kwargs)
    elif atomic:
        done["cast"] = launcher.launch(_cast_dq, (triton.cdiv(nq, SUM_BLOCK),),
                                       dict(DQacc=t["DQacc"], DQ=t["DQ"], numel=nq, scale=float(softmax_scale),
                                            BLOCK=SUM_BLOCK, SCALE=unscaled))
    return done


def _t3(prefix: str, t, fp8: bool) -> dict:
    """The (batch, head, row) strides of a sequence-contiguous FP8 copy ([B, H, D, S]) under ``prefix``
    (``stride_qt`` -> stride_qtb, stride_qth, stride_qtd); None where there is none (not FP8: constexprs)."""
    strides = t.stride()[:3] if fp8 else (None, None, None)
    return dict(zip((prefix + "b", prefix + "h", prefix + "d"), strides))
