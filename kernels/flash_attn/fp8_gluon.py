"""Flash-attention forwards for Hopper in Gluon: FP8 (sessions 16-17; the warp-specialised one runs FP8 hd 256) and,
on the same warp-specialised partitions, bf16 / fp16 (session 30: ``fwd_gluon_ws``, which ``flash_attn_func`` routes
its hd 128 forwards to, session 31 its MLA training form's 192 / 128 head dims and a persistent variant in three tile
orders; configs.FWD_GLUON_WS and its neighbours say when). The file keeps its FP8 name: the 16-bit kernel is its
partitions with ``_WsShape.FP8`` off.

The Triton FP8 forward (fwd.py) cannot overlap a block's softmax with the tensor cores inside one
warpgroup: Triton 3.6 waits for the Q K^T wgmma right after issuing it (docs/perf/flash_attn.md,
session 14). Gluon (``triton.experimental.gluon``, shipped with Triton 3.6) hands the wgmma's
asynchrony to the kernel, so this kernel can pipeline the way flash-attn 3 does inside a warpgroup:

    S_0 = Q K_0^T
    for j:  issue S_{j+1} = Q K_{j+1}^T   (tensor cores)              OVERLAP bit 1
            softmax of S_j                (the rest of the SM, meanwhile)
            wait for O += P_{j-1} V_{j-1}; rescale O; issue O += P_j V_j
            wait for S_{j+1}                (bit 2: O's wgmma left in flight into the next block)

K and V^T stream through NUM_STAGES (>= 3) shared-memory slots filled by TMA, one mbarrier per slot.

Where it stands (H100, benchmarks/fp8_gluon_probe.py, docs/perf/flash_attn.md "Session 16"): correct
against the FP64 oracle on every checked shape (its error equal to the Triton kernel's), but slower
than the Triton kernel: 0.71-0.79x at hd 64, 0.86-0.92x at hd 128, 0.97x at hd 256 (64x64 tiles),
with OVERLAP = 1 the best of the four (3-6% over no overlap). Both bits together are serialised by
ptxas (warning C7514: the wgmmas' accumulators are read inside their pipeline stage). What it lacks
against the Triton kernel is occupancy: S_{j+1} is live beside S_j, P and O, 230 registers at hd 64
(64x128) against the Triton kernel's 146, two programs per SM instead of three.

``_fp8_fwd_ws_kernel`` (``fp8_fwd_gluon_ws``) is flash-attn 3's answer to that: warp specialisation
(``gl.warp_specialize``). A loader warp (24 registers) brings both consumers' Q and then K and V^T
into NUM_STAGES slots (``ready`` mbarriers); two consumer warpgroups (240+ registers each, set by
``setmaxnreg``) each take 64 rows of a 128-row tile and release a slot (``empty``, two arrivals) once
its P V is done; one program per SM. The consumers run flash-attn 3's schedule (session 17): in block j
each issues S_{j+1} = Q K_{j+1}^T and O += P_j V_j back to back and runs the softmax of S_{j+1} while
P_j V_j is on the tensor cores, and the two take turns to issue (``turn``, two mbarriers), so one's
softmax runs while the other's matmuls do. Measured (kernel alone, same runs as the Triton kernel,
three repeats): 1.05-1.13x the session-16 schedule at hd 256 and 1.02-1.11x at hd 128; against the
Triton FP8 kernel hd 256 1.04-1.15x (one causal 16k repeat 0.99x; 954-962 TFLOP/s non-causal 16k),
hd 128 0.96-0.99x at 4k and 0.95-1.27x at 16k, hd 64 0.72-0.87x (0.65-0.95x with three consumers,
tried and reverted: docs/perf/fp8-s17). ``configs.FP8_GLUON_WS``
routes ``flash_attn_fp8_func``'s hd 256 calls to it: through the harness 970 TFLOP/s non-causal and 905
causal at 16k (docs/bench/h100-fp8-sweep-s17), ACCEPTED by ``accept --profile fp8``.

Dense inputs only: q [B, Sq, Hq, D], k [B, Sk, Hk, D] in float8_e4m3fn, V already keys-contiguous
([B, Hk, D, Sk], ``v_layout.v_keys_contiguous``), descales (B, Hk) float32 as flash-attn 3 takes
them; out [B, Sq, Hq, D] bf16, lse [B, Hq, Sq] float32. Causal is bottom-right aligned, as in fwd.py.
Head dims 64, 128, 256 (d_v = d); no windows, softcap or varlen (the 16-bit kernel: a causal window on the left,
session 50; a softcap, session 52, by the hardware's tanh since session 53). Gluon has no interpreter: it runs on
an sm90 GPU (tests/kernels/test_fp8_gluon.py compiles it for sm_90a on the CPU).
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
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from .. import launcher

#: Head dims this kernel compiles for (d_v = d).
HEAD_DIMS = (64, 128, 256)
#: The 16-bit forward's host-made descriptor arguments (``HOST_DESC``) -> the tensor slot each describes (a replay
#: encodes them again for its own tensors: kernels/launcher.py)
HOST_DESCRIPTOR_OF = {"QD": "Q", "KD": "K", "VD": "V", "OD": "Out"}


@gluon.jit
def _tile(num_heads, group, seqlen_q, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """This program's (batch, query head, kv head, first query row); causal: heaviest query blocks first
    (they see the most keys)."""
    pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    if IS_CAUSAL:
        m0 = (n_m - 1 - pid_m) * BLOCK_M
    else:
        m0 = pid_m * BLOCK_M
    return b, h, h // group, m0


@gluon.jit
def _descriptors(Q, K, VT, Out, b64, h, hk, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k,
                 ROWS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, Q_SL: gl.constexpr,
                 K_SL: gl.constexpr, V_SL: gl.constexpr, O_SL: gl.constexpr):
    """TMA descriptors of one (batch, head)'s Q and out (ROWS-row boxes), K and V^T (BLOCK_N-key boxes)."""
    q_desc = tma.make_tensor_descriptor(Q + b64 * stride_qb + h.to(gl.int64) * stride_qh, [seqlen_q, HEAD_DIM],
                                        [stride_qs, 1], [ROWS, HEAD_DIM], Q_SL)
    k_desc = tma.make_tensor_descriptor(K + b64 * stride_kb + hk.to(gl.int64) * stride_kh, [seqlen_k, HEAD_DIM],
                                        [stride_ks, 1], [BLOCK_N, HEAD_DIM], K_SL)
    v_desc = tma.make_tensor_descriptor(VT + b64 * stride_vb + hk.to(gl.int64) * stride_vh, [HEAD_DIM, seqlen_k],
                                        [stride_vd, 1], [HEAD_DIM, BLOCK_N], V_SL)
    o_desc = tma.make_tensor_descriptor(Out + b64 * stride_ob + h.to(gl.int64) * stride_oh, [seqlen_q, HEAD_DIM],
                                        [stride_os, 1], [ROWS, HEAD_DIM], O_SL)
    return q_desc, k_desc, v_desc, o_desc


@gluon.jit
def _key_blocks(m0, off, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(how many key blocks rows [m0, m0 + BLOCK_M) see, the first that may hold a key some row must not
    see). At least one block: rows that see no key go through it fully masked (out 0, lse -inf)."""
    if IS_CAUSAL:
        hi = gl.minimum(seqlen_k, gl.maximum(m0 + BLOCK_M + off, 0))
        mask_from = gl.maximum(m0 + off, 0) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen_k
        mask_from = seqlen_k // BLOCK_N * BLOCK_N
    return gl.maximum(gl.cdiv(hi, BLOCK_N), 1), mask_from


@gluon.jit
def _window_blocks(m0, off, window_left, n_blocks, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """A causal tile's key blocks under a sliding window on the left (row r sees keys r + off - window_left ..
    r + off): (the first block the tile's first row sees, how many blocks from there (``n_blocks``: from block 0, as
    :func:`_key_blocks` counts them; at least one), the key below which a block holds keys some row must not see:
    the last row's window edge)."""
    lo = gl.maximum(m0 + off - window_left, 0) // BLOCK_N
    return lo, gl.maximum(n_blocks - lo, 1), m0 + BLOCK_M - 1 + off - window_left


@gluon.jit
def _cap_scales(sm_scale, softcap, SOFTCAP: gl.constexpr):
    """(qk_scale, cap_in): the scores' scale into base 2, and with ``SOFTCAP`` tanh's argument's (the scores capped,
    softcap * tanh(s * sm_scale / softcap): qk_scale softcap * log2(e), cap_in sm_scale / softcap; without it
    sm_scale * log2(e) and 0, unread). The 16-bit forwards' and the backward's Gluon kernels'."""
    if SOFTCAP:
        cap_in = sm_scale / softcap  # (first: the kernels' PTX as when each computed these itself)
        return softcap * 1.4426950408889634, cap_in
    else:
        return sm_scale * 1.4426950408889634, 0.0


