"""Chunked linear attention with a scalar per-head decay: Triton kernels, launchers, autograd.

Per (batch, head):  S_t = exp(g_t) S_{t-1} + k_t^T v_t,  o_t = scale * q_t S_t.

Chunk algorithm (chunk of BT rows, b = cumsum of g *within the chunk*, so every exponent below is
a difference of two partial sums of one chunk and is <= 0 for a log-decay: nothing overflows, at
any T and any decay strength):
    o     = scale * ( (q S) * exp(b)[:, None] + ((q k^T) * M) v ),   M_ij = exp(b_i - b_j), i >= j
    S_new = exp(b_last) S + (k * exp(b_last - b)[:, None])^T v

Forward: one program per (batch, head, block of V columns) walks the chunks in order, the state
S [K, BV] in fp32 registers; nothing but o (and the final state) is written.

Backward, recompute-based (no per-chunk states are stored, so the saved activations are just the
inputs): one launch runs independent programs side by side,
  - the dq walk, forwards: dq = scale * ((do S^T) * exp(b) + ((do v^T) * M) k). This is the
    forward recurrence with (q, k, v) -> (do, v, k) and the state S^T, so it is the same code;
  - walks backwards with dS (the gradient of the state after a chunk):
        dv = scale * ((k q^T) * M^T) do + (k dS) * exp(b_last - b)
        dk = scale * ((v do^T) * M^T) q + (v dS^T) * exp(b_last - b)
        dS <- exp(b_last) dS + scale * (q * exp(b))^T do          (dS at t=0 is dh0)
    either one walk for both with all of dS (small K x V), or split (configs.bwd_plan): dv walks
    holding dS[:, V block] and dk walks holding dS[K block, :], each output complete.
Gate gradient (only when g requires grad): dL/dG_t = q_t.dq_t - k_t.dk_t summed the right way;
_assemble_dg says how it is grouped so that nothing large cancels over the sequence.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .. import launcher
from . import configs as cfg

# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _minus(x, x_lo, y, y_lo, EXACT: tl.constexpr):
    """x - y for log-decays given as (fp32 value, low part) by _chunk_gate: two close large sums
    subtract exactly in fp32 (Sterbenz), and the low parts add back what their rounding dropped."""
    d = x - y
    if EXACT:
        d += x_lo - y_lo
    return d


@triton.jit
def _decay_ji(b_b, b_bl, m_t, EXACT: tl.constexpr):
    """The backward walks' intra-chunk decay at [j, i]: exp(b_i - b_j) where i >= j (m_t), else 0
    (masked before exp: b_i - b_j > 0 above the diagonal could overflow)."""
    b_seg = _minus(b_b[None, :], b_bl[None, :], b_b[:, None], b_bl[:, None], EXACT)
    return tl.exp(tl.where(m_t, b_seg, float("-inf")))


@triton.jit
def _rows(base, T, D: tl.constexpr, H, BT: tl.constexpr, BD: tl.constexpr, TMA: tl.constexpr):
    """One head's [T, D] rows (H*D apart) as _tile/_put read and write them in [BT, BD] tiles: with
    TMA a tensor descriptor (the copy engine moves the tiles, zero-fills past T on loads and clips
    stores), else the base pointer (block pointers, cp.async loads). Made once, before a walk."""
    if TMA:
        return tl.make_tensor_descriptor(base, shape=[T, D], strides=[H * D, 1], block_shape=[BT, BD])
    else:
        return base


@triton.jit
def _tile(rows, t0, c0, T, D: tl.constexpr, H, BT: tl.constexpr, BD: tl.constexpr, TMA: tl.constexpr):
    """The [BT, BD] tile at row t0, column c0 of _rows' view (rows past T read 0)."""
    if TMA:
        return rows.load([t0, c0])
    else:
        return tl.load(tl.make_block_ptr(rows, (T, D), (H * D, 1), (t0, c0), (BT, BD), (1, 0)), boundary_check=(0,))


@triton.jit
def _put(rows, t0, c0, x, T, D: tl.constexpr, H, BT: tl.constexpr, BD: tl.constexpr, TMA: tl.constexpr):
    """Store x as the [BT, BD] tile at (t0, c0) of _rows' view, in its dtype (rows past T dropped)."""
    if TMA:
        rows.store([t0, c0], x.to(rows.dtype))
    else:
        p = tl.make_block_ptr(rows, (T, D), (H * D, 1), (t0, c0), (BT, BD), (1, 0))
        tl.store(p, x.to(p.dtype.element_ty), boundary_check=(0,))


@triton.jit
def _chunk_gate(g, g_gamma, i_b, i_h, t0, T, H: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr,
                EXACT: tl.constexpr):
    """Chunk-local cumulative log-decay b [BT] and its value at the chunk's last valid row, each as
    (fp32 value, low part). With EXACT (fp32 inputs) the sum runs in fp64 and the low part keeps
    what rounding it to fp32 dropped: at strong decay b reaches -500 in a chunk, where one fp32
    ulp is 3e-5, and b_i - b_j of two such sums would carry that as a relative error of the decay
    (12x the fp32 reference's error, measured on an H100). Without EXACT the low parts are 0."""
    o_t = tl.arange(0, BT)
    n_valid = tl.minimum(T - t0, BT)
    if GATE == 1:
        b_g = tl.load(g + (i_b * T + t0 + o_t).to(tl.int64) * H + i_h, mask=t0 + o_t < T, other=0.0)
        # b at the last valid row, bit for bit: a separately rounded sum would leave
        # exp(b_last - b_last') != 1 on the chunk's most weighted row (1e-5 off at strong decay)
        last = o_t == n_valid - 1
        if EXACT:
            b_b64 = tl.cumsum(b_g.to(tl.float64), axis=0)
            b_b = b_b64.to(tl.float32)
            b_lo = (b_b64 - b_b.to(tl.float64)).to(tl.float32)
            b_last_lo = tl.sum(tl.where(last, b_lo, 0.0), axis=0)
        else:
            b_b = tl.cumsum(b_g.to(tl.float32), axis=0)
        b_last = tl.sum(tl.where(last, b_b, 0.0), axis=0)
    else:
        gam = tl.load(g_gamma + i_h)
        if EXACT:  # exact in fp64 (an integer times an fp32), then split
            b_b64 = tl.minimum(o_t + 1, n_valid).to(tl.float64) * gam.to(tl.float64)
            b_b = b_b64.to(tl.float32)
            b_lo = (b_b64 - b_b.to(tl.float64)).to(tl.float32)
            b_last64 = n_valid.to(tl.float64) * gam.to(tl.float64)
            b_last = b_last64.to(tl.float32)
            b_last_lo = (b_last64 - b_last.to(tl.float64)).to(tl.float32)
        else:
            b_b = tl.minimum(o_t + 1, n_valid).to(tl.float32) * gam.to(tl.float32)
            b_last = n_valid.to(tl.float32) * gam.to(tl.float32)
    if not EXACT:
        b_lo = tl.zeros([BT], dtype=tl.float32)
        b_last_lo = 0.0
    return b_b, b_lo, b_last, b_last_lo


