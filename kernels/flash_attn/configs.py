"""Autotune config space for the flash-attention kernels, and the pruning filters.

Every number here has its reason beside it. The autotuner key of each kernel is
(HEAD_DIM, IS_CAUSAL, SEQ_BUCKET, FILL_BUCKET, ARCH) plus the dtypes of the tensor arguments (Triton appends those
itself), so the chosen config is cached per (head dim, dtype, causal, arch, seqlen bucket, fill bucket) for
the life of the process.
"""

from __future__ import annotations

import functools
import os

import torch
import triton

from .. import launcher

# The interpreter (TRITON_INTERPRET=1, CPU) runs every program serially in numpy: autotuning there
# would only multiply the runtime, so it uses one small config. 16 is the smallest tile tl.dot takes.
INTERPRET_BLOCK_M = 16
INTERPRET_BLOCK_N = 16
# The interpreter runs tensor descriptors too (zero fill and clipping included); tests flip this to
# check the TMA code path on the CPU.
INTERPRET_USE_TMA = False

# Shared memory a Hopper block may use (227 KiB opt-in). Read off the device when there is one.
H100_SMEM_BYTES = 232448
# Triton's own buffers (barriers, layout conversions, the reduction scratch) come on top of the
# tiles we count; keep this much headroom so a config we keep never hits OutOfResources.
SMEM_HEADROOM_BYTES = 16 * 1024

# Head dims the kernels take: tl.arange needs a power of two, so the tile is padded to BLOCK_D and
# the tail masked (or q / k's head dim split in two power-of-two parts: block_db); tl.dot needs K >= 16. 256 is the largest flash-attn supports, and its fp32
# backward tiles are the largest we have checked still fit in 227 KiB.
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8

# Autotune timing per config, in ms: enough for a stable median on shapes that fill the GPU,
# short enough that tuning a whole benchmark sweep takes seconds, not minutes.
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 25


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def patch_interpreter_scalar_index() -> None:
    """Triton 3.6's interpreter converts a scalar tensor to a Python int with int(ndarray) on a
    1-element 1-D array, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted"),
    so any loop with run-time bounds fails under TRITON_INTERPRET=1. Wrap its tensor patcher so
    __index__ reads the single element. Interpreter only; compiled kernels are untouched."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_flash_attn_index_patched", False):
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._flash_attn_index_patched = True


if interpreting():
    patch_interpreter_scalar_index()


def block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


# Head-dim split (issue 16): q / k head dims that are not a power of two are cut into two
# power-of-two parts instead of being padded. Tests and A/B compiles turn it off to get the padded
# kernels back; power-of-two head dims never split.
HEAD_DIM_SPLIT = True


def block_db(head_dim: int, elt: int = 2) -> int:
    """Width of the second part of a split q / k head dim, or 0: not split (BLOCK_DB, a constexpr).

    A head dim that is not a power of two pads to ``block_d`` = 2P columns, P the largest power of
    two below it. Split, the first part is those P columns (all real: no mask, no waste) and the
    second the remaining d - P padded to a power of two, at least the smallest dot depth (16; 32 for
    1-byte FP8, whose MMA is 32 deep): 192 = 128 + 64, 96 = 64 + 32, 160 = 128 + 32, 80 = 64 + 16,
    40 = 32 + 8 (padded to 16). Q K^T is then two dots summed, and the Q / K tiles, their shared
    memory and the dK / dQ accumulators shrink from 2P to P + BLOCK_DB columns (192: 256 -> 192).
    Only when that is narrower than 2P, i.e. d - P <= P / 2: 224 = 128 + 96 would pad its second
    part to 128, the padded width again, so 224 (and 56, 104-120, 200-248) stay padded. A third part
    (224 = 128 + 64 + 32) would save 32 of 256 columns for a third dot, descriptor and accumulator
    on every tile: not taken; 192 (MLA's training form) and 96 are the head dims in use.
    """
    full = block_d(head_dim)
    if not HEAD_DIM_SPLIT or full == head_dim:
        return 0
    first = full // 2
    if head_dim <= first:  # below the smallest tile (d = 8 in a 16-wide one): nothing to split
        return 0
    second = max(32 if elt == 1 else 16, triton.next_power_of_2(head_dim - first))
    return second if second < first else 0


def qk_width(args) -> int:
    """Columns of a q / k tile of a launch: the padded head dim, or the split's two parts."""
    db = args.get("BLOCK_DB", 0)
    return args["BLOCK_D"] // 2 + db if db else args["BLOCK_D"]


def seq_bucket(seqlen_q: int, seqlen_k: int) -> int:
    """Coarse seqlen class for the autotune key: short sequences want smaller tiles (more programs
    to fill 132 SMs), long ones the largest tile that fits. 0: <= 1k, 1: <= 4k, 2: longer."""
    s = max(seqlen_q, seqlen_k)
    return 0 if s <= 1024 else (1 if s <= 4096 else 2)


#: An H100's (and H200's) multiprocessors: where a route reasons about waves of programs without a GPU at hand
H100_SMS = 132
# Query rows (batch x heads x seqlen) that one 128-row program per SM covers on an H100: the
# fill bucket's unit. Below it the grid leaves SMs idle and small tiles win; far above it the
# largest tile that fits wins.
FILL_UNIT_ROWS = H100_SMS * 128


def fill_bucket(rows: int) -> int:
    """Coarse size class of the whole launch for the autotune key: 0 when the grid cannot fill the
    GPU once, 1 up to 4 waves, 2 beyond. Without it the first shape that reaches a (head dim,
    seqlen bucket) key decides the tile for all later ones: a one-head check at seqlen 16k tuned
    for 16 programs then ran a 256-program benchmark of the same seqlen with its tile."""
    return 0 if rows < FILL_UNIT_ROWS else (1 if rows < 4 * FILL_UNIT_ROWS else 2)


@functools.cache
def sm_count(device_index: int) -> int:
    """Multiprocessors of a CUDA device (asked once: launch paths size their grids from it)."""
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def tensor_sm_count(t) -> int:
    """:func:`sm_count` of the CUDA device tensor ``t`` lives on (the current device where its index is unset)."""
    return sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device())


def route_sm_count(t) -> int:
    """The SM count a route's models assume for a call on ``t``: its device's, or the H100's for a CPU tensor (the
    routes' CPU tests pass CPU tensors as if on an sm90 GPU)."""
    return tensor_sm_count(t) if t.is_cuda else H100_SMS


@functools.cache
def device_smem_bytes(device_index: int) -> int:
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(device_index)
        return int(props["max_shared_mem"])
    except Exception:  # noqa: BLE001 - no driver (CPU): the kernels do not use this path there
        return H100_SMEM_BYTES


def _elt(args) -> int:
    q = args["Q"]
    return q.element_size()


def _smem_fwd(cfg, head_dim_padded: int, elt: int, width_v: int | None = None) -> int:
    """Bytes of the forward's tiles: q / k at ``head_dim_padded`` columns, v at ``width_v`` (default the same)."""
    bm, bn, st = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_stages
    wv = head_dim_padded if width_v is None else width_v
    # Q tile once, K and V tiles per pipeline stage. Two query blocks per program (TILES = 2): up to two
    # more Q-sized buffers (sm_90a compiles, session 15: FP8 hd 64 64x128 +8704 B, FP8 hd 128 64x128
    # +16384 B, bf16 hd 64 128x64 +16384 B over one block).
    q_tiles = 1 if cfg.kwargs.get("TILES", 1) == 1 else 3
    return q_tiles * bm * head_dim_padded * elt + max(st, 1) * bn * (head_dim_padded + wv) * elt


def _smem_bwd(cfg, head_dim_padded: int, elt: int, width_v: int | None = None) -> int:
    """Bytes of a backward kernel's tiles: q / k at ``head_dim_padded`` columns, v / dO at ``width_v``."""
    bm, bn, st = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_stages
    wv = head_dim_padded if width_v is None else width_v
    # The resident tiles (K,V for dK/dV; Q,dO for dQ) plus the streamed pair per stage, plus the
    # P / dS tile staged through shared memory for the second operand of a dot.
    resident = max(bm, bn) * (head_dim_padded + wv) * elt
    streamed = max(st, 1) * max(bm, bn) * (head_dim_padded + wv) * elt
    return resident + streamed + bm * bn * elt


def smem_estimate(cfg, smem_fn, args) -> int:
    """The filter's shared-memory bound of a config: its tiles plus the headroom. A split head dim
    (BLOCK_DB > 0) costs each operand at its real width: q / k at the two parts (``qk_width``, 192 not
    256), v / dO at the value dim's. Otherwise as before: d_v != d sizes every operand at the wider of
    the two (conservative; costing v at its own width would let one more dQ tile into the hd 64 / v 128
    list, 128x64 on 8 warps and 3 stages, 122880 B compiled: left as it was)."""
    elt = _elt(args)
    if smem_fn is _smem_bwd and args.get("IS_FP8"):
        # the FP8 backward reads each streamed operand twice, as given and sequence-contiguous (Q, Q^T, dO,
        # dO^T; K, K^T, V): as many bytes as one 16-bit tile (sm_90a, hd 128, dK/dV 64x64 on 8 warps: 82944 B
        # compiled against 69632 counted at one byte)
        elt = 2
    if args.get("BLOCK_DB"):
        return smem_fn(cfg, qk_width(args), elt, args["BLOCK_DV"]) + SMEM_HEADROOM_BYTES
    width = max(args["BLOCK_D"], args.get("BLOCK_DV", 0))
    return smem_fn(cfg, width, elt) + SMEM_HEADROOM_BYTES


def _fits(cfg, smem_fn, args) -> bool:
    q = args["Q"]
    limit = device_smem_bytes(q.device.index or 0) if q.is_cuda else H100_SMEM_BYTES
    return smem_estimate(cfg, smem_fn, args) <= limit


def _cfg(bm, bn, w, s, tma=False, tiles=None):
    """A config; ``tiles``: the forward's query blocks per program (TILES), forward configs only."""
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "USE_TMA": tma}
    if tiles is not None:
        kw["TILES"] = tiles
    return triton.Config(kw, num_warps=w, num_stages=s)


# Full spaces; the filters below cut each to a handful per key so a sweep tunes in seconds.
FWD_SPACE = [_cfg(bm, bn, w, s, t, n) for bm in (32, 64, 128) for bn in (32, 64, 128) for w in (4, 8)
             for s in (1, 2, 3, 4) for t in (False, True) for n in (1, 2)]
BWD_SPACE = [_cfg(bm, bn, w, s, t) for bm in (16, 32, 64, 128) for bn in (16, 32, 64, 128) for w in (4, 8)
             for s in (1, 2, 3) for t in (False, True)]


def _merged(named_args, kwargs):
    return {**named_args, **kwargs}


def _tma_ok(args) -> bool:
    """TMA (tensor descriptors) needs sm90+, 16-byte aligned bases and 16-byte multiple strides for
    every tensor it touches; anything else (odd views) falls back to pointer loads."""
    if interpreting() or args.get("ARCH", 0) < 90:
        return False
    elt = _elt(args)
    for name in ("Q", "K", "V", "Out", "DO", "DK", "DV", "DQ"):
        t = args.get(name)
        if t is not None and t.data_ptr() % 16:
            return False
    for name, val in args.items():  # cheapest tests first: this runs on every pinned-config launch
        if (type(val) is int and (val * elt) % 16 and name[:7] == "stride_"
                and not name.startswith(_NOT_TMA_STRIDES)):
            return False
    return True


#: Strides of tensors no tensor descriptor reads (lse, dq's fp32 accumulator, the FP8 descales: scalar
#: or row loads). The descales' batch stride is heads_k: an FP8 case with 8 kv heads (hd 256 x 8 heads
#: on the FA sweep, Llama-style GQA) lost TMA, and with it every tile of the FP8 list (session 11).
_NOT_TMA_STRIDES = ("stride_l", "stride_dqa", "stride_dsb")


def _select(configs, keep, smem_fn, args):
    """The configs named in `keep` (ordered by preference, first = the untuned default) that fit.
    keep entries: (BLOCK_M, BLOCK_N, num_warps, num_stages, use_tma[, tiles[, maxnreg]]). Where TMA is
    refused and no pointer-load entry is listed (the FP8 list is all TMA), the same tiles with pointer loads."""
    by_key = _by_key(configs)
    tma_ok = _tma_ok(args)
    keys = [_key7(k) for k in keep]
    out = _listed(by_key, [k for k in keys if tma_ok or not k[4]], smem_fn, args)
    if not out and not tma_ok:
        out = _listed(by_key, [k[:4] + (False,) + k[5:] for k in keys], smem_fn, args)
    return out


def _key6(k) -> tuple:
    """A keep entry as (BLOCK_M, BLOCK_N, warps, stages, use_tma, tiles): TMA off and one tile unless named."""
    k = tuple(k)
    return k[:5] + (False,) * (5 - len(k[:5])) + (k[5] if len(k) > 5 else 1,)


def _key7(k) -> tuple:
    """_key6 and the entry's register cap (ptxas's maxnreg; None: none)."""
    return _key6(k) + (k[6] if len(k) > 6 else None,)


#: (the uncapped config's id, cap) -> (that config, the capped one), made once per config and cap
_CAPPED: dict[tuple[int, int], tuple] = {}


def _capped(c, cap: int | None):
    """``c`` under a register cap (the same object when there is none)."""
    if not cap:
        return c
    hit = _CAPPED.get((id(c), cap))
    if hit is None or hit[0] is not c:
        hit = _CAPPED[(id(c), cap)] = (c, triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages,
                                                        maxnreg=cap))
    return hit[1]


def _listed(by_key, keys, smem_fn, args):
    out, seen = [], set()
    for k in keys:
        c = by_key.get(k[:6])
        if c is not None and (id(c), k[6]) not in seen and _fits(c, smem_fn, args):
            out.append(_capped(c, k[6]))
            seen.add((id(c), k[6]))
    return out


_BY_KEY: dict[int, tuple[list, dict]] = {}


def _by_key(configs: list) -> dict:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA, TILES) -> config, built once per config list (the
    pinned-config launch path prunes on every call: rebuilding it was most of that call's host time).
    Keyed by the list's identity, which the entry keeps alive."""
    hit = _BY_KEY.get(id(configs))
    if hit is None or hit[0] is not configs:
        hit = (configs, {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.kwargs["USE_TMA"],
                          c.kwargs.get("TILES", 1)): c for c in configs})
        _BY_KEY[id(configs)] = hit
    return hit[1]


T, P = True, False  # USE_TMA: tensor-descriptor (TMA) loads, or pointer loads


# FP8 forward tiles, measured (session 13, H100, `benchmarks/fp8_configs.py --seqlen 4096`: FA sweep
# shapes, each config alone, V copied K-major; TFLOP/s, the bf16 forward's pinned pick in the same run
# in brackets): fastest first, so pinned runs (the GPU tests) take it too.
# - hd 64 [420-428]: 64x128 on 4 warps 463-466 (3 or 4 stages), 128x128 on 4 warps 454, 64x64 435;
#   the bf16 pick 128x64 on 8 warps 399-403, 128x128 on 8 warps 348-356. 4 warps win everywhere
#   (our reading, not measured: one warpgroup per program and 2-3 programs per SM, so one program's
#   softmax runs while another's MMAs do).
# - hd 128 [458-473]: 64x128 and 128x128 on 4 warps 596, 64x64 on 4 warps 573-582, 128x128 on 8
#   warps 521-530 (non-causal; causal 128x128 on 4 warps spills 332 B in the sm_90a compile: the
#   autotuner times it like the others).
# - hd 256 [393]: 64x64 on 4 warps, 3 stages 635 (2 stages 568-572), 128x64 on 8 warps 507, 64x128
#   on 4 warps 506; 128x128 on 4 warps spills (274 B, 256).
# Session 10's prediction (128-row tiles on 8 warps, as in FA3's FP8 forward, >= 1.2x bf16) did not
# hold: FA3 ping-pongs two warpgroups' softmax and MMAs, which Triton 3.6 does not do here.
_FP8_FWD = {
    64: [(64, 128, 4, 3, True), (64, 128, 4, 4, True), (128, 128, 4, 3, True), (64, 64, 4, 3, True)],
    128: [(64, 128, 4, 3, True), (128, 128, 4, 3, True), (64, 64, 4, 3, True), (128, 128, 8, 3, True)],
    256: [(64, 64, 4, 3, True), (64, 64, 4, 2, True), (128, 64, 8, 2, True), (64, 128, 4, 2, True)],
}


