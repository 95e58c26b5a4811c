"""Launch configurations for the linear-attention chunk kernels, and why each limit is what it is.

Every number that shapes a launch lives here. The kernels keep the running state S ([K, BV] fp32)
in registers for the whole sequence walk, so the register file, not shared memory, is the first
limit; shared memory holds the (pipelined) q/k/v/do tiles the tensor cores read.
"""
from __future__ import annotations

import os

import triton

# Dimensions the kernels are written for: powers of two so that tiles need no masking along K/V,
# and at least 32 so a tile feeds the tensor cores (tl.dot needs every dimension >= 16).
SUPPORTED_DIMS = (32, 64, 128, 256)
# Chunk sizes: tl.dot needs >= 16 rows; 128 rows of [128, K] tiles already overflow registers at K=256.
SUPPORTED_CHUNKS = (16, 32, 64, 128)
# Past this many state elements per program (fp32 in registers) the backward walk splits V into
# blocks: 128 x 128 fp32 over 8 warps is 64 registers a thread, the most that still leaves room for
# the q/k/v/do tiles and the two [BT, BT] score blocks without spilling.
MAX_STATE_ELEMS = 128 * 128
# H100 / H200 allow 227 KiB of shared memory per block; keep a margin for Triton's own scratch
# (layout conversions, reductions), which the estimate below does not model.
SMEM_BUDGET = 200 * 1024

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# fp32 inputs on the GPU: "ieee" (fp32 FMA, the products an fp32 reference makes). "tf32x3" (three
# tf32 MMAs, ~2^-21 relative a product, 8x fp32's rounding) kept the tensor cores, but the first GPU
# fp32 run (session 3, H100) failed the fp32 tolerance at strong decay: final state 12x, dk 9.7x the
# eager fp32 reference's error (allowed 3-4x). "ieee" spills (ptxas: 0.7-8 KB a thread forward,
# 30-70 KB backward): fp32 is for correctness here, not speed (the speed targets are fp16/bf16).
FP32_DOT_PRECISION = "ieee"

# Autotune search on the GPU (off: the default configs below, no search; for quick correctness runs).
# Read at every launch, so a script may flip it.
AUTOTUNE = os.environ.get("KERNELS_LINEAR_ATTN_AUTOTUNE", "1") == "1"


def internal_chunk(chunk_size: int, K: int, V: int) -> int:
    """Rows per tile. The result does not depend on it (only rounding does); at K or V = 256 a
    64-row chunk's [64, 256] q/k/do tiles and [256, BV] state leave no registers, so use 32."""
    return min(chunk_size, 32) if max(K, V) >= 256 else chunk_size


def _smem_bytes(BT: int, KD: int, BV: int, elt: int, stages: int, extra_tiles: int) -> int:
    # q, k ([BT, KD]) and v (and do for the backward: extra_tiles) [BT, BV] per pipeline stage,
    # plus the [BT, BT] score block and the state operand staged for the tensor cores.
    per_stage = (2 * BT * KD + (1 + extra_tiles) * BT * BV) * elt
    return stages * per_stage + BT * BT * elt + KD * BV * elt


def prune_by_resources(configs, named_args, **kwargs):
    """Autotune pruning of the forward: drop configs that cannot fit; keeps at least one (the smallest)."""
    a = {**named_args, **kwargs}
    KD, BT = a["KD"], a["BT"]
    elt = a["q"].element_size()
    ok = []
    for c in configs:
        BV = c.kwargs.get("BV", a.get("BV"))
        if BV is None or BV > a["VD"]:
            continue
        # the fp32 state [KD, BV] in registers; ptxas for sm_90a (benchmarks/ptxas_report.py): spill-free
        # up to 128 x 64 elements and 64 a thread (4 warps at 128 x 64: 255 regs, 0 spill); 128 x 128
        # (8 warps) and 256 x 64 spill 4-576 bytes a thread
        if KD * BV > 128 * 64 or KD * BV / (32 * c.num_warps) > 64:
            continue
        if BT * BT / (32 * c.num_warps) > 64:  # the [BT, BT] score block: BT=128 needs 8 warps
            continue
        if _smem_bytes(BT, KD, BV, elt, max(c.num_stages, 1), 0) > SMEM_BUDGET:
            continue
        ok.append(c)
    if not ok:
        ok = [min(configs, key=lambda c: (c.kwargs.get("BV", 0), c.num_stages))]
    return ok


def _fwd_list():
    # (BV, warps, stages). Every one spill-free at K = V = 64 and 128 on sm_90a with its loads
    # pipelined (benchmarks/ptxas_report.py, table in docs/perf/linear_attn.md). BV = V (one program
    # per head: q, k read once, as FLA's fused kernel) against BV = V/2 (twice the programs, q and k
    # read twice, the second time from L2); 3-4 stages keep 2-3 chunks of loads in flight.
    # (BV = 128 is not listed: a [128, 128] state spills at any K >= 128, prune_by_resources drops it)
    return [(32, 4, 2), (32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3),
            (32, 8, 3)]


def fwd_configs():
    """Forward walk: BV (state columns per program), warps, pipeline depth. More V blocks mean more
    programs (B*H*V/BV) to fill 132 SMs, at the price of re-reading q and k once per block (from L2
    when the blocks of one head run together, which adjacent program ids make likely)."""
    return [triton.Config({"BV": BV}, num_warps=w, num_stages=s) for BV, w, s in _fwd_list()]


#: The backward's searched (warps, stages); bwd_configs says why there is no 1-stage config.
BWD_WARPS_STAGES = ((8, 2), (4, 2))