@triton.jit
def _fwd_walk(
    q, k, v, g, g_gamma, h0, o, ht, x, rdot,
    scale, T, i_v, i_b, i_h, s_h0k, s_h0v,
    H: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, ROW_DOT: tl.constexpr,
    PREC: tl.constexpr, NT_INTERP: tl.constexpr, DECAY_V: tl.constexpr, TMA: tl.constexpr,
):
    """o[:, block i_v] for one (batch, head): q, k [T, KD], v, o [T, VD] rows H*dim apart.
    TMA: tiles through tensor descriptors (see _rows).
    ROW_DOT (the dq walk when g needs a gradient): also adds the inter-chunk q.dq term
    scale * exp(b) * rowsum((q S) * x) into rdot[0] [B, T, H], keeps S exact to fp32, and
    stores the final state for <S_T, dS_T> (see _assemble_dg)."""
    i_bh = i_b * H + i_h
    row0 = (i_b * T * H + i_h).to(tl.int64)
    EXACT: tl.constexpr = q.dtype.element_ty == tl.float32  # fp32 inputs: see _chunk_gate
    r_q = _rows(q + row0 * KD, T, KD, H, BT, KD, TMA)
    r_k = _rows(k + row0 * KD, T, KD, H, BT, KD, TMA)
    r_v = _rows(v + row0 * VD, T, VD, H, BT, BV, TMA)
    r_o = _rows(o + row0 * VD, T, VD, H, BT, BV, TMA)
    if ROW_DOT:
        r_x = _rows(x + row0 * VD, T, VD, H, BT, BV, TMA)
    o_t = tl.arange(0, BT)
    o_kd = tl.arange(0, KD)
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = o_t[:, None] >= o_t[None, :]

    b_S = tl.zeros([KD, BV], dtype=tl.float32)
    if USE_H0:
        p_h0 = h0 + i_bh.to(tl.int64) * KD * VD + o_kd[:, None] * s_h0k + o_v[None, :] * s_h0v
        b_S += tl.load(p_h0).to(tl.float32)

    for i_t in range(NT_INTERP if NT_INTERP > 0 else tl.cdiv(T, BT)):
        t0 = i_t * BT
        b_q = _tile(r_q, t0, 0, T, KD, H, BT, KD, TMA)
        b_k = _tile(r_k, t0, 0, T, KD, H, BT, KD, TMA)
        b_v = _tile(r_v, t0, i_v * BV, T, VD, H, BT, BV, TMA)
        dt = b_q.dtype

        b_A = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
        b_Shi = b_S.to(dt)
        b_o = tl.dot(b_q, b_Shi, input_precision=PREC)
        if ROW_DOT:
            # inter-chunk part of the gate gradient's q.dq term, with the state's low half too
            # (fp32-accurate: these terms cancel against k.dk ones over the sequence)
            b_lo = tl.dot(b_q, (b_S - b_Shi.to(tl.float32)).to(dt), input_precision=PREC)
            b_x = _tile(r_x, t0, i_v * BV, T, VD, H, BT, BV, TMA).to(tl.float32)
            b_rd = tl.sum((b_o + b_lo) * b_x, axis=1) * scale
        if GATE > 0:
            b_b, b_bl, b_last, b_lastl = _chunk_gate(g, g_gamma, i_b, i_h, t0, T, H, BT, GATE, EXACT)
            # mask before exp: above the diagonal b_i - b_j > 0 could overflow
            b_seg = _minus(b_b[:, None], b_bl[:, None], b_b[None, :], b_bl[None, :], EXACT)
            b_A *= tl.exp(tl.where(m_s, b_seg, float("-inf")))
            b_o *= tl.exp(b_b)[:, None]
            if ROW_DOT:
                b_rd *= tl.exp(b_b)
        else:
            b_A = tl.where(m_s, b_A, 0.0)
        b_o += tl.dot(b_A.to(dt), b_v, input_precision=PREC)
        b_o *= scale
        _put(r_o, t0, i_v * BV, b_o, T, VD, H, BT, BV, TMA)
        if ROW_DOT:
            p_r = rdot + (i_b * T + t0 + o_t).to(tl.int64) * H + i_h
            tl.atomic_add(p_r, b_rd, mask=t0 + o_t < T, sem="relaxed")

        if GATE > 0 and ROW_DOT:
            b_kd32 = b_k * tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))[:, None]
            b_kd = b_kd32.to(dt)
            b_S = tl.dot(tl.trans(b_kd), b_v, b_S * tl.exp(b_last), input_precision=PREC)
            # the gate gradient's terms cancel over the sequence: they need the state exact to
            # fp32, so add what rounding the decayed keys to the input dtype dropped
            b_S = tl.dot(tl.trans((b_kd32 - b_kd.to(tl.float32)).to(dt)), b_v, b_S, input_precision=PREC)
        elif GATE > 0 and DECAY_V:
            # decay the values ([BT, BV]) rather than the keys ([BT, KD]): k stays the operand it was
            # loaded as, and the state accumulates in the tensor cores
            b_vd = (b_v * tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))[:, None]).to(dt)
            b_S = tl.dot(tl.trans(b_k), b_vd, b_S * tl.exp(b_last), input_precision=PREC)
        elif GATE > 0:
            b_kd = (b_k * tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))[:, None]).to(dt)
            b_S = tl.dot(tl.trans(b_kd), b_v, b_S * tl.exp(b_last), input_precision=PREC)
        else:
            b_S = tl.dot(tl.trans(b_k), b_v, b_S, input_precision=PREC)

    if STORE_HT:
        # same layout as h0 (the dq walk stores its exact S^T transposed, for the gate gradient)
        p_ht = ht + i_bh.to(tl.int64) * KD * VD + o_kd[:, None] * s_h0k + o_v[None, :] * s_h0v
        tl.store(p_ht, b_S.to(p_ht.dtype.element_ty))


