"""Registers, spills, shared memory and wgmma of the wide-head-dim kernels for sm_90a, without a GPU.

    python benchmarks/wide_ptxas.py [--cases all|576|1088|2112] [--dtype bf16] [--causal] [--override JSON]

Runs ``kernels.flash_attn.wide.wide_fwd`` / ``wide_bwd`` on meta tensors of the attention-layers
preset's absorbed-MLA shapes (B2 S2048 H32/1 576/512, B1 S4096 H64/1 1088/1024, B1 S2048 H128/1
2112/2048), intercepts each kernel launch (its first chunk; "programs" is that launch's grid), and compiles that launch for an H100
target the way Triton's launcher would specialise it: ints equal to 1 become constants, ints
divisible by 16 and every pointer carry the 16-byte divisibility (torch allocations are aligned).
Without those hints the loads cannot be vectorised or made asynchronous and the numbers are those of
another program (see benchmarks/ptxas_report.py). Then Triton's bundled ptxas -v reports registers
and spills; "async" counts the pipelined loads in the TTGIR, "wgmma" the Hopper MMAs in the PTX.
--override replaces tiles, e.g. '{"pv": {"BLOCK_W": 128}}' (keys as in wide.wide_configs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from sm90_compile import TARGET, ptxas_usage  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.flash_attn import wide  # noqa: E402

PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
CASES = {"576": (2, 2048, 32, 1, 576, 512), "1088": (1, 4096, 64, 1, 1088, 1024), "2112": (1, 2048, 128, 1, 2112, 2048)}
KERNELS = {"_fwd_scores_kernel": "scores", "_bwd_delta_kernel": "delta", "_bwd_ds_kernel": "ds",
           "_keys_gemm_kernel": "dkdv"}


def _name(fn, kwargs) -> str:
    n = KERNELS.get(fn.__name__)
    if n is None:  # the rows GEMM serves the forward's P V and the backward's dQ
        n = "pv" if kwargs.get("RESCALE") else "dq"
    return n


class _Capture:
    """Stands in for a JITFunction: records the first launch of each kernel."""

    def __init__(self, fn, seen):
        self.fn, self.seen = fn, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            name = _name(self.fn.fn, kwargs)
            if name not in self.seen:
                self.seen[name] = (self.fn, grid, args, kwargs)
        return launch


def capture(case: str, dtype: torch.dtype, causal: bool, override: dict) -> dict:
    b, s, hq, hk, d, dv = CASES[case]
    seen: dict = {}
    real = {n: getattr(wide, n) for n in ("_fwd_scores_kernel", "_rows_gemm_kernel", "_bwd_delta_kernel",
                                          "_bwd_ds_kernel", "_keys_gemm_kernel")}
    real_cfg = wide.wide_configs
    try:
        for n, fn in real.items():
            setattr(wide, n, _Capture(fn, seen))
        wide.wide_configs = lambda dt, arch, *dims: {k: {**v, **override.get(k, {})} for k, v in real_cfg(dt, 90, *dims).items()}
        mk = lambda *shape: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
        q, k, v = mk(b, s, hq, d), mk(b, s, hk, d), mk(b, s, hk, dv)
        out, lse = wide.wide_fwd(q, k, v, softmax_scale=d ** -0.5, causal=causal)
        wide.wide_bwd(mk(b, s, hq, dv), q, k, v, out, lse, softmax_scale=d ** -0.5, causal=causal, split=1)
    finally:
        for n, fn in real.items():
            setattr(wide, n, fn)
        wide.wide_configs = real_cfg
    return seen


def compile_launch(fn, args, kwargs) -> dict:
    names = fn.arg_names
    values = dict(zip(names, args))
    values.update({k: v for k, v in kwargs.items() if k in names})
    opts = {"num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 3)}
    sig, const, attrs = {}, {}, {}
    for i, n in enumerate(names):
        val = values[n]
        if fn.params[i].is_constexpr:
            sig[n], const[(i,)] = "constexpr", val
        elif isinstance(val, torch.Tensor):
            sig[n], attrs[(i,)] = PTR[val.dtype], [["tt.divisibility", 16]]
        elif isinstance(val, bool):
            sig[n] = "i1"
        elif isinstance(val, int):
            if val == 1:
                sig[n], const[(i,)] = "constexpr", 1
            else:
                sig[n] = "i32" if -2**31 <= val < 2**31 else "i64"
                if val % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(val, float):
            sig[n] = "fp32"
        else:
            raise TypeError(f"{n}: {type(val).__name__}")
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=TARGET, options=opts)
    use = ptxas_usage(k.asm["ptx"])
    ttgir = k.asm["ttgir"]
    return {"warps": opts["num_warps"], "stages": opts["num_stages"], "regs": use["regs"],
            "spill": f"{use['spill_stores']}/{use['spill_loads']}" if use["spill_stores"] >= 0 else "?",
            "smem": k.metadata.shared,
            "async": ttgir.count("async_copy_global_to_local") + ttgir.count("async_tma_copy_global_to_local"),
            "wgmma": k.asm["ptx"].count("wgmma.mma_async")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="all")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--override", default="{}")
    ap.add_argument("--kernels", default="", help="comma-separated subset (scores,pv,delta,ds,dq,dkdv)")
    a = ap.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    cases = list(CASES) if a.cases == "all" else a.cases.split(",")
    only = set(filter(None, a.kernels.split(",")))
    print("| case | kernel | tiles | programs | warps | stages | regs | spill st/ld (B) | smem (B) | async loads | wgmma |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        for name, (fn, grid, args, kwargs) in capture(case, dtype, a.causal, json.loads(a.override)).items():
            if only and name not in only:
                continue
            tiles = "x".join(f"{k[6:]}{v}" for k, v in kwargs.items() if k.startswith("BLOCK_"))
            r = compile_launch(fn, args, kwargs)
            programs = 1
            for g in grid:
                programs *= g
            print(f"| {case} | {name} | {tiles} | {programs} | {r['warps']} | {r['stages']} | {r['regs']} | {r['spill']} | "
                  f"{r['smem']} | {r['async']} | {r['wgmma']} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
