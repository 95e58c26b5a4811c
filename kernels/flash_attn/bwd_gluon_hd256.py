"""The backward's dK / dV kernel at hd 256 (Gemma-2's 256 / 256) for Hopper in Gluon, warp-specialised, with the
softcap (built in session 54; routed from 512 tokens since session 55: configs.BWD_GLUON; Gemma-2-9B's whole
backward 1.51-1.56x the Triton dK / dV's on an H200, docs/perf/gluon-s55).

bwd_gluon.py's dK / dV kernel gives each consumer warpgroup its own 64 keys and both of their accumulators, dK and
dV, 64 x D fp32 each: at D = 256 that is 256 registers a thread for the accumulators alone. Here the two consumers
share a program's 64 keys and split the head dim instead (flash-attn 3's plan at hd 256): consumer w owns columns
[128 w, 128 w + 128) of dK and dV (64 + 64 registers), and each query tile of 64 rows is worked as

    S^T_w  = K Q_w^T          P^T_w  = exp2(S^T_w * scale * log2(e) - lse * log2(e))   (causal: masked to 0)
    dP^T_w = V dO_w^T         dS^T_w = P^T_w * (dP^T_w - delta)
    dV[:, cols_w] += P^T dO[:, cols_w]         dK[:, cols_w] += dS^T Q[:, cols_w]   (dK scaled once at the end)

where Q_w and dO_w are the tile's query rows [32 w, 32 w + 32): each consumer makes the scores of its 32 queries
against all 64 keys (a wgmma's 64 rows are the keys, K and V the A operand from shared memory), stores its P^T_w
and dS^T_w (bf16, 64 x 32) to shared memory and arrives on ``pds_ready``; once both halves are there, each issues
dV and dK for its columns over all 64 queries (P^T and dS^T the A operand from shared memory, two 32-query parts;
dO and Q the B operand, row and column slices of the tile), waits for them and arrives on ``pds_free`` (the next
tile's halves are stored only after both consumers' wgmmas read these). A loader warp brings K and V once and the
Q and dO tiles through two stages (shared memory: K and V 32 KiB each, 64 KiB a stage, 16 KiB of P^T / dS^T: 208
KiB). TMA descriptors are made on the host (bwd_gluon.host_descriptor).

Softcap (``SOFTCAP``): the forward capped the scores, softcap * tanh(s * sm_scale / softcap); P is recomputed
through the cap (t = tanh.approx(S * cap_in), P = 2^(t * softcap * log2(e) - lse * log2(e))) and dS through its
slope, dS = P (dP - delta) (1 - t^2), as the Gluon dQ kernel does. GQA: a program runs the group's query heads one
after another (or its share under the backward's group split, fp32 partials the Triton sum adds up). Rows past a
sequence's end: zero-filled tiles, lse read as +inf (P = 0); keys past it are computed and not stored. Dense bf16 /
fp16, causal (bottom-right aligned) or no mask; no window, no varlen. Gluon has no interpreter: sm90 GPUs only
(tests/kernels/test_bwd_gluon.py compiles it for sm_90a on the CPU and checks it against the FP64 oracle on the GPU).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .. import launcher
from .bwd_gluon import (
    _DTYPES,
    HOST_DESCRIPTOR_OF,
    _acc_layout,
    _BwdShape,
    _check_call,
    _copy_lse_rows,
    _dkdv_coords,
    _host_descriptors,
    _lse_ring,
    _outputs,
    _p_and_ds,
    _replay_or_launch,
    lse_tma_arguments,
)
from .bwd_gluon import unsupported as _unsupported
from .fp8_gluon import _cap_scales, _pass, _ws_barriers, softcap_refused

#: the (q / k, v) head dims this kernel takes
HEAD_DIMS = ((256, 256), )
#: keys a program (both consumers'), query rows a tile (32 a consumer for S^T and dP^T)
BLOCK_N = 64
BLOCK_M = 64


@gluon.jit
def _load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk, n0, group,
          g_lo, g_hi, j_lo, n_m, shape, lse_desc, delta_desc, lse_smem, delta_smem):
    """The loader warp: the program's K and V (64 keys) once, then per query head of its part of the group ([g_lo,
    g_hi)) and query tile from ``j_lo`` the Q and dO tiles into the slot both consumers released; with
    ``shape.LSE_TMA`` the tile's lse and delta rows too (``lse_desc`` / ``delta_desc`` into ``lse_smem`` /
    ``delta_smem``, on the same barrier)."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    ROWS: gl.constexpr = shape.BLOCK_M
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    LSE_BYTES: gl.constexpr = 2 * ROWS * 4 if shape.LSE_TMA else 0  # (a query tile's lse and delta, fp32)
    mbarrier.expect(kv_bar, 2 * 64 * HEAD_DIM * 2)
    tma.async_copy_global_to_shared(k_desc, [b, n0, hk, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [b, n0, hk, 0], kv_bar, v_smem)
    it = gl.to_tensor(0)
    for g in range(g_lo, g_hi):
        h = hk * group + g
        for j in range(j_lo, n_m):
            slot = it % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) - 1) & 1, pred=it >= NUM_STAGES)
            mbarrier.expect(ready.index(slot), 2 * ROWS * HEAD_DIM * 2 + LSE_BYTES)
            _copy_lse_rows(lse_desc, delta_desc, lse_smem, delta_smem, b, h, j * ROWS, ready.index(slot), slot,
                           shape.LSE_TMA)
            tma.async_copy_global_to_shared(q_desc, [b, j * ROWS, h, 0], ready.index(slot), q_smem.index(slot))
            tma.async_copy_global_to_shared(do_desc, [b, j * ROWS, h, 0], ready.index(slot), do_smem.index(slot))
            it += 1