@triton.jit
def _dkv_walk(
    q, k, v, g, g_gamma, do, dht, dk, dv, dh0, rdot,
    scale, T, i_b, i_h, s_r,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    GATE: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, ROW_DOT: tl.constexpr,
    PREC: tl.constexpr, NT_INTERP: tl.constexpr, TMA: tl.constexpr,
):
    """dk and dv for one (batch, head), walking the chunks backwards with the whole state
    gradient dS [K, V] in fp32 registers (small K x V only: see SPLIT in _bwd_kernel)."""
    BV: tl.constexpr = V
    i_v = 0
    i_bh = i_b * H + i_h
    row0 = (i_b * T * H + i_h).to(tl.int64)
    EXACT: tl.constexpr = q.dtype.element_ty == tl.float32  # fp32 inputs: see _chunk_gate
    r_q = _rows(q + row0 * K, T, K, H, BT, K, TMA)
    r_k = _rows(k + row0 * K, T, K, H, BT, K, TMA)
    r_v = _rows(v + row0 * V, T, V, H, BT, V, TMA)
    r_do = _rows(do + row0 * V, T, V, H, BT, V, TMA)
    r_dv = _rows(dv + row0 * V, T, V, H, BT, V, TMA)
    r_dk = _rows(dk + row0 * K, T, K, H, BT, K, TMA)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_t[None, :] >= o_t[:, None]  # [j, i]: i >= j

    b_dS = tl.zeros([K, BV], dtype=tl.float32)
    if USE_DHT:
        b_dS += tl.load(dht + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]).to(tl.float32)

    NT = tl.cdiv(T, BT)
    for i in range(NT_INTERP if NT_INTERP > 0 else tl.cdiv(T, BT)):
        t0 = (NT - 1 - i) * BT
        b_q = _tile(r_q, t0, 0, T, K, H, BT, K, TMA)
        b_k = _tile(r_k, t0, 0, T, K, H, BT, K, TMA)
        b_v = _tile(r_v, t0, 0, T, V, H, BT, V, TMA)
        b_do = _tile(r_do, t0, 0, T, V, H, BT, V, TMA)
        dt = b_q.dtype

        b_Akq = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * scale  # [j, i]
        b_Avd = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)  # [j, i]
        b_dSc = b_dS.to(dt)
        b_dv = tl.dot(b_k, b_dSc, input_precision=PREC)  # [BT, BV]
        b_dk = tl.dot(b_v, tl.trans(b_dSc), input_precision=PREC)  # [BT, K]
        if GATE > 0:
            b_b, b_bl, b_last, b_lastl = _chunk_gate(g, g_gamma, i_b, i_h, t0, T, H, BT, GATE, EXACT)
            b_M = _decay_ji(b_b, b_bl, m_t, EXACT)
            b_Akq *= b_M
            b_dec = tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))
            if ROW_DOT:
                # gate gradient, this walk's share (see _assemble_dg): for each row t, the pairs
                # j < t <= i inside the chunk, sum_{i >= t} sum_{j < t} W_ij with
                # W = scale M (q k^T)(do v^T) in fp32, a masked sum with nothing cancelling;
                # and k.dk's inter-chunk part per row, with the state gradient's low half too.
                b_W = b_Akq * b_Avd  # [j, i]
                b_Wx = tl.cumsum(b_W, axis=0) - b_W  # [t, i] = sum_{j < t} W[j, i]
                b_loc = tl.sum(tl.where(m_t, b_Wx, 0.0), axis=1)  # over i >= t
                b_lo = tl.dot(b_k, (b_dS - b_dSc.to(tl.float32)).to(dt), input_precision=PREC)
                b_ku = tl.sum((b_dv + b_lo) * b_v.to(tl.float32), axis=1) * b_dec
                p_r = rdot + (i_b * T + t0 + o_t).to(tl.int64) * H + i_h
                m_r = t0 + o_t < T
                tl.atomic_add(p_r + s_r, b_loc, mask=m_r, sem="relaxed")
                tl.atomic_add(p_r + 2 * s_r, b_ku, mask=m_r, sem="relaxed")
            b_Avd *= b_M * scale
            b_dv *= b_dec[:, None]
            b_dk *= b_dec[:, None]
        else:
            b_Akq = tl.where(m_t, b_Akq, 0.0)
            b_Avd = tl.where(m_t, b_Avd * scale, 0.0)
        b_dv += tl.dot(b_Akq.to(dt), b_do, input_precision=PREC)
        b_dk += tl.dot(b_Avd.to(dt), b_q, input_precision=PREC)

        _put(r_dv, t0, 0, b_dv, T, V, H, BT, V, TMA)
        _put(r_dk, t0, 0, b_dk, T, K, H, BT, K, TMA)

        if GATE > 0:
            b_qd32 = b_q * (scale * tl.exp(b_b))[:, None]
            b_qd = b_qd32.to(dt)
            b_dS = b_dS * tl.exp(b_last) + tl.dot(tl.trans(b_qd), b_do, input_precision=PREC)
            if ROW_DOT:  # exact to fp32, as the dq walk's state
                b_dS += tl.dot(tl.trans((b_qd32 - b_qd.to(tl.float32)).to(dt)), b_do, input_precision=PREC)
        else:
            b_dS += scale * tl.dot(tl.trans(b_q), b_do, input_precision=PREC)

    if STORE_DH0:
        p_dh0 = dh0 + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]
        tl.store(p_dh0, b_dS.to(p_dh0.dtype.element_ty))