@gluon.jit
def _tanh_approx(x):
    """tanh of every element of the fp32 tensor ``x`` by PTX's ``tanh.approx.f32`` (sm_75 and later)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)


#: 2^f on [0, 1) as the cubic 1 + f (c1 + f (c2 + f c3)) with p(0) = 1 and p(1) = 2 (a minimax fit of the relative
#: error: at most 1.14e-4 over x in [-126, 0], ~2^-13, under the 2^-9 of the bf16 / fp16 P it feeds; PTX's
#: ex2.approx: ~2^-22): (c3, c2, c1) as PTX fp32 literals. flash-attn 4 evaluates a cubic for part of its
#: exponentials on the FMA pipe, beside the 16-a-cycle MUFU unit.
EXP2_CUBIC = ("0f3DA057CC", "0f3E67C34B", "0f3F320434")
#: 1.5 * 2^23 as a PTX fp32 literal: added to x in [-126, 0] rounding down, a float whose integer part is 1.5 * 2^23 +
#: floor(x) exactly (the units place at 2^23) and whose low mantissa bits are floor(x), all on the FMA and ALU pipes
EXP2_ROUND_MAGIC = "0f4B400000"
#: the forward's ``EXP2_EVERY`` choices: one exponential in this many by the cubic, the rest by ex2.approx
EXP2_EVERY_CHOICES = (2, 4)
#: the 16-bit forward's ``LAZY`` choices (:func:`_softmax_step_lazy`): how far, in base-2 units, a row's max may grow
#: before O is rescaled (P below 2^LAZY: 256 at 8, as flash-attn 4 keeps it; bf16 / fp16 P and fp32 sums hold it)
LAZY_CHOICES = (8, )


@gluon.constexpr_function
def _exp2_mixed_asm(every: int) -> str:
    """The PTX of :func:`_exp2_mixed`: elements 0 .. every - 2 of each pack by ex2.approx.ftz (as gl.exp2), the last
    by :data:`EXP2_CUBIC` (x clamped at -126: its 2^-126, not 0, below; inputs x <= 0), 2^n added in the exponent.
    The floor n is :data:`EXP2_ROUND_MAGIC` + x rounded down (an FADD.RM: 1.5 * 2^23 + n, its low bits n in two's
    complement, so its bits shifted left by 23 are n's exponent field); session 56's form took it by cvt.rmi and
    cvt.rzi, two conversions on the same XU pipe as ex2, which raised that pipe's work by a quarter (ncu, session 57)
    where the cubic was to lower it."""
    c3, c2, c1 = EXP2_CUBIC
    lines = [f"ex2.approx.ftz.f32 ${i}, ${every + i};" for i in range(every - 1)]
    last, arg = every - 1, 2 * every - 1
    lines += ["{", ".reg .f32 x, t, fl, f, p;", ".reg .b32 n, pb;",
              f"max.ftz.f32 x, ${arg}, 0fC2FC0000;", f"add.rm.ftz.f32 t, x, {EXP2_ROUND_MAGIC};",
              f"sub.ftz.f32 fl, t, {EXP2_ROUND_MAGIC};", "sub.ftz.f32 f, x, fl;",
              f"fma.rn.ftz.f32 p, f, {c3}, {c2};", f"fma.rn.ftz.f32 p, p, f, {c1};",
              "fma.rn.ftz.f32 p, p, f, 0f3F800000;",
              "mov.b32 n, t;", "shl.b32 n, n, 23;", "mov.b32 pb, p;", f"add.s32 ${last}, pb, n;", "}"]
    return "\n".join(lines)


@gluon.constexpr_function
def _exp2_mixed_constraints(every: int) -> str:
    """:func:`_exp2_mixed`'s operands: ``every`` 32-bit outputs, then as many inputs."""
    return ",".join(["=r"] * every + ["r"] * every)


@gluon.jit
def _exp2_mixed(x, EVERY: gl.constexpr):
    """2^x of every element of the fp32 tensor ``x`` (x <= 0: scores less their row's max), one element of each
    ``EVERY`` consecutive ones of a thread's registers by a cubic on the FMA pipe (:func:`_exp2_mixed_asm`), the rest
    by the MUFU unit's ex2.approx as gl.exp2: the softmax's MUFU work cut by 1 / EVERY."""
    return gl.inline_asm_elementwise(_exp2_mixed_asm(EVERY), _exp2_mixed_constraints(EVERY), [x],
                                     dtype=gl.float32, is_pure=True, pack=EVERY)


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked,
                  IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr, window_left=0,
                  WINDOW: gl.constexpr = False, cap_in=0.0, SOFTCAP: gl.constexpr = False,
                  EXP2_EVERY: gl.constexpr = 0):
    """One key block's online softmax in base 2 (scores ``s`` unscaled): (p, alpha, m_new, l_new).
    ``masked``: the block holds keys some row may not see (the causal diagonal, the sequence's end; with
    ``WINDOW``, keys left of a row's window: before ``offs_m + off - window_left``). ``SOFTCAP``: the scores
    capped first, tanh(s * ``cap_in``) (``cap_in`` = sm_scale / softcap) by the hardware's one-instruction tanh
    (``tanh.approx.f32``, relative error under 2^-10.9: below the bf16 inputs' own rounding of s; one MUFU operation
    an element where fwd.py's ``_capped`` form, 2 / (1 + 2^x) - 1, takes an exp2 and a reciprocal beside the
    softmax's exp2), ``qk_scale`` then softcap * log2(e). ``EXP2_EVERY`` (2 or 4; 0: off): in a block no row masks,
    one of each EXP2_EVERY exponentials by a cubic on the FMA pipe (:func:`_exp2_mixed`), for kernels whose softmax
    waits on the MUFU unit (hd 64; capped scores)."""
    if SOFTCAP:
        s = _tanh_approx(s * cap_in)
    if masked:
        keys = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
        keep = gl.expand_dims(keys < seqlen_k, 0)
        if IS_CAUSAL:
            keep = keep & (gl.expand_dims(keys, 0) <= gl.expand_dims(offs_m + off, 1))
        if WINDOW:
            keep = keep & (gl.expand_dims(keys, 0) >= gl.expand_dims(offs_m + off - window_left, 1))
        s = gl.where(keep, s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        # a row that sees nothing yet keeps m = -inf: subtract 0 there so exp2 gives 0, not NaN
        m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - gl.expand_dims(m_sub, 1))
        alpha = gl.exp2(m_i - m_sub)
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p, alpha = _unmasked_exp(s, m_i, m_new, qk_scale, EXP2_EVERY)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _unmasked_exp(s, m_i, m_new, qk_scale, EXP2_EVERY: gl.constexpr):
    """An unmasked block's p = 2^(s * qk_scale - m_new) (one of ``EXP2_EVERY`` by the cubic, :func:`_exp2_mixed`)
    and alpha = 2^(m_i - m_new), the running max's move."""
    if EXP2_EVERY:
        p = _exp2_mixed(s * qk_scale - gl.expand_dims(m_new, 1), EXP2_EVERY)
    else:
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    return p, gl.exp2(m_i - m_new)


@gluon.jit
def _softmax_step_lazy(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked,
                       IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr, window_left=0,
                       WINDOW: gl.constexpr = False, cap_in=0.0, SOFTCAP: gl.constexpr = False,
                       EXP2_EVERY: gl.constexpr = 0, LAZY: gl.constexpr = 8):
    """:func:`_softmax_step` with a lazy rescale: (p, alpha, m_new, l_new, rescale). In a block no row masks the
    running max stays where it was unless some row of the consumer's 64 grew by more than ``LAZY`` (base-2 units),
    so p stays below 2^LAZY and ``rescale`` (one bool for the consumer's four warps) False says alpha is all ones:
    the caller skips O's rescale. A masked block rescales as :func:`_softmax_step` does (``rescale`` True)."""
    if masked:
        p, alpha, m_new, l_new = _softmax_step(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked,
                                               IS_CAUSAL, BLOCK_N, S_LAYOUT, window_left, WINDOW, cap_in, SOFTCAP,
                                               EXP2_EVERY)
        rescale = seqlen_k >= 0  # (True, as a run-time bool: both branches yield the same type)
    else:
        if SOFTCAP:
            s = _tanh_approx(s * cap_in)
        m_blk = gl.max(s, 1) * qk_scale
        rescale = gl.max(m_blk - m_i, 0) > LAZY
        m_new = gl.where(rescale, gl.maximum(m_i, m_blk), m_i)
        p, alpha = _unmasked_exp(s, m_i, m_new, qk_scale, EXP2_EVERY)
        l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new, rescale


@gluon.jit
def _ws_softmax(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked, IS_CAUSAL: gl.constexpr,
                BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr, window_left, WINDOW: gl.constexpr, cap_in,
                SOFTCAP: gl.constexpr, EXP2_EVERY: gl.constexpr, LAZY: gl.constexpr):
    """A consumer's softmax step: :func:`_softmax_step_lazy` with ``LAZY`` (> 0), else :func:`_softmax_step` and
    ``rescale`` True."""
    if LAZY:
        return _softmax_step_lazy(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked, IS_CAUSAL, BLOCK_N,
                                  S_LAYOUT, window_left, WINDOW, cap_in, SOFTCAP, EXP2_EVERY, LAZY)
    else:
        p, alpha, m_new, l_new = _softmax_step(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, masked, IS_CAUSAL,
                                               BLOCK_N, S_LAYOUT, window_left, WINDOW, cap_in, SOFTCAP, EXP2_EVERY)
        return p, alpha, m_new, l_new, True


@gluon.jit
def _rescale_o(acc, alpha, rescale, O_ROWS: gl.constexpr, LAZY: gl.constexpr):
    """O's rows times alpha (the running max moved); with ``LAZY`` only where ``rescale`` says it did."""
    if LAZY:
        if rescale:
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, O_ROWS), 1)
    else:
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, O_ROWS), 1)
    return acc


@gluon.jit
def _fp8_fwd_kernel(Q, K, VT, Out, Lse, QDescale, KDescale, VDescale, stride_dsb,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                    stride_vb, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                    seqlen_q, seqlen_k, num_heads, group, sm_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                    Q_SL: gl.constexpr, K_SL: gl.constexpr, V_SL: gl.constexpr, O_SL: gl.constexpr,
                    num_warps: gl.constexpr):
    # wgmma: 16-row atoms, 4 warps (a warpgroup) per 64 rows; K of an 8-bit instruction is 32
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 32])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=4)
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)

    b, h, hk, m0 = _tile(num_heads, group, seqlen_q, BLOCK_M, IS_CAUSAL)
    off = seqlen_k - seqlen_q
    ds_off = b.to(gl.int64) * stride_dsb + hk
    qk_scale = sm_scale * gl.load(QDescale + ds_off) * gl.load(KDescale + ds_off) * 1.4426950408889634

    b64 = b.to(gl.int64)
    q_desc, k_desc, v_desc, o_desc = _descriptors(
        Q, K, VT, Out, b64, h, hk, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vh, stride_vd, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, HEAD_DIM,
        Q_SL, K_SL, V_SL, O_SL)
    n_blocks, mask_from = _key_blocks(m0, off, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, HEAD_DIM, BLOCK_N], V_SL)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(i), count=1)

    kv_bytes: gl.constexpr = 2 * BLOCK_N * HEAD_DIM
    mbarrier.expect(q_bar, BLOCK_M * HEAD_DIM)
    tma.async_copy_global_to_shared(q_desc, [m0, 0], q_bar, q_smem)
    for i in gl.static_range(NUM_STAGES - 1):  # blocks 0 .. NUM_STAGES - 2; the loop loads the rest
        pred = i < n_blocks
        mbarrier.expect(bars.index(i), kv_bytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [i * BLOCK_N, 0], bars.index(i), k_smem.index(i), pred=pred)
        tma.async_copy_global_to_shared(v_desc, [0, i * BLOCK_N], bars.index(i), v_smem.index(i), pred=pred)

    offs_m = m0 + gl.arange(0, BLOCK_M, layout=ROWS)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROWS)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=ROWS)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=O_LAYOUT)
    if OVERLAP & 2:
        acc = warpgroup_mma_init(acc)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_LAYOUT)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))

    for j in range(0, n_blocks - 1):
        # the next block's scores go to the tensor cores first ...
        nxt = j + 1
        mbarrier.wait(bars.index(nxt % NUM_STAGES), (nxt // NUM_STAGES) & 1)
        s_next = warpgroup_mma(q_smem, k_smem.index(nxt % NUM_STAGES).permute((1, 0)), s_zero, use_acc=False,
                               is_async=True)
        if not (OVERLAP & 1):
            s_next = warpgroup_mma_wait(0, deps=(s_next, ))
        # ... while this block's softmax runs
        start = j * BLOCK_N
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off,
                                           start >= mask_from, IS_CAUSAL, BLOCK_N, S_LAYOUT)
        # O += P_{j-1} V_{j-1} was issued before S_{j+1}: waiting down to one leaves only S_{j+1} in flight
        acc = warpgroup_mma_wait(1, deps=(acc, ))
        # block j - 1's slot is free now: load block j + NUM_STAGES - 1 into it
        ld = j + NUM_STAGES - 1
        slot = ld % NUM_STAGES
        pred = ld < n_blocks
        mbarrier.expect(bars.index(slot), kv_bytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [ld * BLOCK_N, 0], bars.index(slot), k_smem.index(slot), pred=pred)
        tma.async_copy_global_to_shared(v_desc, [0, ld * BLOCK_N], bars.index(slot), v_smem.index(slot), pred=pred)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, O_ROWS), 1)
        p8 = gl.convert_layout(p.to(gl.float8e4nv), P_LAYOUT)
        acc = warpgroup_mma(p8, v_smem.index(j % NUM_STAGES).permute((1, 0)), acc, is_async=True)
        if not (OVERLAP & 2):
            acc = warpgroup_mma_wait(0, deps=(acc, ))
        s = warpgroup_mma_wait(1, deps=(s_next, ))

    last = n_blocks - 1
    start = last * BLOCK_N
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off, start >= mask_from,
                                       IS_CAUSAL, BLOCK_N, S_LAYOUT)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, O_ROWS), 1)
    p8 = gl.convert_layout(p.to(gl.float8e4nv), P_LAYOUT)
    acc = warpgroup_mma(p8, v_smem.index(last % NUM_STAGES).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(i))

    # fully masked rows (l = 0): out 0, lse -inf (the oracle's convention)
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    v_scale = gl.load(VDescale + ds_off)
    acc = acc * gl.expand_dims(gl.convert_layout(v_scale / l_safe, O_ROWS), 1)
    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    gl.store(Lse + b64 * stride_lb + h.to(gl.int64) * stride_lh + offs_m, lse, mask=offs_m < seqlen_q)
    o_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, HEAD_DIM], O_SL)
    o_smem.store(acc.to(gl.bfloat16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [m0, 0], o_smem)
    tma.store_wait(pendings=0)


# --------------------------------------------------------------------------------------------
# Warp-specialised: a loader warp and two consumer warpgroups (64 query rows each), flash-attn 3's split
# --------------------------------------------------------------------------------------------


@aggregate
class _WsShape:
    """The partitions' compile-time shape (warp_specialize passes plain arguments as run-time values).
    Its fields are set as a dict: this module's annotations are strings (``from __future__``). FP8: e4m3
    operands (32-deep wgmma, P in e4m3, V given keys-contiguous as V^T tiles [HEAD_DIM, BLOCK_N]); else 16-bit
    (bf16 / fp16: 16-deep wgmma, P in the inputs' dtype, V as given, tiles [BLOCK_N, HEAD_DIM]). 16-bit only:
    HEAD_DIM_B, a second part of the q / k head dim (tiles of their own, the scores two chained wgmmas; v's head
    dim stays HEAD_DIM: DeepSeek's MLA training form is q / k 128 + 64, v 128, as the Triton kernels split it).
    NUM_WG: consumer warpgroups of 64 query rows taking turns in a ring (2: flash-attn 3's ping-pong; 3: its
    192-row tiles at small head dims, where the softmax outweighs the matmuls). OVERLAP: each consumer's in-block
    overlap (block j+1's softmax while P_j V_j runs; off: both retire first, so P_j is dead during the softmax and
    two score tiles are never live at once: fewer registers, the overlap left to the other consumers). WINDOW (16-bit,
    causal, not persistent): a sliding window on the left, the key blocks from the first one the tile's first row sees
    (``_window_blocks``), the blocks below the last row's window edge masked too. RANK4 (16-bit, not persistent,
    one head-dim part): the descriptors made on the host, rank 4 over [B, S, H, D] (boxes [1, rows, 1, D]), the tiles
    rank 4 in shared memory: the partitions address them with (batch, head) coordinates (``coords``). SOFTCAP (16-bit):
    the scores capped, softcap * tanh(s * sm_scale / softcap), before the softmax
    (``_softmax_step``). EXP2_EVERY (16-bit; 0: off): one of each EXP2_EVERY of the softmax's exponentials by a cubic on
    the FMA pipe (``_exp2_mixed``)."""
    __annotations__ = {"HEAD_DIM": gl.constexpr, "BLOCK_N": gl.constexpr, "NUM_STAGES": gl.constexpr,
                       "IS_CAUSAL": gl.constexpr, "FP8": gl.constexpr, "HEAD_DIM_B": gl.constexpr,
                       "TILE_ORDER": gl.constexpr, "NUM_WG": gl.constexpr, "OVERLAP": gl.constexpr,
                       "WINDOW": gl.constexpr, "RANK4": gl.constexpr, "SOFTCAP": gl.constexpr,
                       "EXP2_EVERY": gl.constexpr, "LAZY": gl.constexpr}

    @gluon.constexpr_function
    def __init__(self, HEAD_DIM, BLOCK_N, NUM_STAGES, IS_CAUSAL, FP8=True, HEAD_DIM_B=0, TILE_ORDER=0, NUM_WG=2,
                 OVERLAP=True, WINDOW=False, RANK4=False, SOFTCAP=False, EXP2_EVERY=0, LAZY=0):
        self.LAZY = gl.constexpr(LAZY)
        self.EXP2_EVERY = gl.constexpr(EXP2_EVERY)
        self.SOFTCAP = gl.constexpr(SOFTCAP)
        self.WINDOW = gl.constexpr(WINDOW)
        self.RANK4 = gl.constexpr(RANK4)
        self.NUM_WG = gl.constexpr(NUM_WG)
        self.OVERLAP = gl.constexpr(OVERLAP)
        self.TILE_ORDER = gl.constexpr(TILE_ORDER)
        self.HEAD_DIM = gl.constexpr(HEAD_DIM)
        self.HEAD_DIM_B = gl.constexpr(HEAD_DIM_B)
        self.BLOCK_N = gl.constexpr(BLOCK_N)
        self.NUM_STAGES = gl.constexpr(NUM_STAGES)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)
        self.FP8 = gl.constexpr(FP8)


