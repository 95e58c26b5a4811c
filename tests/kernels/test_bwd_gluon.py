"""The warp-specialised Gluon backward kernels, dQ and dK / dV (kernels/flash_attn/bwd_gluon.py; session 31: built
on the CPU; session 32: routed by configs.BWD_GLUON). Gluon has no interpreter: on the CPU the kernels are compiled for sm_90a
(benchmarks/fp8_gluon_ptxas.py) and the input checks and the route run; on an sm90 GPU (marked ``gpu``) dQ, delta,
dK and dV run against the FP64 oracle beside the Triton backward's on the same inputs.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sm90_compiles import sm90_reports

from kernels.flash_attn import bwd_gluon, configs

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
#: (head dims, query rows a tile) -> the spill bytes ptxas reported in sessions 31-32 (an upper bound here: more is
#: a regression; hd 128 at 64-row tiles spills, 32-row tiles about not; MLA's 192 / 128 at 32-row tiles 32 / 36 B
#: over 2 stages, up to 68 B over the 3 it is routed at)
SPILL_AT_MOST = {("128", 64): 256, ("128", 32): 32, ("64", 64): 0, ("192/128", 32): 72, ("64", 128): 400}
#: hd 64's 128-row tiles, the mask they are routed with (session 38: 12 B; causal 384 B in query halves, 440 B
#: without: not routed)
SPILL_64_128_NONCAUSAL = 16
#: ... and of the fused backward's kernel by (head dim, query rows a tile) (session 34; hd 128: 60 / 140 B over 2
#: stages, 100 / 268 B over 3, the causal 3-stage one not routed; session 38: hd 64's 128-row tiles, in query halves
#: 96 / 208 B (non-causal routed since session 39), 100 B with an adder warp non-causal; without the halves 232 /
#: 660 B)
FUSED_SPILL_AT_MOST = {("128", 64): 272, ("64", 64): 0, ("64", 128): 300}
#: ... and of its ordered (deterministic) variant, causal (session 36: the adds in an adder warp, hd 128 100-172 B over
#: 2 stages as the adder changed; session 35's spin and hand-on in the consumers spilled 468 B, ran at 0.6x the fused
#: kernel)
ORDERED_SPILL_AT_MOST = {"128": 200, "64": 0}
#: ... and of both kernels over a GQA group (not specialised to 1) walking their steps in one flat loop, hd 128
#: (session 37: 100-180 B the dK / dV kernel, 152 B fused over 2 stages, 296 B over 3; nested: 352-684 B)
FLAT_SPILL_AT_MOST = 300
#: ... and of the persistent kernels (@p1; session 44, built without a GPU): hd 64's 64-row tiles none, as one
#: program a tile; hd 128 256-292 B, hd 64's 128-row tiles 196 B (session 45, the turn count no longer carried:
#: 312-328 and 236 before; 64-184 and 96 B one program a tile: the tile loop's index and coordinates stay live); hd
#: 128's 32-row tiles (capped causal, session 55) 32 B
PERSISTENT_SPILL_AT_MOST = {("128", 64): 300, ("64", 64): 0, ("64", 128): 200, ("128", 32): 40}
#: the dQ kernel's (head dims, keys a block, stages) compiled here: no spill at any
DQ_CONFIGS = (("128", 64, 3), ("128", 128, 2), ("64", 64, 3), ("192/128", 64, 3))
#: ... but hd 256's (the dQ kernel alone, session 53: 32-key tiles over 3 stages, 224 KiB; causal 4 B with device-made
#: descriptors, none with host-made; softcapped 24 B causal, none non-causal)
DQ_SPILL_AT_MOST = {"256": 24}
#: the dQ kernel compiled with and without a softcap (@sc, bwd_gluon.dq_arguments' ``softcap``): hd 256's tried
#: config (configs.BWD_GLUON_TRY, configs.BWD_GLUON_SOFTCAP's head dim) and hd 128's capped one
#: (configs.BWD_GLUON_SOFTCAP_CONFIGS), both masks
DQ_SOFTCAP_TWINS = [f"bwdq16:256,{configs.BWD_GLUON_TRY[256]['dq'][0]},{configs.BWD_GLUON_TRY[256]['dq'][1]},{c}"
                    for c in (0, 1)] + [f"bwdq16:128,{bn},{st},{int(c)}" for (d, n, c), (bn, st)
                                        in configs.BWD_GLUON_SOFTCAP_CONFIGS.items() if (d, n) == (128, "dq")]
#: the dK / dV kernel compiled with and without a softcap (@sc, bwd_gluon.dkdv_arguments' ``softcap``; session 55,
#: built on the CPU) at hd 128's capped configs (configs.BWD_GLUON_SOFTCAP_CONFIGS, else configs.BWD_GLUON's) with
#: host-made descriptors, MHA both masks, over a GQA group of 2 in one flat walk (Gemma-2-27B's 32 / 16) causal, and
#: causal persistent; its capped spills by mask (non-causal 64-row tiles 120 B, GQA 116 B; causal 32-row tiles 0 B,
#: persistent 32 B)
_CAPPED_DKDV = {c: configs.BWD_GLUON_SOFTCAP_CONFIGS.get((128, "dkdv", bool(c)), configs.BWD_GLUON[128]["dkdv"])
                for c in (0, 1)}
DKDV_SOFTCAP_TWINS = ([f"bwd16:128,{bm},{st},{c}@hd" for c, (bm, st) in _CAPPED_DKDV.items()]
                      + [f"bwdw16:128,{_CAPPED_DKDV[1][0]},{_CAPPED_DKDV[1][1]},1,1,2,0@hd"]
                      + [f"bwd16:128,{_CAPPED_DKDV[1][0]},{_CAPPED_DKDV[1][1]},1@p1@hd"])
DKDV_SOFTCAP_SPILL_AT_MOST = {False: 130, True: 40}
#: hd 256's dK / dV kernel (bwd_gluon_hd256, session 54, built on the CPU): 144 B spilled non-causal, 376 B causal,
#: capped 212 / 448 B (the routed hd 128 causal dK / dV kernel's 188 B for scale)
HD256_SPILL_AT_MOST = 460
#: ... compiled at its tried config, both masks, with and without a softcap (@sc), and over a GQA group of 4
HD256_TWINS = [f"bwd256:{configs.BWD_GLUON_TRY[256]['dkdv'][1]},{c}" for c in (0, 1)]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """spec -> fp8_gluon_ptxas.py's report of every config below (its PTX written to "ptx_file")."""
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    specs = [f"bwd16:{d},{bm},2,{c}" for d, bm in SPILL_AT_MOST for c in (0, 1)] + ["bwd16:128,32,3,1,1"]
    specs += [f"bwd16:{d},{bm},{st},{int(c)}" for (d, n, c), (_, (bm, st)) in configs.BWD_GLUON_BY_MASK.items()
              if n == "dkdv"]
    specs += [f"bwdq16:{d},{bn},{st},{c}" for d, bn, st in DQ_CONFIGS for c in (0, 1)]
    for table in (configs.BWD_GLUON, configs.BWD_GLUON_TRY):  # every routed and tried config, as the route runs it
        for d, cfg in table.items():
            dims = "192/128" if d == 192 else str(d)
            specs += [f"bwd256:{st},{c}" if (n, d) == ("dkdv", 256) else
                      f"bwd{'' if n == 'dkdv' else 'q'}16:{dims},{blk},{st},{c}" for n, (blk, st) in cfg.items()
                      for c in (0, 1)]
    # the fused backward (dQ by TMA reduce) at every tried and routed config
    fused = set(configs.BWD_GLUON_FUSED_TRY.items()) | {(d, c) for d, m in configs.BWD_GLUON_FUSED.items()
                                                          for _, c in m.values()}
    specs += [f"bwdf16:{d},{bm},{st},{c}" for d, (bm, st) in sorted(fused) for c in (0, 1)] + ["bwdf16:64,64,3,1,1"]
    # hd 64's 128-row tiles (dQ in row halves; S^T and dP^T in query halves by default, and without)
    specs += ["bwdf16:64,128,2,0", "bwdf16:64,128,2,1", "bwda16:64,128,2,0", "bwdf16:64,128,2,0@h0"]
    # hd 128 causal's mask on every tile: the dK / dV kernel's (not routed) and the fused kernel's (routed: MHA, and
    # GQA's flat walk under FLASH_ATTN_BWD=fused)
    specs += ["bwd16:128,64,2,1@m1"] + [f"bwdf16:{d},64,2,1@m1" for d in configs.BWD_GLUON_FUSED_MASK_EVERY_TILE]
    specs += [f"bwdw16:{d},64,2,1,1,4,1@m1" for d in configs.BWD_GLUON_FUSED_MASK_EVERY_TILE]
    # dQ's partials without the softmax scale (not routed): the routed fused configs, and the adder warp's
    specs += [f"bwdf16:{d},{bm},{st},{int(c)}@u1" for d, m in configs.BWD_GLUON_FUSED.items()
              for (_, c), (_, (bm, st)) in m.items()] + ["bwda16:128,64,3,0@u1"]
    # dK's dS^T from shared memory (not routed): the routed fused configs (with their mask on every tile), the adder's
    specs += [f"bwdf16:{d},{bm},{st},{int(c)}{'@m1' if c and d in configs.BWD_GLUON_FUSED_MASK_EVERY_TILE else ''}@d1"
              for d, m in configs.BWD_GLUON_FUSED.items() for (_, c), (_, (bm, st)) in m.items()]
    specs += ["bwda16:128,64,3,0@d1", "bwdf16:64,128,2,1@d1"]
    # the dK / dV kernel without its consumers' turns (not routed): its routed configs, both masks (hd 256's dK / dV
    # is bwd_gluon_hd256's kernel, whose consumers run in lockstep: no turns to take away)
    specs += [f"bwd16:{'192/128' if d == 192 else d},{blk},{st},{c}@t0" for d, cfg in configs.BWD_GLUON.items()
              for n, (blk, st) in cfg.items() if n == "dkdv" and d != 256 for c in (0, 1)]
    # ... and the fused kernel without them: its routed configs with their options, both masks, the adder's (hd 64's
    # 128-row tiles with dS^T from shared memory: without, 364 B spilled)
    specs += [f"bwdf16:{d},{bm},{st},{int(c)}{'@m1' if c and d in configs.BWD_GLUON_FUSED_MASK_EVERY_TILE else ''}"
              f"{'@d1' if bm == 128 else ''}@t0"
              for d, m in configs.BWD_GLUON_FUSED.items() for (_, c), (_, (bm, st)) in m.items()]
    specs += [f"bwdf16:{d},64,2,{c}@t0" for d in bwd_gluon.FUSED_HEAD_DIMS for c in (0, 1)]  # (64-row, both masks)
    specs += [f"bwda16:{d},{bm},{st},0@t0" for d, m in configs.BWD_GLUON_FUSED.items()
              for (_, c), (_, (bm, st)) in m.items() if (d, c) in configs.BWD_GLUON_FUSED_ADDER]
    specs += [f"bwdo16:{d},64,2,{c}" for d in bwd_gluon.FUSED_HEAD_DIMS for c in (0, 1)]  # the ordered adds
    # the adder warp: both head dims and masks over 2 stages, and where it is routed (configs.BWD_GLUON_FUSED_ADDER)
    specs += [f"bwda16:{d},64,2,{c}" for d in bwd_gluon.FUSED_HEAD_DIMS for c in (0, 1)]
    specs += [f"bwda16:{d},{bm},{st},{int(c)}" for d, m in configs.BWD_GLUON_FUSED.items()
              for (_, c), (_, (bm, st)) in m.items() if (d, c) in configs.BWD_GLUON_FUSED_ADDER]
    # GQA (a group of 4: not specialised) as routed, each program's steps in one flat loop (configs.bwd_walk), both
    # masks; the nested loops beside them causal, at 2 stages (what the flat walk is compared with)
    gqa = {(d, blk, st, 0) for d, cfg in configs.BWD_GLUON.items() if d in configs.BWD_GLUON_FLAT_WALK
           for n, (blk, st) in cfg.items() if n == "dkdv"} | {(d, bm, st, 1) for d, (bm, st) in sorted(fused)
                                                               if d in configs.BWD_GLUON_FLAT_WALK}
    specs += [f"bwdw16:{d},{bm},{st},{c},1,4,{f}" for d, bm, st, f in sorted(gqa) for c in (0, 1)]
    specs += [f"bwdw16:{d},{bm},{st},1,0,4,{f}" for d, bm, st, f in sorted(gqa) if st == 2]
    # the probes' timeline stamps (gluon_bwd_probe.py --timeline), beside their twins above
    specs += TIMELINE_TWINS + [f"{spec}@x1" for spec in TIMELINE_TWINS]
    # the persistent kernels (one program an SM over the tiles), beside their twins above
    specs += PERSISTENT_TWINS + [f"{spec}@p1" for spec in PERSISTENT_TWINS]
    specs += [f"bwdq16:{d},{bn},{st},1@p1" for d, bn, st in DQ_CONFIGS]  # (the dQ kernel's: causal twins above)
    specs += [f"{spec}@p2" for spec in HEAVY_TWINS]  # (the heavy-first tile order, causal)
    specs += [f"{spec}@hd" for spec in HOST_DESC_TWINS]  # (host-made TMA descriptors)
    specs += [f"{spec}@w1" for spec in WINDOW_TWINS]  # (a sliding window on the left)
    specs += [f"{spec}@sc" for spec in DQ_SOFTCAP_TWINS + HD256_TWINS]  # (a softcap: the twins are BWD_GLUON_TRY's)
    specs += DKDV_SOFTCAP_TWINS + [f"{spec}@sc" for spec in DKDV_SOFTCAP_TWINS]
    specs += [f"{spec},0,4" for spec in HD256_TWINS]  # (hd 256's dK / dV over a group of 4)
    specs += [f"{HD256_TWINS[1]}@sc@l1"]  # (... capped causal, with lse and delta by the loader's TMA)
    specs += SPLIT_SUM_TWINS + [f"{spec}@s2" for spec in SPLIT_SUM_TWINS]  # (the group split summed in the kernel)
    specs += LSE_TMA_TWINS + [f"{spec}@l1" for spec in LSE_TMA_TWINS]  # (lse and delta by the loader's TMA)
    specs += UNITS_FIRST_TWINS + [f"{spec}@g1" for spec in UNITS_FIRST_TWINS]  # (the grid's units first)
    return sm90_reports(specs, tmp_path_factory.mktemp("ptx"))


#: causal dK / dV kernels as the route would give them ``units_first`` (configs.BWD_GLUON_UNITS_FIRST, built in
#: session 59): the split route's hd 128 and the fused kernel's GQA flat walk, both with lse by TMA; and (built in
#: session 60) hd 256's dK / dV kernel capped with lse by TMA (Gemma-2's) and its causal dQ kernel
UNITS_FIRST_TWINS = [f"bwd16:128,{configs.BWD_GLUON[128]['dkdv'][0]},{configs.BWD_GLUON[128]['dkdv'][1]},1@hd@l1",
                     "bwdw16:128,64,2,1,1,4,1@m1@l1", f"{HD256_TWINS[1]}@sc@l1",
                     f"bwdq16:256,{configs.BWD_GLUON[256]['dq'][0]},{configs.BWD_GLUON[256]['dq'][1]},1"]


#: the dK / dV kernel as the MQA / GQA calls at hd 64 run it (persistent, host-made descriptors, a group of 4 over
#: the nested loops), beside it with a group split of 2 summed in the kernel (@s2, ``split_sum``;
#: configs.BWD_GLUON_SPLIT_SUM), both masks
SPLIT_SUM_TWINS = [f"bwdw16:64,64,2,{c},0,4,0@p1@hd" for c in (0, 1)]
#: ... whose spills (sm_90a, session 57: 40 B non-causal, 160 B causal; the twins none) stay within
SPLIT_SUM_SPILL_AT_MOST = 160
#: routed dK / dV configs as the route launches them (host-made descriptors; MLA's two head-dim parts without):
#: hd 128 both masks and MLA causal (where the compile spilled; hd 64's spills none either way), beside their
#: lse-by-TMA twins (@l1, ``lse_tma``; configs.BWD_GLUON_LSE_TMA, session 58), and the fused kernel's largest in
#: shared memory (hd 128 non-causal, 3 stages, the adder warp: configs.BWD_GLUON_FUSED_LSE_TMA); the plain twins are
#: compiled for other tests already (the CPU suite's time)
LSE_TMA_TWINS = [f"bwd16:128,{configs.BWD_GLUON[128]['dkdv'][0]},{configs.BWD_GLUON[128]['dkdv'][1]},{c}@hd"
                 for c in (0, 1)] + [f"bwd16:192/128,{configs.BWD_GLUON[192]['dkdv'][0]},"
                                     f"{configs.BWD_GLUON[192]['dkdv'][1]},1", "bwda16:128,64,3,0@hd"]


def test_the_kernels_compile_with_their_partitions(compiled):
    """Every config of both kernels, causal or not (and fp16, three stages): a loader warp at 24 registers,
    consumers at 240 (setmaxnreg), 16-bit wgmmas not serialised, shared memory within the H100's 227 KiB, spills
    within the session-31 bound of the dK / dV kernel's tile, none in the dQ kernel (hd 256's:
    :data:`DQ_SPILL_AT_MOST`)."""
    for spec, r in compiled.items():
        kernel, _, cfg = spec.partition(":")
        d, block = cfg.split(",")[0], int(cfg.split("@")[0].split(",")[1])
        assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 240, spec
        assert r["wgmma"] > 0 and not r["serialized"], spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec
        walk = kernel == "bwdw16" and cfg.split(",")[4] == "1"  # (bwdw16 walk 0: GQA's nested loops, spilling)
        bound = {"bwd16": SPILL_AT_MOST.get((d, block)), "bwdf16": FUSED_SPILL_AT_MOST.get((d, block)),
                 "bwda16": FUSED_SPILL_AT_MOST.get((d, block)), "bwdo16": ORDERED_SPILL_AT_MOST.get(d),
                 "bwdw16": FLAT_SPILL_AT_MOST if walk else 10 ** 4, "bwdq16": DQ_SPILL_AT_MOST.get(d, 0),
                 "bwd256": HD256_SPILL_AT_MOST}.get(kernel, 0)
        if ("@p1" in spec or "@p2" in spec) and kernel != "bwdq16":  # (the dQ kernel's: none, as one a tile)
            bound = PERSISTENT_SPILL_AT_MOST[d, block]
        if "@s2" in spec:  # (the in-kernel split sum, not routed: its own test's bound)
            bound = SPLIT_SUM_SPILL_AT_MOST
        assert r["spill"] <= bound, (spec, r["spill"])
        adds = kernel in ("bwdf16", "bwda16", "bwdo16") or (kernel == "bwdw16" and cfg.split("@")[0].endswith(",1"))
        assert (r["tma_reduce"] > 0) == adds, spec  # only the fused ones add dQ by TMA reduce


#: kernels compiled with and without the probes' timeline stamps (@x1): the split route's hd 128 causal dK / dV, hd 64
#: causal fused without turns, hd 128 non-causal fused with the adder warp (their routed configs)
TIMELINE_TWINS = ["bwd16:128,64,2,1", "bwdf16:64,64,2,1@t0", "bwda16:128,64,3,0"]


def test_the_timeline_stamps_leave_the_kernels_work_alone(compiled):
    """A kernel with ``times`` (bwd_gluon.dkdv_arguments) compiles to the same wgmmas and TMA reduces as without, its
    spills within 32 B and its shared memory within 16 B (the stamps' pointer, captured for one partition) of its
    twin's; without ``times`` the stamps are compiled out (the twins' numbers are the routed kernels' above)."""
    for spec in TIMELINE_TWINS:
        plain, stamped = compiled[spec], compiled[f"{spec}@x1"]
        assert (stamped["wgmma"], stamped["tma_reduce"]) == (plain["wgmma"], plain["tma_reduce"]), spec
        assert abs(stamped["spill"] - plain["spill"]) <= 32 and 0 <= stamped["smem"] - plain["smem"] <= 16, (
            spec, plain, stamped)


#: kernels compiled one program a tile and persistent (@p1, bwd_gluon.dkdv_arguments' ``persistent``): the split
#: route's dK / dV at hd 64 and hd 128 causal, the fused kernel at hd 64's two routed configs and hd 128 non-causal's
#: (with the adder warp)
PERSISTENT_TWINS = ["bwd16:64,64,2,1", "bwd16:128,64,2,1", "bwdf16:64,64,2,1@t0", "bwdf16:64,128,2,0",
                    "bwda16:128,64,3,0"]


def test_the_persistent_kernels_do_the_same_work(compiled):
    """A persistent kernel compiles to the same wgmmas and TMA reduces as its one-program-a-tile twin, its shared
    memory at most 32 B more (the K / V release barrier), hd 64's 64-row tiles without a spill (the cells where
    session 44's timeline put 17-28% of the SMs' time between programs at 1k)."""
    for spec in PERSISTENT_TWINS:
        plain, persistent = compiled[spec], compiled[f"{spec}@p1"]
        assert (persistent["wgmma"], persistent["tma_reduce"]) == (plain["wgmma"], plain["tma_reduce"]), spec
        assert 0 < persistent["smem"] - plain["smem"] <= 32, (spec, plain["smem"], persistent["smem"])
        if spec.split(":")[1].startswith("64,64,"):
            assert persistent["spill"] == 0, (spec, persistent["spill"])


def test_the_split_summed_in_the_kernel_adds_one_count_a_warp_and_nothing_else(compiled):
    """The dK / dV kernel summing its group split itself (``split_sum``, session 57; lost 0.80-0.85x, not routed)
    beside its twin: the same wgmmas and partitions' registers, the twin without spills and the kernel within 160 B
    (sm_90a: 40 B non-causal, 160 B causal), shared memory within 64 B (its arguments into the partitions); each
    consumer counts its warps' stored rows by one gpu-scope acquire-release add (two in the kernel, none in the
    twin) and reads the partials back from L2 (ld.global.cg: none in the twin)."""
    for spec in SPLIT_SUM_TWINS:
        plain, summed = compiled[spec], compiled[f"{spec}@s2"]
        for key in ("wgmma", "setmaxnreg", "serialized", "ex2", "tma_reduce"):
            assert plain[key] == summed[key], (spec, key)
        assert plain["spill"] == 0 and summed["spill"] <= SPLIT_SUM_SPILL_AT_MOST, (spec, summed["spill"])
        assert 0 <= summed["smem"] - plain["smem"] <= 64, (spec, plain["smem"], summed["smem"])
        assert (plain["atom_acq_rel"], summed["atom_acq_rel"]) == (0, 2), spec
        assert plain["ld_cg"] == 0 < summed["ld_cg"], spec


def test_units_first_changes_only_which_grid_dimension_is_which(compiled):
    """A kernel with its grid's units first (``units_first``) compiles to its twin's wgmmas, TMA reduces, registers,
    shared memory and partitions' register budgets, and spills no more: the two program ids swap (the dQ kernel's
    query block counted from the end), nothing else. (sm_90a, session 60: hd 256's dQ 4 -> 0 B spilled, the others
    the same bytes.)"""
    for spec in UNITS_FIRST_TWINS:
        plain, swapped = compiled[spec], compiled[f"{spec}@g1"]
        for key in ("wgmma", "tma_reduce", "regs", "smem", "setmaxnreg"):
            assert plain[key] == swapped[key], (spec, key, plain[key], swapped[key])
        assert swapped["spill"] <= plain["spill"], (spec, plain["spill"], swapped["spill"])


def test_lse_by_tma_keeps_the_kernel_and_spills_no_more(compiled):
    """The dK / dV kernel taking lse and delta from the loader's TMA copies (``lse_tma``) beside its twin at
    :data:`LSE_TMA_TWINS`' configs: the same wgmmas, partitions' registers and exponentials, spills no more than the
    twin's (sm_90a, session 58: hd 128 76 -> 0 B non-causal, 188 -> 0 B causal; MLA causal 68 -> 0 B; the fused
    adder's 112 -> 8 B), and shared memory larger by the ring's lse and delta rows (2 x stages x BLOCK_M fp32; MLA:
    112 B of alignment more), within the H100's 227 KiB."""
    assert len(LSE_TMA_TWINS) == 4
    for spec in LSE_TMA_TWINS:
        plain, by_tma = compiled[spec], compiled[f"{spec}@l1"]
        for key in ("wgmma", "serialized", "ex2"):
            assert plain[key] == by_tma[key], (spec, key)
        assert sorted(plain["setmaxnreg"]) == sorted(by_tma["setmaxnreg"]), spec  # (the code's order may move)
        assert by_tma["spill"] <= plain["spill"], (spec, plain["spill"], by_tma["spill"])
        bm, st = (int(x) for x in spec.split(",")[1:3])
        ring = 2 * st * bm * 4
        assert ring <= by_tma["smem"] - plain["smem"] <= ring + 128, (spec, plain["smem"], by_tma["smem"])
        assert by_tma["smem"] <= configs.H100_SMEM_BYTES, spec  # (the fused hd 128 kernel: 226 KiB of 227)


def test_launcher_counters_are_kept_zeroed_per_stream():
    """kernels.launcher.counters: at least n int32 zeros, the same buffer again for the same (thread, device,
    stream) while it is large enough (a kernel sets back what it counted), a new zeroed one when a call needs more."""
    from kernels import launcher

    like = torch.empty(1)
    first = launcher.counters(like, 40)
    assert first.dtype == torch.int32 and first.numel() >= 40 and not first.any()
    assert launcher.counters(like, 10) is first
    first[3] = 5  # (what a kernel that did not finish would leave: the next larger buffer starts from zero anyway)
    grown = launcher.counters(like, 1000)
    assert grown is not first and grown.numel() >= 1000 and not grown.any()
    assert launcher.counters(like, 1000) is grown