def fwd_keep(d: int, elt: int, arch: int, causal: bool = False) -> list[tuple]:
    """Forward (BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA[, TILES[, MAXNREG]]) per (head dim, dtype,
    arch, causal without a left window), best guess first. Reasons (sm90 ptxas reports, bf16; registers per
    thread / spill bytes):
    - TMA loads first: no per-thread address tensors, so hd 128 128x64 on 8 warps drops from 255
      registers to 160 and 128x128 fits (221, no spill); pointer loads kept as the fallback.
    - hd <= 64: 128x64 tiles, 3 stages (small accumulators; deep pipelines hide loads); 8 warps won
      the measurements (v1, v2), 4 warps close behind.
    - hd 128: 64x64 on 4 warps won every measured shape (v1, v2): ~160 registers with TMA, so three
      CTAs share an SM and one's softmax overlaps another's matmuls; 64x128 and 128x64 kept as
      challengers.
    - hd 256: 64x64 / 64x32: the accumulator alone is 64x256 fp32; 1-2 stages.
    - hd 136-192 split in two parts (block_db; MLA's 192 / 128): q / k tiles 144-192 wide. The first
      pick stays 64x64 on 4 warps, 2 stages: 147 registers, 107520 B of shared memory, so two CTAs
      share an SM (padded to 256 it took 132096 B: one CTA). Challengers: 128x64 on 8 warps (154
      registers, 132096 B) and 3 stages (148480 B), both one CTA per SM.
    - fp32: ieee dots run on the FMA units, not the tensor cores: small tiles, 1-2 stages; at hd 256
      32 rows (64 spills 11 KB).
    - pre-Hopper: no TMA, at most 3 stages.
    Causal and non-causal share the tiles; the masked diagonal is a separate loop either way. Causal at
    hd <= 64 adds the first tile with TILES = 2 (a program runs the heaviest query block with the
    lightest: equal work per program, half the programs; session 15, H100, kernel alone, FA sweep):
    FP8 64x128 0.592 -> 0.555 ms at 4k, 1.070 -> 1.017 at 8k, 1.969 -> 1.906 at 16k, so first there;
    bf16 128x64 -1 to -8% at 4k, within 1% at 8k / 16k over two runs: a challenger the autotuner
    times. Not at hd 128: the FP8 64x128 tile took 123904 B of shared memory instead of 107520 (one
    program per SM, not two) and 0.449 -> 0.592 ms.
    FP8 at hd <= 64 on sm90 adds the 64x128 tile under a register cap of 128 (_FP8_FOUR_AN_SM: four programs an
    SM), first where causal, second (a challenger) where not.
    """
    if elt == 4:
        keep = ([(32, 32, 4, 1, P), (64, 32, 4, 1, P)] if d > 128 else
                [(64, 32, 4, 2, T), (64, 32, 4, 2, P), (64, 32, 4, 1, P)])
    elif elt == 1:  # FP8: the measured list (_FP8_FWD), then the bf16 pick as a fallback
        keep = _FP8_FWD.get(min(k for k in _FP8_FWD if k >= d), [])
        keep = list(dict.fromkeys(keep + fwd_keep(d, 2, arch)[:1]))
    elif d <= 64:
        keep = [(128, 64, 8, 3, T), (128, 64, 8, 3, P), (128, 64, 4, 3, P), (128, 64, 4, 3, T),
                (128, 128, 8, 3, T)]
    elif d <= 128:
        keep = [(64, 64, 4, 3, T), (64, 64, 4, 3, P), (64, 128, 4, 2, T), (64, 64, 4, 4, T),
                (128, 64, 8, 2, T)]
    elif d <= 192 and block_db(d, elt):
        keep = [(64, 64, 4, 2, T), (128, 64, 8, 2, T), (64, 64, 4, 3, T), (64, 32, 4, 2, T), (64, 64, 4, 2, P)]
    else:
        keep = [(64, 64, 4, 2, T), (64, 32, 4, 2, T), (64, 64, 4, 2, P), (64, 32, 4, 1, P)]
    if arch and arch < 90:
        keep = [(bm, bn, w, min(s, 3), P) for bm, bn, w, s, _ in keep]
    if causal and d <= 64 and elt < 4:
        paired = keep[0][:5] + (2,)
        keep = [paired] + keep if elt == 1 else keep[:1] + [paired] + keep[1:]
    if elt == 1 and d <= 64 and not (arch and arch < 90):  # four programs an SM: first causal, a challenger else
        four = _FP8_FOUR_AN_SM[:5] + (2 if causal else 1,) + _FP8_FOUR_AN_SM[5:]
        keep = [four] + keep if causal else keep[:1] + [four] + keep[1:]
    return keep


#: The FP8 64x128 tile on 4 warps, 2 stages, under a cap of 128 registers (ptxas's maxnreg): 125-128 registers
#: with no spill in its key loops (sm_90a; 138-139 uncapped), 46 KB of shared memory, so four programs share an
#: SM instead of three. Measured (session 25, H100, hd 64, FP8 kernel alone on V in the MMA order, TILES 2, two
#: interleaved repeats, bf16 out; docs/perf/fp8-s25): causal 4k 0.5346 / 0.5322 ms against 0.5392 / 0.5443 for
#: the uncapped 3-stage pick (-1 to -2%), causal 16k 1.8745 / 1.8696 against 1.8811 / 1.8975 (-0.4 to -1.5%),
#: non-causal 16k 3.4745 / 3.5460 against 3.6408 / 3.6024 (-2 to -5%; TILES forced to 2 there: non-causal calls
#: take TILES 1, not measured, so a challenger the autotuner times). Uncapped, 2 stages lose (0.60 ms at 4k).
_FP8_FOUR_AN_SM = (64, 128, 4, 2, T, 128)


#: FP8 forward head dims that run the warp-specialised Gluon kernel (fp8_gluon.fp8_fwd_gluon_ws) on sm90,
#: with its (BLOCK_N, stages); only dense e4m3 calls without window or softcap, bf16 or e4m3 out and the default
#: accumulation take it. hd 256: with flash-attn 3's ping-pong between its consumers (session 17), kernel
#: alone against the Triton FP8 forward in the same runs (H100, three interleaved repeats,
#: docs/perf/fp8-s17/): 16k 1.08-1.15x non-causal (954-962 TFLOP/s), 0.99-1.13x causal; 4k 1.04-1.10x
#: non-causal, 1.01-1.04x causal. hd 128 stays on the Triton kernel (0.95-1.27x at 16k, 0.96-0.99x at 4k), hd 64
#: too (softmax-bound; 0.67-0.79x in session 16). tests/kernels/test_fp8_gluon.py checks the routing on
#: the GPU; set it before a signature's first call, which the later ones replay.
FP8_GLUON_WS: dict[int, tuple[int, int]] = {256: (64, 3)}

#: bf16 / fp16 forward (q / k head dim, v head dim) pairs that run the warp-specialised Gluon kernel
#: (fp8_gluon.fwd_gluon_ws: flash-attn 3's loader warp and two ping-pong consumer warpgroups, 128-row tiles) on sm90,
#: with its (BLOCK_N, stages). Only dense calls the kernel takes, no window other than causal, no softcap,
#: TMA-aligned inputs take it (``gluon_ws_fwd``).
#: hd 128, measured against this module's pinned Triton forward (H100, session 30, kernel alone, CUDA events,
#: docs/perf/gluon-ws-s30): 128-key tiles over 3 stages 1.10-1.15x non-causal at 1k-16k (FA sweep), 1.01x / 1.11x /
#: 1.13x causal at 1k / 4k / 16k, 1.12-1.17x on Llama-3-8B / 70B / an MQA causal; 64-key tiles 1.01-1.11x, 128-key
#: over 2 stages 0.82-0.94x. hd 64 stays on the Triton kernel (0.74-0.98x, one causal 16k cell 1.02-1.05x).
#: DeepSeek's MLA training form (q / k 192 = 128 + 64 in two tile parts, v 128; session 31, docs/perf/gluon-ws-s31):
#: 64-key tiles over 4 stages 1.27-1.32x the Triton forward non-causal, 1.21-1.23x causal on the attention-layer
#: report's three MLA rows (3 stages 1.21-1.29x).
#: hd 256 (Gemma-2's 256 / 256): 32-key tiles over 4 stages (192 KiB of shared memory, 168 registers, no spill, with
#: and without softcap: sm_90a compile). Session 53 (H200, docs/perf/gluon-s53): kernels alone, softcap 50, 32-key
#: tiles over 4 stages 1.07-1.14x the 64-key tiles over 2 (session 52's build) and 1.26-1.50x the Triton forward
#: (1k / 4k, both masks, Gemma-2-9B's GQA 16/8); whole forward (route-ab, three pairs) 1.21x causal GQA 16/8 4k,
#: 1.22x non-causal MHA 4k, 1.14x Gemma-2's capped row (64-key tiles: 1.15x / 1.10x / 1.05x).
FWD_GLUON_WS: dict[tuple[int, int], tuple[int, int]] = {(128, 128): (128, 3), (192, 128): (64, 4), (256, 256): (32, 4)}
#: ... and only where both sequences hold at least this many tokens, by head dims and mask (False: none, True:
#: causal). Session 31, same runs (FA sweep's shapes, 16k tokens): hd 128 at 512 tokens 1.05x the Triton forward
#: non-causal, 0.98-0.99x causal, at 1k causal 1.00-1.02x (session 30: 1.006x); MLA 192 / 128 at 512 1.25x non-causal,
#: 1.10-1.14x causal (shorter not measured). A short query (decode-like) fills few of its 128-row tiles. hd 256
#: (session 53, H200): 1k causal capped 1.21x (route-ab, one pair timed), kernels alone 1.45-1.50x at 1k both masks
#: (capped); shorter not measured.
FWD_GLUON_WS_MIN_SEQLEN: dict[tuple[int, int], dict[bool, float]] = {
    (128, 128): {False: 512, True: 1024}, (192, 128): {False: 512, True: 512},
    (256, 256): {False: 1024, True: 1024}}
#: ... as the persistent kernel (one program an SM looping over the tiles) in a tile order of fp8_gluon.TILE_ORDERS,
#: keyed (GQA / MQA: query heads share kv heads, causal); None: the one-program-a-tile grid. Measured on an H100
#: against the one-program-a-tile kernel (kernel alone, CUDA events; docs/perf/gluon-ws-s31, docs/perf/gluon-ws-s32):
#: hd 128 GQA / MQA non-causal, query blocks outer, 1.02-1.17x on the attention-layer report's GQA / MQA rows
#: (programs running together share the group's K / V); GQA / MQA causal, kv heads outer snaking over the query
#: blocks (s32), 1.08x on Llama-3-8B 8k and 70B 4k, 1.09x an MQA 32/1 4k (query blocks outer: 1.04x / 1.07x / 1.12x);
#: MHA non-causal, kv heads outer, 1.02-1.29x at 512-16k (query blocks outer 0.77-1.01x: no K / V shared, L2
#: thrashed); MHA causal, snaking, 1.25x / 1.10x at 1k / 4k but 0.955x at 16k (kv heads outer without the snake
#: 0.71-0.79x at 16k: a static round-robin hands some programs only heavy tiles; hence the bound below). MLA
#: 192 / 128 (MHA), snaking (s32): 1.03-1.29x non-causal and 1.11-1.46x causal on the FA sweep's 512 / 1k and the
#: attention-layer report's three MLA rows (kv heads outer without the snake 1.02-1.31x).
FWD_GLUON_WS_PERSISTENT: dict[tuple[int, int], dict[tuple[bool, bool], str | None]] = {
    (128, 128): {(True, False): "query", (True, True): "kv-snake", (False, False): "kv", (False, True): "kv-snake"},
    (192, 128): {(False, False): "kv-snake", (False, True): "kv-snake"}}
#: ... and only up to this many query tokens where a key is here (longer: one program a tile). MHA causal hd 128: the
#: snake's last measured win is 4k (8k not measured; 16k 0.955x).
FWD_GLUON_WS_PERSISTENT_MAX_SEQLEN: dict[tuple[int, int], dict[tuple[bool, bool], int]] = {
    (128, 128): {(False, True): 4096}}
#: A causal persistent launch whose routed tile order (:data:`FWD_GLUON_WS_PERSISTENT`) the balance model
#: (fp8_gluon.persistent_balance: the static round-robin's mean program load over the largest) reads more than this
#: below another order's takes that order instead (the best, the routed one first among equals); None: off, the
#: routed order always. The snake order was measured at 4k-16k (session 32), where the model reads it 0.94-0.97; at
#: Llama-3-8B's 2k (B4 H32/8, the models table's lowest cuDNN cell: 0.354 ms, 0.78x cuDNN, 0.77x flash-attn-4; the
#: same kernel reaches 0.93x flash-attn-4 at 8k) it reads 0.73 (the snake's period of two units, 128 tiles, against
#: 132 programs hands some programs only heavy tiles), the query order 0.97; B2 2k 0.68 against 0.92; B4 1k 0.73
#: against 0.97. Built in session 55 on the CPU. Prediction at 0.05 (Llama-3-8B B4 2k causal): the forward
#: 1.10-1.25x (0.354 -> ~0.29-0.32 ms), the 8k / 4k rows unchanged (their orders kept). Measured in session 56 (H200,
#: docs/perf/gluon-s56, whole forward through the harness, same-call pairs): Llama-3-8B B4 2k 1.209-1.219x (0.356 ->
#: 0.295 ms), B2 H32/16 4k causal (snake 0.70 in the model) 1.162-1.169x, Llama-3-8B 8k 1.019x (one pair: unchanged);
#: the models table's Llama-3-8B 2k forward 0.95x cuDNN (was 0.78x). On at 0.05.
FWD_PERSISTENT_BALANCE_MARGIN: float | None = 0.05
#: Head dims whose Gluon forward is routed cell by cell instead (:data:`FWD_GLUON_WS` and its neighbours do not apply):
#: (GQA / MQA, causal) -> (shortest, longest (None: no bound) query and key length, fp8_gluon.ws16_launch's
#: keywords); a cell not listed, or a length outside its bounds, stays on the Triton forward. hd 64 (sessions 33-34,
#: docs/perf/gluon-ws-s33 and gluon-ws-s34, H100): the two-consumer kernel loses (0.77-1.03x the pinned Triton
#: config); three consumer warpgroups without the in-block overlap (192-row tiles, 128-key tiles) win. Session 34,
#: kernel alone against the **autotuned** Triton forward in one run (``gluon_ws_probe.py --autotune``): MHA
#: non-causal 0.96-0.97x at 2k, 1.03-1.04x at 4k, 1.08x / 1.11x at 8k (3 / 4 stages), 1.09x / 1.12x at 16k; causal
#: 0.77x at 2k, 0.93x at 4k, 1.02x at 8k, 1.05x / 1.06x at 16k. Routed: non-causal from 4k over 4 stages, causal
#: from 8k over 3 (4 stages within 1%). Through the harness (session 33, FA sweep with flash-attn-4 and cuDNN) the
#: 8k / 16k cells' ratio to flash-attn-4 rose (non-causal 0.82 -> 0.89 / 0.91, causal 0.82 / 0.80 -> 0.85 / 0.91).
#: GQA / MQA not routed: the persistent kernel's 1.13-1.20x at 2k causal was against the pinned config; against
#: the autotuned one 1.03x on Llama-style 32/8, 0.97x Falcon-7B's 71/1, 0.87x the MQA layer (session 34).
#: Session 51 (H200, docs/perf/gluon-s51, with :data:`FWD_GLUON_HOST_DESC`), the non-causal cell from 2k: the A/B
#: (device time, against session 50's tree, three pairs) read MHA B2 H12 1.114-1.131x (0.072 -> 0.064 ms) but GQA 32/8
#: and MQA 16/1 on the same config 0.961-0.967x / 0.970-0.976x, and the attention-layers table run with it read MHA B2
#: H32 0.168 -> 0.175 ms, H16 0.088 -> 0.092 (0.96x, peers unchanged): H12's 264 tiles of 192 rows fill two waves of
#: 132 SMs exactly, H16's 352 and H32's 704 do not. Kept from 4k; a rule by waves would need its own A/B.
FWD_GLUON_WS_CELLS: dict[tuple[int, int], dict[tuple[bool, bool], tuple[int, int | None, dict]]] = {
    (64, 64): {(False, False): (4096, None, dict(block_n=128, num_stages=4, consumers=3, overlap=False)),
               (False, True): (8192, None, dict(block_n=128, num_stages=3, consumers=3, overlap=False))}}
#: (q / k head dim, v head dim) -> {(GQA / MQA, causal): (shortest, fill)}: below its :data:`FWD_GLUON_WS_CELLS`
#: cell's shortest length, down to ``shortest``, a call whose one-program-a-tile grid (64 x consumers query rows a
#: tile) fills the GPU's waves to at least ``fill`` (:func:`wave_fill`) takes the cell's launch anyway. Session 51's
#: A/B of hd 64's non-causal cell from 2k (above): MHA B2 H12, 264 tiles of 192 rows, two full waves of 132 SMs,
#: 1.114-1.131x; H16's 352 (fill 0.89) and H32's 704 (0.89) 0.96x, GQA 32/8 (0.89) 0.96x, MQA 16/1 (0.89) 0.97x.
#: The one shape that gained is the one whose Gluon grid leaves no partial wave. Built in session 56 (off); routed in
#: session 57 (docs/perf/gluon-s57, H200, device time against 59c5b81): predicted B2 H12 2k 1.10-1.13x, B4 H12
#: 1.05-1.15x, H16 1.00; measured 1.127x (0.072 -> 0.064 ms), 1.067x (0.130 -> 0.122), 0.994x (one pair each: the
#: run's 25 s reached them last), and the attention-layers table in the same session: B2 H12 2k 0.064 ms, 1.01x cuDNN
#: (fused q / k / v 1.04x). Only the MHA non-causal cell (the one measured gaining).
FWD_GLUON_WS_WAVE_CELLS: dict[tuple[int, int], dict[tuple[bool, bool], tuple[int, float]]] = {
    (64, 64): {(False, False): (2048, 0.97)}}