@gluon.jit
def _pass(bar):
    """Arrive once on ``bar`` for the whole warpgroup, after every warp of it got here (the turn handed over, a
    slot released)."""
    gl.thread_barrier()
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _ws_barriers(NUM_STAGES: gl.constexpr, NUM_WG: gl.constexpr = 2):
    """The warp-specialised kernels' barriers (forwards here, backwards in bwd_gluon.py): one for the tiles a
    program loads once, a ring's ``ready`` (the loader's TMA landed) and ``empty`` (every consumer warpgroup
    released the slot), and one ``turn`` barrier a consumer (2: ping-pong; NUM_WG: a ring)."""
    once = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    mbarrier.init(once, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NUM_WG)
    for i in gl.static_range(NUM_WG):
        mbarrier.init(turn.index(i), count=1)
    return once, ready, empty, turn


@gluon.jit
def _ws_v(v_slot, FP8: gl.constexpr):
    """A slot's V tile as the B operand of O += P V ([BLOCK_N, HEAD_DIM]): FP8's V^T tile seen transposed
    (keys, its contiguous dim, become the dot's depth), a 16-bit V tile as loaded."""
    if FP8:
        return v_slot.permute((1, 0))
    else:
        return v_slot


@gluon.jit
def _ws_scores(q, q_b, k_slot, k_slot_b, s_zero, HEAD_DIM_B: gl.constexpr):
    """S = Q K^T issued on the tensor cores (asynchronous): one wgmma, or with a second head-dim part (HEAD_DIM_B)
    two chained ones, S = Q_a K_a^T + Q_b K_b^T (they retire in order, so a wait for the later one covers both)."""
    s = warpgroup_mma(q, k_slot.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if HEAD_DIM_B > 0:
        s = warpgroup_mma(q_b, k_slot_b.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _block_masked(start, mask_from, clear_from, WINDOW: gl.constexpr):
    """Whether the key block from key ``start`` holds keys some row must not see: from ``mask_from`` on (the causal
    diagonal, the sequence's end), and with ``WINDOW`` before ``clear_from`` (a window's left edge)."""
    if WINDOW:
        return (start >= mask_from) | (start < clear_from)
    else:
        return start >= mask_from


@gluon.jit
def _slot(buf, i, ROWS: gl.constexpr, COLS: gl.constexpr, RANK4: gl.constexpr):
    """Tile ``i`` of a shared buffer as the [ROWS, COLS] operand a wgmma reads (RANK4: its [1, ROWS, 1, COLS] TMA box
    seen as two dimensions)."""
    if RANK4:
        return buf.index(i).reshape([ROWS, COLS])
    else:
        return buf.index(i)


@gluon.jit
def _ws_consume(wg, q_smem, k_smem, v_smem, o_smem, q_bar, ready, empty, turn, o_desc, lse_ptr, m0, n_blocks,
                mask_from, seqlen_q, seqlen_k, off, qk_scale, v_scale, shape, q_smem_b, k_smem_b, lo=0, clear_from=0,
                window_left=0, coords=0, cap_in=0.0):
    """One consumer warpgroup, query rows [m0 + 64 wg, + 64), with flash-attn 3's schedule: in block j it
    issues S_{j+1} = Q K_{j+1}^T and O += P_j V_j back to back, then runs the softmax of S_{j+1} while
    P_j V_j is still on the tensor cores; and the two consumers take turns to issue (``turn``: one
    mbarrier each, the other consumer arrives on it once it has issued), so that one's softmax runs while
    the other's matmuls do (ping-pong). Consumer 1 hands the first turn to consumer 0. Both take
    n_blocks + 1 turns (the same tile), so each barrier is at most one phase ahead of its waiter. With
    ``shape.NUM_WG`` 3 the turns go round a ring (0, 1, 2, 0, ...: each hands to the next, the last hands the
    first turn to 0); a turn barrier is then still armed once a round, after its waiter took the last one.
    ``q_smem_b`` / ``k_smem_b``: the second head-dim part's tiles (read only with ``shape.HEAD_DIM_B``). With
    ``shape.WINDOW`` the n_blocks blocks start at block ``lo``, those before key ``clear_from`` masked too
    (``_window_blocks``); read only then. With ``shape.RANK4`` the tiles are rank 4 and out goes to (batch, query
    head) ``coords[0]``, ``coords[1]``. With ``shape.SOFTCAP`` the scores are capped (``cap_in``: ``_softmax_step``'s;
    ``qk_scale`` softcap * log2(e) then)."""
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    WINDOW: gl.constexpr = shape.WINDOW
    SOFTCAP: gl.constexpr = shape.SOFTCAP
    RANK4: gl.constexpr = shape.RANK4
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    FP8: gl.constexpr = shape.FP8
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    # an 8-bit wgmma is 32 deep, a 16-bit one 16; P from registers packs 32 bits per operand element
    K_DOT: gl.constexpr = 32 if FP8 else 16
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, K_DOT])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, K_DOT])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=4 if FP8 else 2)
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    P_DTYPE: gl.constexpr = k_smem.dtype
    NUM_WG: gl.constexpr = shape.NUM_WG
    LAZY: gl.constexpr = shape.LAZY
    row0 = m0 + wg * 64
    q = _slot(q_smem, wg, 64, HEAD_DIM, RANK4)
    q_b = q_smem_b.index(wg)
    mine = turn.index(wg)
    if NUM_WG == 2:
        other = turn.index(1 - wg)
    else:  # the next consumer round the ring
        other = turn.index((wg + 1) % NUM_WG)
    offs_m = row0 + gl.arange(0, 64, layout=ROWS)
    m_i = gl.full([64], float("-inf"), gl.float32, layout=ROWS)
    l_i = gl.zeros([64], gl.float32, layout=ROWS)
    acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=O_LAYOUT)
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=S_LAYOUT)

    mbarrier.arrive(turn.index(0), count=1, pred=wg == NUM_WG - 1)  # consumer 0 issues first
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(ready.index(0), 0)
    mbarrier.wait(mine, 0)
    s = _ws_scores(q, q_b, _slot(k_smem, 0, BLOCK_N, HEAD_DIM, RANK4), k_smem_b.index(0), s_zero, HEAD_DIM_B)
    _pass(other)  # every warp of this warpgroup has issued before the turn passes
    s = warpgroup_mma_wait(0, deps=(s, ))
    base = 0  # the first block's first key
    if WINDOW:
        base = lo * BLOCK_N
    p, alpha, m_i, l_i, rescale = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, base, seqlen_k, off,
                                              _block_masked(base, mask_from, clear_from, WINDOW), IS_CAUSAL, BLOCK_N,
                                              S_LAYOUT, window_left, WINDOW, cap_in, SOFTCAP, shape.EXP2_EVERY, LAZY)
    for j in range(0, n_blocks - 1):
        nxt = j + 1
        start = base + nxt * BLOCK_N
        mbarrier.wait(ready.index(nxt % NUM_STAGES), (nxt // NUM_STAGES) & 1)
        mbarrier.wait(mine, nxt & 1)
        s_next = _ws_scores(q, q_b, _slot(k_smem, nxt % NUM_STAGES, BLOCK_N, HEAD_DIM, RANK4),
                            k_smem_b.index(nxt % NUM_STAGES), s_zero, HEAD_DIM_B)
        acc = _rescale_o(acc, alpha, rescale, O_ROWS, LAZY)
        p8 = gl.convert_layout(p.to(P_DTYPE), P_LAYOUT)
        acc = warpgroup_mma(p8, _ws_v(_slot(v_smem, j % NUM_STAGES, BLOCK_N, HEAD_DIM, RANK4), FP8), acc,
                            is_async=True)
        _pass(other)
        if shape.OVERLAP:
            s = warpgroup_mma_wait(1, deps=(s_next, ))  # S_{j+1} done; P_j V_j may still run
            p, alpha, m_i, l_i, rescale = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off,
                                                      _block_masked(start, mask_from, clear_from, WINDOW),
                                                      IS_CAUSAL, BLOCK_N, S_LAYOUT, window_left, WINDOW, cap_in,
                                                      SOFTCAP, shape.EXP2_EVERY, LAZY)
            acc = warpgroup_mma_wait(0, deps=(acc, ))  # (P_j in registers: ptxas keeps them until this wait)
            _pass(empty.index(j % NUM_STAGES))  # block j's K and V read: the slot is free
        else:  # both retire before the softmax: P_j dead, one score tile live
            s, acc = warpgroup_mma_wait(0, deps=(s_next, acc))
            _pass(empty.index(j % NUM_STAGES))
            p, alpha, m_i, l_i, rescale = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, start, seqlen_k, off,
                                                      _block_masked(start, mask_from, clear_from, WINDOW),
                                                      IS_CAUSAL, BLOCK_N, S_LAYOUT, window_left, WINDOW, cap_in,
                                                      SOFTCAP, shape.EXP2_EVERY, LAZY)
    last = n_blocks - 1
    mbarrier.wait(mine, n_blocks & 1)
    acc = _rescale_o(acc, alpha, rescale, O_ROWS, LAZY)
    p8 = gl.convert_layout(p.to(P_DTYPE), P_LAYOUT)
    acc = warpgroup_mma(p8, _ws_v(_slot(v_smem, last % NUM_STAGES, BLOCK_N, HEAD_DIM, RANK4), FP8), acc,
                        is_async=True)
    _pass(other)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    _ws_store(acc, m_i, l_i, offs_m, o_smem.index(wg), o_desc, row0, lse_ptr, seqlen_q, v_scale, O_ROWS, coords,
              RANK4)