def bwd_configs():
    """Backward (dq walk + dk/dv walk in one launch): BV is fixed by the launcher (it sizes the
    partial-dk buffer), so only warps and pipeline depth are searched."""
    # 16 warps cap a thread at 128 registers: 136-1008 bytes of spill in every plan (ptxas_report.py).
    # No num_stages=1: on the H100 (Triton 3.6) it faults with an illegal memory access at some
    # shapes with K != V (found by the fuzzer, session 10; benchmarks/la_crash_probe.py: K32 V128 at
    # 8 warps, K64 V128 and K128 V32 with the 32-wide split), and it was never the fastest (D=64:
    # 4 w 1 s 0.508 / 8 w 1 s 0.606 ms against 0.473 / 0.541 at 2 stages, docs/perf/linear_attn.md).
    return [triton.Config({}, num_warps=w, num_stages=s) for w, s in BWD_WARPS_STAGES]


def prune_bwd(configs, named_args, **kwargs):
    """The fused walk holds dS [K, V] and two [BT, BT] blocks in fp32. At 64 x 64, 4 warps spill 16-112
    bytes a thread (benchmarks/ptxas_report.py) but fit 2 programs an SM: session 3 dropped them and
    fwd+bwd went from 1.54 to 2.10 ms (T=16k, docs/perf/linear_attn.md), so they stay; past 64 x 64
    (never planned: bwd_plan splits) 8 only. The split walks are spill-free at 4 and 8 warps."""
    a = {**named_args, **kwargs}
    big_fused = not a["SPLIT"] and a["K"] * a["V"] > 64 * 64
    ok = [c for c in configs if c.num_warps == 8 or not big_fused]
    return ok or configs[:1]


def bwd_plan(K: int, V: int, BT: int = 64) -> dict:
    """How the backward splits its state among programs (fixed before launch: the grid and the
    kernel's branches depend on it, so autotune searches warps and stages only).
    SPLIT=0: one dk+dv walk per head holding all of dS [K, V]; only for K, V <= 64
    (ptxas at 128 x 128: 255 registers and 1.8-3 KB of spill a thread at 8 or 16 warps).
    SPLIT=1: a dv walk per V block (dS[:, BV]) and a dk walk per K block (dS[BKD, :]), each
    complete (no partial sums to add up), at the price of computing dS twice.
    BK: dq's columns per dq walk (state S^T [V, BK]); 64 keeps it at most 128 x 64."""
    if PLAN_OVERRIDE is not None:
        return dict(PLAN_OVERRIDE)
    if K <= 64 and V <= 64 and BT <= 64:  # (K, V) = (128, 32) fused: 1.1 KB spill (ptxas); BT=128: 440 B
        return {"SPLIT": False, "BV": V, "BKD": K, "BK": K}
    blk = 64 if max(K, V) <= 128 and BT <= 64 else 32
    return {"SPLIT": True, "BV": min(V, blk), "BKD": min(K, blk), "BK": min(K, blk)}


# The benchmark sets these to compare launch choices in one process: PLAN_OVERRIDE a dict like
# bwd_plan's result; CONFIG_OVERRIDE {"fwd": {"BV", "num_warps", "num_stages"}, "bwd": {"num_warps",
# "num_stages"}} (either key) launches that config instead of autotuning.
PLAN_OVERRIDE = None
CONFIG_OVERRIDE = None
# Forward state update with a decay: scale the values (True) or the keys (False) by the decay to the
# chunk's end before k^T v. Same arithmetic; which is faster is measured (docs/perf/linear_attn.md).
FWD_DECAY_V = True
# Tiles through tensor descriptors (TMA, sm_90+; older GPUs keep block pointers) instead of block
# pointers (cp.async), in the forward and in the backward's walks (chunk._rows says what changes).
# Forward, K=V=64, H100 (session 5 sweep, docs/perf/linear_attn.md): 0.366 ms instead of 0.428 at
# T=16k bf16 (best config of each), 0.107 instead of 0.116 at 4k. Backward (fwd+bwd rows, 4 warps
# 2 stages, bf16 T=16k): 1.398 ms instead of 1.476 at K=V=64, 3.622 instead of 3.857 at 128.
FWD_TMA = True
BWD_TMA = True
# ... for K and V up to this: measured at 64 and 128; at 256 (32-row chunks) ptxas reports more
# spill with descriptors than without (bf16: forward 4 warps 84 B instead of 0, backward 8 warps
# 476 B instead of 0; benchmarks/ptxas_report.py --tma), so 256 keeps block pointers.
TMA_MAX_DIM = 128


def knobs_key() -> tuple | None:
    """The module knobs a launch depends on, for the call signatures replayed launches are keyed on
    (kernels/launcher.py); None while a benchmark overrides the plan or the config (no replays)."""
    if PLAN_OVERRIDE is not None or CONFIG_OVERRIDE is not None:
        return None
    return AUTOTUNE, FWD_DECAY_V, FWD_TMA, BWD_TMA, TMA_MAX_DIM, FP32_DOT_PRECISION


# Used under the interpreter (no autotune search there) and as the GPU fallback.
def default_fwd_config(K: int, V: int, BT: int = 64) -> dict:
    if K <= 64 and V <= 64 and BT <= 64:
        return {"BV": min(V, 32), "num_warps": 4, "num_stages": 2}
    return {"BV": min(V, 64) if K <= 128 else 32, "num_warps": 8, "num_stages": 2}


def default_bwd_config(K: int, V: int, BT: int = 64) -> dict:
    # 2 stages, not 1: see bwd_configs
    return {"num_warps": 4 if max(K, V) <= 32 and BT <= 64 else 8, "num_stages": 2}