def test_the_in_kernel_split_sum_says_what_it_cannot_take():
    """bwd_gluon.dkdv_arguments' ``split_sum``: a group split (split > 1) of the dK / dV kernel (not fused), q / k = v
    head dims, enough int32 counters (split_counter_count: one a batch, kv head and 16 key rows of each 128-key
    block), contiguous gradients shaped as k / v."""
    q, k, v, do, lse, delta = _inputs(sq=300, sk=300, hq=8, hk=2, d=64)
    pk, pv = torch.empty(2, *k.shape), torch.empty(2, *v.shape)
    n = bwd_gluon.split_counter_count(k)
    assert n == 1 * 2 * 3 * 8
    sums = (torch.zeros(n, dtype=torch.int32), torch.empty_like(k), torch.empty_like(v))
    call = bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, pk, pv, 0.125, False, split=2, split_sum=sums)
    assert call["Count"] is sums[0] and call["DKsum"] is sums[1] and call["group_split"] == 2
    for bad, match in (((sums, 1, pk), "group split"), (((sums[0][:n - 1], *sums[1:]), 2, pk), "int32 counters"),
                       (((sums[0].long(), *sums[1:]), 2, pk), "int32 counters"),
                       (((sums[0], sums[1].transpose(1, 2), sums[2]), 2, pk), "contiguous")):
        with pytest.raises(ValueError, match=match):
            bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, bad[2], pv, 0.125, False, split=bad[1],
                                     split_sum=bad[0])
    with pytest.raises(ValueError, match="group split"):
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, pk, pv, 0.125, False, split=2, split_sum=sums,
                                 dq_acc=torch.empty(q.shape))


def test_the_backward_sums_the_split_in_the_gluon_kernel_only_where_listed(monkeypatch):
    """configs.BWD_GLUON_SPLIT_SUM (session 57): a split call at a listed head dim hands the Gluon dK / dV launch
    its counters (launcher.counters, zero) and the gradients, and launches no _sum_partials; unlisted (hd 128, or
    the set empty) the launch gets none and the sum runs after it; unsplit calls neither. (No sm90 GPU here: the
    route is made to see one, the Gluon launches recorded, the Triton ones logged by stand-ins.)"""
    from kernels.flash_attn import bwd
    from kernels.standins import cpu_replays

    seen, log = _record_gluon_launches(monkeypatch)[0], []

    def call(hk, d, split):
        q, k, v, do, _, _ = _inputs(sq=2048, sk=2048, hq=8, hk=hk, d=d)
        log.clear()
        with cpu_replays(log):
            dq, dk, dv = bwd.flash_attn_bwd(do, q, k, v, q.clone(), torch.zeros(1, 8, 2048), softmax_scale=0.125,
                                            causal=False, window_left=-1, window_right=-1, split=split)
        (args, kw), = seen
        seen.clear()
        return kw.get("split_sum"), args[10], dk, dv, [name for _, name, *_ in log]

    monkeypatch.setattr(configs, "BWD_GLUON_SPLIT_SUM", frozenset({64}))
    sums, split, dk, dv, names = call(1, 64, 4)
    assert split == 4 and sums is not None and sums[1] is dk and sums[2] is dv and "_sum_partials" not in names
    assert sums[0].dtype == torch.int32 and sums[0].numel() >= 2048 // 16 and not sums[0].any()
    sums, split, *_, names = call(1, 128, 4)  # (hd 128: not listed)
    assert split == 4 and sums is None and "_sum_partials" in names
    sums, split, *_, names = call(8, 64, None)  # (MHA: no split)
    assert split == 1 and sums is None and "_sum_partials" not in names
    monkeypatch.setattr(configs, "BWD_GLUON_SPLIT_SUM", frozenset())
    sums, split, *_, names = call(2, 64, 4)
    assert split == 4 and sums is None and "_sum_partials" in names


#: kernels compiled with their TMA descriptors made on the device and on the host (@hd, ``host_desc``): the split
#: route's dK / dV and dQ and the fused kernel (adder warp) at hd 128 non-causal, where session 47's timeline priced
#: the device-made ones
HOST_DESC_TWINS = ["bwd16:128,64,2,0", "bwda16:128,64,3,0", "bwdq16:128,128,2,0"]


def test_host_made_descriptors_change_only_the_set_up(compiled):
    """A kernel taking host-made descriptors (session 48, not routed) compiles to its twin's wgmmas, TMA reduces,
    shared memory and partitions' registers, spills within 32 B of the twin's (sm_90a: 64 -> 76 B, 128 -> 112 B,
    0 -> 0 B)."""
    for spec in HOST_DESC_TWINS:
        plain, host = compiled[spec], compiled[f"{spec}@hd"]
        assert (host["wgmma"], host["tma_reduce"], host["smem"], host["setmaxnreg"]) == (
            plain["wgmma"], plain["tma_reduce"], plain["smem"], plain["setmaxnreg"]), spec
        assert host["spill"] <= plain["spill"] + 32 and not host["serialized"], (spec, plain["spill"], host["spill"])


#: the split route's kernels compiled with a sliding window on the left (@w1, ``window_left``;
#: configs.BWD_GLUON_WINDOW) beside their twins: Mistral's route (GQA hd 128: the dK / dV kernel's flat walk, and
#: the dQ kernel); the MHA, hd 64 and MLA windows compile as these do (session 51: spills +40, -104 and +8 B) and
#: are left to the GPU test (each spec here costs the CPU suite a few seconds a worker)
WINDOW_TWINS = ["bwdw16:128,64,2,1,1,4,0", "bwdq16:128,128,2,1"]


def test_a_window_changes_only_the_masks_and_the_loop_bounds(compiled):
    """The windowed kernels (session 51, not routed) compile to their twins' wgmmas and partitions' registers,
    shared memory within 64 B (the window's argument) and spills within 32 B of the twin's (sm_90a: 180 -> 196 B,
    0 -> 0 B)."""
    for spec in WINDOW_TWINS:
        plain, windowed = compiled[spec], compiled[f"{spec}@w1"]
        assert (windowed["wgmma"], windowed["setmaxnreg"]) == (plain["wgmma"], plain["setmaxnreg"]), spec
        assert plain["smem"] <= windowed["smem"] <= plain["smem"] + 64, spec
        assert windowed["spill"] <= plain["spill"] + 32 and not windowed["serialized"], (spec, windowed["spill"])


#: persistent kernels compiled in both tile orders (@p1 the snake, @p2 heaviest first: bwd_gluon.PERSISTENT_ORDERS):
#: the routed causal cells of the split dK / dV kernel (hd 64), the fused kernel (hd 64) and the dQ kernel (hd 128)
HEAVY_TWINS = ["bwd16:64,64,2,1", "bwdf16:64,64,2,1@t0", "bwdq16:128,128,2,1"]


def test_the_heavy_first_order_changes_only_the_tile_walk(compiled):
    """The heavy-first order (session 47, not routed) compiles to the same wgmmas, TMA reduces and shared memory as
    the snake order, spilling at most 32 B more (sm_90a on the CPU: 0 B at these configs, either order)."""
    for spec in HEAVY_TWINS:
        snake, heavy = compiled[f"{spec}@p1"], compiled[f"{spec}@p2"]
        assert (heavy["wgmma"], heavy["tma_reduce"], heavy["smem"]) == (
            snake["wgmma"], snake["tma_reduce"], snake["smem"]), spec
        assert heavy["spill"] <= snake["spill"] + 32 and not heavy["serialized"], (spec, snake, heavy)


def test_the_fused_kernel_adds_dq_with_its_own_wgmmas(compiled):
    """The fused backward's kernel: one more pair of wgmmas (dQ's partial, two 64-key halves) in each consumer than
    the dK / dV kernel at the same config (hd 128: every tile, a consumer its 64 columns; hd 64: every other tile,
    all 64), one TMA reduce-add a consumer, and its shared memory (dS^T double-buffered, fp32 dQ tiles) above it."""
    for d in bwd_gluon.FUSED_HEAD_DIMS:
        for c in (0, 1):
            base, fused = compiled.get(f"bwd16:{d},64,2,{c}"), compiled[f"bwdf16:{d},64,2,{c}"]
            assert fused["tma_reduce"] == 2, fused  # one a consumer partition
            assert fused["smem"] > base["smem"] and fused["wgmma"] > base["wgmma"], (d, c)


def test_hd64_takes_128_row_tiles_where_routed(compiled):
    """hd 64's dK / dV kernel on 128-row tiles, as configs.BWD_GLUON_BY_MASK routes it (non-causal, S^T and dP^T
    whole): a spill of a few bytes at most (causal spills 384 B: not routed). The fused kernel takes them too, as
    configs.BWD_GLUON_FUSED routes it non-causal (each consumer its 64 rows of every tile's dQ, not alternate tiles:
    its two reduces a tile), in the shared memory it has over 2 stages, and by default makes S^T and dP^T in two
    64-query halves (four wgmmas where two were), spilling less than without them."""
    for (d, name, causal), (least, (bm, st)) in configs.BWD_GLUON_BY_MASK.items():
        assert (d, name, causal, bm) == (64, "dkdv", False, 128) and least == 4096
        assert compiled[f"bwd16:{d},{bm},{st},0"]["spill"] <= SPILL_64_128_NONCAUSAL
        assert not bwd_gluon.query_halves(bm, 0, False, causal)  # (the routed kernel: whole)
    halves, whole = compiled["bwdf16:64,128,2,0"], compiled["bwdf16:64,128,2,0@h0"]
    assert halves["spill"] < whole["spill"] and halves["wgmma"] > whole["wgmma"]
    assert bwd_gluon.query_halves(128, 0, True, False) and not bwd_gluon.query_halves(64, 0, True, True)
    for c in (0, 1):
        rows, alternate = compiled[f"bwdf16:64,128,2,{c}"], compiled[f"bwdf16:64,64,2,{c}"]
        assert rows["tma_reduce"] == alternate["tma_reduce"] == 2 and rows["wgmma"] > alternate["wgmma"], c
        assert rows["smem"] <= configs.H100_SMEM_BYTES, c
    assert compiled["bwda16:64,128,2,0"]["tma_reduce"] >= 2


def test_the_causal_mask_on_every_tile_spills_less(compiled):
    """hd 128 causal, both kernels as routed (64-row tiles, 2 stages): the mask on every tile (``mask_every_tile``, a
    compare and a select an element, no branch; routed for the fused kernel, configs.BWD_GLUON_FUSED_MASK_EVERY_TILE,
    not for the split route's dK / dV kernel) spills under two thirds of what the branch on the diagonal's tiles
    does (session 38: 184 -> 92 B, 140 -> 88 B), the same wgmmas; the fused kernel's GQA flat walk less too."""
    for kernel in ("bwd16", "bwdf16"):
        branch, every = compiled[f"{kernel}:128,64,2,1"], compiled[f"{kernel}:128,64,2,1@m1"]
        assert 3 * every["spill"] < 2 * branch["spill"] and every["wgmma"] == branch["wgmma"], kernel
    branch, every = compiled["bwdw16:128,64,2,1,1,4,1"], compiled["bwdw16:128,64,2,1,1,4,1@m1"]
    assert every["spill"] < branch["spill"] and every["wgmma"] == branch["wgmma"]


def test_dq_without_the_softmax_scale_drops_a_multiply_an_element_a_tile(compiled):
    """The fused kernel with ``dq_unscaled`` (not routed; the caller would scale dQ's sum once): its PTX has 64 fewer
    fp32 multiplies than the kernel's at the same config (32 in each consumer partition: its dQ tile's elements a
    thread), the same wgmmas, and spills no more."""
    for spec, r in compiled.items():
        if not spec.endswith("@u1"):
            continue
        base = compiled[spec[:-3]]
        muls = [sum(line.count("mul.f32") + line.count("mul.rn.f32") for line in Path(x["ptx_file"]).read_text()
                    .splitlines()) for x in (base, r)]
        assert muls[0] - muls[1] == 64 and r["wgmma"] == base["wgmma"] and r["spill"] <= base["spill"], (spec, muls)


def test_dk_from_shared_ds_reads_its_a_operand_from_shared_memory(compiled):
    """The fused kernel with ``ds_smem`` (not routed): half its register-sourced wgmmas (dV's P^T stays in registers,
    dK's dS^T comes from the shared buffer, a descriptor), as many wgmmas in all and the same TMA reduces as the
    kernel at the same config, and at hd 64's 128-row non-causal tiles (the routed config) fewer bytes spilled
    (session 40: 96 -> 36 B)."""
    def register_a(r):  # wgmmas whose A operand is a register list (after the accumulator's)
        return sum("}, {" in line for line in Path(r["ptx_file"]).read_text().splitlines() if "wgmma.mma_async" in line)

    specs = [spec for spec in compiled if spec.endswith("@d1")]
    assert len(specs) >= 4, specs
    for spec in specs:
        r, base = compiled[spec], compiled[spec[:-3]]
        assert 2 * register_a(r) == register_a(base) > 0 and r["wgmma"] == base["wgmma"], spec
        assert r["tma_reduce"] == base["tma_reduce"], spec
    assert compiled["bwdf16:64,128,2,0@d1"]["spill"] < compiled["bwdf16:64,128,2,0"]["spill"]


def test_the_kernels_without_turns_drop_the_handover(compiled):
    """The dK / dV kernel and the fused one with ``turns=False`` (flash-attn-4's and FA3's sm90 backwards have no
    turns between their MMA warpgroups): the same wgmmas (and the fused kernel's the same TMA reduces and shared
    memory) as with turns, none of the turn's waits (each consumer waits on its slot's loads, the fused kernel's on
    the tile's dS^T halves too, and on its own wgmmas) and fewer mbarrier arrives, at every routed config."""
    def count(r, op):
        return sum(op in line for line in Path(r["ptx_file"]).read_text().splitlines())

    specs = [spec for spec in compiled if spec.endswith("@t0")]
    assert len(specs) >= 14 and any(spec.startswith("bwda16") for spec in specs), specs
    for spec in specs:
        r, base = compiled[spec], compiled[spec[:-3]]
        assert r["wgmma"] == base["wgmma"] > 0, spec
        assert r["tma_reduce"] == base["tma_reduce"] and r["smem"] <= base["smem"], spec  # (the turn barriers go)
        assert 0 < count(r, "mbarrier.try_wait") < count(base, "mbarrier.try_wait"), spec
        assert count(r, "mbarrier.arrive") < count(base, "mbarrier.arrive"), spec


def test_the_ordered_adds_wait_their_turn_and_hand_it_on(compiled):
    """The deterministic variant of the fused kernel (causal): the fused kernel's wgmmas, its TMA reduces moved to a
    fourth partition (the adder warp, one of the 12 launched anyway: the consumers keep none), which spins on a
    tile's counter (an acquire load in a loop), and hands the previous tile on once its reduces completed in full
    (the bulk groups' writes, not only their reads of shared memory) by a release reduction (no return: the warp
    does not wait for it), each behind a proxy fence."""
    for d in bwd_gluon.FUSED_HEAD_DIMS:
        fused, ordered = compiled[f"bwdf16:{d},64,2,1"], compiled[f"bwdo16:{d},64,2,1"]
        assert ordered["wgmma"] == fused["wgmma"] and ordered["tma_reduce"] >= fused["tma_reduce"] == 2, d
        assert ordered["smem"] <= configs.H100_SMEM_BYTES, d
        ptx = Path(ordered["ptx_file"]).read_text()
        assert ptx.count("ld.global.gpu.acquire.b32") == 1 and ptx.count("red.release.gpu.global.add") == 2, d
        assert ptx.count("fence.proxy.async.global;") == 3, d
        # the previous tile handed on once its reduces completed, this tile's (hd 128: two, hd 64: one) still
        # pending; all of them before the last hand-on
        assert ptx.count(f"cp.async.bulk.wait_group {2 if d == 128 else 1};") == 1, d
        assert ptx.count("cp.async.bulk.wait_group 0;") == 1, d
        # non-causal: each tile handed on as soon as its reduces completed (every program starts at tile 0 and
        # trails the one above it by a hand-on: kept short), none left pending
        fused, ordered = compiled[f"bwdf16:{d},64,2,0"], compiled[f"bwdo16:{d},64,2,0"]
        assert ordered["wgmma"] == fused["wgmma"] and ordered["smem"] <= configs.H100_SMEM_BYTES, d
        ptx = Path(ordered["ptx_file"]).read_text()
        assert ptx.count("ld.global.gpu.acquire.b32") == 1 and ptx.count("red.release.gpu.global.add") == 1, d
        assert ptx.count("cp.async.bulk.wait_group 0;") == 1 and ptx.count("fence.proxy.async.global;") == 2, d
        assert "cp.async.bulk.wait_group 1;" not in ptx and "cp.async.bulk.wait_group 2;" not in ptx, d


def test_gqa_programs_walk_their_steps_in_one_loop(compiled):
    """A GQA group (not specialised away, as MHA's is) in nested loops over (head, tile) spills several times what
    MHA's kernel does at hd 128; the flat walk the route takes there (configs.bwd_walk) spills within its bound in
    every routed config and both masks (the compile test), and less than half the nested loops' where both were
    compiled (causal, 2 stages: both kernels)."""
    pairs = [(r, compiled[spec.replace(",1,4,", ",0,4,")]) for spec, r in compiled.items()
             if spec.startswith("bwdw16:") and ",1,4," in spec and spec.replace(",1,4,", ",0,4,") in compiled]
    assert len(pairs) >= 2
    for flat, nested in pairs:
        assert flat["spill"] <= FLAT_SPILL_AT_MOST and 2 * flat["spill"] < nested["spill"], (flat, nested)


def test_the_adder_warp_adds_without_turns(compiled):
    """The fused kernel with an adder warp (``dkdv_gluon(adder=True)``): the fused kernel's wgmmas and shared
    memory (the hand-over barriers aside), its TMA reduces in the fourth partition as the ordered kernel's, and no
    counter touched: no acquire spin, no release, no wait for a reduce's writes (only for its reads of shared
    memory), whichever mask and stage count."""
    for d in bwd_gluon.FUSED_HEAD_DIMS:
        for c in (0, 1):
            fused, adder = compiled[f"bwdf16:{d},64,2,{c}"], compiled[f"bwda16:{d},64,2,{c}"]
            assert adder["wgmma"] == fused["wgmma"] and adder["tma_reduce"] >= fused["tma_reduce"], (d, c)
            assert fused["smem"] <= adder["smem"] <= fused["smem"] + 64, (d, c)
            ptx = Path(adder["ptx_file"]).read_text()
            assert "ld.global.gpu.acquire" not in ptx and "red.release" not in ptx, (d, c)
            assert "fence.proxy.async.global;" not in ptx and "cp.async.bulk.wait_group 0;" not in ptx, (d, c)
    assert compiled["bwda16:128,64,3,0"]["smem"] <= configs.H100_SMEM_BYTES  # (3 stages: hd 128 non-causal's route)


def test_the_ordered_adds_say_what_they_cannot_run():
    """dkdv_gluon(ordered=True): built for the fused kernel adding every partial, either mask; anything else is
    named before any launch. The counters: a spare one, then one per (batch, query head, 64-row tile)."""
    assert bwd_gluon.ordered_unsupported(True) is None
    assert "fused" in bwd_gluon.ordered_unsupported(False)
    assert "block_m=128" in bwd_gluon.ordered_unsupported(True, block_m=128)
    assert "dq_sink" in bwd_gluon.ordered_unsupported(True, 1)
    q, k, v, do, lse, delta = _inputs(b=2, sq=130, sk=130, hq=4, hk=2)
    with pytest.raises(ValueError, match="fused"):
        bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=0.1, causal=False, ordered=True)
    sem = bwd_gluon.order_counters(q)
    assert sem.dtype == torch.int32 and sem.shape == (1 + 2 * 4 * 3,) and not sem.any()


def test_the_ordered_kernel_launches_its_key_blocks_last_first(monkeypatch):
    """dkdv_gluon launches the ordered kernel's key blocks last first unless told otherwise (a program then waits
    only on programs dispatched before it: no deadlock however few SMs the kernel gets), the unordered kernel's
    first first; either can be forced (probes)."""
    seen = []
    monkeypatch.setattr(bwd_gluon, "_check_call", lambda *a: None)  # (no sm90 GPU here: the launch is recorded)
    signature = inspect.signature(bwd_gluon.dkdv_launch)  # (the launch's last_first, however it is passed)
    monkeypatch.setattr(bwd_gluon, "dkdv_launch",
                        lambda *a, **kw: seen.append(signature.bind(*a, **kw).arguments["last_first"]))
    q, k, v, do, lse, delta = _inputs(b=1, sq=130, sk=130, hq=2, hk=2)
    for ordered, forced in ((True, None), (False, None), (True, False), (False, True)):
        bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=0.1, causal=True, fused=True, ordered=ordered,
                             last_first=forced)
    assert seen == [True, False, False, True]


