"""The backward's dK / dV kernel for Hopper in Gluon, warp-specialised, and its dQ kernel (issue 16's goals; built
without a GPU in session 31; first run, measured and routed in session 32: configs.BWD_GLUON).

The Triton backward (bwd.py) runs a dQ kernel (which also computes delta = rowsum(dO * O)) and a dK / dV kernel;
the second does four of the backward's seven matmuls. This is that kernel on the forward's warp-specialised plan
(fp8_gluon.py, flash-attn 3's structure): a program owns 128 keys of one (batch, kv head); a loader warp brings
its K and V once and then Q and dO tiles of 64 query rows through a ring of stages (TMA, rank-4 descriptors over
[B, S, H, D]); two consumer warpgroups own 64 keys each and, per query tile, compute with keys as rows

    S^T  = K_w Q^T            P^T  = exp2(S^T * scale * log2(e) - lse * log2(e))   (causal: masked to 0)
    dP^T = V_w dO^T           dS^T = P^T * (dP^T - delta)
    dV_w += P^T dO            dK_w += dS^T Q                                     (dK scaled once at the end)

so every operand is where a wgmma wants it: K_w and V_w from shared memory as the A operand, Q and dO tiles as the
B operand (seen transposed for S^T and dP^T, as loaded for dV and dK), P^T and dS^T from registers as the A
operand. The consumers take turns to issue (the forward's ping-pong ``turn`` barriers): one's exponentials run
while the other's wgmmas do; or not (``NO_TURNS``, either kernel, as flash-attn-4's sm90 backward: routed for the
fused kernel at hd 64 causal since session 42, configs.BWD_GLUON_FUSED_NO_TURNS). GQA: the program runs the group's
query heads one after another, or a share of them under the backward's group split (MQA / GQA with few kv heads:
fp32 partials the Triton sum adds up). Rows past a sequence's end: zero-filled tiles, lse read as +inf (P = 0); keys
past it are computed and not stored.

Dense bf16 / fp16, d = d_v in (64, 128), or q / k 192 with v 128 (DeepSeek's MLA training form: the scores two
chained wgmmas over 128 + 64 tile parts, dK and dQ two accumulators each), causal (bottom-right aligned) or no
mask, or causal with a sliding window on the left (the split kernels one program a tile, ``window_left``: session
51); no varlen. The dQ kernel alone also takes hd 256 (Gemma-2's; 32-key tiles). Both take a softcap (the forward's
capped scores recomputed by the hardware's tanh, dS through the cap's slope: the dQ kernel's from session 53, the dK /
dV kernel's from session 55; the fused kernel takes none).
The fused backward (``DQ_COLS``: dQ's partials added into an fp32 buffer by TMA reduce, in arrival order) has an
ordered variant (``Sem``: ``dkdv_gluon(ordered=True)``; not routed): each dQ tile's adds wait their turn on a
counter, largest key block first, so dQ is bitwise the same on every run. Session 35 waited in the consumers (0.6x
the fused kernel on the H100, causal); session 36 moved the waits and adds to an adder warp; session 37 measured it
pipelined (0.86-0.96x causal, 0.87-1.13x non-causal). The unordered kernel can add through the same adder warp
without the turns (``dkdv_gluon(adder=True)``, ``DQ_ADDER``): routed at hd 128 non-causal
(configs.BWD_GLUON_FUSED_ADDER, 1.035-1.059x its consumers' own adds). A GQA / MQA program walks its (query head,
query tile) steps in one flat loop at hd 128 (``walk=1``, configs.bwd_walk: the nested loops spilled 4-5x MHA's,
whose group of 1 Triton specialises away). hd 64 takes 128-row query tiles too (session 38: the dK / dV kernel's
routed non-causal, configs.BWD_GLUON_BY_MASK; the fused kernel's each consumer its row half of dQ, routed
non-causal from session 39, configs.BWD_GLUON_FUSED), optionally with S^T and dP^T in two 64-query halves
(``QUERY_HALVES``: fewer registers live where the spills were; on by default for the fused kernel's). Causal tiles
may take the mask on every tile instead of behind a branch (``MASK_EVERY_TILE``: routed for the fused kernel at hd
128, configs.BWD_GLUON_FUSED_MASK_EVERY_TILE).
Gluon has no interpreter: sm90 GPUs only (tests/kernels/test_bwd_gluon.py compiles it for sm_90a on the CPU and
checks it against the FP64 oracle on the GPU).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate

from .. import launcher
from . import configs
from .fp8_gluon import (
    _cap_scales,
    _key_blocks,
    _pass,
    _second_part,
    _tanh_approx,
    _window_blocks,
    _ws_barriers,
    softcap_refused,
    window_argument,
)

#: (q / k head dim, v head dim) pairs both kernels compile for: DeepSeek's MLA training form too, q / k 192 in two
#: tile parts (128 + 64), v 128
HEAD_DIMS = ((64, 64), (128, 128), (192, 128))
#: ... and the dQ kernel's alone: Gemma-2's hd 256 (dQ's 64 x 256 fp32 accumulator a consumer fits beside 32-key S
#: and dP tiles; dK / dV's two would not), its dK / dV on the Triton kernel or bwd_gluon_hd256's (the head dim split)
DQ_HEAD_DIMS = HEAD_DIMS + ((256, 256), )
_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
#: keys a program owns (two consumer warpgroups of 64)
BLOCK_N = 128


@aggregate
class _BwdShape:
    """The partitions' compile-time shape (warp_specialize passes plain arguments as run-time values), and which
    part of each query tile's dQ partial a consumer of the fused kernel makes (``DQ_COLS`` > 0), worked out once
    for the consumers and the adder warp: ``DQ_COL_HALVES`` (hd 128: its ``DQ_COLS`` columns of every tile),
    ``DQ_ROW_HALVES`` (hd 64 on 128-row tiles: its 64 rows of every tile) or ``DQ_ALTERNATE`` (hd 64 on 64-row
    tiles: all of every other tile, by parity)."""
    __annotations__ = {"HEAD_DIM": gl.constexpr, "BLOCK_M": gl.constexpr, "NUM_STAGES": gl.constexpr,
                       "IS_CAUSAL": gl.constexpr, "HEAD_DIM_B": gl.constexpr, "DQ_COLS": gl.constexpr,
                       "DQ_SINK": gl.constexpr, "DQ_ADDER": gl.constexpr, "DQ_TURNS": gl.constexpr,
                       "WALK": gl.constexpr, "QUERY_HALVES": gl.constexpr, "MASK_EVERY_TILE": gl.constexpr,
                       "DQ_COL_HALVES": gl.constexpr, "DQ_ROW_HALVES": gl.constexpr, "DQ_ALTERNATE": gl.constexpr,
                       "DQ_UNSCALED": gl.constexpr, "DS_SMEM": gl.constexpr, "WG_TURNS": gl.constexpr,
                       "TIMES": gl.constexpr, "PERSISTENT": gl.constexpr, "WINDOW": gl.constexpr,
                       "SOFTCAP": gl.constexpr, "SPLIT_SUM": gl.constexpr, "LSE_TMA": gl.constexpr}

    @gluon.constexpr_function
    def __init__(self, HEAD_DIM, BLOCK_M, NUM_STAGES, IS_CAUSAL, HEAD_DIM_B=0, DQ_COLS=0, DQ_SINK=0, DQ_ADDER=0,
                 DQ_TURNS=0, WALK=0, QUERY_HALVES=False, MASK_EVERY_TILE=False, DQ_UNSCALED=False, DS_SMEM=False,
                 WG_TURNS=True, TIMES=False, PERSISTENT=False, WINDOW=False, SOFTCAP=False, SPLIT_SUM=False,
                 LSE_TMA=False):
        self.HEAD_DIM = gl.constexpr(HEAD_DIM)
        self.BLOCK_M = gl.constexpr(BLOCK_M)
        self.NUM_STAGES = gl.constexpr(NUM_STAGES)
        self.IS_CAUSAL = gl.constexpr(IS_CAUSAL)
        self.HEAD_DIM_B = gl.constexpr(HEAD_DIM_B)
        self.DQ_COLS = gl.constexpr(DQ_COLS)
        self.DQ_SINK = gl.constexpr(DQ_SINK)
        self.DQ_ADDER = gl.constexpr(DQ_ADDER)
        self.DQ_TURNS = gl.constexpr(DQ_TURNS)
        self.WALK = gl.constexpr(WALK)
        self.QUERY_HALVES = gl.constexpr(QUERY_HALVES)
        self.MASK_EVERY_TILE = gl.constexpr(MASK_EVERY_TILE)
        self.DQ_COL_HALVES = gl.constexpr(0 < DQ_COLS < HEAD_DIM)
        self.DQ_ROW_HALVES = gl.constexpr(DQ_COLS > 0 and BLOCK_M == 128)
        self.DQ_ALTERNATE = gl.constexpr(DQ_COLS > 0 and not self.DQ_COL_HALVES and not self.DQ_ROW_HALVES)
        self.DQ_UNSCALED = gl.constexpr(DQ_UNSCALED)
        self.DS_SMEM = gl.constexpr(DS_SMEM and DQ_COLS > 0)
        self.WG_TURNS = gl.constexpr(WG_TURNS)
        self.TIMES = gl.constexpr(TIMES)
        self.PERSISTENT = gl.constexpr(PERSISTENT)
        self.WINDOW = gl.constexpr(WINDOW)
        self.SOFTCAP = gl.constexpr(SOFTCAP)
        self.LSE_TMA = gl.constexpr(LSE_TMA)
        self.SPLIT_SUM = gl.constexpr(SPLIT_SUM)


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add shared-memory tile ``src`` into global memory at ``coord`` of ``tensor_desc`` (Hopper's
    ``cp.reduce.async.bulk.tensor ... .add``; asynchronous: a bulk group ``tma.store_wait`` retires, as a TMA
    store's). Triton 3.6's Gluon has the op in its builder (``create_async_tma_reduce``) but ``hopper.tma`` does
    not wrap it; measured at 3.2 TB/s on an H100 (docs/perf/tma-reduce-s34, benchmarks/tma_reduce_probe.py)."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.constexpr_function
def _bulk_wait_asm(pending):
    """The PTX of :func:`_bulk_done_then_proxy_fence` for ``pending`` bulk groups left in flight."""
    return f"cp.async.bulk.wait_group {pending};\n\tfence.proxy.async.global;\n\tmov.u32 $0, 0;"


@gluon.jit
def _bulk_done_then_proxy_fence(PENDING: gl.constexpr = 0):
    """Wait until this thread's bulk groups (TMA stores / reduces) but the newest ``PENDING`` have completed, their
    writes performed (not only their reads of shared memory: ``tma.store_wait`` waits for those alone), then order
    the async proxy's global writes before this thread's later generic accesses (a release that hands the tile
    on)."""
    gl.inline_asm_elementwise(_bulk_wait_asm(PENDING), "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _proxy_fence():
    """Order this thread's earlier generic accesses (an acquire) before its later async-proxy ones (a TMA reduce)."""
    gl.inline_asm_elementwise("fence.proxy.async.global;\n\tmov.u32 $0, 0;", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _wait_turn(sem, rank):
    """Spin until the counter at ``sem`` reads ``rank`` (acquire: the adds it counts are visible), then fence the
    async proxy: the deterministic fused backward's turn to add into a dQ tile."""
    while gl.atomic_add(sem, 0, sem="acquire", scope="gpu") != rank:
        pass
    _proxy_fence()


@gluon.jit
def _hand_on(sem, PENDING: gl.constexpr = 0):
    """The adds behind ``sem`` completed (this warp's bulk groups but the newest ``PENDING`` waited for in full):
    count them, with release semantics, so the next program in the tile's order may add. A one-warp partition's:
    lane 0 adds, by a reduction that returns nothing (the warp does not wait for the counter's round trip)."""
    _bulk_done_then_proxy_fence(PENDING)
    gl.thread_barrier()  # the lane that issued the reduces waited: every lane's view before the release
    gl.inline_asm_elementwise(
        "{\n\t.reg .pred lane0;\n\t.reg .u32 lane;\n\tmov.u32 lane, %laneid;\n\tsetp.eq.u32 lane0, lane, 0;\n\t"
        "@lane0 red.release.gpu.global.add.u32 [$1], 1;\n\t}\n\tmov.u32 $0, 0;", "=r,l", [sem], dtype=gl.int32,
        is_pure=False, pack=1)


@gluon.jit
def _stamp(ptr, GLOBAL: gl.constexpr = False):
    """Store the SM's cycle counter (``GLOBAL``: the GPU's nanosecond timer) at ``ptr``: a program's timeline for
    probes (``Times``; every thread of the warpgroup stores the same value)."""
    if GLOBAL:
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    else:
        t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    gl.store(ptr, t)


#: a consumer's timeline record (``Times``, int64 each; :func:`timeline_record`'s fields in this order)
TIMELINE_FIELDS = ("clock_start", "clock_kv", "clock_loop_end", "clock_end", "global_start", "global_end", "sm",
                   "tiles", "clock_entry", "clock_desc")
assert len(TIMELINE_FIELDS) == 10  # (the kernel's record stride)


@gluon.constexpr_function
def _acc_layout(n):
    """A consumer warpgroup's wgmma accumulator layout for 64 rows x ``n`` columns (16-bit operands)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _s_and_dp(a_s, b_s, a_dp, b_dp, other, N: gl.constexpr, S_LAYOUT: gl.constexpr, a_s2=None, b_s2=None,
              SECOND: gl.constexpr = False, TURNS: gl.constexpr = True):
    """A consumer's first turn of a block: S = a_s b_s^T (``SECOND``: + a_s2 b_s2^T, a second head-dim part
    chained on the same accumulator) and dP = a_dp b_dp^T issued on the tensor cores (64 x N, fresh zero
    accumulators: none kept across the loop), then the turn handed to the other consumer (``TURNS`` off: no
    turns)."""
    s = warpgroup_mma(a_s, b_s.permute((1, 0)), gl.zeros([64, N], gl.float32, layout=S_LAYOUT), use_acc=False,
                      is_async=True)
    if SECOND:
        s = warpgroup_mma(a_s2, b_s2.permute((1, 0)), s, is_async=True)
    dp = warpgroup_mma(a_dp, b_dp.permute((1, 0)), gl.zeros([64, N], gl.float32, layout=S_LAYOUT), use_acc=False,
                       is_async=True)
    if TURNS:
        _pass(other)
    return s, dp


@gluon.jit
def _s_and_dp_halves(a_s, b_s, a_dp, b_dp, other, S_LAYOUT: gl.constexpr, TURNS: gl.constexpr = True):
    """:func:`_s_and_dp` for 128 queries as two halves of 64 (S^T and dP^T of the first half issued first: it is done
    first), then the turn handed to the other consumer (``TURNS`` off: no turns)."""
    zero = gl.zeros([64, 64], gl.float32, layout=S_LAYOUT)
    s = warpgroup_mma(a_s, b_s.slice(0, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
    dp = warpgroup_mma(a_dp, b_dp.slice(0, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
    s_b = warpgroup_mma(a_s, b_s.slice(64, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
    dp_b = warpgroup_mma(a_dp, b_dp.slice(64, 64).permute((1, 0)), zero, use_acc=False, is_async=True)
    if TURNS:
        _pass(other)
    return s, dp, s_b, dp_b


@gluon.jit
def _p_and_ds(s, dp, q0, lse_s, delta_s, key0, off, qk_scale, seqlen_q, IS_CAUSAL: gl.constexpr, N: gl.constexpr,
              S_LAYOUT: gl.constexpr, WAIT_S: gl.constexpr, WAIT_DP: gl.constexpr,
              MASK_EVERY_TILE: gl.constexpr = False, window_left=0, WINDOW: gl.constexpr = False, cap_in=0.0,
              SOFTCAP: gl.constexpr = False, LSE_SMEM: gl.constexpr = False):
    """P^T and dS^T of one consumer's 64 keys from ``key0`` and ``N`` queries from ``q0``, their S^T and dP^T still in
    flight (``WAIT_S`` / ``WAIT_DP``: the wgmmas left pending once each is done): lse and delta read while the
    wgmmas run (loaded late: fewer registers live across the waits); rows past the sequence: lse +inf makes P 0
    (their Q and dO tiles are zero-filled). Causal: the mask applied where the tile crosses the diagonal (a run-time
    branch), or with ``MASK_EVERY_TILE`` on every tile (a compare and a select an element more, no branch: the
    sm_90a compile spills half as much at hd 128). ``WINDOW`` (causal): query i sees keys i + off - ``window_left``
    .. i + off; the branch's tiles those that cross the diagonal or the last query's window edge. ``SOFTCAP``: the
    forward capped the scores, t = tanh(S^T * ``cap_in``) (``qk_scale`` then softcap * log2(e)) and dS^T through the
    cap's slope (1 - t^2), as the dQ kernel's (the split dK / dV kernels', a window's too; not with the mask every
    tile, which only the fused kernel takes). ``LSE_SMEM``: ``lse_s`` / ``delta_s`` are the tile's N values in shared
    memory (the loader's TMA copies, zero past the sequence: those rows' Q and dO are zero too, so P^T is 1 there and
    dS^T and both products with dO and Q 0), not pointers."""
    cols = q0 + gl.arange(0, N, layout=gl.SliceLayout(0, S_LAYOUT))
    if LSE_SMEM:
        lse2 = lse_s.load(gl.SliceLayout(0, S_LAYOUT)) * 1.4426950408889634
    else:
        lse2 = gl.load(lse_s + cols, mask=cols < seqlen_q, other=float("inf")) * 1.4426950408889634
    s = warpgroup_mma_wait(WAIT_S, deps=(s, ))  # S^T done; dP^T may still run
    if SOFTCAP:
        s = _tanh_approx(s * cap_in)
        slope = 1.0 - s * s
    if IS_CAUSAL and MASK_EVERY_TILE:  # key n seen by query i iff n <= i + off
        keys = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, S_LAYOUT))
        keep = gl.expand_dims(keys, 1) <= gl.expand_dims(cols + off, 0)
        if WINDOW:  # ... and n >= i + off - window_left
            keep = keep & (gl.expand_dims(keys, 1) >= gl.expand_dims(cols + off - window_left, 0))
        p = gl.where(keep, gl.exp2(s * qk_scale - gl.expand_dims(lse2, 0)), 0.0)
    else:
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 0))
    if IS_CAUSAL and not MASK_EVERY_TILE and WINDOW:
        # the tile crosses the diagonal, or its first key is left of its last query's window edge
        if (q0 + off < key0 + 63) | (key0 < q0 + N - 1 + off - window_left):
            keys = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, S_LAYOUT))
            keep = gl.expand_dims(keys, 1) <= gl.expand_dims(cols + off, 0)
            keep = keep & (gl.expand_dims(keys, 1) >= gl.expand_dims(cols + off - window_left, 0))
            p = gl.where(keep, p, 0.0)
    elif IS_CAUSAL and not MASK_EVERY_TILE:  # (the mask written again inside the branch, not shared with the one
        # above: computed before the branch, the keys change the routed causal kernels' code and spills, session 38)
        if q0 + off < key0 + 63:  # the tile crosses the diagonal
            keys = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, S_LAYOUT))
            keep = gl.expand_dims(keys, 1) <= gl.expand_dims(cols + off, 0)
            p = gl.where(keep, p, 0.0)
    if LSE_SMEM:
        delta = delta_s.load(gl.SliceLayout(0, S_LAYOUT))
    else:
        delta = gl.load(delta_s + cols, mask=cols < seqlen_q, other=0.0)
    dp = warpgroup_mma_wait(WAIT_DP, deps=(dp, ))
    if SOFTCAP:
        return p, p * (dp - gl.expand_dims(delta, 0)) * slope
    return p, p * (dp - gl.expand_dims(delta, 0))


@gluon.jit
def _lse_ring(Lse, Delta, batch, num_heads, seqlen_q, stride_lb, stride_lh, stride_db, stride_dh, desc, smem,
              ROWS: gl.constexpr, NUM_STAGES: gl.constexpr, L_SL: gl.constexpr, LSE_TMA: gl.constexpr):
    """With ``LSE_TMA``: (lse's and delta's TMA descriptors over [batch, heads, seqlen_q], a [1, 1, ``ROWS``] box
    each, and their rows' ring in shared memory, ``NUM_STAGES`` slots each, layout ``L_SL``) for a dK / dV kernel's
    loader to fill (:func:`_copy_lse_rows`) and its consumers to read (:func:`_p_and_ds`' ``LSE_SMEM``); else the
    stand-ins ``desc``, ``desc``, ``smem``, ``smem`` (never read)."""
    lse_desc, delta_desc, lse_smem, delta_smem = desc, desc, smem, smem
    if LSE_TMA:
        lse_desc = tma.make_tensor_descriptor(Lse, [batch, num_heads, seqlen_q], [stride_lb, stride_lh, 1],
                                              [1, 1, ROWS], L_SL)
        delta_desc = tma.make_tensor_descriptor(Delta, [batch, num_heads, seqlen_q], [stride_db, stride_dh, 1],
                                                [1, 1, ROWS], L_SL)
        lse_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, 1, ROWS], L_SL)
        delta_smem = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, 1, 1, ROWS], L_SL)
    return lse_desc, delta_desc, lse_smem, delta_smem


@gluon.jit
def _copy_lse_rows(lse_desc, delta_desc, lse_smem, delta_smem, b, h, row, bar, slot, LSE_TMA: gl.constexpr):
    """The loader's copies of one query tile's lse and delta rows (from ``row`` of (batch ``b``, head ``h``)) into
    slot ``slot`` of :func:`_lse_ring`'s ring, on ``bar`` (2 x rows x 4 bytes more for its expect); nothing without
    ``LSE_TMA``."""
    if LSE_TMA:
        tma.async_copy_global_to_shared(lse_desc, [b, h, row], bar, lse_smem.index(slot))
        tma.async_copy_global_to_shared(delta_desc, [b, h, row], bar, delta_smem.index(slot))


@gluon.jit
def _walk_bounds(g_lo, g_hi, j_lo, n_m, WALK: gl.constexpr):
    """The ranges (outer lo, hi, inner lo, hi) of a dK / dV program's two loops over its (query head of its group
    part, query tile) steps, by ``WALK``: 0 (the default) the heads outside, each head's tiles inside from the
    first this program's keys see (causal: its diagonal) to the last (the loop variables are the head and the tile);
    1 the same steps in one flat loop (:func:`_walk_tile` works them out); 2 (lockstep) one flat loop over the tiles
    from the last down to that first, the group's heads inside: every program of a kv head is then on the same
    (tile, head) at the same step however many tiles it has (causal programs differ in length and drift apart
    across the group's heads in the default order)."""
    if WALK == 0:
        return g_lo, g_hi, j_lo, n_m
    else:
        return 0, 1, 0, (g_hi - g_lo) * (n_m - j_lo)


@gluon.jit
def _walk_tile(a, c, g_lo, g_hi, j_lo, n_m, WALK: gl.constexpr):
    """(query head, query tile) at the loops' variables (a, c) of :func:`_walk_bounds`."""
    if WALK == 0:
        return a, c
    elif WALK == 1:
        return g_lo + c // (n_m - j_lo), j_lo + c % (n_m - j_lo)
    else:
        return g_lo + c % (g_hi - g_lo), n_m - 1 - c // (g_hi - g_lo)


@gluon.jit
def _dkdv_coords(pid_n, pid_bh, seqlen_q, seqlen_k, kv_heads, group, group_split, BLOCK_M: gl.constexpr,
                 IS_CAUSAL: gl.constexpr, KEYS: gl.constexpr = 128):
    """A dK / dV program's (or persistent tile's) key block ``pid_n`` of ``KEYS`` keys and (batch, kv head, group
    part) ``pid_bh`` -> (batch, kv head, group part, first key, the group's query heads [g_lo, g_hi) it walks, its
    first query tile: causal, the first that sees one of its keys)."""
    gs = pid_bh % group_split
    b = (pid_bh // group_split) // kv_heads
    hk = (pid_bh // group_split) % kv_heads
    per = gl.cdiv(group, group_split)
    g_lo = gs * per
    g_hi = gl.minimum(g_lo + per, group)
    n0 = pid_n * KEYS
    j_lo = 0
    if IS_CAUSAL:  # the first query tile that sees one of these keys (query i sees key n iff n <= i + off)
        j_lo = gl.maximum(n0 - (seqlen_k - seqlen_q), 0) // BLOCK_M
    return b, hk, gs, n0, g_lo, g_hi, j_lo


@gluon.jit
def _persistent_tile(t, total, seqlen, IS_CAUSAL: gl.constexpr, ORDER: gl.constexpr, HEAVY_LAST: gl.constexpr):
    """A persistent kernel's tile ``t`` of ``total`` -> (block of 128 rows of ``seqlen``, its unit), by ``ORDER``
    (:data:`PERSISTENT_ORDERS`). 1, "snake": blocks inner, as the one-program-a-tile grid's launch order (the tiles
    running together share one head's data in L2); causal, odd units walk their blocks the other way, so the static
    round-robin (tile t to program t mod the grid) hands each program heavy and light tiles alike (a simulation of
    the FA sweep's causal shapes for the dK / dV kernel: the busiest program 1.03-1.06x the mean, against 1.12-1.57x
    without the snake; but 1.88x with 2.2 tiles an SM, MQA 71/1 B2 2k, where session 47 measured persistence lose).
    2, "heavy" (causal; non-causal tiles are even, and run the snake): the heaviest blocks first, units inner, the
    grid's waves dealt to the programs forward and backward in turn (wave i's tile i * grid + p goes to program p,
    or to grid - 1 - p in odd waves but a last partial one): the longest-processing-first rule, whose busiest
    program the same simulation puts at 1.00-1.02x the mean on the FA sweep and 1.11x at MQA 71/1; the tiles
    running together then belong to different heads (less L2 reuse of a head's rows: measure before routing).
    ``HEAVY_LAST``: the last block is the heaviest (the dQ kernel's query blocks, causal), else the first (the dK /
    dV kernels' key blocks). The dK / dV kernels' blocks are key blocks and units (batch, kv head, group part); the
    dQ kernel's query blocks and (batch, query head)."""
    n_blocks = gl.cdiv(seqlen, 128)
    if IS_CAUSAL and ORDER == 2:
        grid = gl.num_programs(0)
        wave = t // grid
        pos = t - wave * grid
        back = ((wave % 2) == 1) & ((wave + 1) * grid <= total)  # (odd full waves run backward)
        r = t + back.to(gl.int32) * (grid - 1 - 2 * pos)
        units = total // n_blocks
        rank = r // units
        unit = r - rank * units
        block = (n_blocks - 1 - rank) if HEAVY_LAST else rank
    else:
        unit = t // n_blocks
        block = t - unit * n_blocks
        if IS_CAUSAL:
            block = block + (unit % 2) * (n_blocks - 1 - 2 * block)
    return block, unit


@gluon.jit
def _tile_coords(t, tiles, group, shape):
    """A persistent program's tile ``t`` -> :func:`_dkdv_coords`' values (``tiles``: the kernel's persistent
    arguments: the tiles, kv heads, group split, both sequence lengths, K / V's release, the split's strides)."""
    seqlen_q, seqlen_k = tiles[3], tiles[4]
    pid_n, pid_bh = _persistent_tile(t, tiles[0], seqlen_k, shape.IS_CAUSAL, shape.PERSISTENT, False)
    return _dkdv_coords(pid_n, pid_bh, seqlen_q, seqlen_k, tiles[1], group, tiles[2], shape.BLOCK_M, shape.IS_CAUSAL)


@gluon.jit
def _bwd_load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk, n0,
              group, g_lo, g_hi, j_lo, n_m, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, tiles=0, lse_desc=0,
              delta_desc=0, lse_smem=0, delta_smem=0):
    """The loader warp: the program's K and V (two 64-key tiles each) once, then per query head of its part of the
    group ([g_lo, g_hi)) and query tile the Q and dO tiles into the slot both consumers released (slot
    ``it % NUM_STAGES``). With ``shape.HEAD_DIM_B`` the second q / k head-dim part's K and Q tiles too (``*_b``:
    from column HEAD_DIM). ``shape.PERSISTENT``: the same per tile of the program's (``tiles``: the kernel's
    persistent arguments; the arguments b to j_lo unused), a tile's K and V once both consumers released the last
    tile's (``kv_free``: after their last query tile, before their dK / dV stores), then its Q and dO tiles, the
    ring's slots counted over the tiles: the next tile's K, V and first Q / dO tiles load while this one's dK and
    dV are stored (not earlier: issuing the first Q / dO tiles before the ``kv_free`` wait would start them during
    this tile's last query tiles; not built). ``shape.LSE_TMA``: each query tile's lse and delta rows too, by TMA
    (``lse_desc`` / ``delta_desc``) into the slot's ``lse_smem`` / ``delta_smem``, on the same barrier."""
    if shape.PERSISTENT:
        kv_free = tiles[5]
        it = 0
        i = 0
        for t in range(gl.program_id(0), tiles[0], gl.num_programs(0)):
            b, hk, gs, n0, g_lo, g_hi, j_lo = _tile_coords(t, tiles, group, shape)
            mbarrier.wait(kv_free, (i - 1) & 1, pred=i > 0)  # (both consumers' last reads of the last K / V)
            it = _bwd_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready,
                                empty, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, shape, q_desc_b, k_desc_b, q_smem_b,
                                k_smem_b, it, lse_desc, delta_desc, lse_smem, delta_smem)
            i += 1
    else:
        _bwd_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk,
                       n0, group, g_lo, g_hi, j_lo, n_m, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, 0, lse_desc,
                       delta_desc, lse_smem, delta_smem)


@gluon.jit
def _bwd_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk,
                   n0, group, g_lo, g_hi, j_lo, n_m, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, it, lse_desc=0,
                   delta_desc=0, lse_smem=0, delta_smem=0):
    """:func:`_bwd_load`'s work for one tile (a program's, or a persistent program's next), the ring's slots counted
    from ``it``; returns the count after it."""
    it = gl.to_tensor(it)  # (a loop-carried count: a plain 0 for a program's only tile)
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    LSE_BYTES: gl.constexpr = 2 * BLOCK_M * 4 if shape.LSE_TMA else 0  # (a query tile's lse and delta, fp32)
    mbarrier.expect(kv_bar, 2 * 64 * (2 * HEAD_DIM + HEAD_DIM_B) * 2)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [b, n0 + 64 * w, hk, 0], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [b, n0 + 64 * w, hk, 0], kv_bar, v_smem.index(w))
        if HEAD_DIM_B > 0:
            tma.async_copy_global_to_shared(k_desc_b, [b, n0 + 64 * w, hk, HEAD_DIM], kv_bar, k_smem_b.index(w))
    a_lo, a_hi, c_lo, c_hi = _walk_bounds(g_lo, g_hi, j_lo, n_m, shape.WALK)
    for a in range(a_lo, a_hi):
        for c in range(c_lo, c_hi):
            g, j = _walk_tile(a, c, g_lo, g_hi, j_lo, n_m, shape.WALK)
            h = hk * group + g
            slot = it % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) - 1) & 1, pred=it >= NUM_STAGES)
            mbarrier.expect(ready.index(slot), BLOCK_M * (2 * HEAD_DIM + HEAD_DIM_B) * 2 + LSE_BYTES)
            _copy_lse_rows(lse_desc, delta_desc, lse_smem, delta_smem, b, h, j * BLOCK_M, ready.index(slot), slot,
                           shape.LSE_TMA)
            tma.async_copy_global_to_shared(q_desc, [b, j * BLOCK_M, h, 0], ready.index(slot), q_smem.index(slot))
            tma.async_copy_global_to_shared(do_desc, [b, j * BLOCK_M, h, 0], ready.index(slot), do_smem.index(slot))
            if HEAD_DIM_B > 0:
                tma.async_copy_global_to_shared(q_desc_b, [b, j * BLOCK_M, h, HEAD_DIM], ready.index(slot),
                                                q_smem_b.index(slot))
            it += 1
    return it