@triton.jit
def _dv_walk(
    q, k, v, g, g_gamma, do, dht, dv, dh0, rdot,
    scale, T, i_v, i_b, i_h, s_r,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, ROW_DOT: tl.constexpr,
    PREC: tl.constexpr, NT_INTERP: tl.constexpr, TMA: tl.constexpr,
):
    """dv[:, block i_v] (and dh0's columns, and the gate gradient's walk terms) for one (batch,
    head), backwards with dS[:, block] [K, BV]: the split form of _dkv_walk for large K x V."""
    i_bh = i_b * H + i_h
    row0 = (i_b * T * H + i_h).to(tl.int64)
    EXACT: tl.constexpr = q.dtype.element_ty == tl.float32  # fp32 inputs: see _chunk_gate
    r_q = _rows(q + row0 * K, T, K, H, BT, K, TMA)
    r_k = _rows(k + row0 * K, T, K, H, BT, K, TMA)
    r_do = _rows(do + row0 * V, T, V, H, BT, BV, TMA)
    r_dv = _rows(dv + row0 * V, T, V, H, BT, BV, TMA)
    if ROW_DOT:
        r_v = _rows(v + row0 * V, T, V, H, BT, BV, TMA)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    m_t = o_t[None, :] >= o_t[:, None]  # [j, i]: i >= j

    b_dS = tl.zeros([K, BV], dtype=tl.float32)
    if USE_DHT:
        b_dS += tl.load(dht + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]).to(tl.float32)

    NT = tl.cdiv(T, BT)
    for i in range(NT_INTERP if NT_INTERP > 0 else tl.cdiv(T, BT)):
        t0 = (NT - 1 - i) * BT
        b_q = _tile(r_q, t0, 0, T, K, H, BT, K, TMA)
        b_k = _tile(r_k, t0, 0, T, K, H, BT, K, TMA)
        b_do = _tile(r_do, t0, i_v * BV, T, V, H, BT, BV, TMA)
        dt = b_q.dtype

        b_Akq = tl.dot(b_k, tl.trans(b_q), input_precision=PREC) * scale  # [j, i]
        b_dSc = b_dS.to(dt)
        b_dv = tl.dot(b_k, b_dSc, input_precision=PREC)  # [BT, BV]
        if GATE > 0:
            b_b, b_bl, b_last, b_lastl = _chunk_gate(g, g_gamma, i_b, i_h, t0, T, H, BT, GATE, EXACT)
            b_M = _decay_ji(b_b, b_bl, m_t, EXACT)
            b_Akq *= b_M
            b_dec = tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))
            if ROW_DOT:  # as in _dkv_walk, over this block of V (the terms add up over blocks)
                b_v = _tile(r_v, t0, i_v * BV, T, V, H, BT, BV, TMA)
                b_W = b_Akq * tl.dot(b_v, tl.trans(b_do), input_precision=PREC)  # [j, i]
                b_Wx = tl.cumsum(b_W, axis=0) - b_W
                b_loc = tl.sum(tl.where(m_t, b_Wx, 0.0), axis=1)
                b_lo = tl.dot(b_k, (b_dS - b_dSc.to(tl.float32)).to(dt), input_precision=PREC)
                b_ku = tl.sum((b_dv + b_lo) * b_v.to(tl.float32), axis=1) * b_dec
                p_r = rdot + (i_b * T + t0 + o_t).to(tl.int64) * H + i_h
                m_r = t0 + o_t < T
                tl.atomic_add(p_r + s_r, b_loc, mask=m_r, sem="relaxed")
                tl.atomic_add(p_r + 2 * s_r, b_ku, mask=m_r, sem="relaxed")
            b_dv *= b_dec[:, None]
        else:
            b_Akq = tl.where(m_t, b_Akq, 0.0)
        b_dv += tl.dot(b_Akq.to(dt), b_do, input_precision=PREC)
        _put(r_dv, t0, i_v * BV, b_dv, T, V, H, BT, BV, TMA)

        if GATE > 0:
            b_qd32 = b_q * (scale * tl.exp(b_b))[:, None]
            b_qd = b_qd32.to(dt)
            b_dS = b_dS * tl.exp(b_last) + tl.dot(tl.trans(b_qd), b_do, input_precision=PREC)
            if ROW_DOT:
                b_dS += tl.dot(tl.trans((b_qd32 - b_qd.to(tl.float32)).to(dt)), b_do, input_precision=PREC)
        else:
            b_dS += scale * tl.dot(tl.trans(b_q), b_do, input_precision=PREC)

    if STORE_DH0:
        p_dh0 = dh0 + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]
        tl.store(p_dh0, b_dS.to(p_dh0.dtype.element_ty))


@triton.jit
def _dk_walk(
    q, v, g, g_gamma, do, dht, dk,
    scale, T, i_k, i_b, i_h,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    GATE: tl.constexpr, USE_DHT: tl.constexpr, PREC: tl.constexpr, NT_INTERP: tl.constexpr, TMA: tl.constexpr,
):
    """dk[:, block i_k] for one (batch, head), backwards with dS[block, :] [BK, V]: complete, as
    dk sums over V only through v dS^T and (v do^T), both whole here."""
    i_bh = i_b * H + i_h
    row0 = (i_b * T * H + i_h).to(tl.int64)
    EXACT: tl.constexpr = q.dtype.element_ty == tl.float32  # fp32 inputs: see _chunk_gate
    r_q = _rows(q + row0 * K, T, K, H, BT, BK, TMA)
    r_v = _rows(v + row0 * V, T, V, H, BT, V, TMA)
    r_do = _rows(do + row0 * V, T, V, H, BT, V, TMA)
    r_dk = _rows(dk + row0 * K, T, K, H, BT, BK, TMA)
    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = tl.arange(0, V)
    m_t = o_t[None, :] >= o_t[:, None]  # [j, i]: i >= j

    b_dS = tl.zeros([BK, V], dtype=tl.float32)
    if USE_DHT:
        b_dS += tl.load(dht + i_bh.to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :]).to(tl.float32)

    NT = tl.cdiv(T, BT)
    for i in range(NT_INTERP if NT_INTERP > 0 else tl.cdiv(T, BT)):
        t0 = (NT - 1 - i) * BT
        b_q = _tile(r_q, t0, i_k * BK, T, K, H, BT, BK, TMA)
        b_v = _tile(r_v, t0, 0, T, V, H, BT, V, TMA)
        b_do = _tile(r_do, t0, 0, T, V, H, BT, V, TMA)
        dt = b_q.dtype

        b_Avd = tl.dot(b_v, tl.trans(b_do), input_precision=PREC)  # [j, i]
        b_dk = tl.dot(b_v, tl.trans(b_dS.to(dt)), input_precision=PREC)  # [BT, BK]
        if GATE > 0:
            b_b, b_bl, b_last, b_lastl = _chunk_gate(g, g_gamma, i_b, i_h, t0, T, H, BT, GATE, EXACT)
            b_Avd *= _decay_ji(b_b, b_bl, m_t, EXACT) * scale
            b_dk *= tl.exp(_minus(b_last, b_lastl, b_b, b_bl, EXACT))[:, None]
        else:
            b_Avd = tl.where(m_t, b_Avd * scale, 0.0)
        b_dk += tl.dot(b_Avd.to(dt), b_q, input_precision=PREC)
        _put(r_dk, t0, i_k * BK, b_dk, T, K, H, BT, BK, TMA)

        if GATE > 0:
            b_qd = (b_q * (scale * tl.exp(b_b))[:, None]).to(dt)
            b_dS = b_dS * tl.exp(b_last) + tl.dot(tl.trans(b_qd), b_do, input_precision=PREC)
        else:
            b_dS += scale * tl.dot(tl.trans(b_q), b_do, input_precision=PREC)


