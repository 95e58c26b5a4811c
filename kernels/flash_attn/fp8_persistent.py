"""A persistent FP8 forward (experiment, session 18; not routed): one program per resident slot walks
the (query block, batch * head) tiles in a single loop that Triton flattens with the key-block loop
(``tl.range(..., flatten=True)``), so the software pipeline runs across tiles: the next tile's first K /
V^T loads are issued while this tile's last blocks and epilogue run. Tensor descriptors over the whole
tensors are made once per program instead of four per tile. What it is meant to win: the per-tile
set-up the 4k FP8 cells lose to (docs/perf/flash_attn.md, sessions 15 and 18).

Limits (an experiment): dense e4m3 q [B, Sq, H, D], k [B, Sk, Hk, D] (contiguous), V keys-contiguous
``vt`` [B, Hk, D, Sk] (``v_layout.v_keys_contiguous``), bf16 out; no window or softcap; Sq a multiple
of BLOCK_M and Sk of BLOCK_N (the whole-tensor descriptors would otherwise read and write across
sequences). Causal tiles run heaviest first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launcher
from . import configs
from .fwd import _round_to_e4m3

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _fp8_persistent_kernel(Q, K, VT, Out, Lse, QDescale, KDescale, VDescale, stride_dsb, stride_vd,
                           batch, seqlen_q, seqlen_k, num_heads, group, sm_scale,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           IS_CAUSAL: tl.constexpr, EXACT_P_CAST: tl.constexpr, NUM_STAGES: tl.constexpr):
    heads_k = num_heads // group
    o_desc = tl.make_tensor_descriptor(Out, shape=[batch * seqlen_q, num_heads * HEAD_DIM],
                                       strides=[num_heads * HEAD_DIM, 1], block_shape=[BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(K, shape=[batch * seqlen_k, heads_k * HEAD_DIM],
                                       strides=[heads_k * HEAD_DIM, 1], block_shape=[BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(VT, shape=[batch * heads_k * HEAD_DIM, seqlen_k],
                                       strides=[stride_vd, 1], block_shape=[HEAD_DIM, BLOCK_N])
    n_m = seqlen_q // BLOCK_M
    bh_total = batch * num_heads
    off = seqlen_k - seqlen_q
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for tile in tl.range(tl.program_id(0), n_m * bh_total, tl.num_programs(0), flatten=True,
                         num_stages=NUM_STAGES):
        rank = tile // bh_total
        bh = tile % bh_total
        if IS_CAUSAL:
            m_blk = n_m - 1 - rank  # heaviest query blocks first: a short tail
        else:
            m_blk = rank
        b = bh // num_heads
        h = bh % num_heads
        hk = h // group
        m0 = m_blk * BLOCK_M
        ds_off = b.to(tl.int64) * stride_dsb + hk
        qk_scale = tl.maximum(sm_scale * tl.load(QDescale + ds_off) * tl.load(KDescale + ds_off) * LOG2E,
                              1.1754943508222875e-38)
        # Q by pointers (registers: wgmma's A operand may come from there); a TMA load of Q in the
        # flattened loop hits a Triton 3.6 verifier error (an scf.if yielding a mutable and an immutable
        # shared-memory view of it)
        q_rows = (b * seqlen_q + m0 + offs_m0).to(tl.int64) * (num_heads * HEAD_DIM) + h * HEAD_DIM
        q = tl.load(Q + q_rows[:, None] + offs_d[None, :])
        if IS_CAUSAL:
            hi = tl.minimum(seqlen_k, tl.maximum(m0 + BLOCK_M + off, 0))
        else:
            hi = seqlen_k
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        offs_m = m0 + offs_m0
        for start in range(0, hi, BLOCK_N):
            k = k_desc.load([b * seqlen_k + start, hk * HEAD_DIM])
            v = tl.trans(v_desc.load([(b * heads_k + hk) * HEAD_DIM, start]))
            s = tl.dot(q, tl.trans(k))
            if IS_CAUSAL:  # every block: one select per score (the diagonal's only in the tuned kernel)
                keep = (start + offs_n0)[None, :] <= offs_m[:, None] + off
                s = tl.where(keep, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.math.exp2(s * qk_scale - m_sub[:, None])
                alpha = tl.math.exp2(m_i - m_sub)
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
                p = tl.math.exp2(s * qk_scale - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            if EXACT_P_CAST:
                p = _round_to_e4m3(p)
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        empty = l_i == 0.0
        l_safe = tl.where(empty, 1.0, l_i)
        acc = acc / l_safe[:, None] * tl.load(VDescale + ds_off)
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
        tl.store(Lse + bh.to(tl.int64) * seqlen_q + offs_m, lse)
        o_desc.store([b * seqlen_q + m0, h * HEAD_DIM], acc.to(Out.dtype.element_ty))


def fp8_fwd_persistent(q, k, vt, descales, *, softmax_scale, causal, block_m=64, block_n=128, num_warps=4,
                       num_stages=3, programs=None):
    """out [B, Sq, H, D] bf16, lse [B, H, Sq] float32 (see the module docstring for the limits).
    ``programs``: the grid (default: 3 per SM, the Triton FP8 kernel's residency at hd 64)."""
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if sq % block_m or sk % block_n:
        raise ValueError(f"fp8_fwd_persistent: Sq ({sq}) a multiple of {block_m} and Sk ({sk}) of {block_n}")
    if not (q.is_contiguous() and k.is_contiguous() and vt.stride(-1) == 1 and vt.stride(1) == d * vt.stride(2)):
        raise ValueError("fp8_fwd_persistent: contiguous q / k and keys-contiguous vt [B, Hk, D, Sk]")
    out = q.new_empty((b, sq, hq, d), dtype=torch.bfloat16)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    qds, kds, vds = descales
    if programs is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        programs = 3 * sms
    tiles = (sq // block_m) * b * hq
    launcher.ensure_allocator() if q.is_cuda else None
    _fp8_persistent_kernel[(min(programs, tiles),)](
        q, k, vt, out, lse, qds, kds, vds, qds.stride(0), vt.stride(2), b, sq, sk, hq, hq // hk,
        float(softmax_scale), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=bool(causal),
        EXACT_P_CAST=configs.interpreting(), NUM_STAGES=num_stages, num_warps=num_warps)
    return out, lse