def wave_fill(tiles: int, programs: int) -> float:
    """The share of whole waves a one-program-a-tile grid keeps busy: ``tiles`` over the waves of ``programs``
    (SMs) it takes, rounded up (1.0: every wave full; 264 tiles on 132 SMs: 1.0; 352: 0.89)."""
    if tiles <= 0 or programs <= 0:
        raise ValueError(f"wave_fill needs positive tiles and programs, got {tiles} and {programs}")
    return tiles / (triton.cdiv(tiles, programs) * programs)


def _wave_cell(dims: tuple[int, int], key: tuple[bool, bool], q, seqlen: int, cell) -> bool:
    """Whether :data:`FWD_GLUON_WS_WAVE_CELLS` gives this call below its cell's shortest length the cell's launch."""
    rule = FWD_GLUON_WS_WAVE_CELLS.get(dims, {}).get(key)
    if rule is None or not rule[0] <= seqlen < cell[0]:
        return False
    from .fp8_gluon import ws16_grid

    blocks, heads = ws16_grid(q, cell[2].get("consumers", 2))  # (2: ws16_launch's default)
    return wave_fill(blocks * heads, route_sm_count(q)) >= rule[1]


#: ``FLASH_ATTN_GLUON_WS=0`` (read per signature's first call) keeps every forward on the Triton kernel.
FWD_GLUON_WS_ENV = "FLASH_ATTN_GLUON_WS"
#: Causal calls with a sliding window on the left (Mistral's 4096, Gemma-2's local layers: query i sees keys i + Sk -
#: Sq - left .. i + Sk - Sq) on the 16-bit Gluon forward, not persistent (``fp8_gluon._fwd_ws_kernel``'s ``WINDOW``:
#: its tiles' key blocks from the first the tile's first row sees, the blocks left of the last row's window edge
#: masked too), wherever that head dim's causal calls take it; off: the Triton forward. Built in session 50 on the
#: CPU (sm_90a compile: registers and shared memory as the windowless kernel's, hd 128 4 B spilled outside the key
#: loop). Predicted (the models table's Mistral row, B1 H32/8 8k causal, window 4095): the forward 0.900 -> ~0.72-0.75
#: ms, ~0.92-0.96x flash-attn-4 (0.689 ms). Measured in session 51 (H200, docs/perf/gluon-s51, with
#: :data:`FWD_GLUON_HOST_DESC`; its GPU tests pass): 0.916-0.923 -> 0.747-0.769 ms, 1.190-1.235x a pair; the models
#: table 0.769 ms, 0.90x flash-attn-4. On.
FWD_GLUON_WS_WINDOW = True
#: The (q / k, v) head dims whose softcapped calls (Gemma-2's 50: scores softcap * tanh(s * scale / softcap)) run
#: the 16-bit Gluon forward wherever that head dim and mask take it uncapped, in the same launch (persistent or one
#: program a tile; both kernels' ``SOFTCAP``: the hardware's tanh, one MUFU operation an element, in the consumers'
#: softmax); other head dims: the Triton forward. Built in session 52 with tanh as the Triton kernel's ``_capped``
#: (one exp2 and a fast division: three MUFU operations an element with the softmax's exp2; sm_90a: the uncapped
#: kernels' PTX unchanged but the new argument; capped hd 256 no spill; hd 128 causal 4 -> 8 B spilled, persistent
#: 8 -> 12 B). Measured in session 53 (H200, docs/perf/gluon-s53, whole forward, route-ab, three pairs; 9 / 9 GPU
#: tests pass): Gemma-2's row (B2 H16/8 hd 256 4k causal, cap 50) 1.14x at hd 256's 32-key tiles (0.811 -> 0.714 ms;
#: prediction 1.10-1.25x), 1.05x at the 64-key tiles; hd 128 MHA causal 4k capped 0.78x the Triton forward (0.436 ->
#: 0.556 ms: the three MUFU operations outrun hd 128's wgmmas). The same session then moved the cap to
#: ``tanh.approx.f32`` (9 / 9 GPU tests pass again) and timed it once, in a later call than the numbers it is set
#: against (no same-call A/B: the budget ran out): Gemma-2's row 0.669 ms (0.712-0.719 with the exp2 form in two
#: calls: ~1.07x more), hd 128's 0.446 ms (Triton's 0.436: ~0.98x, still not routed). Session 54's same-call A/B
#: (H200, docs/perf/gluon-s54, three pairs against session 53's exp2 form, 4fab229): Gemma-2's row 0.718-0.720 ->
#: 0.666-0.669 ms, 1.074-1.080x (prediction 1.05-1.10x); the models table 0.656 ms, 0.94x flash-attn-4; hd 128's
#: capped Gluon forward 0.974-0.984x the Triton one (not routed). Session 56 (H200, docs/perf/gluon-s56; its GPU tests
#: pass): the capped hd 128 Gluon forward (the cubic off) against the Triton one, from two back-to-back calls' pairs
#: (Triton -> Gluon with the cubic, then the cubic off -> on): B2 H32/16 4k causal cap 50 (Gemma-2-27B's global
#: layers; persistent, the balance model's order) 0.832 -> 0.637 ms, ~1.31x; its local layers (8k, window 4095, one
#: program a tile) 1.222 -> 0.897 ms, ~1.36x; B2 H16 2k non-causal cap 30 0.206 -> 0.159 ms, ~1.30x. Routed at hd
#: 128. Session 57's same-call pairs of that route against 59c5b81 (the Triton capped forward; docs/perf/gluon-s57,
#: three pairs, 12 / 12 persistent GPU tests pass): B2 H32/16 4k causal cap 50 1.264-1.296x (0.846 -> 0.666 ms);
#: session 54's MHA row, B2 H16 4k causal cap 50, 1.253-1.270x (0.438 -> 0.347: no longer the 0.97x of the exp2 form's
#: days; not restricted to GQA); B2 H16 2k cap 30 1.292-1.302x. MLA's and hd 64's capped kernels not timed.
FWD_GLUON_WS_SOFTCAP: frozenset[tuple[int, int]] = frozenset({(128, 128), (256, 256)})
#: (q / k head dim, v head dim, capped) -> the 16-bit Gluon forward's ``exp2_every`` (fp8_gluon.EXP2_EVERY_CHOICES):
#: one of that many of the softmax's exponentials (in blocks no row masks) by a cubic on the FMA pipe instead of the
#: MUFU unit's ex2 (flash-attn 4's answer to that unit's 16 a cycle an SM), wherever the route runs that kernel;
#: not listed: all by ex2. Built in session 55 on the CPU, not listed: the cubic's relative error at most 1.14e-4 (under
#: the 2^-9 of the bf16 P it feeds); sm_90a: registers and spills as without (hd 64's cell 0 B; hd 128 one program a
#: tile 0 B, capped 8 B, capped persistent 12 B), one in 4 / 2 of the unmasked blocks' ex2 replaced (9 FMA-pipe
#: instructions each). Where it may pay, by MUFU operations an
#: element against the wgmmas' cycles (16 a cycle an SM; 4096 bf16 flops): hd 64, 1 exp2 (0.0625 cycles) against
#: two 64-deep matmuls (0.0625): a tie, the hd 64 forward softmax-bound since session 16; hd 128 capped, tanh + exp2
#: (0.125) against 0.125 (session 54: the capped Gluon forward 0.97-0.98x the Triton one). Prediction: hd 64's routed
#: cells (4k+) 1.03-1.10x at 4, the capped hd 128 Gluon forward 1.05-1.12x its uncapped-exp2 form at 2 (then
#: ahead of the Triton one: Gemma-2-27B's forward). Measured in session 56 (H200, docs/perf/gluon-s56, same-call
#: pairs; its 12 GPU tests pass): it loses everywhere. Capped hd 128 at 2 against the same kernel all by ex2
#: 0.861-0.895x (B2 H32/16 4k causal 0.62-0.64 -> 0.71-0.72 ms; 8k window 0.867-0.873x; 2k non-causal 0.861-0.867x);
#: hd 64's B4 H32 4k non-causal cell at 4 0.903x (one pair, 1.194 -> 1.323 ms). The MUFU count alone does not bound
#: these kernels: the cubic's 9 FMA-pipe instructions an element cost more than the ex2 they replace. Session 57
#: (ncu, docs/perf/gluon-s57, one launch a variant): the cubic's floor (cvt.rmi, cvt.rzi) ran on the XU pipe as ex2
#: does, so XU's work rose a quarter (hd 64 at 4: 630 -> 777 us of XU time; capped at 2: 323 -> 396), as counted.
#: With the floor by a round-down add (fp8_gluon.EXP2_ROUND_MAGIC) XU's work fell as counted (476 / 246 us) and the
#: launches were still slower: hd 64 at 4 0.95x, capped hd 128 at 2 0.96x, at 4 1.00x, uncapped hd 128 causal GQA at
#: 4 0.96x. Neither XU (51-55% of its peak) nor the tensor pipe (50-65%) nor the issue slots (30-43%) binds these
#: kernels; the largest stalls are the consumers' barriers and fixed-latency waits: a shorter softmax chain, not
#: fewer MUFU operations, is what would move them. Empty.
FWD_GLUON_EXP2_EVERY: dict[tuple[int, int, bool], int] = {}
#: (q / k head dim, v head dim, capped) -> the 16-bit Gluon forward's ``lazy`` (fp8_gluon.LAZY_CHOICES; both its
#: kernels, wherever the route runs them): in a block no row masks, each consumer keeps its rows' running max, and
#: skips O's rescale (64 FMULs a thread at hd 128), unless some row's max grew by more than that many base-2 units
#: (fp8_gluon._softmax_step_lazy; P then stays below 2^8; flash-attn 4's rule). Built in session 60 on the CPU, not
#: listed: sm_90a (the routed hd 128 cells) the same wgmmas, registers and ex2s, a cross-warp max a block (two named
#: barriers of the warpgroup and a shared-memory word: the consumer's one bool), the rescale's FMULs in a branch of
#: their own after S_{j+1}'s eight wgmmas (session 59's SASS: the eager rescale sat between S_{j+1}'s first and
#: second wgmma, with P's conversion, holding the consumer's turn ~80 issue slots longer). Prediction: runbook
#: session 61 (c).
FWD_GLUON_LAZY: dict[tuple[int, int, bool], int] = {}
#: The 16-bit Gluon forward's one-program-a-tile launches (hd 64's cells, hd 128 MHA causal past the persistent
#: kernel's longest, windows) with their four TMA descriptors made on the host (``fp8_gluon._fwd_ws_kernel``'s
#: ``HOST_DESC``: rank 4, encoded once per pointer by a replay) instead of by every program; q / k = v head dims only.
#: The backward's three kernels gained 1.02-1.08x from the same (session 49). Built in session 50 on the CPU (sm_90a:
#: registers and split as the device-made kernel's; hd 64 no spill, hd 128 causal 4 B). Predicted: hd 64's
#: three-consumer cells 1.03-1.08x. Measured in session 51 (H200, docs/perf/gluon-s51; its GPU tests bitwise the
#: device-made kernel's): hd 64 MHA non-causal B4 H32 4k 1.031-1.044x a pair (the cell's route unchanged there); session
#: 52 (H200, docs/perf/gluon-s52, against the device-made descriptors, three pairs): hd 128 MHA causal B2 8k
#: 1.044-1.065x, B1 16k 1.006-1.026x, GQA 32/8 B1 8k causal 1.008-1.023x (prediction 1.00-1.01x). On.
FWD_GLUON_HOST_DESC = True


def _on_sm90(q, sm_major: int | None) -> bool:
    """Whether a Gluon kernel can run q's call: ``sm_major`` 9, or (None) q on an sm90 GPU outside the
    interpreter (the Gluon routes' device rule; tests pass 9 with CPU tensors)."""
    if sm_major is None:
        if interpreting() or not q.is_cuda:
            return False
        sm_major = torch.cuda.get_device_capability(q.device)[0]
    return sm_major == 9


def persistent_order(dims: tuple[int, int], gqa: bool, causal: bool, seqlen_q: int, shape=None) -> str | None:
    """The persistent Gluon forward's tile order for these (q / k, v) head dims, heads (``gqa``: query heads share
    kv heads), mask and query length, or None for the one-program-a-tile kernel (:data:`FWD_GLUON_WS_PERSISTENT`,
    :data:`FWD_GLUON_WS_PERSISTENT_MAX_SEQLEN`). ``shape`` (batch, query heads, kv heads, key length, programs):
    with :data:`FWD_PERSISTENT_BALANCE_MARGIN` set, a causal call's order is the balance model's pick."""
    key = (gqa, causal)
    order = FWD_GLUON_WS_PERSISTENT.get(dims, {}).get(key)
    if order is not None and seqlen_q > FWD_GLUON_WS_PERSISTENT_MAX_SEQLEN.get(dims, {}).get(key, seqlen_q):
        return None
    if order is not None and causal and shape is not None and FWD_PERSISTENT_BALANCE_MARGIN is not None:
        order = balanced_order(order, seqlen_q, *shape)
    return order


def balanced_order(order: str, seqlen_q: int, batch: int, heads: int, kv_heads: int, seqlen_k: int,
                   programs: int) -> str:
    """``order``, or the tile order of fp8_gluon.TILE_ORDERS the balance model reads more than
    :data:`FWD_PERSISTENT_BALANCE_MARGIN` better balanced for this causal call (the best; ``order`` first among
    equals). Asked once per call signature (a replay keeps its launch)."""
    from .fp8_gluon import TILE_ORDERS, persistent_balance

    read = {o: persistent_balance(o, batch, heads, kv_heads, seqlen_q, seqlen_k, programs)
            for o in (order, *(o for o in TILE_ORDERS if o != order))}
    best = max(read, key=read.get)
    return best if read[best] > read[order] + FWD_PERSISTENT_BALANCE_MARGIN else order


def gluon_ws_fwd(q, k, v, *, causal: bool, window_left: int, window_right: int, softcap, varlen: bool,
                 fp8: bool, sm_major: int | None = None) -> dict | None:
    """fp8_gluon.ws16_launch's keywords (block_n, num_stages, persistent, tile_order; consumers, overlap) the 16-bit
    warp-specialised Gluon forward runs this call with (:data:`FWD_GLUON_WS`, :data:`FWD_GLUON_WS_PERSISTENT`, or
    :data:`FWD_GLUON_WS_CELLS`), or None where the Triton forward does: those tables' head dims, both sequences at
    least the mask's :data:`FWD_GLUON_WS_MIN_SEQLEN` long (or within the cell's bounds, or filling the GPU's waves
    below them: :data:`FWD_GLUON_WS_WAVE_CELLS`), an sm90 GPU (not the
    interpreter), dense bf16 / fp16 inputs the kernel takes (fp8_gluon.ws16_unsupported: its head dims,
    TMA-readable rows), causal or no mask (with :data:`FWD_GLUON_WS_WINDOW`, causal with a window on the left too:
    then not persistent, ``window_left`` among the keywords), no softcap (head dims in :data:`FWD_GLUON_WS_SOFTCAP`:
    a softcap too: ``softcap`` among the keywords; :data:`FWD_GLUON_EXP2_EVERY`'s cells ``exp2_every`` too,
    :data:`FWD_GLUON_LAZY`'s ``lazy``), and the
    environment knob not 0. With
    :data:`FWD_GLUON_HOST_DESC` a launch that is not persistent gets ``host_desc`` (q / k = v head dims).
    ``sm_major``: the GPU's compute capability major (default: q's device's; a test passes 9 with CPU tensors)."""
    dims = (q.shape[-1], v.shape[-1])
    cfg = FWD_GLUON_WS.get(dims)
    cells = FWD_GLUON_WS_CELLS.get(dims)
    window = window_left >= 0 and causal and FWD_GLUON_WS_WINDOW
    if (cfg is None and cells is None) or varlen or fp8 or (softcap and dims not in FWD_GLUON_WS_SOFTCAP) or (
            window_left >= 0 and not window) or (window_right >= 0 and not causal) or q.dim() != 4:
        return None
    seqlen = min(q.shape[1], k.shape[1])
    if cells is not None:
        key = (q.shape[2] > k.shape[2], bool(causal))
        cell = cells.get(key)
        if cell is None or (cell[1] is not None and seqlen > cell[1]) or (
                seqlen < cell[0] and not _wave_cell(dims, key, q, seqlen, cell)):
            return None
    elif seqlen < FWD_GLUON_WS_MIN_SEQLEN[dims][bool(causal)]:
        return None
    if os.environ.get(FWD_GLUON_WS_ENV, "1") == "0":
        return None
    if not _on_sm90(q, sm_major):
        return None
    from .fp8_gluon import ws16_unsupported

    if ws16_unsupported(q, k, v):
        return None
    if cells is not None:
        kw = {"persistent": False, "tile_order": "query"} | cell[2]
    else:
        shape = None  # (the balance model's inputs: asked only when it may change the order)
        if causal and FWD_PERSISTENT_BALANCE_MARGIN is not None:
            shape = (q.shape[0], q.shape[2], k.shape[2], k.shape[1], route_sm_count(q))
        order = persistent_order(dims, q.shape[2] > k.shape[2], bool(causal), q.shape[1], shape)
        kw = {"block_n": cfg[0], "num_stages": cfg[1], "persistent": order is not None, "tile_order": order or "query"}
    if window:  # (the persistent kernel has no window: one program a tile)
        kw.update(persistent=False, tile_order="query", window_left=window_left)
    if softcap:
        kw["softcap"] = float(softcap)
    if every := FWD_GLUON_EXP2_EVERY.get((*dims, bool(softcap))):
        kw["exp2_every"] = every
    if lazy := FWD_GLUON_LAZY.get((*dims, bool(softcap))):
        kw["lazy"] = lazy
    if FWD_GLUON_HOST_DESC and not kw["persistent"] and dims[0] == dims[1]:
        kw["host_desc"] = True
    return kw