@triton.jit(do_not_specialize=["T"])
def _fwd_kernel(
    q, k, v, g, g_gamma, h0, o, ht, x, rdot,
    scale, T, TB, s_h0k, s_h0v,
    H: tl.constexpr, KD: tl.constexpr, VD: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, ROW_DOT: tl.constexpr,
    PREC: tl.constexpr, NT_INTERP: tl.constexpr, DECAY_V: tl.constexpr, TMA: tl.constexpr,
):
    # TB (a power-of-two bucket of T) is only an autotune key. Adjacent programs share a head, so the q/k tiles re-read per V block come from L2
    NV: tl.constexpr = VD // BV
    pid = tl.program_id(0)
    i_v, i_bh = pid % NV, pid // NV
    _fwd_walk(q, k, v, g, g_gamma, h0, o, ht, x, rdot, scale, T, i_v, i_bh // H, i_bh % H,
              s_h0k, s_h0v, H, KD, VD, BT, BV, GATE, USE_H0, STORE_HT, ROW_DOT, PREC, NT_INTERP, DECAY_V, TMA)


@triton.jit(do_not_specialize=["T"])
def _bwd_kernel(
    q, k, v, g, g_gamma, h0, do, dht, dq, dk, dv, dh0, rdot, hT,
    scale, T, TB, NBH, s_r,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    SPLIT: tl.constexpr, BV: tl.constexpr, BKD: tl.constexpr, BK: tl.constexpr,
    GATE: tl.constexpr, USE_H0: tl.constexpr, USE_DHT: tl.constexpr, ROW_DOT: tl.constexpr,
    PREC: tl.constexpr, NT_INTERP: tl.constexpr, TMA: tl.constexpr,
):
    # One launch, independent programs, the heaviest first:
    #   SPLIT=0: [0, NBH) dk+dv walks (backwards, whole dS), then NBH*NK dq walks (forwards);
    #   SPLIT=1: NBH*NV dv walks (dS[:, V block]), NBH*NKD dk walks (dS[K block, :]), then the dq
    #            walks: three small states instead of one large, more programs, no partial sums.
    NK: tl.constexpr = K // BK
    NV: tl.constexpr = V // BV
    NKD: tl.constexpr = K // BKD
    pid = tl.program_id(0)
    if SPLIT:
        N1 = NBH * NV
        N2 = N1 + NBH * NKD
    else:
        N1 = NBH
        N2 = NBH
    if pid < N1:
        if SPLIT:
            i_v, i_bh = pid % NV, pid // NV
            _dv_walk(q, k, v, g, g_gamma, do, dht, dv, dh0, rdot, scale, T, i_v, i_bh // H, i_bh % H, s_r,
                     H, K, V, BT, BV, GATE, USE_DHT, USE_H0, ROW_DOT, PREC, NT_INTERP, TMA)
        else:
            _dkv_walk(q, k, v, g, g_gamma, do, dht, dk, dv, dh0, rdot, scale, T, pid // H, pid % H, s_r,
                      H, K, V, BT, GATE, USE_DHT, USE_H0, ROW_DOT, PREC, NT_INTERP, TMA)
    elif pid < N2:
        pid -= N1
        i_k, i_bh = pid % NKD, pid // NKD
        _dk_walk(q, v, g, g_gamma, do, dht, dk, scale, T, i_k, i_bh // H, i_bh % H,
                 H, K, V, BT, BKD, GATE, USE_DHT, PREC, NT_INTERP, TMA)
    else:
        pid -= N2
        i_k, i_bh = pid % NK, pid // NK
        # dq is the forward walk over (do, v, k) with state S^T [V, K]: h0^T via swapped strides;
        # with the gate gradient it also stores its final state, exact to fp32, for <S_T, dS_T>
        _fwd_walk(do, v, k, g, g_gamma, h0, dq, hT, q, rdot, scale, T, i_k, i_bh // H, i_bh % H,
                  1, V, H, V, K, BT, BK, GATE, USE_H0, ROW_DOT, ROW_DOT, PREC, NT_INTERP, False, TMA)


def _zero_rdot(nargs, reset_only=False):
    # the row dots are accumulated with atomics: every autotune trial must start from zero
    if nargs.get("rdot") is not None:
        nargs["rdot"].zero_()


if not cfg.INTERPRET:
    _fwd_kernel_tuned = triton.autotune(
        configs=cfg.fwd_configs(), key=["TB", "H", "KD", "VD", "BT", "GATE", "USE_H0", "STORE_HT", "DECAY_V", "TMA"],
        prune_configs_by={"early_config_prune": cfg.prune_by_resources},
        cache_results=True,  # winners kept in Triton's cache dir: other processes reuse them
    )(_fwd_kernel)
    _bwd_kernel_tuned = triton.autotune(
        configs=cfg.bwd_configs(), key=["TB", "H", "K", "V", "BT", "SPLIT", "BV", "BKD", "BK", "GATE", "USE_H0", "USE_DHT", "ROW_DOT", "TMA"],
        prune_configs_by={"early_config_prune": cfg.prune_bwd}, pre_hook=_zero_rdot, cache_results=True,
    )(_bwd_kernel)