def test_tma_reduce_add_compiles_from_gluon_for_sm90a():
    """benchmarks/tma_reduce_probe.py's wrapper of the Gluon builder's TMA reduce (the op a fused backward would add
    dQ partials with; Triton 3.6's hopper.tma does not wrap it) compiles to Hopper's bulk tensor reduce-add; the
    probe's expected sums follow its schedule (a hand-worked case)."""
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "tma_reduce_probe.py"), "--ptx"], capture_output=True,
                         text=True, cwd=root, timeout=300, env=dict(os.environ, TRITON_INTERPRET="0"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add" in run.stdout, run.stdout
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        import tma_reduce_probe
    finally:
        sys.path.pop(0)
    # 4 row blocks of 64, 5 programs adding p + 1 into blocks p, p + 1, p + 2 (mod 4)
    sums = tma_reduce_probe.expected(256, 8, 64, 3, 5)[::64, 0].tolist()
    assert sums == [1 + 3 + 4 + 5, 1 + 2 + 4 + 5, 1 + 2 + 3 + 5, 2 + 3 + 4]


def _record_gluon_launches(monkeypatch) -> tuple[list, list]:
    """The backward's route made to see an sm90 GPU (``FLASH_ATTN_BWD`` unset) and its Gluon launches recorded instead
    of run (no sm90 GPU here; the Triton launches go to the caller's stand-ins): (each dK / dV launch's (positional
    arguments, keywords), each dQ launch's keywords)."""
    dkdv, dq = [], []
    monkeypatch.setattr(configs, "_on_sm90", lambda q, sm_major: True)
    monkeypatch.setattr(bwd_gluon, "dkdv_launch", lambda *a, **kw: dkdv.append((a, kw)))
    monkeypatch.setattr(bwd_gluon, "dq_launch", lambda *a, **kw: dq.append(kw))
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    return dkdv, dq


def _inputs(b=1, sq=256, sk=256, hq=4, hk=2, d=128, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(3)
    q, do = (torch.randn(b, sq, hq, d, generator=g).to(device, dtype) for _ in range(2))
    k, v = (torch.randn(b, sk, hk, d, generator=g).to(device, dtype) for _ in range(2))
    lse, delta = (torch.randn(b, hq, sq, generator=g).to(device) for _ in range(2))
    return q, k, v, do, lse, delta


def _mla_inputs(b=1, sq=256, sk=256, hq=4, hk=2, device="cpu", dtype=torch.bfloat16):
    """q, k at 192 and v, dO at 128 (DeepSeek's MLA training form), lse and delta."""
    q, k, _, _, lse, delta = _inputs(b, sq, sk, hq, hk, 192, dtype, device)
    g = torch.Generator(device="cpu").manual_seed(5)
    v = torch.randn(b, sk, hk, 128, generator=g).to(device, dtype)
    do = torch.randn(b, sq, hq, 128, generator=g).to(device, dtype)
    return q, k, v, do, lse, delta


def test_unsupported_inputs_are_named():
    q, k, v, do, lse, delta = _inputs()
    assert bwd_gluon.unsupported(q, k, v, do, lse, delta) is None
    mla = _mla_inputs()
    assert bwd_gluon.unsupported(*mla) is None  # both kernels take MLA's 192 / 128
    assert "head dims" in bwd_gluon.unsupported(*_inputs(d=192))  # 192 / 192: no
    assert "dO's shape" in bwd_gluon.unsupported(*mla[:3], mla[3][..., :64], *mla[4:])
    assert "bf16 or fp16" in bwd_gluon.unsupported(q.float(), k.float(), v.float(), do.float(), lse, delta)
    assert "head dims" in bwd_gluon.unsupported(*_inputs(d=96))
    gemma = _inputs(d=256)  # (hd 256: the dQ kernel alone)
    assert "head dims" in bwd_gluon.unsupported(*gemma) and bwd_gluon.unsupported(*gemma, kernel="dq") is None
    assert "head dims" in bwd_gluon.unsupported(*_inputs(d=96), kernel="dq")
    assert "head dims" in bwd_gluon.unsupported(q, k, v[..., :64].contiguous(), do, lse, delta)
    assert "kv heads" in bwd_gluon.unsupported(*_inputs(hq=3, hk=2))
    assert "dO's shape" in bwd_gluon.unsupported(q, k, v, do[:, :100], lse, delta)
    assert "lse and delta" in bwd_gluon.unsupported(q, k, v, do, lse.transpose(1, 2).contiguous(), delta)
    assert "lse and delta" in bwd_gluon.unsupported(q, k, v, do, lse, delta.half())
    shifted = torch.empty(1, 256, 4, 136, dtype=q.dtype)[..., 4:132]  # its base 8 bytes off a 16-byte boundary
    assert "16-byte" in bwd_gluon.unsupported(shifted, k, v, do, lse, delta)
    with pytest.raises(ValueError, match="dkdv_gluon"):
        bwd_gluon.dkdv_gluon(q.float(), k, v, do, lse, delta, softmax_scale=0.1, causal=False)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for block_m, inputs in ((64, (q, k, v, do)), (128, mla[:4])):  # query halves: 128-row tiles, q / k = v
        with pytest.raises(ValueError, match="query halves"):
            bwd_gluon.dkdv_arguments(*inputs, lse, delta, dk, dv, 0.1, False, block_m, halves=True)


def _probe():
    """benchmarks/gluon_bwd_probe.py as a module (the benchmarks folder is no package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import gluon_bwd_probe

        return gluon_bwd_probe
    finally:
        sys.path.pop(0)


def test_the_probe_reads_its_configs_and_cells(capsys):
    probe = _probe()
    assert probe._config("32,3", "block_m") == dict(block_m=32, num_stages=3)
    assert probe._config("128,2", "block_n") == dict(block_n=128, num_stages=2)
    assert probe._config("128,2,h0", "block_m") == dict(block_m=128, num_stages=2, halves=False)
    assert probe._config("64,2,m1", "block_m") == dict(block_m=64, num_stages=2, mask_every_tile=True)
    assert probe._config("128,2,h1,m1", "block_m") == dict(block_m=128, num_stages=2, halves=True,
                                                           mask_every_tile=True)
    assert probe._config("64,2,m1,w1", "block_m") == dict(block_m=64, num_stages=2, mask_every_tile=True, walk=1)
    assert probe._config("64,3,u1", "block_m") == dict(block_m=64, num_stages=3, dq_unscaled=True)
    assert probe._config("64,3,a1,u1", "block_m") == dict(block_m=64, num_stages=3, adder=True, dq_unscaled=True)
    assert probe._config("128,2,d1", "block_m") == dict(block_m=128, num_stages=2, ds_smem=True)
    assert probe._config("64,2,t0", "block_m") == dict(block_m=64, num_stages=2, turns=False)
    for bad in ("64", "128,2,h0,1", "128,2,x", "a,2"):
        with pytest.raises(SystemExit):
            probe._config(bad, "block_m")
    with pytest.raises(SystemExit):
        probe._config("128,2,h1", "block_n")  # (the dQ kernel has no halves)
    if not SM90:  # the command line's configs are read before it asks for the GPU
        assert probe.main(["--dkdv", "64,2,m1", "--fused", "128,2,h0", "64,2,m1", "--dq", "128,2"]) == 2
        with pytest.raises(SystemExit):
            probe.main(["--dq", "128,2,m1"])
        for only_fused in ("64,2,u1", "64,3,a1", "64,2,d1", "64,2,o1"):
            with pytest.raises(SystemExit, match="fused"):
                probe.main(["--dkdv", only_fused])
        assert probe.main(["--fused", "64,2,t0", "128,2,a1,t0"]) == 2  # (no turns: either kernel's)
        assert probe.main(["--fused", "64,3,t0", "--whole"]) == 2
    with pytest.raises(SystemExit, match="--fused configs"):
        probe.main(["--fused", "--whole"])
    q, k, v, *_ = _inputs()  # --whole's route: a --fused config's keywords where the route would answer at all
    lse, kw = torch.empty(q.shape[0], q.shape[2], q.shape[1]), dict(causal=False, window_left=-1, window_right=-1,
                                                                     softcap=0.0, varlen=False, fp8=False)
    original = configs.gluon_fused_bwd
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLASH_ATTN_BWD", "fused")
        with probe.fused_route("64,3,a1,t0") as route:
            assert configs.gluon_fused_bwd(q, k, v, q, q, lse, sm_major=9, **kw) == route == dict(
                block_m=64, num_stages=3, dq_adder=True, walk=0, mask_every_tile=False, dq_unscaled=False,
                ds_smem=False, turns=False)
            assert configs.gluon_fused_bwd(q, k, v, q, q, lse, sm_major=8, **kw) is None  # (not where it cannot)
            assert configs.gluon_bwd(q, k, v, q, q, lse, sm_major=9, atomic=True, **kw) == {"fused": route}
        with probe.fused_route("64,2,t0,o1") as route:  # (the ordered kernel: flash_attn_bwd adds its counters)
            assert route["ordered"] is True and route["turns"] is False
        with probe.fused_route("128,2,h0,m1,d1") as route:
            assert route == dict(block_m=128, num_stages=2, dq_adder=False, walk=0, mask_every_tile=True,
                                 dq_unscaled=False, ds_smem=True, turns=True, halves=False)
    assert configs.gluon_fused_bwd is original
    best = {(128, "no", "sweep S1024 H16/16"): {("triton dq", "pinned"): (0.2, None),
                                                 ("gluon dq", "64,3"): (0.16, "triton dq")}}
    probe.summary(best)
    assert probe.parse_shape("2,2048,32,8") == (2, 2048, 32, 8)
    for bad in ("2,2048,32", "2,2048,12,8", "0,2048,8,8", "2,x,8,8"):
        with pytest.raises(SystemExit):
            probe.parse_shape(bad)
    cells = list(probe._cells([(64, 64)], [], [False, True], False, [(2, 2048, 12, 12)]))
    assert cells == [("B2 S2048", 2, 2048, 12, 12, 64, 64, False), ("B2 S2048", 2, 2048, 12, 12, 64, 64, True)]
    dims = [probe._dims(x) for x in "64,128,192/128".split(",")]
    assert dims == [(64, 64), (128, 128), (192, 128)]
    cells = list(probe._cells(dims, [1024, 4096], [False, True], models=True))
    assert len(cells) == 3 * 2 * 2 + len([m for m in probe.MODELS if m[-2:] in dims])  # (not Gemma-2's hd 256)
    gemma = list(probe._cells([(256, 256)], [], [False], models=True))
    assert gemma == [("Gemma-2-9B uncapped B2 S4096", 2, 4096, 16, 8, 256, 256, True)]
    assert probe._dkdv(256, "64,2").keywords == dict(num_stages=2)  # (hd 256: bwd_gluon_hd256's kernel)
    assert probe._dkdv(256, "64,2").func.__module__.endswith("bwd_gluon_hd256")
    assert probe._dkdv(128, "64,2,m1").keywords == dict(block_m=64, num_stages=2, mask_every_tile=True)
    for bad in ("32,2", "64,2,m1"):
        with pytest.raises(SystemExit, match="hd 256"):
            probe._dkdv(256, bad)
    if not SM90:  # (read before the GPU is asked for)
        with pytest.raises(SystemExit, match="hd 256"):
            probe.main(["--head-dims", "256", "--dkdv", "32,3", "--dq", "32,3"])
        assert probe.main(["--head-dims", "256", "--dkdv", "64,2", "--dq", "32,3"]) == 2
    assert ("sweep S1024", 16, 1024, 32, 32, 64, 64, False) in cells and cells[-1][-1] is True
    assert ("sweep S1024", 16, 1024, 16, 16, 192, 128, True) in cells  # MLA: hidden 2048 over v's head dim
    assert ("DeepSeek-V3 MLA B1 S4096", 1, 4096, 128, 128, 192, 128, True) in cells
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| summary | 128")]
    assert rows == ["| summary | 128 | no | sweep S1024 H16/16 | triton dq | pinned | 0.2000 | - |",
                    "| summary | 128 | no | sweep S1024 H16/16 | gluon dq | 64,3 | 0.1600 | 1.250 |"]


def test_the_probe_reads_where_the_sms_time_went_off_a_timeline():
    """gluon_bwd_probe.py --timeline's summary of bwd_gluon.timeline_record's fields, on a made-up launch: two SMs,
    SM 0 runs two programs back to back with a 100-cycle gap (60 to the second's entry, 40 from there to its
    consumers' start, 25 of them to its descriptors made), SM 1 one program; the ns timer runs at 0.5 ns a cycle.
    Records left unwritten (-1) are refused, but for the entry and descriptor stamps (a persistent program's later
    tiles have none)."""
    probe = _probe()
    fields = bwd_gluon.TIMELINE_FIELDS
    # per program, per consumer: start, K / V landed, loop end, end (cycles); ns timer start / end; SM; tiles
    programs = [[(0, 100, 900, 1000), (10, 100, 880, 990)], [(1100, 1150, 2000, 2100), (1100, 1160, 2050, 2080)],
                [(50, 150, 950, 1050), (50, 140, 960, 1040)]]
    sms, entries, descs, rows = [0, 0, 1], [0, 1060, 20], [5, 1085, 45], []
    for p, consumers in enumerate(programs):
        for c0, ckv, cloop, cend in consumers:
            rows.append([c0, ckv, cloop, cend, 1000 + c0 // 2, 1000 + cend // 2, sms[p], 16, entries[p], descs[p]])
    times = torch.tensor(rows, dtype=torch.int64).flatten()
    rec = bwd_gluon.timeline_record(times)
    assert set(rec) == set(fields) and rec["clock_start"].shape == (3, 2)
    t = probe.timeline_summary(rec)
    assert (t["programs"], t["sms"], t["overlaps"], t["tiles"]) == (3, 2, 0, 16)
    assert t["gap_us"] == pytest.approx(100 * 0.5 / 1e3)  # SM 0: 1100 - 1000 cycles
    assert t["launch_us"] == pytest.approx(60 * 0.5 / 1e3) and t["setup_us"] == pytest.approx(30 * 0.5 / 1e3)
    assert t["desc_us"] == pytest.approx(25 * 0.5 / 1e3)  # (5, 25, 25 cycles: the median)
    assert t["span_us"] == pytest.approx((2100 - 0) * 0.5 / 1e3)
    assert t["prologue_us"] == pytest.approx(100 * 0.5 / 1e3)  # the later consumer's K / V: 100, 60, 100
    assert t["epilogue_us"] == pytest.approx(90 * 0.5 / 1e3)  # end - the later loop end: 100, 50, 90
    total = 2100 * 2  # two SMs over the span, cycles
    assert t["gaps"] == pytest.approx(100 / total)
    assert t["loop"] + t["prologue"] + t["epilogue"] == pytest.approx((1000 + 1000 + 1000) / total)
    assert t["idle"] == pytest.approx(1 - (3000 + 100) / total)
    with pytest.raises(ValueError, match="unwritten"):
        bwd_gluon.timeline_record(torch.full((20, ), -1, dtype=torch.int64))
    # a persistent program's two tiles on one SM: the second's first consumer starts (at 950) before the first's other
    # consumer ends (1000); that record's start is taken as 1000, so no cycle counts twice and no gap is seen
    tiles = [[(0, 100, 900, 950), (0, 100, 920, 1000)], [(950, 1000, 1900, 2000), (1000, 1020, 1920, 1990)]]
    rows = [[c0, ckv, cloop, cend, 1000 + c0 // 2, 1000 + cend // 2, 0, 8, -1 if c0 > 0 else 0, -1 if c0 > 0 else 0]
            for pair in tiles for c0, ckv, cloop, cend in pair]
    t = probe.timeline_summary(bwd_gluon.timeline_record(torch.tensor(rows, dtype=torch.int64).flatten()))
    assert (t["programs"], t["sms"], t["overlaps"], t["gaps"], t["gap_us"], t["launch_us"]) == (2, 1, 1, 0, 0, 0)
    assert t["loop"] + t["prologue"] + t["epilogue"] == pytest.approx(1.0)  # (the span: 0 to 2000, all of it)
    assert t["prologue"] == pytest.approx((100 + 20) / 2000) and t["epilogue"] == pytest.approx((80 + 80) / 2000)


def test_the_probe_reads_decisions_off_its_repeats(tmp_path, capsys):
    """gluon_bwd_probe.py's speed-up table: a config against its kernel's first config and the fused route's whole
    backward against the default route's, repeat by repeat and only within what one run timed side by side (two
    logs of one cell pooled: a config only one of them ran is compared with that log's base alone)."""
    probe = _probe()
    head = "| hd | causal | shape | kernel | config | ms | / its Triton twin |\n|---|---|---|---|---|---|---|\n"
    row = "| 64 | no | sweep S4096 H32/32 | {} | {} | {} | 1.1 |\n"
    one = tmp_path / "one.md"  # two repeats: the base, ,d1, the whole backwards
    one.write_text(head + "".join(row.format(*r) for r in (
        ("routed bwd", "whole", 4.0), ("fused bwd", "whole", 3.6), ("gluon fused", "128,2", 3.5),
        ("gluon fused", "128,2,d1", 3.4)) * 2) + "\n| summary | 64 | no | sweep S4096 H32/32 | gluon fused | 128,2 "
        "| 3.0 | 1.3 |\n")
    two = tmp_path / "two.md"  # one repeat, a third config too
    two.write_text(head + "".join(row.format(*r) for r in (
        ("gluon fused", "128,2", 3.0), ("gluon fused", "128,2,d1", 3.3), ("gluon fused", "64,2", 2.5))))
    runs = probe.runs_from_logs([one, two])
    assert runs[("64", "no", "sweep S4096 H32/32")][("gluon fused", "128,2")] == {(0, 0): 3.5, (0, 1): 3.5,
                                                                                  (1, 0): 3.0}
    rows = {(r[3], r[4]): r[5:] for r in probe.speedups(runs)}
    got, geo, faster = rows["gluon fused", "128,2,d1 / 128,2"]
    assert got == pytest.approx([3.5 / 3.4, 3.5 / 3.4, 3.0 / 3.3]) and faster == 2
    assert geo == pytest.approx(((3.5 / 3.4) ** 2 * (3.0 / 3.3)) ** (1 / 3))
    assert rows["gluon fused", "64,2 / 128,2"][0] == pytest.approx([3.0 / 2.5])  # (the second log's base only)
    assert rows["fused bwd", "fused bwd / routed bwd"][0] == pytest.approx([4.0 / 3.6] * 2)
    assert probe.main(["--from-log", str(one), str(two)]) == 0
    out = capsys.readouterr().out
    assert "| speed-up | 64 | no | sweep S4096 H32/32 | gluon fused | 128,2,d1 / 128,2 | 1.029, 1.029, 0.909 |" in out
    with pytest.raises(SystemExit, match="no such file"):
        probe.main(["--from-log", str(tmp_path / "missing.md")])
    empty = tmp_path / "empty.md"
    empty.write_text("nothing timed\n")
    with pytest.raises(SystemExit, match="no per-repeat rows"):
        probe.main(["--from-log", str(empty)])


def _route(q, k, v, **over):
    kw = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, atomic=False,
              sm_major=9)
    kw.update(over)
    return configs.gluon_bwd(q, k, v, q, q, torch.empty(q.shape[0], q.shape[2], q.shape[1]), **kw)


def test_a_window_takes_the_split_gluon_kernels_one_program_a_tile_when_switched_on(monkeypatch):
    """configs.BWD_GLUON_WINDOW (built in session 51, on since session 52 measured it): off, a causal call with a window
    on the left keeps the Triton backward; on, it takes the split route's Gluon kernels wherever the windowless causal
    call does, one program a tile (a persistent cell's launch not persistent), ``window_left`` among the keywords;
    never the fused route (atomic), a window without causal, a softcap at a head dim configs.BWD_GLUON_SOFTCAP does
    not list (hd 128's capped window: its own test) or a length the route does not take. The kernels' arguments refuse
    what they cannot run with a window and cap a wide one at Sq + Sk."""
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    causal = dict(causal=True, window_right=0)
    q, k, v, do, lse, delta = _inputs(sq=4096, sk=4096)  # (GQA 4/2, hd 128)
    plain = _route(q, k, v, **causal)
    assert set(plain) == {"dq", "dkdv"} and plain["dq"].get("persistent")  # (the causal dQ: persistent to 4k)
    assert configs.BWD_GLUON_WINDOW is True  # (the routed default)
    monkeypatch.setattr(configs, "BWD_GLUON_WINDOW", False)
    assert _route(q, k, v, window_left=100, **causal) == {}
    monkeypatch.setattr(configs, "BWD_GLUON_WINDOW", True)
    assert _route(q, k, v, window_left=100, **causal) == {  # (one program a tile in the default order)
        name: dict({key: x for key, x in kw.items() if key not in ("persistent", "units_first")}, window_left=100)
        for name, kw in plain.items()}
    assert _route(q, k, v, window_left=0, **causal)["dkdv"]["window_left"] == 0  # (the diagonal only)
    for over in (dict(causal=False), dict(causal=False, window_right=-1), dict(atomic=True)):
        assert _route(q, k, v, **dict(causal, window_left=100, **over)) == {}, over
    assert _route(*_inputs(sq=512, sk=512)[:3], window_left=100, **causal) == {}  # (too short for either kernel)
    hd64 = _route(*_inputs(sq=4096, sk=4096, d=64)[:3], window_left=100, **causal)  # (hd 64: dK / dV only)
    assert set(hd64) == {"dkdv"} and hd64["dkdv"]["window_left"] == 100 and "persistent" not in hd64["dkdv"]
    assert _route(*_inputs(sq=4096, sk=4096, d=64)[:3], window_left=100, softcap=30.0, **causal) == {}  # (not listed)
    small = _inputs(sq=300, sk=500)
    dk, dv = torch.empty_like(small[1]), torch.empty_like(small[2])
    args = bwd_gluon.dkdv_arguments(*small, dk, dv, 0.125, True, window_left=10**9)
    assert args["WINDOW"] is True and args["window_left"] == 800  # (Sq + Sk: no int32 overflow in the kernel)
    assert "WINDOW" not in bwd_gluon.dkdv_arguments(*small, dk, dv, 0.125, True)
    for causal_, bad in ((False, {}), (True, dict(persistent=True)), (True, dict(dq_acc=torch.zeros(small[0].shape)))):
        with pytest.raises(ValueError, match="window"):
            bwd_gluon.dkdv_arguments(*small, dk, dv, 0.125, causal_, window_left=10, **bad)
    q2, k2, v2, do2, lse2, _ = small
    dq_args = bwd_gluon.dq_arguments(q2, k2, v2, do2, do2, lse2, lse2, q2, 0.125, True, window_left=7)
    assert dq_args["WINDOW"] is True and dq_args["window_left"] == 7
    for causal_, persistent in ((False, False), (True, True)):
        with pytest.raises(ValueError, match="window"):
            bwd_gluon.dq_arguments(q2, k2, v2, do2, do2, lse2, lse2, q2, 0.125, causal_, window_left=7,
                                   persistent=persistent)


def test_a_softcap_takes_the_gluon_split_kernels_at_the_listed_head_dims(monkeypatch):
    """configs.BWD_GLUON_SOFTCAP (hd 256 since session 54; hd 128 since session 56, both measured): a
    softcapped call keeps the Triton backward unless its head dim is listed; then the split route's Gluon kernels
    run it where the uncapped call would run them, the cap among their keywords, each at
    configs.BWD_GLUON_SOFTCAP_CONFIGS' config where it lists one (hd 128's dQ at 64-key tiles); never the fused
    route. hd 256 runs the dQ kernel (bwd_gluon.DQ_HEAD_DIMS) from 1k and its own dK / dV kernel (bwd_gluon_hd256,
    session 55) from 512, both masks (configs.BWD_GLUON), capped or not, both tried at any length under
    ``FLASH_ATTN_BWD=gluon``. Both kernels' arguments carry the cap and refuse one that is not positive; the fused
    kernel's refuse any."""
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    causal = dict(causal=True, window_right=0)
    q, k, v, do, lse, delta = _inputs(sq=4096, sk=4096)  # (GQA 4/2, hd 128: dQ and dK / dV on Gluon uncapped)
    plain = _route(q, k, v, **causal)
    assert set(plain) == {"dq", "dkdv"}
    assert configs.BWD_GLUON_SOFTCAP == frozenset({128, 256})  # (the routed default)
    monkeypatch.setattr(configs, "BWD_GLUON_SOFTCAP", frozenset({256}))
    assert _route(q, k, v, softcap=50.0, **causal) == {}
    gemma = _inputs(sq=4096, sk=4096, hq=16, hk=8, d=256)[:3]
    bn, st = configs.BWD_GLUON[256]["dq"]
    routed = {"dq": dict(block_n=bn, num_stages=st, host_desc=True),
              "dkdv": dict(num_stages=configs.BWD_GLUON[256]["dkdv"][1], lse_tma=True)}  # (BWD_GLUON_LSE_TMA)
    assert _route(*gemma, **causal) == routed
    assert _route(*gemma, softcap=50.0, **causal) == {n: dict(kw, softcap=50.0) for n, kw in routed.items()}
    for causal_ in (False, True):  # (dK / dV from 512, dQ from 1k: shorter sequences stay on the Triton kernels)
        for n, kernels in ((511, set()), (512, {"dkdv"}), (1023, {"dkdv"}), (1024, {"dq", "dkdv"})):
            short = _inputs(sq=n, sk=n, hq=4, hk=4, d=256)[:3]
            assert set(_route(*short, causal=causal_, window_right=0 if causal_ else -1)) == kernels, (n, causal_)
    monkeypatch.setattr(configs, "BWD_GLUON_SOFTCAP", frozenset({128, 256}))
    bn, st = configs.BWD_GLUON_SOFTCAP_CONFIGS[128, "dq", True]  # (hd 128's capped configs)
    bm, st_k = configs.BWD_GLUON_SOFTCAP_CONFIGS[128, "dkdv", True]
    assert _route(q, k, v, softcap=50.0, **causal) == {
        "dq": dict(plain["dq"], block_n=bn, num_stages=st, softcap=50.0),
        "dkdv": dict(plain["dkdv"], block_m=bm, num_stages=st_k, softcap=50.0)}
    bn, st = configs.BWD_GLUON_SOFTCAP_CONFIGS[128, "dq", False]  # (non-causal: the dK / dV kernel as routed)
    plain = _route(q, k, v)
    assert _route(q, k, v, softcap=50.0) == {"dq": dict(plain["dq"], block_n=bn, num_stages=st, softcap=50.0),
                                             "dkdv": dict(plain["dkdv"], softcap=50.0)}
    windowed = _route(q, k, v, softcap=50.0, window_left=100, **causal)  # (Gemma-2's local layers: both)
    assert set(windowed) == {"dq", "dkdv"}
    assert all(kw["softcap"] == 50.0 and kw["window_left"] == 100 for kw in windowed.values()), windowed
    assert _route(q, k, v, softcap=50.0, atomic=True, **causal) == {}
    assert _route(*_inputs(sq=4096, sk=4096, d=64)[:3], softcap=50.0, **causal) == {}  # (hd 64: not listed)
    monkeypatch.setenv("FLASH_ATTN_BWD", "gluon")  # (hd 256's dK / dV kernel too: bwd_gluon_hd256, its stages alone)
    bn, st = configs.BWD_GLUON_TRY[256]["dq"]
    wide = dict(num_stages=configs.BWD_GLUON_TRY[256]["dkdv"][1])
    wide["lse_tma"] = True  # (BWD_GLUON_LSE_TMA lists hd 256 since session 59)
    assert _route(*gemma, **causal) == {"dq": dict(block_n=bn, num_stages=st, host_desc=True), "dkdv": wide}
    assert _route(*gemma, softcap=50.0, **causal) == {"dq": dict(block_n=bn, num_stages=st, host_desc=True,
                                                                  softcap=50.0), "dkdv": dict(wide, softcap=50.0)}
    assert set(_route(*gemma, window_left=100, **causal)) == {"dq"}  # (no window in hd 256's dK / dV kernel)
    monkeypatch.setattr(configs, "BWD_GLUON_SOFTCAP", frozenset({128}))
    assert _route(*gemma, softcap=50.0, **causal) == {}
    args = bwd_gluon.dq_arguments(q, k, v, do, do, lse, lse, q, 0.125, True, softcap=50.0)
    assert args["SOFTCAP"] is True and args["softcap"] == 50.0
    assert "SOFTCAP" not in bwd_gluon.dq_arguments(q, k, v, do, do, lse, lse, q, 0.125, True)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args = bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.125, True, softcap=50.0)
    assert args["SOFTCAP"] is True and args["softcap"] == 50.0
    assert "SOFTCAP" not in bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.125, True)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="softcap"):
            bwd_gluon.dq_arguments(q, k, v, do, do, lse, lse, q, 0.125, True, softcap=bad)
        with pytest.raises(ValueError, match="softcap"):
            bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.125, True, softcap=bad)
    with pytest.raises(ValueError, match="softcap"):  # (the fused kernel: no cap)
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.125, True, dq_acc=torch.empty(q.shape),
                                 softcap=50.0)


