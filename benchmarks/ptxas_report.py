"""Registers, spill and shared memory of the linear-attention kernels for sm_90a, without a GPU.

Compiles the kernels with Triton for an H100 target on this (CPU) machine and runs the ptxas that
ships with Triton (-v), for every config of the autotune lists at the given head dims:

    python benchmarks/ptxas_report.py --dims 64 128 [--dtype fp16] [--bwd]

The pointer (and int) arguments carry the 16-byte divisibility a real launch gives them (torch
allocations are 16-aligned, Triton specialises on it). Without it nothing can prove the loads
aligned, cp.async cannot take them, the loop pipeliner leaves every load synchronous, and the
registers reported are those of another program: sessions 1-2's table in docs/perf/linear_attn.md
was made that way. The "async" column counts the pipelined loads (cp.async or TMA copies, 0 = none
pipelined). --tma compiles the kernels with their tiles through tensor descriptors (configs.FWD_TMA,
BWD_TMA).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
from sm90_compile import TARGET, ptxas_usage  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.linear_attn import chunk  # noqa: E402
from kernels.linear_attn import configs as cfg  # noqa: E402

ELT = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


def _compile(fn, sig: dict, const: dict, aligned: list[str], num_warps: int, num_stages: int) -> dict:
    sig = {**sig, **{c: "constexpr" for c in const}}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=sig, attrs=attrs,
                    constexprs={(fn.arg_names.index(k),): v for k, v in const.items()})
    k = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    use = ptxas_usage(k.asm["ptx"])
    return {"regs": use["regs"], "spill": use["spill_stores"],
            "smem": k.metadata.shared, "async": k.asm["ttgir"].count("async_copy_global_to_local")
            + k.asm["ttgir"].count("async_tma_copy_global_to_local")}


def fwd(D: int, BV: int, num_warps: int, num_stages: int, dtype: str = "fp16", gate: int = 2, BT: int = 64,
        tma: bool = False) -> dict:
    p = "*" + ELT[dtype]
    ptrs = ["q", "k", "v", "g", "g_gamma", "h0", "o", "ht", "x", "rdot"]
    sig = {n: p for n in ptrs}
    sig.update({n: "*fp32" for n in ("g", "g_gamma", "h0", "ht", "rdot")})
    sig.update({"scale": "fp32", "T": "i32", "TB": "i32", "s_h0k": "i32", "s_h0v": "i32"})
    const = {"H": 32, "KD": D, "VD": D, "BT": BT, "BV": BV, "GATE": gate, "USE_H0": False, "STORE_HT": False,
             "ROW_DOT": False, "PREC": "tf32", "NT_INTERP": 0, "DECAY_V": cfg.FWD_DECAY_V, "TMA": tma}
    return _compile(chunk._fwd_kernel, sig, const, ptrs + ["s_h0k"], num_warps, num_stages)


def bwd(D: int, num_warps: int, num_stages: int, dtype: str = "fp16", gate: int = 2, BT: int = 64,
        row_dot: bool = False, tma: bool = False) -> dict:
    p = "*" + ELT[dtype]
    ptrs = ["q", "k", "v", "g", "g_gamma", "h0", "do", "dht", "dq", "dk", "dv", "dh0", "rdot", "hT"]
    sig = {n: p for n in ptrs}
    sig.update({n: "*fp32" for n in ("g", "g_gamma", "h0", "dht", "dh0", "rdot", "hT")})
    sig.update({"scale": "fp32", "T": "i32", "TB": "i32", "NBH": "i32", "s_r": "i32"})
    const = {"H": 32, "K": D, "V": D, "BT": BT, **cfg.bwd_plan(D, D, BT), "GATE": gate, "USE_H0": False,
             "USE_DHT": False, "ROW_DOT": row_dot, "PREC": "tf32", "NT_INTERP": 0, "TMA": tma}
    return _compile(chunk._bwd_kernel, sig, const, ptrs + ["NBH"], num_warps, num_stages)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", choices=sorted(ELT), default="fp16")
    ap.add_argument("--bwd", action="store_true", help="also the backward's configs")
    ap.add_argument("--tma", action="store_true", help="tiles through tensor descriptors (configs.FWD_TMA, BWD_TMA)")
    a = ap.parse_args(argv)
    print("| kernel | D | BV | warps | stages | regs | spill B | smem KB | pipelined loads |")
    print("|---|---|---|---|---|---|---|---|---|")
    for D in a.dims:
        BT = cfg.internal_chunk(64, D, D)
        for c in cfg.fwd_configs():
            BV = c.kwargs["BV"]
            if BV > D:
                continue
            r = fwd(D, BV, c.num_warps, c.num_stages, a.dtype, BT=BT, tma=a.tma)
            print(f"| fwd | {D} | {BV} | {c.num_warps} | {c.num_stages} | {r['regs']} | {r['spill']} | "
                  f"{r['smem'] / 1024:.0f} | {r['async']} |", flush=True)
        if a.bwd:
            plan = cfg.bwd_plan(D, D, BT)
            for c in cfg.bwd_configs():
                r = bwd(D, c.num_warps, c.num_stages, a.dtype, BT=BT, tma=a.tma)
                name = f"bwd {'split' if plan['SPLIT'] else 'fused'}"
                print(f"| {name} | {D} | {plan['BV']} | {c.num_warps} | {c.num_stages} | {r['regs']} | "
                      f"{r['spill']} | {r['smem'] / 1024:.0f} | {r['async']} |", flush=True)


if __name__ == "__main__":
    main()