# ---------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------


def _prec(dtype: torch.dtype) -> str:
    # fp32 inputs need fp32-accurate products (plain tf32 costs ~1e-3 relative error, 1000x the
    # reference's); the interpreter computes exactly, the GPU uses configs.FP32_DOT_PRECISION
    if dtype != torch.float32:
        return "tf32"  # ignored for 16-bit operands
    return "ieee" if cfg.INTERPRET else cfg.FP32_DOT_PRECISION


def _nt_interp(T: int, BT: int) -> int:
    # The interpreter (triton 3.6 with numpy >= 2.4) cannot take a run-time loop bound: int() of its
    # one-element arrays raises. There the chunk count is a compile-time constant; on the GPU it is 0,
    # meaning "use the run-time count", so one compiled kernel serves every T.
    return triton.cdiv(T, BT) if cfg.INTERPRET else 0


def _t_bucket(T: int) -> int:
    # the best config moves with T (launch-bound at 1k, latency per step at 16k): tune per
    # power-of-two bucket, not per T, so varying lengths do not retune every call
    return min(triton.next_power_of_2(T), 1 << 16)


def _use_tma(flag: bool, *tiles: torch.Tensor) -> bool:
    """Whether a launch takes its tiles through tensor descriptors: configs.FWD_TMA / BWD_TMA, on
    hardware with the copy engine for them (sm_90+), for head dims up to configs.TMA_MAX_DIM, and
    when every tiled tensor starts on a 16-byte boundary, as the copy engine requires (a contiguous view can start anywhere: x[1:] of a flat
    buffer); else block pointers. The interpreter runs either path. Descriptors made inside a
    kernel need a little global scratch per launch from Triton's allocator: one backed by torch's
    caching allocator (stream-ordered, in a CUDA graph's pool when captured) is installed unless
    the caller has set their own."""
    if not flag or any(t.data_ptr() % 16 for t in tiles) or max(t.shape[-1] for t in tiles) > cfg.TMA_MAX_DIM:
        return False
    if cfg.INTERPRET:
        return True
    if torch.cuda.get_device_capability(tiles[0].device)[0] < 9:
        return False
    launcher.ensure_allocator()
    return True


def _gate_args(g, g_gamma):
    if g is not None:
        return g, g, 1
    if g_gamma is not None:
        return g_gamma, g_gamma, 2
    return None, None, 0


def _assemble_dg(rdot, ht, dht, BT):
    """dg_t for t in chunk c: the sum of every loss term whose decay spans step t, grouped by where
    its key s and query r lie (s < t <= r):
      both in chunk c                  rdot[1] (the kernel's masked sum)
      s before c, r in c, r >= t       reverse cumsum within the chunk of rdot[0] (q.dq inter)
      s in c, s < t, r after c         exclusive cumsum within the chunk of rdot[2] (k.dk inter)
      s before c, r after c            P_c - KU_c, P_c = <S_c, dS_c> at the chunk's end
    P_c is not at hand (the walks never meet), so it is telescoped from P_last = <S_T, dS_T>
    over *chunks*: P_{c-1} = P_c + QI_c - KU_c (QI, KU: chunk sums of rdot[0], rdot[2]), in
    float64, so only NT terms cancel, not T rows of q.dq - k.dk. P_last uses the dq walk's
    fp32-exact final state: the forward's (decayed keys rounded to fp16) put a constant
    1e-4-relative error of P_last into every dg_t, 11x the reference's error at T=1000."""
    _, B, T, H = rdot.shape
    NT = triton.cdiv(T, BT)
    r = torch.nn.functional.pad(rdot, (0, 0, 0, NT * BT - T)).view(3, B, NT, BT, H)
    qi, loc, ku = r[0], r[1], r[2]
    QI, KU = qi.double().sum(2), ku.double().sum(2)  # [B, NT, H]
    d = QI - KU
    P = d.flip(1).cumsum(1).flip(1) - d  # sum over later chunks
    if dht is not None and ht is not None:
        P = P + (ht.double() * dht.double()).sum((-2, -1))[:, None, :]
    span = (P - KU).float()
    dg = loc + qi.flip(2).cumsum(2).flip(2) + (ku.cumsum(2) - ku) + span[:, :, None, :]
    return dg.reshape(B, NT * BT, H)[:, :T]


def _run(kernel, tuned, grid_of, kwargs, override, default):
    """Launch ``kernel`` with a forced config (``override``), the default config (interpreter, or
    autotuning off) or autotuned; grid_of(config kwargs) -> grid. Returns the launch's
    :class:`kernels.launcher.Launch` (None where it cannot be replayed: the interpreter, a forced
    config)."""
    if override is not None:
        kernel[grid_of(override)](**kwargs, **override)
        return None
    if cfg.INTERPRET or not cfg.AUTOTUNE:
        grid = grid_of(default)
        compiled = kernel[grid](**kwargs, **default)
        meta = {n: x for n, x in default.items() if n not in ("num_warps", "num_stages")}
        return launcher.launched(kernel, compiled, grid, dict(kwargs, **meta))
    compiled = tuned[lambda meta: grid_of(meta)](**kwargs)
    config = tuned.best_config
    return launcher.launched(kernel, compiled, grid_of(config.kwargs), kwargs, config)