@gluon.jit
def _dq_turn(ds_t, k_smem, ds_ready, phase, other, dv, dk, dq_smem_w, dq_desc, b, m0, h, sm_scale, C0: gl.constexpr,
             shape, order, PENDING: gl.constexpr = True, R0: gl.constexpr = 0):
    """The rest of a consumer's second turn in the fused backward, dV and dK issued: once both halves of the tile's
    dS^T are in ``ds_t`` ([128 keys, BLOCK_M]), dQ's partial over the program's 128 keys for the tile's 64 rows from
    R0 and columns [C0, C0 + DQ_COLS) (dS seen transposed as the A operand, each 64-key K tile's columns as B), the
    turn handed over, every wgmma retired, the partial added into the fp32 buffer (``order``: :func:`_add_dq`'s),
    times the softmax scale (``shape.DQ_UNSCALED``: not; the caller scales the sum once). Returns (dv, dk)
    (``PENDING`` False: retired already)."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    DQ_COLS: gl.constexpr = shape.DQ_COLS
    mbarrier.wait(ds_ready, phase)
    dq = warpgroup_mma(ds_t.slice(0, 64).slice(R0, 64, dim=1).permute((1, 0)),
                       k_smem.index(0).reshape([64, HEAD_DIM]).slice(C0, DQ_COLS, dim=1),
                       gl.zeros([64, DQ_COLS], gl.float32, layout=_acc_layout(DQ_COLS)), use_acc=False,
                       is_async=True)
    dq = warpgroup_mma(ds_t.slice(64, 64).slice(R0, 64, dim=1).permute((1, 0)),
                       k_smem.index(1).reshape([64, HEAD_DIM]).slice(C0, DQ_COLS, dim=1), dq, is_async=True)
    if shape.WG_TURNS:
        _pass(other)
    if PENDING:
        dv, dk, dq = warpgroup_mma_wait(0, deps=(dv, dk, dq))
    else:
        dq = warpgroup_mma_wait(0, deps=(dq, ))
    if not shape.DQ_UNSCALED:  # (a multiply an element a tile: the scale left to the sum's cast saves it)
        dq = dq * sm_scale
    _add_dq(dq, dq_smem_w, dq_desc, b, m0 + R0, h, C0, 64, DQ_COLS, shape.DQ_SINK, shape.DQ_ADDER, order)
    return dv, dk


@gluon.jit
def _add_dq(dq, dq_smem_w, dq_desc, b, m0, h, c0, BLOCK_M: gl.constexpr, DQ_COLS: gl.constexpr,
            DQ_SINK: gl.constexpr = 0, DQ_ADDER: gl.constexpr = 0, order=None):
    """A consumer's dQ partial (fp32, [BLOCK_M, DQ_COLS], scaled) added into the fp32 dQ buffer at rows m0 of
    (batch b, query head h), columns c0, through its shared-memory tile and a TMA reduce (rows past the sequence
    are clipped by the descriptor's bounds). The tile's previous reduce must have read it first. ``DQ_SINK``
    (probes only, wrong dQ): 1 a plain TMA store instead of the add, 2 nothing leaves (the partial is dropped).

    ``DQ_ADDER`` (an adder warp: the ordered kernel's, or the unordered one's with it): the consumer only fills its
    shared-memory tile and hands it to the adder warp (:func:`_dq_adder`), which adds it (in its turn where
    ordered); ``order`` = (the tile's ``full`` and ``empty`` barriers, this consumer's adds so far)."""
    if DQ_ADDER:
        full, empty, u = order
        mbarrier.wait(empty, (u - 1) & 1, pred=u >= 1)  # the adder's reduce of the previous partial read the tile
        dq_smem_w.reshape([BLOCK_M, DQ_COLS]).store(dq)
        fence_async_shared()
        _pass(full)
    elif DQ_SINK < 2:
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        dq_smem_w.reshape([BLOCK_M, DQ_COLS]).store(dq)
        fence_async_shared()
        gl.thread_barrier()
        if DQ_SINK == 0:
            tma_reduce_add(dq_desc, [b, m0, h, c0], dq_smem_w)
        else:
            tma.async_copy_shared_to_global(dq_desc, [b, m0, h, c0], dq_smem_w)


@gluon.jit
def _dq_adder(dq_smem, dq_full, dq_empty, dq_desc, Sem, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q, seqlen_k,
              num_heads, shape, tiles=0):
    """The fused backward's adder warp (:func:`_dq_adder_tile`) over the program's tile, or with
    ``shape.PERSISTENT`` (unordered only) over each of its tiles in turn (``tiles``: the kernel's persistent
    arguments; b to j_lo unused), the consumers' tiles counted over the program's tiles."""
    if shape.PERSISTENT:
        gl.static_assert(not shape.DQ_TURNS, "the persistent kernel: dQ's adds unordered")
        it = 0
        for t in range(gl.program_id(0), tiles[0], gl.num_programs(0)):
            b, hk, gs, n0, g_lo, g_hi, j_lo = _tile_coords(t, tiles, group, shape)
            it, prev = _dq_adder_tile(dq_smem, dq_full, dq_empty, dq_desc, Sem, b, hk, n0, group, g_lo, g_hi, j_lo,
                                      n_m, seqlen_q, seqlen_k, num_heads, shape, it)
    else:
        it, prev = _dq_adder_tile(dq_smem, dq_full, dq_empty, dq_desc, Sem, b, hk, n0, group, g_lo, g_hi, j_lo, n_m,
                                  seqlen_q, seqlen_k, num_heads, shape, 0)
        if shape.DQ_TURNS and shape.IS_CAUSAL:
            _hand_on(Sem + prev)  # the last tile's adds complete (a program with none: the spare counter)


@gluon.jit
def _dq_adder_tile(dq_smem, dq_full, dq_empty, dq_desc, Sem, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q,
                   seqlen_k, num_heads, shape, it):
    """The fused backward's adder warp (``shape.DQ_ADDER``): it walks the consumers' query tiles in their order and
    adds each tile's dQ partials (hd 128: both consumers' column halves; hd 64: the tile's parity's consumer, all
    columns) into the fp32 buffer by TMA reduce; once the reduces' reads of shared memory are done the consumers
    have their tiles back. Without ``shape.DQ_TURNS`` that is all (the unordered kernel with an adder warp: its
    consumers never wait on a reduce's reads themselves).

    ``shape.DQ_TURNS`` (the deterministic fused backward): the adds in a fixed order across programs, whatever the
    timing: the largest key block first, down to block 0. ``Sem``: int32 counters, a spare one then one per
    (batch, query head, query tile), zero at the start. A tile's adds wait until its counter reads this program's
    rank (the adders before it), a wait taken before its partials arrive (while the consumers' matmuls run).
    Causal: programs start at their diagonal, so the largest key block reaches a tile first and in lockstep no one
    waits; a tile is handed on (a release add) once its reduces completed, checked after the next tile's are
    issued: the warp's serial work a tile is then a spin, the reduces and their reads (session 36's first adder also
    waited for each tile's reduces to complete in line: ~0.9x the fused kernel at hd 128 16k). Non-causal: every
    program starts at tile 0, so each trails the one above it by a hand-on, set up once (a wavefront): the tile is
    handed on as soon as its reduces completed, keeping that lag short. The key blocks are launched last first
    (``LAST_FIRST``): a program waits only on programs dispatched before it."""
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    DQ_COLS: gl.constexpr = shape.DQ_COLS
    TURNS: gl.constexpr = shape.DQ_TURNS
    HALVES: gl.constexpr = not shape.DQ_ALTERNATE  # each consumer its half of every tile (columns or rows)
    R1: gl.constexpr = 64 if shape.DQ_ROW_HALVES else 0  # the second half's offsets (rows, columns)
    C1: gl.constexpr = DQ_COLS if shape.DQ_COL_HALVES else 0
    last = gl.cdiv(seqlen_k, 128) - 1 - n0 // 128  # this program's rank on a tile every key block adds to
    below = BLOCK_M - 1 + seqlen_k - seqlen_q - n0  # (m0 + below) // 128: the key blocks after this one a tile sees
    prev = 0  # (causal) the tile added before: handed on after this one's reduces are issued (the spare one first)
    it = gl.to_tensor(it)  # (a loop-carried count: a plain 0 for a program's only tile)
    a_lo, a_hi, c_lo, c_hi = _walk_bounds(g_lo, g_hi, j_lo, n_m, shape.WALK)
    for a in range(a_lo, a_hi):
        for c in range(c_lo, c_hi):
            g, j = _walk_tile(a, c, g_lo, g_hi, j_lo, n_m, shape.WALK)
            h = hk * group + g
            m0 = j * BLOCK_M
            cur = 1 + (b * num_heads + h) * n_m + j
            if TURNS:
                if shape.IS_CAUSAL:  # the key blocks after this one that the tile's last row sees
                    _wait_turn(Sem + cur, gl.minimum((m0 + below) // 128, last))
                else:  # every key block adds to every tile
                    _wait_turn(Sem + cur, last)
            if HALVES:
                mbarrier.wait(dq_full.index(0), it & 1)
                tma_reduce_add(dq_desc, [b, m0, h, 0], dq_smem.index(0))
                mbarrier.wait(dq_full.index(1), it & 1)
                tma_reduce_add(dq_desc, [b, m0 + R1, h, C1], dq_smem.index(1))
                tma.store_wait(pendings=0)  # (their reads of the tiles)
                _pass(dq_empty.index(0))
                _pass(dq_empty.index(1))
            else:
                mbarrier.wait(dq_full.index(it % 2), (it // 2) & 1)
                tma_reduce_add(dq_desc, [b, m0, h, 0], dq_smem.index(it % 2))
                tma.store_wait(pendings=0)
                _pass(dq_empty.index(it % 2))
            if TURNS:
                if shape.IS_CAUSAL:  # the previous tile's reduces complete, this tile's (hd 128: two, hd 64: one) may not be
                    _hand_on(Sem + prev, 2 if HALVES else 1)
                else:  # this tile's complete
                    _hand_on(Sem + cur)
            prev = cur
            it += 1
    return it, prev


@gluon.jit
def _bwd_consume(wg, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, turn, DK, DV, Lse, Delta, stride_dkb,
                 stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lb, stride_lh, stride_db,
                 stride_dh, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q, seqlen_k, qk_scale, sm_scale, shape,
                 q_smem_b, k_smem_b, ds_smem, dq_smem, ds_bar, dq_desc, dq_full, dq_empty, tiles=0, lse_smem=0,
                 delta_smem=0, sums=0, window_left=0, cap_in=0.0, Times=None):
    """One consumer warpgroup (:func:`_bwd_consume_tile`) over the program's tile, or with ``shape.PERSISTENT``
    over each of its tiles in turn (``tiles``: the kernel's persistent arguments; b to j_lo unused, ``DK`` / ``DV``
    without a group part's offset), the query tiles, turns and K / V landings counted over the program's tiles, its
    timeline (``Times``) one record a tile. ``window_left``: read with ``shape.WINDOW`` only (one program a tile);
    ``cap_in``: with ``shape.SOFTCAP`` only (:func:`_p_and_ds`); ``sums``: with ``shape.SPLIT_SUM`` only
    (:func:`_split_sum`); ``lse_smem`` / ``delta_smem``: with ``shape.LSE_TMA`` only (the loader's copies)."""
    if shape.PERSISTENT:
        kv_free, stride_dkp, stride_dvp = tiles[5], tiles[6], tiles[7]
        it = 0
        i = 0
        for t in range(gl.program_id(0), tiles[0], gl.num_programs(0)):
            b, hk, gs, n0, g_lo, g_hi, j_lo = _tile_coords(t, tiles, group, shape)
            gs64 = gs.to(gl.int64)
            it = _bwd_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, turn,
                                       DK + gs64 * stride_dkp, DV + gs64 * stride_dvp, Lse, Delta, stride_dkb,
                                       stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lb,
                                       stride_lh, stride_db, stride_dh, b, hk, n0, group, g_lo, g_hi, j_lo, n_m,
                                       seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b, k_smem_b, ds_smem,
                                       dq_smem, ds_bar, dq_desc, dq_full, dq_empty, t, i, it, kv_free, Times,
                                       cap_in=cap_in, sums=sums, lse_smem=lse_smem, delta_smem=delta_smem)
            i += 1
    else:
        _bwd_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, turn, DK, DV, Lse, Delta,
                          stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lb, stride_lh,
                          stride_db, stride_dh, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q, seqlen_k, qk_scale,
                          sm_scale, shape, q_smem_b, k_smem_b, ds_smem, dq_smem, ds_bar, dq_desc, dq_full, dq_empty,
                          gl.program_id(1) * gl.num_programs(0) + gl.program_id(0), 0, 0, kv_bar, Times, window_left,
                          cap_in, sums, lse_smem, delta_smem)


@gluon.jit
def _arrive_warp(count, last):
    """This warp's part of the group split stored: count it at ``count`` (a gpu-scope acquire-release add by lane 0
    after the warp's barrier, so every lane's stores precede it and the last arriver sees them all) and return the
    count before it to every lane (a shuffle, then the barrier again: the lanes' loads after lane 0's acquire). The
    part that finds ``last`` there (the split less one: every other part counted) sets the counter back to 0 for the
    next launch at once, in lane 0 (a scalar gl.store would be the partition's thread 0's alone, in its first warp:
    session 57's first GPU run left warps 1-3's counters growing launch to launch)."""
    return gl.inline_asm_elementwise(
        "{\n\t.reg .pred lane0, done;\n\t.reg .u32 lane, old;\n\tmov.u32 lane, %laneid;\n\t"
        "setp.eq.u32 lane0, lane, 0;\n\tmov.u32 old, 0;\n\tbar.warp.sync -1;\n\t"
        "@lane0 atom.acq_rel.gpu.global.add.u32 old, [$1], 1;\n\tsetp.eq.and.u32 done, old, $2, lane0;\n\t"
        "@done st.relaxed.gpu.global.u32 [$1], 0;\n\tshfl.sync.idx.b32 $0, old, 0, 0x1f, -1;\n\t"
        "bar.warp.sync -1;\n\t}", "=r,l,r", [count, last], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _split_sum(sums, b64, hk64, key0, r64, cols, keep, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
               stride_dvh, seqlen_k, HEAD_DIM: gl.constexpr, G_LAYOUT: gl.constexpr):
    """The group split's sum in the dK / dV kernel itself (``shape.SPLIT_SUM``; bwd._sum_partials' launch otherwise):
    each warp of a consumer owns 16 of its 64 key rows (the wgmma accumulator's layout), so each warp counts its
    stored part at ``Count`` (one int32 a (batch, kv head, 16-key rows), zero before the launch) and the warp that
    arrives last, having seen every part's stores, adds the ``split`` partials of its 16 rows in split order (from
    0.0, as _sum_partials: the same bits) and writes dK / dV in their dtype; its counter is back at 0 for the next
    launch (:func:`_arrive_warp`). ``sums``: (Count, DKsum, DVsum: the gradients, PK, PV: split 0's partials, split,
    the partials' split strides, kv heads); the gradients and each split's partials share dK's / dV's strides (all
    contiguous). Session 57 measured it 0.80-0.85x the separate sum (configs.BWD_GLUON_SPLIT_SUM): that last warp's
    loop over the partials is latency-bound at the end of a tile."""
    Count, DKsum, DVsum, PK, PV, split, stride_pk, stride_pv, kv_heads = sums
    warp = (gl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=gl.int32, is_pure=True, pack=1) // 32) % 4
    count = Count + (b64 * kv_heads + hk64) * (gl.cdiv(seqlen_k, 128) * 8) + key0 // 16 + warp
    if _arrive_warp(count, split - 1) == split - 1:
        at_k = b64 * stride_dkb + hk64 * stride_dkh + r64 * stride_dks + cols
        at_v = b64 * stride_dvb + hk64 * stride_dvh + r64 * stride_dvs + cols
        acc_k = gl.zeros([64, HEAD_DIM], gl.float32, layout=G_LAYOUT)
        acc_v = gl.zeros([64, HEAD_DIM], gl.float32, layout=G_LAYOUT)
        for s in range(split):
            s64 = s.to(gl.int64)
            acc_k += gl.load(PK + s64 * stride_pk + at_k, mask=keep, other=0.0, cache_modifier=".cg")
            acc_v += gl.load(PV + s64 * stride_pv + at_v, mask=keep, other=0.0, cache_modifier=".cg")
        gl.store(DKsum + at_k, acc_k.to(DKsum.dtype.element_ty), mask=keep)
        gl.store(DVsum + at_v, acc_v.to(DVsum.dtype.element_ty), mask=keep)


@gluon.jit
def _bwd_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, turn, DK, DV, Lse, Delta,
                      stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lb, stride_lh,
                      stride_db, stride_dh, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q, seqlen_k, qk_scale,
                      sm_scale, shape, q_smem_b, k_smem_b, ds_smem, dq_smem, ds_bar, dq_desc, dq_full, dq_empty, rec,
                      i, it, kv_free, Times=None, window_left=0, cap_in=0.0, sums=0, lse_smem=0, delta_smem=0):
    """One consumer warpgroup's work on one tile (``i``: the program's tiles before it; ``it``: the query tiles
    consumed before it; returns the count after it; ``rec``: its timeline record): keys [n0 + 64 wg, + 64), dK and
    dV accumulated over every query tile of the heads [g_lo, g_hi) of the group; two turns a query tile (S^T and
    dP^T issued, then dV and dK), the other consumer's exponentials running meanwhile. Two turns a tile, each
    consumer's, every tile: a turn's barrier phase is even for the first, odd for the second, in any program (no
    count of turns carried: a persistent program's was a register live across its loops).
    ``DK`` / ``DV``: this program's part of the group split already added (the caller's base pointers: the
    gradients, or a split's fp32 partials). With ``shape.HEAD_DIM_B`` (MLA: q / k HEAD_DIM + HEAD_DIM_B, v HEAD_DIM)
    S^T is two chained wgmmas and dK two accumulators, one a head-dim part.

    ``shape.DQ_COLS`` > 0 (the fused backward): dQ too. Each consumer stores its dS^T (64 keys x BLOCK_M) into
    ``ds_smem`` (two buffers by tile parity) and arrives on ``ds_bar``; in its second turn, once both halves are
    there, dQ's partial of the tile over the program's 128 keys, dS (the shared buffer seen transposed) times K's
    columns [c0, c0 + DQ_COLS), goes to shared memory (fp32, ``dq_smem``) and is added into the fp32 buffer behind
    ``dq_desc`` by TMA reduce. DQ_COLS = HEAD_DIM / 2 (hd 128): each consumer its half of the columns every tile;
    DQ_COLS = HEAD_DIM (hd 64): the consumer of the tile's parity all of them with 64-row tiles, with 128-row tiles
    each consumer its 64 rows of every tile (partials are 64 rows always). The buffer a tile's dS^T goes to is
    free again two tiles on, turns or not (``shape.WG_TURNS`` off: none): a consumer arrives on tile t + 1's
    ``ds_bar`` only after its own dQ wgmmas of tile t (if it made any) retired, and before it writes tile t + 2's
    dS^T each consumer has either waited on tile t + 1's ``ds_bar`` (it makes tile t + 1's dQ: every tile, or with
    hd 64's 64-row tiles every other) or made tile t's dQ alone (the other consumer never read that buffer).

    ``shape.DQ_ADDER`` (an adder warp; the deterministic fused backward's too): the partial goes to shared memory
    only and the adder warp (:func:`_dq_adder`) adds it in its turn (``dq_full``: a consumer's tile is there; ``dq_empty``:
    the adder's reduce read it).

    ``shape.TIMES`` (probes: the program's timeline, :func:`timeline_record`): this consumer's
    :data:`TIMELINE_FIELDS` at ``Times + (rec * 2 + wg) * 10`` (``clock_entry`` and ``clock_desc``: the kernel's,
    before it).

    ``shape.PERSISTENT``: once both its wgmmas reading the tile's K and V retired, the consumer releases them
    (``kv_free``) before storing dK and dV, so the loader brings the next tile's meanwhile."""
    TIMES: gl.constexpr = shape.TIMES
    if TIMES:
        stamp = Times + (rec * 2 + wg) * 10
        _stamp(stamp + 4, True)
        _stamp(stamp)
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    KB_DIM: gl.constexpr = HEAD_DIM_B if HEAD_DIM_B > 0 else HEAD_DIM  # the second part's tiles (read only with it)
    BLOCK_M: gl.constexpr = shape.BLOCK_M
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    # (128-row tiles: S^T and dP^T in two 64-query halves each, :func:`_s_and_dp_halves`)
    QUERY_HALVES: gl.constexpr = shape.QUERY_HALVES
    S_LAYOUT: gl.constexpr = _acc_layout(64 if QUERY_HALVES else BLOCK_M)  # S^T, dP^T: 64 keys x BLOCK_M queries
    G_LAYOUT: gl.constexpr = _acc_layout(HEAD_DIM)  # dK, dV
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=G_LAYOUT, k_width=2)
    GB_LAYOUT: gl.constexpr = _acc_layout(KB_DIM)  # dK's second part
    AB_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=GB_LAYOUT, k_width=2)
    DTYPE: gl.constexpr = q_smem.dtype
    off = seqlen_k - seqlen_q
    k_w = k_smem.index(wg).reshape([64, HEAD_DIM])
    v_w = v_smem.index(wg).reshape([64, HEAD_DIM])
    k_w_b = k_smem_b.index(wg).reshape([64, KB_DIM])
    DQ_COLS: gl.constexpr = shape.DQ_COLS
    FUSED: gl.constexpr = DQ_COLS > 0
    DQ_COL_HALVES: gl.constexpr = shape.DQ_COL_HALVES  # (fused: which part of a tile's dQ this consumer makes)
    DQ_ROW_HALVES: gl.constexpr = shape.DQ_ROW_HALVES
    DQ_ALTERNATE: gl.constexpr = shape.DQ_ALTERNATE
    DS_SMEM: gl.constexpr = shape.DS_SMEM  # (fused: dK's A operand, dS^T, from the shared buffer dQ reads too)
    LSE_TMA: gl.constexpr = shape.LSE_TMA  # (lse and delta from the loader's copies in shared memory)
    mine = turn.index(wg)
    other = turn.index(1 - wg)
    key0 = n0 + 64 * wg
    dk = gl.zeros([64, HEAD_DIM], gl.float32, layout=G_LAYOUT)
    dv = gl.zeros([64, HEAD_DIM], gl.float32, layout=G_LAYOUT)
    if HEAD_DIM_B > 0:
        dk_b = gl.zeros([64, KB_DIM], gl.float32, layout=GB_LAYOUT)

    DQ_ADDER: gl.constexpr = shape.DQ_ADDER
    if DQ_ADDER:
        gl.static_assert(FUSED, "the adder warp's dQ adds: the fused backward")
    TURNS: gl.constexpr = shape.WG_TURNS  # (off, the dK / dV kernel: each consumer issues its wgmmas when ready)
    if TURNS:
        if wg == 1:  # consumer 0 issues first (a persistent program's turns go on across its tiles)
            mbarrier.arrive(turn.index(0), count=1, pred=i == 0)
    mbarrier.wait(kv_bar, i & 1)
    if TIMES:  # (this program's K and V tiles in shared memory)
        _stamp(stamp + 1)
    it = gl.to_tensor(it)  # (a loop-carried count: a plain 0 for a program's only tile)
    it0 = it  # (the query tiles consumed before this tile)
    a_lo, a_hi, c_lo, c_hi = _walk_bounds(g_lo, g_hi, j_lo, n_m, shape.WALK)
    lse_b = Lse + b.to(gl.int64) * stride_lb  # (the flat walks'; the default's own below)
    delta_b = Delta + b.to(gl.int64) * stride_db
    for a in range(a_lo, a_hi):
        h32 = hk * group + a  # (the default's head; a flat walk's changes with the step, below)
        h = h32.to(gl.int64)
        lse_ptr = Lse + b.to(gl.int64) * stride_lb + h * stride_lh
        delta_ptr = Delta + b.to(gl.int64) * stride_db + h * stride_dh
        for c in range(c_lo, c_hi):
            # this step's tile, head and their rows of lse / delta (names of the step's own: a flat walk's head
            # changes with the step, and the outer loop's values must not become the inner loop's carried state)
            j = c
            hs = h32
            lse_s = lse_ptr
            delta_s = delta_ptr
            if shape.WALK > 0:
                g, j = _walk_tile(a, c, g_lo, g_hi, j_lo, n_m, shape.WALK)
                hs = hk * group + g
                lse_s = lse_b + hs * stride_lh
                delta_s = delta_b + hs * stride_dh
            slot = it % NUM_STAGES
            m0 = j * BLOCK_M
            q_t = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            do_t = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
            q_t_b = q_smem_b.index(slot).reshape([BLOCK_M, KB_DIM])
            lse_in = lse_s  # (the rows' lse and delta: pointers, or with the loader's copies those in shared memory)
            delta_in = delta_s
            lse_in_b = lse_s
            delta_in_b = delta_s
            if LSE_TMA:
                lse_in = lse_smem.index(slot).reshape([BLOCK_M])
                delta_in = delta_smem.index(slot).reshape([BLOCK_M])
                if QUERY_HALVES:
                    lse_in_b = lse_in.slice(64, 64)
                    delta_in_b = delta_in.slice(64, 64)
                    lse_in = lse_in.slice(0, 64)
                    delta_in = delta_in.slice(0, 64)
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
            if TURNS:
                mbarrier.wait(mine, 0)  # (two turns a query tile: the first one's phase is even)
            if QUERY_HALVES:  # S^T and dP^T as two 64-query halves each, one half's P^T / dS^T made while the
                # other's wgmmas run (at 128 columns lse, delta and the mask's indices take 32 registers each)
                s, dp, s_b, dp_b = _s_and_dp_halves(k_w, q_t, v_w, do_t, other, S_LAYOUT, TURNS)
                p, ds = _p_and_ds(s, dp, m0, lse_in, delta_in, key0, off, qk_scale, seqlen_q, IS_CAUSAL, 64, S_LAYOUT,
                                  3, 2, shape.MASK_EVERY_TILE, window_left, shape.WINDOW, cap_in, shape.SOFTCAP,
                                  LSE_TMA)
                if FUSED:  # this consumer's dS^T for the tile's dQ: both consumers' halves make [128 keys, BLOCK_M]
                    ds_t = ds_smem.index(it % 2)
                    ds_t.slice(64 * wg, 64).slice(0, 64, dim=1).store(ds.to(DTYPE))
                p16 = gl.convert_layout(p.to(DTYPE), A_LAYOUT)
                if not (FUSED and DS_SMEM):
                    ds16 = gl.convert_layout(ds.to(DTYPE), A_LAYOUT)
                p, ds = _p_and_ds(s_b, dp_b, m0 + 64, lse_in_b, delta_in_b, key0, off, qk_scale, seqlen_q,
                                  IS_CAUSAL, 64, S_LAYOUT, 1, 0, shape.MASK_EVERY_TILE, window_left, shape.WINDOW,
                                  cap_in, shape.SOFTCAP, LSE_TMA)
                if FUSED:
                    ds_t.slice(64 * wg, 64).slice(64, 64, dim=1).store(ds.to(DTYPE))
                    fence_async_shared()
                    _pass(ds_bar.index(it % 2))
                p16_b = gl.convert_layout(p.to(DTYPE), A_LAYOUT)
                if not (FUSED and DS_SMEM):
                    ds16_b = gl.convert_layout(ds.to(DTYPE), A_LAYOUT)
                if TURNS:
                    mbarrier.wait(mine, 1)
                dv = warpgroup_mma(p16, do_t.slice(0, 64), dv, is_async=True)
                dv = warpgroup_mma(p16_b, do_t.slice(64, 64), dv, is_async=True)
                if FUSED and DS_SMEM:  # both halves' dS^T, fenced and passed on above: one wgmma over 128 queries
                    dk = warpgroup_mma(ds_t.slice(64 * wg, 64), q_t, dk, is_async=True)
                else:
                    dk = warpgroup_mma(ds16, q_t.slice(0, 64), dk, is_async=True)
                    dk = warpgroup_mma(ds16_b, q_t.slice(64, 64), dk, is_async=True)
            else:
                s, dp = _s_and_dp(k_w, q_t, v_w, do_t, other, BLOCK_M, S_LAYOUT, k_w_b, q_t_b, HEAD_DIM_B > 0,
                                  TURNS)  # S^T, dP^T
                p, ds = _p_and_ds(s, dp, m0, lse_in, delta_in, key0, off, qk_scale, seqlen_q, IS_CAUSAL, BLOCK_M,
                                  S_LAYOUT, 1, 0, shape.MASK_EVERY_TILE, window_left, shape.WINDOW, cap_in,
                                  shape.SOFTCAP, LSE_TMA)
                if FUSED:  # this consumer's dS^T for the tile's dQ: both consumers' halves make [128 keys, BLOCK_M]
                    ds_t = ds_smem.index(it % 2)
                    ds_t.slice(64 * wg, 64).store(ds.to(DTYPE))
                    fence_async_shared()
                    _pass(ds_bar.index(it % 2))
                p16 = gl.convert_layout(p.to(DTYPE), A_LAYOUT)
                if not (FUSED and DS_SMEM):
                    ds16 = gl.convert_layout(ds.to(DTYPE), A_LAYOUT)
                if TURNS:
                    mbarrier.wait(mine, 1)
                dv = warpgroup_mma(p16, do_t, dv, is_async=True)
                if FUSED and DS_SMEM:  # (dS^T fenced and passed on above)
                    dk = warpgroup_mma(ds_t.slice(64 * wg, 64), q_t, dk, is_async=True)
                else:
                    dk = warpgroup_mma(ds16, q_t, dk, is_async=True)
                if HEAD_DIM_B > 0:
                    dk_b = warpgroup_mma(gl.convert_layout(ds16, AB_LAYOUT), q_t_b, dk_b, is_async=True)
            if FUSED:  # dQ's partial of the tile: this consumer's columns (hd 64: all of them every other tile)
                order = None
                if DQ_ADDER:  # the adder's barriers for this consumer's tile, and its adds so far
                    order = (dq_full.index(wg), dq_empty.index(wg), it // 2 if DQ_ALTERNATE else it)
                if DQ_ALTERNATE:  # (dV and dK retired first: async accumulators cannot cross a run-time if)
                    dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
                    if it % 2 == wg:
                        dv, dk = _dq_turn(ds_t, k_smem, ds_bar.index(it % 2), (it // 2) & 1, other, dv, dk,
                                          dq_smem.index(wg), dq_desc, b, m0, hs, sm_scale, 0, shape, order, False)
                    elif TURNS:
                        _pass(other)
                else:  # (wg is a compile-time value in each partition: its half is too)
                    dv, dk = _dq_turn(ds_t, k_smem, ds_bar.index(it % 2), (it // 2) & 1, other, dv, dk,
                                      dq_smem.index(wg), dq_desc, b, m0, hs, sm_scale, DQ_COLS * wg * DQ_COL_HALVES,
                                      shape, order, True, 64 * wg * DQ_ROW_HALVES)
            else:
                if TURNS:
                    _pass(other)
                if HEAD_DIM_B > 0:
                    dv, dk, dk_b = warpgroup_mma_wait(0, deps=(dv, dk, dk_b))
                else:
                    dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
            _pass(empty.index(slot))  # this tile's Q and dO read: the slot is free
            it += 1
    if shape.PERSISTENT:
        _pass(kv_free)  # (every wgmma of this consumer retired: the next tile's K and V may land)
    if FUSED and not DQ_ADDER:
        tma.store_wait(pendings=0)  # the last reduce has read dq_smem before the program ends
    if TIMES:
        _stamp(stamp + 2)
    dk = dk * sm_scale
    rows = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, G_LAYOUT))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, G_LAYOUT))
    keep = gl.expand_dims(rows < seqlen_k, 1)
    b64 = b.to(gl.int64)
    hk64 = hk.to(gl.int64)
    r64 = gl.expand_dims(rows.to(gl.int64), 1)
    gl.store(DK + b64 * stride_dkb + hk64 * stride_dkh + r64 * stride_dks + gl.expand_dims(dims, 0),
             dk.to(DK.dtype.element_ty), mask=keep)
    if HEAD_DIM_B > 0:  # dK's second head-dim part, from column HEAD_DIM
        dk_b = dk_b * sm_scale
        rows_b = key0 + gl.arange(0, 64, layout=gl.SliceLayout(1, GB_LAYOUT))
        dims_b = HEAD_DIM + gl.arange(0, KB_DIM, layout=gl.SliceLayout(0, GB_LAYOUT))
        gl.store(DK + b64 * stride_dkb + hk64 * stride_dkh + gl.expand_dims(rows_b.to(gl.int64), 1) * stride_dks
                 + gl.expand_dims(dims_b, 0), dk_b.to(DK.dtype.element_ty), mask=gl.expand_dims(rows_b < seqlen_k, 1))
    gl.store(DV + b64 * stride_dvb + hk64 * stride_dvh + r64 * stride_dvs + gl.expand_dims(dims, 0),
             dv.to(DV.dtype.element_ty), mask=keep)
    if shape.SPLIT_SUM:  # (the group split's partials just stored: the last of a row block's parts sums them)
        _split_sum(sums, b64, hk64, key0, r64, gl.expand_dims(dims, 0), keep, stride_dkb, stride_dks, stride_dkh,
                   stride_dvb, stride_dvs, stride_dvh, seqlen_k, HEAD_DIM, G_LAYOUT)
    if TIMES:
        _stamp(stamp + 3)
        _stamp(stamp + 5, True)
        gl.store(stamp + 6, gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=True,
                                                      pack=1).to(gl.int64))
        gl.store(stamp + 7, it - it0)
    return it