#: The FP8 backward's sequence-contiguous copies of Q, K and dO in the MMA order of each 16 positions (v_layout),
#: so dS, dS^T and P^T reach their dots as the MMA left them (the forward's V since session 24): the sm_90a compile
#: drops the dots' shuffles (docs/perf/flash_attn.md "Session 24"). Measured (session 25, H100, the backward's
#: first tiles, two interleaved repeats, docs/perf/fp8-s25): at 4k hd 64 3.913 / 3.916 -> 3.648 / 3.638 ms
#: non-causal, 2.416 / 2.408 -> 2.156 / 2.153 causal; hd 128 2.801 / 2.822 -> 2.687 / 2.716, 1.687 / 1.715 ->
#: 1.583 / 1.585 (4-11% faster); the errors against the FP8 reference equal to the digits printed. The CPU suite
#: runs both orders. Part of a call's signature (flash_attn_fp8_bwd_func keys its replayed launches on it).
FP8_BWD_MMA_ORDER = True

#: The FP8 forward overlaps its V copy (v_layout): the copy runs as persistent programs that count each (batch,
#: kv head) done, and the forward, launched with programmatic dependent launch, starts while the copy runs and
#: waits per program for its own head only (fwd._wait_ready). Predicted (session 25): the copy's 27 us at the FA
#: sweep's 4k (5% of the hd 64 causal call) mostly hidden, 2-4% off the call. Measured (session 25, H100, hd 64,
#: whole calls, benchmarks/fp8_overlap_probe.py, docs/perf/fp8-s25): first +13% (the copy's small shared-memory
#: carveout kept the forward off its SMs until it ended: both kernels now ask for the largest), then within
#: +-2% of the call without it at 4k and 16k, causal or not (0.5560 / 0.5582 ms against 0.5560 / 0.5691 at 4k
#: causal): no gain, so off. Outputs bitwise equal in every race check. That is "counters"; "pdl" keeps the plain
#: copy and launches the forward with programmatic dependent launch only, every program waiting for the whole copy
#: (griddepcontrol.wait) before it reads: its launch and set-up during the copy's last programs; measured slower
#: (+1.5-2% at 4k causal, up to +21% at 16k). "": neither (the default). Part of a call's signature.
FP8_V_OVERLAP = ""

#: Query blocks per forward program (the kernel's TILES), forced to 1 or 2 on every config of the list
#: (tests, benchmarks/fp8_causal_probe.py; under the interpreter it is the only way to get 2). None:
#: as fwd_keep lists them.
FWD_TILES_FORCE: int | None = None
#: A register cap (ptxas's maxnreg) on every forward config, for experiments (benchmarks/fp8_causal_probe.py
#: --maxnreg): at 128 the FP8 64x128 tile on 4 warps fits four programs an SM (session 24's compile: 125-128
#: registers, no spill in its key loops; with two stages causal). None: no cap, as measured so far.
FWD_MAXNREG: int | None = None
#: Forces fwd_masked_no_licm's answer (True / False) for experiments (benchmarks/fp8_causal_probe.py).
FWD_MASKED_NO_LICM: bool | None = None


#: Forces fwd_narrow_diagonal's answer (True / False) for experiments (benchmarks/fp8_causal_probe.py --narrow).
FWD_NARROW_DIAGONAL: bool | None = None


def fwd_narrow_diagonal(d: int) -> bool:
    """Whether the forward reads the keys right of a tile's unmasked part (the causal diagonal) in
    BLOCK_M-wide blocks where BLOCK_M < BLOCK_N (the FP8 64x128 tile): a 64-row query block whose diagonal
    lies in the first half of a 128-key block then skips the second half, whose every key it masks.
    Measured (session 24, H100, FP8 kernel alone, causal, two interleaved repeats, perf/fp8-s24): hd 64
    0.5495 / 0.5551 ms against 0.5782 / 0.5742 at 4k, 16k mixed (1.8775 / 1.8790 against 1.8575 / 2.0456);
    hd 128 no gain at 4k (0.5985 / 0.6003 against 0.5985 / 0.5900), so there only hd <= 64."""
    return d <= 64 if FWD_NARROW_DIAGONAL is None else FWD_NARROW_DIAGONAL


def fwd_masked_no_licm(d: int, elt: int) -> bool:
    """Whether the forward's masked key loops keep their index arithmetic inside (no loop-invariant code
    motion): where hoisting it costs occupancy. FP8 at hd <= 64, causal 64x128 tile: 196 -> 155
    registers (two programs per SM -> three), 0.72 -> 0.59 ms at 4k, 2.10 -> 1.97 ms at 16k. Not
    elsewhere: FP8 hd 128 (234 -> 204 registers, shared memory holds it at two programs either way)
    read 1.46-1.55 ms against 1.40-1.44 with the motion at 16k, interleaved runs; bf16 within the
    runs' +-3% (session 15, H100, benchmarks/fp8_causal_probe.py)."""
    if FWD_MASKED_NO_LICM is not None:
        return FWD_MASKED_NO_LICM
    return elt == 1 and d <= 64


def bwd_keep(d: int, elt: int, arch: int, resident_is_n: bool) -> list[tuple]:
    """Backward (BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA), best guess first, for the dK/dV
    kernel (resident_is_n: K, V and the fp32 accumulators dK, dV stay for BLOCK_N key rows while
    Q/dO stream) or the dQ kernel (Q, dO and dQ stay for BLOCK_M rows while K/V stream).
    Register budget (sm90 ptxas reports, bf16): the resident side's fp32 accumulators plus the S / dP
    tiles must fit in 255 registers per thread:
    - dK/dV hd 128: 128 resident key rows on 8 warps won (v1: 32x128 with pointers despite 368 B of
      spills; v2: 64x128 with TMA); 64x64 on 8 warps is the spill-free alternative.
    - dK/dV hd 64: 32x128 (TMA) or 64x64 on 4 warps won depending on seqlen (v2).
    - dQ: 64x64 on 4 warps won everywhere (v1, v2), TMA or pointers by a hair.
    - hd 129-256 (padded to 256): dK/dV 64x64 on 8 warps, 2 stages with dQ 64x64 on 4 warps, 2 stages
      (wgmma; 197632 B, one CTA per SM; dK/dV spills 116-244 B, 696 B with softcap and GQA): H100, 4k,
      CUDA graphs, each pair pinned (benchmarks/bf16_bwd_tiles.py, session 23): 5.24 / 3.30 ms non-causal
      / causal on the FA sweep's hd 256 (8 heads, batch 4) where the 32-row mma.sync tiles listed first
      before read 7.70 / 4.20 autotuned (10.0 / 5.44 untuned), 1.47 / 1.27x; Gemma-2-9B (B2 H16/8,
      softcap 50, causal) 3.68 against 4.51, 1.23x. dK/dV 32x64 on 8 warps (8 B of spills) read 8.33 /
      5.01 and dQ on 8 warps 6.56 / 3.97. The FP8 backward takes the same pair there (session 22).
    - fp32: small tiles, 1 stage (registers and shared memory are the limit).
    - hd 136-192 split in two parts (block_db; 192 / 128 bf16): the hd 256 list's 32-row tiles run on
      mma.sync (no wgmma below 64 rows per warpgroup) or spill (32x64: 356 B padded). Split, 64-row
      tiles fit without spills: dK/dV 64x64 on 8 warps, 2 stages (240 registers, 0 spills, 123904 B;
      padded 255 and 4 B); dQ 64x64 on 8 warps, 2 stages (161, 0, 123904 B), one CTA of 8 warps per SM,
      ahead of hd 128's 64x64 on 4 warps (205, 0, 123904 B: one CTA of 4 warps here, where hd 128's
      99 KB let two share an SM) and 64x32 on 4 warps (192, 0, 82944 B: two CTAs); the old 32x32
      tiles stay as challengers (sm90 compile reports, not timed: docs/perf/flash_attn.md, session 12).
    """
    if elt == 1 and d <= 64:  # the FP8 backward (one-byte q / k) at hd 64: a measured list of its own
        keep = _fp8_bwd_keep(d, resident_is_n)
    elif elt == 4:
        pairs = ([(32, 16, 4, 1, P), (16, 16, 4, 1, P)] if d > 128 else
                 [(64, 32, 4, 1, P), (32, 32, 4, 1, P), (64, 16, 4, 1, P)])
        keep = [(s_, r, w, st, t) if resident_is_n else (r, s_, w, st, t) for r, s_, w, st, t in pairs]
    elif d <= 64:
        keep = ([(32, 128, 8, 2, T), (64, 64, 4, 2, T), (64, 64, 4, 2, P), (64, 128, 8, 2, T)] if resident_is_n
                else [(64, 64, 4, 2, T), (64, 64, 4, 2, P), (128, 64, 8, 3, P), (128, 64, 8, 2, T)])
    elif d <= 128:
        keep = ([(64, 128, 8, 2, T), (32, 128, 8, 2, T), (64, 64, 8, 2, T)] if resident_is_n
                else [(64, 64, 4, 2, T), (64, 64, 4, 2, P), (64, 128, 4, 2, T)])
    elif d <= 192 and block_db(d, elt):
        keep = ([(64, 64, 8, 2, T), (32, 64, 8, 2, T), (32, 32, 4, 1, T), (32, 32, 4, 1, P)] if resident_is_n
                else [(64, 64, 8, 2, T), (64, 64, 4, 2, T), (64, 32, 4, 2, T), (32, 32, 4, 1, T), (32, 32, 4, 1, P)])
    else:  # hd 129-256, and the FP8 backward's (which refuses split head dims) at hd 129-256 too
        keep = ([(64, 64, 8, 2, T), (32, 32, 4, 1, T), (32, 64, 4, 1, T), (32, 32, 4, 1, P), (32, 64, 8, 1, P)]
                if resident_is_n else
                [(64, 64, 4, 2, T), (64, 64, 8, 2, T), (32, 32, 4, 1, T), (64, 32, 4, 1, T), (32, 32, 4, 1, P),
                 (64, 32, 8, 1, P)])
    if arch and arch < 90:
        keep = [(bm, bn, w, min(st, 2), P) for bm, bn, w, st, _ in keep]
    return keep


def _fp8_bwd_keep(d: int, resident_is_n: bool) -> list[tuple]:
    """The FP8 backward's tiles at hd <= 64, where the bf16 list's lose (session 22, H100, 4k, the FA
    sweep's shapes, benchmarks/fp8_bwd_configs.py with each tile pinned, CUDA graphs; docs/perf/fp8-s22):
    dK/dV 128x128 on 8 warps, 3.90 / 2.41 ms (0.93x bf16 either way), ahead of 64x128 (4.17 / 2.63),
    64x128 on 3 stages (4.11 / 2.65) and on 4 warps (6.46 / 2.56); dQ 64x64 on 4 warps ahead of 64x128 on
    4 warps, 128x64 and 64x64 on 8 warps (4.17-5.45 ms non-causal).
    hd 65-128 keeps the bf16 list (its first tiles within 1% of the best pair, session 21). hd 129-256
    shares the bf16 list's pair, measured for FP8 first (session 22: dK/dV 64x64 on 8 warps, 2 stages with
    dQ 64x64 on 4 warps, 3.78 / 2.32 ms non-causal / causal, 2.03 / 1.77x the bf16 backward of then,
    where dK/dV 64x128 on 8 warps read 9.03 / 5.47 ms and 32x128 15.7 / 9.2), then for bf16 (session 23)."""
    return ([(128, 128, 8, 2, T), (64, 128, 8, 2, T), (32, 128, 8, 2, T)] if resident_is_n
            else [(64, 64, 4, 2, T), (64, 128, 4, 2, T)])


def prune_fwd(configs, named_args, **kwargs):
    """Named pruning filter of the forward (see fwd_keep for the reasons)."""
    args = _merged(named_args, kwargs)
    keep = fwd_keep(args["HEAD_DIM"], _elt(args), args["ARCH"], bool(args.get("IS_CAUSAL")) and not args.get("HAS_LEFT"))
    if FWD_TILES_FORCE is not None:
        keep = list(dict.fromkeys(_key7(k)[:5] + (FWD_TILES_FORCE,) + _key7(k)[6:] for k in keep))
    picked = _select(configs, keep, _smem_fwd, args) or [_cfg(32, 32, 4, 1)]
    if FWD_MAXNREG:
        picked = [triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages, maxnreg=FWD_MAXNREG)
                  for c in picked]
    return picked


def prune_bwd(configs, named_args, **kwargs):
    """Named pruning filter of both backward kernels (see bwd_keep for the reasons)."""
    args = _merged(named_args, kwargs)
    keep = bwd_keep(args["HEAD_DIM"], _elt(args), args["ARCH"], args["RESIDENT_N"])
    return _select(configs, keep, _smem_bwd, args) or [_cfg(16, 16, 4, 1)]


def tuning_enabled() -> bool:
    """FLASH_ATTN_AUTOTUNE=0 takes the first config of each pruned list instead of timing them all
    (GPU test runs: many shapes, each would otherwise compile and time every config)."""
    return os.environ.get("FLASH_ATTN_AUTOTUNE", "1") != "0"


def env_key() -> tuple:
    """The environment knobs that choose a launch (FLASH_ATTN_AUTOTUNE, FLASH_ATTN_BWD, FLASH_ATTN_GLUON_WS): part
    of every call signature a replayed launch is keyed on."""
    return _ENV.get(_AUTOTUNE_KEY), _ENV.get(_BWD_KEY), _ENV.get(_GLUON_WS_KEY)


# env_key runs on every call: os.environ's own mapping (bytes on POSIX) is read directly, a tenth
# of os.environ.get's cost; setenv and monkeypatch.setenv update it.
_ENV = getattr(os.environ, "_data", os.environ)
_AUTOTUNE_KEY, _BWD_KEY, _GLUON_WS_KEY = (
    (b"FLASH_ATTN_AUTOTUNE", b"FLASH_ATTN_BWD", b"FLASH_ATTN_GLUON_WS") if _ENV is not os.environ and
    isinstance(next(iter(_ENV), b""), bytes) else ("FLASH_ATTN_AUTOTUNE", "FLASH_ATTN_BWD", "FLASH_ATTN_GLUON_WS"))


def _tune_bench(kernel_call, quantiles):
    return triton.testing.do_bench(kernel_call, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)


TUNE_KEY = ["HEAD_DIM", "HEAD_DIM_V", "BLOCK_DB", "IS_CAUSAL", "HAS_LEFT", "HAS_SOFTCAP", "SEQ_BUCKET", "FILL_BUCKET", "ARCH", "ATOMIC_DQ"]


