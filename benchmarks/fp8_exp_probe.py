"""FP8 forward at hd 64 (issue 19's must: >= 1.3x the bf16 forward at 4k): kernel variants timed alone,
interleaved, beside the bf16 forward's pinned pick, each checked against the eager FP8 reference first.

Variants: ``base`` (the pinned config), ``r128`` (ptxas capped at 128 registers: 147 -> 128 without spills
in the sm_90a compile, so 4 programs share an SM instead of 3), ``emu4`` / ``emu2`` (a quarter / half of
P's exponentials on the FMA units, configs.FP8_EXP_EMU), and their combinations.

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/fp8_exp_probe.py [--seqlens 4096,16384] [--repeat 3]
        [--variants base,r128,emu4,emu2,emu4+r128]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _set(configs, variant: str) -> None:
    parts = variant.split("+")
    configs.FP8_EXP_EMU = 4 if "emu4" in parts else 2 if "emu2" in parts else 0
    configs.MAXNREG_FORCE = 128 if "r128" in parts else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", default="base,r128,emu4,emu2,emu4+r128")
    args = ap.parse_args(argv)
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    from harness import fp8
    from harness.adapters.eager import eager_fp8_attention
    from harness.perf.timing import time_callable
    from kernels.flash_attn import configs
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    d, variants = args.head_dim, args.variants.split(",")
    heads = 2048 // d
    # correctness first: each variant against the eager FP8 reference and the FP64 oracle on a small case
    g = torch.Generator(device="cpu").manual_seed(1)
    x = [torch.randn(1, 512, 4, d, generator=g).to("cuda") for _ in range(3)]
    (q, qs), (k, ks), (v, vs) = (fp8.quantize(t, "e4m3", 4) for t in x)
    vt = v_keys_contiguous(v)
    qd, kd, vd = (fp8.dequantize(a, b).transpose(1, 2) for a, b in ((q, qs), (k, ks), (v, vs)))
    for causal in (False, True):
        s = qd @ kd.transpose(-1, -2) * d ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(512, 512, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
        exact = (torch.softmax(s, -1) @ vd).transpose(1, 2)
        ref, ref_lse = eager_fp8_attention(q, k, v, qs, ks, vs, causal=causal, out_dtype=torch.float32)
        ref_err = float((ref.double() - exact).norm() / exact.norm())
        for var in variants:
            _set(configs, var)
            out, lse = flash_attn_fwd(q, k, vt, softmax_scale=d ** -0.5, causal=causal, window_left=-1,
                                      window_right=0 if causal else -1, descales=(qs, ks, vs),
                                      out_dtype=torch.bfloat16, v_transposed=True, max_num_imprecise_acc=None)
            err = float((out.double() - exact).norm() / exact.norm())
            lse_err = float((lse.double() - ref_lse.double()).abs().max())
            print(f"check {var} causal={causal}: out error {err:.4g} ({err / ref_err:.2f}x the reference's), "
                  f"max |lse - reference lse| {lse_err:.3g}", flush=True)
    print("\n| variant | causal | seqlen | ms | TFLOP/s | FP8 / bf16 |")
    print("|---|---|---|---|---|---|", flush=True)
    for s in (int(t) for t in args.seqlens.split(",")):
        b = max(1, 16384 // s)
        x = [torch.randn(b, s, heads, d, generator=g).to("cuda") for _ in range(3)]
        (q, qs), (k, ks), (v, vs) = (fp8.quantize(t, "e4m3", heads) for t in x)
        vt = v_keys_contiguous(v)
        qb, kb, vb = (t.to(torch.bfloat16) for t in x)
        for causal in [m == "yes" for m in args.masks.split(",")]:
            kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1)
            flops = 4 * b * heads * s * s * d // (2 if causal else 1)
            fp8_call = functools.partial(flash_attn_fwd, q, k, vt, descales=(qs, ks, vs), out_dtype=torch.bfloat16,
                                         v_transposed=True, max_num_imprecise_acc=None, **kw)
            bf16_call = functools.partial(flash_attn_fwd, qb, kb, vb, **kw)
            for _ in range(args.repeat):
                _set(configs, "base")
                bf16_call()
                bf16 = time_callable(bf16_call, "cuda").median_ms
                print(f"| bf16 | {causal} | {s} | {bf16:.4f} | {flops / bf16 / 1e9:.0f} | |", flush=True)
                for var in variants:
                    _set(configs, var)
                    fp8_call()
                    ms = time_callable(fp8_call, "cuda").median_ms
                    print(f"| {var} | {causal} | {s} | {ms:.4f} | {flops / ms / 1e9:.0f} | {bf16 / ms:.3f} |",
                          flush=True)
        del x, q, k, v, vt, qb, kb, vb
        torch.cuda.empty_cache()
    _set(configs, "base")
    return 0


if __name__ == "__main__":
    sys.exit(main())
