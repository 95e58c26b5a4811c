"""What the FP8 forward's accumulator promotion costs and buys (issue 19): one run, every setting,
the bf16 forward beside it, same inputs.

    python benchmarks/fp8_promotion.py [--seqlens 4096,16384] [--head-dims 64,128,256] [--variants 0/0,none/0,none/none]

Hopper's FP8 tensor cores add products in a reduced-precision accumulator; Triton's
``max_num_imprecise_acc`` says after how many products the sum is promoted to fp32 (0: after every
MMA, which makes each MMA wait for the one before; ``none``: Triton's sm90 default, never). A variant
``QK/PV`` sets the two dots of ``kernels.flash_attn.flash_attn_fp8_func`` apart: Q K^T starts from
zero every key block (its imprecision is confined to one head-dim-deep dot), P V adds into the
running output over the whole sequence.

Per FA-sweep shape (16k tokens, hidden 2048; hd 256 with 8 heads), causal and not: each variant and
the in-repo bf16 forward (``flash_attn_func`` on the dequantised inputs in bf16), timed with the
harness timer (CUDA events, warm-up, median): ms, TFLOP/s, speed-up over bf16. Non-causal cells
also report accuracy on batch 0, two heads, against the FP64 oracle on the dequantised inputs: out
and lse relative RMS error, for each variant, the eager FP8 reference (the tolerance rule's
reference: fp32 accumulation, P in e4m3, 128-key blocks) and the bf16 kernel on bf16 inputs.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness import fp8  # noqa: E402
from harness.perf.timing import time_callable  # noqa: E402


def _median(t) -> float:
    xs = sorted(t.times_ms)
    return xs[len(xs) // 2]


def _variant(text: str):
    def one(x):
        return None if x.lower() == "none" else int(x)

    qk, pv = text.split("/")
    return one(qk), one(pv)


def _rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300))


def _accuracy(rows, calls, q64, k64, v64, heads):
    """rows[name] = (out rel-RMS, lse rel-RMS, lse max abs) on batch 0, the first ``heads`` heads."""
    from harness.oracle.softmax import softmax_attention

    ref = softmax_attention(q64, k64, v64)
    for name, call in calls.items():
        out, lse = call()
        out, lse = out[:1, :, :heads], lse[:1, :heads]
        rows[name] = (_rel_rms(out, ref.out), _rel_rms(lse, ref.lse), float((lse.double() - ref.lse).abs().max()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--variants", default="0/0,none/0,0/none,none/none", help="QK/PV settings, comma-separated")
    ap.add_argument("--accuracy-heads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen (the FA sweep's 16k)")
    args = ap.parse_args(argv)
    if torch.cuda.is_available():
        dev = torch.device("cuda")
    elif os.environ.get("TRITON_INTERPRET") == "1":  # a dry run of the script itself, at toy sizes
        dev = torch.device("cpu")
    else:
        print("fp8_promotion: needs a CUDA GPU (Hopper's FP8 tensor cores), or TRITON_INTERPRET=1 for a dry run",
              file=sys.stderr)
        return 2
    from kernels.flash_attn import flash_attn_fp8_func, flash_attn_func

    variants = [_variant(v) for v in args.variants.split(",")]
    label = {v: "/".join("none" if x is None else str(x) for x in v) for v in variants}
    rows, acc_rows = [], []
    for d in (int(x) for x in args.head_dims.split(",")):
        heads = 8 if d == 256 else 2048 // d
        for s in (int(x) for x in args.seqlens.split(",")):
            b = max(1, args.tokens // s)
            g = torch.Generator(device="cpu").manual_seed(0)
            x = [torch.randn(b, s, heads, d, generator=g).to(dev) for _ in range(3)]
            quant = [fp8.quantize(t, "e4m3", heads) for t in x]
            (q, qs), (k, ks), (v, vs) = quant
            deq = [fp8.dequantize(t, ds, dtype=torch.float32) for t, ds in quant]
            qb, kb, vb = (t.to(torch.bfloat16) for t in deq)
            for causal in (False, True):
                flops = 4 * b * heads * s * s * d / (2 if causal else 1)
                ms = {}
                calls = {label[vr]: functools.partial(flash_attn_fp8_func, q, k, v, qs, ks, vs, causal=causal,
                                                      max_num_imprecise_acc=vr, return_lse=True) for vr in variants}
                calls["bf16"] = functools.partial(flash_attn_func, qb, kb, vb, causal=causal, return_lse=True)
                for name, call in calls.items():
                    ms[name] = _median(time_callable(call, dev))
                rows.append((d, s, b, heads, causal, flops, ms))
                print(f"d{d} S{s} B{b} H{heads} {'causal' if causal else 'full'}: "
                      + ", ".join(f"{n} {t:.3f} ms" for n, t in ms.items()), flush=True)
                if not causal:
                    h = args.accuracy_heads
                    acc = {}
                    sub = [t[:1, :, :h].double() for t in deq]
                    calls["eager FP8 ref"] = functools.partial(
                        _eager, q[:1, :, :h], k[:1, :, :h], v[:1, :, :h], qs[:1, :h], ks[:1, :h], vs[:1, :h])
                    _accuracy(acc, calls, *sub, heads=h)
                    acc_rows.append((d, s, acc))
            del x, quant, deq, q, k, v, qb, kb, vb
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    names = [label[v] for v in variants]
    print("\n## Time (ms) and TFLOP/s; FP8 variants are QK/PV max_num_imprecise_acc (none: never promote)\n")
    print("| hd | seqlen | causal | bf16 ms | " + " | ".join(f"{n} ms (x bf16)" for n in names) + " |")
    print("|---" * (4 + len(names)) + "|")
    for d, s, _b, _h, causal, flops, ms in rows:
        cells = " | ".join(f"{ms[n]:.3f} ({ms['bf16'] / ms[n]:.2f}x, {flops / ms[n] / 1e9:.0f} TF)" for n in names)
        print(f"| {d} | {s} | {'yes' if causal else 'no'} | {ms['bf16']:.3f} ({flops / ms['bf16'] / 1e9:.0f} TF) "
              f"| {cells} |")
    print("\n## Accuracy against the FP64 oracle on the dequantised inputs (batch 0, "
          f"{args.accuracy_heads} heads, non-causal): out rel-RMS / lse rel-RMS / lse max abs\n")
    print("| hd | seqlen | " + " | ".join(names + ["eager FP8 ref", "bf16"]) + " |")
    print("|---" * (2 + len(names) + 2) + "|")
    for d, s, acc in acc_rows:
        print(f"| {d} | {s} | " + " | ".join(
            f"{acc[n][0]:.2e} / {acc[n][1]:.1e} / {acc[n][2]:.1e}" for n in names + ["eager FP8 ref", "bf16"]) + " |")
    return 0


def _eager(q, k, v, qs, ks, vs):
    from harness.adapters.eager import eager_fp8_attention

    return eager_fp8_attention(q, k, v, qs, ks, vs, block_n=128)


if __name__ == "__main__":
    sys.exit(main())