def chunk_linear_attn_fwd(q, k, v, g, g_gamma, scale, initial_state, output_final_state, chunk_size, launches=None):
    """``launches``: a dict this call may replay its launch from and leave it in (kernels/launcher.py);
    the caller keys it on the call's signature."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    gp, gg, GATE = _gate_args(g, g_gamma)
    o = torch.empty_like(v)
    ht = q.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    tensors = {"q": q, "k": k, "v": v, "g": gp, "g_gamma": gg, "h0": initial_state, "o": o, "ht": ht}
    replay = launches.get("fwd") if launches is not None else None
    if replay is not None and replay(tensors):
        return o, ht
    BT = cfg.internal_chunk(chunk_size, K, V)
    args = dict(x=None, rdot=None, scale=scale, T=T, TB=_t_bucket(T), s_h0k=V, s_h0v=1, H=H, KD=K, VD=V, BT=BT,
                GATE=GATE, USE_H0=initial_state is not None, STORE_HT=output_final_state, ROW_DOT=False,
                PREC=_prec(q.dtype), NT_INTERP=_nt_interp(T, BT), DECAY_V=cfg.FWD_DECAY_V,
                TMA=_use_tma(cfg.FWD_TMA, q, k, v, o))
    override = cfg.CONFIG_OVERRIDE.get("fwd") if cfg.CONFIG_OVERRIDE is not None else None
    launch = _run(_fwd_kernel, globals().get("_fwd_kernel_tuned"), lambda c: (B * H * (V // c["BV"]),),
                  dict(tensors, **args), override, cfg.default_fwd_config(K, V, BT))
    if launches is not None and launch is not None:
        launches["fwd"] = launch
    return o, ht


def chunk_linear_attn_bwd(q, k, v, g, g_gamma, scale, initial_state, do, dht, chunk_size, need_dg, launches=None):
    """``launches``: as in :func:`chunk_linear_attn_fwd` (the signature includes dO's and dh_T's)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = cfg.internal_chunk(chunk_size, K, V)
    gp, gg, GATE = _gate_args(g, g_gamma)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dh0 = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32) if initial_state is not None else None
    # gate-gradient rows: [0] q.dq inter-chunk (dq walk), [1] intra-chunk pairs, [2] k.dk inter-chunk
    rdot = torch.zeros(3, B, T, H, device=q.device, dtype=torch.float32) if need_dg else None
    # the forward's final state has the input dtype's rounding of the decayed keys (~1e-4): too
    # coarse for <S_T, dS_T>, which every dg_t holds; the dq walk recomputes it exactly
    hT = torch.empty(B, H, K, V, device=q.device, dtype=torch.float32) if need_dg else None
    tensors = {"q": q, "k": k, "v": v, "g": gp, "g_gamma": gg, "h0": initial_state, "do": do, "dht": dht, "dq": dq,
               "dk": dk, "dv": dv, "dh0": dh0, "rdot": rdot, "hT": hT}
    replay = launches.get("bwd") if launches is not None else None
    if replay is None or not replay(tensors):
        plan = cfg.bwd_plan(K, V, BT)
        NV = V // plan["BV"] if plan["SPLIT"] else 1
        NKD = K // plan["BKD"] if plan["SPLIT"] else 0
        NK = K // plan["BK"]
        args = dict(scale=scale, T=T, TB=_t_bucket(T), NBH=B * H, s_r=B * T * H, H=H, K=K, V=V, BT=BT, **plan,
                    GATE=GATE, USE_H0=initial_state is not None, USE_DHT=dht is not None, ROW_DOT=need_dg,
                    PREC=_prec(q.dtype), NT_INTERP=_nt_interp(T, BT),
                    TMA=_use_tma(cfg.BWD_TMA, q, k, v, do, dq, dk, dv))
        grid = (B * H * (NV + NKD + NK),)
        override = cfg.CONFIG_OVERRIDE.get("bwd") if cfg.CONFIG_OVERRIDE is not None else None
        launch = _run(_bwd_kernel, globals().get("_bwd_kernel_tuned"), lambda c: grid, dict(tensors, **args),
                      override, cfg.default_bwd_config(K, V, BT))
        if launches is not None and launch is not None:
            launches["bwd"] = launch
    dg = _assemble_dg(rdot, hT, dht, BT) if need_dg else None
    return dq, dk, dv, dg, dh0


# ---------------------------------------------------------------------------------------------
# autograd
# ---------------------------------------------------------------------------------------------


def _on_device(t):
    # Triton launches on the current CUDA device: make it the tensors' one
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


class _Signature:
    """What the first call of a signature leaves for the next ones: the checked scale and the kernel
    launches to replay (forward; backward per dO / dh_T layout). See kernels/launcher.py."""

    __slots__ = ("scale", "fwd", "bwd")

    def __init__(self, scale: float):
        self.scale = scale
        self.fwd: dict = {}
        self.bwd: dict = {}


#: call signature -> _Signature: the inputs' shapes, strides, dtypes, devices and 16-byte alignment,
#: the keywords, the module's launch knobs (configs.knobs_key).
_SIGNATURES = launcher.Signatures()


def _tensor_key(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


class ChunkLinearAttnFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, g_gamma, sig, initial_state, output_final_state, chunk_size):
        with _on_device(q):
            o, ht = chunk_linear_attn_fwd(q, k, v, g, g_gamma, sig.scale, initial_state, output_final_state,
                                          chunk_size, launches=sig.fwd)
        # recompute-based backward: the inputs are all it keeps (no per-chunk states)
        ctx.save_for_backward(q, k, v, g, g_gamma, initial_state)
        ctx.sig, ctx.chunk_size = sig, chunk_size
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, g_gamma, initial_state = ctx.saved_tensors
        need_dg = g is not None and ctx.needs_input_grad[3]
        dht = dht.contiguous().float() if dht is not None else None
        do = do.contiguous()
        launches = ctx.sig.bwd.setdefault((_tensor_key(do), _tensor_key(dht), need_dg), {})
        with _on_device(q):
            dq, dk, dv, dg, dh0 = chunk_linear_attn_bwd(
                q, k, v, g, g_gamma, ctx.sig.scale, initial_state, do, dht, ctx.chunk_size, need_dg, launches
            )
        dg_out = dg.to(g.dtype) if dg is not None else None
        if dh0 is not None:
            dh0 = dh0.to(initial_state.dtype)
        return dq, dk, dv, dg_out, None, None, dh0, None, None


