"""Registers, spills and ptxas's wgmma serialisation warning of the Gluon FP8 forward
(kernels/flash_attn/fp8_gluon.py) compiled for sm_90a, without a GPU.

    python benchmarks/fp8_gluon_ptxas.py 64,64,128,1,1 256,64,64,0,1 ws:256,64,3,0 [--json] [--dump DIR]

Each spec is HEAD_DIM,BLOCK_M,BLOCK_N,CAUSAL,OVERLAP (3 stages), or ws:HEAD_DIM,BLOCK_N,STAGES,CAUSAL[,OUT8] for
the warp-specialised kernel (OUT8 1: the output written in e4m3) (its partitions' register budgets: the PTX's setmaxnreg),
or ws16:HEAD_DIM,BLOCK_N,STAGES,CAUSAL[,FP16] for its 16-bit variant (``fwd_gluon_ws``, bf16 unless FP16 is 1; the
"e4m3 wgmma" column then counts 16-bit wgmmas; HEAD_DIM may be QK/V, e.g. 192/128), ws16p:... for that one's
persistent kernel (query blocks outer), ws16pk:... for it with kv heads outer, ws16ps:... kv heads outer snaking,
ws16w3:HEAD_DIM,BLOCK_N,STAGES,CAUSAL[,FP16[,REGS]] for the 16-bit kernel's three consumer warpgroups (192-row tiles),
ws16w3n:... for them without the in-block overlap, ws16n:... the two-consumer kernel without it (these four
not persistent ones may end in @w1: a causal call's sliding window on the left, ``fwd_gluon_ws``'s ``window_left``;
and in @hd: its TMA descriptors made on the host, its ``host_desc``; and any ws16 spec, persistent too, in @sc: its
scores softcapped at 50, its ``softcap``, and in @e2 / @e4: one of 2 / 4 exponentials by a cubic, its ``exp2_every``,
and in @lz: the lazy rescale at its bound of 8, its ``lazy``;
e.g. ws16:128,128,3,1@w1@hd),
or bwd16:HEAD_DIM[/HEAD_DIM_V],BLOCK_M,STAGES,CAUSAL[,FP16] for the warp-specialised dK / dV kernel (bwd_gluon.py),
bwdf16:... for its fused variant (dQ too, added by TMA reduce), bwda16:... for that one with its adds in an adder
warp, bwdw16:HEAD_DIM,BLOCK_M,STAGES,CAUSAL,WALK[,GROUP[,FUSED]] for the fused one (FUSED 0: the dK / dV one) walking
its (head, tile) steps by WALK (bwd_gluon._walk_bounds: 0 nested, 1 flat, 2 lockstep) over a GQA group of GROUP
(default 4) query heads, bwdo16:... for
the fused one with its adds ordered (the deterministic variant) (any of these five may end in @h1 / @h0: 128-row
tiles' S^T and dP^T in two 64-query halves or not, bwd_gluon.dkdv_arguments' ``halves``, default its rule; and in
@m1: the causal mask on every tile, its ``mask_every_tile``; @u1 (the fused ones): dQ's partials without the softmax
scale, its ``dq_unscaled``; @d1 (the fused ones): dK's dS^T from shared memory, its ``ds_smem``; @t0 (any of
them): its consumers issue without taking turns, its ``turns=False``; @x1 (any of them): each consumer's timeline
stamps, its ``times`` (gluon_bwd_probe.py --timeline); @p1 (not bwdo16): one program an SM over the tiles, its
``persistent``; @p2: the same in the heavy-first tile order, its ``persistent="heavy"``; @hd: its TMA descriptors
made on the host, its ``host_desc``; @w1 (causal, not fused or persistent): a sliding window on the left, its
``window_left``; @sc (bwd16 / bwdw16 with FUSED 0): scores softcapped at 50, its ``softcap``; @s2 (the same two): a
group split of 2 summed in the kernel, its ``split_sum``; @l1: lse and delta by the loader's TMA, its ``lse_tma``;
@g1 (one program a tile, not bwdo16): the grid's units before its key blocks, its ``units_first``; e.g.
bwdf16:128,64,2,1@m1,
several as @m1@u1), and
bwdq16:HEAD_DIM[/HEAD_DIM_V],BLOCK_N,STAGES,CAUSAL[,FP16][@p1|@p2][@hd][@w1][@sc][@g1] for its dQ kernel (@p1 / @p2:
persistent; @hd: host-made descriptors; @w1: a window; @sc: softcapped scores; @g1: the grid's units first, its
``units_first``), and
bwd256:STAGES,CAUSAL[,FP16[,GROUP]][@sc][@l1][@g1] for hd 256's dK / dV kernel (bwd_gluon_hd256.py: 64 keys a program,
the head dim split between its consumers; GROUP query heads a kv head, default 2; @sc: softcapped scores; @l1: lse
and delta by the loader's TMA; @g1: the grid's units first).
Gluon has no interpreter, so this is how the CPU suite checks the kernel (tests/kernels/test_fp8_gluon.py runs it
in a subprocess: the suite's interpreter setting would otherwise turn the kernel's helpers into interpreted
functions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU even on a machine without one
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from sm90_compile import compile_call, ptxas_usage  # noqa: E402


def compile_sm90a(d: int, block_m: int, block_n: int, causal: bool, overlap: int, ws: bool = False,
                  stages: int = 3, out8: bool = False) -> dict:
    """{"regs", "spill", "smem", "wgmma", "serialized", "setmaxnreg", "wait_one_pending", "ptx"} of one config, from CPU
    tensors (``ws``: the warp-specialised kernel, 128-row tiles; block_m and overlap unused)."""
    from kernels.flash_attn import fp8_gluon

    e4m3 = torch.float8_e4m3fn
    b, s, h = 1, 256, 2
    q, k = torch.empty(b, s, h, d, dtype=e4m3), torch.empty(b, s, h, d, dtype=e4m3)
    vt, out = torch.empty(b, h, d, s, dtype=e4m3), torch.empty(b, s, h, d, dtype=e4m3 if out8 else torch.bfloat16)
    lse, ds = torch.empty(b, h, s), torch.ones(b, h)
    call = dict(Q=q, K=k, VT=vt, Out=out, Lse=lse, QDescale=ds, KDescale=ds, VDescale=ds, stride_dsb=ds.stride(0),
                stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2), stride_kb=k.stride(0),
                stride_ks=k.stride(1), stride_kh=k.stride(2), stride_vb=vt.stride(0), stride_vh=vt.stride(1),
                stride_vd=vt.stride(2), stride_ob=out.stride(0), stride_os=out.stride(1), stride_oh=out.stride(2),
                stride_lb=lse.stride(0), stride_lh=lse.stride(1), seqlen_q=s, seqlen_k=s, num_heads=h, group=1,
                sm_scale=0.125, HEAD_DIM=d, BLOCK_N=block_n, IS_CAUSAL=causal, NUM_STAGES=stages)
    if ws:
        out_layout = fp8_gluon.gl.float8e4nv if out8 else fp8_gluon.gl.bfloat16
        call.update(CONSUMER_REGS=240, **fp8_gluon._layouts(64, block_n, d, out_layout), num_warps=4, OUT_FP8=out8)
        fn = fp8_gluon._fp8_fwd_ws_kernel
    else:
        call.update(BLOCK_M=block_m, OVERLAP=overlap, **fp8_gluon._layouts(block_m, block_n, d),
                    num_warps=block_m // 16)
        fn = fp8_gluon._fp8_fwd_kernel
    return _report(compile_call(fn, call), r"wgmma\.mma_async\S*e4m3\.e4m3")


def compile_ws16_sm90a(d: int, block_n: int, stages: int, causal: bool, fp16: bool = False,
                       persistent: bool | str = False, dv: int | None = None, consumers: int = 2,
                       regs: int | None = None, overlap: bool = True, window: bool = False,
                       host_desc: bool = False, softcap: bool = False, exp2_every: int = 0, lazy: int = 0) -> dict:
    """The same report for the 16-bit warp-specialised forward (``fwd_gluon_ws``: bf16, or fp16), 128-row tiles;
    ``persistent``: its persistent kernel (True, or a tile order of fp8_gluon.TILE_ORDERS); ``dv``: v's head dim
    where it is not q's (MLA's 192 / 128); ``consumers``: 3 for the 192-row tiles (three consumer warpgroups),
    ``regs`` their registers (None: fp8_gluon.WS16_CONSUMER_REGS), ``overlap`` False: no in-block overlap;
    ``window``: a sliding window on the left (causal, not persistent; the kernel's ``WINDOW``); ``host_desc``: its
    descriptors made on the host (not persistent; the kernel's ``HOST_DESC``); ``softcap``: the scores capped at 50
    (the kernel's ``SOFTCAP``); ``exp2_every``: one of that many exponentials by a cubic (its ``EXP2_EVERY``);
    ``lazy``: the lazy rescale's bound (its ``LAZY``; 0: off)."""
    from kernels.flash_attn import fp8_gluon

    dtype = torch.float16 if fp16 else torch.bfloat16
    b, s, h = 1, 256, 2
    dv = d if dv is None else dv
    q, k = (torch.empty(b, s, h, d, dtype=dtype) for _ in range(2))
    v, out = (torch.empty(b, s, h, dv, dtype=dtype) for _ in range(2))
    lse = torch.empty(b, h, s)
    args = (q, k, v, out, lse, 0.125, causal, block_n, stages, regs)
    if persistent:
        order = persistent if isinstance(persistent, str) else "query"
        fn, call = fp8_gluon._fwd_ws_persistent_kernel, fp8_gluon.ws16_persistent_arguments(
            *args, order, 50.0 if softcap else 0.0, exp2_every, lazy)
    else:
        fn, call = fp8_gluon._fwd_ws_kernel, fp8_gluon.ws16_arguments(*args, consumers, overlap, 100 if window else -1,
                                                                      host_desc, 50.0 if softcap else 0.0, exp2_every,
                                                                      lazy)
    return _report(compile_call(fn, call), r"wgmma\.mma_async\S*\.f16\.f16|wgmma\.mma_async\S*\.bf16\.bf16")


def compile_bwd16_sm90a(d: int, block_m: int, stages: int, causal: bool, fp16: bool = False, group: int = 1,
                        dv: int | None = None, fused: bool = False, ordered: bool = False,
                        adder: bool = False, walk: int = 0, halves: bool | None = None,
                        mask_every_tile: bool = False, dq_unscaled: bool = False, ds_smem: bool = False,
                        turns: bool = True, timeline: bool = False, persistent: bool | str = False,
                        host_desc: bool = False, window: bool = False, softcap: bool = False,
                        split_sum: bool = False, lse_tma: bool = False, units_first: bool = False) -> dict:
    """The same report for the warp-specialised dK / dV kernel (kernels/flash_attn/bwd_gluon.py), 128 keys a
    program, ``block_m`` query rows a tile; ``dv``: v's head dim where it is not q / k's ``d`` (MLA 192 / 128);
    ``fused``: the fused backward's variant (dQ too, by TMA reduce); ``adder``: that one with its adds in an adder
    warp; ``ordered``: its deterministic variant; ``halves``, ``mask_every_tile``, ``dq_unscaled``, ``ds_smem``,
    ``turns``: bwd_gluon.dkdv_arguments'; ``timeline``: its ``times`` (the probes' timeline stamps); ``persistent``: one
    program an SM over the tiles (its ``persistent``); ``host_desc``: its descriptors made on the host; ``window``: a
    causal call's sliding window on the left (its ``window_left``); ``softcap``: scores capped at 50 (its
    ``softcap``; not the fused variants); ``split_sum``: a group split of 2 summed in the kernel (its ``split_sum``;
    fp32 partials; not the fused variants); ``lse_tma``: lse and delta by the loader's TMA (its ``lse_tma``);
    ``units_first``: the grid's units before its key blocks (its ``units_first``; one program a tile, unordered)."""
    from kernels.flash_attn import bwd_gluon

    dtype = torch.float16 if fp16 else torch.bfloat16
    b, s, hk = 1, 256, 2
    d_v = dv or d
    q = torch.empty(b, s, hk * group, d, dtype=dtype)
    do = torch.empty(b, s, hk * group, d_v, dtype=dtype)
    k, dk = (torch.empty(b, s, hk, d, dtype=dtype) for _ in range(2))
    v, dv = (torch.empty(b, s, hk, d_v, dtype=dtype) for _ in range(2))
    lse, delta = (torch.empty(b, hk * group, s) for _ in range(2))
    dq_acc = torch.empty(q.shape) if fused or ordered or adder else None
    sem = bwd_gluon.order_counters(q, block_m) if ordered else None
    split, sums = 1, None
    if split_sum:  # (the partials fp32, [2, *k.shape]; the gradients k's / v's)
        split, sums = 2, (torch.zeros(bwd_gluon.split_counter_count(k), dtype=torch.int32), dk, dv)
        dk, dv = torch.empty(2, *k.shape), torch.empty(2, *v.shape)
    call = bwd_gluon.dkdv_arguments(q, k, v, do, lse, delta, dk, dv, 0.125, causal, block_m, stages, split=split,
                                    split_sum=sums, dq_acc=dq_acc,
                                    dq_order=sem, dq_adder=adder, walk=walk, halves=halves,
                                    mask_every_tile=mask_every_tile, dq_unscaled=dq_unscaled, ds_smem=ds_smem,
                                    turns=turns, times=bwd_gluon.timeline_buffer(k) if timeline else None,
                                    persistent=persistent, host_desc=host_desc, window_left=100 if window else -1,
                                    softcap=50.0 if softcap else 0.0, lse_tma=lse_tma, units_first=units_first)
    return _report(compile_call(bwd_gluon._bwd_dkdv_ws_kernel, call),
                   r"wgmma\.mma_async\S*\.f16\.f16|wgmma\.mma_async\S*\.bf16\.bf16")


def compile_bwdq16_sm90a(d: int, block_n: int, stages: int, causal: bool, fp16: bool = False,
                         dv: int | None = None, persistent: bool | str = False, host_desc: bool = False,
                         window: bool = False, softcap: bool = False, units_first: bool = False) -> dict:
    """The same report for the warp-specialised dQ kernel (kernels/flash_attn/bwd_gluon.py), 128 query rows a
    program, ``block_n`` keys a block; ``dv`` as :func:`compile_bwd16_sm90a`'s; ``persistent``: one program an SM
    over the tiles (its ``persistent``); ``host_desc``: its descriptors made on the host; ``window``: as
    :func:`compile_bwd16_sm90a`'s; ``softcap``: scores capped at 50 (its ``softcap``); ``units_first``: the grid's
    units first, its query blocks last first (its ``units_first``)."""
    from kernels.flash_attn import bwd_gluon

    dtype = torch.float16 if fp16 else torch.bfloat16
    b, s, h = 1, 256, 2
    q, k, dq = (torch.empty(b, s, h, d, dtype=dtype) for _ in range(3))
    v, do, out = (torch.empty(b, s, h, dv or d, dtype=dtype) for _ in range(3))
    lse, delta = (torch.empty(b, h, s) for _ in range(2))
    call = bwd_gluon.dq_arguments(q, k, v, do, out, lse, delta, dq, 0.125, causal, block_n, stages,
                                  persistent=persistent, host_desc=host_desc, window_left=100 if window else -1,
                                  softcap=50.0 if softcap else 0.0, units_first=units_first)
    return _report(compile_call(bwd_gluon._bwd_dq_ws_kernel, call),
                   r"wgmma\.mma_async\S*\.f16\.f16|wgmma\.mma_async\S*\.bf16\.bf16")


def compile_bwd256_sm90a(stages: int, causal: bool, fp16: bool = False, group: int = 2,
                         softcap: bool = False, lse_tma: bool = False, units_first: bool = False) -> dict:
    """The same report for hd 256's dK / dV kernel (kernels/flash_attn/bwd_gluon_hd256.py) over a GQA group of
    ``group`` query heads; ``softcap``: scores capped at 50; ``lse_tma``: lse and delta by the loader's TMA;
    ``units_first``: the grid's units first (its ``units_first``)."""
    from kernels.flash_attn import bwd_gluon_hd256

    dtype = torch.float16 if fp16 else torch.bfloat16
    b, s, hk = 1, 256, 2
    q, do = (torch.empty(b, s, hk * group, 256, dtype=dtype) for _ in range(2))
    k, v, dk, dv = (torch.empty(b, s, hk, 256, dtype=dtype) for _ in range(4))
    lse, delta = (torch.empty(b, hk * group, s) for _ in range(2))
    call = bwd_gluon_hd256.dkdv256_arguments(q, k, v, do, lse, delta, dk, dv, 0.0625, causal, num_stages=stages,
                                             softcap=50.0 if softcap else 0.0, lse_tma=lse_tma,
                                             units_first=units_first)
    return _report(compile_call(bwd_gluon_hd256._bwd_dkdv256_kernel, call),
                   r"wgmma\.mma_async\S*\.f16\.f16|wgmma\.mma_async\S*\.bf16\.bf16")


def _report(kernel, wgmma_pattern: str) -> dict:
    from kernels.flash_attn.fp8_gluon import EXP2_CUBIC

    ptx = kernel.asm["ptx"]
    use = ptxas_usage(ptx)
    return {"regs": use["regs"], "spill": use["spill_stores"], "smem": kernel.metadata.shared,
            "wgmma": len(re.findall(wgmma_pattern, ptx)), "serialized": "serialized" in use["log"],
            "setmaxnreg": [int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)],
            # waits that leave one wgmma group in flight (the ping-pong consumers retire S_{j+1} while P_j V_j runs)
            "wait_one_pending": len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)),
            # TMA reduce-adds (the fused backward's dQ partials)
            "tma_reduce": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\S*\.add", ptx)),
            # the MUFU work a softmax adds: exponentials, fast divisions and tanh (the 16-bit Gluon forward's softcap)
            "ex2": len(re.findall(r"ex2\.approx", ptx)), "fdiv": len(re.findall(r"div\.full\.f32", ptx)),
            "tanh": len(re.findall(r"tanh\.approx\.f32", ptx)),
            # the exponentials the forward's EXP2_EVERY moves to a cubic on the FMA pipe (one per element)
            "exp2_cubic": ptx.count(EXP2_CUBIC[0]),
            # float-to-integer and rounding conversions: the XU pipe's, as ex2 and tanh are (ncu, session 57)
            "xu_cvt": len(re.findall(r"cvt\.r[mnpz]i\.", ptx)),
            # gpu-scope acquire-release counts (the dK / dV kernel's in-kernel split sum) and L2-only loads
            "atom_acq_rel": len(re.findall(r"atom\.acq_rel\.gpu", ptx)), "ld_cg": len(re.findall(r"ld\.global\.cg", ptx)),
            # named barriers of a warpgroup (bar.sync ID, 128): the turns' hand-over, cross-warp reductions
            "bar_sync_128": len(re.findall(r"bar\.sync\s+\d+,\s*128;", ptx)),
            "ptx": ptx}