def bwd_mode(head_dim: int, dtype, causal: bool, bucket: int) -> str:
    """'split' (dK/dV kernel + dQ kernel, deterministic) or 'atomic' (one kernel, dQ by fp32 atomics).
    FLASH_ATTN_BWD=split|atomic forces one on the Triton kernels (``gluon``: split, its kernels the Gluon ones
    wherever they run; ``fused``: see :func:`gluon_fused_bwd`, which the backward asks first); the default is
    'split', its kernels as :func:`gluon_bwd` routes them."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if forced in ("split", "atomic"):
        return forced
    return "split"


#: The fused Gluon backward (bwd_gluon.py's dK / dV kernel adding dQ into an fp32 buffer by TMA reduce: five
#: matmuls, not the split mode's seven; three launches: delta with dQ's fp32 buffer zeroed, the kernel, dQ's cast):
#: q / k = v head dim -> {(GQA / MQA, causal): (shortest sequence, (BLOCK_M, stages))}; a cell not listed stays on
#: :data:`BWD_GLUON`'s split kernels; only for calls that allow a nondeterministic backward
#: (flash_attn_func(deterministic=False), as flash-attn's default). Measured on an H100 (session 34). Through the
#: harness, same run, against the split route
#: (docs/bench/h100-fa-sweep-bwd-s34): hd 128 non-causal 1.02x / 1.05x / 1.03x at 4k / 8k / 16k, causal 1.10x / 1.11x
#: / 1.14x; hd 64 non-causal 0.97x at 4k, 1.05x / 1.07x at 8k / 16k. The probe (docs/perf/gluon-fused-s34; whole
#: backwards against the autotuned Triton backward and the split route in one run): hd 128 0.98-1.01x the Triton
#: backward at 1k (split route 1.02-1.05x); hd 64 causal even with the split route at 4k (1.04x / 1.05x), 1.16x /
#: 1.09x at 16k. GQA lost then: Llama-3-8B (32/8, 8k causal) 0.80x, Llama-3-70B (64/8, 4k) 0.70x (split route 1.09x
#: / 1.15x; a group split of 4 recovers part: 0.84x / 0.80x the split route): not routed until session 59 (below,
#: where today's kernel wins most GQA / MQA cells). hd 128 non-causal runs 3
#: stages (the kernel alone 1.19-1.29x the Triton backward against 1.13-1.18x at 2), causal 2 (1.32-1.40x against
#: 1.12-1.19x at 3). hd 64 non-causal runs 128-row tiles (session 39, docs/perf/gluon-hd64-s39: S^T and dP^T in
#: query halves, bwd_gluon.query_halves; the kernel alone 1.035-1.109x the 64-row tiles at 4k, 1.016-1.116x at 16k,
#: faster in each of two repeats; causal 0.97-1.00x: stays 64); from 4k since session 40 (docs/perf/gluon-s40: the
#: whole fused backward 1.133x / 1.169x the split route at 4k, two repeats, 0.97-1.05x at 2k; causal 4k 1.004-1.007x:
#: stays from 8k). hd 64 causal from 4k since session 42 (docs/perf/gluon-s42), its consumers without turns
#: (:data:`BWD_GLUON_FUSED_NO_TURNS`): the whole fused backward 1.098x / 1.106x / 1.078x the split route at 4k in the
#: probe (three repeats; 1.001-1.013x at 2k: stays from 4k) and 1.086x / 1.093x through the harness against
#: session 41's route (fused with turns from 8k, split below), 1.088-1.119x at 8k-16k. hd 128 from 2k since session
#: 43 (docs/perf/gluon-s43; the probe against the autotuned Triton backward and the split route, two repeats: the
#: whole fused backward 1.119x / 1.134x the split route non-causal, 1.052x / 1.048x causal at 2k; 1k 1.04-1.07x /
#: 0.97x: stays from 2k), through the harness against session 42's route, same host, three pairs: non-causal 1.165 /
#: 1.087 / 1.110x, causal 1.078 / 1.078 / 1.096x at 2k (1k, unchanged, 0.996-1.022x). hd 128 non-causal from 1k
#: since session 44 (docs/perf/gluon-s44; on an H200, the only kind lent that session: the same sm90 chip, memory
#: 1.4x faster): through the harness against session 43's route, four pairs, 1.088 / 1.068 / 1.079 / 1.077x (the
#: probe on an H100 in session 43: 1.04-1.07x alone). hd 64 from 2k, same host, three pairs: non-causal 1.005-1.020x,
#: causal 1.023-1.029x: under the 5% bar, stays from 4k. Causal hd 64 and hd 128 from 1k since session 46
#: (docs/perf/gluon-s46, H200), their kernels persistent there (:data:`BWD_GLUON_PERSISTENT`): through the harness
#: against session 45's route (Triton split / Gluon dK / dV split at 1k-2k), same host, three pairs: hd 64 1.168-1.177x
#: at 1k, 1.209-1.222x at 2k; hd 128 1.092-1.099x at 1k. hd 64 non-causal from 1k the same way (persistent): 0.964-
#: 0.968x at 1k, 1.019-1.032x at 2k: stays from 4k. Session 59 (docs/perf/gluon-s59, H200), with lse by TMA
#: (:data:`BWD_GLUON_FUSED_LSE_TMA`), through the harness against the split route (its dK / dV kernel with lse by TMA
#: too), CUDA graphs, three pairs, every pair gaining: hd 64 non-causal from 2k (B2 H12 / H16 / H32 2k
#: 1.095-1.124x); GQA / MQA, their group split as the split route's (bwd.group_split): hd 128 non-causal from 1k
#: (32/8 1k 1.071-1.078x, 40/8 2k 1.045-1.071x, 32/8 4k 1.132-1.151x, MQA 40/1 2k 1.060-1.075x, MQA 32/1 4k
#: 1.114-1.159x), hd 64 non-causal from 2k (32/8 2k 1.122-1.131x, 4k 1.346-1.384x, MQA 16/1 2k 1.112-1.131x), hd 64
#: causal from 2k (32/8 2k 1.067-1.074x); hd 128 causal from 8k only (32/8 8k 1.072-1.093x; 32/8 B4 2k 0.996-1.011x,
#: 64/8 4k 0.912-0.924x: one program a (kv head, key block) walks its whole group, 256 of them at 64/8 4k, and the
#: causal tiles' uneven work sets the span). Session 60, with units first in the dK / dV grids
#: (:data:`BWD_GLUON_UNITS_FIRST`) and at most 4 heads a fused GQA program (:data:`BWD_GLUON_FUSED_GQA_HEADS`):
#: hd 128 causal GQA / MQA from 1k (1.00-1.06x in five rows). Under a group split the GQA / MQA cells launch three
#: kernels, as the split route (the sum's launch casts dQ; session 59 measured four: 6.2-8.9 launch floors, and
#: session 60 6.1-8.7 with three: within host-floors' spread).
BWD_GLUON_FUSED: dict[int, dict[tuple[bool, bool], tuple[int, tuple[int, int]]]] = {
    128: {(False, False): (1024, (64, 3)), (False, True): (1024, (64, 2)), (True, False): (1024, (64, 3)),
          (True, True): (1024, (64, 2))},
    64: {(False, False): (2048, (128, 2)), (False, True): (1024, (64, 2)), (True, False): (2048, (128, 2)),
         (True, True): (2048, (64, 2))}}
#: (head dim, causal) -> the most query heads one program of a fused GQA / MQA call walks (bwd.flash_attn_bwd takes
#: the larger of :func:`fused_gqa_split`'s split and bwd.group_split's, which stays 1 once the (kv head, key block)
#: programs fill the SMs once). A fused GQA program walks its share of the group for one key block, so a causal
#: call's heaviest programs (the first key blocks) hold heads x all query tiles: at Llama-3-70B 64/8 4k, 256 programs
#: of up to 8 x 64 tile steps for 132 SMs. Its partials cost the sum's launch (which casts dQ too). Measured on an H200
#: (session 60, docs/perf/gluon-s60, the whole backward, CUDA graphs, three pairs, units first routed in both trees),
#: the fused route at hd 128 causal from 1k against the split route, without a split / with a split of 2: 64/8 4k
#: 0.932-0.975x / 1.032-1.065x, 32/8 4k 1.017-1.060x / 1.000-1.036x, B4 32/8 2k 1.007-1.050x / 0.940-0.946x, 40/8 2k
#: 1.039-1.042x / 1.037-1.049x, MQA 32/1 4k (bwd.group_split's 8 in both) 1.015-1.054x / 1.027-1.062x, 32/8 8k
#: (fused in both) 1.000-1.018x / 0.983-1.002x. So at most 4 heads a program: groups of 8 split in two, 4 not.
BWD_GLUON_FUSED_GQA_HEADS: dict[tuple[int, bool], int] = {(128, True): 4}


def fused_gqa_split(d: int, causal: bool, group: int) -> int:
    """The least group split of a fused GQA / MQA call of this head dim, mask and group (query heads a kv head): the
    fewest splits leaving :data:`BWD_GLUON_FUSED_GQA_HEADS`'s heads or fewer a program, no split without a head (1:
    the cell is not listed)."""
    heads = BWD_GLUON_FUSED_GQA_HEADS.get((d, bool(causal)))
    if not heads or group <= heads:
        return 1
    split = triton.cdiv(group, heads)
    return triton.cdiv(group, triton.cdiv(group, split))  # (as bwd.group_split: no split left without a head)


#: the configs ``FLASH_ATTN_BWD=fused`` runs wherever the kernel can (tests, probes), at any length, in a cell that
#: :data:`BWD_GLUON_FUSED` does not list (a listed cell runs its routed config at any length: what a lower routing
#: length would run, so probes time it)
BWD_GLUON_FUSED_TRY: dict[int, tuple[int, int]] = {64: (64, 2), 128: (64, 2)}
#: (head dim, causal) cells whose fused kernel adds dQ's partials through an adder warp (a fourth partition) instead
#: of the consumers' own reduces, wherever it runs (routed or ``FLASH_ATTN_BWD=fused``). Measured on an H100
#: (session 37, docs/perf/gluon-ordered-s37, the kernels alone, same run, three repeats): hd 128 non-causal
#: 1.035x / 1.054x / 1.059x at 4k / 8k / 16k over its 3 routed stages (1.06-1.14x over 2), faster in every
#: repeat; causal 1.02x / 0.97x / 0.99x and hd 64 0.98-1.01x (session 37's no-wait rows): left on the consumers.
BWD_GLUON_FUSED_ADDER: frozenset[tuple[int, bool]] = frozenset({(128, False)})
#: head dims whose causal fused kernel writes the causal mask on every tile (bwd_gluon.dkdv_launch's
#: ``mask_every_tile``: no run-time branch on the diagonal's tiles, 140 -> 88 B spilled at hd 128) wherever it runs
#: (routed or ``FLASH_ATTN_BWD=fused``). Measured on an H100 (session 39, docs/perf/gluon-hd64-s39, the kernels alone,
#: same run, two repeats, MHA): 1.060x / 1.058x at 4k, 1.080x / 1.034x at 16k; the split route's dK / dV kernel
#: 1.006-1.026x there (under the 3% bar: keeps the branch). GQA's flat walk with it: not timed.
BWD_GLUON_FUSED_MASK_EVERY_TILE: frozenset[int] = frozenset({128})
#: head dims whose fused kernel adds dQ's partials without the softmax scale (bwd_gluon.dkdv_launch's
#: ``dq_unscaled``; bwd._cast_dq multiplies the sum once) wherever it runs (routed or ``FLASH_ATTN_BWD=fused``): one
#: fp32 multiply fewer an element of every dQ partial, 32 of the hd 64 128-row tile loop's ~790 instructions a warp
#: (static SASS, session 39), spills the same or lower in every fused config's PTX. Measured on an H100 (session 40,
#: docs/perf/gluon-s40, the kernels alone at the routed configs, same run, two repeats, 4k / 16k): hd 64 non-causal
#: 1.016 / 0.992x, 1.011 / 1.007x; causal 0.996 / 0.999x, 1.009 / 0.973x; hd 128 non-causal (adder warp) 0.982 /
#: 0.994x, 0.998 / 1.012x; causal (mask on every tile) 1.020 / 1.023x, 0.997 / 1.004x: within this host's +-2-3%
#: between repeats, the 1.01-1.04x predicted not seen anywhere in both repeats: not routed.
BWD_GLUON_FUSED_DQ_UNSCALED: frozenset[int] = frozenset()
#: (head dim, causal) cells whose fused kernel's dK reads dS^T from the shared buffer dQ's wgmma reads
#: (bwd_gluon.dkdv_launch's ``ds_smem``) instead of a bf16 register copy, wherever it runs (routed or
#: ``FLASH_ATTN_BWD=fused``). Measured on an H100 (session 41, docs/perf/gluon-s41, the kernels alone at the routed
#: configs, same run, 5-6 repeats over two calls, 4k / 16k): hd 64 non-causal 1.006-1.064x (geomean 1.032) / 0.972-
#: 1.042x (1.009); hd 128 non-causal (adder warp) 1.010-1.053x (1.032) / 0.976-1.053x (1.014); hd 128 causal (two
#: repeats) 0.972-0.996x / 0.990-1.031x. Faster in every repeat at 4k non-causal, but not by the 3% bar in every
#: repeat anywhere: not routed. The whole backward through the harness (session 42, docs/perf/gluon-s42, both cells
#: routed against neither, same host, three pairs): hd 64 1.003x / 0.994x / 0.994x at 4k / 8k / 16k, hd 128 1.020x
#: (1.011-1.034 a pair) / 0.997x / 1.007x: the kernel's 3% does not reach the whole backward; stays off.
BWD_GLUON_FUSED_DS_SMEM: frozenset[tuple[int, bool]] = frozenset()
#: (head dim, causal) cells whose fused kernel's consumers issue their wgmmas without taking turns
#: (bwd_gluon.dkdv_launch's ``turns`` False; flash-attn-4's sm90 backward has none), wherever it runs (routed or
#: ``FLASH_ATTN_BWD=fused``). Measured on an H100 (session 42, docs/perf/gluon-s42, the kernel alone at the routed
#: configs against the same with turns, same run, two repeats at 4k and 16k, hd 64 causal at 8k): hd 64 causal
#: (64-row tiles, dQ by tile parity; no spill either way) 1.101x and 1.071x, and the whole backward through the
#: harness 1.088-1.119x at 8k-16k (three pairs); hd 64 non-causal 128-row tiles 0.77-0.81x (96 -> 364 B spilled;
#: 0.87-0.91x with ``ds_smem``), hd 128 non-causal (adder warp, 3 stages) 0.90-1.02x, hd 128 causal (mask on every
#: tile) 0.92-0.98x: the turns stay there (the spills grow: 128 -> 248 B, 88 -> 172 B). Session 43
#: (docs/perf/gluon-s43): hd 64 non-causal on 64-row tiles without turns (0 B spilled) 1.04-1.05x the routed 128-row
#: kernel alone at 4k over 3 stages (0.995-1.048x at 16k), whole through the harness 1.009-1.017x a pair: under the
#: bar, not routed; hd 128 causal without turns and without the mask on every tile 0.956-0.989x at 4k.
BWD_GLUON_FUSED_NO_TURNS: frozenset[tuple[int, bool]] = frozenset({(64, True)})
#: (head dim, causal) cells whose *deterministic* calls (``flash_attn_func``'s default) run the fused kernel with its
#: dQ adds in a fixed order (bwd_gluon's ordered kernel: an adder warp takes each dQ tile's turn on a counter, the
#: largest key block first, key blocks launched last first; bitwise reproducible) instead of the split kernels, on
#: MHA from :data:`BWD_GLUON_FUSED`'s length at its stages on 64-row tiles (the ordered adds' tile), the counters
#: zeroed by delta's preprocess: {(head dim, causal): shortest sequence} (at least :data:`BWD_GLUON_FUSED`'s length).
#: Measured on an H200 (session 44, docs/perf/gluon-s44; the same sm90 chip as the H100, memory 1.4x faster), the
#: deterministic call (``triton_fa_det``) through the harness against session 43's split route, same host, three
#: pairs: hd 128 non-causal 0.991-1.008x at 2k, 1.000-1.017x at 4k, 1.084-1.095x at 8k and 16k (routed from 8k);
#: hd 128 causal 0.952-0.954x at 8k, 1.022-1.049x at 16k; hd 64 causal 0.933-0.961x at 8k, 0.996-1.003x at 16k
#: (not routed). The probe's whole ordered backward against the unordered one: 0.79-0.94x at 4k, 0.89-0.99x at 16k.
#: ``FLASH_ATTN_BWD=ordered`` runs it wherever the fused kernel can, at any length, deterministic call or not
#: (tests, probes).
BWD_GLUON_FUSED_ORDERED: dict[tuple[int, bool], int] = {(128, False): 8192}
#: (head dim, causal) cells whose fused kernel (routed, ordered or ``FLASH_ATTN_BWD=fused``) takes lse and delta by
#: the loader's TMA (bwd_gluon.dkdv_launch's ``lse_tma``, where bwd_gluon.lse_tma_refused allows it), as the split
#: route's dK / dV kernel does in :data:`BWD_GLUON_LSE_TMA`'s cells. Built in session 58 (compile: hd 128 spills 104
#: -> 0 B); measured in session 59 (docs/perf/gluon-s59, H200, the whole backward through the harness, CUDA graphs,
#: three pairs against the consumers' loads, every pair gaining): MHA hd 128 4k 1.072-1.079x, H40 hd 128 2k
#: 1.081-1.090x, hd 128 causal 4k 1.039-1.063x, hd 64 4k 1.085-1.107x (prediction 1.02-1.08x). hd 64 causal and the
#: ordered kernel (deterministic calls from 8k) take it too: same kernel and GPU test, not timed apart.
BWD_GLUON_FUSED_LSE_TMA: frozenset[tuple[int, bool]] = frozenset({(64, False), (64, True), (128, False), (128, True)})
#: (kernel "dkdv" / "fused" / "dq", head dim) cells whose causal launches, one program a tile (not persistent, not
#: ordered, not windowed), put the grid's (batch, kv head, group part) units first and its key blocks second
#: (bwd_gluon.dkdv_launch's ``units_first``; hd 256's dK / dV: bwd_gluon_hd256.dkdv256_launch's; the dQ kernel,
#: bwd_gluon.dq_launch's: its (batch, query head) units first and its query blocks second, last first, since a
#: causal dQ program's work grows with its query block): the GPU starts programs in grid order as SMs free up, and
#: a causal dK / dV program's work falls with its key block, so in the default order (key blocks first) each unit's
#: heavy first blocks wait behind the earlier units' light ones. A list-scheduling model of that dispatch (session
#: 59, a program's work = its heads x query tiles, 132 SMs; benchmarks/dispatch_model.py since session 60) puts the last SM's finish at 1.59x the mean at Llama-3-70B 64/8 4k and Llama-3-8B 32/8 4k, 1.30x at
#: B4 32/8 2k and MHA B2 H16 2k, 1.14x at MHA B2 H16 4k, 1.24x at 32/8 8k; units first: 1.00-1.03x in every one.
#: Session 58's ncu run agrees at 64/8 4k causal: the split route's dK / dV kernel kept the tensor pipe 67.4% busy
#: over the SMs' active cycles but ran its 568 GFLOP in 1.369 ms, 42% of the H200's 989 TFLOP/s: the SMs were active
#: ~62% of the kernel's time on average (the model: 1 / 1.59 = 0.63; its dQ kernel: 0.90). Measured on an H200
#: (session 60, docs/perf/gluon-s60, the whole backward, CUDA graphs, three pairs): 64/8 4k causal 1.186-1.207x, 32/8
#: 4k 1.165-1.208x, B4 32/8 2k 1.060-1.082x, 32/8 8k 1.070-1.089x, MHA B2 H16 2k (fused) 1.148-1.153x; controls
#: (persistent or non-causal: the same code) 0.965-1.084x, 0.996-1.006x. Built in session 60 after the device
#: budget, not listed (benchmarks/dispatch_model.py's span over mean, blocks first -> units first): hd 256's dK / dV
#: (Gemma-2-9B B2 16/8 4k causal 1.12 -> 1.00) and the dQ kernel (hd 256 at Gemma-2's 1.16 -> 1.01; hd 128 32/8 4k
#: 1.16 -> 1.01, where it runs: deterministic causal calls from 8k, persistent below; MLA 192 / 128 H128 4k 1.04 ->
#: 1.00): runbook session 61.
BWD_GLUON_UNITS_FIRST: frozenset[tuple[str, int]] = frozenset({("dkdv", 128), ("fused", 128), ("dkdv", 64),
                                                               ("fused", 64)})
#: (kernel "dkdv" / "fused" / "dq", head dim, causal) -> the longest sequence whose Gluon dK / dV kernel (the split
#: route's), unordered fused kernel or dQ kernel (the split route's, where :data:`BWD_GLUON` runs it) runs
#: persistent (bwd_gluon.dkdv_launch's / dq_launch's ``persistent``: one program an SM over the (key block, head) or
#: (query block, head) tiles, descriptors and barriers made once a program; session 44's timeline, H200: 5-7 us
#: between two programs on an SM, 10-28% of the SMs' time at 1k, 6-18% at 2k, 1-3% at 16k). Measured on an H200
#: (session 46, docs/perf/gluon-s46; whole backward through the harness against session 45's tree, persistent nowhere,
#: same host, three pairs; a cell kept where every pair gained >= 1.5%, a route from a shorter length (the fused
#: route below) where every pair gained >= 5%, session 44's bar): fused hd 64 causal 1.17x / 1.22x / 1.08-1.10x at
#: 1k / 2k / 4k (with :data:`BWD_GLUON_FUSED` from 1k), 1.002x at 8k, 0.957x at 16k (the default grid's order wins
#: there); fused hd 128 causal 1.09-1.10x at 1k (with the fused route from 1k), 0.99x at 2k; fused hd 128 non-causal
#: (adder warp, 3 stages, 292 B spilled) 0.986x / 0.933x at 1k / 2k; fused hd 64 non-causal (128-row tiles, 196 B) not
#: routed (0.965x at 1k, 1.026x at 2k with the route from 1k). The split route's dK / dV, hd 128, deterministic call
#: (``triton_fa_det``): non-causal 1.029-1.040x / 1.022-1.044x at 1k / 2k, causal 1.042-1.050x at 1k, 1.011-1.022x at
#: 2k (stays off); GQA 40/8 non-causal 2k 1.019-1.024x, MQA 40/1 1.001-1.009x (even: kept with its cell, the table
#: is per kernel, head dim and mask). The split route's dQ, hd 128 non-causal at 4k (its Gluon kernel's shortest
#: length): GQA 32/8 1.032-1.055x, MQA 32/1 1.031-1.054x. Routed by these cells, not measured
#: themselves: GQA / MQA at 1k and causal (dK / dV), MHA deterministic calls at 4k (dQ).
#: Session 47 (H200, docs/perf/gluon-s47, against session 46's tree, three pairs): the split route's dQ hd 128
#: causal at 4k, Llama-3-70B 64/8 1.041-1.045x; hd 64 dK / dV 1k-4k with its route from 1k (see
#: :data:`BWD_GLUON_MIN_SEQLEN`). Causal launches with few tiles an SM walk them heaviest first (session 48,
#: :data:`PERSISTENT_CAUSAL_TILES_PER_SM`). Session 50: the split route's dQ, hd 128 non-causal, from 1k, persistent
#: to 2k (measured with its route from 1k: :data:`BWD_GLUON_MIN_SEQLEN`; one program a tile against persistent at 1k-2k:
#: not measured apart).
#: The probe (kernels alone, same run): hd 64 non-causal dK / dV 1.20x / 1.12x at 1k / 2k, fused 1.09x / 1.01x; hd
#: 128 causal fused 1.06x at 1k; hd 64 causal timeline: dK / dV 600 -> 432 us at 1k, fused 756 -> 556 us.
#: ``FLASH_ATTN_BWD=persistent`` runs every unordered Gluon dK / dV, fused and dQ launch of the default route
#: persistent (probes, tests).
BWD_GLUON_PERSISTENT: dict[tuple[str, int, bool], int] = {
    ("fused", 64, True): 4096, ("fused", 128, True): 1024, ("dkdv", 128, False): 2048, ("dkdv", 128, True): 1024,
    ("dq", 128, False): 2048, ("dq", 128, True): 4096,
    ("dkdv", 64, False): 4096, ("dkdv", 64, True): 4096}


#: (kernel, head dim, causal) cells of :data:`BWD_GLUON_PERSISTENT` whose persistent launches walk their tiles heaviest
#: first (bwd_gluon.PERSISTENT_ORDERS' "heavy"; the others the snake order) whatever their tiles an SM: none. Built in
#: session 47 for the causal launches whose static round-robin leaves SMs idle (sm_90a compile: the same registers,
#: spills equal or lower). Measured on an H200 (session 48, docs/perf/gluon-s48, whole backward through the harness,
#: three pairs): with many tiles an SM it loses, the tiles running together then belonging to different heads (less L2
#: reuse): MHA hd 64 causal fused 0.799-0.817x the snake at 1k-4k (31 tiles an SM), 0.943x one program a tile at 16k,
#: geomeans 0.93-0.99x at 15.5 tiles an SM (hd 128 fused pairs 0.97-1.03x); with few it wins
#: (:data:`PERSISTENT_CAUSAL_TILES_PER_SM`).
BWD_GLUON_PERSISTENT_ORDER: dict[tuple[str, int, bool], str] = {}
#: A causal launch of :data:`BWD_GLUON_PERSISTENT`'s cells on the default route with fewer than this many tiles an SM
#: walks its tiles heaviest first (bwd_gluon.PERSISTENT_ORDERS' "heavy"; :func:`persistent_causal`, called by bwd.py
#: once the group split is known): a program walks its tiles in a static round-robin, and a causal tile's work varies
#: with its key block, so with few tiles a program the snake order's unlucky SMs set the span. Measured on an H200,
#: whole backward through the harness, three pairs: session 47 (docs/perf/gluon-s47) MQA 71/1 hd 64 causal 2k (group
#: split 9: 288 dK / dV tiles, 2.2 an SM) snake persistent 0.952-0.957x the Triton dK / dV, one program a tile
#: 1.091-1.105x; session 48 (docs/perf/gluon-s48) heavy-first against one program a tile: MQA 71/1 there 1.232-1.300x
#: (split route, both calls), B4 H16 hd 64 causal 2k (7.8 tiles an SM) 1.146-1.179x, 1k (3.9; CUDA graphs: the whole
#: call is host-bound there) fused 1.32x, split 1.22x, hd 128 causal 1k 1.033-1.037x fused, 1.084-1.095x split; at 15.5
#: tiles an SM (B4 H16 4k, bound 16 against 8, CUDA graphs) heavy-first lost or tied (geomeans 0.93-0.99x the snake; hd
#: 128 fused pairs 0.97-1.03x), at 31 0.80-0.82x (:data:`BWD_GLUON_PERSISTENT_ORDER`). So the bound lay between 7.8 and
#: 15.5 tiles an SM. Session 49 (docs/perf/gluon-s49, the bound 16 against 8, CUDA graphs, three pairs): the split
#: route's dK / dV (``triton_fa_det``) gains heavy-first at 9.7 tiles an SM (B10 H16 hd 64 causal 1k)
#: 1.019-1.026x and at 11.6 (B6 H16 2k) 1.060-1.065x; the fused kernel (``triton_fa``) loses at 9.7
#: (0.937-0.939x) and ties at 11.6 (1.004-1.017x): per kernel, dK / dV's bound 12, the fused kernel's (and dQ's, not
#: measured there) 8.
PERSISTENT_CAUSAL_TILES_PER_SM: dict[str, int] = {"dkdv": 12, "fused": 8, "dq": 8}


#: Backward Gluon kernels ("dkdv": the split route's dK / dV, "fused": the fused route's, "dq": the split route's dQ)
#: whose launches take their Q / dO / K / V (and dQ accumulator) TMA descriptors made on the host, encoded by Triton's
#: launcher on every launch (bwd_gluon.dkdv_launch's / dq_launch's ``host_desc``), instead of by every program on the
#: device: session 47's timeline (H200, hd 128 non-causal 1k / 2k) put 4.0-4.1 us of a program's 4.6-5.9 us set-up
#: in its four device-made descriptors, ~10% of the SMs' time for the dK / dV kernel at 1k, 7% for the fused kernel.
#: Built in session 48 on the CPU (sm_90a compile: the same registers, shared memory and wgmmas, spills -44 to +12 B).
#: Measured on an H200 (session 49, docs/perf/gluon-s49; whole backward through the harness against session 48's tree,
#: three pairs, CUDA graphs (device time) and the whole call): the fused kernel (``triton_fa``) hd 128 non-causal
#: 1.063-1.078x at 1k, 1.013-1.061x at 2k, 1.008-1.046x at 4k; hd 64 non-causal 1.069-1.072x at 4k, 1.029-1.045x at 16k;
#: causal hd 64 1.021-1.023x at 2k, 1.040-1.067x at 8k, hd 128 1.057-1.067x at 2k, 0.994-0.999x at 8k. The split
#: route (``triton_fa_det``: dK / dV, and dQ at hd 128 from 4k then) gains where its launches are not persistent (hd 128
#: non-causal 4k 1.015-1.036x, hd 64 16k 1.008-1.014x) and ties where they are (0.984-1.025x: a persistent program
#: makes its descriptors once anyway). The host's cost: Triton's launcher encodes every descriptor on every launch,
#: ~+26 us a backward call (host-ab, two pairs, four cases: the launch path 42-84 against 33-55 us); a replay encodes
#: them once per device pointer (kernels/launcher.py, ``_Encoded``), after which the pairs read 0.95-1.26x on a noisier
#: host, and the launch path's own Python +2.1 us for four descriptors (this CPU, benchmarks/host_python.py: 3.60
#: against 1.46 us a replay).
BWD_GLUON_HOST_DESC: frozenset[str] = frozenset({"dkdv", "fused", "dq"})


def host_desc_bwd(kernel: str, d: int, dv: int) -> bool:
    """Whether the backward's Gluon ``kernel`` launch takes host-made descriptors (:data:`BWD_GLUON_HOST_DESC`;
    one q / k head-dim part: q / k = v head dims)."""
    return kernel in BWD_GLUON_HOST_DESC and d == dv


def persistent_causal(kernel: str, persistent: bool | str, tiles: int, sms: int) -> bool | str:
    """A causal launch's ``persistent`` keyword (:func:`persistent_bwd`'s) for the Gluon ``kernel``'s ``tiles`` tiles on
    ``sms`` multiprocessors: "heavy" (heaviest tiles first) on the default route with fewer than
    :data:`PERSISTENT_CAUSAL_TILES_PER_SM`'s bound of tiles an SM, else unchanged (so always under ``FLASH_ATTN_BWD``:
    forced modes, tests, probes). (Non-causal tiles are even: their launches keep the snake order.)"""
    bound = PERSISTENT_CAUSAL_TILES_PER_SM[kernel]
    if not persistent or os.environ.get("FLASH_ATTN_BWD", "") or tiles >= bound * sms:
        return persistent
    return "heavy"


def persistent_bwd(kernel: str, d: int, causal: bool, seqlen: int) -> bool | str:
    """Whether the backward's Gluon ``kernel`` ("dkdv": the split route's dK / dV kernel; "fused": the unordered fused
    one; "dq": the split route's dQ kernel) runs persistent at this q / k head dim, mask and *longer* sequence length
    (both sequences within a cell's length: the measured regime, Sq = Sk; a long key sequence under short queries
    has the many tiles a program that lost at 16k): :data:`BWD_GLUON_PERSISTENT` on the default route
    (``FLASH_ATTN_BWD`` unset; the forced modes' tests and probes run one program a tile), or
    ``FLASH_ATTN_BWD=persistent`` (everywhere). Where it does, the launch's ``persistent`` keyword: the tile order
    :data:`BWD_GLUON_PERSISTENT_ORDER` names for the cell (default route only), else True (the snake order)."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if forced:
        return forced == "persistent"
    key = (kernel, d, bool(causal))
    return seqlen <= BWD_GLUON_PERSISTENT.get(key, -1) and BWD_GLUON_PERSISTENT_ORDER.get(key, True)


def fused_bwd_cell(d: int, dv: int, gqa: bool, causal: bool, seqlen: int) -> tuple[int, int] | None:
    """The fused backward's (BLOCK_M, stages) for a dense call with these head dims, heads (``gqa``: query heads
    share kv heads), mask and shorter sequence length, by the environment (``FLASH_ATTN_BWD=fused``: the cell's
    config of :data:`BWD_GLUON_FUSED` where it lists one, else :data:`BWD_GLUON_FUSED_TRY`'s, at any length;
    ``split`` / ``atomic`` / ``gluon``: None) and
    :data:`BWD_GLUON_FUSED`; None where it does not run. The cell rule alone, before the call's own checks
    (:func:`gluon_fused_bwd`): shared with the harness's ``triton_fa`` adapter, which declares the cells it routes
    as having a nondeterministic backward."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if forced in ("split", "atomic", "gluon", "ordered") or d != dv:
        return None
    least, cfg = BWD_GLUON_FUSED.get(d, {}).get((gqa, bool(causal)), (None, None))
    if forced == "fused":
        return cfg or BWD_GLUON_FUSED_TRY.get(d)
    return cfg if cfg is not None and seqlen >= least else None


def ordered_bwd_cell(d: int, dv: int, gqa: bool, causal: bool, seqlen: int) -> tuple[int, int] | None:
    """The ordered (deterministic) fused backward's (BLOCK_M, stages) for a deterministic call with these head dims,
    heads, mask and shorter sequence length: a cell of :data:`BWD_GLUON_FUSED_ORDERED` (MHA) from its length (at
    least :data:`BWD_GLUON_FUSED`'s) at :data:`BWD_GLUON_FUSED`'s stages, 64-row tiles; ``FLASH_ATTN_BWD=ordered``:
    wherever the fused kernel has a config (:data:`BWD_GLUON_FUSED`'s, else :data:`BWD_GLUON_FUSED_TRY`'s), at any
    length; ``FLASH_ATTN_BWD=persistent``: as unset; any other forced mode: None."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if forced not in ("", "ordered", "persistent") or d != dv:
        return None
    least, cfg = BWD_GLUON_FUSED.get(d, {}).get((gqa, bool(causal)), (None, None))
    if forced == "ordered":
        cfg = cfg or BWD_GLUON_FUSED_TRY.get(d)
    elif cfg is None or gqa or seqlen < max(least, BWD_GLUON_FUSED_ORDERED.get((d, bool(causal)), 1 << 62)):
        return None
    return None if cfg is None else (64, cfg[1])


def gluon_fused_bwd(q, k, v, do, out, lse, *, causal: bool, window_left: int, window_right: int, softcap,
                    varlen: bool, fp8: bool, sm_major: int | None = None, deterministic: bool = False) -> dict | None:
    """bwd_gluon.dkdv_launch's keywords (block_m, num_stages, dq_adder: :data:`BWD_GLUON_FUSED_ADDER`, walk:
    :func:`bwd_walk`, mask_every_tile: :data:`BWD_GLUON_FUSED_MASK_EVERY_TILE`, dq_unscaled:
    :data:`BWD_GLUON_FUSED_DQ_UNSCALED`, ds_smem: :data:`BWD_GLUON_FUSED_DS_SMEM`, turns: not
    :data:`BWD_GLUON_FUSED_NO_TURNS`, lse_tma: :data:`BWD_GLUON_FUSED_LSE_TMA`) where the backward runs fused (dQ
    by TMA reduce, the atomic mode's launches around it), or None: a head dim and cell of :data:`BWD_GLUON_FUSED`
    with both sequences at least its length (:func:`fused_bwd_cell`; ``FLASH_ATTN_BWD=fused``: at any length,
    deterministic or not; ``split`` / ``atomic`` / ``gluon``: never), and :func:`gluon_bwd`'s input rules
    (bwd_gluon.fused_unsupported). ``deterministic`` (the caller asked for bitwise-reproducible gradients): the
    unordered kernel never by default (dQ's partials are added in arrival order); the ordered one in
    :func:`ordered_bwd_cell`'s cells (``ordered`` True in the answer: bwd_gluon.dkdv_launch's ``dq_order`` and
    ``last_first`` for the caller to fill); ``FLASH_ATTN_BWD=ordered``: the ordered one for every call it can take."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if varlen or q.dim() != 4:
        return None
    cell = (q.shape[-1], v.shape[-1], q.shape[2] != k.shape[2], causal, min(q.shape[1], k.shape[1]))
    ordered = forced == "ordered" or (deterministic and forced != "fused")
    cfg = ordered_bwd_cell(*cell) if ordered else fused_bwd_cell(*cell)
    if cfg is None or fp8 or softcap or window_left >= 0 or (window_right >= 0 and not causal):
        return None
    if not _on_sm90(q, sm_major) or out.shape != q.shape[:-1] + v.shape[-1:]:
        return None
    from .bwd_gluon import fused_unsupported

    if fused_unsupported(q, k, v, do, lse, lse, cfg[0]):  # (delta is made in lse's shape and layout)
        return None
    route = dict(block_m=cfg[0], num_stages=cfg[1], dq_adder=(q.shape[-1], bool(causal)) in BWD_GLUON_FUSED_ADDER,
                 walk=bwd_walk(q, k), mask_every_tile=bool(causal) and q.shape[-1] in BWD_GLUON_FUSED_MASK_EVERY_TILE,
                 dq_unscaled=q.shape[-1] in BWD_GLUON_FUSED_DQ_UNSCALED,
                 ds_smem=(q.shape[-1], bool(causal)) in BWD_GLUON_FUSED_DS_SMEM,
                 turns=(q.shape[-1], bool(causal)) not in BWD_GLUON_FUSED_NO_TURNS)
    if ordered:  # (the adder warp adds in turn whatever dq_adder says)
        route["ordered"] = True
    elif persistent := persistent_bwd("fused", q.shape[-1], causal, max(q.shape[1], k.shape[1])):  # (unordered only)
        route["persistent"] = persistent
    elif causal and ("fused", q.shape[-1]) in BWD_GLUON_UNITS_FIRST:  # (unordered, one program a tile)
        route["units_first"] = True
    if host_desc_bwd("fused", q.shape[-1], v.shape[-1]):
        route["host_desc"] = True
    if lse_by_tma(BWD_GLUON_FUSED_LSE_TMA, q, causal, lse):
        route["lse_tma"] = True
    return route


def lse_by_tma(cells: frozenset, q, causal: bool, lse) -> bool:
    """Whether a Gluon dK / dV launch (``cells``: :data:`BWD_GLUON_LSE_TMA` or :data:`BWD_GLUON_FUSED_LSE_TMA`) takes
    lse and delta by the loader's TMA: its (head dim, causal) cell listed and lse's rows on 16 bytes
    (bwd_gluon.lse_tma_refused; delta has lse's shape and strides: bwd.py's workspace, or made like lse)."""
    if (q.shape[-1], bool(causal)) not in cells or lse.dim() != 3:
        return False
    from .bwd_gluon import lse_tma_refused

    return lse_tma_refused(lse, lse) is None


#: bf16 / fp16 backward q / k head dims whose split-mode kernels run the warp-specialised Gluon ones
#: (bwd_gluon.py) on sm90: per kernel ("dq": BLOCK_N, stages; "dkdv": BLOCK_M, stages), from
#: :data:`BWD_GLUON_MIN_SEQLEN`'s length. Measured on an H100 (session 32, docs/perf/gluon-bwd-s32; each launch
#: replayed alone against its Triton twin at the Triton kernel's pinned config, CUDA events): hd 128 dK / dV at
#: 64-row tiles over 2 stages 1.08-1.27x at 1k-16k on the FA sweep and Llama-3-8B 8k / 70B 4k causal (32-row tiles
#: 0.96-1.13x); hd 128 dQ at 128-key tiles over 2 stages 1.05-1.16x from 4k (0.95-1.01x at 1k; 64-key tiles
#: 0.92-1.15x); hd 64 dK / dV 1.07x / 1.18x causal at 4k / 16k, 1.04x non-causal at 16k, 0.87-0.97x shorter; hd 64
#: dQ 0.61-0.91x everywhere (stays Triton). MLA's 192 / 128 (session 33, docs/perf/gluon-bwd-s33, against the
#: autotuned Triton kernels): dK / dV at 32-row tiles 1.46-2.10x at 512-4k and DeepSeek-V3's 128 heads at 4k (3
#: stages ahead of 2 in 7 of 10 cells, by <= 5%), dQ at 64-key tiles over 2 stages 1.14-1.35x (0.98x causal at
#: 512; 3 stages within 3%). ``FLASH_ATTN_BWD=gluon`` runs both at :data:`BWD_GLUON_TRY`'s configs wherever they
#: can, at any length (tests, probes).
BWD_GLUON: dict[int, dict[str, tuple[int, int]]] = {128: {"dq": (128, 2), "dkdv": (64, 2)}, 64: {"dkdv": (64, 2)},
                                                    192: {"dq": (64, 2), "dkdv": (32, 3)},
                                                    256: {"dq": (32, 3), "dkdv": (64, 2)}}
#: ... and only where both sequences hold at least this many tokens, by head dim, kernel and mask (False: none,
#: True: causal; a mask not listed: not routed); the shortest measured win (shorter not measured: 1k was the
#: sweep's shortest, 512 MLA's). Against the Triton kernels at their autotuned configs (the probe's --autotune):
#: hd 128 whole backward, routed, 1.01-1.02x at 1k, 1.06-1.12x at 4k, 1.17x at 16k (session 32; the autotuner
#: keeps the pinned configs there); hd 64 causal, routed (Gluon dK / dV, Triton dQ), 1.04x at 4k and 1.08x at 16k
#: (session 33; the Gluon dK / dV alone 1.07x / 1.16x); MLA both Gluon kernels 1.26-1.33x at 512, 1.48x at 1k,
#: 1.52-1.81x at 2k-4k (session 33). hd 64 non-causal stays off: session 33's autotuned run read its Gluon dK / dV
#: 0.93x / 0.94x at 4k / 16k (the 1.04x at 16k was against the pinned config); session 38 routed it from 4k on
#: 128-row tiles (:data:`BWD_GLUON_BY_MASK`). hd 64 dK / dV from 1k both masks since session 47 (H200,
#: docs/perf/gluon-s47: the whole backward through the harness against session 46's tree, Triton dK / dV below 4k,
#: three pairs), the kernel persistent to 4k (:data:`BWD_GLUON_PERSISTENT`): deterministic MHA calls non-causal
#: 1.024-1.034x / 1.029-1.040x / 1.038-1.058x at 1k / 2k / 4k, causal 1.107-1.122x / 1.108-1.120x / 1.044-1.048x;
#: GQA 32/8 non-causal 2k 1.072-1.075x, MQA 16/1 1.057-1.114x, MQA 71/1 causal 2k 1.091-1.105x one program a tile
#: (persistent 0.952-0.957x; session 48: heavy-first persistent 1.23-1.30x one program a tile,
#: :data:`PERSISTENT_CAUSAL_TILES_PER_SM`). The MHA non-causal 1k-2k pairs are under
#: session 44's 5% bar for a route from a shorter length: taken because the same cell gains 5.7-11.4% a pair on
#: the GQA / MQA calls it also routes (issue 16's shapes) and no measured call of it loses. hd 128 non-causal dQ
#: from 1k since session 50 (H200, docs/perf/gluon-s50: the whole backward through the harness, device time, against
#: session 49's tree (Triton dQ below 4k), three pairs each; the Gluon kernel persistent to 2k, with host-made
#: descriptors since session 49): GQA 40/8 2k 1.089-1.094x, MQA 40/1 2k 1.055-1.061x, MHA 40 deterministic 2k
#: 1.095-1.104x, GQA 32/8 1k 1.065-1.075x, MHA 16 deterministic 1k 1.077-1.094x (the fused route's MHA calls, which
#: have no dQ kernel: 0.997-1.011x). Causal dQ from 2k since session 51 (H200, docs/perf/gluon-s51, the same A/B
#: against session 50's tree, persistent as below 4k): GQA 32/8 B4 2k 1.054-1.074x (deterministic 1.050-1.069x), MHA
#: 32 B2 2k deterministic (split route) 1.031-1.064x, its fused route 0.999-1.012x. Causal dQ from 1k since session 52
#: (H200, docs/perf/gluon-s52, against session 51's tree, three pairs): GQA 32/8 B4 1k 1.037-1.047x (deterministic
#: 1.039-1.041x); the fused MHA route (B8 H16 1k, no dQ kernel) 0.994-0.997x. hd 64's Gluon dQ (BWD_GLUON_TRY's
#: config) from 2k, session 52, same A/B: GQA 32/8 2k 0.935-0.948x, MQA 16/1 0.935-0.942x, MQA 71/1 causal
#: 0.931-0.949x (the MHA 4k control, fused route, 0.994-1.009x): not routed. At 64-key tiles over 3 stages (session
#: 53, H200, docs/perf/gluon-s53, three pairs): 0.922-0.928x, 0.913-0.921x, 0.894-0.912x on the same cells: not routed.
#: hd 256's dQ from 1k both masks since session 54 (H200, docs/perf/gluon-s54, the whole backward against the
#: Triton dQ, three pairs): non-causal MHA B2 H16 1k 1.091-1.094x; causal GQA 16/8 B8 1k 1.072-1.074x, MHA B4 H16 2k
#: 1.069-1.075x, B2 H16/8 4k 1.023-1.037x; capped (:data:`BWD_GLUON_SOFTCAP`) above. hd 256's dK / dV
#: (bwd_gluon_hd256) from 512 both masks since session 55 (H200, docs/perf/gluon-s55, the whole backward against the
#: Triton dK / dV, the Gluon dQ in both trees from 1k; its 7 GPU tests pass): Gemma-2-9B B2 H16/8 4k causal cap 50
#: 1.511-1.556x (3.440-3.447 -> 2.211-2.277 ms, three pairs), MHA B2 H16 1k non-causal 1.304-1.313x, B4 H16 2k
#: causal 1.496-1.516x (three pairs); B8 H16 512 non-causal 1.228-1.230x, causal 1.318-1.330x (two pairs each).
BWD_GLUON_MIN_SEQLEN: dict[int, dict[str, dict[bool, int]]] = {
    128: {"dq": {False: 1024, True: 1024}, "dkdv": {False: 1024, True: 1024}},
    64: {"dkdv": {False: 1024, True: 1024}},
    192: {"dq": {False: 512, True: 1024}, "dkdv": {False: 512, True: 512}},
    256: {"dq": {False: 1024, True: 1024}, "dkdv": {False: 512, True: 512}}}
#: the configs ``FLASH_ATTN_BWD=gluon`` runs (tests, probes): hd 64 / 128 as routed (hd 64's dQ, never routed, at
#: hd 128's); MLA's 192 / 128 dK / dV at 32-row tiles over 2 stages (32 / 36 B spilled; 64-row tiles spill 1176 B
#: and serialise their wgmmas), dQ at 64-key tiles over 3 stages (no spill, 205 KiB; 128-key tiles would hold S and
#: dP at 64 + 64 registers beside dQ's 96): the routed MLA configs' neighbours, so tests cover both. hd 256 (Gemma-2;
#: built in session 53, routed by :data:`BWD_GLUON` since session 54): the dQ kernel alone
#: (bwd_gluon.DQ_HEAD_DIMS; dK / dV stay on the Triton kernel) at 32-key tiles over 3 stages (224 KiB: Q and dO 64
#: KiB each, 32 KiB a stage; sm_90a with host-made descriptors: no spill uncapped, 20 B causal softcapped, 0 B
#: non-causal; 64-key tiles over 2 stages would need 256 KiB). hd 256's dK / dV (bwd_gluon_hd256: a program's 64
#: keys shared by both consumers, the head dim split between them, 64-row query tiles over 2 stages, 208 KiB; built in
#: session 54, routed as tried since session 55: sm_90a with its host-made descriptors 144 B spilled non-causal, 376 B
#: causal, capped 212 / 448 B).
BWD_GLUON_TRY: dict[int, dict[str, tuple[int, int]]] = {64: {"dq": (128, 2), "dkdv": (64, 2)},
                                                        128: {"dq": (128, 2), "dkdv": (64, 2)},
                                                        192: {"dq": (64, 3), "dkdv": (32, 2)},
                                                        256: {"dq": (32, 3), "dkdv": (64, 2)}}
_BWD_GLUON_KEYS = {"dq": ("block_n", "num_stages"), "dkdv": ("block_m", "num_stages")}
#: (head dim, kernel, causal) -> (shortest sequence, config): the config a routed kernel of :data:`BWD_GLUON` runs with
#: that mask, from that length on, instead of its own (below it, where :data:`BWD_GLUON_MIN_SEQLEN` routes the kernel at
#: all: its own config, GQA / MQA too). hd 64 non-causal dK / dV on 128-row tiles over 2 stages (12 B spilled; causal
#: 440 B, and slower), from 4k (the kernel's own shortest routed length): measured on an H100 (session 38,
#: docs/perf/gluon-hd64-s38, the kernels alone, against the autotuned Triton dK / dV in the same runs, two calls x best
#: of two): 1.035x / 1.037x at 4k, 1.060x / 1.052x at 16k (0.97x at 2k); the 64-row tiles 0.92-0.98x (128 rows ahead of
#: 64 by 1.05-1.14x in each cell); causal 128-row 0.82-0.94x (stays 64). The whole backward with the route (session 39,
#: docs/perf/gluon-hd64-s39, against the autotuned Triton backward, two repeats): 0.991x / 1.028x at 4k, 1.144x / 0.970x
#: at 16k, a host whose hd 64 16k cells moved 8% between repeats (the kernel alone 1.02-1.20x the 64-row tiles in the
#: same run): not settled either way. Measured on MHA only: GQA / MQA calls of these cells are not routed (the Triton
#: kernel; a group's loops make the 128-row kernel spill 212 B nested, 120 B flat, against MHA's 12 B).
BWD_GLUON_BY_MASK: dict[tuple[int, str, bool], tuple[int, tuple[int, int]]] = {(64, "dkdv", False): (4096, (128, 2))}
#: (head dim, causal) cells whose routed Gluon dK / dV kernel (:data:`BWD_GLUON`) issues its consumers' wgmmas
#: without turns (bwd_gluon.dkdv_launch's ``turns`` False). Measured on an H100 (session 42, docs/perf/gluon-s42,
#: the kernel alone at 64-row tiles over 2 stages against the same with turns, same run, two repeats, 4k / 16k):
#: non-causal hd 64 1.081, 1.086x / 1.090, 1.049x, hd 128 1.031, 1.058x / 1.084, 1.025x; causal 0.93-0.99x (stays
#: turned). The one routed cell it could take, hd 128 non-causal below the fused route's 4k (and every deterministic
#: call), measured whole through the harness at 1k / 2k (three pairs): 1.028, 1.034, 0.992x / 1.032, 1.014, 1.003x,
#: under the 2%-every-pair bar: not routed. Session 43 (docs/perf/gluon-s43): the deterministic backward
#: (``triton_fa_det``) with it at hd 128 non-causal, whole: 0.977 / 1.040x at 2k, 0.998 / 1.001x at 8k; hd 64
#: non-causal's routed 128-row tiles without turns 0.43-0.46x alone (12 -> 788 B spilled), MLA's 32-row ones
#: 0.90-0.96x (48 -> 40 B).
BWD_GLUON_NO_TURNS: frozenset[tuple[int, bool]] = frozenset()
#: (head dim, causal) cells whose routed Gluon dK / dV kernel (:data:`BWD_GLUON`) takes each query tile's lse and delta
#: rows by the loader warp's TMA with its Q and dO tiles (bwd_gluon.dkdv_launch's ``lse_tma``), where lse allows it
#: (bwd_gluon.lse_tma_refused: seqlen_q a multiple of 4 for the forward's lse), instead of the consumers' own loads.
#: Session 58's ncu source page (H200, GQA 40/8 2k hd 128 and a 64/8 4k causal) had the consumers waiting on those
#: loads after their S^T wgmma (long-scoreboard stalls on lse's first use, ~7% of the kernel's samples); the sm_90a
#: compile spills less with it (hd 128 non-causal 76 -> 0 B, persistent 104 -> 8, causal 188 -> 0, capped 440 -> 216,
#: windowed 224 -> 4; MLA 48 / 68 -> 0; hd 64 128-row 12 -> 0; hd 64's routed 64-row tiles none either way). Measured on an H200 (session 58, docs/perf/gluon-s58: the whole
#: backward through the harness, CUDA graphs, three pairs against the consumers' loads, every pair gaining):
#: GQA 40/8 2k hd 128 1.061x, 64/8 4k causal 1.073x, Llama-3-8B B4 2k causal 1.082x, GQA 32/8 2k hd 64 1.147x, MQA
#: 16/1 2k hd 64 1.075x, B2 H16 2k capped at 30 1.036x, DeepSeek-V3's MLA 4k causal 1.026x, GQA 32/8 2k hd 64 causal
#: 1.023x, Falcon's 71/1 2k causal 1.048x; MHA hd 128 4k (the fused route: unchanged) 1.004x. hd 256's own dK / dV
#: kernel (bwd_gluon_hd256; compile spills 144 -> 32 B, capped causal 448 -> 168 B) from session 59 (same method, two
#: backends, six pairs each): Gemma-2-9B's B2 16/8 4k causal capped 1.055-1.079x, hd 256 MHA B2 2k 1.004-1.018x.
BWD_GLUON_LSE_TMA: frozenset[tuple[int, bool]] = frozenset({(64, False), (64, True), (128, False), (128, True),
                                                           (192, False), (192, True), (256, False), (256, True)})

#: q / k head dims whose Gluon dK / dV kernels (split route's and fused) walk a GQA / MQA program's (query head, query
#: tile) steps in one flat loop (bwd_gluon._walk_bounds' walk 1) instead of heads outside, tiles inside: with a group
#: (not specialised to 1 by Triton as MHA's is) the nested loops spill 532 B (dK / dV, causal) / 684 B (fused) at hd
#: 128, the flat one 180 / 152 B. Measured on an H100 (session 37, docs/perf/gluon-ordered-s37/gqa-walks.md, kernels
#: alone, same run, best of three): dK / dV 1.06x / 1.12x on Llama-3-8B (8k) / 70B (4k) causal, 1.06x on Llama-3-8B
#: non-causal; fused 1.47x / 1.51x; MHA keeps the nested loops (flat 0.96-0.97x there).
BWD_GLUON_FLAT_WALK = frozenset({128})
#: q / k = v head dims whose Gluon dK / dV kernel (the split route's, bwd_gluon's ``split_sum``) sums a GQA / MQA
#: call's group split itself: each warp of a consumer counts its 16 stored key rows in a zero-at-rest counter
#: (launcher.counters) and the last of the split's parts to arrive adds the fp32 partials in split order (the same
#: bits as bwd._sum_partials) and writes dK / dV, instead of the backward's third launch. Built in session 57 for the
#: launch path's one cell over issue 16's 50 us (MQA 16/1 hd 64 2k: 55-60 us, 7.0-8.2 replayed launches against the
#: others' 5.5-7.4; session 56). Prediction: that cell's host time down one launch (~5-8 us), its device time within
#: +-2%. Measured (H200, docs/perf/gluon-s57, the whole backward through the harness against the separate sum, three
#: pairs; its GPU tests pass: the same bits, counters back at 0 across calls and graph replays): MQA 16/1 hd 64 2k
#: 0.839-0.849x (0.255 -> 0.301 ms), Falcon's 71/1 causal 2k 0.801-0.816x (0.411 -> 0.508); unsplit controls 1.00x.
#: The prediction was wrong: the last part's sum is one warp's latency-bound loop over the split's partials (8 x
#: 2 loads of 4 KB a warp, each waiting on L2) at the end of a tile, where the separate launch spreads the same reads
#: over every SM. sm_90a compile: hd 64 persistent 40 B spilled non-causal, 160 B causal (0 B without). Not routed:
#: the launch it saves is ~6 us of host time, the device time it costs 46-97 us. Empty.
BWD_GLUON_SPLIT_SUM: frozenset[int] = frozenset()


#: Causal calls with a sliding window on the left on the split route's Gluon kernels (dK / dV and dQ, wherever
#: :data:`BWD_GLUON` routes the window's head dim and length), one program a tile (bwd_gluon's ``window_left``: a dK /
#: dV program's query tiles end at the last that sees its keys, a dQ program's key blocks start at the first its
#: first row sees, the tiles crossing a window edge masked); off: the Triton backward (which skips the same blocks).
#: Built in session 51 on the CPU (sm_90a: the windowless configs' wgmmas and partitions' registers, shared memory +16
#: B; spills hd 128 GQA flat walk 180 -> 196 B, MHA 184 -> 224 B, hd 64 and dQ none, MLA dK / dV 68 -> 76 B).
#: Prediction (the models table's Mistral row, B1 H32/8 8k causal, window 4095, backward 3.09 ms on the Triton
#: kernels): ~0.75 of the windowless Gluon causal backward's 3.41 ms, ~2.55-2.7 ms (1.15-1.2x). Measured in session 52
#: (H200, docs/perf/gluon-s52; its 8 GPU tests against the oracle pass): Mistral 3.11-3.16 -> 2.63-2.67 ms,
#: 1.175-1.202x a pair (deterministic 1.175-1.180x); B2 H32/8 4k window 1023 1.177-1.193x; the models table 2.635 ms,
#: 0.74x flash-attn-4. On.
BWD_GLUON_WINDOW = True
#: Head dims whose softcapped calls (Gemma-2's 50) run the split route's Gluon kernels where :data:`BWD_GLUON` (or
#: ``FLASH_ATTN_BWD=gluon``) routes them (their ``SOFTCAP``: P recomputed through the hardware's tanh as the Gluon
#: forward capped the scores, dS through the cap's slope), at :data:`BWD_GLUON_SOFTCAP_CONFIGS`' configs where it
#: lists one (hd 256's dK / dV: bwd_gluon_hd256's kernel; bwd_gluon's dK / dV kernel takes the cap since session 55).
#: Built in session 53 on the CPU (sm_90a, hd 256 at 32-key tiles: uncapped PTX unchanged but the new argument;
#: capped 20 B spilled causal, 0 B non-causal, 12 B persistent; hd 128's 128-key tiles spill 552 B capped: not
#: listed). Prediction for Gemma-2-9B's backward (B2 H16/8 4k causal, cap 50; 3.66 ms
#: on the Triton kernels, flash-attn-4 2.18): with ``BWD_GLUON[256] = {"dq": (32, 3)}`` from 1k, the dQ kernel ~1.3x
#: its Triton twin, the whole backward 1.05-1.12x. Measured in session 54 (H200, docs/perf/gluon-s54, whole backward
#: through the harness against the Triton dQ, three pairs; its 6 GPU tests against the oracle pass): Gemma-2's row
#: 3.669-3.690 -> 3.441-3.442 ms, 1.066-1.072x; B4 H16/8 2k causal capped 1.079-1.088x; the models table 3.436 ms,
#: 0.65x flash-attn-4 (was 0.59x). On at hd 256. hd 128 (:data:`BWD_GLUON_SOFTCAP_CONFIGS`, session 55) measured in
#: session 56 (H200, docs/perf/gluon-s56, whole backward against the Triton capped one, three same-call pairs; its 7
#: GPU tests pass): B2 H32/16 4k causal cap 50 (Gemma-2-27B's global layers) 1.410-1.418x (2.95 -> 2.09 ms); its
#: local layers (8k, window 4095) 1.337-1.355x (4.06 -> 3.02 ms); B2 H16 2k non-causal cap 30 1.392-1.404x (two
#: pairs; 0.684 -> 0.489 ms). Prediction 1.10-1.30x. On at hd 128 and 256.
BWD_GLUON_SOFTCAP: frozenset[int] = frozenset({128, 256})
#: (head dim, kernel, causal) -> the config a softcapped call's split kernel takes where it is not :data:`BWD_GLUON`'s
#: (or :data:`BWD_GLUON_TRY`'s). hd 128 (Gemma-2-27B's 32 / 16, Grok-1's cap 30; built in session 55 on the CPU,
#: listed in :data:`BWD_GLUON_SOFTCAP` since session 56 measured it): sm_90a with host-made descriptors, the dQ kernel
#: at 64-key tiles over 3 stages 0 B spilled capped, both masks, persistent too (the routed 128-key tiles over 2 stages:
#: 552 B); the dK / dV kernel at its routed 64-row tiles 120 B non-causal (uncapped 76), 440 B causal (188; 272 with the
#: mask on every tile, a GQA flat walk 412, persistent 572, windowed 552), so causal at 32-row tiles: 0 B (persistent
#: 32, windowed and a GQA flat walk 0; session 32 measured the uncapped 32-row tiles 0.96-1.13x the Triton kernel
#: against the 64-row tiles' 1.08-1.27x). Prediction for the whole capped backward against the Triton one (B2 H32/16 4k
#: causal, cap 50: Gemma-2-27B's global layers; the Triton backward's B2 H16 4k causal capped ran at ~245 TFLOP/s in
#: session 54, the uncapped Gluon split route ~350 on Llama-3-70B's 4k causal row): 1.10-1.30x, the cap's tanh one MUFU
#: operation a score element beside exp2's (~0.125 cycles an element against ~0.31 for the five matmuls at hd 128).
BWD_GLUON_SOFTCAP_CONFIGS: dict[tuple[int, str, bool], tuple[int, int]] = {
    (128, "dq", False): (64, 3), (128, "dq", True): (64, 3), (128, "dkdv", True): (32, 2)}


def bwd_walk(q, k) -> int:
    """bwd_gluon.dkdv_launch's ``walk`` for these inputs ([B, S, H, D]): 1 (one flat loop) for a GQA / MQA group at a
    head dim of :data:`BWD_GLUON_FLAT_WALK`, else 0."""
    return int(q.shape[2] != k.shape[2] and q.shape[-1] in BWD_GLUON_FLAT_WALK)


def gluon_bwd(q, k, v, do, out, lse, *, causal: bool, window_left: int, window_right: int, softcap, varlen: bool,
              fp8: bool, atomic: bool, sm_major: int | None = None) -> dict:
    """Kernel name ("dq", "dkdv") -> bwd_gluon.dq_launch's / dkdv_launch's keywords (dK / dV's walk:
    :func:`bwd_walk`; turns False in :data:`BWD_GLUON_NO_TURNS`' cells) for the backward's kernels
    that run on the Gluon ones; empty where both run the Triton ones: a head dim and kernel of :data:`BWD_GLUON`
    with both sequences at least :data:`BWD_GLUON_MIN_SEQLEN` long (or any of :data:`BWD_GLUON_TRY` with
    ``FLASH_ATTN_BWD=gluon``; ``FLASH_ATTN_BWD=split`` keeps the Triton ones), the split mode, dense bf16 / fp16
    inputs the kernels take (bwd_gluon.unsupported: their head-dim pairs, TMA-readable rows, lse [B, Hq, Sq]),
    causal or no mask (with :data:`BWD_GLUON_WINDOW`, causal with a window on the left too: then one program a tile,
    ``window_left`` among the keywords), no softcap (at a head dim of :data:`BWD_GLUON_SOFTCAP`, a softcap too:
    ``softcap`` among both kernels' keywords, their configs :data:`BWD_GLUON_SOFTCAP_CONFIGS`' where it lists one),
    an sm90 GPU (not the interpreter). hd 256's dK / dV runs
    bwd_gluon_hd256's kernel: its keywords ``num_stages`` alone (and ``softcap``), no window. A causal dK / dV
    or dQ launch that is neither windowed nor persistent takes ``units_first`` in :data:`BWD_GLUON_UNITS_FIRST`'s
    cells.
    ``sm_major``: as :func:`gluon_ws_fwd`'s."""
    forced = os.environ.get("FLASH_ATTN_BWD", "")
    if forced in ("split", "atomic"):  # the Triton kernels, as asked
        return {}
    if atomic:  # the fused backward's kernel where it runs (the caller's atomic mode), else the Triton one
        fused = gluon_fused_bwd(q, k, v, do, out, lse, causal=causal, window_left=window_left,
                                window_right=window_right, softcap=softcap, varlen=varlen, fp8=fp8, sm_major=sm_major)
        return {} if fused is None else {"fused": fused}
    tried = forced == "gluon"
    cfg = (BWD_GLUON_TRY if tried else BWD_GLUON).get(q.shape[-1])
    if cfg and not tried:
        least = BWD_GLUON_MIN_SEQLEN.get(q.shape[-1], {})
        seqlen = min(q.shape[1], k.shape[1]) if q.dim() == 4 else 0
        gqa = q.dim() == 4 and q.shape[2] != k.shape[2]
        mask_cfg = {name: BWD_GLUON_BY_MASK.get((q.shape[-1], name, bool(causal)), (float("inf"), None))
                    for name in cfg}
        mask_cfg = {name: c for name, (from_len, c) in mask_cfg.items() if seqlen >= from_len}
        cfg = {name: mask_cfg.get(name, c) for name, c in cfg.items()
               if seqlen >= least.get(name, {}).get(bool(causal), float("inf"))  # a mask not listed: not routed
               and not (gqa and name in mask_cfg)}  # (the by-mask configs: MHA only)
    window = window_left >= 0 and causal and BWD_GLUON_WINDOW
    wide = q.shape[-1] == 256  # (hd 256's dK / dV: bwd_gluon_hd256's kernel, with a softcap, without a window)
    if cfg and softcap:  # (both split kernels take a softcap, some at their own configs)
        cfg = ({n: BWD_GLUON_SOFTCAP_CONFIGS.get((q.shape[-1], n, bool(causal)), c) for n, c in cfg.items()}
               if q.shape[-1] in BWD_GLUON_SOFTCAP else {})
    if cfg and wide and window_left >= 0:
        cfg = {n: c for n, c in cfg.items() if n != "dkdv"}
    if not cfg or atomic or varlen or fp8 or (window_left >= 0 and not window) or (
            window_right >= 0 and not causal):
        return {}
    if not _on_sm90(q, sm_major) or out.shape != q.shape[:-1] + v.shape[-1:]:
        return {}
    from .bwd_gluon import unsupported

    if unsupported(q, k, v, do, lse, lse, "dkdv" if "dkdv" in cfg and not wide else "dq"):  # (delta in lse's layout;
        # hd 256's dK / dV kernel: the dQ kernel's rules)
        return {}
    out = {name: dict(zip(_BWD_GLUON_KEYS[name], c)) for name, c in cfg.items()}
    for keywords in out.values() if softcap else ():
        keywords["softcap"] = float(softcap)
    if "dkdv" in out:
        out["dkdv"]["walk"] = bwd_walk(q, k)
        if (q.shape[-1], bool(causal)) in BWD_GLUON_NO_TURNS:
            out["dkdv"]["turns"] = False
        if lse_by_tma(BWD_GLUON_LSE_TMA, q, causal, lse):
            out["dkdv"]["lse_tma"] = True
    longer = max(q.shape[1], k.shape[1])  # (dense: varlen calls returned above)
    for name, keywords in out.items():  # (the split route's dQ and dK / dV launches)
        if window:  # (the persistent kernels have no window: one program a tile)
            keywords["window_left"] = window_left
        elif persistent := persistent_bwd(name, q.shape[-1], causal, longer):
            keywords["persistent"] = persistent
        elif causal and (name, q.shape[-1]) in BWD_GLUON_UNITS_FIRST:  # (hd 256's dK / dV too, below)
            keywords["units_first"] = True
        if host_desc_bwd(name, q.shape[-1], v.shape[-1]):
            keywords["host_desc"] = True
    if wide and "dkdv" in out:  # (bwd_gluon_hd256.dkdv256_launch: 64-row tiles, its descriptors made on the host)
        out["dkdv"] = ({"num_stages": cfg["dkdv"][1]} | ({"softcap": float(softcap)} if softcap else {})
                       | {key: True for key in ("lse_tma", "units_first") if out["dkdv"].get(key)})
    return out


def autotuned(space, prune, reset_to_zero=None):
    """Decorator: autotune over `space` cut by `prune`, keyed on TUNE_KEY (+ dtypes). The winner
    of each key is kept in Triton's cache directory (cache_results): another process on the same
    machine (the acceptance check's baseline child, the next run) reuses it instead of timing every
    config again (9-46 s per new shape on the H100)."""
    return triton.autotune(configs=space, key=TUNE_KEY, prune_configs_by={"early_config_prune": prune},
                           do_bench=_tune_bench, reset_to_zero=reset_to_zero, cache_results=True)


def launch(raw_kernel, tuned_kernel, space, prune, grid_of, kwargs, options=None):
    """Run a kernel three ways: interpreter (one small config), untuned (the filter's first pick),
    or autotuned (Triton times the pruned configs once per key and caches the winner).
    grid_of(BLOCK_M, BLOCK_N[, TILES]) -> grid (TILES passed where the config has it: the forward's).
    kwargs: every kernel argument except the tuned meta-params; options: Triton launch options (the
    forward's launch_pdl), not under the interpreter.
    Returns the :class:`kernels.launcher.Launch` that replays this launch for the same call
    signature (None under the interpreter)."""
    if interpreting():
        bm, bn = INTERPRET_BLOCK_M, INTERPRET_BLOCK_N
        raw_kernel[grid_of(bm, bn)](**kwargs, BLOCK_M=bm, BLOCK_N=bn, USE_TMA=INTERPRET_USE_TMA)
        return None
    launcher.ensure_allocator()
    if not tuning_enabled():
        cfg = prune(space, {}, **kwargs)[0]
        grid = grid_of(*_grid_meta(cfg.kwargs))
        cap = {"maxnreg": cfg.maxnreg} if getattr(cfg, "maxnreg", None) else {}  # (FWD_MAXNREG's experiments)
        compiled = raw_kernel[grid](**kwargs, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cap,
                                    **(options or {}))
    else:
        compiled = tuned_kernel[lambda meta: grid_of(*_grid_meta(meta))](**kwargs, **(options or {}))
        cfg = tuned_kernel.best_config
        grid = grid_of(*_grid_meta(cfg.kwargs))
    return launcher.launched(raw_kernel, compiled, grid, kwargs, cfg)


def _grid_meta(meta) -> tuple:
    """grid_of's arguments from a config's (or the autotuner's) meta-parameters."""
    if "TILES" in meta:
        return meta["BLOCK_M"], meta["BLOCK_N"], meta["TILES"]
    return meta["BLOCK_M"], meta["BLOCK_N"]