# ---------------------------------------------------------------------------------------------
# public function
# ---------------------------------------------------------------------------------------------

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def support_reason(*, K: int, V: int, dtype: torch.dtype, device: torch.device | str,
                   chunk_size: int = 64) -> str | None:
    """None when chunk_linear_attn runs these head dims / dtype / device, else the reason in words
    (for the harness adapter's ``supports``)."""
    dev = torch.device(device)
    if dev.type != "cuda" and not cfg.INTERPRET:
        return f"needs a CUDA device (or TRITON_INTERPRET=1), got {dev}"
    if dtype not in _FLOATS:
        return f"dtype {dtype} not supported (float16, bfloat16, float32)"
    if dtype == torch.bfloat16 and cfg.INTERPRET:
        return "bfloat16 under Triton's interpreter: its bf16 tl.dot multiplies raw bit patterns"
    if K not in cfg.SUPPORTED_DIMS or V not in cfg.SUPPORTED_DIMS:
        return f"head dims K={K}, V={V}: each must be one of {cfg.SUPPORTED_DIMS}"
    if chunk_size not in cfg.SUPPORTED_CHUNKS:
        return f"chunk_size {chunk_size} not one of {cfg.SUPPORTED_CHUNKS}"
    return None


def _check(name, t, shape, like):
    if t.dim() != len(shape) or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device} like q, got {t.device}")


def chunk_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    r"""Chunked linear attention with a scalar per-head decay (FLA ``chunk_simple_gla`` compatible).

    Computes, per batch and head, ``S_t = exp(g_t) S_{t-1} + k_t^T v_t`` and ``o_t = scale * q_t S_t``.

    Args:
        q: queries, ``[B, T, H, K]``, float16 / bfloat16 / float32.
        k: keys, ``[B, T, H, K]``, same dtype and device as q.
        v: values, ``[B, T, H, V]``, same dtype and device as q. K and V in {32, 64, 128, 256}.
        g: per-step log-decay (natural log, normally <= 0), ``[B, T, H]``, any float dtype. Default: None.
        g_gamma: constant per-head log-decay, ``[H]``. At most one of g / g_gamma. Default: None.
        scale: multiplies q.k. Default: ``K ** -0.5``.
        initial_state: ``[B, H, K, V]``, any float dtype (used in fp32). Default: None (zeros).
        output_final_state: also return the final state ``[B, H, K, V]`` in float32. Default: False.
        chunk_size: rows per chunk, one of 16, 32, 64, 128 (only rounding depends on it). Default: 64.

    Returns:
        ``(o, final_state)``: o ``[B, T, H, V]`` in q's dtype; final_state or None.

    Differentiable for q, k, v, g and initial_state (and through final_state). g_gamma is a
    constant, as in FLA: it gets no gradient (its gradient would be a sum over the whole sequence
    of the telescoping q.dq - k.dk terms, too cancellation-prone to be worth a kernel).
    """
    knobs = cfg.knobs_key()
    try:  # a call like an earlier one reuses its checks and launches
        key = (_tensor_key(q), _tensor_key(k), _tensor_key(v), _tensor_key(g), _tensor_key(g_gamma),
               _tensor_key(initial_state), scale, output_final_state, chunk_size, knobs) if knobs else None
    except (AttributeError, TypeError):  # not tensors: the checks below say what is wrong
        key = None
    sig = _SIGNATURES.get(key)
    if sig is None:
        sig = _SIGNATURES.put(key, _Signature(_checked_scale(q, k, v, g, g_gamma, scale, initial_state, chunk_size)))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    g_gamma = g_gamma.contiguous() if g_gamma is not None else None
    initial_state = initial_state.contiguous() if initial_state is not None else None
    if launcher.autograd_needed(q, k, v, g, initial_state):
        return ChunkLinearAttnFunction.apply(q, k, v, g, g_gamma, sig, initial_state, bool(output_final_state),
                                             int(chunk_size))
    # nothing for autograd to record (no grad mode, or no input requiring grad): the forward alone, no node and
    # nothing saved (host time a call, issue 16's budgets)
    with _on_device(q):
        return chunk_linear_attn_fwd(q, k, v, g, g_gamma, sig.scale, initial_state, bool(output_final_state),
                                     int(chunk_size), launches=sig.fwd)


def _checked_scale(q, k, v, g, g_gamma, scale, initial_state, chunk_size) -> float:
    """Every check of chunk_linear_attn's arguments (ValueError naming the argument); the scale."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise ValueError("q, k and v must be tensors")
    if q.dim() != 4:
        raise ValueError(f"q must have shape [B, T, H, K] (rank 4), got rank {q.dim()}")
    B, T, H, K = q.shape
    if v.dim() != 4:
        raise ValueError(f"v must have shape [B, T, H, V] (rank 4), got rank {v.dim()}")
    V = v.shape[-1]
    _check("k", k, (B, T, H, K), q)
    _check("v", v, (B, T, H, V), q)
    if q.dtype not in _FLOATS:
        raise ValueError(f"q must be float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if T < 1 or B < 1 or H < 1:
        raise ValueError(f"q must have shape [B, T, H, K] with B, T, H >= 1, got {list(q.shape)}")
    if K not in cfg.SUPPORTED_DIMS:
        raise ValueError(f"q/k head dim K must be one of {cfg.SUPPORTED_DIMS}, got {K}")
    if V not in cfg.SUPPORTED_DIMS:
        raise ValueError(f"v head dim V must be one of {cfg.SUPPORTED_DIMS}, got {V}")
    if g is not None and g_gamma is not None:
        raise ValueError("give at most one of g ([B, T, H]) and g_gamma ([H]), not both")
    if g is not None:
        _check("g", g, (B, T, H), q)
        if not g.is_floating_point():
            raise ValueError(f"g must be a float tensor of shape [B, T, H], got {g.dtype}")
    if g_gamma is not None:
        _check("g_gamma", g_gamma, (H,), q)
        if not g_gamma.is_floating_point():
            raise ValueError(f"g_gamma must be a float tensor of shape [H], got {g_gamma.dtype}")
    if initial_state is not None:
        _check("initial_state", initial_state, (B, H, K, V), q)
        if not initial_state.is_floating_point():
            raise ValueError(f"initial_state must be a float tensor of shape [B, H, K, V], got {initial_state.dtype}")
    if chunk_size not in cfg.SUPPORTED_CHUNKS:
        raise ValueError(f"chunk_size must be one of {cfg.SUPPORTED_CHUNKS}, got {chunk_size}")
    if q.device.type != "cuda" and not cfg.INTERPRET:
        raise ValueError(f"q must be a CUDA tensor (or run under TRITON_INTERPRET=1), got device {q.device}")
    return float(K ** -0.5 if scale is None else scale)