@gluon.jit(do_not_specialize=["window_left"])  # (a window of 1 would otherwise compile as a constant)
def _bwd_dkdv_ws_kernel(Q, K, V, DO, Lse, Delta, DK, DV, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                        stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh, stride_dkb,
                        stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh, stride_lb, stride_lh, stride_db,
                        stride_dh, stride_dkp, stride_dvp, group_split, batch, seqlen_q, seqlen_k, num_heads, group,
                        sm_scale,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr,
                        NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, Q_SL: gl.constexpr,
                        K_SL: gl.constexpr, num_warps: gl.constexpr, HEAD_DIM_B: gl.constexpr = 0,
                        QB_SL: gl.constexpr = None, KB_SL: gl.constexpr = None, DQacc=None, stride_dqab=0,
                        stride_dqas=0, stride_dqah=0, DQ_COLS: gl.constexpr = 0, DS_SL: gl.constexpr = None,
                        DQ_SL: gl.constexpr = None, DQ_SINK: gl.constexpr = 0, Sem=None,
                        LAST_FIRST: gl.constexpr = False, DQ_ADDER: gl.constexpr = False,
                        WALK: gl.constexpr = 0, QUERY_HALVES: gl.constexpr = False,
                        MASK_EVERY_TILE: gl.constexpr = False, DQ_UNSCALED: gl.constexpr = False,
                        DS_SMEM: gl.constexpr = False, NO_TURNS: gl.constexpr = False, Times=None,
                        PERSISTENT: gl.constexpr = False, HOST_DESC: gl.constexpr = False, QD=None, DOD=None,
                        KD=None, VD=None, DQD=None, window_left=0, WINDOW: gl.constexpr = False, softcap=0.0,
                        SOFTCAP: gl.constexpr = False, Count=None, DKsum=None, DVsum=None,
                        LSE_TMA: gl.constexpr = False, L_SL: gl.constexpr = None, UNITS_FIRST: gl.constexpr = False):
    """dK and dV of 128 keys of one (batch, kv head) a program (grid: key blocks x batch x kv heads x group
    split; ``UNITS_FIRST``: batch x kv heads x group split x key blocks, :func:`dkdv_grid`'s ``units_first``).
    ``group_split`` > 1 (MQA / GQA with few kv heads): that many programs share a group's query heads, each
    writing its fp32 partial dK / dV at DK + split * stride_dkp (bwd._sum_partials adds them in split order), as
    the Triton dK / dV kernel does. ``HEAD_DIM_B``: a second part of the q / k head dim (DeepSeek's MLA: 192 =
    128 + 64, v 128 = HEAD_DIM; TMA boxes are powers of two), its Q and K tiles (layouts QB_SL, KB_SL) from column
    HEAD_DIM.
    ``DQ_COLS`` > 0 (the fused backward, BLOCK_M 64, no second head-dim part): dQ too, each tile's partial added
    into ``DQacc`` (fp32 [B, Sq, Hq, HEAD_DIM], zeroed by the caller, softmax scale applied) by TMA reduce; dS^T
    through shared memory (DS_SL: [128, BLOCK_M]), the partials through fp32 tiles (DQ_SL), added by the consumers
    themselves or (``DQ_ADDER``) by a fourth partition, an adder warp. With ``Sem`` (``DQ_TURNS`` in the
    partitions; an adder warp too): each dQ tile's adds in a fixed order (bitwise reproducible), counted in ``Sem``
    (:func:`order_counters`, zeroed by the caller; see _dq_adder). ``LAST_FIRST``: the key blocks launched last
    first (the ordered kernel's order: :func:`dkdv_gluon`'s ``last_first``). ``WALK``: how a program walks its (head,
    tile) steps (:func:`_walk_bounds`). ``QUERY_HALVES`` (128-row tiles, one head-dim part): a consumer's S^T and dP^T
    as two 64-query halves each, one half's P^T and dS^T made while the other's wgmmas run (:func:`dkdv_arguments`).
    ``DS_SMEM`` (fused): dK's A operand, dS^T, read from the shared buffer it was stored to for dQ (``ds_smem``).
    ``MASK_EVERY_TILE`` (causal): the mask applied on every tile, not behind a branch (:func:`_p_and_ds`).
    ``DQ_UNSCALED`` (fused): dQ's partials added without the softmax scale (the caller scales the sum).
    ``NO_TURNS``: the consumers issue their wgmmas without taking turns (flash-attn-4's and FA3's sm90 backwards
    have no such handover; the fused kernel's shared dS^T buffers are ordered by ``ds_bar`` alone, see
    :func:`_bwd_consume`). ``Times`` (probes; None compiles it out): each consumer's timeline (:func:`_bwd_consume`).
    ``PERSISTENT``: one program an SM (grid: min(tiles, SMs) x 1) over the (key block, batch, kv head, group part)
    tiles, tile t to program t mod the grid (:func:`_persistent_tile`'s order); descriptors and barriers made once
    a program, not once a tile (session 44's timeline: 5-7 us between two programs on an SM, 10-28% of the SMs' time
    at 1k), the next tile's K / V and first Q / dO tiles loaded while this one's dK / dV are stored. Not with the
    ordered adds (``Sem``) or ``LAST_FIRST``. ``Times``: with each consumer's timeline the program's entry (the SM's
    cycle counter before the descriptors are made) and the moment Q's, dO's, K's and V's descriptors are made (before
    the shared memory's barriers; the fused kernel's dQ descriptor comes after), in its first tile's records.
    ``HOST_DESC``: Q's, dO's, K's, V's (and the fused kernel's dQ accumulator's) TMA descriptors made on the host
    (``QD``, ``DOD``, ``KD``, ``VD``, ``DQD``: :func:`host_descriptors`' kernel parameters) instead of by every program
    on the device (session 47's timeline: 4.0-4.1 us of a program's 4.6-5.9 us set-up); one head-dim part only.
    ``WINDOW`` (causal, one program a tile, not fused): query i sees keys i + Sk - Sq - ``window_left`` .. i + Sk -
    Sq; a program's query tiles end at the last that sees one of its keys, the tiles crossing a window edge masked
    (:func:`_p_and_ds`); ``window_left`` is read only with it. ``SOFTCAP`` (not fused): the forward capped the scores
    at ``softcap`` (softcap * tanh(s * sm_scale / softcap)): P^T recomputed through the hardware's tanh, dS^T through
    the cap's slope (:func:`_p_and_ds`, as the dQ kernel's); ``softcap`` is read only with it. ``Count`` (with
    ``group_split`` > 1, not fused, one head-dim part; the kernel's SPLIT_SUM): int32 counters, zero, one a (batch, kv
    head, 16-key rows of each 128-key block) (:func:`split_counter_count`): the part that stores a row block's
    partials last sums them into ``DKsum`` / ``DVsum`` (the gradients, contiguous) itself (:func:`_split_sum`), no
    sum launch after. ``LSE_TMA`` (lse and delta [batch, heads, seqlen_q] with 16-byte strides): each query tile's lse
    and delta rows come with its Q and dO tiles, by TMA into shared memory (``L_SL``: [1, 1, BLOCK_M] fp32), not by the
    consumers' own loads, which session 58's ncu source page (H200, GQA 40/8 2k hd 128) showed them waiting on after
    their S^T wgmma (a long-scoreboard stall on lse's first use). The fused kernel's too: a row past the sequence gets
    P^T 1 and dS^T 0 there, so its dQ partial is 0 as well (and the TMA reduce clips it). ``UNITS_FIRST`` (one
    program a tile): the grid's first dimension the (batch, kv head, group part) units, its second the key blocks, so
    the GPU, which starts programs in the grid's order as SMs free up, starts every unit's first key block before
    any unit's second: causal, a program's work falls with its key block, and the heaviest start first (the
    longest-processing-first rule) instead of each unit's heavy blocks waiting behind earlier units' light ones."""
    TIMES: gl.constexpr = Times is not None
    SPLIT_SUM: gl.constexpr = Count is not None
    if TIMES:  # (the program's entry, before its descriptors and barriers: both consumers' records of its first tile)
        entry = Times + (gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)) * 20 + 8
        _stamp(entry)
        _stamp(entry + 10)
    D_QK: gl.constexpr = HEAD_DIM + HEAD_DIM_B  # q / k columns in memory
    kv_heads = num_heads // group
    DQ_TURNS: gl.constexpr = Sem is not None
    ADDER: gl.constexpr = DQ_ADDER or DQ_TURNS
    gl.static_assert(not ADDER or DQ_SINK == 0, "the adder warp adds every partial")
    gl.static_assert(WALK != 2 or not DQ_TURNS, "the ordered adds walk each head's tiles from the diagonal")
    gl.static_assert(not PERSISTENT or not (DQ_TURNS or LAST_FIRST), "the persistent kernel: unordered adds")
    gl.static_assert(not PERSISTENT or not UNITS_FIRST, "units first: one program a tile")
    if UNITS_FIRST:
        pid_n = gl.program_id(1)
        pid_bh = gl.program_id(0)
    else:
        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)  # (persistent: 0, its b to j_lo unused but gs: 0, DK / DV without an offset)
    if LAST_FIRST:  # a tile's first adder launched before those that wait on it (the ordered kernel, long keys)
        pid_n = gl.cdiv(seqlen_k, 128) - 1 - pid_n
    b, hk, gs, n0, g_lo, g_hi, j_lo = _dkdv_coords(pid_n, pid_bh, seqlen_q, seqlen_k, kv_heads, group, group_split,
                                                   BLOCK_M, IS_CAUSAL)
    n_m = gl.cdiv(seqlen_q, BLOCK_M)
    if WINDOW:  # the last query tile that sees one of these keys (query i sees key n iff n >= i + off - window_left)
        gl.static_assert(IS_CAUSAL and not PERSISTENT and DQ_COLS == 0, "a window: causal, one program a tile, dK / dV")
        n_m = gl.maximum(gl.minimum(n_m, gl.cdiv(gl.maximum(n0 + 128 + window_left - (seqlen_k - seqlen_q), 0),
                                                 BLOCK_M)), j_lo)
    if HOST_DESC:
        gl.static_assert(HEAD_DIM_B == 0, "host-made descriptors: one head-dim part")
        q_desc, do_desc, k_desc, v_desc = QD, DOD, KD, VD
    else:
        q_desc = tma.make_tensor_descriptor(Q, [batch, seqlen_q, num_heads, D_QK],
                                            [stride_qb, stride_qs, stride_qh, 1], [1, BLOCK_M, 1, HEAD_DIM], Q_SL)
        do_desc = tma.make_tensor_descriptor(DO, [batch, seqlen_q, num_heads, HEAD_DIM],
                                             [stride_dob, stride_dos, stride_doh, 1], [1, BLOCK_M, 1, HEAD_DIM], Q_SL)
        k_desc = tma.make_tensor_descriptor(K, [batch, seqlen_k, kv_heads, D_QK], [stride_kb, stride_ks, stride_kh, 1],
                                            [1, 64, 1, HEAD_DIM], K_SL)
        v_desc = tma.make_tensor_descriptor(V, [batch, seqlen_k, kv_heads, HEAD_DIM],
                                            [stride_vb, stride_vs, stride_vh, 1], [1, 64, 1, HEAD_DIM], K_SL)
    dtype: gl.constexpr = Q.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, 1, HEAD_DIM], Q_SL)
    do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_M, 1, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(dtype, [2, 1, 64, 1, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(dtype, [2, 1, 64, 1, HEAD_DIM], K_SL)
    q_desc_b, k_desc_b, q_smem_b, k_smem_b = _second_part(
        Q, K, batch, seqlen_q, seqlen_k, num_heads, kv_heads, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
        stride_kh, q_desc, k_desc, q_smem, k_smem, HEAD_DIM, HEAD_DIM_B, NUM_STAGES, BLOCK_M, 2, 64, QB_SL, KB_SL)
    if TIMES:  # (Q's, dO's, K's and V's descriptors made: the set-up's first part)
        _stamp(entry + 1)
        _stamp(entry + 11)
    kv_bar, ready, empty, turn = _ws_barriers(NUM_STAGES)
    lse_desc, delta_desc, lse_smem, delta_smem = _lse_ring(Lse, Delta, batch, num_heads, seqlen_q, stride_lb,
                                                           stride_lh, stride_db, stride_dh, q_desc, q_smem, BLOCK_M,
                                                           NUM_STAGES, L_SL, LSE_TMA)
    if DQ_COLS > 0:
        gl.static_assert((BLOCK_M == 64 or (BLOCK_M == 128 and DQ_COLS == HEAD_DIM)) and HEAD_DIM_B == 0,
                         "the fused dQ: 64-row tiles (hd 64: or 128-row), one head-dim part")
        if HOST_DESC:
            dq_desc = DQD
        else:
            dq_desc = tma.make_tensor_descriptor(DQacc, [batch, seqlen_q, num_heads, HEAD_DIM],
                                                 [stride_dqab, stride_dqas, stride_dqah, 1], [1, 64, 1, DQ_COLS], DQ_SL)
        ds_smem = gl.allocate_shared_memory(dtype, [2, 128, BLOCK_M], DS_SL)
        dq_smem = gl.allocate_shared_memory(gl.float32, [2, 1, 64, 1, DQ_COLS], DQ_SL)
        ds_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_bar.index(i), count=2)  # both consumers' halves of a tile's dS^T
    else:  # stand-ins, never read
        dq_desc, ds_smem, dq_smem, ds_bar = q_desc, q_smem, q_smem, turn
    dq_full, dq_empty = turn, turn  # (stand-ins, never read, unless ADDER)
    if ADDER:  # a consumer's dQ tile handed to the adder warp (full) and back (empty)
        dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(dq_full.index(i), count=1)
            mbarrier.init(dq_empty.index(i), count=1)

    tiles = 0  # (persistent: the tiles, the coordinates' inputs, K / V's release and the group split's strides)
    if PERSISTENT:
        kv_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_free, count=2)  # both consumers
        tiles = (gl.cdiv(seqlen_k, 128) * batch * kv_heads * group_split, kv_heads, group_split, seqlen_q, seqlen_k,
                 kv_free, stride_dkp, stride_dvp)

    gl.static_assert(not QUERY_HALVES or (BLOCK_M == 128 and HEAD_DIM_B == 0), "query halves: 128-row tiles")
    gl.static_assert(not SOFTCAP or DQ_COLS == 0, "a softcap: the dK / dV kernel (not fused)")
    gl.static_assert(not SPLIT_SUM or (DQ_COLS == 0 and HEAD_DIM_B == 0),
                     "the group split summed in the kernel: the dK / dV kernel, one head-dim part")
    qk_scale, cap_in = _cap_scales(sm_scale, softcap, SOFTCAP)
    shape = _BwdShape(HEAD_DIM, BLOCK_M, NUM_STAGES, IS_CAUSAL, HEAD_DIM_B, DQ_COLS, DQ_SINK, ADDER, DQ_TURNS,
                      WALK, QUERY_HALVES, MASK_EVERY_TILE, DQ_UNSCALED, DS_SMEM, not NO_TURNS, TIMES, PERSISTENT,
                      WINDOW, SOFTCAP, SPLIT_SUM, LSE_TMA)
    load_args = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, b, hk, n0,
                 group, g_lo, g_hi, j_lo, n_m, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, tiles, lse_desc,
                 delta_desc, lse_smem, delta_smem)
    gs64 = gs.to(gl.int64)
    consume_args = (q_smem, do_smem, k_smem, v_smem, kv_bar, ready, empty, turn, DK + gs64 * stride_dkp,
                    DV + gs64 * stride_dvp, Lse, Delta, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs,
                    stride_dvh, stride_lb, stride_lh, stride_db, stride_dh, b, hk, n0, group, g_lo, g_hi, j_lo, n_m,
                    seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b, k_smem_b, ds_smem, dq_smem, ds_bar,
                    dq_desc, dq_full, dq_empty, tiles, lse_smem, delta_smem)
    if SPLIT_SUM or WINDOW or TIMES or SOFTCAP:  # (only then: a partition's run-time arguments pass through shared
        sums = 0  # memory)
        if SPLIT_SUM:
            sums = (Count, DKsum, DVsum, DK, DV, group_split, stride_dkp, stride_dvp, kv_heads)
        consume_args = consume_args + (sums, )
    if WINDOW or TIMES or SOFTCAP:
        consume_args = consume_args + (window_left if WINDOW else 0, )
    if SOFTCAP or TIMES:
        consume_args = consume_args + (cap_in, )
    if TIMES:
        consume_args = consume_args + (Times, )
    if ADDER:  # a fourth partition: the adder warp (unordered: dQ's buffer a stand-in for the counters, never read)
        if DQ_TURNS:
            add_args = (dq_smem, dq_full, dq_empty, dq_desc, Sem, b, hk, n0, group, g_lo, g_hi, j_lo, n_m, seqlen_q,
                        seqlen_k, num_heads, shape)
        else:
            add_args = (dq_smem, dq_full, dq_empty, dq_desc, DQacc, b, hk, n0, group, g_lo, g_hi, j_lo, n_m,
                        seqlen_q, seqlen_k, num_heads, shape, tiles)
        gl.warp_specialize([(_bwd_consume, (0, ) + consume_args), (_bwd_consume, (1, ) + consume_args),
                            (_bwd_load, load_args), (_dq_adder, add_args)], [4, 1, 1], [CONSUMER_REGS, 24, 24])
    else:
        gl.warp_specialize([(_bwd_consume, (0, ) + consume_args), (_bwd_consume, (1, ) + consume_args),
                            (_bwd_load, load_args)], [4, 1], [CONSUMER_REGS, 24])


