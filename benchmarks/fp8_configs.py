"""Every FP8 forward tile config, one at a time (issue 19): registers, spills, whether the dots became
Hopper wgmma instructions, and the time, beside the bf16 forward's pinned pick on the same shape.

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/fp8_configs.py [--head-dims 64,128,256] [--seqlen 4096]
        [--try 256,64,8,2,T ...] [--layouts k-major,stored] [--causal]

For each head dim (FA sweep: 16k tokens, hidden 2048; hd 256 with 8 heads) and each config of the
FP8 list (``kernels.flash_attn.configs.fwd_keep(d, 1, 90)``), the list is narrowed to that config
alone, ``flash_attn_fp8_func`` (never promoting: ``max_num_imprecise_acc=None``) runs with V copied
K-major (``v_transposed=True``, the sm90 default) and as stored (``False``), and the new compiled
kernel's ptxas numbers are printed with the median time (harness timer).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import parse_config as _config  # noqa: E402

from harness import fp8  # noqa: E402
from harness.perf.timing import time_callable  # noqa: E402


def _kernels(fn):
    from triton.runtime.autotuner import Autotuner

    if isinstance(fn, Autotuner):
        fn = fn.fn
    for caches in fn.device_caches.values():
        yield from caches[0].values()


def _as_tuple(config) -> tuple:
    """A triton.Config of the forward as (BLOCK_M, BLOCK_N, num_warps, num_stages, USE_TMA)."""
    kw = config.kwargs
    return kw["BLOCK_M"], kw["BLOCK_N"], config.num_warps, config.num_stages, bool(kw["USE_TMA"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--try", dest="extra", nargs="+", default=[], metavar="BM,BN,WARPS,STAGES,T|P",
                    help="configs off the list to measure too, after it (T: TMA loads, P: pointer loads)")
    ap.add_argument("--layouts", default="k-major,stored", help="V layouts: k-major (a K-major copy), stored")
    ap.add_argument("--causal", action="store_true", help="causal attention (half the FLOPs of the full square)")
    args = ap.parse_args(argv)
    try:
        extra = [_config(c) for c in args.extra]
    except ValueError as e:
        ap.error(f"--try: {e}")
    layouts = [{"k-major": True, "stored": False}[x] for x in args.layouts.split(",")]
    if not torch.cuda.is_available():
        print("fp8_configs: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    from kernels.flash_attn import configs, flash_attn_fp8_func, flash_attn_func, fwd, interface
    from kernels.flash_attn.v_layout import v_keys_contiguous

    real_keep, real_prune = configs.fwd_keep, configs.prune_fwd
    print("| hd | config (BM, BN, warps, stages, TMA) | V layout | registers | spill B | shared B | wgmma | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in (int(x) for x in args.head_dims.split(",")):
        heads = 8 if d == 256 else 2048 // d
        s = args.seqlen
        b = max(1, 16384 // s)
        flops = 4 * b * heads * s * s * d // (2 if args.causal else 1)
        g = torch.Generator(device="cpu").manual_seed(0)
        x = [torch.randn(b, s, heads, d, generator=g).to("cuda") for _ in range(3)]
        (q, qs), (k, ks), (v, vs) = (fp8.quantize(t, "e4m3", heads) for t in x)
        qb, kb, vb = (t.to(torch.bfloat16) for t in x)
        t = time_callable(functools.partial(flash_attn_func, qb, kb, vb, causal=args.causal), "cuda").median_ms
        print(f"| {d} | bf16 pinned pick {real_keep(d, 2, 90)[0]} | - | | | | | {t:.3f} | {flops / t / 1e9:.0f} |",
              flush=True)
        if True in layouts:  # what the K-major copy of V alone costs (part of every K-major row's time)
            t = time_callable(functools.partial(v_keys_contiguous, v), "cuda").median_ms
            print(f"| {d} | V copy alone (v_keys_contiguous) | K-major copy | | | | | {t:.3f} | |", flush=True)
        for cfg in list(dict.fromkeys(real_keep(d, 1, 90) + extra)):
            for vt in layouts:
                configs.fwd_keep = lambda *_a, _c=cfg: [_c]
                picked = []
                configs.prune_fwd = lambda *a, _p=picked, **kw: _p.append(real_prune(*a, **kw)) or _p[-1]
                before = {id(kern) for kern in _kernels(fwd._fwd_kernel)}
                call = functools.partial(flash_attn_fp8_func, q, k, v, qs, ks, vs, v_transposed=vt,
                                         max_num_imprecise_acc=None, causal=args.causal)
                # the config as configs says now: a call of the last one's signature would replay its launch
                interface._SIGNATURES.clear()
                try:
                    call()
                    torch.cuda.synchronize()
                    ran = _as_tuple(picked[-1][0]) if picked else None
                    if ran != cfg:  # the filter dropped it: the launch took the fallback, not this config
                        print(f"| {d} | {cfg} | {'K-major copy' if vt else 'as stored'} | not run: outside the "
                              f"autotune space or over the shared-memory filter (the fallback {ran} ran) |", flush=True)
                        continue
                    ms = time_callable(call, "cuda").median_ms
                except Exception as e:  # out of resources, a compile error: say so and go on
                    print(f"| {d} | {cfg} | {'K-major copy' if vt else 'as stored'} | {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:80]} |", flush=True)
                    continue
                finally:
                    configs.fwd_keep, configs.prune_fwd = real_keep, real_prune
                new = [kern for kern in _kernels(fwd._fwd_kernel) if id(kern) not in before]
                for kern in new[-1:]:
                    kern._init_handles()
                    wgmma = "wgmma" in kern.asm.get("ptx", "")
                    print(f"| {d} | {cfg} | {'K-major copy' if vt else 'as stored'} | {kern.n_regs} | {kern.n_spills} "
                          f"| {kern.metadata.shared} | {'yes' if wgmma else 'NO'} | {ms:.3f} | {flops / ms / 1e9:.0f} |",
                          flush=True)
        del x, q, k, v, qb, kb, vb
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