def test_the_backward_routes_to_gluon_only_where_asked_and_able(monkeypatch):
    """By default each kernel of configs.BWD_GLUON from its measured length on (hd 128: dK / dV from 1k, dQ from
    1k, both masks; hd 64: dK / dV from 1k, non-causal on 128-row tiles from 4k and MHA only:
    configs.BWD_GLUON_BY_MASK); FLASH_ATTN_BWD=split / atomic: the Triton kernels;
    FLASH_ATTN_BWD=gluon: both Gluon kernels at any length. Only the split mode, dense bf16 / fp16 causal or
    unmasked calls on sm90 (capped only at BWD_GLUON_SOFTCAP's head dims), nothing else. The dK / dV kernel walks a
    GQA group's steps in one flat loop at hd 128 (these inputs are GQA 4/2: walk 1; hd 64 and MHA: 0). Persistent
    launches, host-made descriptors, lse by TMA and units first: off here, their own tests."""
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(configs, "BWD_GLUON_PERSISTENT", {})
    monkeypatch.setattr(configs, "BWD_GLUON_UNITS_FIRST", frozenset())
    monkeypatch.setattr(configs, "BWD_GLUON_LSE_TMA", frozenset())  # (test_lse_by_tma_routes_...)
    monkeypatch.setattr(configs, "BWD_GLUON_HOST_DESC", frozenset())  # (host-made descriptors: their own test)
    dq, dkdv = (dict(zip(configs._BWD_GLUON_KEYS[n], configs.BWD_GLUON[128][n])) for n in ("dq", "dkdv"))
    dkdv = dict(dkdv, walk=1)
    least = configs.BWD_GLUON_MIN_SEQLEN
    q, k, v, *_ = _inputs()
    assert _route(q, k, v) == {}  # 256 tokens: the Triton kernels
    for causal in (False, True):
        mask = dict(causal=causal, window_right=0 if causal else -1)
        at = lambda n, mask=mask, **kw: _route(*_inputs(sq=n, sk=n, **kw)[:3], **mask)  # noqa: E731
        n_k, n_q = least[128]["dkdv"][causal], least[128]["dq"][causal]
        for n in sorted({n_k - 1, n_k, n_q - 1, n_q}):  # each kernel from its own length (the two may be equal)
            want = {**({"dq": dq} if n >= n_q else {}), **({"dkdv": dkdv} if n >= n_k else {})}
            assert at(n) == want, (causal, n)
    assert least[128]["dq"] == {False: 1024, True: 1024}  # (sessions 50 / 52: non-causal / causal dQ from 1k)
    hd64 = lambda n, **mask: _route(*_inputs(sq=n, sk=n, d=64)[:3], **mask)  # noqa: E731
    n64 = least[64]["dkdv"][True]
    assert hd64(n64, causal=True, window_right=0) == {"dkdv": dict(dkdv, walk=0)}
    assert hd64(n64 - 1, causal=True, window_right=0) == {}
    mha = _inputs(sq=4096, sk=4096, hk=4)[:3]
    assert _route(*mha)["dkdv"]["walk"] == 0 and _route(*_inputs(sq=4096, sk=4096, hk=1)[:3])["dkdv"]["walk"] == 1
    n64 = least[64]["dkdv"][False]  # hd 64 non-causal: 64-row tiles from the kernel's own length, GQA / MQA too ...
    mha64 = lambda n: _route(*_inputs(sq=n, sk=n, d=64, hk=4)[:3])  # noqa: E731
    row64 = {"dkdv": dict(block_m=64, num_stages=2, walk=0)}
    assert mha64(n64) == row64 == hd64(n64) == _route(*_inputs(sq=n64, sk=n64, d=64, hk=1)[:3])  # MHA, GQA 4/2, MQA
    assert mha64(n64 - 1) == {} == hd64(n64 - 1)
    by_mask = configs.BWD_GLUON_BY_MASK[64, "dkdv", False][0]  # ... and 128-row tiles from their own length, MHA only
    assert n64 < by_mask and mha64(by_mask - 1) == row64 and mha64(by_mask)["dkdv"]["block_m"] == 128
    assert hd64(by_mask) == {}  # (GQA / MQA there: not measured, the Triton kernel)
    long_q = _inputs(sq=8192, sk=least[128]["dkdv"][False] - 1)  # the shorter sequence decides
    assert _route(*long_q[:3]) == {}
    long = _inputs(sq=4096, sk=4096)[:3]
    assert _route(*long) == {"dq": dq, "dkdv": dkdv}
    for mode in ("split", "atomic"):  # forced modes keep the Triton kernels (the probes' baseline)
        monkeypatch.setenv("FLASH_ATTN_BWD", mode)
        assert _route(*long) == {}, mode
    monkeypatch.setenv("FLASH_ATTN_BWD", "gluon")
    assert configs.bwd_mode(128, q.dtype, False, 0) == "split"
    (bn, st_q), (bm, st_k) = configs.BWD_GLUON_TRY[128]["dq"], configs.BWD_GLUON_TRY[128]["dkdv"]
    want = {"dq": dict(block_n=bn, num_stages=st_q), "dkdv": dict(block_m=bm, num_stages=st_k, walk=1)}
    assert _route(q, k, v) == want == _route(q, k, v, causal=True, window_right=0)
    assert _route(*_inputs(d=64)[:3]) and _route(*_inputs(dtype=torch.float16)[:3])
    for over in (dict(window_left=8), dict(window_right=4), dict(varlen=True), dict(fp8=True),
                 dict(atomic=True), dict(sm_major=8), dict(sm_major=10), dict(sm_major=None)):
        assert _route(q, k, v, **over) == {}, over
    assert _route(*_inputs(d=64)[:3], softcap=30.0) == {}  # (a cap at a head dim BWD_GLUON_SOFTCAP does not list)
    assert _route(*_inputs(d=96)[:3]) == {} and _route(q.float(), k.float(), v.float()) == {}
    mq, mk, mv, mdo, *_ = _mla_inputs()  # MLA: both kernels at the tried configs at any length
    kw = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, atomic=False,
              sm_major=9)
    lse = torch.empty(1, mq.shape[2], mq.shape[1])
    (bn, st_q), (bm, st) = configs.BWD_GLUON_TRY[192]["dq"], configs.BWD_GLUON_TRY[192]["dkdv"]
    assert configs.gluon_bwd(mq, mk, mv, mdo, mdo, lse, **kw) == {"dq": dict(block_n=bn, num_stages=st_q),
                                                                  "dkdv": dict(block_m=bm, num_stages=st, walk=0)}
    monkeypatch.delenv("FLASH_ATTN_BWD")
    assert configs.gluon_bwd(mq, mk, mv, mdo, mdo, lse, **kw) == {}  # MLA by default: too short
    mla = {n: dict(zip(configs._BWD_GLUON_KEYS[n], configs.BWD_GLUON[192][n])) for n in ("dq", "dkdv")}
    mla["dkdv"]["walk"] = 0
    for causal in (False, True):  # ... and from BWD_GLUON_MIN_SEQLEN[192]'s lengths, each kernel on its own
        mask = dict(kw, causal=causal, window_right=0 if causal else -1)
        for n in (1, 32, 256, 512, 1024, 2048):
            mq, mk, mv, mdo, *_ = _mla_inputs(sq=n, sk=n)
            lse = torch.empty(1, mq.shape[2], n)
            want = {name: c for name, c in mla.items() if n >= configs.BWD_GLUON_MIN_SEQLEN[192][name][causal]}
            assert configs.gluon_bwd(mq, mk, mv, mdo, mdo, lse, **mask) == want, (causal, n)
    assert configs.BWD_GLUON_MIN_SEQLEN[192]["dkdv"][True] == 512 < configs.BWD_GLUON_MIN_SEQLEN[192]["dq"][True]
    assert _route(*_inputs(sq=2048, sk=2048, d=192)[:3]) == {}  # 192 / 192: no Gluon kernel has that pair


def test_the_fused_backward_routes_only_where_asked_and_able(monkeypatch):
    """configs.gluon_fused_bwd: FLASH_ATTN_BWD=fused runs wherever the kernel can (hd 64 / 128, q / k = v, dense
    bf16 / fp16, causal or no mask, sm90) at any length, a cell BWD_GLUON_FUSED lists at its routed config (what a
    lower routing length would run), others at BWD_GLUON_FUSED_TRY's; by default BWD_GLUON_FUSED's cells
    from their lengths; never under split / atomic / gluon. gluon_bwd in the atomic mode names it "fused". The adds
    go through an adder warp in BWD_GLUON_FUSED_ADDER's cells (hd 128 non-causal), and causal ones put the mask on
    every tile at BWD_GLUON_FUSED_MASK_EVERY_TILE's head dims (hd 128), either way. (Host-made descriptors and units
    first: off here, their own tests.)"""
    monkeypatch.setattr(configs, "BWD_GLUON_HOST_DESC", frozenset())
    monkeypatch.setattr(configs, "BWD_GLUON_UNITS_FIRST", frozenset())
    kw = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, sm_major=9)

    def fused(q, k, v, **over):
        return configs.gluon_fused_bwd(q, k, v, q, q, torch.empty(q.shape[0], q.shape[2], q.shape[1]),
                                       **dict(kw, **over))

    def persistent(d, causal, n):  # (configs.BWD_GLUON_PERSISTENT's fused cells, to their lengths: default route)
        return {"persistent": order} if (order := configs.persistent_bwd("fused", d, causal, n)) else {}

    monkeypatch.setenv("FLASH_ATTN_BWD", "fused")
    q, k, v, *_ = _inputs()
    for d in bwd_gluon.FUSED_HEAD_DIMS:  # (GQA's cells: listed since session 59, their config; else the TRY one)
        tried = {c: configs.BWD_GLUON_FUSED.get(d, {}).get((True, c), (0, configs.BWD_GLUON_FUSED_TRY[d]))[1]
                 for c in (False, True)}
        x = _inputs(d=d)[:3]
        plain, causal = fused(*x), fused(*x, causal=True, window_right=0)  # (GQA 4/2: flat walk at hd 128)
        unscaled = d in configs.BWD_GLUON_FUSED_DQ_UNSCALED
        tma = {c: {"lse_tma": True} if (d, c) in configs.BWD_GLUON_FUSED_LSE_TMA else {} for c in (False, True)}
        (bm, st), (bm_c, st_c) = tried[False], tried[True]
        assert plain == dict(block_m=bm, num_stages=st, dq_adder=d == 128, walk=int(d == 128), mask_every_tile=False,
                             dq_unscaled=unscaled, ds_smem=(d, False) in configs.BWD_GLUON_FUSED_DS_SMEM,
                             turns=(d, False) not in configs.BWD_GLUON_FUSED_NO_TURNS, **tma[False])  # (forced)
        assert causal == dict(block_m=bm_c, num_stages=st_c, dq_adder=False, walk=int(d == 128),
                              mask_every_tile=d == 128, dq_unscaled=unscaled,
                              ds_smem=(d, True) in configs.BWD_GLUON_FUSED_DS_SMEM,
                              turns=(d, True) not in configs.BWD_GLUON_FUSED_NO_TURNS, **tma[True])
        assert _route(*x, atomic=True) == {"fused": plain}
    assert fused(*_inputs(sq=1, sk=1)[:3]) and fused(*_inputs(dtype=torch.float16)[:3])
    for d, cells in configs.BWD_GLUON_FUSED.items():  # a routed cell: its config, at any length
        for (gqa, causal), (least, (bm, st)) in cells.items():
            short = _inputs(sq=64, sk=64, d=d, hq=4, hk=2 if gqa else 4)[:3]
            got = fused(*short, causal=causal, window_right=0 if causal else -1)
            assert (got["block_m"], got["num_stages"]) == (bm, st) and least > 64, (d, gqa, causal)
    for over in (dict(window_left=8), dict(window_right=4), dict(softcap=30.0), dict(varlen=True), dict(fp8=True),
                 dict(sm_major=8), dict(sm_major=None)):
        assert fused(q, k, v, **over) is None, over
    mq, mk, mv, *_ = _mla_inputs()  # MLA's 192 / 128 and other head dims: not built
    assert fused(mq, mk, mv) is None and fused(*_inputs(d=192)[:3]) is None and fused(*_inputs(d=96)[:3]) is None
    for mode in ("split", "atomic", "gluon"):
        monkeypatch.setenv("FLASH_ATTN_BWD", mode)
        assert fused(q, k, v) is None and _route(q, k, v, atomic=True) == {}, mode
    monkeypatch.delenv("FLASH_ATTN_BWD")
    for d, cells in configs.BWD_GLUON_FUSED.items():  # the default: each routed cell from its length on
        for (gqa, causal), (least, (bm, st)) in cells.items():
            mask = dict(causal=causal, window_right=0 if causal else -1)
            heads = dict(hq=4, hk=2 if gqa else 4)
            adder = (d, causal) in configs.BWD_GLUON_FUSED_ADDER
            every = causal and d in configs.BWD_GLUON_FUSED_MASK_EVERY_TILE
            assert fused(*_inputs(sq=least, sk=least, d=d, **heads)[:3], **mask) == dict(
                block_m=bm, num_stages=st, dq_adder=adder, walk=int(gqa and d == 128), mask_every_tile=every,
                dq_unscaled=d in configs.BWD_GLUON_FUSED_DQ_UNSCALED,
                ds_smem=(d, causal) in configs.BWD_GLUON_FUSED_DS_SMEM,
                turns=(d, causal) not in configs.BWD_GLUON_FUSED_NO_TURNS,
                **persistent(d, causal, least), **({"lse_tma": True} if (d, causal) in configs.BWD_GLUON_FUSED_LSE_TMA
                                                   else {}))
            assert fused(*_inputs(sq=least - 1, sk=least - 1, d=d, **heads)[:3], **mask) is None
    assert configs.BWD_GLUON_FUSED[128][False, False][0] == 1024  # measured (session 44, H200): 1.07-1.09x whole at 1k
    assert configs.BWD_GLUON_FUSED[128][False, True][0] == 1024  # measured (session 46, H200, persistent at 1k):
    # 1.09-1.10x whole at 1k
    assert configs.BWD_GLUON_FUSED_ADDER == {(128, False)}  # measured (session 37): 1.035-1.059x there only
    assert configs.BWD_GLUON_FUSED_MASK_EVERY_TILE == {128}  # measured (session 39): causal 1.034-1.080x at hd 128
    assert configs.BWD_GLUON_FUSED_DQ_UNSCALED == frozenset()  # measured (session 40): 0.97-1.02x, not routed
    assert configs.BWD_GLUON_FUSED_DS_SMEM == frozenset()  # measured (sessions 41-42): 1.01-1.03x alone, ~1.00 whole
    assert configs.BWD_GLUON_FUSED_NO_TURNS == {(64, True)}  # measured (session 42): 1.09-1.12x whole, hd 64 causal
    assert configs.BWD_GLUON_NO_TURNS == frozenset()  # measured (sessions 42-43): 1.00-1.02x whole, hd 128 non-causal
    assert configs.BWD_GLUON_FUSED_ORDERED == {(128, False): 8192}  # measured (session 44): 1.08-1.10x whole 8k-16k
    assert configs.BWD_GLUON_FUSED_LSE_TMA == {(64, False), (64, True), (128, False), (128, True)}  # measured
    # (session 59): 1.04-1.11x whole at hd 64 / 128, 2k-4k
    monkeypatch.setenv("FLASH_ATTN_BWD", "ordered")  # the ordered kernel: 64-row tiles, any length, GQA too
    assert configs.ordered_bwd_cell(64, 64, False, False, 64) == (64, configs.BWD_GLUON_FUSED[64][False, False][1][1])
    assert configs.ordered_bwd_cell(128, 128, True, True, 64) == (64, configs.BWD_GLUON_FUSED_TRY[128][1])
    assert configs.ordered_bwd_cell(192, 128, False, True, 4096) is None  # (q / k = v only)
    assert configs.fused_bwd_cell(128, 128, False, False, 8192) is None  # (the adapter: a deterministic backward)
    ordered = _inputs(sq=4096, sk=4096, hq=4, hk=4)[:3]
    assert fused(*ordered)["ordered"] is True and fused(*ordered, deterministic=True)["ordered"] is True
    monkeypatch.setenv("FLASH_ATTN_BWD", "fused")  # (the unordered one, deterministic call or not)
    assert "ordered" not in fused(*ordered, deterministic=True)
    monkeypatch.delenv("FLASH_ATTN_BWD")
    assert configs.ordered_bwd_cell(128, 128, False, True, 1 << 20) is None  # (no cell listed)
    assert configs.ordered_bwd_cell(128, 128, False, False, 8192) == (64, 3)  # (the routed cell, its stages)
    assert configs.ordered_bwd_cell(128, 128, False, False, 8191) is None  # (below its own length)
    least = configs.BWD_GLUON_FUSED[128][False, True][0]
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_ORDERED", {(128, True): least // 2})  # (the fused route's length
    assert configs.ordered_bwd_cell(128, 128, False, True, least) == (64, 2)  # is the least either way)
    assert configs.ordered_bwd_cell(128, 128, False, True, least - 1) is None
    assert configs.ordered_bwd_cell(128, 128, True, True, least) is None  # (MHA only)
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_ORDERED", {})
    assert configs.BWD_GLUON_FUSED[64][False, True][0] == 1024  # (session 46: persistent, 1.17-1.22x at 1k-2k)
    assert configs.BWD_GLUON_FUSED[64][False, False][0] == 2048  # (session 59, with lse by TMA: 1.10-1.12x at 2k)
    assert configs.BWD_GLUON_FUSED[64][False, False][1] == (128, 2)  # (session 39: 128-row tiles non-causal)
    routed = _inputs(sq=4096, sk=4096, hq=4, hk=4)[:3]  # ... for calls that allow a nondeterministic backward
    assert fused(*routed) is not None and fused(*routed, deterministic=True) is None
    monkeypatch.setenv("FLASH_ATTN_BWD", "fused")  # (forced: tests and probes, deterministic or not)
    assert fused(*routed, deterministic=True) is not None
    monkeypatch.delenv("FLASH_ATTN_BWD")
    # GQA / MQA: hd 128 non-causal from 1k (session 59), causal from 1k (session 60, with units first and at most 4
    # heads a program; session 59 without: from 8k only, 64/8 4k causal 0.91-0.92x)
    assert configs.BWD_GLUON_FUSED[128][True, False][0] == 1024 and configs.BWD_GLUON_FUSED[128][True, True][0] == 1024
    for gqa_heads in (dict(hq=4, hk=2), dict(hq=4, hk=1)):
        assert fused(*_inputs(sq=1000, sk=1000, **gqa_heads)[:3], causal=True, window_right=0) is None
        assert fused(*_inputs(sq=1024, sk=1024, **gqa_heads)[:3], causal=True, window_right=0)["walk"] == 1
        assert fused(*_inputs(sq=1024, sk=1024, **gqa_heads)[:3]) is not None
    lse = torch.empty(1, 4, 256)
    assert "64-row" in bwd_gluon.fused_unsupported(q, k, v, q, lse, lse, 32)
    assert "64-row query tiles at hd 128" in bwd_gluon.fused_unsupported(q, k, v, q, lse, lse, 128)
    q64, k64, v64, *_ = _inputs(d=64)
    assert bwd_gluon.fused_unsupported(q64, k64, v64, q64, lse, lse, 128) is None  # (row halves)
    assert "head dims" in bwd_gluon.fused_unsupported(*_mla_inputs()[:4], lse, lse)
    assert bwd_gluon.fused_unsupported(q, k, v, q, lse, lse) is None


def test_the_backward_hands_each_gluon_launch_its_routed_walk(monkeypatch):
    """flash_attn_bwd passes configs.gluon_bwd's / gluon_fused_bwd's keywords to the Gluon dK / dV launch: the flat
    walk for a GQA / MQA group at hd 128 (split route and fused), the nested loops for MHA and at hd 64; the fused
    route's adder warp at hd 128 non-causal, dQ's partials without the softmax scale, which the cast launch then
    applies (its SCALE on, the call's scale), and dK's dS^T from shared memory by (head dim, mask) cell. (No sm90
    GPU here: the route is made to see one and the Gluon launches are recorded; the Triton ones go to stand-ins,
    which log their arguments.)"""
    from kernels.flash_attn import bwd
    from kernels.standins import cpu_replays

    seen, log = _record_gluon_launches(monkeypatch)[0], []

    def call(hq, hk, d, causal=True, deterministic=True, s=4096):
        q, k, v, do, _, _ = _inputs(sq=s, sk=s, hq=hq, hk=hk, d=d)
        lse = torch.zeros(1, hq, s)
        log.clear()
        with cpu_replays(log):
            bwd.flash_attn_bwd(do, q, k, v, q.clone(), lse, softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                               window_right=0 if causal else -1, deterministic=deterministic)
        return seen.pop()[1]

    def cast_args():  # (scale, SCALE) of the last call's dQ cast launch
        (args,) = [a for how, name, a, _ in log if name == "_cast_dq"]
        return args[3], args[5]

    assert call(8, 2, 128)["walk"] == 1 and call(8, 1, 128)["walk"] == 1  # GQA / MQA: the flat walk
    assert call(8, 8, 128)["walk"] == 0 and call(8, 2, 64, s=8192)["walk"] == 0  # MHA, hd 64: nested
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_DQ_UNSCALED", frozenset({128}))  # (not routed by default)
    fused = call(8, 8, 128, causal=False, deterministic=False)  # the fused route (MHA hd 128 from 2k)
    assert fused["dq_adder"] is True and fused["walk"] == 0 and fused["dq_acc"] is not None
    assert fused["dq_unscaled"] is True and cast_args() == (128 ** -0.5, True)
    assert call(8, 8, 128, causal=True, deterministic=False)["dq_adder"] is False
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_DQ_UNSCALED", frozenset())  # not routed: the kernel scales
    assert call(8, 8, 64, causal=False, deterministic=False, s=8192)["dq_unscaled"] is False
    assert cast_args() == (64 ** -0.5, False)
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_DS_SMEM", frozenset({(64, False)}))  # (not routed by default)
    assert call(8, 8, 64, causal=False, deterministic=False, s=8192)["ds_smem"] is True
    assert call(8, 8, 128, causal=False, deterministic=False)["ds_smem"] is False  # (the cell is (head dim, mask))
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_DS_SMEM", frozenset())
    assert call(8, 8, 64, causal=False, deterministic=False, s=8192)["ds_smem"] is False
    for name, fused_route in (("BWD_GLUON_FUSED_NO_TURNS", True), ("BWD_GLUON_NO_TURNS", False)):  # by cell, each route
        monkeypatch.setattr(configs, name, frozenset({(128, False)}))
        assert call(8, 8, 128, causal=False, deterministic=not fused_route)["turns"] is False
        assert call(8, 8, 128, causal=True, deterministic=not fused_route).get("turns", True) is True
        assert call(8, 8, 128, causal=False, deterministic=fused_route).get("turns", True) is True  # (other route's)
        monkeypatch.setattr(configs, name, frozenset())


def test_the_fused_gqa_route_takes_its_least_group_split(monkeypatch):
    """configs.BWD_GLUON_FUSED_GQA_HEADS: a fused GQA / MQA call of a listed (head dim, mask) cell splits its group so
    that no program walks more than the listed query heads (hd 128 causal: 4; a group of 8 in two, 5 in two, 4 not),
    where bwd.group_split alone gives 1 once the programs fill the SMs; its dK / dV partials then go through the sum's
    launch, which casts dQ too (no _cast_dq launch). MHA, an unlisted cell, the split route and a caller's own split
    are unchanged. (No sm90 GPU here: the route is made to see one, the Gluon launch is recorded, the Triton ones go to
    stand-ins.)"""
    from kernels.flash_attn import bwd
    from kernels.standins import cpu_replays

    seen, log = _record_gluon_launches(monkeypatch)[0], []
    monkeypatch.setattr(bwd, "group_split", lambda *a: 1)  # (as once the programs fill the SMs)

    def call(hq, hk, causal=True, deterministic=False, split=None):
        q, k, v, do, _, _ = _inputs(sq=1024, sk=1024, hq=hq, hk=hk)
        log.clear()
        with cpu_replays(log):
            bwd.flash_attn_bwd(do, q, k, v, q.clone(), torch.zeros(1, hq, 1024), softmax_scale=0.1, causal=causal,
                               window_left=-1, window_right=0 if causal else -1, deterministic=deterministic,
                               split=split)
        names = [name for _, name, _, _ in log]
        args, kw = seen.pop()
        return args[10], "dq_acc" in kw, names

    assert configs.BWD_GLUON_FUSED_GQA_HEADS == {(128, True): 4}
    assert configs.BWD_GLUON_FUSED[128][True, True][0] <= 1024  # (the fused route at 1k: these calls take it)
    split, fused, names = call(8, 2)
    assert (split, fused) == (1, True) and "_cast_dq" in names and "_sum_partials" not in names  # (4 heads)
    split, fused, names = call(8, 1)
    assert (split, fused) == (2, True) and "_sum_partials" in names and "_cast_dq" not in names  # (8 heads)
    assert call(10, 2)[0] == 2 and call(16, 1)[0] == 4 and call(32, 1)[0] == 8
    assert call(8, 1, causal=False)[:2] == (1, True)  # (an unlisted cell)
    assert call(8, 8)[:2] == (1, True)  # (MHA)
    assert call(8, 1, deterministic=True)[:2] == (1, False)  # (the split route: no dQ buffer)
    assert call(8, 1, split=8)[0] == 8 and call(8, 2, split=3)[0] == 3  # (the caller's own split)
    monkeypatch.setitem(configs.BWD_GLUON_FUSED_GQA_HEADS, (128, True), 0)
    assert call(8, 1)[0] == 1  # (listed as nothing: no split)