# --------------------------------------------------------------------------------------------
# dQ (and delta): a program owns 128 query rows of one (batch, query head); the forward's plan with dP and dQ
# --------------------------------------------------------------------------------------------


@gluon.jit
def _dq_tile_coords(t, tiles, IS_CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, ORDER: gl.constexpr):
    """The persistent dQ kernel's tile ``t`` -> (batch, query head, kv head, first query row, key blocks, the first
    masked one) (``tiles``: its persistent arguments: the tiles, query heads, group, both sequence lengths, Q / dO's
    release), in :func:`_persistent_tile`'s order over query blocks."""
    num_heads, group, seqlen_q, seqlen_k = tiles[1], tiles[2], tiles[3], tiles[4]
    pid_m, pid_bh = _persistent_tile(t, tiles[0], seqlen_q, IS_CAUSAL, ORDER, True)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    m0 = pid_m * 128
    n_blocks, mask_from = _key_blocks(m0, seqlen_k - seqlen_q, seqlen_k, 128, BLOCK_N, IS_CAUSAL)
    return b, h, h // group, m0, n_blocks, mask_from


@gluon.jit
def _dq_load(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, b, h, hk, m0,
             n_blocks, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, tiles=0, lo=0):
    """The loader warp: both consumers' Q and dO tiles once, then K and V block by block (from block ``lo``: a
    window's first, ``shape.WINDOW`` only) into the slots both consumers released. With ``shape.HEAD_DIM_B`` the
    second q / k head-dim part's Q and K tiles too (``*_b``: from column HEAD_DIM). ``shape.PERSISTENT``: the same
    per tile of the program's (``tiles``: the kernel's persistent arguments; b to n_blocks unused), a tile's Q and
    dO once both consumers released the last tile's (``q_free``: after their last key block's wgmmas, before their
    dQ stores), then its K / V blocks, the ring's slots counted over the tiles: the next tile's Q, dO and first K /
    V blocks load while this one's dQ is stored (not earlier: the K / V blocks could go before the ``q_free`` wait,
    into the slots already released; not built, since the consumers need the Q / dO tiles issued after it first)."""
    if shape.PERSISTENT:
        q_free = tiles[5]
        j = 0
        i = 0
        for t in range(gl.program_id(0), tiles[0], gl.num_programs(0)):
            b, h, hk, m0, n_blocks, mask_from = _dq_tile_coords(t, tiles, shape.IS_CAUSAL, shape.BLOCK_M,
                                                                shape.PERSISTENT)
            mbarrier.wait(q_free, (i - 1) & 1, pred=i > 0)  # (both consumers' last reads of the last Q / dO)
            j = _dq_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty,
                              b, h, hk, m0, n_blocks, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, j)
            i += 1
    else:
        _dq_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, b, h, hk,
                      m0, n_blocks, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, 0, lo)