@gluon.jit
def _ws_finish(acc, m_i, l_i, v_scale, O_ROWS: gl.constexpr):
    """(out's rows normalised and scaled by ``v_scale``, lse in natural log) from a consumer's accumulator and its
    base-2 row max / sum; fully masked rows (l = 0) get out 0 and lse -inf (the oracle's convention)."""
    empty_row = l_i == 0.0
    l_safe = gl.where(empty_row, 1.0, l_i)
    acc = acc * gl.expand_dims(gl.convert_layout(v_scale / l_safe, O_ROWS), 1)
    lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    return acc, lse


@gluon.jit
def _ws_store(acc, m_i, l_i, offs_m, o, o_desc, row0, lse_ptr, seqlen_q, v_scale, O_ROWS: gl.constexpr, coords=0,
              RANK4: gl.constexpr = False):
    """A consumer's epilogue: normalise its 64 rows, store lse and (through shared memory, TMA) out (RANK4: ``o``
    a [1, 64, 1, D] box, out's descriptor rank 4, at (batch, head) ``coords[0]``, ``coords[1]``)."""
    acc, lse = _ws_finish(acc, m_i, l_i, v_scale, O_ROWS)
    gl.store(lse_ptr + offs_m, lse, mask=offs_m < seqlen_q)
    if RANK4:
        o.reshape([o.shape[1], o.shape[3]]).store(acc.to(o.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [coords[0], row0, coords[1], 0], o)
    else:
        o.store(acc.to(o.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [row0, 0], o)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_load(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, m0, n_blocks, shape, q_desc_b,
             k_desc_b, q_smem_b, k_smem_b, lo=0, coords=0):
    """The loader warp: every consumer's Q (``shape.NUM_WG`` tiles of 64 rows), then K and V (FP8: V^T) block by
    block into the slots they release; with ``shape.HEAD_DIM_B`` the second head-dim part's Q and K tiles too
    (``*_b``: from column HEAD_DIM); with ``shape.WINDOW`` the blocks from block ``lo`` on; with ``shape.RANK4``
    rank-4 boxes at (batch, query head, kv head) ``coords``."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    BYTES: gl.constexpr = 1 if shape.FP8 else 2
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    NUM_WG: gl.constexpr = shape.NUM_WG
    mbarrier.expect(q_bar, NUM_WG * 64 * (HEAD_DIM + HEAD_DIM_B) * BYTES)
    for wg in gl.static_range(NUM_WG):
        if shape.RANK4:
            tma.async_copy_global_to_shared(q_desc, [coords[0], m0 + 64 * wg, coords[1], 0], q_bar, q_smem.index(wg))
        else:
            tma.async_copy_global_to_shared(q_desc, [m0 + 64 * wg, 0], q_bar, q_smem.index(wg))
    if HEAD_DIM_B > 0:
        for wg in gl.static_range(NUM_WG):
            tma.async_copy_global_to_shared(q_desc_b, [m0 + 64 * wg, HEAD_DIM], q_bar, q_smem_b.index(wg))
    base = 0  # the first block's first key
    if shape.WINDOW:
        base = lo * BLOCK_N
    for j in range(0, n_blocks):
        slot = j % NUM_STAGES
        key = base + j * BLOCK_N
        # the slot's previous block released by both consumers (not needed the first time round)
        mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) - 1) & 1, pred=j >= NUM_STAGES)
        mbarrier.expect(ready.index(slot), BLOCK_N * (2 * HEAD_DIM + HEAD_DIM_B) * BYTES)
        if shape.RANK4:
            tma.async_copy_global_to_shared(k_desc, [coords[0], key, coords[2], 0], ready.index(slot),
                                            k_smem.index(slot))
            tma.async_copy_global_to_shared(v_desc, [coords[0], key, coords[2], 0], ready.index(slot),
                                            v_smem.index(slot))
        else:
            tma.async_copy_global_to_shared(k_desc, [key, 0], ready.index(slot), k_smem.index(slot))
            if HEAD_DIM_B > 0:
                tma.async_copy_global_to_shared(k_desc_b, [key, HEAD_DIM], ready.index(slot), k_smem_b.index(slot))
            if shape.FP8:
                tma.async_copy_global_to_shared(v_desc, [0, key], ready.index(slot), v_smem.index(slot))
            else:
                tma.async_copy_global_to_shared(v_desc, [key, 0], ready.index(slot), v_smem.index(slot))


@gluon.jit
def _fp8_fwd_ws_kernel(Q, K, VT, Out, Lse, QDescale, KDescale, VDescale, stride_dsb,
                       stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                       stride_vb, stride_vh, stride_vd, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                       seqlen_q, seqlen_k, num_heads, group, sm_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                       NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                       Q_SL: gl.constexpr, K_SL: gl.constexpr, V_SL: gl.constexpr, O_SL: gl.constexpr,
                       num_warps: gl.constexpr, OUT_FP8: gl.constexpr = False):
    BLOCK_M: gl.constexpr = 128  # two consumer warpgroups of 64 rows
    b, h, hk, m0 = _tile(num_heads, group, seqlen_q, BLOCK_M, IS_CAUSAL)
    off = seqlen_k - seqlen_q
    ds_off = b.to(gl.int64) * stride_dsb + hk
    qk_scale = sm_scale * gl.load(QDescale + ds_off) * gl.load(KDescale + ds_off) * 1.4426950408889634
    v_scale = gl.load(VDescale + ds_off)
    if OUT_FP8:  # out written in e4m3 in V's units (real value = out x v_descale): not scaled here
        v_scale = v_scale * 0.0 + 1.0
    b64 = b.to(gl.int64)
    q_desc, k_desc, v_desc, o_desc = _descriptors(  # Q and out in one consumer's 64 rows
        Q, K, VT, Out, b64, h, hk, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb,
        stride_vh, stride_vd, stride_ob, stride_os, stride_oh, seqlen_q, seqlen_k, 64, BLOCK_N, HEAD_DIM,
        Q_SL, K_SL, V_SL, O_SL)
    lse_ptr = Lse + b64 * stride_lb + h.to(gl.int64) * stride_lh
    n_blocks, mask_from = _key_blocks(m0, off, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, 64, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, HEAD_DIM, BLOCK_N], V_SL)
    o_smem = gl.allocate_shared_memory(Out.dtype.element_ty, [2, 64, HEAD_DIM], O_SL)
    q_bar, ready, empty, turn = _ws_barriers(NUM_STAGES)

    shape = _WsShape(HEAD_DIM, BLOCK_N, NUM_STAGES, IS_CAUSAL)
    # (no second head-dim part: the part-B arguments are the first part's objects, never read)
    load_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, m0, n_blocks, shape, q_desc,
                 k_desc, q_smem, k_smem)
    consume_args = (q_smem, k_smem, v_smem, o_smem, q_bar, ready, empty, turn, o_desc, lse_ptr, m0, n_blocks,
                    mask_from, seqlen_q, seqlen_k, off, qk_scale, v_scale, shape, q_smem, k_smem)
    gl.warp_specialize([(_ws_consume, (0, ) + consume_args), (_ws_consume, (1, ) + consume_args),
                        (_ws_load, load_args)], [4, 1], [CONSUMER_REGS, 24])


@gluon.jit(do_not_specialize=["window_left"])  # (a window of 1 would otherwise compile as a constant)
def _fwd_ws_kernel(Q, K, V, Out, Lse, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                   stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                   seqlen_q, seqlen_k, num_heads, group, sm_scale, window_left, softcap,
                   HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                   NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   Q_SL: gl.constexpr, K_SL: gl.constexpr, V_SL: gl.constexpr, O_SL: gl.constexpr,
                   num_warps: gl.constexpr, HEAD_DIM_B: gl.constexpr = 0, QB_SL: gl.constexpr = None,
                   KB_SL: gl.constexpr = None, NUM_WG: gl.constexpr = 2, OVERLAP: gl.constexpr = True,
                   WINDOW: gl.constexpr = False, HOST_DESC: gl.constexpr = False, QD=None, KD=None, VD=None, OD=None,
                   SOFTCAP: gl.constexpr = False, EXP2_EVERY: gl.constexpr = 0, LAZY: gl.constexpr = 0):
    """The warp-specialised forward in bf16 / fp16 (session 30): the FP8 kernel's loader and ping-pong consumers
    (``_ws_load``, ``_ws_consume`` with ``FP8`` off) over q, k, v as the public function takes them
    ([B, S, H, D], V not transposed: a 16-bit wgmma reads its B operand either way round). HEAD_DIM_B: a second
    part of the q / k head dim (DeepSeek's MLA: q / k 192 = 128 + 64 with v 128; TMA boxes are powers of two), its
    Q and K tiles (layouts QB_SL, KB_SL) loaded from column HEAD_DIM; v's head dim is then HEAD_DIM (the first
    part's) too. NUM_WG: consumer warpgroups (2, or 3 in a ring: 192-row tiles, session 33, for hd 64); OVERLAP:
    the consumers' in-block overlap (``_WsShape``). WINDOW (causal only): query i sees keys i + Sk - Sq -
    ``window_left`` .. i + Sk - Sq, the tile's key blocks from the first its first row sees (``_window_blocks``);
    ``window_left`` is read only with it. HOST_DESC (one head-dim part): q's, k's, v's and out's TMA descriptors made
    on the host (``QD`` .. ``OD``, rank 4 over [B, S, H, D]; the layouts Q_SL .. V_SL rank 4 then) instead of four
    rank-2 ones made by every program (session 47's timeline: ~4 us of a program's set-up). SOFTCAP: the scores
    capped, ``softcap`` * tanh(s * sm_scale / ``softcap``) (Gemma-2's logit softcapping; ``softcap`` read only then),
    the softmax over the capped scores (``_softmax_step``)."""
    BLOCK_M: gl.constexpr = 64 * NUM_WG  # NUM_WG consumer warpgroups of 64 rows
    D_QK: gl.constexpr = HEAD_DIM + HEAD_DIM_B  # q / k columns in memory
    b, h, hk, m0 = _tile(num_heads, group, seqlen_q, BLOCK_M, IS_CAUSAL)
    off = seqlen_k - seqlen_q
    qk_scale, cap_in = _cap_scales(sm_scale, softcap, SOFTCAP)
    b64 = b.to(gl.int64)
    dtype: gl.constexpr = Q.dtype.element_ty
    if HOST_DESC:
        gl.static_assert(HEAD_DIM_B == 0, "host-made descriptors: one head-dim part")
        q_desc, k_desc, v_desc, o_desc = QD, KD, VD, OD
        q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 1, 64, 1, HEAD_DIM], Q_SL)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], K_SL)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], V_SL)
        coords = (b, h, hk)  # (the partitions' rank-4 coordinates)
    else:
        q_desc = tma.make_tensor_descriptor(Q + b64 * stride_qb + h.to(gl.int64) * stride_qh, [seqlen_q, D_QK],
                                            [stride_qs, 1], [64, HEAD_DIM], Q_SL)
        k_desc = tma.make_tensor_descriptor(K + b64 * stride_kb + hk.to(gl.int64) * stride_kh, [seqlen_k, D_QK],
                                            [stride_ks, 1], [BLOCK_N, HEAD_DIM], K_SL)
        v_desc = tma.make_tensor_descriptor(V + b64 * stride_vb + hk.to(gl.int64) * stride_vh, [seqlen_k, HEAD_DIM],
                                            [stride_vs, 1], [BLOCK_N, HEAD_DIM], V_SL)
        o_desc = tma.make_tensor_descriptor(Out + b64 * stride_ob + h.to(gl.int64) * stride_oh, [seqlen_q, HEAD_DIM],
                                            [stride_os, 1], [64, HEAD_DIM], O_SL)
        q_smem = gl.allocate_shared_memory(dtype, [NUM_WG, 64, HEAD_DIM], Q_SL)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], K_SL)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], V_SL)
        coords = 0
    lse_ptr = Lse + b64 * stride_lb + h.to(gl.int64) * stride_lh
    n_blocks, mask_from = _key_blocks(m0, off, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if WINDOW:  # (the partitions' extra arguments: a window's first block, its masked left edge, the window)
        lo, n_blocks, clear_from = _window_blocks(m0, off, window_left, n_blocks, BLOCK_M, BLOCK_N)
        win = (lo, clear_from, window_left)
    else:
        win = (0, 0, 0)

    if HEAD_DIM_B > 0:
        q_desc_b = tma.make_tensor_descriptor(Q + b64 * stride_qb + h.to(gl.int64) * stride_qh, [seqlen_q, D_QK],
                                              [stride_qs, 1], [64, HEAD_DIM_B], QB_SL)
        k_desc_b = tma.make_tensor_descriptor(K + b64 * stride_kb + hk.to(gl.int64) * stride_kh, [seqlen_k, D_QK],
                                              [stride_ks, 1], [BLOCK_N, HEAD_DIM_B], KB_SL)
        q_smem_b = gl.allocate_shared_memory(dtype, [NUM_WG, 64, HEAD_DIM_B], QB_SL)
        k_smem_b = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM_B], KB_SL)
    else:  # (never read: the first part's objects stand in)
        q_desc_b, k_desc_b, q_smem_b, k_smem_b = q_desc, k_desc, q_smem, k_smem
    # out goes through its consumer's (first-part) Q tile (same shape, dtype and layout): that consumer's last
    # wgmma has retired before its epilogue stores there, and nothing else reads it. 32 KiB at hd 128 buys a third
    # stage of 128-key K and V tiles (224 KiB in all)
    o_smem = q_smem
    q_bar, ready, empty, turn = _ws_barriers(NUM_STAGES, NUM_WG)

    shape = _WsShape(HEAD_DIM, BLOCK_N, NUM_STAGES, IS_CAUSAL, False, HEAD_DIM_B, 0, NUM_WG, OVERLAP, WINDOW,
                     HOST_DESC, SOFTCAP, EXP2_EVERY, LAZY)
    load_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, m0, n_blocks, shape, q_desc_b,
                 k_desc_b, q_smem_b, k_smem_b, win[0], coords)
    consume_args = (q_smem, k_smem, v_smem, o_smem, q_bar, ready, empty, turn, o_desc, lse_ptr, m0, n_blocks,
                    mask_from, seqlen_q, seqlen_k, off, qk_scale, 1.0, shape, q_smem_b, k_smem_b) + win + (
                        coords, cap_in)
    if NUM_WG == 3:
        gl.warp_specialize([(_ws_consume, (0, ) + consume_args), (_ws_consume, (1, ) + consume_args),
                            (_ws_consume, (2, ) + consume_args), (_ws_load, load_args)], [4, 4, 1],
                           [CONSUMER_REGS, CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_ws_consume, (0, ) + consume_args), (_ws_consume, (1, ) + consume_args),
                            (_ws_load, load_args)], [4, 1], [CONSUMER_REGS, 24])


# --------------------------------------------------------------------------------------------
# Persistent (16-bit): the same schedule looping over 128-row tiles, one program an SM (session 30; measured and
# routed in sessions 31-32 at hd 128 and MLA 192 / 128: configs.FWD_GLUON_WS_PERSISTENT)
# --------------------------------------------------------------------------------------------


@gluon.jit
def _second_part(Q, K, batch, seqlen_q, seqlen_k, num_heads, kv_heads, stride_qb, stride_qs, stride_qh, stride_kb,
                 stride_ks, stride_kh, q_desc, k_desc, q_smem, k_smem, HEAD_DIM: gl.constexpr,
                 HEAD_DIM_B: gl.constexpr, Q_TILES: gl.constexpr, Q_ROWS: gl.constexpr, K_TILES: gl.constexpr,
                 K_ROWS: gl.constexpr, QB_SL: gl.constexpr, KB_SL: gl.constexpr):
    """The second q / k head-dim part's rank-4 TMA descriptors (boxes of HEAD_DIM_B columns, read from column
    HEAD_DIM) and tiles (Q_TILES x Q_ROWS rows, K_TILES x K_ROWS) of a kernel with ``HEAD_DIM_B`` (MLA's 192 =
    128 + 64), or without one the first part's objects as stand-ins that are never read: (q_desc_b, k_desc_b,
    q_smem_b, k_smem_b). The 16-bit forwards' and both backward kernels' set-up."""
    if HEAD_DIM_B > 0:
        D_QK: gl.constexpr = HEAD_DIM + HEAD_DIM_B
        dtype: gl.constexpr = Q.dtype.element_ty
        q_desc_b = tma.make_tensor_descriptor(Q, [batch, seqlen_q, num_heads, D_QK],
                                              [stride_qb, stride_qs, stride_qh, 1], [1, Q_ROWS, 1, HEAD_DIM_B], QB_SL)
        k_desc_b = tma.make_tensor_descriptor(K, [batch, seqlen_k, kv_heads, D_QK],
                                              [stride_kb, stride_ks, stride_kh, 1], [1, K_ROWS, 1, HEAD_DIM_B], KB_SL)
        q_smem_b = gl.allocate_shared_memory(dtype, [Q_TILES, 1, Q_ROWS, 1, HEAD_DIM_B], QB_SL)
        k_smem_b = gl.allocate_shared_memory(dtype, [K_TILES, 1, K_ROWS, 1, HEAD_DIM_B], KB_SL)
        return q_desc_b, k_desc_b, q_smem_b, k_smem_b
    else:
        return q_desc, k_desc, q_smem, k_smem


@gluon.jit
def _p_coords(t, n_m, batch_heads, heads, group, IS_CAUSAL: gl.constexpr, TILE_ORDER: gl.constexpr):
    """Tile ``t``'s (batch, query head, kv head, first query row), ``TILE_ORDER`` indexing :data:`TILE_ORDERS`.
    0, query-block major: query blocks outer, (batch, head) inner, so the grid's programs start on one query block
    of many heads (causal: the heaviest first over the whole grid). 1, kv-head major: (batch, kv head) outer, then
    query blocks, the group's query heads inner, so programs running together share one kv head's K / V (MHA: the
    non-persistent grid's order). Causal: each query-block loop runs from its heaviest block (most keys). 2, kv-head
    major snaking: odd (batch, kv head) units run their query blocks the other way (causal: lightest first), so the
    static round-robin (tile t to program t mod the grid) hands each program heavy and light tiles alike."""
    if TILE_ORDER != 0:
        per = n_m * group
        bk = t // per
        r = t - bk * per
        pid_m = r // group
        kv_heads = heads // group
        h = (bk % kv_heads) * group + (r - pid_m * group)
        b = bk // kv_heads
        if TILE_ORDER == 2:
            pid_m = pid_m + (bk % 2) * (n_m - 1 - 2 * pid_m)
    else:
        bh = t % batch_heads
        pid_m = t // batch_heads
        h = bh % heads
        b = bh // heads
    if IS_CAUSAL:
        pid_m = n_m - 1 - pid_m
    return b, h, h // group, pid_m * 128


@gluon.jit
def _p_load(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, ready, empty, num_tiles, n_m,
            batch_heads, heads, group, seqlen_q, seqlen_k, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b):
    """The persistent loader warp: per tile, both consumers' Q once both have retired the last tile's Q K^T
    (``q_free``), then K and V block by block into the slots the consumers release, the blocks counted over
    tiles (slot ``it % NUM_STAGES``, phase ``(it // NUM_STAGES) & 1``). Rank-4 descriptors over [B, S, H, D]: one
    per tensor and program, boxes past a sequence's end zero-filled. With ``shape.HEAD_DIM_B`` the second head-dim
    part's Q and K tiles too (``*_b``: from column HEAD_DIM), as ``_ws_load``."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    off = seqlen_k - seqlen_q
    it = 0
    i = 0
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, hk, m0 = _p_coords(t, n_m, batch_heads, heads, group, IS_CAUSAL, shape.TILE_ORDER)
        n_blocks = _key_blocks(m0, off, seqlen_k, 128, BLOCK_N, IS_CAUSAL)[0]
        mbarrier.wait(q_free, (i - 1) & 1, pred=i > 0)
        mbarrier.expect(q_bar, 2 * 64 * (HEAD_DIM + HEAD_DIM_B) * 2)
        tma.async_copy_global_to_shared(q_desc, [b, m0, h, 0], q_bar, q_smem.index(0))
        tma.async_copy_global_to_shared(q_desc, [b, m0 + 64, h, 0], q_bar, q_smem.index(1))
        if HEAD_DIM_B > 0:
            tma.async_copy_global_to_shared(q_desc_b, [b, m0, h, HEAD_DIM], q_bar, q_smem_b.index(0))
            tma.async_copy_global_to_shared(q_desc_b, [b, m0 + 64, h, HEAD_DIM], q_bar, q_smem_b.index(1))
        for j in range(0, n_blocks):
            slot = it % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) - 1) & 1, pred=it >= NUM_STAGES)
            mbarrier.expect(ready.index(slot), BLOCK_N * (2 * HEAD_DIM + HEAD_DIM_B) * 2)
            tma.async_copy_global_to_shared(k_desc, [b, j * BLOCK_N, hk, 0], ready.index(slot), k_smem.index(slot))
            if HEAD_DIM_B > 0:
                tma.async_copy_global_to_shared(k_desc_b, [b, j * BLOCK_N, hk, HEAD_DIM], ready.index(slot),
                                                k_smem_b.index(slot))
            tma.async_copy_global_to_shared(v_desc, [b, j * BLOCK_N, hk, 0], ready.index(slot), v_smem.index(slot))
            it += 1
        i += 1


@gluon.jit
def _p_consume(wg, q_smem, k_smem, v_smem, q_bar, q_free, ready, empty, turn, Out, Lse, stride_ob, stride_os,
               stride_oh, stride_lb, stride_lh, num_tiles, n_m, batch_heads, heads, group, seqlen_q, seqlen_k,
               qk_scale, shape, q_smem_b, k_smem_b, cap_in=0.0):
    """One persistent consumer warpgroup: ``_ws_consume``'s ping-pong schedule per tile, the turns, blocks and tiles
    counted over the program's tiles; after a tile's last Q K^T it frees Q's tile for the loader (the next tile's
    Q lands while this one's last P V and epilogue run), releases every block's slot (the last one too), and
    stores out from registers (no shared tile of its own: Q's is the next tile's by then). With
    ``shape.HEAD_DIM_B`` the scores are two chained wgmmas over both head-dim parts (``_ws_scores``); with
    ``shape.SOFTCAP`` they are capped (``cap_in``: ``_softmax_step``'s)."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    KB_DIM: gl.constexpr = HEAD_DIM_B if HEAD_DIM_B > 0 else HEAD_DIM  # the second part's tiles (read only with it)
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    O_COLS: gl.constexpr = gl.SliceLayout(0, O_LAYOUT)
    P_DTYPE: gl.constexpr = k_smem.dtype
    LAZY: gl.constexpr = shape.LAZY
    mine = turn.index(wg)
    other = turn.index(1 - wg)
    off = seqlen_k - seqlen_q
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, layout=S_LAYOUT)
    q = q_smem.index(wg).reshape([64, HEAD_DIM])
    q_b = q_smem_b.index(wg).reshape([64, KB_DIM])
    mbarrier.arrive(turn.index(0), count=1, pred=wg == 1)  # consumer 0 issues first
    tc = 0  # turns taken
    it = 0  # key blocks consumed
    i = 0  # tiles
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        b, h, hk, m0 = _p_coords(t, n_m, batch_heads, heads, group, IS_CAUSAL, shape.TILE_ORDER)
        n_blocks, mask_from = _key_blocks(m0, off, seqlen_k, 128, BLOCK_N, IS_CAUSAL)
        row0 = m0 + wg * 64
        offs_m = row0 + gl.arange(0, 64, layout=ROWS)
        m_i = gl.full([64], float("-inf"), gl.float32, layout=ROWS)
        l_i = gl.zeros([64], gl.float32, layout=ROWS)
        acc = gl.zeros([64, HEAD_DIM], gl.float32, layout=O_LAYOUT)
        mbarrier.wait(q_bar, i & 1)
        mbarrier.wait(ready.index(it % NUM_STAGES), (it // NUM_STAGES) & 1)
        mbarrier.wait(mine, tc & 1)
        s = _ws_scores(q, q_b, k_smem.index(it % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]),
                       k_smem_b.index(it % NUM_STAGES).reshape([BLOCK_N, KB_DIM]), s_zero, HEAD_DIM_B)
        _pass(other)
        tc += 1
        s = warpgroup_mma_wait(0, deps=(s, ))
        p, alpha, m_i, l_i, rescale = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, 0, seqlen_k, off, mask_from <= 0,
                                                  IS_CAUSAL, BLOCK_N, S_LAYOUT, 0, False, cap_in, shape.SOFTCAP,
                                                  shape.EXP2_EVERY, LAZY)
        for j in range(0, n_blocks - 1):
            cur = it + j
            nxt = cur + 1
            mbarrier.wait(ready.index(nxt % NUM_STAGES), (nxt // NUM_STAGES) & 1)
            mbarrier.wait(mine, tc & 1)
            s_next = _ws_scores(q, q_b, k_smem.index(nxt % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]),
                                k_smem_b.index(nxt % NUM_STAGES).reshape([BLOCK_N, KB_DIM]), s_zero, HEAD_DIM_B)
            acc = _rescale_o(acc, alpha, rescale, O_ROWS, LAZY)
            p16 = gl.convert_layout(p.to(P_DTYPE), P_LAYOUT)
            acc = warpgroup_mma(p16, v_smem.index(cur % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
            _pass(other)
            tc += 1
            s = warpgroup_mma_wait(1, deps=(s_next, ))  # S_{j+1} done; P_j V_j may still run
            p, alpha, m_i, l_i, rescale = _ws_softmax(s, m_i, l_i, qk_scale, offs_m, (j + 1) * BLOCK_N, seqlen_k,
                                                      off, (j + 1) * BLOCK_N >= mask_from, IS_CAUSAL, BLOCK_N,
                                                      S_LAYOUT, 0, False, cap_in, shape.SOFTCAP, shape.EXP2_EVERY,
                                                      LAZY)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            _pass(empty.index(cur % NUM_STAGES))  # block cur's K and V read: the slot is free
        # every Q K^T of this tile retired (waited above by every warp): Q's tile is the loader's again
        _pass(q_free)
        last = it + n_blocks - 1
        mbarrier.wait(mine, tc & 1)
        acc = _rescale_o(acc, alpha, rescale, O_ROWS, LAZY)
        p16 = gl.convert_layout(p.to(P_DTYPE), P_LAYOUT)
        acc = warpgroup_mma(p16, v_smem.index(last % NUM_STAGES).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        _pass(other)
        tc += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        _pass(empty.index(last % NUM_STAGES))
        acc, lse = _ws_finish(acc, m_i, l_i, 1.0, O_ROWS)  # the epilogue, from registers
        b64 = b.to(gl.int64)
        gl.store(Lse + b64 * stride_lb + h.to(gl.int64) * stride_lh + offs_m, lse, mask=offs_m < seqlen_q)
        rows = row0 + gl.arange(0, 64, layout=O_ROWS)
        cols = gl.arange(0, HEAD_DIM, layout=O_COLS)
        o_ptr = Out + b64 * stride_ob + h.to(gl.int64) * stride_oh + gl.expand_dims(rows.to(gl.int64) * stride_os, 1) \
            + gl.expand_dims(cols, 0)
        gl.store(o_ptr, acc.to(Out.dtype.element_ty), mask=gl.expand_dims(rows < seqlen_q, 1))
        it += n_blocks
        i += 1


@gluon.jit
def _fwd_ws_persistent_kernel(Q, K, V, Out, Lse, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                              stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                              batch, seqlen_q, seqlen_k, num_heads, group, sm_scale, softcap,
                              HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                              NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, TILE_ORDER: gl.constexpr,
                              Q_SL: gl.constexpr, K_SL: gl.constexpr, V_SL: gl.constexpr, num_warps: gl.constexpr,
                              HEAD_DIM_B: gl.constexpr = 0, QB_SL: gl.constexpr = None, KB_SL: gl.constexpr = None,
                              SOFTCAP: gl.constexpr = False, EXP2_EVERY: gl.constexpr = 0, LAZY: gl.constexpr = 0):
    """``_fwd_ws_kernel`` as one program an SM looping over the 128-row tiles (grid: at most the SM count): the
    descriptors made once a program (rank 4, over [B, S, H, D]), the next tile's Q and first key blocks loaded
    while this tile's last P V and epilogue run. ``TILE_ORDER``: the tile order (``_p_coords``). ``HEAD_DIM_B``: a
    second part of the q / k head dim as in ``_fwd_ws_kernel`` (MLA's 192 = 128 + 64, v 128). ``SOFTCAP``: the
    scores capped as in ``_fwd_ws_kernel``."""
    qk_scale, cap_in = _cap_scales(sm_scale, softcap, SOFTCAP)
    kv_heads = num_heads // group
    D_QK: gl.constexpr = HEAD_DIM + HEAD_DIM_B  # q / k columns in memory
    q_desc = tma.make_tensor_descriptor(Q, [batch, seqlen_q, num_heads, D_QK], [stride_qb, stride_qs, stride_qh, 1],
                                        [1, 64, 1, HEAD_DIM], Q_SL)
    k_desc = tma.make_tensor_descriptor(K, [batch, seqlen_k, kv_heads, D_QK], [stride_kb, stride_ks, stride_kh, 1],
                                        [1, BLOCK_N, 1, HEAD_DIM], K_SL)
    v_desc = tma.make_tensor_descriptor(V, [batch, seqlen_k, kv_heads, HEAD_DIM], [stride_vb, stride_vs, stride_vh, 1],
                                        [1, BLOCK_N, 1, HEAD_DIM], V_SL)
    n_m = gl.cdiv(seqlen_q, 128)
    batch_heads = batch * num_heads
    num_tiles = n_m * batch_heads

    dtype: gl.constexpr = Q.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 64, 1, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], V_SL)
    q_desc_b, k_desc_b, q_smem_b, k_smem_b = _second_part(
        Q, K, batch, seqlen_q, seqlen_k, num_heads, kv_heads, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
        stride_kh, q_desc, k_desc, q_smem, k_smem, HEAD_DIM, HEAD_DIM_B, 2, 64, NUM_STAGES, BLOCK_N, QB_SL, KB_SL)
    q_bar, ready, empty, turn = _ws_barriers(NUM_STAGES)
    q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_free, count=2)  # both consumers retire their Q K^T

    shape = _WsShape(HEAD_DIM, BLOCK_N, NUM_STAGES, IS_CAUSAL, False, HEAD_DIM_B, TILE_ORDER, SOFTCAP=SOFTCAP,
                     EXP2_EVERY=EXP2_EVERY, LAZY=LAZY)
    tiles = (num_tiles, n_m, batch_heads, num_heads, group, seqlen_q, seqlen_k)
    load_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_free, ready, empty) + tiles + (
        shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b)
    consume_args = (q_smem, k_smem, v_smem, q_bar, q_free, ready, empty, turn, Out, Lse, stride_ob, stride_os,
                    stride_oh, stride_lb, stride_lh) + tiles + (qk_scale, shape, q_smem_b, k_smem_b, cap_in)
    gl.warp_specialize([(_p_consume, (0, ) + consume_args), (_p_consume, (1, ) + consume_args),
                        (_p_load, load_args)], [4, 1], [CONSUMER_REGS, 24])


def _layouts(block_m: int, block_n: int, d: int, out=gl.bfloat16) -> dict:
    e4m3 = gl.float8e4nv
    return {"Q_SL": gl.NVMMASharedLayout.get_default_for([block_m, d], e4m3),
            "K_SL": gl.NVMMASharedLayout.get_default_for([block_n, d], e4m3),
            "V_SL": gl.NVMMASharedLayout.get_default_for([d, block_n], e4m3),
            "O_SL": gl.NVMMASharedLayout.get_default_for([block_m, d], out)}


def _prepare(name, q, k, vt, descales, softmax_scale, num_stages, min_stages, poison, out_dtype=torch.bfloat16):
    """Check a call of either kernel (ValueError / RuntimeError naming what it cannot run), make out and
    lse (NaN-filled with ``poison``), and return (out, lse, the kernel's leading positional arguments)."""
    b, sq, hq, d = q.shape
    hk = k.shape[2]
    if d not in HEAD_DIMS or vt.shape[2] != d:
        raise ValueError(f"{name}: head dims {HEAD_DIMS} with d_v = d, got q {d} and v {vt.shape[2]}")
    if hq % hk:
        raise ValueError(f"{name}: {hq} query heads are not a multiple of {hk} kv heads")
    if num_stages < min_stages:
        raise ValueError(f"{name}: num_stages must be at least {min_stages}")
    if any(t.dtype != torch.float8_e4m3fn for t in (q, k, vt)):
        raise ValueError(f"{name}: q, k, v must be torch.float8_e4m3fn, got {q.dtype}, {k.dtype}, {vt.dtype}")
    if vt.stride(-1) != 1 or vt.stride(2) % 16:
        raise ValueError(f"{name}: vt must be [B, Hk, D, Sk] with keys contiguous and 16-byte rows "
                         "(v_layout.v_keys_contiguous)")
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        raise RuntimeError(f"{name}: needs an sm90 GPU (Hopper's wgmma and TMA; Gluon has no interpreter)")
    out = q.new_empty((b, sq, hq, d), dtype=out_dtype)
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    if poison:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    launcher.ensure_allocator()
    return out, lse, _launch_args(q, k, vt, out, lse, descales, softmax_scale)


def _launch_args(q, k, vt, out, lse, descales, softmax_scale) -> tuple:
    """Both kernels' leading positional arguments, in their signatures' order (a CPU test binds them)."""
    qds, kds, vds = descales
    return (q, k, vt, out, lse, qds, kds, vds, qds.stride(0), q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2), vt.stride(0), vt.stride(1), vt.stride(2),
            out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1), q.shape[1], k.shape[1],
            q.shape[2], q.shape[2] // k.shape[2], float(softmax_scale))


def fp8_fwd_gluon(q, k, vt, descales, *, softmax_scale, causal, block_m=64, block_n=128, num_stages=3,
                  overlap=1, poison=False):
    """out [B, Sq, Hq, D] bf16, lse [B, Hq, Sq] fp32 of e4m3 q [B, Sq, Hq, D], k [B, Sk, Hk, D] and V
    keys-contiguous ``vt`` [B, Hk, D, Sk] (``v_layout.v_keys_contiguous``), descales (q, k, v) each
    (B, Hk) float32. sm90 GPUs only. ``overlap``: the kernel's OVERLAP bits (module docstring; 1
    measured best). ``poison``: fill out and lse with NaN first (checks)."""
    if block_m != 64:  # one warpgroup: with two, a slot could be refilled while the other still reads it
        raise ValueError(f"fp8_fwd_gluon: block_m must be 64 (one warpgroup), got {block_m}")
    # min 3 stages: block j + 1 is waited for before block j - 1's slot is free to take it
    out, lse, args = _prepare("fp8_fwd_gluon", q, k, vt, descales, softmax_scale, num_stages, 3, poison)
    grid = (triton.cdiv(q.shape[1], block_m), q.shape[0] * q.shape[2])
    _fp8_fwd_kernel[grid](*args, HEAD_DIM=q.shape[-1], BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=bool(causal),
                          NUM_STAGES=num_stages, OVERLAP=overlap, **_layouts(block_m, block_n, q.shape[-1]),
                          num_warps=block_m // 16)
    return out, lse


def fp8_fwd_gluon_ws(q, k, vt, descales, *, softmax_scale, causal, block_n=128, num_stages=3, consumer_regs=240,
                     poison=False, out_dtype=torch.bfloat16):
    """The warp-specialised kernel (a loader warp, two consumer warpgroups of 64 query rows, 128-row tiles):
    arguments and results as :func:`fp8_fwd_gluon`. ``consumer_regs``: the second consumer's register
    budget (``setmaxnreg``; the loader keeps 24, the first consumer takes what is left). ``out_dtype``:
    bf16, or float8_e4m3fn for out in V's units (real value = out x v_descale, as flash_attn_fp8_func's)."""
    if out_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise ValueError(f"fp8_fwd_gluon_ws: out_dtype bfloat16 or float8_e4m3fn, got {out_dtype}")
    out, lse, args = _prepare("fp8_fwd_gluon_ws", q, k, vt, descales, softmax_scale, num_stages, 2, poison,
                              out_dtype)
    fp8_out = out_dtype == torch.float8_e4m3fn
    grid = (triton.cdiv(q.shape[1], 128), q.shape[0] * q.shape[2])
    _fp8_fwd_ws_kernel[grid](*args, HEAD_DIM=q.shape[-1], BLOCK_N=block_n, IS_CAUSAL=bool(causal),
                             NUM_STAGES=num_stages, CONSUMER_REGS=consumer_regs,
                             **_layouts(64, block_n, q.shape[-1], gl.float8e4nv if fp8_out else gl.bfloat16),
                             num_warps=4, OUT_FP8=fp8_out)
    return out, lse


#: (q / k head dim, v head dim) pairs the 16-bit warp-specialised forward runs; configs.FWD_GLUON_WS routes the
#: measured winners (hd 128; DeepSeek's MLA training form 192 / 128 at 64-key tiles x 4 stages, 208 KiB, since
#: session 31). hd 256 compiles without spill (64-key tiles x 2 stages or 32 x 4, 192 KiB): not yet timed on a GPU.
WS16_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (192, 128))
#: consumer warpgroups the (not persistent) 16-bit kernel takes: 2 (128-row tiles, ping-pong) or 3 (192-row tiles, the
#: turns in a ring: flash-attn 3's tiles at hd 64; session 33, compiled on the CPU)
WS16_CONSUMERS = (2, 3)
#: each consumer warpgroup's registers (setmaxnreg) by consumers: 2 x 4 warps at 240 beside the loader warp's 24 fill
#: the 64 K register file, 3 x 4 at 160 the same (168 would leave 256 spare)
WS16_CONSUMER_REGS = {2: 240, 3: 160}
#: the persistent kernel's tile orders (``_p_coords``): "query" (query blocks outer, every (batch, head) inner) and
#: "kv" ((batch, kv head) outer, query blocks, the group's query heads inner), "kv-snake" (as "kv", every other
#: (batch, kv head) unit's query blocks the other way round: the causal round-robin balanced; session 31, compiled
#: on the CPU, not yet timed)
TILE_ORDERS = ("query", "kv", "kv-snake")


def tile_query_blocks(order: str, batch: int, heads: int, kv_heads: int, n_m: int) -> list[int]:
    """Each persistent tile's query block (0: the sequence's first) in tile order ``order`` of :data:`TILE_ORDERS`,
    causal (the heaviest first): ``_p_coords``' arithmetic on the host (tile t goes to program t mod the grid)."""
    group = heads // kv_heads
    blocks = []
    for t in range(batch * heads * n_m):
        if order == "query":
            pid_m = t // (batch * heads)
        else:
            unit, r = divmod(t, n_m * group)
            pid_m = r // group
            if order == "kv-snake" and unit % 2:
                pid_m = n_m - 1 - pid_m
        blocks.append(n_m - 1 - pid_m)
    return blocks


def persistent_balance(order: str, batch: int, heads: int, kv_heads: int, seqlen_q: int, seqlen_k: int,
                       programs: int, block_n: int = 128, overhead: float = 1.5) -> float:
    """A model of how evenly the persistent forward's static round-robin spreads a causal call's work in tile order
    ``order``: the mean program load over the largest (1.0: every program ends together; the kernel's time follows
    the largest). A tile's load is the key blocks of ``block_n`` its 128 query rows see (bottom-right aligned) plus
    ``overhead`` blocks of fixed work (prologue, epilogue). No GPU; benchmarks/persistent_balance.py prints it for
    the sweep's and real models' shapes (session 31 measured the kv order at MHA causal 16k at 0.72-0.79x the
    one-program-a-tile kernel where the model reads 0.64 against 0.94 for the query order)."""
    n_m = -(-seqlen_q // 128)
    off = seqlen_k - seqlen_q
    cost = [-(-max(0, min(seqlen_k, (m + 1) * 128 + off)) // block_n) + overhead for m in range(n_m)]
    load = [0.0] * max(1, min(programs, batch * heads * n_m))
    for t, m in enumerate(tile_query_blocks(order, batch, heads, kv_heads, n_m)):
        load[t % len(load)] += cost[m]
    return sum(load) / len(load) / max(load)


_WS16_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def _ws16_parts(d: int, dv: int) -> tuple[int, int]:
    """(first part, second part) of the q / k head dim ``d`` in the 16-bit kernel: (d, 0), or where v is narrower
    (MLA's 192 / 128) (dv, d - dv)."""
    return (d, 0) if dv == d else (dv, d - dv)


def _ws16_layouts(block_n: int, d: int, dtype, dv: int | None = None) -> dict:
    g = _WS16_DTYPES[dtype]
    first, second = _ws16_parts(d, d if dv is None else dv)
    out = {"Q_SL": gl.NVMMASharedLayout.get_default_for([64, first], g),
           "K_SL": gl.NVMMASharedLayout.get_default_for([block_n, first], g),
           "V_SL": gl.NVMMASharedLayout.get_default_for([block_n, first], g),
           "O_SL": gl.NVMMASharedLayout.get_default_for([64, first], g)}
    if second:
        out.update(HEAD_DIM_B=second, QB_SL=gl.NVMMASharedLayout.get_default_for([64, second], g),
                   KB_SL=gl.NVMMASharedLayout.get_default_for([block_n, second], g))
    return out


def _ws16_rank4_layouts(block_n: int, d: int, g) -> tuple:
    """(rows, keys): the shared layouts of rank-4 [1, 64, 1, d] and [1, block_n, 1, d] TMA boxes in gluon dtype ``g``
    (Q / out's and K / V's tiles in the persistent kernel and with host-made descriptors)."""
    return (gl.NVMMASharedLayout.get_default_for([1, 64, 1, d], g),
            gl.NVMMASharedLayout.get_default_for([1, block_n, 1, d], g))


def window_argument(window_left: int, q, k) -> int:
    """The Gluon kernels' ``window_left`` argument for q [B, Sq, ...] and k [B, Sk, ...]: 0 without a window (not
    read), else the window, at most Sq + Sk (a wider one sees the same keys, and the kernels' int32 sums of it and a
    row or key index cannot overflow)."""
    return min(max(int(window_left), 0), q.shape[1] + k.shape[1])


def ws16_arguments(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages, consumer_regs,
                   consumers=2, overlap=True, window_left=-1, host_desc=False, softcap=0.0, exp2_every=0,
                   lazy=0) -> dict:
    """Every argument of ``_fwd_ws_kernel`` by name for a dense call (a CPU compile binds the same); ``consumers``:
    its consumer warpgroups (:data:`WS16_CONSUMERS`; 64 query rows each); ``consumer_regs`` None: theirs by
    :data:`WS16_CONSUMER_REGS`; ``overlap`` False: no in-block overlap (``_WsShape.OVERLAP``); ``window_left`` >= 0
    (causal calls only): a sliding window on the left (the kernel's ``WINDOW``); ``host_desc``: its TMA descriptors
    made here (its ``HOST_DESC``: rank 4, :data:`HOST_DESCRIPTOR_OF`; q / k = v head dims) instead of by every
    program; ``softcap`` > 0: the scores capped, softcap * tanh(s / softcap) (its ``SOFTCAP``); ``exp2_every`` (one
    of :data:`EXP2_EVERY_CHOICES`; 0: off): one of each that many exponentials by a cubic (its ``EXP2_EVERY``);
    ``lazy`` (one of :data:`LAZY_CHOICES`; 0: off): the lazy rescale, O rescaled only in blocks where a row's max
    grew by more than that many base-2 units (its ``LAZY``, :func:`_softmax_step_lazy`)."""
    why = ws16_refused(causal, False, consumers, overlap, window_left, host_desc, q.shape[-1], v.shape[-1], softcap,
                       exp2_every, lazy)
    if why:
        raise ValueError(f"ws16_arguments: {why}")
    if consumer_regs is None:
        consumer_regs = WS16_CONSUMER_REGS[consumers]
    layouts = _ws16_layouts(block_n, q.shape[-1], q.dtype, v.shape[-1])
    if host_desc:
        from .bwd_gluon import _host_descriptors

        d = q.shape[-1]
        rows, keys = _ws16_rank4_layouts(block_n, d, _WS16_DTYPES[q.dtype])
        layouts = dict(Q_SL=rows, K_SL=keys, V_SL=keys, O_SL=rows, **_host_descriptors(
            layouts.get("HEAD_DIM_B", 0), QD=(q, 64, d, rows), KD=(k, block_n, d, keys), VD=(v, block_n, d, keys),
            OD=(out, 64, d, rows)))
    return dict(({} if consumers == 2 else {"NUM_WG": consumers}), **({} if overlap else {"OVERLAP": False}),
                **({"WINDOW": True} if window_left >= 0 else {}), window_left=window_argument(window_left, q, k),
                **({"SOFTCAP": True} if softcap else {}), softcap=float(softcap or 0.0),
                **({"EXP2_EVERY": int(exp2_every)} if exp2_every else {}), **({"LAZY": int(lazy)} if lazy else {}),
                Q=q, K=k, V=v, Out=out, Lse=lse, stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2),
                stride_kb=k.stride(0), stride_ks=k.stride(1), stride_kh=k.stride(2), stride_vb=v.stride(0),
                stride_vs=v.stride(1), stride_vh=v.stride(2), stride_ob=out.stride(0), stride_os=out.stride(1),
                stride_oh=out.stride(2), stride_lb=lse.stride(0), stride_lh=lse.stride(1), seqlen_q=q.shape[1],
                seqlen_k=k.shape[1], num_heads=q.shape[2], group=q.shape[2] // k.shape[2],
                sm_scale=float(softmax_scale), HEAD_DIM=_ws16_parts(q.shape[-1], v.shape[-1])[0], BLOCK_N=block_n,
                IS_CAUSAL=bool(causal), NUM_STAGES=num_stages, CONSUMER_REGS=consumer_regs, **layouts, num_warps=4)


def ws16_persistent_arguments(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages, consumer_regs,
                              tile_order="query", softcap=0.0, exp2_every=0, lazy=0) -> dict:
    """Every argument of ``_fwd_ws_persistent_kernel`` by name (its layouts rank 4: boxes [1, rows, 1, D]);
    ``tile_order``: one of :data:`TILE_ORDERS`; ``softcap`` > 0: the scores capped (its ``SOFTCAP``);
    ``exp2_every``, ``lazy``: :func:`ws16_arguments`'."""
    if tile_order not in TILE_ORDERS:
        raise ValueError(f"tile_order: one of {TILE_ORDERS}, got {tile_order!r}")
    why = ws16_refused(causal, True, 2, True, -1, False, q.shape[-1], v.shape[-1], softcap, exp2_every, lazy)
    if why:
        raise ValueError(f"ws16_persistent_arguments: {why}")
    if consumer_regs is None:
        consumer_regs = WS16_CONSUMER_REGS[2]
    g = _WS16_DTYPES[q.dtype]
    d, second = _ws16_parts(q.shape[-1], v.shape[-1])
    rows, keys = _ws16_rank4_layouts(block_n, d, g)
    parts = {}
    if second:  # MLA's 192 / 128: the second q / k part's boxes (rank 4)
        parts = dict(HEAD_DIM_B=second, QB_SL=gl.NVMMASharedLayout.get_default_for([1, 64, 1, second], g),
                     KB_SL=gl.NVMMASharedLayout.get_default_for([1, block_n, 1, second], g))
    return dict(Q=q, K=k, V=v, Out=out, Lse=lse, stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2),
                stride_kb=k.stride(0), stride_ks=k.stride(1), stride_kh=k.stride(2), stride_vb=v.stride(0),
                stride_vs=v.stride(1), stride_vh=v.stride(2), stride_ob=out.stride(0), stride_os=out.stride(1),
                stride_oh=out.stride(2), stride_lb=lse.stride(0), stride_lh=lse.stride(1), batch=q.shape[0],
                seqlen_q=q.shape[1], seqlen_k=k.shape[1], num_heads=q.shape[2], group=q.shape[2] // k.shape[2],
                sm_scale=float(softmax_scale), HEAD_DIM=d, BLOCK_N=block_n, IS_CAUSAL=bool(causal),
                NUM_STAGES=num_stages, CONSUMER_REGS=consumer_regs, TILE_ORDER=TILE_ORDERS.index(tile_order),
                Q_SL=rows, K_SL=keys, V_SL=keys, num_warps=4, **parts, softcap=float(softcap or 0.0),
                **({"SOFTCAP": True} if softcap else {}), **({"EXP2_EVERY": int(exp2_every)} if exp2_every else {}),
                **({"LAZY": int(lazy)} if lazy else {}))


def ws16_refused(causal: bool, persistent: bool, consumers: int, overlap: bool, window_left: int, host_desc: bool,
                 d: int, dv: int, softcap: float = 0.0, exp2_every: int = 0, lazy: int = 0) -> str | None:
    """Why the 16-bit forward cannot run these options together (q / k head dim ``d``, v's ``dv``), or None: the
    persistent kernel has two consumers with their in-block overlap, no window and its own descriptors; a window
    on the left needs causal (its right bound); host-made descriptors one head-dim part; a softcap is > 0; the
    cubic's share of the exponentials one of :data:`EXP2_EVERY_CHOICES` (0: none); the lazy rescale's bound one of
    :data:`LAZY_CHOICES` (0: none)."""
    if exp2_every and exp2_every not in EXP2_EVERY_CHOICES:
        return f"exp2_every: one of {EXP2_EVERY_CHOICES} (0: off), got {exp2_every}"
    if lazy and lazy not in LAZY_CHOICES:
        return f"lazy: one of {LAZY_CHOICES} (0: off), got {lazy}"
    if consumers not in WS16_CONSUMERS or (persistent and consumers != 2):
        return f"consumers {WS16_CONSUMERS} (the persistent kernel: 2), got {consumers}"
    if persistent and not overlap:
        return "the persistent kernel keeps its in-block overlap (overlap=True)"
    if window_left >= 0 and (persistent or not causal):
        return "a window on the left needs causal=True and persistent=False"
    if host_desc and (persistent or d != dv):
        return "host-made descriptors (host_desc) need persistent=False and q / k = v head dims"
    return softcap_refused(softcap)


def softcap_refused(softcap: float) -> str | None:
    """Why ``softcap`` is no cap a kernel takes (it is > 0, or 0 for none), or None: the 16-bit forwards' and the
    backward's Gluon kernels' rule."""
    if softcap and not softcap > 0:
        return f"a softcap is a positive cap (0: none), got {softcap}"
    return None


def ws16_unsupported(q, k, v) -> str | None:
    """Why the 16-bit warp-specialised forward cannot run q, k, v ([B, S, H, D] dense), or None: dtypes, head dims
    (:data:`WS16_HEAD_DIMS`), GQA grouping, and TMA's rule (16-byte aligned base and row strides, unit
    stride along the head dim). The device (an sm90 GPU) is the caller's to check."""
    if q.dtype not in _WS16_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v in bf16 or fp16 alike, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "dense [B, S, H, D] inputs"
    d = q.shape[-1]
    if (d, v.shape[-1]) not in WS16_HEAD_DIMS or k.shape[-1] != d:
        return f"(q / k, v) head dims among {WS16_HEAD_DIMS}, got q {d}, k {k.shape[-1]}, v {v.shape[-1]}"
    if q.shape[2] % k.shape[2] or v.shape[2] != k.shape[2]:
        return f"{q.shape[2]} query heads over {k.shape[2]} kv heads"
    for t in (q, k, v):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(x * t.element_size() % 16 for x in t.stride()[:3]):
            return "16-byte aligned rows with the head dim contiguous (TMA)"
    return None


def fwd_gluon_ws(q, k, v, *, softmax_scale, causal, block_n=128, num_stages=2, consumer_regs=None, poison=False,
                 launches=None, persistent=False, tile_order="query", consumers=2, overlap=True, window_left=-1,
                 host_desc=False, softcap=0.0, exp2_every=0, lazy=0):
    """out [B, Sq, Hq, D] (q's dtype) and lse [B, Hq, Sq] fp32 of bf16 / fp16 q [B, Sq, Hq, D], k and v
    [B, Sk, Hk, D] (GQA when Hq > Hk; causal bottom-right aligned), with the warp-specialised kernel: a loader
    warp, two consumer warpgroups of 64 query rows in flash-attn 3's ping-pong, 128-row tiles. sm90 GPUs only
    (Gluon has no interpreter). ``launches``: a dict this call replays its launch from, or leaves it in
    (kernels/launcher.py; the caller keys it on the call's signature). ``poison``: NaN-fill out and lse first.
    ``persistent``: ``_fwd_ws_persistent_kernel`` (one program an SM over the tiles), its tiles in
    ``tile_order`` (:data:`TILE_ORDERS`; ``benchmarks/gluon_ws_probe.py --ws p:BLOCK_N,STAGES`` / ``pk:...``).
    ``consumers``: 3 for three consumer warpgroups in a ring, 192-row tiles (not persistent; ``w3:...``);
    ``overlap`` False: no in-block overlap in the consumers (not persistent; ``n:...``, ``w3n:...``).
    ``window_left`` >= 0: a causal call's sliding window on the left (query i sees keys i + Sk - Sq - window_left
    .. i + Sk - Sq; not persistent). ``host_desc``: its TMA descriptors made on the host (not persistent; q / k = v
    head dims). ``softcap`` > 0: the scores capped, softcap * tanh(s * softmax_scale / softcap). ``exp2_every`` (2
    or 4; 0: off): one of each that many of the softmax's exponentials by a cubic on the FMA pipe. ``lazy`` (8; 0:
    off): O rescaled only in blocks where some row's max grew by more than that (:func:`ws16_arguments`')."""
    why = ws16_unsupported(q, k, v)
    if why:
        raise ValueError(f"fwd_gluon_ws: {why}")
    why = ws16_refused(causal, persistent, consumers, overlap, window_left, host_desc, q.shape[-1], v.shape[-1],
                       softcap, exp2_every, lazy)
    if why:
        raise ValueError(f"fwd_gluon_ws: {why}")
    if num_stages < 2:
        raise ValueError("fwd_gluon_ws: num_stages must be at least 2")
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        raise RuntimeError("fwd_gluon_ws: needs an sm90 GPU (Hopper's wgmma and TMA; Gluon has no interpreter)")
    b, sq, hq, d = q.shape
    out = q.new_empty((b, sq, hq, v.shape[-1]))
    lse = q.new_empty((b, hq, sq), dtype=torch.float32)
    if poison:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    replay = launches.get("ws16") if launches is not None else None
    if replay is not None and replay({"Q": q, "K": k, "V": v, "Out": out, "Lse": lse}):
        return out, lse
    made = ws16_launch(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages, consumer_regs, persistent,
                       tile_order, consumers, overlap, window_left, host_desc, softcap, exp2_every, lazy)
    if launches is not None and made is not None:
        launches["ws16"] = made
    return out, lse


def ws16_grid(q, consumers: int) -> tuple[int, int]:
    """The one-program-a-tile forward's grid: query tiles of 64 rows a consumer warpgroup, by batch x query heads."""
    return (triton.cdiv(q.shape[1], 64 * consumers), q.shape[0] * q.shape[2])


def ws16_launch(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages, consumer_regs=None, persistent=False,
                tile_order="query", consumers=2, overlap=True, window_left=-1, host_desc=False, softcap=0.0,
                exp2_every=0, lazy=0):
    """Launch the 16-bit warp-specialised forward into ``out`` [B, Sq, Hq, D] and ``lse`` [B, Hq, Sq] (checked by
    the caller: :func:`ws16_unsupported`, an sm90 GPU); returns its :class:`kernels.launcher.Launch` (slots Q, K,
    V, Out, Lse). ``persistent``: the persistent kernel, at most one program an SM, its tiles in ``tile_order``
    (:data:`TILE_ORDERS`); ``consumers``, ``overlap``: the (not persistent) kernel's consumer warpgroups and their
    in-block overlap; ``window_left`` >= 0: a causal call's sliding window on the left (not persistent);
    ``host_desc``: the TMA descriptors made on the host (not persistent: that kernel makes its own once a
    program); ``softcap`` > 0: the scores capped; ``exp2_every``, ``lazy``: :func:`ws16_arguments`'."""
    why = persistent and ws16_refused(causal, True, 2, overlap, window_left, host_desc, q.shape[-1], v.shape[-1],
                                      softcap, exp2_every, lazy)
    if why:  # (not persistent: ws16_arguments checks)
        raise ValueError(f"ws16_launch: {why}")
    launcher.ensure_allocator()
    tiles = triton.cdiv(q.shape[1], 128) * q.shape[0] * q.shape[2]
    if persistent:
        from .configs import tensor_sm_count

        kernel = _fwd_ws_persistent_kernel
        kwargs = ws16_persistent_arguments(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages,
                                           consumer_regs, tile_order, softcap, exp2_every, lazy)
        grid = (min(tiles, tensor_sm_count(q)),)
    else:
        kernel = _fwd_ws_kernel
        kwargs = ws16_arguments(q, k, v, out, lse, softmax_scale, causal, block_n, num_stages, consumer_regs,
                                consumers, overlap, window_left, host_desc, softcap, exp2_every, lazy)
        grid = ws16_grid(q, consumers)
    return launcher.launched(kernel, kernel[grid](**kwargs), grid, kwargs,
                             descriptors=HOST_DESCRIPTOR_OF if host_desc else None)