def test_the_preprocess_zeroes_the_ordered_adds_counters():
    """bwd._bwd_preprocess with ``Sem`` (the ordered fused backward's counters, bwd_gluon.order_counters' layout:
    a spare one, then one a (batch, head, 64-row query tile)): every counter zeroed, delta and dQ's zeroed buffer as
    without (interpreter, odd length)."""
    from kernels.flash_attn import bwd

    b, s, h, d = 2, 150, 3, 64
    g = torch.Generator().manual_seed(1)
    out, do = torch.randn(b, s, h, d, generator=g), torch.randn(b, s, h, d, generator=g)
    sem = torch.full((1 + b * h * -(-s // 64), ), 7, dtype=torch.int32)
    assert sem.numel() == bwd_gluon.order_counters(out, 64).numel()
    delta, dq_acc = torch.empty(b, h, s), torch.full((b, s, h, d), 5.0)
    bwd._bwd_preprocess[(-(-s // bwd.PREPROCESS_BLOCK_M), b * h)](
        out, do, delta, dq_acc, *out.stride()[:3], *do.stride()[:3], *delta.stride()[:2], *dq_acc.stride()[:3], None,
        s, h, HEAD_DIM=d, BLOCK_D=d, IS_VARLEN=False, BLOCK_M=bwd.PREPROCESS_BLOCK_M, HEAD_DIM_Q=d, BLOCK_DQ=d,
        Sem=sem)
    assert bool((sem == 0).all()) and bool((dq_acc == 0).all())
    assert torch.allclose(delta, (out * do).sum(-1).transpose(1, 2), atol=1e-5)


def test_persistent_launches_only_where_asked(monkeypatch):
    """configs.BWD_GLUON_PERSISTENT's cells (session 46's measured table by default, a test's own after) and
    FLASH_ATTN_BWD=persistent (everywhere) hand the split route's Gluon dK / dV and dQ launches and the unordered
    fused launch ``persistent=True``; the ordered launch (deterministic calls in configs.BWD_GLUON_FUSED_ORDERED's
    cells) never; without either, no launch is persistent. (No sm90 GPU here: as the walk test above.)"""
    from kernels.flash_attn import bwd
    from kernels.standins import cpu_replays

    seen, seen_dq = _record_gluon_launches(monkeypatch)

    def call(d, causal, s, deterministic):
        q, k, v, do, _, _ = _inputs(sq=s, sk=s, hq=4, hk=4, d=d)
        with cpu_replays([]):
            bwd.flash_attn_bwd(do, q, k, v, q.clone(), torch.zeros(1, 4, s), softmax_scale=d ** -0.5, causal=causal,
                               window_left=-1, window_right=0 if causal else -1, deterministic=deterministic)
        return seen.pop()[1]

    assert configs.BWD_GLUON_PERSISTENT == {  # measured (sessions 46-47, H200): whole backward 1.02-1.22x a cell
        ("fused", 64, True): 4096, ("fused", 128, True): 1024, ("dkdv", 128, False): 2048, ("dkdv", 128, True): 1024,
        ("dq", 128, False): 2048, ("dq", 128, True): 4096, ("dkdv", 64, False): 4096, ("dkdv", 64, True): 4096}
    split, fused = call(128, True, 2048, True), call(128, False, 2048, False)  # (the split route; the fused one)
    assert "persistent" not in split and "dq_acc" not in split and "persistent" not in fused and "dq_acc" in fused
    assert call(128, True, 1024, True)["persistent"] is True  # (the split route's dK / dV, causal to 1k)
    assert call(128, False, 2048, True)["persistent"] is True  # (... non-causal to 2k)
    assert "persistent" not in call(128, False, 4096, True)
    fused_c = call(128, True, 1024, False)  # (the fused route, hd 128 causal from 1k: persistent at 1k only)
    assert fused_c["persistent"] is True and "dq_acc" in fused_c and "persistent" not in call(128, True, 2048, False)
    assert call(64, True, 4096, False)["persistent"] is True and "persistent" not in call(64, True, 8192, False)
    seen_dq.clear()
    call(128, False, 1024, True)  # (the split route's Gluon dQ, non-causal, at its shortest routed length ...)
    assert seen_dq.pop()["persistent"] is True
    call(128, False, 4096, True)  # (... and one program a tile past 2k)
    assert "persistent" not in seen_dq.pop()
    call(128, False, 8192, True)  # (the ordered kernel from 8k: no dQ launch of its own)
    assert not seen_dq
    call(128, True, 1024, True)  # (causal: from 1k since session 52, dK / dV's length too, persistent to 4k)
    assert seen_dq.pop()["persistent"] is True
    monkeypatch.setattr(configs, "BWD_GLUON_PERSISTENT", {("dkdv", 128, True): 2048, ("fused", 128, False): 1024})
    assert call(128, True, 2048, True)["persistent"] is True  # (the cell, at its longest)
    assert "persistent" not in call(128, True, 2056, True)  # (longer)
    assert "persistent" not in call(128, False, 2048, False)  # (the fused cell's longest is 1k)
    assert call(128, False, 1024, False)["persistent"] is True
    monkeypatch.setattr(configs, "BWD_GLUON_PERSISTENT", {})
    monkeypatch.setenv("FLASH_ATTN_BWD", "persistent")
    assert call(128, True, 2048, True)["persistent"] is True and call(128, False, 2048, False)["persistent"] is True
    ordered = call(128, False, 8192, True)  # (a deterministic call in an ordered cell: the ordered kernel)
    assert "dq_order" in ordered and "persistent" not in ordered
    # the split route's Gluon dQ kernel (hd 128 causal from 2k: configs.BWD_GLUON_MIN_SEQLEN)
    seen_dq.clear()
    call(128, True, 4096, True)
    assert seen_dq.pop()["persistent"] is True
    monkeypatch.delenv("FLASH_ATTN_BWD")
    call(128, True, 4096, True)  # (the table emptied above)
    assert "persistent" not in seen_dq.pop()
    monkeypatch.setattr(configs, "BWD_GLUON_PERSISTENT", {("dq", 128, True): 4096})
    dkdv = call(128, True, 4096, True)
    assert seen_dq.pop()["persistent"] is True and "persistent" not in dkdv  # (the dQ cell alone)
    monkeypatch.setattr(configs, "BWD_GLUON_PERSISTENT", {("dkdv", 128, True): 2048, ("fused", 64, True): 4096})
    for mode in ("gluon", "fused"):  # (the forced modes' tests and probes: one program a tile, whatever the table)
        monkeypatch.setenv("FLASH_ATTN_BWD", mode)
        assert "persistent" not in call(128, True, 1024, mode == "gluon"), mode
    monkeypatch.delenv("FLASH_ATTN_BWD")
    for causal in (True, False):
        monkeypatch.setitem(configs.BWD_GLUON_PERSISTENT, ("dkdv", 64, causal), 4096)
    monkeypatch.setattr(bwd, "_sms", lambda q: 132)  # (an H100 / H200's multiprocessors)

    def thin(hq, hk, causal, s=2048):  # (hd 64 dK / dV: 128-key tiles, group split by bwd.group_split)
        q, k, v, do, _, _ = _inputs(sq=s, sk=s, hq=hq, hk=hk, d=64)
        with cpu_replays([]):
            bwd.flash_attn_bwd(do, q, k, v, q.clone(), torch.zeros(1, hq, s), softmax_scale=0.125, causal=causal,
                               window_left=-1, window_right=0 if causal else -1, deterministic=True)
        return seen.pop()[1]

    # causal: the snake order with the dK / dV kernel's configs.PERSISTENT_CAUSAL_TILES_PER_SM tiles an SM, heaviest
    # first below (MQA 71/1 at 2k with B2; these inputs are B1: 16 key tiles x a split of 15 = 240 tiles, about 2 an SM)
    assert thin(71, 1, True)["persistent"] == "heavy" and thin(71, 1, False)["persistent"] is True
    tiles = 16 * 99  # (MHA: no split) 99 heads = 1584 tiles = 12 an SM; 98 heads one short
    assert tiles == configs.PERSISTENT_CAUSAL_TILES_PER_SM["dkdv"] * 132
    assert thin(99, 99, True)["persistent"] is True and thin(98, 98, True)["persistent"] == "heavy"
    # the fused kernel's bound, 8 an SM: the same walk over the same tiles (configs.persistent_causal by kernel)
    assert configs.persistent_causal("fused", True, 8 * 132 - 1, 132) == "heavy"
    assert configs.persistent_causal("fused", True, 8 * 132, 132) is True
    assert configs.persistent_causal("dkdv", True, 8 * 132, 132) == "heavy"
    monkeypatch.setenv("FLASH_ATTN_BWD", "persistent")  # (forced: every launch the snake order, tests and probes)
    assert thin(71, 1, True)["persistent"] is True and thin(98, 98, True)["persistent"] is True
    monkeypatch.delenv("FLASH_ATTN_BWD")
    monkeypatch.setitem(configs.BWD_GLUON_PERSISTENT_ORDER, ("dkdv", 64, True), "heavy")  # (a cell's tile order)
    assert thin(99, 99, True)["persistent"] == "heavy" and thin(99, 99, False)["persistent"] is True
    monkeypatch.setenv("FLASH_ATTN_BWD", "persistent")  # (forced: the snake order)
    assert thin(99, 99, True)["persistent"] is True
    monkeypatch.delenv("FLASH_ATTN_BWD")
    assert [bwd_gluon.persistent_order(p) for p in (False, True, "snake", "heavy")] == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="heavy"):
        bwd_gluon.persistent_order("longest")
    q, k, v, *_ = _inputs(sq=1024, sk=8192, hq=4, hk=4, d=64)  # (the longer sequence decides: 8k keys)
    mask = dict(causal=True, window_left=-1, window_right=0, softcap=0.0, varlen=False, fp8=False, sm_major=9)
    route = configs.gluon_fused_bwd(q, k, v, q, q, torch.empty(1, 4, 1024), **mask)
    assert route is not None and "persistent" not in route
    assert configs.gluon_fused_bwd(q, k[:, :4096], v[:, :4096], q, q, torch.empty(1, 4, 1024),
                                   **mask)["persistent"] is True
    assert configs.fused_bwd_cell(128, 128, False, False, 2048) == configs.BWD_GLUON_FUSED[128][False, False][1]


def test_host_made_descriptors_describe_what_the_kernels_make_on_the_device(monkeypatch):
    """``host_desc`` (built in session 48, routed in session 49): the dK / dV, fused and dQ kernels' arguments carry
    HOST_DESC and a TensorDescriptor per TMA-read tensor over that very tensor, with the box and shared layout the
    kernel's device-made descriptor has (its Q_SL / K_SL / DQ_SL), named for the replays
    (bwd_gluon.HOST_DESCRIPTOR_OF); MLA's second head-dim part is not taken (ValueError). configs.BWD_GLUON_HOST_DESC
    routes it by kernel: all three by default."""
    q, k, v, do, lse, delta = _inputs(sq=256, sk=256, hq=4, hk=2, d=128)
    dk, dv, dq_acc = torch.empty_like(k), torch.empty_like(v), torch.zeros(q.shape)
    call = bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.1, False, 64, 2, dq_acc=dq_acc,
                                    host_desc=True)
    assert call["HOST_DESC"] is True and "HOST_DESC" not in bwd_gluon.dkdv_arguments(
        q, k, v, do, lse, delta, dk, dv, 0.1, False, 64, 2)
    for name, rows, cols, layout in (("QD", 64, 128, "Q_SL"), ("DOD", 64, 128, "Q_SL"), ("KD", 64, 128, "K_SL"),
                                     ("VD", 64, 128, "K_SL"), ("DQD", 64, 64, "DQ_SL")):
        desc = call[name]
        base = call[bwd_gluon.HOST_DESCRIPTOR_OF[name]]
        assert desc.base is base and list(desc.shape) == list(base.shape), name
        assert list(desc.strides) == list(base.stride()) and desc.block_shape == [1, rows, 1, cols], name
        assert desc.layout == call[layout], name
    call = bwd_gluon.dq_arguments(q, k, v, do, q, lse, delta, torch.empty_like(q), 0.1, True, 128, 2, host_desc=True)
    assert call["KD"].block_shape == [1, 128, 1, 128] and call["KD"].layout == call["K_SL"] and call["VD"].base is v
    assert call["QD"].block_shape == [1, 64, 1, 128] and call["DOD"].base is do and "DQD" not in call
    mq, mk, mv, mdo, mlse, mdelta = _mla_inputs()
    with pytest.raises(ValueError, match="head-dim part"):
        bwd_gluon.dkdv_arguments(mq, mk, mv, mdo, mlse, mdelta, torch.empty_like(mk), torch.empty_like(mv), 0.1,
                                 True, 32, 2, host_desc=True)
    # the route: by kernel, in configs.BWD_GLUON_HOST_DESC (all three by default)
    q, k, v, *_ = _inputs(sq=4096, sk=4096, hq=4, hk=4, d=128)
    lse = torch.empty(1, 4, 4096)
    mask = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, sm_major=9)

    def asked():
        split = configs.gluon_bwd(q, k, v, q, q, lse, atomic=False, **mask)
        fused = configs.gluon_fused_bwd(q, k, v, q, q, lse, deterministic=False, **mask)
        assert set(split) == {"dq", "dkdv"} and fused is not None
        return {name for name, kw in dict(split, fused=fused).items() if kw.get("host_desc")}

    assert configs.BWD_GLUON_HOST_DESC == frozenset({"dkdv", "fused", "dq"}) and asked() == {"dkdv", "fused", "dq"}
    monkeypatch.setattr(configs, "BWD_GLUON_HOST_DESC", frozenset())
    assert asked() == set()
    monkeypatch.setattr(configs, "BWD_GLUON_HOST_DESC", frozenset({"dq", "fused"}))
    assert asked() == {"dq", "fused"}
    monkeypatch.setattr(configs, "BWD_GLUON_HOST_DESC", frozenset({"dkdv"}))
    assert asked() == {"dkdv"}
    assert not configs.host_desc_bwd("dkdv", 192, 128)  # (MLA: two head-dim parts)


def test_the_persistent_dq_kernel_does_the_same_work(compiled):
    """The persistent dQ kernel (session 45, built without a GPU) compiles to the same wgmmas as its
    one-program-a-tile twin, its shared memory 32 B more (the Q / dO release barrier), without a spill (as the
    twin: 0 B at every config the route or the probes run)."""
    for d, bn, st in DQ_CONFIGS:
        spec = f"bwdq16:{d},{bn},{st},1"
        plain, persistent = compiled[spec], compiled[f"{spec}@p1"]
        assert persistent["wgmma"] == plain["wgmma"] and not persistent["serialized"], spec
        assert 0 < persistent["smem"] - plain["smem"] <= 32, (spec, plain["smem"], persistent["smem"])
        assert persistent["spill"] == 0 == plain["spill"], (spec, plain["spill"], persistent["spill"])


def test_a_softcap_adds_one_tanh_a_score_to_the_dq_kernel_and_nothing_else(compiled):
    """The softcapped dQ kernel (``SOFTCAP``; session 53, routed at hd 256 since session 54) beside its uncapped twin
    (:data:`DQ_SOFTCAP_TWINS`: hd 256 and 128, both masks): the same partitions' registers, wgmmas and exp2s, shared
    memory within 64 B, spills within :data:`DQ_SPILL_AT_MOST`; the capped kernel recomputes the cap by one hardware
    tanh a score element of each softmax it inlines (64 query rows x BLOCK_N keys over a warpgroup's 128 threads), one
    division a program (tanh's scale), the twin none."""
    for spec in DQ_SOFTCAP_TWINS:
        plain, capped = compiled[spec], compiled[f"{spec}@sc"]
        for key in ("setmaxnreg", "wgmma", "serialized", "ex2"):
            assert plain[key] == capped[key], (spec, key)
        assert abs(plain["smem"] - capped["smem"]) <= 64 and capped["smem"] <= configs.H100_SMEM_BYTES, spec
        assert capped["spill"] <= DQ_SPILL_AT_MOST.get(spec.split(":")[1].split(",")[0], 0), (spec, capped["spill"])
        per_softmax = 64 * int(spec.split(",")[1]) // 128
        assert plain["tanh"] == 0 and capped["tanh"] > 0 and capped["tanh"] % per_softmax == 0, (spec, capped["tanh"])
        assert capped["fdiv"] - plain["fdiv"] in (0, 1), spec


def test_a_softcap_adds_one_tanh_a_score_to_the_dkdv_kernel_and_nothing_else(compiled):
    """The softcapped dK / dV kernel (``SOFTCAP``; session 55, built on the CPU, not routed) beside its uncapped twin
    (:data:`DKDV_SOFTCAP_TWINS`: hd 128's routed config, MHA and a GQA group's flat walk, both masks): the same
    partitions' registers, wgmmas and exp2s, shared memory within 64 B; one hardware tanh a score element where the
    twin has its exp2 (P^T recomputed through the cap), one division a program (tanh's scale); spills within
    :data:`DKDV_SOFTCAP_SPILL_AT_MOST` by mask. The fused kernel takes no cap."""
    for spec in DKDV_SOFTCAP_TWINS:
        plain, capped = compiled[spec], compiled[f"{spec}@sc"]
        for key in ("setmaxnreg", "wgmma", "serialized", "ex2", "tma_reduce"):
            assert plain[key] == capped[key], (spec, key)
        assert abs(plain["smem"] - capped["smem"]) <= 64 and capped["smem"] <= configs.H100_SMEM_BYTES, spec
        assert plain["tanh"] == 0 and capped["tanh"] == plain["ex2"] > 0, (spec, capped["tanh"])
        assert capped["fdiv"] - plain["fdiv"] == 1, spec
        causal = spec.split("@")[0].split(",")[3] == "1"
        assert capped["spill"] <= DKDV_SOFTCAP_SPILL_AT_MOST[causal], (spec, capped["spill"])


def test_hd256_dkdv_kernel_splits_the_head_dim_and_takes_the_cap(compiled):
    """hd 256's dK / dV kernel (bwd_gluon_hd256; built in session 54, routed since session 55): per consumer and 64-row
    tile, S^T and dP^T of its 32 queries over the head dim's 16 k-steps each, then dV and dK of its 128 columns over
    the tile's two 32-query parts (2 k-steps each): 40 wgmmas a consumer, none serialised; one exp2 (and capped one
    hardware tanh) a score element of its 64 keys x 32 queries over a warpgroup's 128 threads; within the H100's
    shared memory; spills within :data:`HD256_SPILL_AT_MOST`, a GQA group of 4 as the routed group of 2."""
    for spec in HD256_TWINS:
        plain, capped, group4 = compiled[spec], compiled[f"{spec}@sc"], compiled[f"{spec},0,4"]
        for r in (plain, capped, group4):
            assert r["wgmma"] == 2 * (16 + 16 + 2 * 2 + 2 * 2) and not r["serialized"], spec
            assert r["ex2"] == 2 * 64 * 32 // 128 and r["smem"] <= configs.H100_SMEM_BYTES, spec
            assert r["spill"] <= HD256_SPILL_AT_MOST and r["tma_reduce"] == 0, (spec, r["spill"])
        assert plain["tanh"] == 0 == group4["tanh"] and capped["tanh"] == plain["ex2"], spec
        assert group4["spill"] == plain["spill"], spec
        by_tma = compiled.get(f"{spec}@sc@l1")  # (lse and delta by TMA, session 58: capped causal 448 -> 168 B spilled)
        if by_tma is not None:
            assert (by_tma["wgmma"], by_tma["ex2"], by_tma["tanh"]) == (capped["wgmma"], capped["ex2"], capped["tanh"])
            assert by_tma["spill"] <= capped["spill"], (spec, capped["spill"], by_tma["spill"])
            assert capped["smem"] < by_tma["smem"] <= configs.H100_SMEM_BYTES, spec
    assert f"{HD256_TWINS[1]}@sc@l1" in compiled


def test_hd256_dkdv_kernel_takes_only_what_it_can_run():
    """bwd_gluon_hd256's refusals: hd 256 only (bwd_gluon's rules besides), two stages, a positive cap; its
    arguments: host-made descriptors, the group split's partial strides, the cap's switch; its grid 64 keys a
    program x (batch, kv head, group part)."""
    from kernels.flash_attn import bwd_gluon_hd256 as wide

    q, k, v, do, lse, delta = _inputs(sq=300, sk=200, hq=4, hk=2, d=256)
    assert wide.unsupported(q, k, v, do, lse, delta) is None
    assert "head dims" in wide.unsupported(*_inputs(d=128))
    assert "head dims" in wide.unsupported(q, k[..., :128], v, do, lse, delta)  # (k narrower than q)
    assert "lse" in wide.unsupported(q, k, v, do, lse[:, :, :10], delta)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    args = wide.dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, 0.0625, True, softcap=30.0)
    assert args["SOFTCAP"] is True and args["softcap"] == 30.0 and args["IS_CAUSAL"] is True
    assert {"QD", "DOD", "KD", "VD"} <= set(args) and args["group"] == 2 and args["stride_dkp"] == 0
    assert wide.dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, 0.0625, False)["SOFTCAP"] is False
    parts = torch.empty(2, *k.shape), torch.empty(2, *v.shape)
    split = wide.dkdv256_arguments(q, k, v, do, lse, delta, *parts, 0.0625, False, split=2)
    assert split["stride_dkp"] == k.numel() and split["group_split"] == 2 and split["stride_dkb"] == k.stride(0)
    with pytest.raises(ValueError, match="stages"):
        wide.dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, 0.0625, False, num_stages=3)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="softcap"):
            wide.dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, 0.0625, False, softcap=bad)
    assert wide.dkdv256_grid(k) == (4, 2) and wide.dkdv256_grid(k, 2) == (4, 4)
    with pytest.raises(ValueError, match="head dims"):
        wide.dkdv256_gluon(*_inputs(d=128), softmax_scale=0.1, causal=False)


def test_units_first_transposes_the_grid_and_routes_where_listed(monkeypatch):
    """``units_first`` (configs.BWD_GLUON_UNITS_FIRST; built in session 59, routed at hd 64 / 128 in session 60): the
    dK / dV grid's (batch, kv head, group part) units in its first dimension and its key blocks in its second, the
    kernel told so (UNITS_FIRST), refused with the persistent kernel or the ordered adds; the route gives it to causal
    dK / dV and fused launches of a listed (kernel, head dim) that are neither persistent, windowed nor ordered. The
    same for hd 256's dK / dV kernel and the dQ kernel (built in session 60, not listed): their grids' units first
    (the dQ kernel's (batch, query head) units), refused persistent, routed where listed."""
    k = torch.empty(2, 1000, 3, 64)
    assert bwd_gluon.dkdv_grid(k, units_first=True) == (6, 8) and bwd_gluon.dkdv_grid(k, 2, None, True) == (12, 8)
    assert bwd_gluon.dkdv_grid(k, 1, 132, True) == (48, 1)  # (persistent: its own grid; the arguments refuse both)
    q, k, v, do, lse, delta = _inputs(sq=256, sk=256, hq=4, hk=4, d=64)
    assert bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, units_first=True)["UNITS_FIRST"]
    assert "UNITS_FIRST" not in bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True)
    with pytest.raises(ValueError, match="units_first: one program a tile"):
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, units_first=True, persistent=True)
    with pytest.raises(ValueError, match="units_first: the unordered kernels only"):
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, dq_acc=torch.zeros(q.shape),
                                 dq_order=bwd_gluon.order_counters(q), units_first=True)
    assert bwd_gluon.dq_grid(q, units_first=True) == (4, 2) and bwd_gluon.dq_grid(q) == (2, 4)
    assert bwd_gluon.dq_grid(q, 3, True) == (3, 1)  # (persistent: its own grid)
    out = torch.empty_like(q)
    assert bwd_gluon.dq_arguments(q, k, v, do, out, lse, delta, q, 0.125, True, units_first=True)["UNITS_FIRST"]
    assert "UNITS_FIRST" not in bwd_gluon.dq_arguments(q, k, v, do, out, lse, delta, q, 0.125, True)
    with pytest.raises(ValueError, match="units_first: one program a tile"):
        bwd_gluon.dq_arguments(q, k, v, do, out, lse, delta, q, 0.125, True, persistent=True, units_first=True)
    from kernels.flash_attn import bwd_gluon_hd256 as wide

    q2, k2, v2, do2, lse2, delta2 = _inputs(sq=300, sk=300, hq=4, hk=2, d=256)
    assert wide.dkdv256_grid(k2, units_first=True) == (2, 5) and wide.dkdv256_grid(k2, 2, True) == (4, 5)
    assert wide.dkdv256_arguments(q2, k2, v2, do2, lse2, delta2, k2, v2, 0.0625, True, units_first=True)["UNITS_FIRST"]
    assert "UNITS_FIRST" not in wide.dkdv256_arguments(q2, k2, v2, do2, lse2, delta2, k2, v2, 0.0625, True)
    assert configs.BWD_GLUON_UNITS_FIRST == {("dkdv", 128), ("fused", 128), ("dkdv", 64), ("fused", 64)}
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(configs, "BWD_GLUON_UNITS_FIRST", frozenset({("dkdv", 128), ("fused", 128)}))
    causal = dict(causal=True, window_right=0)
    x = _inputs(sq=4096, sk=4096)[:3]  # (GQA 4/2 hd 128: dK / dV on Gluon, one program a tile at 4k)
    assert _route(*x, **causal)["dkdv"]["units_first"] is True and "units_first" not in _route(*x)["dkdv"]
    assert "units_first" not in _route(*x, window_left=100, **causal)["dkdv"]  # (windowed)
    assert "units_first" not in _route(*_inputs(sq=4096, sk=4096, d=64)[:3], **causal).get("dkdv", {})  # (hd 64)
    short = _inputs(sq=1024, sk=1024)[:3]  # (persistent there: its own order)
    assert _route(*short, **causal)["dkdv"].get("persistent") and "units_first" not in _route(*short, **causal)["dkdv"]
    kw = dict(window_left=-1, softcap=0.0, varlen=False, fp8=False, sm_major=9)
    mha = _inputs(sq=4096, sk=4096, hq=4, hk=4)[:3]
    lse = torch.empty(1, 4, 4096)
    assert configs.gluon_fused_bwd(*mha, mha[0], mha[0], lse, causal=True, window_right=0, **kw)["units_first"]
    assert "units_first" not in configs.gluon_fused_bwd(*mha, mha[0], mha[0], lse, causal=False, window_right=-1, **kw)
    ordered = configs.gluon_fused_bwd(*mha, mha[0], mha[0], lse, causal=True, window_right=0, deterministic=True, **kw)
    assert ordered is None or "units_first" not in ordered
    # (session 60's builds, listed here: hd 256's dK / dV and dQ, hd 128's dQ where it is not persistent)
    monkeypatch.setattr(configs, "BWD_GLUON_UNITS_FIRST", frozenset({("dkdv", 256), ("dq", 256), ("dq", 128)}))
    gemma = _route(*_inputs(sq=4096, sk=4096, hq=4, hk=2, d=256)[:3], softcap=50.0, **causal)
    assert gemma["dkdv"]["units_first"] is True and gemma["dq"]["units_first"] is True
    assert set(gemma["dkdv"]) <= {"num_stages", "softcap", "lse_tma", "units_first"}  # (hd 256's kernel's keywords)
    assert "units_first" not in _route(*_inputs(sq=4096, sk=4096, d=256)[:3])["dq"]  # (not causal)
    long = _route(*_inputs(sq=8192, sk=8192)[:3], **causal)
    assert long["dq"]["units_first"] is True and "units_first" not in long["dkdv"]  # (dK / dV not listed now)
    assert "units_first" not in _route(*x, **causal)["dq"] and _route(*x, **causal)["dq"].get("persistent")


