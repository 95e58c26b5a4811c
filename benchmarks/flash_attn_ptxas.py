"""Registers, spills and shared memory of the flash-attention kernels for sm_90a, without a GPU.

    python benchmarks/flash_attn_ptxas.py --shape 2,2048,32,192 --dv 128 [--dtype bf16] [--causal]
        [--top 3] [--kernels fwd dq dkdv] [--atomic] [--window L,R] [--softcap C] [--fp8]
        [--no-split] [--try 64,64,4,3,T ...] [--fp8-bwd e4m3|e5m2 [--fp8-grads]] [--loops]

Runs the launchers (``fwd.flash_attn_fwd``, ``bwd.flash_attn_bwd``) on CPU tensors of the shape
(batch, seqlen, heads, head dim) with the launch itself replaced by a recorder, so the kernel
arguments are exactly what a GPU launch passes. Each launch's autotune list is pruned as on an H100
(arch 90, TMA allowed where the strides let it), and its first ``--top`` configs are compiled for
sm_90a the way Triton's launcher would (the same binder: 16-byte divisible pointers and integers
carry their divisibility). ptxas (the one shipped with Triton) reports registers and spills; the
shared memory is Triton's; "wgmma" counts the Hopper MMA instructions in the PTX (0: the dots fell
back to mma.sync or FMA); "est" is the shared-memory filter's estimate plus its headroom (what
``configs._fits`` compares with the 227 KiB limit). ``--loops``: each loop's SASS instructions per
iteration and their most frequent opcodes (nvdisasm's disassembly; the forward's unmasked and masked
key loops, session 24's compile screen in docs/perf/flash_attn.md).
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
from config_arg import parse_config  # noqa: E402
from sm90_compile import compile_call, ptxas_usage, sass_loops  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def record_launches(b, s, h, hk, d, dv, dtype, causal, atomic, window=(-1, -1), softcap=0.0, fp8=False,
                    v_natural=False, fp8_bwd="", fp8_grads=False, key_order=False):
    """[(name, raw kernel, space, prune, kwargs)] of one forward and one backward call (``fp8``: the
    FP8 forward alone, e4m3 q / k / v with descales and V transposed as on sm90 (its keys in the MMA order,
    v_layout; ``key_order``: in key order, the kernel before session 24), bf16 out;
    ``v_natural``: V left as [B, S, Hk, Dv], the kernel's ``V_T`` off; ``fp8_bwd``: the FP8 backward
    alone, dO in that format, its gradients bf16 or, ``fp8_grads``, in dO's format)."""
    from kernels.flash_attn import bwd, configs, fwd

    seen = []

    def recorder(raw_kernel, tuned_kernel, space, prune, grid_of, kwargs, options=None):
        seen.append((raw_kernel.fn.__name__, raw_kernel, space, prune, dict(kwargs, ARCH=90)))

    class _NoLaunch:  # the atomic backward's delta pass is launched directly: not compiled here
        def __getitem__(self, grid):
            return lambda *a, **kw: None

    real, real_pre = configs.launch, bwd._bwd_preprocess
    configs.launch, bwd._bwd_preprocess = recorder, _NoLaunch()
    old_mode = os.environ.get("FLASH_ATTN_BWD")
    os.environ["FLASH_ATTN_BWD"] = "atomic" if atomic else "split"
    try:
        kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=window[0],
                  window_right=0 if causal else window[1], softcap=softcap)
        if fp8_bwd:  # as flash_attn_fp8_bwd_func calls it: Q, K, dO also as [B, H, D, S], positions padded to 16
            e4m3, fmt = torch.float8_e4m3fn, {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fp8_bwd]
            q, do = torch.empty(b, s, h, d, dtype=e4m3), torch.empty(b, s, h, dv, dtype=fmt)
            k, v = torch.empty(b, s, hk, d, dtype=e4m3), torch.empty(b, s, hk, dv, dtype=e4m3)
            seq = lambda t: torch.empty(*t.shape[:1], t.shape[2], t.shape[3], -(-s // 16) * 16, dtype=t.dtype)[..., :s]
            extra = dict(QT=seq(q), KT=seq(k), DOT=seq(do), **{n: torch.ones(b, hk) for n in bwd.FP8_TENSORS[3:]})
            out, lse = torch.empty(b, s, h, dv, dtype=torch.bfloat16), torch.empty(b, h, s)
            bwd.flash_attn_bwd(do, q, k, v, out, lse, **kw, fp8=extra, grad_dtype=fmt if fp8_grads else torch.bfloat16,
                               fp8_mma_order=configs.FP8_BWD_MMA_ORDER and not key_order)
            return seen
        if fp8:  # as flash_attn_fp8_func calls it on sm90: V as [B, Hk, Dv, Sk], keys padded to 16
            e4m3 = torch.float8_e4m3fn
            q, k = torch.empty(b, s, h, d, dtype=e4m3), torch.empty(b, s, hk, d, dtype=e4m3)
            if v_natural:
                vt = torch.empty(b, s, hk, dv, dtype=e4m3)
            else:
                vt = torch.empty(b, hk, dv, -(-s // 16) * 16, dtype=e4m3)[..., :s]
            descales = tuple(torch.ones(b, hk) for _ in range(3))
            fwd.flash_attn_fwd(q, k, vt, **kw, descales=descales, out_dtype=torch.bfloat16,
                               v_transposed=not v_natural, v_mma_order=not v_natural and not key_order,
                               max_num_imprecise_acc=None)
            return seen
        q, do = (torch.empty(b, s, h, n, dtype=dtype) for n in (d, dv))
        k, v = (torch.empty(b, s, hk, n, dtype=dtype) for n in (d, dv))
        out, lse = fwd.flash_attn_fwd(q, k, v, **kw)
        bwd.flash_attn_bwd(do, q, k, v, out, lse, **kw)
    finally:
        configs.launch, bwd._bwd_preprocess = real, real_pre
        if old_mode is None:
            os.environ.pop("FLASH_ATTN_BWD", None)
        else:
            os.environ["FLASH_ATTN_BWD"] = old_mode
    return seen


def compile_config(fn, kwargs, cfg, maxnreg=None) -> dict:
    """ptxas's report of one config; ``maxnreg``: a register cap (default: the config's own, as the launch)."""
    maxnreg = maxnreg or getattr(cfg, "maxnreg", None)
    cap = {"maxnreg": maxnreg} if maxnreg else {}
    k = compile_call(fn, dict(kwargs, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cap))
    ptx = k.asm["ptx"]
    use = ptxas_usage(ptx)
    return {"maxnreg": maxnreg, "regs": use["regs"], "spill": use["spill_stores"],
            "smem": k.metadata.shared, "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "ptx": ptx,
            "cubin": k.asm["cubin"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="2,2048,32,192", help="batch,seqlen,heads,head dim")
    ap.add_argument("--dv", type=int, default=None, help="value head dim (default: the head dim)")
    ap.add_argument("--heads-k", type=int, default=None)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--fp8", action="store_true", help="the FP8 forward (e4m3 inputs, bf16 out) instead of --dtype")
    ap.add_argument("--v-natural", action="store_true",
                    help="with --fp8: V as [B, S, Hk, Dv] (no K-major copy; the kernel's V_T off)")
    ap.add_argument("--fp8-bwd", choices=["e4m3", "e5m2"], default="",
                    help="the FP8 backward (e4m3 q / k / v, dO in this format) instead of --dtype")
    ap.add_argument("--fp8-grads", action="store_true", help="with --fp8-bwd: gradients in dO's format, not bf16")
    ap.add_argument("--key-order", action="store_true",
                    help="with --fp8: V's keys in key order (the kernel's V_MMA_ORDER off; before session 24)")
    ap.add_argument("--mma-order", action="store_true",
                    help="with --fp8-bwd: the copies of Q, K, dO in the MMA order (configs.FP8_BWD_MMA_ORDER on)")
    ap.add_argument("--loops", action="store_true",
                    help="each loop's SASS instructions per iteration and its most frequent opcodes (nvdisasm)")
    ap.add_argument("--maxnreg", type=int, default=0, help="a register cap for ptxas (configs.FWD_MAXNREG's)")
    ap.add_argument("--json", action="store_true",
                    help="one JSON line per compiled config instead of the table (its loops' opcode counts included)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--atomic", action="store_true", help="the atomic-dQ backward instead of the split one")
    ap.add_argument("--window", default="-1,-1", help="left,right (-1: unbounded)")
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=3, help="configs per kernel, in the autotune list's order")
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dq", "dkdv"])
    ap.add_argument("--dump", default=None, help="write each compiled PTX into this folder")
    ap.add_argument("--no-split", action="store_true",
                    help="pad the q / k head dim to a power of two (configs.HEAD_DIM_SPLIT off: the kernels before the split)")
    ap.add_argument("--try", dest="try_", nargs="+", default=None, metavar="BM,BN,WARPS,STAGES,T|P",
                    help="compile these configs (T: TMA, P: pointer loads) instead of the pruned list")
    a = ap.parse_args(argv)
    from kernels.flash_attn import configs

    if a.no_split:
        configs.HEAD_DIM_SPLIT = False
    if a.mma_order:
        configs.FP8_BWD_MMA_ORDER = True
    b, s, h, d = (int(x) for x in a.shape.split(","))
    dv = a.dv or d
    names = {"_fwd_kernel": "fwd", "_bwd_dq_kernel": "dq", "_bwd_dkdv_kernel": "dkdv"}
    form = f"e4m3, dO {a.fp8_bwd}{' FP8 grads' if a.fp8_grads else ''}" if a.fp8_bwd else 'e4m3' if a.fp8 else a.dtype
    if not a.json:
        print(f"B{b} S{s} H{h}/{a.heads_k or h} d{d} v{dv} {form} {'causal' if a.causal else 'full'} window "
              f"{a.window} softcap {a.softcap}{' atomic dQ' if a.atomic else ''}"
              f"{' padded (no split)' if a.no_split else ''}, sm_90a")
        print("| kernel | BLOCK_M x BLOCK_N | warps | stages | TMA | regs | spill B | smem B | est B | wgmma |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for name, fn, space, prune, kwargs in record_launches(b, s, h, a.heads_k or h, d, dv, DTYPES[a.dtype],
                                                          a.causal, a.atomic,
                                                          tuple(int(x) for x in a.window.split(",")), a.softcap,
                                                          a.fp8, a.v_natural, a.fp8_bwd, a.fp8_grads,
                                                          a.key_order):
        short = names.get(name, name)
        if short not in a.kernels:
            continue
        smem_fn = configs._smem_fwd if short == "fwd" else configs._smem_bwd
        if a.try_:
            cfgs = [configs._cfg(*parse_config(t)) for t in a.try_]
        else:
            cfgs = prune(space, {}, **kwargs)[:a.top]
        for cfg in cfgs:
            r = compile_config(fn, kwargs, cfg, a.maxnreg)
            est = configs.smem_estimate(cfg, smem_fn, kwargs) if hasattr(configs, "smem_estimate") else "-"
            kw = cfg.kwargs
            if a.json:
                print(json.dumps({"kernel": short, "config": [kw["BLOCK_M"], kw["BLOCK_N"], cfg.num_warps,
                                                              cfg.num_stages, bool(kw["USE_TMA"])],
                                  "maxnreg": r["maxnreg"],
                                  "regs": r["regs"], "spill": r["spill"], "smem": r["smem"], "wgmma": r["wgmma"],
                                  "loops": [dict(loop, ops=dict(loop["ops"])) for loop in sass_loops(r["cubin"])]}),
                      flush=True)
                continue
            print(f"| {short} | {kw['BLOCK_M']} x {kw['BLOCK_N']} | {cfg.num_warps} | {cfg.num_stages} | "
                  f"{'yes' if kw['USE_TMA'] else 'no'} | {r['regs']} | {r['spill']} | {r['smem']} | {est} | "
                  f"{r['wgmma']} |", flush=True)
            if a.loops:
                for loop in sass_loops(r["cubin"]):
                    mix = ", ".join(f"{op} {n}" for op, n in loop["ops"].most_common(12))
                    print(f"|   loop {loop['start']:#x}-{loop['end']:#x} | {loop['count']} SASS instructions: {mix} |")
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                tag = f"{short}-{kw['BLOCK_M']}x{kw['BLOCK_N']}-w{cfg.num_warps}-s{cfg.num_stages}-" \
                      f"{'tma' if kw['USE_TMA'] else 'ptr'}"
                Path(a.dump, tag + ".ptx").write_text(r["ptx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