def _head_dims(spec: str) -> tuple[int, int | None, list[int]]:
    """A ``KIND:D[/DV],N,...`` spec's (q / k head dim, v head dim or None when the same, the other numbers)."""
    dims, *rest = spec.split(":", 1)[1].split(",")
    d, _, dv = dims.partition("/")
    return int(d), int(dv) if dv else None, [int(x) for x in rest]


def _dkdv_options(spec: str, options: list[str]) -> dict:
    """A dK / dV spec's @-options (h0 / h1, m1, u1, d1, t0, x1, p1 / p2, hd, w1, sc, s2, l1, g1) as
    compile_bwd16_sm90a's keywords."""
    known = {"h0": dict(halves=False), "h1": dict(halves=True), "m1": dict(mask_every_tile=True),
             "u1": dict(dq_unscaled=True), "d1": dict(ds_smem=True), "t0": dict(turns=False),
             "x1": dict(timeline=True), "p1": dict(persistent=True), "p2": dict(persistent="heavy"),
             "hd": dict(host_desc=True), "w1": dict(window=True), "sc": dict(softcap=True),
             "s2": dict(split_sum=True), "l1": dict(lse_tma=True), "g1": dict(units_first=True)}
    if any(o not in known for o in options):
        raise SystemExit(f"spec {spec}: options after @ are {', '.join(known)}")
    return {key: value for o in options for key, value in known[o].items()}