@gluon.jit
def _consume(wg, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, p_smem, ds_smem, pds_ready, pds_free, DK,
             DV, Lse, Delta, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_dkp,
             stride_dvp, stride_lb, stride_lh, stride_db, stride_dh, b, hk, gs, n0, group, g_lo, g_hi, j_lo, n_m,
             seqlen_q, seqlen_k, qk_scale, sm_scale, cap_in, shape, lse_smem, delta_smem):
    """Consumer ``wg``'s work (the module's docstring): S^T and dP^T of its 32 queries of each tile, P^T and dS^T
    through shared memory to both consumers, dV and dK of its 128 columns; stored (dK scaled) at the end. With
    ``shape.LSE_TMA`` its queries' lse and delta from the loader's copies (``lse_smem`` / ``delta_smem``)."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    ROWS: gl.constexpr = shape.BLOCK_M
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    HALF: gl.constexpr = HEAD_DIM // 2
    QW: gl.constexpr = ROWS // 2
    S_LAYOUT: gl.constexpr = _acc_layout(QW)  # S^T, dP^T: 64 keys x 32 queries
    G_LAYOUT: gl.constexpr = _acc_layout(HALF)  # dK, dV: 64 keys x 128 columns
    DTYPE: gl.constexpr = q_smem.dtype
    off = seqlen_k - seqlen_q
    k_t = k_smem.reshape([64, HEAD_DIM])
    v_t = v_smem.reshape([64, HEAD_DIM])
    b64 = b.to(gl.int64)
    dv = gl.zeros([64, HALF], gl.float32, layout=G_LAYOUT)
    dk = gl.zeros([64, HALF], gl.float32, layout=G_LAYOUT)
    mbarrier.wait(kv_bar, 0)
    it = gl.to_tensor(0)
    for g in range(g_lo, g_hi):
        h = (hk * group + g).to(gl.int64)
        lse_s = Lse + b64 * stride_lb + h * stride_lh
        delta_s = Delta + b64 * stride_db + h * stride_dh
        for j in range(j_lo, n_m):
            slot = it % NUM_STAGES
            q_t = q_smem.index(slot).reshape([ROWS, HEAD_DIM])
            do_t = do_smem.index(slot).reshape([ROWS, HEAD_DIM])
            lse_in = lse_s
            delta_in = delta_s
            if shape.LSE_TMA:  # (this consumer's 32 queries of the tile's rows)
                lse_in = lse_smem.index(slot).reshape([ROWS]).slice(QW * wg, QW)
                delta_in = delta_smem.index(slot).reshape([ROWS]).slice(QW * wg, QW)
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
            zero = gl.zeros([64, QW], gl.float32, layout=S_LAYOUT)
            s = warpgroup_mma(k_t, q_t.slice(QW * wg, QW).permute((1, 0)), zero, use_acc=False, is_async=True)
            dp = warpgroup_mma(v_t, do_t.slice(QW * wg, QW).permute((1, 0)), zero, use_acc=False, is_async=True)
            p, ds = _p_and_ds(s, dp, j * ROWS + QW * wg, lse_in, delta_in, n0, off, qk_scale, seqlen_q, IS_CAUSAL,
                              QW, S_LAYOUT, 1, 0, cap_in=cap_in, SOFTCAP=shape.SOFTCAP, LSE_SMEM=shape.LSE_TMA)
            # both consumers' wgmmas of the last tile read the halves there: then this one's are stored
            mbarrier.wait(pds_free, (it - 1) & 1, pred=it > 0)
            p_smem.index(wg).store(p.to(DTYPE))
            ds_smem.index(wg).store(ds.to(DTYPE))
            fence_async_shared()
            _pass(pds_ready)
            mbarrier.wait(pds_ready, it & 1)
            for w in gl.static_range(2):  # the tile's two 32-query parts, this consumer's columns
                dv = warpgroup_mma(p_smem.index(w), do_t.slice(QW * w, QW).slice(HALF * wg, HALF, dim=1), dv,
                                   is_async=True)
                dk = warpgroup_mma(ds_smem.index(w), q_t.slice(QW * w, QW).slice(HALF * wg, HALF, dim=1), dk,
                                   is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
            _pass(pds_free)
            _pass(empty.index(slot))  # this tile's Q and dO read: the slot is free
            it += 1
    rows = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, G_LAYOUT))
    dims = HALF * wg + gl.arange(0, HALF, layout=gl.SliceLayout(0, G_LAYOUT))
    keep = gl.expand_dims(rows < seqlen_k, 1)
    at = gl.expand_dims(rows.to(gl.int64), 1)
    hk64 = hk.to(gl.int64)
    gs64 = gs.to(gl.int64)  # (a group split's partials: [split, *k.shape] fp32)
    gl.store(DK + gs64 * stride_dkp + b64 * stride_dkb + hk64 * stride_dkh + at * stride_dks + gl.expand_dims(dims, 0),
             (dk * sm_scale).to(DK.dtype.element_ty), mask=keep)
    gl.store(DV + gs64 * stride_dvp + b64 * stride_dvb + hk64 * stride_dvh + at * stride_dvs + gl.expand_dims(dims, 0),
             dv.to(DV.dtype.element_ty), mask=keep)


@gluon.jit
def _bwd_dkdv256_kernel(Q, K, V, DO, Lse, Delta, DK, DV, QD, DOD, KD, VD, stride_dkb, stride_dks, stride_dkh,
                        stride_dvb, stride_dvs, stride_dvh, stride_dkp, stride_dvp, stride_lb, stride_lh, stride_db,
                        stride_dh, group_split, seqlen_q, seqlen_k, num_heads, group, sm_scale, softcap,
                        HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                        SOFTCAP: gl.constexpr, CONSUMER_REGS: gl.constexpr, Q_SL: gl.constexpr, K_SL: gl.constexpr,
                        P_SL: gl.constexpr, num_warps: gl.constexpr, batch=1, LSE_TMA: gl.constexpr = False,
                        L_SL: gl.constexpr = None, UNITS_FIRST: gl.constexpr = False):
    """dK and dV of 64 keys of one (batch, kv head, group part) a program (grid: key blocks x batch x kv heads x
    group parts); Q's, dO's, K's and V's TMA descriptors made on the host (``QD`` .. ``VD``; Q .. DO themselves
    unread, the launch's replay slots). ``SOFTCAP``: the forward's scores were capped at ``softcap`` (read only
    then). ``stride_dkp`` / ``stride_dvp``: the group split's partials (0 without a split). ``LSE_TMA``: lse and
    delta ([``batch``, heads, seqlen_q], 16-byte strides) by the loader's TMA with each query tile (``L_SL``: [1, 1,
    64] fp32), as bwd_gluon's dK / dV kernel takes them (session 58). ``UNITS_FIRST``: the grid's (batch, kv head,
    group part) units first and its key blocks second (:func:`dkdv256_grid`'s ``units_first``), as bwd_gluon's
    kernel's (session 60)."""
    if UNITS_FIRST:
        pid_n = gl.program_id(1)
        pid_u = gl.program_id(0)
    else:
        pid_n = gl.program_id(0)
        pid_u = gl.program_id(1)
    b, hk, gs, n0, g_lo, g_hi, j_lo = _dkdv_coords(pid_n, pid_u, seqlen_q, seqlen_k, num_heads // group, group,
                                                   group_split, 64, IS_CAUSAL, 64)
    n_m = gl.cdiv(seqlen_q, 64)
    dtype: gl.constexpr = Q.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 64, 1, HEAD_DIM], Q_SL)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, 64, 1, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(dtype, [1, 64, 1, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(dtype, [1, 64, 1, HEAD_DIM], K_SL)
    p_smem = gl.allocate_shared_memory(dtype, [2, 64, 32], P_SL)  # P^T of each consumer's 32 queries
    ds_smem = gl.allocate_shared_memory(dtype, [2, 64, 32], P_SL)  # dS^T
    kv_bar, ready, empty, _turn = _ws_barriers(NUM_STAGES)
    pds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(pds_ready, count=2)  # both consumers' halves stored
    mbarrier.init(pds_free, count=2)  # both consumers' wgmmas over them retired
    lse_desc, delta_desc, lse_smem, delta_smem = _lse_ring(Lse, Delta, batch, num_heads, seqlen_q, stride_lb,
                                                           stride_lh, stride_db, stride_dh, QD, q_smem, 64, NUM_STAGES,
                                                           L_SL, LSE_TMA)
    qk_scale, cap_in = _cap_scales(sm_scale, softcap, SOFTCAP)
    shape = _BwdShape(HEAD_DIM, 64, NUM_STAGES, IS_CAUSAL, SOFTCAP=SOFTCAP, LSE_TMA=LSE_TMA)
    load_args = (QD, DOD, KD, VD, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk, n0, group, g_lo, g_hi,
                 j_lo, n_m, shape, lse_desc, delta_desc, lse_smem, delta_smem)
    consume_args = (q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, p_smem, ds_smem, pds_ready, pds_free, DK,
                    DV, Lse, Delta, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_dkp,
                    stride_dvp, stride_lb, stride_lh, stride_db, stride_dh, b, hk, gs, n0, group, g_lo, g_hi, j_lo,
                    n_m, seqlen_q, seqlen_k, qk_scale, sm_scale, cap_in, shape, lse_smem, delta_smem)
    gl.warp_specialize([(_consume, (0, ) + consume_args), (_consume, (1, ) + consume_args), (_load, load_args)],
                       [4, 1], [CONSUMER_REGS, 24])


def unsupported(q, k, v, do, lse, delta) -> str | None:
    """Why this kernel cannot run these inputs (bwd_gluon.unsupported's rules, hd 256 only), or None."""
    why = _unsupported(q, k, v, do, lse, delta, "dq")
    if why is None and (q.shape[-1], v.shape[-1]) not in HEAD_DIMS:
        why = f"head dims (q / k, v) in {HEAD_DIMS}, got q {q.shape[-1]}, v {v.shape[-1]}"
    return why


def dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, split=1, num_stages=2,
                      consumer_regs=240, softcap=0.0, lse_tma=False, units_first=False) -> dict:
    """Every argument of ``_bwd_dkdv256_kernel`` by name (a CPU compile binds the same). ``split`` > 1: ``dk`` /
    ``dv`` are the group split's fp32 partials, [split, *k.shape] and [split, *v.shape]. ``softcap`` > 0: the
    forward's scores were capped, softcap * tanh(s * softmax_scale / softcap) (the kernel's SOFTCAP). ``lse_tma``:
    lse and delta by the loader's TMA (the kernel's LSE_TMA; bwd_gluon.lse_tma_refused says what it takes).
    ``units_first``: the kernel's UNITS_FIRST, for :func:`dkdv256_grid`'s grid of the same name."""
    if why := softcap_refused(softcap):
        raise ValueError(f"dkdv256_arguments: {why}")
    by_tma = dict(lse_tma_arguments(lse, delta, BLOCK_M, "dkdv256_arguments"), batch=q.shape[0]) if lse_tma else {}
    if num_stages != 2:
        raise ValueError(f"dkdv256_arguments: 2 stages (3 would need 272 KiB of shared memory), got {num_stages}")
    g = _DTYPES[q.dtype]
    d = q.shape[-1]
    q_sl = gl.NVMMASharedLayout.get_default_for([1, BLOCK_M, 1, d], g)
    k_sl = gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, 1, d], g)
    dk3, dv3 = (dk[0], dv[0]) if split > 1 else (dk, dv)
    described = _host_descriptors(0, QD=(q, BLOCK_M, d, q_sl), DOD=(do, BLOCK_M, d, q_sl), KD=(k, BLOCK_N, d, k_sl),
                                  VD=(v, BLOCK_N, d, k_sl))
    described.pop("HOST_DESC")
    return dict(Q=q, K=k, V=v, DO=do, Lse=lse, Delta=delta, DK=dk, DV=dv, **described, stride_dkb=dk3.stride(0),
                stride_dks=dk3.stride(1), stride_dkh=dk3.stride(2), stride_dvb=dv3.stride(0), stride_dvs=dv3.stride(1),
                stride_dvh=dv3.stride(2), stride_dkp=dk.stride(0) if split > 1 else 0,
                stride_dvp=dv.stride(0) if split > 1 else 0, stride_lb=lse.stride(0), stride_lh=lse.stride(1),
                stride_db=delta.stride(0), stride_dh=delta.stride(1), group_split=split, seqlen_q=q.shape[1],
                seqlen_k=k.shape[1], num_heads=q.shape[2], group=q.shape[2] // k.shape[2],
                sm_scale=float(softmax_scale), softcap=float(softcap or 0.0), HEAD_DIM=d, NUM_STAGES=num_stages,
                IS_CAUSAL=bool(causal), SOFTCAP=bool(softcap), CONSUMER_REGS=consumer_regs, Q_SL=q_sl, K_SL=k_sl,
                P_SL=gl.NVMMASharedLayout.get_default_for([64, BLOCK_M // 2], g), num_warps=4, **by_tma,
                **({"UNITS_FIRST": True} if units_first else {}))


def dkdv256_grid(k, split: int = 1, units_first: bool = False) -> tuple[int, int]:
    """The kernel's grid over ``k`` [B, Sk, Hk, D]: key blocks of 64 x (batch, kv head, group part); ``units_first``:
    the units first, the key blocks second (the kernel's UNITS_FIRST: every unit's heavy first causal blocks start
    before any unit's lighter ones)."""
    blocks, units = triton.cdiv(k.shape[1], BLOCK_N), k.shape[0] * k.shape[2] * split
    return (units, blocks) if units_first else (blocks, units)


def dkdv256_launch(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, split=1, num_stages=2,
                   consumer_regs=240, softcap=0.0, lse_tma=False, units_first=False):
    """Launch the kernel into ``dk`` / ``dv`` (the gradients, or with ``split`` > 1 the group split's fp32 partials;
    inputs checked by the caller: :func:`unsupported`, an sm90 GPU); returns its :class:`kernels.launcher.Launch`
    (slots Q, K, V, DO, Lse, Delta, DK, DV: the Triton dK / dV kernel's names, so the backward's replay fills
    either). ``units_first``: :func:`dkdv256_grid`'s."""
    launcher.ensure_allocator()
    kwargs = dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, split, num_stages,
                               consumer_regs, softcap, lse_tma, units_first)
    grid = dkdv256_grid(k, split, units_first)
    return launcher.launched(_bwd_dkdv256_kernel, _bwd_dkdv256_kernel[grid](**kwargs), grid, kwargs,
                             descriptors=HOST_DESCRIPTOR_OF)


def dkdv256_gluon(q, k, v, do, lse, delta, *, softmax_scale, causal, num_stages=2, consumer_regs=240, softcap=0.0,
                  poison=False, launches=None, lse_tma=False, units_first=False):
    """(dK, dV) in k's / v's layout and dtype from q, k, v, dO [B, S, H, 256] (GQA when Hq > Hk; causal bottom-right
    aligned), the forward's lse and delta = rowsum(dO * O) ([B, Hq, Sq] fp32), with this kernel. sm90 GPUs only.
    ``softcap``: the forward's cap; ``launches`` / ``poison``: bwd_gluon.dkdv_gluon's; ``lse_tma``,
    ``units_first``: :func:`dkdv256_arguments`'."""
    _check_call("dkdv256_gluon", unsupported(q, k, v, do, lse, delta), num_stages, q)
    dk, dv = _outputs(poison, torch.empty_like(k), torch.empty_like(v))
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Lse": lse, "Delta": delta, "DK": dk, "DV": dv}
    _replay_or_launch(launches, "dkdv256", tensors, lambda: dkdv256_launch(
        q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, 1, num_stages, consumer_regs, softcap, lse_tma,
        units_first))
    return dk, dv