def test_the_persistent_grid_and_its_refusals():
    """The persistent kernel's grid: min(tiles, programs) in one dimension (one program a tile otherwise: key blocks x
    (batch, kv head, group part)); the ordered adds and the key blocks last first are refused by name."""
    k = torch.empty(2, 1000, 3, 64)
    assert bwd_gluon.dkdv_grid(k) == (8, 6) and bwd_gluon.dkdv_grid(k, 2) == (8, 12)
    assert bwd_gluon.dkdv_grid(k, 1, 132) == (48, 1) and bwd_gluon.dkdv_grid(k, 4, 20) == (20, 1)
    q, k, v, do, lse, delta = _inputs(sq=256, sk=256, hq=4, hk=4, d=64)
    dq = torch.zeros(q.shape)
    with pytest.raises(ValueError, match="persistent: the unordered kernels only"):
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, dq_acc=dq,
                                 dq_order=bwd_gluon.order_counters(q), persistent=True)
    with pytest.raises(ValueError, match="persistent: the unordered kernels only"):
        bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, last_first=True, persistent=True)
    assert bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True, persistent=True)["PERSISTENT"]
    assert "PERSISTENT" not in bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, k, v, 0.125, True)
    with pytest.raises(ValueError, match="persistent runs the unordered adds only"):
        bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=0.125, causal=True, fused=True, ordered=True,
                             persistent=True)


def test_deterministic_calls_take_the_ordered_fused_kernel_only_where_routed(monkeypatch):
    """configs.BWD_GLUON_FUSED_ORDERED's cells (hd 128 non-causal from 8k) send deterministic calls to the fused
    kernel with its adds in a fixed order: flash_attn_bwd hands the dK / dV launch the add counters (``dq_order``:
    int32, bwd_gluon.order_counters' size) and ``last_first``, on 64-row tiles (hd 64 non-causal's unordered route
    runs 128) from the cell's length (at least BWD_GLUON_FUSED's), and delta's preprocess the same counters to zero;
    nondeterministic calls keep the unordered kernel, GQA the split kernels; FLASH_ATTN_BWD=ordered forces it at any
    length, GQA too, deterministic call or not. (No sm90 GPU here: as the walk test above.)"""
    from kernels.flash_attn import bwd
    from kernels.standins import cpu_replays

    seen, log = _record_gluon_launches(monkeypatch)[0], []
    sem_at = bwd._bwd_preprocess.arg_names.index("Sem")

    def call(hq, hk, d, causal, deterministic=True, s=4096):
        q, k, v, do, _, _ = _inputs(sq=s, sk=s, hq=hq, hk=hk, d=d)
        log.clear()
        with cpu_replays(log):
            bwd.flash_attn_bwd(do, q, k, v, q.clone(), torch.zeros(1, hq, s), softmax_scale=d ** -0.5, causal=causal,
                               window_left=-1, window_right=0 if causal else -1, deterministic=deterministic)
        pre = [a for how, name, a, _ in log if name == "_bwd_preprocess"]
        return (seen.pop()[1] if seen else None), (pre[0][sem_at] if pre else "no preprocess")

    assert set(configs.BWD_GLUON_FUSED_ORDERED) == {(128, False)}  # hd 64 causal: the split kernels
    kw, _ = call(8, 8, 64, True)
    assert kw is None or "dq_order" not in kw  # (the split route's dK / dV launch, when Gluon)
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_ORDERED", {(64, False): 4096, (128, True): 2048})
    kw, sem = call(8, 8, 64, False, s=4096)
    assert kw["block_m"] == 64 and kw["last_first"] is True and kw["dq_acc"] is not None
    assert kw["dq_order"] is sem and sem.dtype == torch.int32 and sem.numel() == 1 + 8 * 4096 // 64
    kw, sem = call(8, 8, 128, True, s=2048)
    assert kw["dq_order"] is sem and kw["mask_every_tile"] is True  # (the cell's other options as routed)
    assert "dq_order" not in call(8, 8, 64, False, deterministic=False)[0]  # nondeterministic: unordered
    assert call(8, 8, 64, False, s=2048)[1] == "no preprocess"  # below the cell's length: split
    assert call(8, 2, 128, True)[1] == "no preprocess"  # GQA: split
    assert call(8, 8, 64, True)[1] == "no preprocess"  # a cell not listed
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_ORDERED", {})
    monkeypatch.setenv("FLASH_ATTN_BWD", "ordered")
    for hk, deterministic in ((8, False), (2, True)):
        kw, sem = call(8, hk, 128, False, deterministic=deterministic, s=512)
        assert kw["dq_order"] is sem and kw["walk"] == int(hk != 8), hk


# ---- sm90 GPU: dK and dV against the oracle ----

needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an sm90 (Hopper) GPU: Gluon's wgmma and TMA, no interpreter")


def _assert_within_triton(got, triton_, want, what=""):
    """A Gluon gradient within twice the Triton backward's error against the FP64 oracle ``want``, plus a bf16
    rounding floor (2e-3 of its largest entry); NaN fails."""
    err = (got.double() - want).abs().max().item()
    err_t = (triton_.double() - want).abs().max().item()
    assert err == err and err <= 2 * err_t + 2e-3 * want.abs().max().item(), (what, err, err_t)


def _backward_kernels(interface) -> set:
    """The kernel names of every backward launch flash_attn_func's signatures left to replay."""
    return {x.compiled.name for s in interface._SIGNATURES._d.values() for plans in s.bwd.values()
            for x in plans["plan"][3]}


#: the whole-backward GPU cases (through flash_attn_func): GQA causal, MQA with the group split, hd 64 Sq < Sk
WHOLE_CASES = pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (1, 1000, 1000, 8, 2, 128, True), (1, 2048, 2048, 8, 1, 128, False), (2, 333, 555, 4, 4, 64, True)],
    ids=["causal-GQA4", "MQA-group-split", "hd64-causal-Sq<Sk"])


def _gpu_case(b, sq, sk, hq, hk, d, causal, dv=None):
    """A GPU test's inputs and references: (q, k, v, dO, the in-repo forward's out and lse, delta = rowsum(dO * O)
    [B, Hq, Sq], the softmax scale, the FP64 oracle's result, the Triton backward's (dq, dk, dv)). ``dv`` 128 with
    ``d`` 192: MLA's training form (:func:`_mla_inputs`)."""
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    if dv is not None and dv != d:
        assert (d, dv) == (192, 128), (d, dv)
        q, k, v, do, _, _ = _mla_inputs(b, sq, sk, hq, hk, device="cuda")
    else:
        q, k, v, do, _, _ = _inputs(b, sq, sk, hq, hk, d, device="cuda")
    scale = d ** -0.5
    mask = dict(causal=causal, window_left=-1, window_right=0 if causal else -1)
    out, lse = flash_attn_fwd(q, k, v, softmax_scale=scale, **mask)
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    ref = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, softmax_scale=scale)
    triton_ = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, **mask)
    return q, k, v, do, out, lse, delta, scale, ref, triton_


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, block_m", [
    (*case, bm) for bm in (32, 64) for case in
    ((2, 1000, 1000, 4, 4, 128, False), (1, 777, 1500, 4, 2, 128, True), (1, 1500, 777, 4, 1, 128, True),
     (1, 130, 70, 2, 2, 128, False), (2, 600, 600, 8, 2, 64, True))] + [
    (2, 600, 600, 8, 2, 64, False, 128), (1, 1000, 1100, 4, 1, 64, False, 128), (1, 1100, 900, 2, 2, 64, True, 128)],
    ids=[f"{name}-{bm}" for bm in (32, 64) for name in
         ("MHA-S1000", "causal-GQA-Sq<Sk", "causal-MQA-Sq>Sk", "short", "hd64-causal-GQA4")] + [
         "hd64-GQA4-128", "hd64-MQA-Sq<Sk-128", "hd64-causal-Sq>Sk-128"])
def test_gpu_dkdv_match_oracle(b, sq, sk, hq, hk, d, causal, block_m):
    """dK and dV from the Gluon kernel within twice the Triton backward's error against the FP64 oracle (plus a
    bf16 rounding floor), on partial tiles, GQA / MQA, Sq != Sk and rows that see no key; NaN-poisoned first; a
    replayed launch gives the same bits. 32- and 64-row tiles, and hd 64's 128-row ones (routed non-causal, MHA)."""
    q, k, v, do, out, lse, delta, scale, ref, (_, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    cache = {}
    dk, dv = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=scale, causal=causal, block_m=block_m,
                                  poison=True, launches=cache)
    dk2, dv2 = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=scale, causal=causal, block_m=block_m,
                                    poison=True, launches=cache)
    torch.cuda.synchronize()
    assert "dkdv" in cache and torch.equal(dk, dk2) and torch.equal(dv, dv2)
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (2, 1000, 1000, 4, 4, False), (1, 777, 1500, 4, 4, True), (1, 1500, 777, 4, 2, True), (1, 130, 70, 2, 2, False)],
    ids=["MHA-S1000", "causal-Sq<Sk", "causal-GQA-Sq>Sk", "short"])
def test_gpu_mla_dkdv_match_oracle(b, sq, sk, hq, hk, causal, stages):
    """MLA's training form (q / k 192 in two tile parts, v 128): dK (both parts) and dV from the Gluon kernel at
    32-row tiles over 2 and 3 stages (the tried and the routed config) within twice the Triton backward's error
    against the FP64 oracle (plus a bf16 floor), NaN-poisoned first."""
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    q, k, v, do, _, _ = _mla_inputs(b, sq, sk, hq, hk, device="cuda")
    scale = 192 ** -0.5
    mask = dict(causal=causal, window_left=-1, window_right=0 if causal else -1)
    out, lse = flash_attn_fwd(q, k, v, softmax_scale=scale, **mask)
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    ref = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, softmax_scale=scale)
    _, dk_t, dv_t = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, **mask)
    dk, dv = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=scale, causal=causal, block_m=32,
                                  num_stages=stages, poison=True)
    torch.cuda.synchronize()
    assert dk.shape == k.shape and dv.shape == v.shape
    for part in (slice(0, 128), slice(128, 192)):
        _assert_within_triton(dk[..., part], dk_t[..., part], ref.dk[..., part], part)
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (2, 1000, 1000, 4, 2, False), (1, 777, 1500, 4, 4, True), (1, 1500, 777, 4, 1, True)],
    ids=["GQA-S1000", "causal-Sq<Sk", "causal-MQA-Sq>Sk"])
def test_gpu_mla_dq_and_delta_match_oracle(b, sq, sk, hq, hk, causal, stages):
    """MLA's training form on the Gluon dQ kernel (64-key tiles; session 32, first run here): dQ's two head-dim
    parts within twice the Triton backward's error against the FP64 oracle (plus a bf16 floor), delta over v's 128
    columns as torch computes it, NaN-poisoned first."""
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    q, k, v, do, _, _ = _mla_inputs(b, sq, sk, hq, hk, device="cuda")
    scale = 192 ** -0.5
    mask = dict(causal=causal, window_left=-1, window_right=0 if causal else -1)
    out, lse = flash_attn_fwd(q, k, v, softmax_scale=scale, **mask)
    ref = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, softmax_scale=scale)
    dq_t, _, _ = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, **mask)
    dq, delta = bwd_gluon.dq_gluon(q, k, v, do, out, lse, softmax_scale=scale, causal=causal, block_n=64,
                                   num_stages=stages, poison=True)
    torch.cuda.synchronize()
    assert dq.shape == q.shape
    assert torch.allclose(delta, (do.float() * out.float()).sum(-1).transpose(1, 2), rtol=1e-4, atol=1e-4)
    for part in (slice(0, 128), slice(128, 192)):
        _assert_within_triton(dq[..., part], dq_t[..., part], ref.dq[..., part], part)


@pytest.mark.gpu
@needs_sm90
def test_gpu_mla_backward_through_the_gluon_kernels_matches_oracle(monkeypatch):
    """flash_attn_func's backward at MLA's 192 / 128 with FLASH_ATTN_BWD=gluon: both Gluon kernels, every gradient
    within the tolerance rule of the FP64 oracle (causal GQA, Sq != Sk)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setenv("FLASH_ATTN_BWD", "gluon")
    interface._SIGNATURES.clear()
    check_against_oracle(1, 900, 1300, 8, 2, 192, torch.bfloat16, True, device="cuda", dv=128)
    names = _backward_kernels(interface)
    assert {"_bwd_dkdv_ws_kernel", "_bwd_dq_ws_kernel"} <= names, names
    assert not {"_bwd_dkdv_kernel", "_bwd_dq_kernel"} & names, names
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@WHOLE_CASES
def test_gpu_backward_through_the_gluon_kernels_matches_oracle(b, sq, sk, hq, hk, d, causal, monkeypatch):
    """flash_attn_func's backward with FLASH_ATTN_BWD=gluon: its dQ and dK / dV launches are the Gluon kernels'
    (the group split's partials summed by the Triton sum for MQA), out and every gradient within the tolerance rule of
    the FP64 oracle, and a second call replays the launches to the same bits."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setenv("FLASH_ATTN_BWD", "gluon")
    interface._SIGNATURES.clear()
    first = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda")
    names = _backward_kernels(interface)
    assert {"_bwd_dq_ws_kernel", "_bwd_dkdv_ws_kernel"} <= set(names), names
    assert not {"_bwd_dq_kernel", "_bwd_dkdv_kernel"} & set(names), names
    again = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda")
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (1, 1024, 1024, 8, 2, 128, False), (1, 4096, 4096, 4, 1, 128, True), (1, 4096, 4096, 4, 2, 64, True),
    (1, 4100, 4096, 4, 4, 64, False), (1, 1100, 1300, 4, 2, 192, True), (1, 600, 600, 4, 4, 192, True),
    (1, 1024, 1100, 4, 1, 64, False), (1, 2048, 2048, 4, 1, 64, True)],
    ids=["hd128-S1024", "hd128-causal-MQA-S4096", "hd64-causal-S4096", "hd64-S4100x4096-128-rows",
         "mla-causal-GQA-S1100x1300", "mla-causal-S600", "hd64-MQA-S1024x1100-persistent-split",
         "hd64-causal-MQA-S2048-few-tiles"])
def test_gpu_default_backward_route_matches_oracle(b, sq, sk, hq, hk, d, causal, monkeypatch):
    """flash_attn_func's backward as routed by default (configs.BWD_GLUON from BWD_GLUON_MIN_SEQLEN's lengths; the
    Gluon dK / dV beside the Triton dQ, which then makes delta, where only dK / dV is routed): each kernel the
    table names is the Gluon one, the others Triton's, out and every gradient within the tolerance rule of the FP64
    oracle."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    routed = {n for n in configs.BWD_GLUON.get(d, {}) if min(sq, sk) >= configs.BWD_GLUON_MIN_SEQLEN[d][n][causal]}
    assert "dkdv" in routed  # each case is one the table routes
    interface._SIGNATURES.clear()
    check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda", dv=128 if d == 192 else None)
    names = _backward_kernels(interface)
    want = {f"_bwd_{n}_ws_kernel" if n in routed else f"_bwd_{n}_kernel" for n in ("dq", "dkdv")}
    assert want <= names and not {f"_bwd_{n}_kernel" for n in routed} & names, (names, want)
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (1, 1024, 1024, 8, 2, 128, False), (1, 2048, 2048, 16, 1, 64, False), (1, 2048, 2048, 8, 2, 64, True),
    (2, 2048, 2048, 4, 4, 64, False)],
    ids=["hd128-GQA-S1024", "hd64-MQA-S2048-group-split", "hd64-causal-GQA-S2048", "hd64-MHA-S2048"])
def test_gpu_fused_default_route_matches_oracle(b, sq, sk, hq, hk, d, causal, monkeypatch):
    """flash_attn_func(deterministic=False)'s backward in the cells session 59 routed to the fused kernel
    (configs.BWD_GLUON_FUSED: GQA / MQA, hd 64 from 2k): out and every gradient within the tolerance rule of the FP64
    oracle; the fused launches and no split-route dQ kernel; under a group split (MQA 16/1) the split's sum launch
    casts dQ (no _cast_dq launch); a second call (the replay: dQ's buffer by its workspace pointer) within the same
    rule (dQ's adds arrive in any order: not bitwise)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import bwd, interface

    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    assert configs.fused_bwd_cell(d, d, hq != hk, causal, min(sq, sk)) is not None  # (a routed fused cell)
    interface._SIGNATURES.clear()
    for _ in range(2):
        check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda", deterministic=False)
    names = _backward_kernels(interface)
    split = bwd.group_split(b, hk, hq // hk, sk, torch.cuda.get_device_properties(0).multi_processor_count)
    assert "_bwd_dkdv_ws_kernel" in names and not {"_bwd_dq_ws_kernel", "_bwd_dq_kernel"} & names, names
    assert ("_sum_partials" in names) == (split > 1) and ("_cast_dq" in names) == (split == 1), (names, split)
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("block_n, stages", [(64, 3), (128, 2)])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (2, 1000, 1000, 4, 2, 128, False), (1, 777, 1500, 4, 4, 128, True), (1, 1500, 777, 4, 1, 128, True),
    (2, 600, 600, 8, 2, 64, True)], ids=["GQA-S1000", "causal-Sq<Sk", "causal-MQA-Sq>Sk", "hd64-causal-GQA4"])
def test_gpu_dq_and_delta_match_oracle(b, sq, sk, hq, hk, d, causal, block_n, stages):
    """dQ from the Gluon kernel within twice the Triton backward's error against the FP64 oracle (plus a bf16
    floor), delta = rowsum(dO * O) as torch computes it, rows that see no key included; NaN-poisoned first; a
    replayed launch gives the same bits."""
    q, k, v, do, out, lse, _, scale, ref, (dq_t, _, _) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    cache = {}
    dq, delta = bwd_gluon.dq_gluon(q, k, v, do, out, lse, softmax_scale=scale, causal=causal, block_n=block_n,
                                   num_stages=stages, poison=True, launches=cache)
    dq2, _ = bwd_gluon.dq_gluon(q, k, v, do, out, lse, softmax_scale=scale, causal=causal, block_n=block_n,
                                num_stages=stages, poison=True, launches=cache)
    torch.cuda.synchronize()
    assert "dq" in cache and torch.equal(dq, dq2)
    want_delta = (do.float() * out.float()).sum(-1).transpose(1, 2)
    assert torch.allclose(delta, want_delta, rtol=1e-4, atol=1e-4)
    _assert_within_triton(dq, dq_t, ref.dq, "dq")


# ---- sm90 GPU: the fused backward (dK / dV with dQ by TMA reduce) ----


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("walk", [1, 2], ids=["flat", "lockstep"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (1, 777, 1500, 8, 2, 128, True), (1, 1500, 777, 4, 1, 128, True), (2, 600, 600, 8, 2, 64, True),
    (1, 1000, 1100, 8, 2, 128, False), (1, 130, 70, 4, 2, 128, False)],
    ids=["causal-GQA4-Sq<Sk", "causal-MQA-Sq>Sk", "hd64-causal-GQA4", "GQA4-Sq<Sk", "short-GQA"])
def test_gpu_walks_match_oracle(b, sq, sk, hq, hk, d, causal, walk):
    """Both kernels (dK / dV alone, and fused with dQ) walking a program's (head, tile) steps in one flat loop
    (``walk`` 1: the default's order, so dK and dV bitwise the default's) or in lockstep (2: tiles from the last,
    the group's heads inside): every gradient within twice the Triton backward's error against the FP64 oracle,
    NaN-poisoned first, on GQA / MQA groups, Sq != Sk and partial tiles."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(softmax_scale=scale, causal=causal, poison=True)
    dk0, dv0 = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    dk, dv = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, walk=walk, **kw)
    fk, fv, fq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, fused=True, walk=walk, **kw)
    torch.cuda.synchronize()
    if walk == 1:
        assert torch.equal(dk, dk0) and torch.equal(dv, dv0)
    for got, tri, want, what in ((dk, dk_t, ref.dk, "dk"), (dv, dv_t, ref.dv, "dv"), (fk, dk_t, ref.dk, "fused dk"),
                                 (fv, dv_t, ref.dv, "fused dv"), (fq, dq_t, ref.dq, "fused dq")):
        _assert_within_triton(got, tri, want, what)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("adder", [False, True], ids=["", "adder"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (2, 1000, 1000, 4, 4, 128, False), (1, 777, 1500, 4, 2, 128, True), (1, 1500, 777, 4, 1, 128, True),
    (1, 130, 70, 2, 2, 128, False), (2, 600, 600, 8, 2, 64, True), (1, 1000, 1100, 4, 4, 64, False)],
    ids=["MHA-S1000", "causal-GQA-Sq<Sk", "causal-MQA-Sq>Sk", "short", "hd64-causal-GQA4", "hd64-Sq<Sk"])
def test_gpu_fused_kernel_matches_oracle(b, sq, sk, hq, hk, d, causal, stages, adder):
    """The fused kernel's dQ (fp32, added by TMA reduce into a zeroed buffer), dK and dV each within twice the Triton
    backward's error against the FP64 oracle (plus a bf16 floor), on partial tiles, GQA / MQA (the group's heads'
    partials into one dQ row block each), Sq != Sk and rows that see no key; dK and dV NaN-poisoned first; a
    replayed launch gives the same dK / dV bits and dQ within fp32 reordering (the adds' order is not fixed).
    ``adder``: the adds in an adder warp instead of the consumers."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    cache = {}
    kw = dict(softmax_scale=scale, causal=causal, num_stages=stages, poison=True, launches=cache, fused=True,
              adder=adder)
    dk, dv, dq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    dk2, dv2, dq2 = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    torch.cuda.synchronize()
    assert "dkdv" in cache and torch.equal(dk, dk2) and torch.equal(dv, dv2)
    assert dq.dtype == torch.float32 and torch.allclose(dq, dq2, rtol=1e-5, atol=1e-5)
    _assert_within_triton(dq, dq_t, ref.dq, "dq")
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("adder, halves", [(False, None), (True, None), (False, False)],
                         ids=["", "adder", "whole-S"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (2, 600, 600, 8, 2, True), (1, 1000, 1100, 4, 4, False), (1, 1100, 700, 4, 1, False), (1, 70, 130, 2, 2, True)],
    ids=["causal-GQA4", "Sq<Sk", "MQA-Sq>Sk", "short-causal"])
def test_gpu_fused_kernel_128_row_tiles_match_oracle(b, sq, sk, hq, hk, causal, adder, halves):
    """The fused kernel at hd 64 on 128-row tiles (each consumer its 64 rows of every tile's dQ; routed non-causal
    since session 39, in query halves), S^T and dP^T in query halves (the default) or whole: dQ, dK and dV
    within twice the Triton backward's error against the FP64 oracle (plus a bf16 floor), partial tiles, GQA /
    MQA, Sq != Sk both ways; dK / dV NaN-poisoned first."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, 64, causal)
    dk, dv, dq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=scale, causal=causal, block_m=128,
                                      num_stages=2, poison=True, fused=True, adder=adder, halves=halves)
    torch.cuda.synchronize()
    _assert_within_triton(dq, dq_t, ref.dq, "dq")
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, block_m", [
    (2, 1000, 1000, 4, 4, 128, False, 64), (1, 777, 1500, 4, 2, 128, True, 64), (2, 600, 600, 8, 2, 64, True, 64),
    (1, 1000, 1100, 4, 4, 64, False, 128)], ids=["hd128", "hd128-causal-GQA-Sq<Sk", "hd64-causal-GQA4", "hd64-128-row"])
def test_gpu_fused_dq_without_the_softmax_scale_matches_oracle(b, sq, sk, hq, hk, d, causal, block_m):
    """The fused kernel with ``dq_unscaled`` (not routed): dK and dV bitwise the scaled kernel's, dQ times the softmax
    scale within twice the Triton backward's error against the FP64 oracle."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(softmax_scale=scale, causal=causal, block_m=block_m, poison=True, fused=True)
    scaled = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    dk, dv, dq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, dq_unscaled=True, **kw)
    torch.cuda.synchronize()
    assert torch.equal(dk, scaled[0]) and torch.equal(dv, scaled[1])
    _assert_within_triton(dq * scale, dq_t, ref.dq, "dq")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, block_m, stages, extra", [
    (2, 1000, 1000, 4, 4, 128, False, 64, 3, dict(adder=True)), (1, 777, 1500, 4, 2, 128, True, 64, 2,
                                                                  dict(mask_every_tile=True, walk=1)),
    (2, 600, 600, 8, 2, 64, True, 64, 2, {}), (1, 1000, 1100, 4, 4, 64, False, 128, 2, {}),
    (1, 1100, 1000, 4, 4, 64, True, 128, 2, {})],
    ids=["hd128-adder", "hd128-causal-every-tile-GQA-flat", "hd64-causal-GQA4", "hd64-128-row", "hd64-128-row-causal"])