@gluon.jit
def _dq_load_tile(q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, b, h, hk,
                  m0, n_blocks, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, j0, lo=0):
    """:func:`_dq_load`'s work for one tile (key blocks [lo, n_blocks)), the ring's slots counted from ``j0``;
    returns the count after it."""
    j0 = gl.to_tensor(j0)  # (a loop-carried count: a plain 0 for a program's only tile)
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    BLOCK_N: gl.constexpr = shape.BLOCK_M  # (the dQ kernel's key block rides in the shape's BLOCK_M)
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    mbarrier.expect(q_bar, 2 * 64 * (2 * HEAD_DIM + HEAD_DIM_B) * 2)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [b, m0 + 64 * w, h, 0], q_bar, q_smem.index(w))
        tma.async_copy_global_to_shared(do_desc, [b, m0 + 64 * w, h, 0], q_bar, do_smem.index(w))
        if HEAD_DIM_B > 0:
            tma.async_copy_global_to_shared(q_desc_b, [b, m0 + 64 * w, h, HEAD_DIM], q_bar, q_smem_b.index(w))
    for jb in range(lo, n_blocks):
        j = j0 + (jb - lo)
        slot = j % NUM_STAGES
        mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) - 1) & 1, pred=j >= NUM_STAGES)
        mbarrier.expect(ready.index(slot), BLOCK_N * (2 * HEAD_DIM + HEAD_DIM_B) * 2)
        tma.async_copy_global_to_shared(k_desc, [b, jb * BLOCK_N, hk, 0], ready.index(slot), k_smem.index(slot))
        tma.async_copy_global_to_shared(v_desc, [b, jb * BLOCK_N, hk, 0], ready.index(slot), v_smem.index(slot))
        if HEAD_DIM_B > 0:
            tma.async_copy_global_to_shared(k_desc_b, [b, jb * BLOCK_N, hk, HEAD_DIM], ready.index(slot),
                                            k_smem_b.index(slot))
    return j0 + (n_blocks - lo)