def _forward_options(spec: str, persistent: bool | str = False) -> tuple[str, bool, bool, bool, int, int]:
    """A forward spec without its @-options, whether it asked for a window (@w1: causal), for host-made
    descriptors (@hd), for softcapped scores (@sc), its exponentials' cubic share (@e2 / @e4: one in 2 / 4; else
    0) and its lazy rescale's bound (@lz: 8; else 0); the first two only for the not persistent kernel."""
    plain, *options = spec.split("@")
    cubic = [o for o in options if o in ("e2", "e4")]
    if any(o not in ("w1", "hd", "sc", "e2", "e4", "lz") for o in options) or len(cubic) > 1 or (
            persistent and set(options) - {"sc", "e2", "e4", "lz"}):
        raise SystemExit(f"spec {spec}: the forwards' options after @ are w1 (a window), hd (host-made descriptors), "
                         "sc (a softcap), one of e2 / e4 (a cubic for one exponential in 2 / 4) and lz (the lazy "
                         "rescale); the persistent kernel's sc, e2 / e4 and lz alone")
    if "w1" in options and not int(plain.split(",")[3]):
        raise SystemExit(f"spec {spec}: a window (@w1) needs CAUSAL 1")
    return (plain, "w1" in options, "hd" in options, "sc" in options, int(cubic[0][1:]) if cubic else 0,
            8 if "lz" in options else 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", metavar="HEAD_DIM,BLOCK_M,BLOCK_N,CAUSAL,OVERLAP")
    ap.add_argument("--json", action="store_true", help="one JSON object per spec (without the PTX)")
    ap.add_argument("--dump", default=None, help="write each PTX into this folder")
    a = ap.parse_args(argv)
    if not a.json:
        print("| hd | BLOCK_M x BLOCK_N | causal | overlap | regs | spill B | smem B | e4m3 wgmma | serialised |")
        print("|---|---|---|---|---|---|---|---|---|")
    for spec in a.specs:
        if spec.startswith("bwd256:"):
            plain, *options = spec.split("@")
            if any(o not in ("sc", "l1", "g1") for o in options):
                raise SystemExit(f"spec {spec}: hd 256's dK / dV kernel's options after @ are sc, l1 and g1")
            stages, causal, *more = (int(x) for x in plain.split(":", 1)[1].split(","))
            d, bm, bn, overlap = 256, 64, 64, 1
            r = compile_bwd256_sm90a(stages, bool(causal), bool(more and more[0]), more[1] if len(more) > 1 else 2,
                                     "sc" in options, "l1" in options, "g1" in options)
        elif spec.startswith("bwdq16:"):
            plain, *options = spec.split("@")
            orders = [o for o in options if o in ("p1", "p2")]
            if len(orders) > 1 or any(o not in ("p1", "p2", "hd", "w1", "sc", "g1") for o in options):
                raise SystemExit(f"spec {spec}: the dQ kernel's options after @ are one of p1 / p2, hd, w1, sc and g1")
            d, dv, rest = _head_dims(plain)
            bn, stages, causal, *fp16 = rest
            bm, overlap = 128, 1
            r = compile_bwdq16_sm90a(d, bn, stages, bool(causal), bool(fp16 and fp16[0]), dv=dv,
                                     persistent={"p1": True, "p2": "heavy"}.get(orders[0]) if orders else False,
                                     host_desc="hd" in options, window="w1" in options, softcap="sc" in options,
                                     units_first="g1" in options)
        elif spec.startswith(("bwdw16:", "bwd16:", "bwdf16:", "bwda16:", "bwdo16:")):
            plain, *options = spec.split("@")
            variant = _dkdv_options(spec, options)
            d, dv, rest = _head_dims(plain)
            bn, overlap = 128, 1
            if spec.startswith("bwdw16:"):
                bm, stages, causal, walk, *more = rest
                group, fused = (more + [4, 1])[:2] if len(more) < 2 else more[:2]
                r = compile_bwd16_sm90a(d, bm, stages, bool(causal), dv=dv, fused=bool(fused), walk=walk, group=group,
                                        **variant)
            else:
                bm, stages, causal, *fp16 = rest
                r = compile_bwd16_sm90a(d, bm, stages, bool(causal), bool(fp16 and fp16[0]), dv=dv,
                                        fused=spec.startswith("bwdf16:"), ordered=spec.startswith("bwdo16:"),
                                        adder=spec.startswith("bwda16:"), **variant)
        elif spec.startswith(("ws16w3:", "ws16w3n:", "ws16n:")):
            plain, window, host, cap, every, lazy = _forward_options(spec)
            d, dv, rest = _head_dims(plain)
            bn, stages, causal, *more = rest
            kind = spec.split(":")[0]
            consumers, overlap = (2 if kind == "ws16n" else 3), int(not kind.endswith("n"))
            bm = 64 * consumers
            r = compile_ws16_sm90a(d, bn, stages, bool(causal), bool(more and more[0]), False, dv, consumers,
                                   more[1] if len(more) > 1 else None, bool(overlap), window, host, cap, every, lazy)
        elif spec.startswith(("ws16:", "ws16p:", "ws16pk:", "ws16ps:")):
            persistent = {"ws16p": "query", "ws16pk": "kv", "ws16ps": "kv-snake"}.get(spec.split(":")[0], False)
            plain, window, host, cap, every, lazy = _forward_options(spec, persistent)
            d, dv, rest = _head_dims(plain)
            bn, stages, causal, *fp16 = rest
            bm, overlap = 128, 1
            r = compile_ws16_sm90a(d, bn, stages, bool(causal), bool(fp16 and fp16[0]), persistent, dv,
                                   window=window, host_desc=host, softcap=cap, exp2_every=every, lazy=lazy)
        elif spec.startswith("ws:"):
            d, bn, stages, causal, *out8 = (int(x) for x in spec[3:].split(","))
            bm, overlap = 128, 1
            r = compile_sm90a(d, 128, bn, bool(causal), 1, ws=True, stages=stages, out8=bool(out8 and out8[0]))
        else:
            d, bm, bn, causal, overlap = (int(x) for x in spec.split(","))
            r = compile_sm90a(d, bm, bn, bool(causal), overlap)
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            path = Path(a.dump, spec.replace(",", "_").replace("/", "v") + ".ptx")
            path.write_text(r["ptx"])
            r["ptx_file"] = str(path)  # (in the JSON: where this spec's PTX went)
        r.pop("ptx")
        if a.json:
            print(json.dumps(dict(r, spec=spec)), flush=True)
        else:
            print(f"| {d} | {bm} x {bn} | {bool(causal)} | {overlap} | {r['regs']} | {r['spill']} | {r['smem']} | "
                  f"{r['wgmma']} | {'yes' if r['serialized'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