def test_gpu_fused_dk_from_shared_ds_matches_oracle(b, sq, sk, hq, hk, d, causal, block_m, stages, extra):
    """The fused kernel with ``ds_smem`` (not routed; dK's wgmma reads dS^T from the shared buffer dQ's reads, not from
    registers), each config beside its route's options: dV bitwise the register kernel's (unchanged), dK and dQ
    within twice the Triton backward's error against the FP64 oracle."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(softmax_scale=scale, causal=causal, block_m=block_m, num_stages=stages, poison=True, fused=True, **extra)
    regs = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    dk, dv, dq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, ds_smem=True, **kw)
    torch.cuda.synchronize()
    assert torch.equal(dv, regs[1])
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dq, dq_t, ref.dq, "dq")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra", [
    (2, 1000, 1000, 4, 4, 128, 128, False, 64, 2, {}), (1, 777, 1500, 4, 2, 128, 128, True, 64, 2, dict(walk=1)),
    (2, 600, 600, 8, 2, 64, 64, True, 64, 2, {}), (1, 1000, 1100, 4, 4, 64, 64, False, 128, 2, {}),
    (1, 700, 700, 4, 4, 192, 128, True, 32, 3, {})],
    ids=["hd128", "hd128-causal-GQA-flat", "hd64-causal-GQA4", "hd64-128-row", "mla-causal"])
def test_gpu_dkdv_without_turns_gives_the_same_gradients(b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra):
    """The dK / dV kernel with ``turns=False`` (not routed): each consumer adds the same tiles in the same order, so
    dK and dV are bitwise those of the kernel with turns, and within twice the Triton backward's error against the
    FP64 oracle."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal, dv=dv)
    kw = dict(softmax_scale=scale, causal=causal, block_m=block_m, num_stages=stages, poison=True, **extra)
    turned = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    dk, dv_ = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, turns=False, **kw)
    torch.cuda.synchronize()
    assert torch.equal(dk, turned[0]) and torch.equal(dv_, turned[1])
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv_, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, block_m, stages, extra", [
    (2, 1000, 1000, 4, 4, 128, False, 64, 3, dict(adder=True)), (2, 1000, 1000, 4, 4, 128, False, 64, 2, {}),
    (1, 777, 1500, 4, 2, 128, True, 64, 2, dict(mask_every_tile=True, walk=1)),
    (2, 600, 600, 8, 2, 64, True, 64, 2, {}), (1, 1000, 1100, 4, 4, 64, False, 128, 2, {}),
    (1, 1000, 1100, 4, 4, 64, False, 128, 2, dict(ds_smem=True)), (1, 1100, 1000, 4, 4, 64, True, 128, 2, {})],
    ids=["hd128-adder", "hd128-own-adds", "hd128-causal-every-tile-GQA-flat", "hd64-causal-GQA4-alternate",
         "hd64-128-row", "hd64-128-row-ds-smem", "hd64-128-row-causal"])
def test_gpu_fused_without_turns_gives_the_same_gradients(b, sq, sk, hq, hk, d, causal, block_m, stages, extra):
    """The fused kernel with ``turns=False`` (its dS^T buffers ordered by the tile's barrier alone), each config
    beside its route's options: dK and dV bitwise the kernel's with turns (each consumer adds the same tiles in the
    same order), dQ (partials added in arrival order) and all three within twice the Triton backward's error against
    the FP64 oracle; run twice, so a buffer overwritten early would show as a dQ off the oracle on either run."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(softmax_scale=scale, causal=causal, block_m=block_m, num_stages=stages, poison=True, fused=True, **extra)
    turned = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    for _ in range(2):
        dk, dv, dq = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, turns=False, **kw)
        torch.cuda.synchronize()
        assert torch.equal(dk, turned[0]) and torch.equal(dv, turned[1])
        _assert_within_triton(dq, dq_t, ref.dq, "dq")
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("kind, b, sq, sk, hq, hk, d, causal, extra", [
    ("dkdv", 2, 1000, 1000, 4, 4, 128, False, dict(block_m=64, num_stages=2)),
    ("dkdv", 1, 1100, 1000, 8, 2, 64, True, dict(block_m=64, num_stages=2, persistent=True)),
    ("fused", 2, 1000, 1000, 4, 4, 128, False, dict(block_m=64, num_stages=3, fused=True, adder=True)),
    ("fused", 1, 1000, 1100, 4, 4, 64, True, dict(block_m=64, num_stages=2, fused=True, turns=False,
                                                   persistent="heavy")),
    ("dq", 2, 1000, 1000, 4, 4, 128, True, dict(block_n=128, num_stages=2)),
    ("dq", 1, 777, 1500, 8, 2, 128, False, dict(block_n=64, num_stages=3, persistent=True))],
    ids=["dkdv-hd128", "dkdv-hd64-causal-GQA4-Sq>Sk-persistent", "fused-hd128-adder",
         "fused-hd64-causal-Sq<Sk-heavy-first", "dq-hd128-causal", "dq-hd128-GQA4-Sq<Sk-persistent"])
def test_gpu_host_made_descriptors_give_the_same_gradients_and_replay(kind, b, sq, sk, hq, hk, d, causal, extra):
    """``host_desc`` (session 48): the kernel reading through descriptors made on the host gives dK / dV (dQ and
    delta for the dQ kernel) bitwise the device-made descriptors' (the same tiles, the same order; the fused
    kernel's dQ, added in arrival order, within twice the Triton backward's error against the FP64 oracle), and a
    replay (``launches``: kernels/launcher.py) with another call's tensors of the same shapes reads *those* tensors
    (each replay encodes its descriptors again): bitwise the device-made kernel's on them."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    other = (q * 0.5, k.flip(1), v.flip(1), do * 2, out, lse, delta)  # (new tensors, the same shapes and strides)

    def run(case, **kw):
        q_, k_, v_, do_, out_, lse_, delta_ = case
        common = dict(softmax_scale=scale, causal=causal, poison=True, **extra, **kw)
        if kind == "dq":
            return bwd_gluon.dq_gluon(q_, k_, v_, do_, out_, lse_, **common)
        return bwd_gluon.dkdv_gluon(q_, k_, v_, do_, lse_, delta_, **common)

    def same(got, want):  # (the fused kernel's dQ: in arrival order)
        for i, (a, w) in enumerate(zip(got, want)):
            assert torch.equal(a, w) or (kind == "fused" and i == 2), (kind, i)

    first = (q, k, v, do, out, lse, delta)
    plain, plain_other = run(first), run(other)
    launches = {}
    host = run(first, host_desc=True, launches=launches)
    (made,) = launches.values()
    assert {name for _, name, *_ in made.descriptors} >= {"Q", "DO", "K", "V"}
    replayed = run(other, host_desc=True, launches=launches)
    again = run(other, host_desc=True, launches=launches)  # (its descriptors' maps as encoded for the replay)
    torch.cuda.synchronize()
    same(host, plain)
    same(replayed, plain_other)
    same(again, plain_other)
    if kind == "dq":
        _assert_within_triton(host[0], dq_t, ref.dq, "dq")
    else:
        _assert_within_triton(host[0], dk_t, ref.dk, "dk")
        _assert_within_triton(host[1], dv_t, ref.dv, "dv")
        if kind == "fused":
            _assert_within_triton(host[2], dq_t, ref.dq, "dq")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra", [
    (2, 1000, 1000, 4, 4, 128, 128, False, 64, 2, {}), (1, 780, 1500, 8, 2, 128, 128, True, 64, 2, dict(walk=1)),
    (1, 1500, 780, 8, 2, 128, 128, True, 64, 2, dict(persistent="heavy")),
    (2, 1000, 1000, 8, 1, 128, 128, False, 64, 2, dict(persistent=True, host_desc=True)),
    (1, 1000, 1100, 4, 4, 64, 64, False, 128, 2, {}), (1, 1000, 1000, 4, 2, 64, 64, True, 128, 2, {}),
    (2, 600, 600, 8, 2, 64, 64, True, 64, 2, {}), (1, 700, 700, 4, 4, 192, 128, True, 32, 3, {}),
    (2, 1000, 1000, 4, 4, 128, 128, False, 64, 3, dict(fused=True, adder=True)),
    (1, 780, 1500, 4, 2, 128, 128, True, 64, 2, dict(fused=True, mask_every_tile=True, walk=1)),
    (1, 1000, 1100, 4, 4, 64, 64, False, 128, 2, dict(fused=True)),
    (2, 1000, 1000, 4, 4, 64, 64, True, 64, 2, dict(fused=True, turns=False, persistent="heavy")),
    (1, 1000, 1000, 4, 2, 128, 128, False, 64, 2, dict(fused=True, ordered=True))],
    ids=["hd128", "hd128-causal-GQA-Sq<Sk-flat", "hd128-causal-GQA-Sq>Sk-persistent", "hd128-MQA-persistent-host-desc",
         "hd64-128-row", "hd64-128-row-causal-halves", "hd64-causal-GQA4", "mla-causal", "fused-hd128-adder",
         "fused-hd128-causal-every-tile-GQA-flat", "fused-hd64-128-row", "fused-hd64-causal-no-turns-heavy-first",
         "fused-hd128-ordered"])
def test_gpu_lse_by_tma_gives_the_same_gradients(b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra):
    """The dK / dV kernel with lse and delta loaded by the loader's TMA (``lse_tma``; configs.BWD_GLUON_LSE_TMA): dK
    and dV bitwise the kernel's with the consumers' own loads (the same values into the same arithmetic; rows past the
    sequence read 0 for lse there, +inf here, and add exact zeros either way: their Q and dO tiles are zero), run
    twice, and within twice the Triton backward's error against the FP64 oracle. The query lengths are multiples of
    4 (TMA's 16-byte rule for lse's rows) but not of the tiles, so the last tile reads past the sequence. The fused
    kernel's (configs.BWD_GLUON_FUSED_LSE_TMA; built in session 58, routed in session 59) the same way, its dQ (added in
    arrival order; the ordered kernel's bitwise) within the same rule."""
    case = _gpu_case(b, sq, sk, hq, hk, d, causal, dv=dv)
    kw = dict(causal=causal, block_m=block_m, num_stages=stages, poison=True, **extra)
    _same_gradients_twice(case, kw, dict(lse_tma=True), dq_bitwise=bool(extra.get("ordered")))


def test_lse_by_tma_routes_in_the_listed_cells_where_tma_can_read_lse(monkeypatch):
    """configs.BWD_GLUON_LSE_TMA (session 58): the routed dK / dV launch takes ``lse_tma`` in a listed (head dim,
    mask) cell when lse's rows are on 16 bytes (a query length a multiple of 4), not otherwise, and never the dQ
    launch or a cell the set leaves out."""
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(configs, "BWD_GLUON_LSE_TMA", frozenset({(128, True)}))
    causal = dict(causal=True, window_right=0)
    routed = _route(*_inputs(sq=2048, sk=2048)[:3], **causal)
    assert routed["dkdv"]["lse_tma"] is True and "lse_tma" not in routed["dq"]
    assert "lse_tma" not in _route(*_inputs(sq=2046, sk=2048)[:3], **causal)["dkdv"]  # (2046 fp32: not 16 bytes)
    assert "lse_tma" not in _route(*_inputs(sq=2048, sk=2048)[:3])["dkdv"]  # (non-causal: not listed here)
    monkeypatch.setattr(configs, "BWD_GLUON_FUSED_LSE_TMA", frozenset({(128, False)}))  # (the fused route's own set)
    q, k, v, *_ = _inputs(sq=4096, sk=4096, hk=4)
    kw = dict(window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, sm_major=9)
    fused = configs.gluon_fused_bwd(q, k, v, q, q, torch.empty(1, 4, 4096), causal=False, **kw)
    assert fused is not None and fused["lse_tma"] is True
    causal = configs.gluon_fused_bwd(q, k, v, q, q, torch.empty(1, 4, 4096), causal=True, window_right=0,
                                     **{n: x for n, x in kw.items() if n != "window_right"})
    assert causal is None or "lse_tma" not in causal


def test_lse_by_tma_takes_16_byte_rows_and_the_dkdv_kernel_only():
    """``lse_tma`` is refused, with the reason, where TMA cannot read lse's rows (a query length not a multiple of 4,
    a strided or misaligned lse, not fp32)."""
    lse = torch.empty(2, 4, 1000)
    assert bwd_gluon.lse_tma_refused(lse, lse) is None
    assert "16 bytes" in bwd_gluon.lse_tma_refused(torch.empty(2, 4, 777), lse)
    assert "16 bytes" in bwd_gluon.lse_tma_refused(lse, torch.empty(2, 4, 1001)[..., 1:])
    assert "fp32" in bwd_gluon.lse_tma_refused(lse.double(), lse)
    assert "fp32" in bwd_gluon.lse_tma_refused(lse, torch.empty(2, 1000, 4).transpose(1, 2))
    q, k = torch.empty(1, 777, 4, 128, dtype=torch.bfloat16), torch.empty(1, 777, 2, 128, dtype=torch.bfloat16)
    odd = torch.empty(1, 4, 777)
    with pytest.raises(ValueError, match="lse_tma: lse: strides"):
        bwd_gluon.dkdv_arguments(q, k, k, q, odd, odd, k, k, 0.1, False, lse_tma=True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra", [
    (1, 1000, 1000, 8, 2, 128, 128, True, 64, 2, dict(walk=1, lse_tma=True)),
    (2, 1000, 1100, 4, 4, 64, 64, True, 64, 2, {}),
    (1, 1000, 1000, 8, 2, 128, 128, True, 64, 2, dict(fused=True, mask_every_tile=True, walk=1, lse_tma=True)),
    (2, 1000, 1000, 4, 4, 64, 64, True, 64, 2, dict(fused=True, turns=False))],
    ids=["hd128-causal-GQA", "hd64-causal-Sq<Sk", "fused-hd128-causal-GQA", "fused-hd64-causal-no-turns"])
def test_gpu_units_first_gives_the_same_gradients(b, sq, sk, hq, hk, d, dv, causal, block_m, stages, extra):
    """The dK / dV kernel with its grid's units first (``units_first``; configs.BWD_GLUON_UNITS_FIRST, built in session
    59): the same programs in another launch order, so dK and dV bitwise the default grid's, run twice; the fused
    kernel's dQ (added in arrival order) within twice the Triton backward's error against the FP64 oracle."""
    case = _gpu_case(b, sq, sk, hq, hk, d, causal, dv=dv)
    kw = dict(causal=causal, block_m=block_m, num_stages=stages, poison=True, **extra)
    _same_gradients_twice(case, kw, dict(units_first=True))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, dv, block_n, stages", [
    (2, 1000, 1000, 4, 4, 128, None, 128, 2), (1, 777, 1500, 8, 2, 128, None, 128, 2),
    (2, 1100, 1000, 4, 1, 128, None, 64, 3), (1, 600, 700, 4, 4, 192, 128, 64, 2),
    (2, 1000, 1000, 4, 2, 256, None, 32, 3)],
    ids=["hd128-causal", "hd128-GQA-Sq<Sk", "hd128-MQA-Sq>Sk", "mla-causal", "hd256-GQA-causal"])
def test_gpu_dq_units_first_gives_the_same_dq_and_delta(b, sq, sk, hq, hk, d, dv, block_n, stages):
    """The dQ kernel with its grid's units first and its query blocks last first (``units_first``; built in session
    60): the same programs in another launch order, so dQ and delta bitwise the default grid's, run twice (causal:
    the diagonal's masked blocks, rows that see no key, keys no row sees), dQ within twice the Triton backward's
    error against the FP64 oracle."""
    case = _gpu_case(b, sq, sk, hq, hk, d, True, dv)
    _same_dq_twice(case, dict(causal=True, block_n=block_n, num_stages=stages, poison=True), dict(units_first=True))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, lse_tma", [
    (1, 1100, 1100, 4, 2, True), (2, 1500, 777, 4, 1, False), (1, 800, 1500, 4, 4, True)],
    ids=["GQA-lse-by-TMA", "MQA-Sq>Sk", "Sq<Sk-lse-by-TMA"])
def test_gpu_hd256_dkdv_units_first_gives_the_same_gradients(b, sq, sk, hq, hk, lse_tma):
    """hd 256's dK / dV kernel with its grid's units first (``units_first``; built in session 60), causal: dK and dV
    bitwise the default grid's, run twice, within twice the Triton backward's error against the FP64 oracle."""
    from kernels.flash_attn import bwd_gluon_hd256 as wide

    case = _gpu_case(b, sq, sk, hq, hk, 256, True)
    _same_gradients_twice(case, dict(causal=True, poison=True, lse_tma=lse_tma), dict(units_first=True),
                          dkdv=wide.dkdv256_gluon)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [None, 7], ids=["an-SM-each", "7-programs"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, block_m, stages, extra", [
    (2, 1000, 1000, 4, 4, 64, True, 64, 2, {}), (1, 777, 1500, 8, 2, 128, False, 64, 2, dict(walk=1)),
    (2, 1000, 1000, 4, 4, 64, True, 64, 2, dict(fused=True, turns=False)),
    (1, 1000, 1100, 4, 4, 64, False, 128, 2, dict(fused=True)),
    (2, 1000, 1000, 4, 4, 128, False, 64, 3, dict(fused=True, adder=True)),
    (1, 777, 1500, 4, 2, 128, True, 64, 2, dict(fused=True, mask_every_tile=True, walk=1)),
    (2, 1000, 1000, 4, 4, 64, True, 64, 2, dict(persistent="heavy")),
    (1, 1500, 777, 8, 2, 128, True, 64, 2, dict(walk=1, persistent="heavy")),
    (2, 1000, 1000, 4, 4, 64, True, 64, 2, dict(fused=True, turns=False, persistent="heavy"))],
    ids=["dkdv-hd64-causal", "dkdv-hd128-GQA4-flat", "fused-hd64-causal-no-turns", "fused-hd64-128-row",
         "fused-hd128-adder", "fused-hd128-causal-every-tile-GQA-flat", "dkdv-hd64-causal-heavy-first",
         "dkdv-hd128-GQA4-causal-Sq>Sk-heavy-first", "fused-hd64-causal-heavy-first"])
def test_gpu_persistent_kernels_give_the_same_gradients(b, sq, sk, hq, hk, d, causal, block_m, stages, extra,
                                                        programs, monkeypatch):
    """The persistent kernel (one program an SM over the tiles; ``programs`` 7: a grid of 7, so each program walks
    many tiles, causal ones of every length, and the K / V release, the ring's phases and the turns cross tile
    boundaries many times): dK and dV bitwise the one-program-a-tile kernel's (each tile's keys see the same query
    tiles in the same order), dQ (fused: added in arrival order) and all three within twice the Triton backward's
    error against the FP64 oracle; run twice, so a barrier phase off by one would show as a hang (the call's
    timeout) or a wrong tile on either run. ``persistent="heavy"`` in ``extra``: the heavy-first tile order (a tile
    missed or walked twice would show in dK / dV's bits)."""
    from kernels.flash_attn import configs

    if programs is not None:
        monkeypatch.setattr(configs, "sm_count", lambda device_index: programs)
    extra = dict(extra)
    order = extra.pop("persistent", True)
    kw = dict(causal=causal, block_m=block_m, num_stages=stages, poison=True, **extra)
    _same_gradients_twice(_gpu_case(b, sq, sk, hq, hk, d, causal), kw, dict(persistent=order))


def _same_gradients_twice(case, kw: dict, variant: dict, dq_bitwise: bool = False, dkdv=None):
    """bwd_gluon.dkdv_gluon (or ``dkdv``: a function of its arguments, hd 256's) with ``variant``'s keywords beside the
    same call without (``kw``; ``case``: :func:`_gpu_case`'s), run twice: dK and dV bitwise, the fused kernel's dQ
    within twice the Triton backward's error (bitwise with ``dq_bitwise``: the ordered adds), and dK and dV within it
    against the FP64 oracle."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = case
    kw = dict(kw, softmax_scale=scale)
    dkdv = dkdv or bwd_gluon.dkdv_gluon
    plain = dkdv(q, k, v, do, lse, delta, **kw)
    for _ in range(2):
        got = dkdv(q, k, v, do, lse, delta, **variant, **kw)
        torch.cuda.synchronize()
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
        if dq_bitwise:
            assert torch.equal(got[2], plain[2])
        if len(got) == 3:
            _assert_within_triton(got[2], dq_t, ref.dq, "dq")
    _assert_within_triton(got[0], dk_t, ref.dk, "dk")
    _assert_within_triton(got[1], dv_t, ref.dv, "dv")


def _same_dq_twice(case, kw: dict, variant: dict):
    """bwd_gluon.dq_gluon with ``variant``'s keywords beside the same call without (``kw``; ``case``:
    :func:`_gpu_case`'s), run twice: dQ and delta bitwise, dQ within twice the Triton backward's error against the
    FP64 oracle, delta within 1e-4 of the case's."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, _, _) = case
    kw = dict(kw, softmax_scale=scale)
    plain = bwd_gluon.dq_gluon(q, k, v, do, out, lse, **kw)
    for _ in range(2):
        got = bwd_gluon.dq_gluon(q, k, v, do, out, lse, **variant, **kw)
        torch.cuda.synchronize()
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
    _assert_within_triton(got[0], dq_t, ref.dq, "dq")
    assert torch.allclose(got[1], delta, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("programs", [None, 7], ids=["an-SM-each", "7-programs"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, dv, causal, block_n, stages, order", [
    (2, 1000, 1000, 4, 4, 128, None, True, 128, 2, True), (1, 777, 1500, 8, 2, 128, None, False, 64, 3, True),
    (2, 1100, 1000, 4, 1, 64, None, True, 64, 3, True), (1, 600, 700, 4, 4, 192, 128, True, 64, 3, True),
    (2, 1000, 1000, 4, 4, 128, None, True, 128, 2, "heavy"), (2, 1100, 1000, 4, 1, 64, None, True, 64, 3, "heavy")],
    ids=["hd128-causal", "hd128-GQA-Sq<Sk", "hd64-MQA-causal-Sq>Sk", "mla-causal", "hd128-causal-heavy-first",
         "hd64-MQA-causal-Sq>Sk-heavy-first"])
def test_gpu_persistent_dq_kernel_gives_the_same_dq_and_delta(b, sq, sk, hq, hk, d, dv, causal, block_n, stages,
                                                             order, programs, monkeypatch):
    """The persistent dQ kernel (one program an SM over the (query block, head) tiles; ``programs`` 7: each program
    walks many tiles, causal ones of every length, and the Q / dO release, the K / V ring's phases and the turns
    cross tile boundaries many times): dQ and delta bitwise the one-program-a-tile kernel's (each tile sees the same
    key blocks in the same order) and dQ within twice the Triton backward's error against the FP64 oracle; run
    twice, so a barrier phase off by one would show as a hang (the call's timeout) or a wrong tile on either run.
    ``order`` "heavy": the heavy-first tile order (the causal query blocks heaviest last, walked first)."""
    from kernels.flash_attn import configs

    if programs is not None:
        monkeypatch.setattr(configs, "sm_count", lambda device_index: programs)
    case = _gpu_case(b, sq, sk, hq, hk, d, causal, dv)
    _same_dq_twice(case, dict(causal=causal, block_n=block_n, num_stages=stages, poison=True), dict(persistent=order))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, window, d, dv", [
    (1, 2000, 2000, 8, 2, 300, 128, 128), (1, 777, 1500, 4, 4, 130, 128, 128), (2, 1500, 777, 4, 1, 64, 128, 128),
    (1, 1000, 1000, 4, 4, 0, 128, 128), (1, 1100, 1300, 4, 4, 257, 192, 128), (1, 1000, 1000, 2, 2, 5000, 128, 128),
    (1, 2100, 2100, 2, 2, 500, 64, 64), (1, 4096, 4096, 8, 1, 1000, 128, 128)],
    ids=["GQA-W300", "Sq<Sk-W130", "MQA-Sq>Sk-W64", "diagonal-only", "mla-W257", "window-past-start", "hd64-W500",
         "MQA-split-4k-W1000"])