@gluon.jit
def _dq_consume(wg, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, turn, Out, Lse, Delta, DQ, stride_ob,
                stride_os, stride_oh, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, b, h, m0, n_blocks,
                mask_from, seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b, k_smem_b, tiles=0, lo=0, left_to=0,
                window_left=0, cap_in=0.0):
    """One consumer warpgroup (:func:`_dq_consume_tile`) over the program's tile, or with ``shape.PERSISTENT`` over
    each of its tiles in turn (``tiles``: the kernel's persistent arguments; b to mask_from unused), the key
    blocks counted over the program's tiles. ``lo``, ``left_to``, ``window_left``: a window's (``shape.WINDOW``, one
    program a tile), ``cap_in`` a softcap's (``shape.SOFTCAP``): :func:`_dq_consume_tile`'s."""
    if shape.PERSISTENT:
        j = 0
        i = 0
        for t in range(gl.program_id(0), tiles[0], gl.num_programs(0)):
            b, h, hk, m0, n_blocks, mask_from = _dq_tile_coords(t, tiles, shape.IS_CAUSAL, shape.BLOCK_M,
                                                                shape.PERSISTENT)
            j = _dq_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, turn, Out, Lse, Delta,
                                 DQ, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_dqb, stride_dqs,
                                 stride_dqh, b, h, m0, n_blocks, mask_from, seqlen_q, seqlen_k, qk_scale, sm_scale,
                                 shape, q_smem_b, k_smem_b, i, j, tiles[5], 0, 0, 0, cap_in)
            i += 1
    else:
        _dq_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, turn, Out, Lse, Delta, DQ,
                         stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, b,
                         h, m0, n_blocks, mask_from, seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b,
                         k_smem_b, 0, 0, q_bar, lo, left_to, window_left, cap_in)


@gluon.jit
def _dq_consume_tile(wg, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, turn, Out, Lse, Delta, DQ, stride_ob,
                     stride_os, stride_oh, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, b, h, m0,
                     n_blocks, mask_from, seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b, k_smem_b, i, j0,
                     q_free, lo=0, left_to=0, window_left=0, cap_in=0.0):
    """One consumer warpgroup's work on one tile (``i``: the program's tiles before it; ``j0``: the key blocks
    consumed before it; returns the count after it): query rows [m0 + 64 wg, + 64). First delta = rowsum(dO * O) of
    its rows (stored for the dK / dV kernel), then per key block S = Q K^T and dP = dO V^T issued in one turn, P and
    dS computed, and dQ += dS K issued in the next turn; dQ scaled and stored at the end. Two turns a key block,
    each consumer's, every block: a turn's barrier phase is even for the first, odd for the second. With
    ``shape.HEAD_DIM_B`` (MLA) S is two chained wgmmas and dQ two accumulators, one a head-dim part.
    ``shape.PERSISTENT``: once its last wgmmas reading the tile's Q and dO retired, the consumer releases them
    (``q_free``) before storing dQ, so the loader brings the next tile's meanwhile. ``shape.WINDOW`` (causal): row
    i sees keys i + off - ``window_left`` .. i + off; the key blocks from ``lo`` (the first the tile's first row
    sees), those starting left of ``left_to`` (the tile's last row's window edge) masked as well as the diagonal's.
    ``shape.SOFTCAP``: the scores capped as the forward capped them, t = tanh(s * ``cap_in``) (``cap_in`` = sm_scale
    / softcap; ``qk_scale`` = softcap * log2(e)), P = 2^(t * qk_scale - lse * log2(e)), and dS = P (dP - delta)
    (1 - t^2): the cap's slope, its tile kept from S's wait until dP's."""
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    HEAD_DIM_B: gl.constexpr = shape.HEAD_DIM_B
    KB_DIM: gl.constexpr = HEAD_DIM_B if HEAD_DIM_B > 0 else HEAD_DIM  # the second part's tiles (read only with it)
    BLOCK_N: gl.constexpr = shape.BLOCK_M
    NUM_STAGES: gl.constexpr = shape.NUM_STAGES
    IS_CAUSAL: gl.constexpr = shape.IS_CAUSAL
    S_LAYOUT: gl.constexpr = _acc_layout(BLOCK_N)  # S, dP: 64 queries x BLOCK_N keys
    G_LAYOUT: gl.constexpr = _acc_layout(HEAD_DIM)  # dQ
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=G_LAYOUT, k_width=2)
    GB_LAYOUT: gl.constexpr = _acc_layout(KB_DIM)  # dQ's second part
    AB_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=GB_LAYOUT, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    DTYPE: gl.constexpr = q_smem.dtype
    off = seqlen_k - seqlen_q
    row0 = m0 + 64 * wg
    q_w = q_smem.index(wg).reshape([64, HEAD_DIM])
    do_w = do_smem.index(wg).reshape([64, HEAD_DIM])
    q_w_b = q_smem_b.index(wg).reshape([64, KB_DIM])
    mine = turn.index(wg)
    other = turn.index(1 - wg)
    b64 = b.to(gl.int64)
    h64 = h.to(gl.int64)
    rows = row0 + gl.arange(0, 64, layout=ROWS)
    row_ok = rows < seqlen_q
    # rows past the sequence: lse +inf makes P 0
    lse2 = gl.load(Lse + b64 * stride_lb + h64 * stride_lh + rows, mask=row_ok, other=float("inf")) \
        * 1.4426950408889634

    mbarrier.arrive(turn.index(0), count=1, pred=(wg == 1) & (i == 0))  # consumer 0 issues first (a program's)
    mbarrier.wait(q_bar, i & 1)
    # delta = rowsum(dO * O) over this warpgroup's rows, kept for dS and published for the dK / dV kernel
    o_rows = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, G_LAYOUT))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, G_LAYOUT))
    o_keep = gl.expand_dims(o_rows < seqlen_q, 1)
    o = gl.load(Out + b64 * stride_ob + h64 * stride_oh + gl.expand_dims(o_rows.to(gl.int64) * stride_os, 1)
                + gl.expand_dims(dims, 0), mask=o_keep, other=0.0)
    delta = gl.sum(o.to(gl.float32) * do_w.load(G_LAYOUT).to(gl.float32), axis=1)
    gl.store(Delta + b64 * stride_lb + h64 * stride_lh + o_rows, delta, mask=o_rows < seqlen_q)
    delta = gl.convert_layout(delta, ROWS)

    dq = gl.zeros([64, HEAD_DIM], gl.float32, layout=G_LAYOUT)
    if HEAD_DIM_B > 0:
        dq_b = gl.zeros([64, KB_DIM], gl.float32, layout=GB_LAYOUT)
    j0 = gl.to_tensor(j0)  # (a loop-carried count: a plain 0 for a program's only tile)
    for jb in range(lo, n_blocks):
        j = j0 + (jb - lo)
        slot = j % NUM_STAGES
        k_t = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        v_t = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        k_t_b = k_smem_b.index(slot).reshape([BLOCK_N, KB_DIM])
        mbarrier.wait(ready.index(slot), (j // NUM_STAGES) & 1)
        mbarrier.wait(mine, 0)
        s, dp = _s_and_dp(q_w, k_t, do_w, v_t, other, BLOCK_N, S_LAYOUT, q_w_b, k_t_b, HEAD_DIM_B > 0)
        s = warpgroup_mma_wait(1, deps=(s, ))  # S done; dP may still run
        if shape.SOFTCAP:
            s = _tanh_approx(s * cap_in)
            slope = 1.0 - s * s
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        if IS_CAUSAL and shape.WINDOW:  # (the diagonal's blocks, and those left of the last row's window edge)
            if (jb * BLOCK_N >= mask_from) | (jb * BLOCK_N < left_to):
                keys = jb * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
                keep = gl.expand_dims(keys, 0) <= gl.expand_dims(rows + off, 1)
                keep = keep & (gl.expand_dims(keys, 0) >= gl.expand_dims(rows + off - window_left, 1))
                p = gl.where(keep, p, 0.0)
        elif IS_CAUSAL:
            if jb * BLOCK_N >= mask_from:  # the block holds keys some row must not see: key n iff n <= i + off
                keys = jb * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
                keep = gl.expand_dims(keys, 0) <= gl.expand_dims(rows + off, 1)
                p = gl.where(keep, p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp, ))
        ds = p * (dp - gl.expand_dims(delta, 1))
        if shape.SOFTCAP:
            ds = ds * slope
        ds16 = gl.convert_layout(ds.to(DTYPE), A_LAYOUT)
        mbarrier.wait(mine, 1)
        dq = warpgroup_mma(ds16, k_t, dq, is_async=True)  # keys past the sequence: zero-filled K rows add nothing
        if HEAD_DIM_B > 0:
            dq_b = warpgroup_mma(gl.convert_layout(ds16, AB_LAYOUT), k_t_b, dq_b, is_async=True)
        _pass(other)
        if HEAD_DIM_B > 0:
            dq, dq_b = warpgroup_mma_wait(0, deps=(dq, dq_b))
        else:
            dq = warpgroup_mma_wait(0, deps=(dq, ))
        _pass(empty.index(slot))  # this block's K and V read: the slot is free
    if shape.PERSISTENT:
        _pass(q_free)  # (every wgmma of this consumer retired: the next tile's Q and dO may land)
    dq = dq * sm_scale
    gl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + gl.expand_dims(o_rows.to(gl.int64) * stride_dqs, 1)
             + gl.expand_dims(dims, 0), dq.to(DQ.dtype.element_ty), mask=o_keep)
    if HEAD_DIM_B > 0:  # dQ's second head-dim part, from column HEAD_DIM
        dq_b = dq_b * sm_scale
        rows_b = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, GB_LAYOUT))
        dims_b = HEAD_DIM + gl.arange(0, KB_DIM, layout=gl.SliceLayout(0, GB_LAYOUT))
        gl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + gl.expand_dims(rows_b.to(gl.int64) * stride_dqs, 1)
                 + gl.expand_dims(dims_b, 0), dq_b.to(DQ.dtype.element_ty), mask=gl.expand_dims(rows_b < seqlen_q, 1))
    return j0 + (n_blocks - lo)


@gluon.jit(do_not_specialize=["window_left"])  # (a window of 1 would otherwise compile as a constant)
def _bwd_dq_ws_kernel(Q, K, V, DO, Out, Lse, Delta, DQ, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                      stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh, stride_ob,
                      stride_os, stride_oh, stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, batch,
                      seqlen_q, seqlen_k, num_heads, group, sm_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                      NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, Q_SL: gl.constexpr,
                      K_SL: gl.constexpr, num_warps: gl.constexpr, HEAD_DIM_B: gl.constexpr = 0,
                      QB_SL: gl.constexpr = None, KB_SL: gl.constexpr = None, PERSISTENT: gl.constexpr = False,
                      HOST_DESC: gl.constexpr = False, QD=None, DOD=None, KD=None, VD=None, window_left=0,
                      WINDOW: gl.constexpr = False, softcap=0.0, SOFTCAP: gl.constexpr = False,
                      UNITS_FIRST: gl.constexpr = False):
    """dQ of 128 query rows of one (batch, query head) a program (grid: query blocks x batch x query heads), and
    delta = rowsum(dO * O) of those rows (Delta, in lse's layout) for the dK / dV kernel that runs next.
    ``HEAD_DIM_B``: a second part of the q / k head dim (MLA), as ``_bwd_dkdv_ws_kernel``'s. ``PERSISTENT``: one
    program an SM (grid: min(tiles, SMs) x 1) over the (query block, batch, query head) tiles, tile t to program t
    mod the grid (:func:`_dq_tile_coords`' order); descriptors and barriers made once a program. ``HOST_DESC``: Q's,
    dO's, K's and V's descriptors made on the host (``QD`` .. ``VD``), as ``_bwd_dkdv_ws_kernel``'s. ``WINDOW``
    (causal, one program a tile): row i sees keys i + Sk - Sq - ``window_left`` .. i + Sk - Sq, a tile's key blocks
    from the first its first row sees (fp8_gluon._window_blocks, as the forward's); ``window_left`` read only with
    it. ``SOFTCAP``: the forward's scores were capped, ``softcap`` * tanh(s * sm_scale / ``softcap``) (read only
    then): P recomputed through the cap and dS through its slope (:func:`_dq_consume_tile`). ``UNITS_FIRST`` (one
    program a tile; grid: batch x query heads x query blocks, :func:`dq_grid`'s ``units_first``): the query blocks
    last first, so the GPU, which starts programs in grid order, starts every unit's heaviest causal block (the
    last: the most key blocks) before any unit's lighter ones."""
    D_QK: gl.constexpr = HEAD_DIM + HEAD_DIM_B  # q / k columns in memory
    gl.static_assert(not PERSISTENT or not UNITS_FIRST, "units first: one program a tile")
    if UNITS_FIRST:
        pid_m = gl.cdiv(seqlen_q, 128) - 1 - gl.program_id(1)
        pid_bh = gl.program_id(0)
    else:
        pid_m = gl.program_id(0)
        pid_bh = gl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    hk = h // group
    m0 = pid_m * 128
    n_blocks, mask_from = _key_blocks(m0, seqlen_k - seqlen_q, seqlen_k, 128, BLOCK_N, IS_CAUSAL)
    if WINDOW:  # (the first block the tile's first row sees; blocks starting left of left_to masked)
        gl.static_assert(IS_CAUSAL and not PERSISTENT, "a window: causal, one program a tile")
        lo, _, left_to = _window_blocks(m0, seqlen_k - seqlen_q, window_left, n_blocks, 128, BLOCK_N)
    kv_heads = num_heads // group
    if HOST_DESC:
        gl.static_assert(HEAD_DIM_B == 0, "host-made descriptors: one head-dim part")
        q_desc, do_desc, k_desc, v_desc = QD, DOD, KD, VD
    else:
        q_desc = tma.make_tensor_descriptor(Q, [batch, seqlen_q, num_heads, D_QK],
                                            [stride_qb, stride_qs, stride_qh, 1], [1, 64, 1, HEAD_DIM], Q_SL)
        do_desc = tma.make_tensor_descriptor(DO, [batch, seqlen_q, num_heads, HEAD_DIM],
                                             [stride_dob, stride_dos, stride_doh, 1], [1, 64, 1, HEAD_DIM], Q_SL)
        k_desc = tma.make_tensor_descriptor(K, [batch, seqlen_k, kv_heads, D_QK], [stride_kb, stride_ks, stride_kh, 1],
                                            [1, BLOCK_N, 1, HEAD_DIM], K_SL)
        v_desc = tma.make_tensor_descriptor(V, [batch, seqlen_k, kv_heads, HEAD_DIM],
                                            [stride_vb, stride_vs, stride_vh, 1], [1, BLOCK_N, 1, HEAD_DIM], K_SL)
    dtype: gl.constexpr = Q.dtype.element_ty
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 64, 1, HEAD_DIM], Q_SL)
    do_smem = gl.allocate_shared_memory(dtype, [2, 1, 64, 1, HEAD_DIM], Q_SL)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], K_SL)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, 1, BLOCK_N, 1, HEAD_DIM], K_SL)
    q_desc_b, k_desc_b, q_smem_b, k_smem_b = _second_part(
        Q, K, batch, seqlen_q, seqlen_k, num_heads, kv_heads, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
        stride_kh, q_desc, k_desc, q_smem, k_smem, HEAD_DIM, HEAD_DIM_B, 2, 64, NUM_STAGES, BLOCK_N, QB_SL, KB_SL)
    q_bar, ready, empty, turn = _ws_barriers(NUM_STAGES)

    tiles = 0  # (persistent: the tiles, the coordinates' inputs and Q / dO's release)
    if PERSISTENT:
        q_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_free, count=2)  # both consumers
        tiles = (gl.cdiv(seqlen_q, 128) * batch * num_heads, num_heads, group, seqlen_q, seqlen_k, q_free)
    qk_scale, cap_in = _cap_scales(sm_scale, softcap, SOFTCAP)
    shape = _BwdShape(HEAD_DIM, BLOCK_N, NUM_STAGES, IS_CAUSAL, HEAD_DIM_B, PERSISTENT=PERSISTENT, WINDOW=WINDOW,
                      SOFTCAP=SOFTCAP)
    load_args = (q_desc, do_desc, k_desc, v_desc, q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, b, h, hk, m0,
                 n_blocks, shape, q_desc_b, k_desc_b, q_smem_b, k_smem_b, tiles)
    consume_args = (q_smem, do_smem, k_smem, v_smem, q_bar, ready, empty, turn, Out, Lse, Delta, DQ, stride_ob,
                    stride_os, stride_oh, stride_lb, stride_lh, stride_dqb, stride_dqs, stride_dqh, b, h, m0,
                    n_blocks, mask_from, seqlen_q, seqlen_k, qk_scale, sm_scale, shape, q_smem_b, k_smem_b, tiles)
    if WINDOW:
        load_args = load_args + (lo, )
        consume_args = consume_args + (lo, left_to, window_left)
    elif SOFTCAP:
        consume_args = consume_args + (0, 0, 0)
    if SOFTCAP:
        consume_args = consume_args + (cap_in, )
    gl.warp_specialize([(_dq_consume, (0, ) + consume_args), (_dq_consume, (1, ) + consume_args),
                        (_dq_load, load_args)], [4, 1], [CONSUMER_REGS, 24])


def unsupported(q, k, v, do, lse, delta, kernel: str = "dkdv") -> str | None:
    """Why the ``kernel`` ("dkdv", or "dq": the dQ kernel alone) cannot run these inputs ([B, S, H, D] dense, its
    head dims: :data:`HEAD_DIMS`, the dQ kernel's :data:`DQ_HEAD_DIMS`; lse and delta [B, Hq, Sq] fp32), or None."""
    if q.dtype not in _DTYPES or any(t.dtype != q.dtype for t in (k, v, do)):
        return f"q, k, v, dO in bf16 or fp16 alike, got {q.dtype}, {k.dtype}, {v.dtype}, {do.dtype}"
    if any(t.dim() != 4 for t in (q, k, v, do)):
        return "dense [B, S, H, D] inputs"
    d, dv = q.shape[-1], v.shape[-1]
    dims = DQ_HEAD_DIMS if kernel == "dq" else HEAD_DIMS
    if (d, dv) not in dims or k.shape[-1] != d:
        return f"head dims (q / k, v) in {dims}, got q {d}, k {k.shape[-1]}, v {dv}"
    if q.shape[2] % k.shape[2] or v.shape[2] != k.shape[2]:
        return f"{q.shape[2]} query heads over {k.shape[2]} kv heads"
    if do.shape != q.shape[:3] + (dv, ):
        return f"dO's shape {tuple(do.shape)} is not q's with v's head dim {tuple(q.shape[:3]) + (dv, )}"
    want = (q.shape[0], q.shape[2], q.shape[1])
    if any(t.dtype != torch.float32 or tuple(t.shape) != want or t.stride(-1) != 1 for t in (lse, delta)):
        return f"lse and delta fp32 [B, Hq, Sq] = {want} with Sq contiguous"
    for t in (q, k, v, do):
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(x * t.element_size() % 16 for x in t.stride()[:3]):
            return "16-byte aligned rows with the head dim contiguous (TMA)"
    return None


