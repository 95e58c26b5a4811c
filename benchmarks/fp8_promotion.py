"""What the FP8 forward's accumulator promotion costs (issue 19): one run, both settings, same inputs.

    python benchmarks/fp8_promotion.py [--seqlens 1024,4096,16384] [--head-dims 64,128,256]

``kernels.flash_attn.flash_attn_fp8_func`` promotes the tensor cores' reduced-precision FP8
accumulator to fp32 after every MMA (``max_num_imprecise_acc=0``, the FP8 contract's fp32
accumulation); ``None`` keeps Triton's sm90 default (never promotes: faster, lse ~1e-3 off at
d=128). Per FA-sweep shape (16k tokens, hidden 2048; hd 256 with 8 heads), causal and not, it
times both with the harness timer (CUDA events, warm-up, median) and prints ms, TFLOP/s and the
ratio, plus each setting's largest output difference from the promoted one.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness import fp8  # noqa: E402
from harness.perf.timing import time_callable  # noqa: E402


def _median(t) -> float:
    xs = sorted(t.times_ms)
    return xs[len(xs) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--head-dims", default="64,128,256")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_promotion: needs a CUDA GPU (Hopper's FP8 tensor cores)", file=sys.stderr)
        return 2
    from kernels.flash_attn import flash_attn_fp8_func

    dev = torch.device("cuda")
    rows = []
    for d in (int(x) for x in args.head_dims.split(",")):
        heads = 8 if d == 256 else 2048 // d
        for s in (int(x) for x in args.seqlens.split(",")):
            b = max(1, 16384 // s)
            g = torch.Generator(device="cpu").manual_seed(0)
            x = [torch.randn(b, s, heads, d, generator=g).to(dev) for _ in range(3)]
            (q, qs), (k, ks), (v, vs) = (fp8.quantize(t, "e4m3", heads) for t in x)
            for causal in (False, True):
                flops = 4 * b * heads * s * s * d / (2 if causal else 1)
                out, ms = {}, {}
                for acc in (0, None):
                    call = functools.partial(flash_attn_fp8_func, q, k, v, qs, ks, vs, causal=causal,
                                             max_num_imprecise_acc=acc)
                    out[acc] = call().float()
                    ms[acc] = _median(time_callable(call, dev))
                diff = (out[None] - out[0]).abs().max().item()
                rows.append((d, s, b, heads, causal, ms[0], ms[None], flops, diff))
                print(f"d{d} S{s} B{b} H{heads} {'causal' if causal else 'full'}: promoted {ms[0]:.3f} ms, "
                      f"Triton default {ms[None]:.3f} ms", flush=True)
    print("\n| hd | seqlen | causal | promoted ms | TFLOP/s | default ms | TFLOP/s | promoted / default time "
          "| max out diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d, s, _b, _h, causal, m0, m1, flops, diff in rows:
        print(f"| {d} | {s} | {'yes' if causal else 'no'} | {m0:.3f} | {flops / m0 / 1e9:.0f} | {m1:.3f} | "
              f"{flops / m1 / 1e9:.0f} | {m0 / m1:.2f} | {diff:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