def test_gpu_windowed_gluon_backward_matches_oracle(b, sq, sk, hq, hk, window, d, dv, monkeypatch):
    """configs.BWD_GLUON_WINDOW on (session 51's build; the route's minimum lengths set to 1): a causal call with a
    window on the left runs the split route's Gluon dK / dV kernel (and its dQ kernel where the head dim has one)
    one program a tile; out and every gradient within the tolerance rule of the FP64 oracle: windows narrower and
    wider than a tile, 0 (the diagonal only), wider than the sequence, keys no query sees (Sq < Sk), rows that see
    no key (Sq > Sk), MLA's two head-dim parts, hd 64, GQA's flat walk, MQA's group split; a second call replays the
    launches to the same gradients."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "BWD_GLUON_WINDOW", True)
    monkeypatch.setattr(configs, "BWD_GLUON_MIN_SEQLEN", {hd: {name: {False: 1, True: 1} for name in kernels}
                                                          for hd, kernels in configs.BWD_GLUON.items()})
    interface._SIGNATURES.clear()
    first = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, True, window=(window, 0), device="cuda",
                                 dv=dv)
    names = _backward_kernels(interface)
    assert "_bwd_dkdv_ws_kernel" in names and "_bwd_dkdv_kernel" not in names, names
    if "dq" in configs.BWD_GLUON[d]:
        assert "_bwd_dq_ws_kernel" in names and "_bwd_dq_kernel" not in names, names
    again = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, True, window=(window, 0), device="cuda",
                                 dv=dv)
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


#: Gemma-2's hd 256 GPU cases (b, sq, sk, hq, hk, causal, window, softcap, dtype) and their ids, both kernels' tests
#: (and hd 128's capped ones at the same shapes)
HD256_CASES = [
    (1, 1100, 1100, 4, 2, True, -1, 50.0, torch.bfloat16), (1, 777, 1500, 4, 4, False, -1, 30.0, torch.bfloat16),
    (2, 1500, 777, 4, 1, True, -1, 50.0, torch.float16), (1, 1000, 1000, 4, 4, False, -1, 0.0, torch.bfloat16),
    (1, 1300, 1300, 4, 2, True, 300, 50.0, torch.bfloat16), (1, 1000, 1000, 2, 2, True, -1, 1.0, torch.bfloat16)]
HD256_IDS = ["causal-GQA-cap50", "Sq<Sk-cap30", "MQA-Sq>Sk-cap50-fp16", "uncapped", "GQA-W300-cap50", "causal-cap1"]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, dtype",
                         HD256_CASES + [(1, 200, 90, 8, 1, True, -1, 50.0, torch.bfloat16)],
                         ids=HD256_IDS + ["MQA-short-split-cap50"])
def test_gpu_gluon_split_kernels_capped_at_hd128_match_oracle(b, sq, sk, hq, hk, causal, window, softcap, dtype,
                                                              monkeypatch):
    """hd 128's softcapped backward on both split Gluon kernels (session 55's build: the dK / dV kernel's SOFTCAP, the
    dQ kernel at configs.BWD_GLUON_SOFTCAP_CONFIGS' 64-key tiles; configs.BWD_GLUON_SOFTCAP listing hd 128, both
    kernels routed from one token, persistent where the route makes them): out and every gradient within the
    tolerance rule of the FP64 oracle, capped (50, 30, and 1: every score near the cap) and not, GQA (Gemma-2-27B's
    group of 2), MQA with rows that see no key (Sq > Sk) and under the group split (fp32 partials), keys no query sees
    (Sq < Sk), fp16, a window (Gemma-2's local layers); a second call replays the launches to the same gradients."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "BWD_GLUON_SOFTCAP", frozenset({128, 256}))
    monkeypatch.setitem(configs.BWD_GLUON_MIN_SEQLEN, 128, {"dq": {False: 1, True: 1}, "dkdv": {False: 1, True: 1}})
    interface._SIGNATURES.clear()
    kw = dict(window=(window, 0 if causal else -1), device="cuda", softcap=softcap)
    first = check_against_oracle(b, sq, sk, hq, hk, 128, dtype, causal, **kw)
    names = _backward_kernels(interface)
    assert {"_bwd_dq_ws_kernel", "_bwd_dkdv_ws_kernel"} <= names, names
    assert not names & {"_bwd_dq_kernel", "_bwd_dkdv_kernel"}, names
    again = check_against_oracle(b, sq, sk, hq, hk, 128, dtype, causal, **kw)
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, dtype", HD256_CASES, ids=HD256_IDS)
def test_gpu_gluon_dq_at_hd256_matches_oracle(b, sq, sk, hq, hk, causal, window, softcap, dtype, monkeypatch):
    """Gemma-2's hd 256 backward with its dQ on the Gluon kernel (session 53's build: configs.BWD_GLUON_TRY's config
    routed from one token, configs.BWD_GLUON_SOFTCAP listing hd 256) and its dK / dV on the Triton kernel: out and
    every gradient within the tolerance rule of the FP64 oracle, capped (50, 30, and 1: every score near the cap) and
    not, GQA, MQA with rows that see no key (Sq > Sk), keys no query sees (Sq < Sk), fp16, a window; a second call
    replays the launches to the same gradients."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "BWD_GLUON_SOFTCAP", frozenset({256}))
    monkeypatch.setitem(configs.BWD_GLUON, 256, dict(configs.BWD_GLUON_TRY[256]))
    monkeypatch.setitem(configs.BWD_GLUON_MIN_SEQLEN, 256, {"dq": {False: 1, True: 1}})
    interface._SIGNATURES.clear()
    kw = dict(window=(window, 0 if causal else -1), device="cuda", softcap=softcap)
    first = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    names = _backward_kernels(interface)
    assert "_bwd_dq_ws_kernel" in names and "_bwd_dq_kernel" not in names, names
    assert "_bwd_dkdv_kernel" in names, names
    again = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, dtype",
                         [c for c in HD256_CASES if c[6] < 0], ids=[i for i, c in zip(HD256_IDS, HD256_CASES) if c[6] < 0])
def test_gpu_hd256_dkdv_takes_lse_by_tma_to_the_same_gradients(b, sq, sk, hq, hk, causal, window, softcap, dtype,
                                                               monkeypatch):
    """hd 256's dK / dV kernel with lse and delta by the loader's TMA (configs.BWD_GLUON_LSE_TMA listing hd 256; built
    in session 58, routed in session 59): every gradient bitwise the consumers' own loads' (the set without hd 256;
    Sq 777: refused by the route, the same kernel), within the tolerance rule of the FP64 oracle."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setitem(configs.BWD_GLUON, 256, dict(configs.BWD_GLUON_TRY[256]))
    monkeypatch.setitem(configs.BWD_GLUON_MIN_SEQLEN, 256, {"dq": {False: 1, True: 1}, "dkdv": {False: 1, True: 1}})
    kw = dict(window=(-1, 0 if causal else -1), device="cuda", softcap=softcap)
    interface._SIGNATURES.clear()
    listed = configs.BWD_GLUON_LSE_TMA | {(256, False), (256, True)}
    monkeypatch.setattr(configs, "BWD_GLUON_LSE_TMA", listed - {(256, False), (256, True)})  # (own loads)
    plain = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    monkeypatch.setattr(configs, "BWD_GLUON_LSE_TMA", listed)
    interface._SIGNATURES.clear()
    by_tma = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    assert "_bwd_dkdv256_kernel" in _backward_kernels(interface)
    assert all(torch.equal(x, y) for x, y in zip(plain[2:5], by_tma[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, dtype",
                         HD256_CASES + [(1, 200, 90, 8, 1, True, -1, 0.0, torch.bfloat16)],
                         ids=HD256_IDS + ["MQA-short-split"])
def test_gpu_gluon_dkdv_at_hd256_matches_oracle(b, sq, sk, hq, hk, causal, window, softcap, dtype, monkeypatch):
    """Gemma-2's hd 256 backward with both kernels on Gluon (session 54's build: bwd_gluon_hd256's dK / dV, the head
    dim split between its consumers; configs.BWD_GLUON_TRY's configs routed from one token): out and every gradient
    within the tolerance rule of the FP64 oracle, capped (50, 30, 1) and not, GQA, MQA with rows that see no key (Sq
    > Sk) and under the backward's group split (fp32 partials), keys no query sees (Sq < Sk), fp16; a window keeps
    the Triton dK / dV kernel (this one has none); a second call replays the launches to the same gradients."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setitem(configs.BWD_GLUON, 256, dict(configs.BWD_GLUON_TRY[256]))
    monkeypatch.setitem(configs.BWD_GLUON_MIN_SEQLEN, 256, {"dq": {False: 1, True: 1}, "dkdv": {False: 1, True: 1}})
    interface._SIGNATURES.clear()
    kw = dict(window=(window, 0 if causal else -1), device="cuda", softcap=softcap)
    first = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    names = _backward_kernels(interface)
    if window >= 0:
        assert "_bwd_dkdv_kernel" in names and "_bwd_dkdv256_kernel" not in names, names
    else:
        assert "_bwd_dkdv256_kernel" in names and "_bwd_dkdv_kernel" not in names, names
    again = check_against_oracle(b, sq, sk, hq, hk, 256, dtype, causal, **kw)
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("sq, sk, d, causal, deterministic", [
    (1024, 1100, 128, False, False), (2100, 2060, 128, True, True), (4100, 4096, 64, True, False),
    (4096, 4096, 64, False, True), (4096, 4100, 128, True, True), (2048, 2100, 128, False, True)],
    ids=["fused-hd128-S1024x1100", "split-hd128-causal", "fused-hd64-causal", "split-hd64",
         "split-hd128-causal-gluon-dq", "split-hd128-gluon-dq-2k"])
def test_gpu_persistent_route_matches_oracle(sq, sk, d, causal, deterministic, monkeypatch):
    """FLASH_ATTN_BWD=persistent through flash_attn_func: the default route's Gluon dK / dV launch (deterministic
    calls: the split kernels, with the Gluon dQ kernel where it runs: hd 128 from 1k, both masks) or
    unordered fused launch (nondeterministic calls) persistent; out and every gradient within the tolerance rule of
    the FP64 oracle, a second call replaying the launches (dK / dV the same bits)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setenv("FLASH_ATTN_BWD", "persistent")
    interface._SIGNATURES.clear()
    first = check_against_oracle(1, sq, sk, 2, 2, d, torch.bfloat16, causal, device="cuda",
                                 deterministic=deterministic)
    names = _backward_kernels(interface)
    assert "_bwd_dkdv_ws_kernel" in names and "_bwd_dkdv_kernel" not in names, names
    if deterministic and d == 128 and min(sq, sk) >= configs.BWD_GLUON_MIN_SEQLEN[128]["dq"][causal]:
        # (the split route's Gluon dQ kernel, persistent too)
        assert "_bwd_dq_ws_kernel" in names and "_bwd_dq_kernel" not in names, names
    again = check_against_oracle(1, sq, sk, 2, 2, d, torch.bfloat16, causal, device="cuda",
                                 deterministic=deterministic)
    assert all(torch.equal(x, y) for x, y in zip(first[3:5], again[3:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, extra", [
    (2, 1000, 1000, 4, 4, 128, True, {}), (2, 1000, 1000, 4, 4, 64, True, dict(fused=True, turns=False)),
    (1, 1000, 1100, 4, 2, 128, False, dict(fused=True, adder=True, num_stages=3)),
    (2, 1000, 1000, 4, 4, 64, True, dict(fused=True, turns=False, persistent=True))],
    ids=["dkdv-hd128-causal", "fused-hd64-causal-no-turns", "fused-hd128-adder-GQA", "fused-hd64-persistent"])
def test_gpu_timeline_stamps_change_no_gradient(b, sq, sk, hq, hk, d, causal, extra):
    """``times`` (gluon_bwd_probe.py --timeline): dK and dV bitwise the same launch's without stamps, dQ within the
    oracle bound; every program's (persistent: every tile's) record written, in order (entry <= start <= K / V landed
    <= loop end <= end, both consumers on one SM, the same query tiles), and the probe's summary reads it."""
    probe = _probe()
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(dict(softmax_scale=scale, causal=causal, block_m=64, num_stages=2, poison=True), **extra)
    plain = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    times = bwd_gluon.timeline_buffer(k)
    got = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, times=times, **kw)
    torch.cuda.synchronize()
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
    if len(got) == 3:
        _assert_within_triton(got[2], dq_t, ref.dq, "dq")
    rec = bwd_gluon.timeline_record(times)
    c = [rec[f] for f in ("clock_start", "clock_kv", "clock_loop_end", "clock_end")]
    assert all(bool((x <= y).all()) for x, y in zip(c, c[1:]))
    entry = rec["clock_entry"]  # (a program's, before its descriptors; a persistent program's first tile only)
    assert bool((entry >= 0).all()) or extra.get("persistent")
    assert bool((entry[entry >= 0] <= rec["clock_start"][entry >= 0]).all())
    desc = rec["clock_desc"]  # (its Q / dO / K / V descriptors made: between the entry and the consumers' start)
    assert torch.equal(desc >= 0, entry >= 0)
    assert bool((entry[entry >= 0] <= desc[entry >= 0]).all())
    assert bool((desc[entry >= 0] <= rec["clock_start"][entry >= 0]).all())
    assert bool((rec["global_start"] <= rec["global_end"]).all())
    assert torch.equal(rec["sm"][:, 0], rec["sm"][:, 1]) and torch.equal(rec["tiles"][:, 0], rec["tiles"][:, 1])
    steps = (hq // hk) * -(-sq // 64)  # a non-causal program's (head, tile) steps; causal ones: at most
    assert bool((rec["tiles"] <= steps).all()) and (causal or bool((rec["tiles"] == steps).all()))
    t = probe.timeline_summary(rec)
    assert t["programs"] == -(-sk // 128) * b * hk and 0 < t["loop"] <= 1
    assert t["loop"] + t["prologue"] + t["epilogue"] + t["gaps"] + t["idle"] == pytest.approx(1, abs=0.05)
    with pytest.raises(ValueError, match="launches=None"):
        bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, times=times, launches={}, **kw)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal", [
    (1, 1000, 1000, 4, 4, 128, True), (1, 1100, 1000, 4, 4, 64, False), (1, 777, 1500, 8, 2, 128, False)],
    ids=["hd128-causal", "hd64-Sq>Sk", "GQA4-flat-Sq<Sk"])
def test_gpu_ordered_fused_route_is_bitwise_reproducible(b, sq, sk, hq, hk, d, causal, monkeypatch):
    """FLASH_ATTN_BWD=ordered through flash_attn_func (the default, deterministic call): delta's preprocess zeroing
    the add counters, the ordered fused kernel, dQ's cast, no dQ kernel; out and every gradient within the
    tolerance rule of the FP64 oracle, and dQ, dK, dV bitwise the same over three calls (the later two replayed)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setenv("FLASH_ATTN_BWD", "ordered")
    interface._SIGNATURES.clear()
    runs = [check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda") for _ in range(3)]
    names = _backward_kernels(interface)
    assert {"_bwd_preprocess", "_bwd_dkdv_ws_kernel", "_cast_dq"} <= names, names
    assert not {"_bwd_dq_kernel", "_bwd_dq_ws_kernel", "_bwd_dkdv_kernel"} & names, names
    for again in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0][2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
def test_gpu_ordered_fused_without_turns_gives_the_same_dq_bitwise():
    """The deterministic fused kernel (its adds in a fixed order by the adder warp) with ``turns=False``: dQ, dK
    and dV bitwise those with turns (the consumers' turns never decided an add's place), causal and not."""
    for causal in (False, True):
        q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(1, 1000, 1000, 4, 4, 128, causal)
        kw = dict(softmax_scale=scale, causal=causal, block_m=64, num_stages=2, poison=True, fused=True,
                  ordered=True)
        turned = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
        got = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, turns=False, **kw)
        torch.cuda.synchronize()
        assert all(torch.equal(x, y) for x, y in zip(got, turned)), causal
        _assert_within_triton(got[2], dq_t, ref.dq, "dq")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("fused", [False, True], ids=["dkdv", "fused"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, walk", [
    (2, 1000, 1000, 4, 4, 128, 0), (1, 777, 1500, 4, 2, 128, 1), (1, 1500, 777, 4, 1, 128, 1),
    (2, 600, 600, 8, 2, 64, 0)],
    ids=["MHA-S1000", "GQA-Sq<Sk-flat", "MQA-Sq>Sk-flat", "hd64-GQA4"])
def test_gpu_mask_on_every_tile_gives_the_same_gradients(b, sq, sk, hq, hk, d, walk, fused):
    """Causal, the mask on every tile (``mask_every_tile``; the fused kernel's route at hd 128) against the branch on
    the diagonal's tiles: dK and dV bitwise the same (the same values added in the same order), dQ (fused) within
    the Triton backward's error bound of the FP64 oracle, as the branch's."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, True)
    kw = dict(softmax_scale=scale, causal=True, poison=True, fused=fused, walk=walk)
    branch = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw)
    every = bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, mask_every_tile=True, **kw)
    torch.cuda.synchronize()
    assert torch.equal(branch[0], every[0]) and torch.equal(branch[1], every[1])
    _assert_within_triton(every[0], dk_t, ref.dk, "dk")
    _assert_within_triton(every[1], dv_t, ref.dv, "dv")
    if fused:
        _assert_within_triton(every[2], dq_t, ref.dq, "dq")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, d, causal, last_first", [
    (2, 1000, 1000, 4, 4, 128, True, None), (1, 777, 1500, 4, 2, 128, True, None),
    (1, 1500, 777, 4, 1, 128, True, None), (2, 600, 600, 8, 2, 64, True, None), (1, 4096, 4096, 2, 2, 128, True, None),
    (1, 4096, 4096, 2, 2, 128, True, False), (1, 777, 1500, 4, 2, 128, True, False),
    (1, 20000, 20000, 1, 1, 128, True, None), (2, 1000, 1000, 4, 4, 128, False, None),
    (1, 777, 1500, 4, 2, 128, False, None), (2, 600, 600, 8, 2, 64, False, None), (1, 20000, 20000, 1, 1, 64, False, None)],
    ids=["MHA-S1000", "GQA-Sq<Sk", "MQA-Sq>Sk", "hd64-GQA4", "S4096", "S4096-first-first", "GQA-Sq<Sk-first-first",
         "S20000-more-key-blocks-than-SMs", "noncausal-MHA-S1000", "noncausal-GQA-Sq<Sk", "noncausal-hd64-GQA4",
         "noncausal-S20000-hd64"])
def test_gpu_ordered_fused_kernel_is_bitwise_reproducible(b, sq, sk, hq, hk, d, causal, last_first):
    """The fused kernel with its dQ adds in a fixed order (not routed yet): dQ, dK and dV within twice the Triton
    backward's error against the FP64 oracle, and three runs bitwise equal (dQ included, which the unordered
    kernel's is not); causal and not; Sq != Sk both ways (off > 0 and < 0: tiles no key block adds to), GQA / MQA
    (a group's heads one after another), the key blocks launched either way (first first: a probe's option, its few
    programs all resident here), and more key blocks than SMs (157 at 20k, last first as by default: programs not
    all resident at once must not deadlock). A hang here is the order being wrong: the whole file runs under a
    timeout (device_show.sh)."""
    q, k, v, do, out, lse, delta, scale, ref, (dq_t, dk_t, dv_t) = _gpu_case(b, sq, sk, hq, hk, d, causal)
    kw = dict(softmax_scale=scale, causal=causal, num_stages=2, poison=True, fused=True, ordered=True,
              last_first=last_first)
    runs = [bwd_gluon.dkdv_gluon(q, k, v, do, lse, delta, **kw) for _ in range(3)]
    torch.cuda.synchronize()
    dk, dv, dq = runs[0]
    for again in runs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(runs[0], again))
    _assert_within_triton(dq, dq_t, ref.dq, "dq")
    _assert_within_triton(dk, dk_t, ref.dk, "dk")
    _assert_within_triton(dv, dv_t, ref.dv, "dv")


@pytest.mark.gpu
@needs_sm90
@WHOLE_CASES
def test_gpu_backward_through_the_fused_kernel_matches_oracle(b, sq, sk, hq, hk, d, causal, monkeypatch):
    """flash_attn_func's backward with FLASH_ATTN_BWD=fused: delta's preprocess, the fused kernel and dQ's cast, no
    dQ kernel (MQA: the group split's dK / dV partials summed by the Triton sum, whose launch also casts dQ, added by
    every split); out and every gradient within the tolerance rule of the FP64 oracle; a second call replays the
    launches (dK / dV the same bits)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setenv("FLASH_ATTN_BWD", "fused")
    interface._SIGNATURES.clear()
    first = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda")
    names = _backward_kernels(interface)
    assert {"_bwd_preprocess", "_bwd_dkdv_ws_kernel"} <= set(names), names
    # dQ is cast by one launch: _cast_dq, or under a group split the sum's launch (_sum_partials' CAST_DQ)
    assert ("_cast_dq" in names) != ("_sum_partials" in names), names
    assert not {"_bwd_dq_kernel", "_bwd_dq_ws_kernel", "_bwd_dkdv_kernel"} & set(names), names
    again = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, device="cuda")
    assert all(torch.equal(x, y) for x, y in zip(first[3:5], again[3:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("sq, sk, d, causal", [(4096, 4096, 128, False), (4100, 4200, 128, True),
                                               (2048, 2048, 128, False), (2100, 2060, 128, True),
                                               (1024, 1100, 128, False), (8192, 8200, 128, False),
                                               (8192, 8200, 64, False), (8300, 8200, 64, True),
                                               (1024, 1100, 64, True), (1024, 1024, 128, True)],
                         ids=["hd128-S4096", "hd128-causal-S4100x4200", "hd128-S2048", "hd128-causal-S2100x2060",
                              "hd128-S1024x1100", "hd128-S8192x8200", "hd64-S8192x8200", "hd64-causal-S8300x8200",
                              "hd64-causal-S1024x1100-persistent", "hd128-causal-S1024-persistent"])
def test_gpu_default_fused_route_matches_oracle(sq, sk, d, causal, monkeypatch):
    """flash_attn_func(deterministic=False)'s backward as routed by default on MHA from configs.BWD_GLUON_FUSED's
    lengths: delta's preprocess and the fused kernel (persistent in configs.BWD_GLUON_PERSISTENT's cells: the causal
    1k cases), no dQ kernel; out and every gradient within the tolerance rule of the FP64 oracle. The default
    deterministic=True: the split kernels, or the ordered fused kernel where configs.BWD_GLUON_FUSED_ORDERED routes it
    (hd 128 non-causal from 8k); two runs bitwise equal."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    assert min(sq, sk) >= configs.BWD_GLUON_FUSED[d][False, causal][0]  # each case is one the table routes
    interface._SIGNATURES.clear()
    check_against_oracle(1, sq, sk, 2, 2, d, torch.bfloat16, causal, device="cuda", deterministic=False)
    names = _backward_kernels(interface)
    assert {"_bwd_preprocess", "_bwd_dkdv_ws_kernel", "_cast_dq"} <= names, names
    assert not {"_bwd_dq_kernel", "_bwd_dq_ws_kernel", "_bwd_dkdv_kernel"} & names, names
    interface._SIGNATURES.clear()  # the default (deterministic): the split kernels, bitwise the same twice
    first = check_against_oracle(1, sq, sk, 2, 2, d, torch.bfloat16, causal, device="cuda")
    names = _backward_kernels(interface)
    if configs.ordered_bwd_cell(d, d, False, causal, min(sq, sk)) is None:
        assert "_bwd_preprocess" not in names, names
    else:
        assert {"_bwd_preprocess", "_bwd_dkdv_ws_kernel", "_cast_dq"} <= names, names
        assert not {"_bwd_dq_kernel", "_bwd_dq_ws_kernel", "_bwd_dkdv_kernel"} & names, names
    again = check_against_oracle(1, sq, sk, 2, 2, d, torch.bfloat16, causal, device="cuda")
    assert all(torch.equal(x, y) for x, y in zip(first[2:5], again[2:5]))
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, split", [
    (2, 2048, 2048, 16, 1, False, None), (1, 1200, 1100, 8, 2, True, 4), (1, 1100, 1200, 8, 1, False, 3)],
    ids=["MQA-16-1-S2048-default-split", "causal-GQA4-Sq>Sk-split4", "MQA-Sq<Sk-split3"])
def test_gpu_split_summed_in_the_dkdv_kernel_gives_the_same_bits(b, sq, sk, hq, hk, causal, split, monkeypatch):
    """configs.BWD_GLUON_SPLIT_SUM (session 57) at hd 64: the Gluon dK / dV kernel summing its group split itself
    gives dQ, dK and dV bitwise the separate sum's (the same fp32 adds in split order), within twice the Triton
    backward's error against the FP64 oracle; no _sum_partials launch; three calls in a row (the first launches,
    the others replay) give the same bits, so each launch left its counters at zero for the next; a CUDA graph of the
    call replayed twice gives them too. Partial key blocks (keys past the end: their rows' counts still arrive),
    an odd split, causal."""
    from kernels import launcher
    from kernels.flash_attn.bwd import flash_attn_bwd

    d = 64
    q, k, v, do, out, lse, _, scale, ref, triton_ = _gpu_case(b, sq, sk, hq, hk, d, causal)
    mask = dict(causal=causal, window_left=-1, window_right=0 if causal else -1)
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(configs, "BWD_GLUON_SPLIT_SUM", frozenset())
    plain_launches = {}
    plain = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, split=split, launches=plain_launches, **mask)
    names = {x.compiled.name for x in plain_launches["plan"][3]}
    assert "_sum_partials" in names and "_bwd_dkdv_ws_kernel" in names, names  # (a split, the Gluon kernel)
    monkeypatch.setattr(configs, "BWD_GLUON_SPLIT_SUM", frozenset({d}))
    launches = {}
    got = [flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, split=split, launches=launches, **mask)
           for _ in range(3)]
    names = {x.compiled.name for x in launches["plan"][3]}
    assert "_sum_partials" not in names and "_bwd_dkdv_ws_kernel" in names, names
    counters = launcher.counters(q, launches["plan"][6])
    torch.cuda.synchronize()
    assert not counters.any()  # (every count set back)
    for i, grads in enumerate(got):
        for name, x, y in zip(("dq", "dk", "dv"), grads, plain):
            assert torch.equal(x, y), (i, name)
    _assert_within_triton(got[0][1], triton_[1], ref.dk, "dk")
    _assert_within_triton(got[0][2], triton_[2], ref.dv, "dv")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, split=split, launches=launches, **mask)  # warm
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=scale, split=split, launches=launches,
                                      **mask)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        for x in captured[1:]:
            x.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured[1], plain[1]) and torch.equal(captured[2], plain[2])