#: A persistent launch's tile order (``persistent`` True: "snake") -> the kernels' PERSISTENT (:func:`_persistent_tile`).
PERSISTENT_ORDERS = {"snake": 1, "heavy": 2}


def persistent_order(persistent) -> int:
    """A launch's ``persistent`` (False, True: the snake order, or a name of :data:`PERSISTENT_ORDERS`) as the
    kernels' PERSISTENT (0: one program a tile)."""
    if persistent is True or persistent is False:
        return int(persistent)
    if persistent not in PERSISTENT_ORDERS:
        raise ValueError(f"persistent: True, False or one of {', '.join(PERSISTENT_ORDERS)}, got {persistent!r}")
    return PERSISTENT_ORDERS[persistent]


#: The kernels' host-made descriptor arguments -> the tensor argument each describes (kernels.launcher.Launch's
#: ``descriptors``: a replay describes that call's tensor).
HOST_DESCRIPTOR_OF = {"QD": "Q", "DOD": "DO", "KD": "K", "VD": "V", "DQD": "DQacc"}


def host_descriptor(t, rows: int, cols: int, layout):
    """A host-made rank-4 TMA descriptor over ``t`` [B, S, H, D] (its first three strides; the last dimension
    contiguous) with [1, rows, 1, cols] boxes in ``layout``: what the kernels otherwise make on the device from
    t's pointer, shape and strides (``HOST_DESC``)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), [t.stride(0), t.stride(1), t.stride(2), 1], [1, rows, 1, cols], layout)


def _host_descriptors(d_b: int, **described) -> dict:
    """The kernels' HOST_DESC and descriptor arguments (name -> (tensor, rows, cols, layout)); one head-dim part."""
    if d_b:
        raise ValueError(f"host-made descriptors: one q / k head-dim part (q / k = v head dims), got {d_b} more")
    return dict(HOST_DESC=True, **{name: host_descriptor(*spec) for name, spec in described.items()})


def dkdv_arguments(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, block_m=64, num_stages=2,
                   consumer_regs=240, split=1, dq_acc=None, dq_sink=0, dq_order=None, last_first=False,
                   dq_adder=False, walk=0, halves=None, mask_every_tile=False, dq_unscaled=False,
                   ds_smem=False, turns=True, times=None, persistent=False, host_desc=False,
                   window_left=-1, softcap=0.0, split_sum=None, lse_tma=False, units_first=False) -> dict:
    """Every argument of ``_bwd_dkdv_ws_kernel`` by name (a CPU compile binds the same). ``units_first`` (one
    program a tile): the kernel's UNITS_FIRST, for :func:`dkdv_grid`'s grid of the same name. ``split`` > 1: ``dk`` /
    ``dv`` are the group split's fp32 partials, [split, *k.shape] and [split, *v.shape]. q / k wider than v (MLA):
    the kernel's HEAD_DIM is v's and the rest of q / k's its second part (HEAD_DIM_B). ``dq_acc`` (the fused
    backward: an fp32 buffer shaped like q, zeroed): dQ is added into it (:data:`FUSED_HEAD_DIMS`); ``dq_sink``
    (probes only: dQ is then wrong) 1 stores the partials instead, 2 drops them. ``dq_adder`` (with ``dq_acc``):
    the partials added by an adder warp instead of by the consumers. ``dq_order`` (with ``dq_acc``):
    :func:`order_counters`' zeroed counters: each dQ tile's adds in a fixed order by an adder warp, bitwise
    reproducible. ``last_first``: the key blocks launched last first. ``walk``: how a program walks its (head, tile)
    steps: 0 heads outside (default), 1 one flat loop, 2 lockstep (:func:`_walk_bounds`). ``halves`` (128-row tiles,
    q / k = v head dims): S^T and dP^T as two 64-query halves (the kernel's QUERY_HALVES); None: where the sm_90a
    compile spills less so (:func:`query_halves`). ``mask_every_tile`` (causal; routed for the fused kernel at hd 128:
    configs.BWD_GLUON_FUSED_MASK_EVERY_TILE): the causal mask on every tile instead of behind a branch on the
    diagonal's (the kernel's MASK_EVERY_TILE). ``dq_unscaled`` (with ``dq_acc``; routed where
    configs.BWD_GLUON_FUSED_DQ_UNSCALED says, bwd._cast_dq then scales the sum): dQ's partials added without the
    softmax scale, which the caller then applies to the sum once (a multiply an element a tile less: 32 of the hd 64
    128-row tile loop's ~790 instructions a warp). ``ds_smem`` (with ``dq_acc``; routed where
    configs.BWD_GLUON_FUSED_DS_SMEM says, none yet: 1.01-1.03x alone non-causal, session 41): dK's wgmma reads dS^T
    as its A operand from the shared buffer the consumer stored it to for dQ, not from registers (the kernel's
    DS_SMEM: a consumer holds no bf16 copy of dS^T across its turn; sm_90a compile, hd 64 128-row non-causal 96 ->
    36 B spilled, elsewhere within +-24 B). ``turns`` False: the two consumers issue their wgmmas without handing
    turns to each other (the kernel's NO_TURNS; the dK / dV kernel's measured in session 42, 1.03-1.09x non-causal,
    0.93-0.99x causal; the fused kernel's from session 42: configs.BWD_GLUON_FUSED_NO_TURNS). ``times`` (probes):
    :func:`timeline_buffer`'s int64 tensor, each consumer's timeline written into it. ``persistent``: the kernel's
    PERSISTENT (one program an SM over the tiles; :func:`dkdv_launch` sizes its grid; not with ``dq_order`` or
    ``last_first``): True (the snake order) or a name of :data:`PERSISTENT_ORDERS`. ``host_desc``: the kernel's
    HOST_DESC, its TMA descriptors made here (:func:`host_descriptor`) instead of by every program (q / k = v head
    dims). ``window_left`` >= 0 (causal, one program a tile, not the fused kernel): a sliding window on the left,
    the kernel's WINDOW. ``softcap`` > 0 (not the fused kernel): the forward's scores were capped, softcap *
    tanh(s * softmax_scale / softcap) (the kernel's SOFTCAP). ``split_sum`` (``split`` > 1, no ``dq_acc``, q / k = v
    head dims): (counters, dK, dV): the kernel sums the partials into the gradients itself (its ``Count``, ``DKsum``,
    ``DVsum``: launcher.counters' zeroed int32 counters, :func:`split_counter_count` of them; the contiguous
    gradients), no sum launch after. ``lse_tma`` (:func:`lse_tma_refused` says what it takes): each query tile's lse
    and delta rows loaded by the loader warp's TMA with its Q and dO tiles (the kernel's LSE_TMA; the fused kernel's
    too)."""
    by_tma = lse_tma_arguments(lse, delta, block_m, "dkdv_arguments") if lse_tma else {}
    if window_left >= 0 and (not causal or persistent or dq_acc is not None):
        raise ValueError("a window (window_left >= 0): causal, one program a tile (persistent=False), the dK / dV "
                         "kernel (no dq_acc)")
    if why := softcap_refused(softcap):
        raise ValueError(f"dkdv_arguments: {why}")
    if softcap and dq_acc is not None:
        raise ValueError("a softcap: the dK / dV kernel (no dq_acc: the fused kernel takes none)")
    g = _DTYPES[q.dtype]
    d = v.shape[-1]
    d_b = q.shape[-1] - d
    if halves is None:
        halves = query_halves(block_m, d_b, dq_acc is not None, causal)
    elif halves and (block_m != 128 or d_b):
        raise ValueError(f"query halves: 128-row tiles with q / k = v head dims, got block_m={block_m}, "
                         f"q / k {q.shape[-1]}, v {d}")
    dk3, dv3 = (dk[0], dv[0]) if split > 1 else (dk, dv)
    second = {} if d_b == 0 else dict(HEAD_DIM_B=d_b, QB_SL=gl.NVMMASharedLayout.get_default_for([1, block_m, 1, d_b], g),
                                      KB_SL=gl.NVMMASharedLayout.get_default_for([1, 64, 1, d_b], g))
    if dq_acc is not None:
        cols = min(d, 64)
        second.update(DQacc=dq_acc, stride_dqab=dq_acc.stride(0), stride_dqas=dq_acc.stride(1),
                      stride_dqah=dq_acc.stride(2), DQ_COLS=cols, DQ_SINK=dq_sink,
                      DS_SL=gl.NVMMASharedLayout.get_default_for([128, block_m], g),
                      DQ_SL=gl.NVMMASharedLayout.get_default_for([1, 64, 1, cols], gl.float32))
        if dq_order is not None:
            second.update(Sem=dq_order)
        elif dq_adder:
            second.update(DQ_ADDER=True)
        if dq_unscaled:
            second.update(DQ_UNSCALED=True)
        if ds_smem:
            second.update(DS_SMEM=True)
    elif dq_unscaled or ds_smem:
        raise ValueError("dq_unscaled / ds_smem: the fused kernel's (dq_acc)")
    if not turns:
        second.update(NO_TURNS=True)
    if times is not None:
        second.update(Times=times)
    if window_left >= 0:
        second.update(WINDOW=True)
    if softcap:
        second.update(SOFTCAP=True, softcap=float(softcap))
    if persistent:
        if dq_order is not None or last_first:
            raise ValueError("persistent: the unordered kernels only (no dq_order, no last_first)")
        if units_first:
            raise ValueError("units_first: one program a tile (not persistent)")
        second.update(PERSISTENT=persistent_order(persistent))
    if units_first:
        if dq_order is not None:  # (the ordered adds' waits follow the launch order: not tested with this one)
            raise ValueError("units_first: the unordered kernels only (no dq_order)")
        second.update(UNITS_FIRST=True)
    second.update(by_tma)
    if split_sum is not None:
        count, dk_sum, dv_sum = split_sum
        if split < 2 or dq_acc is not None or d_b:
            raise ValueError(f"split_sum: a group split (split > 1, got {split}) of the dK / dV kernel (no dq_acc) "
                             f"with q / k = v head dims (got {q.shape[-1]} / {d})")
        if count.dtype != torch.int32 or count.numel() < split_counter_count(k):
            raise ValueError(f"split_sum: at least {split_counter_count(k)} int32 counters, got {count.numel()} "
                             f"{count.dtype}")
        if not all(x.is_contiguous() for x in (dk, dv, dk_sum, dv_sum)) or dk_sum.shape != k.shape or (
                dv_sum.shape != v.shape):
            raise ValueError("split_sum: dK / dV shaped as k / v and the partials, all contiguous")
        second.update(Count=count, DKsum=dk_sum, DVsum=dv_sum)
    q_sl = gl.NVMMASharedLayout.get_default_for([1, block_m, 1, d], g)
    k_sl = gl.NVMMASharedLayout.get_default_for([1, 64, 1, d], g)
    if host_desc:
        dq = {} if dq_acc is None else dict(DQD=(dq_acc, 64, second["DQ_COLS"], second["DQ_SL"]))
        second.update(_host_descriptors(d_b, QD=(q, block_m, d, q_sl), DOD=(do, block_m, d, q_sl),
                                        KD=(k, 64, d, k_sl), VD=(v, 64, d, k_sl), **dq))
    return dict(Q=q, K=k, V=v, DO=do, Lse=lse, Delta=delta, DK=dk, DV=dv, stride_qb=q.stride(0),
                stride_qs=q.stride(1), stride_qh=q.stride(2), stride_kb=k.stride(0), stride_ks=k.stride(1),
                stride_kh=k.stride(2), stride_vb=v.stride(0), stride_vs=v.stride(1), stride_vh=v.stride(2),
                stride_dob=do.stride(0), stride_dos=do.stride(1), stride_doh=do.stride(2), stride_dkb=dk3.stride(0),
                stride_dks=dk3.stride(1), stride_dkh=dk3.stride(2), stride_dvb=dv3.stride(0), stride_dvs=dv3.stride(1),
                stride_dvh=dv3.stride(2), stride_lb=lse.stride(0), stride_lh=lse.stride(1), stride_db=delta.stride(0),
                stride_dh=delta.stride(1), stride_dkp=dk.stride(0) if split > 1 else 0,
                stride_dvp=dv.stride(0) if split > 1 else 0, group_split=split, batch=q.shape[0],
                seqlen_q=q.shape[1], seqlen_k=k.shape[1], num_heads=q.shape[2], group=q.shape[2] // k.shape[2],
                sm_scale=float(softmax_scale), HEAD_DIM=d, BLOCK_M=block_m, IS_CAUSAL=bool(causal),
                NUM_STAGES=num_stages, CONSUMER_REGS=consumer_regs, Q_SL=q_sl, K_SL=k_sl, num_warps=4,
                LAST_FIRST=bool(last_first), WALK=int(walk), QUERY_HALVES=bool(halves),
                MASK_EVERY_TILE=bool(mask_every_tile and causal), window_left=window_argument(window_left, q, k),
                **second)


def lse_tma_arguments(lse, delta, rows: int, caller: str) -> dict:
    """A dK / dV kernel's LSE_TMA arguments (its [1, 1, ``rows``] fp32 ring layout ``L_SL``); ValueError, named after
    ``caller``, where :func:`lse_tma_refused` refuses lse / delta."""
    if why := lse_tma_refused(lse, delta):
        raise ValueError(f"{caller}: lse_tma: {why}")
    return dict(LSE_TMA=True, L_SL=gl.NVMMASharedLayout.get_default_for([1, 1, rows], gl.float32))


def lse_tma_refused(lse, delta) -> str | None:
    """Why lse and delta cannot come by TMA (:func:`dkdv_arguments`' ``lse_tma``), or None: both fp32 [batch, heads,
    seqlen_q] with the sequence contiguous and their other strides and addresses on 16 bytes (a TMA descriptor's
    rule: seqlen_q a multiple of 4 for a contiguous lse)."""
    for name, t in (("lse", lse), ("delta", delta)):
        if t.dtype != torch.float32 or t.dim() != 3 or t.stride(-1) != 1:
            return f"{name}: fp32 [batch, heads, seqlen_q] with the sequence contiguous"
        if t.stride(0) % 4 or t.stride(1) % 4 or t.data_ptr() % 16:
            return f"{name}: strides and address on 16 bytes (strides {tuple(t.stride())})"
    return None


def query_halves(block_m: int, d_b: int, fused: bool, causal: bool) -> bool:
    """Whether 128-row tiles split S^T and dP^T into 64-query halves by default: where it spilled less in the sm_90a
    compile (session 38, hd 64): the fused kernel 232 -> 96 B non-causal, 660 -> 208 B causal; the dK / dV kernel
    causal 440 -> 384 B; not the dK / dV kernel non-causal (12 -> 76 B; its routed config)."""
    return block_m == 128 and d_b == 0 and (fused or bool(causal))


def dkdv_launch(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, split=1, block_m=64, num_stages=2,
                consumer_regs=240, dq_acc=None, dq_sink=0, dq_order=None, last_first=False, dq_adder=False,
                walk=0, halves=None, mask_every_tile=False, dq_unscaled=False, ds_smem=False, turns=True,
                times=None, persistent=False, host_desc=False, window_left=-1, softcap=0.0, split_sum=None,
                lse_tma=False, units_first=False):
    """Launch the kernel into ``dk`` / ``dv`` (the gradients, or with ``split`` > 1 the group split's fp32
    partials; inputs checked by the caller: :func:`unsupported`, an sm90 GPU; with ``dq_acc`` dQ added into it,
    :func:`fused_unsupported` too); returns its :class:`kernels.launcher.Launch` (slots Q, K, V, DO, Lse, Delta,
    DK, DV, DQacc: the Triton dK / dV kernel's names, so the backward's replay fills either; Sem with
    ``dq_order``; Count, DKsum, DVsum with ``split_sum``). ``persistent``: min(tiles, the GPU's multiprocessors)
    programs (:func:`dkdv_grid`); ``units_first``: :func:`dkdv_grid`'s."""
    launcher.ensure_allocator()
    kwargs = dkdv_arguments(q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, block_m, num_stages,
                            consumer_regs, split, dq_acc, dq_sink, dq_order, last_first, dq_adder, walk, halves,
                            mask_every_tile, dq_unscaled, ds_smem, turns, times, persistent, host_desc,
                            window_left, softcap, split_sum, lse_tma, units_first)
    grid = dkdv_grid(k, split, configs.sm_count(k.get_device()) if persistent else None, units_first)
    return launcher.launched(_bwd_dkdv_ws_kernel, _bwd_dkdv_ws_kernel[grid](**kwargs), grid, kwargs,
                             descriptors=HOST_DESCRIPTOR_OF)


def dkdv_grid(k, split: int = 1, programs: int | None = None, units_first: bool = False) -> tuple[int, int]:
    """The dK / dV kernel's grid over ``k`` [B, Sk, Hk, D]: one program a tile (key blocks x (batch, kv head, group
    part); ``units_first``: the units first, the key blocks second, so that the GPU starts every unit's first key
    block before any unit's second: the kernel's UNITS_FIRST), or with ``programs`` (the persistent kernel: the GPU's
    multiprocessors, one program each) at most that many in one dimension, each walking tiles t, t + grid, ...
    (:func:`_persistent_tile`)."""
    blocks, units = triton.cdiv(k.shape[1], BLOCK_N), k.shape[0] * k.shape[2] * split
    if programs is not None:
        return max(1, min(blocks * units, programs)), 1
    return (units, blocks) if units_first else (blocks, units)


def split_counter_count(k) -> int:
    """How many counters the kernel's in-kernel group-split sum (``split_sum``) counts in for ``k`` [B, Sk, Hk, D]:
    one a (batch, kv head, 16 key rows of each 128-key block)."""
    return k.shape[0] * k.shape[2] * triton.cdiv(k.shape[1], BLOCK_N) * (BLOCK_N // 16)


def order_counters(q, block_m=64) -> torch.Tensor:
    """The deterministic fused backward's add counters for ``q`` [B, Sq, Hq, D], zeroed, int32: a spare one (the
    adder's "previous tile" before its first), then [B, Hq, ceil(Sq / block_m)] flat (one per query tile)."""
    return torch.zeros(1 + q.shape[0] * q.shape[2] * triton.cdiv(q.shape[1], block_m), device=q.device,
                       dtype=torch.int32)


def dkdv_gluon(q, k, v, do, lse, delta, *, softmax_scale, causal, block_m=64, num_stages=2, consumer_regs=240,
               poison=False, launches=None, fused=False, dq_sink=0, ordered=False, last_first=None, adder=False,
               walk=0, halves=None, mask_every_tile=False, dq_unscaled=False, ds_smem=False, turns=True, times=None,
               persistent=False, host_desc=False, window_left=-1, softcap=0.0, lse_tma=False, units_first=False):
    """(dK, dV) in k's / v's layout and dtype from q, k, v, dO [B, S, H, D] (GQA when Hq > Hk; causal bottom-right
    aligned), the forward's lse and delta = rowsum(dO * O) ([B, Hq, Sq] fp32), with the warp-specialised kernel.
    sm90 GPUs only. ``launches``: a dict this call replays its launch from, or leaves it in (kernels/launcher.py).
    ``poison``: NaN-fill dK and dV first. ``fused``: the fused backward's kernel, (dK, dV, dQ) with dQ fp32 (added
    into a zeroed buffer: not poisoned; ``dq_sink``: :func:`dkdv_arguments`', probes only). ``ordered`` (fused; not
    routed yet): each dQ tile's adds in a fixed order, dQ bitwise the same on every run.
    ``last_first``: the key blocks launched last first (None: the ordered kernel's order, else no; forced either way
    by probes). The ordered kernel launched last first only ever waits on programs dispatched before it, so it
    cannot deadlock however few SMs it gets (another stream's kernels, NCCL's, an MPS share). First first (the
    longest programs first: 3-4% faster at hd 128 4k, session 36) waits on programs not dispatched yet: safe only
    while all of a (batch, head)'s key blocks fit on the SMs it has, which a kernel cannot know; probes only.
    ``adder`` (fused, unordered): dQ's partials added by an adder warp instead of by the consumers (the ordered
    kernel's structure without its turns). ``walk``: how each program walks its (head, tile)
    steps (:func:`_walk_bounds`; 2, lockstep, not with ``ordered``). ``halves``, ``mask_every_tile``,
    ``dq_unscaled`` (dQ returned without the softmax scale), ``ds_smem``, ``turns``: :func:`dkdv_arguments`'.
    ``times`` (probes; with ``launches`` None): :func:`timeline_buffer`'s tensor, the programs' timelines written into
    it (:func:`timeline_record` reads them; persistent: one record a tile). ``persistent`` (not with ``ordered``):
    one program an SM over the tiles (the kernel's PERSISTENT), True in the snake order or a name of
    :data:`PERSISTENT_ORDERS` (:func:`_persistent_tile`). ``host_desc``: the TMA descriptors made on the host
    (:func:`dkdv_arguments`'; a replay describes its own call's tensors). ``window_left`` >= 0 (causal, not fused,
    not persistent): query i sees keys i + Sk - Sq - window_left .. i + Sk - Sq. ``softcap`` > 0 (not fused): the
    forward's scores were capped (:func:`dkdv_arguments`'). ``lse_tma``: lse and delta by the loader's TMA
    (:func:`dkdv_arguments`'). ``units_first``: the grid's units before its key blocks (:func:`dkdv_grid`'s)."""
    if persistent and ordered:
        raise ValueError("dkdv_gluon: persistent runs the unordered adds only (ordered=False)")
    if times is not None and launches is not None:
        raise ValueError("dkdv_gluon: times is a launch's own buffer, not a replay slot (launches=None)")
    why = fused_unsupported(q, k, v, do, lse, delta, block_m) if fused else unsupported(q, k, v, do, lse, delta)
    if ordered and not why:
        why = ordered_unsupported(fused, dq_sink, walk == 2, block_m)
    _check_call("dkdv_gluon", why, num_stages, q)
    dk, dv = _outputs(poison, torch.empty_like(k), torch.empty_like(v))
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if fused else None
    sem = order_counters(q, block_m) if ordered else None
    if last_first is None:
        last_first = ordered
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Lse": lse, "Delta": delta, "DK": dk, "DV": dv, "DQacc": dq,
               "Sem": sem}
    _replay_or_launch(launches, "dkdv", tensors, lambda: dkdv_launch(
        q, k, v, do, lse, delta, dk, dv, softmax_scale, causal, 1, block_m, num_stages, consumer_regs, dq, dq_sink,
        sem, last_first, adder, walk, halves, mask_every_tile, dq_unscaled, ds_smem, turns, times, persistent,
        host_desc, window_left, softcap, lse_tma=lse_tma, units_first=units_first))
    return (dk, dv, dq) if fused else (dk, dv)


def timeline_buffer(k, split: int = 1) -> torch.Tensor:
    """The int64 buffer a dK / dV launch over ``k`` [B, Sk, Hk, D] writes its consumers' timelines into (``times``):
    :data:`TIMELINE_FIELDS` for each of a program's two consumers, every program of the grid, filled with -1 (a
    record a program did not write stays -1)."""
    programs = triton.cdiv(k.shape[1], BLOCK_N) * k.shape[0] * k.shape[2] * split
    return torch.full((programs * 2 * len(TIMELINE_FIELDS), ), -1, device=k.device, dtype=torch.int64)


def timeline_record(times: torch.Tensor) -> dict:
    """:func:`timeline_buffer`'s tensor after a launch -> {field: int64 tensor [programs, 2 consumers]} on the CPU
    (:data:`TIMELINE_FIELDS`: the SM's cycle counter at the consumer's start, once its K / V tiles landed, after its
    last query tile (dQ's last reduce read), after its dK / dV stores; the GPU's nanosecond timer at its start and
    end; the SM it ran on; the query tiles it consumed; the program's entry, before its descriptors, and the moment
    its Q / dO / K / V descriptors were made: both -1 in a persistent program's later tiles). ValueError if a record
    is missing (a program not run)."""
    n = len(TIMELINE_FIELDS)
    rec = times.detach().cpu().view(-1, 2, n)
    if bool((rec[:, :, :-2] == -1).any()):
        raise ValueError("timeline_record: a program left its record unwritten")
    return {name: rec[:, :, i] for i, name in enumerate(TIMELINE_FIELDS)}


#: head dims (q / k = v) the fused backward's kernel takes (64-row query tiles; MLA's two head-dim parts not built)
FUSED_HEAD_DIMS = (64, 128)
#: ... and their query tiles' rows (dQ's partials are 64 rows: hd 64's 128-row tiles give each consumer a row half)
FUSED_BLOCK_M = {64: (64, 128), 128: (64, )}


def fused_unsupported(q, k, v, do, lse, delta, block_m=64) -> str | None:
    """Why the fused backward's kernel (dK / dV with dQ by TMA reduce) cannot run these inputs, or None:
    :func:`unsupported`'s reasons, then its head dims and tile."""
    why = unsupported(q, k, v, do, lse, delta)
    if why:
        return why
    if q.shape[-1] != v.shape[-1] or q.shape[-1] not in FUSED_HEAD_DIMS:
        return f"the fused backward takes q / k = v head dims in {FUSED_HEAD_DIMS}, got {q.shape[-1]} / {v.shape[-1]}"
    if block_m not in FUSED_BLOCK_M.get(q.shape[-1], ()):
        rows = " or ".join(f"{m}-row" for m in FUSED_BLOCK_M[q.shape[-1]])
        return f"the fused backward runs {rows} query tiles at hd {q.shape[-1]}, got block_m={block_m}"
    return None


def ordered_unsupported(fused: bool, dq_sink: int = 0, lockstep: bool = False, block_m: int = 64) -> str | None:
    """Why the ordered (deterministic) dQ adds cannot run, or None: they are the fused kernel's, adding every
    partial, each head's tiles walked from the diagonal, 64-row tiles (hd 64's 128-row ones not tested ordered)."""
    if not fused:
        return "ordered dQ adds: only the fused backward adds dQ (fused=True)"
    if block_m != 64:
        return f"ordered dQ adds: 64-row query tiles, got block_m={block_m}"
    if dq_sink:
        return "ordered dQ adds: every partial is added (no dq_sink)"
    if lockstep:
        return "ordered dQ adds: each head's tiles walked from the diagonal (no lockstep)"
    return None


def _check_call(name: str, why: str | None, num_stages: int, q) -> None:
    """What a direct call of a kernel cannot run, raised: its inputs (``why``), too few stages, no sm90 GPU."""
    if why:
        raise ValueError(f"{name}: {why}")
    if num_stages < 2:
        raise ValueError(f"{name}: num_stages must be at least 2")
    if not (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9):
        raise RuntimeError(f"{name}: needs an sm90 GPU (Hopper's wgmma and TMA; Gluon has no interpreter)")


def _outputs(poison: bool, *outs):
    """``outs``, NaN-filled with ``poison``."""
    for t in outs if poison else ():
        t.fill_(float("nan"))
    return outs


def _replay_or_launch(launches, key: str, tensors: dict, launch) -> None:
    """Replay ``launches[key]`` with ``tensors``, or call ``launch()`` and keep the Launch it returns there."""
    replay = launches.get(key) if launches is not None else None
    if replay is not None and replay(tensors):
        return
    made = launch()
    if launches is not None and made is not None:
        launches[key] = made


def dq_arguments(q, k, v, do, out, lse, delta, dq, softmax_scale, causal, block_n=64, num_stages=3,
                 consumer_regs=240, persistent=False, host_desc=False, window_left=-1, softcap=0.0,
                 units_first=False) -> dict:
    """Every argument of ``_bwd_dq_ws_kernel`` by name (``delta`` in lse's layout: the kernel writes it with lse's
    strides, as the Triton dQ kernel does). q / k wider than v (MLA): as :func:`dkdv_arguments`. ``persistent``:
    the kernel's PERSISTENT (one program an SM over the tiles; :func:`dq_launch` sizes its grid). ``host_desc``: as
    :func:`dkdv_arguments`'. ``window_left`` >= 0 (causal, not persistent): a sliding window on the left, the
    kernel's WINDOW. ``softcap`` > 0: the forward's scores were capped, softcap * tanh(s * softmax_scale / softcap)
    (the kernel's SOFTCAP). ``units_first`` (one program a tile): the kernel's UNITS_FIRST, for :func:`dq_grid`'s
    grid of the same name."""
    if window_left >= 0 and (not causal or persistent):
        raise ValueError("a window (window_left >= 0): causal, one program a tile (persistent=False)")
    if why := softcap_refused(softcap):
        raise ValueError(f"dq_arguments: {why}")
    if units_first and persistent:
        raise ValueError("units_first: one program a tile (not persistent)")
    g = _DTYPES[q.dtype]
    d = v.shape[-1]
    d_b = q.shape[-1] - d
    second = {} if d_b == 0 else dict(HEAD_DIM_B=d_b, QB_SL=gl.NVMMASharedLayout.get_default_for([1, 64, 1, d_b], g),
                                      KB_SL=gl.NVMMASharedLayout.get_default_for([1, block_n, 1, d_b], g))
    if persistent:
        second.update(PERSISTENT=persistent_order(persistent))
    if window_left >= 0:
        second.update(WINDOW=True)
    if softcap:
        second.update(SOFTCAP=True, softcap=float(softcap))
    if units_first:
        second.update(UNITS_FIRST=True)
    q_sl = gl.NVMMASharedLayout.get_default_for([1, 64, 1, d], g)
    k_sl = gl.NVMMASharedLayout.get_default_for([1, block_n, 1, d], g)
    if host_desc:
        second.update(_host_descriptors(d_b, QD=(q, 64, d, q_sl), DOD=(do, 64, d, q_sl), KD=(k, block_n, d, k_sl),
                                        VD=(v, block_n, d, k_sl)))
    return dict(Q=q, K=k, V=v, DO=do, Out=out, Lse=lse, Delta=delta, DQ=dq, stride_qb=q.stride(0),
                stride_qs=q.stride(1), stride_qh=q.stride(2), stride_kb=k.stride(0), stride_ks=k.stride(1),
                stride_kh=k.stride(2), stride_vb=v.stride(0), stride_vs=v.stride(1), stride_vh=v.stride(2),
                stride_dob=do.stride(0), stride_dos=do.stride(1), stride_doh=do.stride(2), stride_ob=out.stride(0),
                stride_os=out.stride(1), stride_oh=out.stride(2), stride_dqb=dq.stride(0), stride_dqs=dq.stride(1),
                stride_dqh=dq.stride(2), stride_lb=lse.stride(0), stride_lh=lse.stride(1), batch=q.shape[0],
                seqlen_q=q.shape[1], seqlen_k=k.shape[1], num_heads=q.shape[2], group=q.shape[2] // k.shape[2],
                sm_scale=float(softmax_scale), HEAD_DIM=d, BLOCK_N=block_n, IS_CAUSAL=bool(causal),
                NUM_STAGES=num_stages, CONSUMER_REGS=consumer_regs, Q_SL=q_sl, K_SL=k_sl, num_warps=4,
                window_left=window_argument(window_left, q, k), **second)


def dq_launch(q, k, v, do, out, lse, delta, dq, softmax_scale, causal, block_n=64, num_stages=3, consumer_regs=240,
              persistent=False, host_desc=False, window_left=-1, softcap=0.0, units_first=False):
    """Launch the dQ kernel into ``dq`` (and delta into ``delta``, lse's shape and strides; inputs checked by the
    caller: :func:`unsupported` with out as dO's twin, an sm90 GPU); returns its :class:`kernels.launcher.Launch`
    (slots Q, K, V, DO, Out, Lse, Delta, DQ: the Triton dQ kernel's names). ``persistent``: min(tiles, the GPU's
    multiprocessors) programs (:func:`dq_grid`); ``softcap``, ``units_first``: :func:`dq_arguments`'."""
    launcher.ensure_allocator()
    kwargs = dq_arguments(q, k, v, do, out, lse, delta, dq, softmax_scale, causal, block_n, num_stages, consumer_regs,
                          persistent, host_desc, window_left, softcap, units_first)
    grid = dq_grid(q, configs.sm_count(q.get_device()) if persistent else None, units_first)
    return launcher.launched(_bwd_dq_ws_kernel, _bwd_dq_ws_kernel[grid](**kwargs), grid, kwargs,
                             descriptors=HOST_DESCRIPTOR_OF)


def dq_grid(q, programs: int | None = None, units_first: bool = False) -> tuple[int, int]:
    """The dQ kernel's grid over ``q`` [B, Sq, Hq, D]: one program a tile (query blocks of 128 rows x (batch, query
    head); ``units_first``: the (batch, query head) units first, the query blocks second: the kernel's UNITS_FIRST,
    which walks them last first), or with ``programs`` (the persistent kernel) at most that many in one dimension,
    each walking tiles t, t + grid, ... (``_dq_tile_coords``)."""
    blocks, units = triton.cdiv(q.shape[1], 128), q.shape[0] * q.shape[2]
    if programs is not None:
        return max(1, min(blocks * units, programs)), 1
    return (units, blocks) if units_first else (blocks, units)


def dq_gluon(q, k, v, do, out, lse, *, softmax_scale, causal, block_n=64, num_stages=3, consumer_regs=240,
             poison=False, launches=None, persistent=False, host_desc=False, window_left=-1, softcap=0.0,
             units_first=False):
    """(dQ in q's layout and dtype, delta = rowsum(dO * O) [B, Hq, Sq] fp32) with the warp-specialised dQ kernel,
    from q, k, v, dO, the forward's out and lse. sm90 GPUs only. ``launches`` / ``poison`` as :func:`dkdv_gluon`'s;
    ``persistent``: one program an SM over the tiles (the kernel's PERSISTENT; True or a name of
    :data:`PERSISTENT_ORDERS`); ``host_desc``, ``window_left``: :func:`dkdv_gluon`'s; ``softcap``: the forward's
    cap (:func:`dq_arguments`); ``units_first``: :func:`dq_grid`'s."""
    _check_call("dq_gluon", unsupported(q, k, v, do, lse, lse, "dq") or unsupported(q, k, v, out, lse, lse, "dq"),
                num_stages, q)
    dq, delta = _outputs(poison, torch.empty_like(q), torch.empty_like(lse))
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Out": out, "Lse": lse, "Delta": delta, "DQ": dq}
    _replay_or_launch(launches, "dq", tensors, lambda: dq_launch(
        q, k, v, do, out, lse, delta, dq, softmax_scale, causal, block_n, num_stages, consumer_regs, persistent,
        host_desc, window_left, softcap, units_first))
    return dq, delta
