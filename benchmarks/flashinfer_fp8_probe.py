"""flashinfer's FP8 prefill on the box (issue 19: another FP8 attention with a usable wheel), first contact:
does it import, which scale convention its ``scale_q / scale_k / scale_v`` take, how far it is from the FP64
oracle beside the in-repo FP8 forward and the eager FP8 reference, and how fast (GPU only).

    python benchmarks/flashinfer_fp8_probe.py [--head-dims 64,128] [--seqlen 4096] [--causal both]

Install first (benchmarks/flashinfer_wheels.sh; device steps fi-1, fi-2, fi-4, then a step carrying .fi-3).
One sequence of the FA sweep's shape (hidden 2048: H = 2048 / hd), e4m3 q / k / v quantised per (kv head) by
harness.fp8, bf16 out. ``single_prefill_with_kv_cache`` takes one sequence ([S, H, D]) and per-head scales
([Hq] for q, [Hk] for k and v); it is called with the descales (real = FP8 value x scale) and, to learn the
convention, with their reciprocals: the row whose error matches the reference's is the convention. Rows:
``| hd | causal | what | out rel-RMS vs FP64 oracle | x eager FP8 ref | ms | TFLOP/s |``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--backend", default="fa3", help="flashinfer's backend argument (fa3 on sm90; auto, fa2)")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script (the in-repo kernel interpreted)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("flashinfer_fp8_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import flashinfer
    except Exception:  # noqa: BLE001 - what is missing is the finding
        print("import flashinfer failed:\n" + traceback.format_exc()[-2000:])
        return 1
    print(f"flashinfer {getattr(flashinfer, '__version__', '?')}", flush=True)
    from harness import fp8
    from harness.adapters.eager import eager_fp8_attention
    from harness.oracle import softmax_attention
    from harness.perf.timing import time_callable
    from kernels.flash_attn import flash_attn_fp8_func

    def rel(x, ref):
        return float((x.double() - ref).norm() / ref.norm())

    print("| hd | causal | what | out rel-RMS vs FP64 oracle | x eager FP8 ref | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|", flush=True)
    bad = 0
    for d in (int(x) for x in a.head_dims.split(",")):
        h, s = 2048 // d, a.seqlen
        g = torch.Generator(device="cpu").manual_seed(0)
        x = [torch.randn(1, s, h, d, generator=g).to(a.device) for _ in range(3)]
        (q, qd), (k, kd), (v, vd) = (fp8.quantize(t, "e4m3", h) for t in x)  # descales [1, H]
        deq = [fp8.dequantize(t, ds, dtype=torch.float64) for t, ds in ((q, qd), (k, kd), (v, vd))]
        for causal in {"no": [False], "yes": [True], "both": [False, True]}[a.causal]:
            flops = 4 * h * s * s * d // (2 if causal else 1)
            want = softmax_attention(*deq, causal=causal).out
            ref, _ = eager_fp8_attention(q, k, v, qd, kd, vd, causal=causal, out_dtype=torch.float32)
            ref_err = rel(ref, want)
            calls = [("in-repo FP8 (flash_attn_fp8_func)",
                      functools.partial(flash_attn_fp8_func, q, k, v, qd, kd, vd, causal=causal))]
            for label, scales in (("flashinfer, scales = descales", (qd[0], kd[0], vd[0])),
                                  ("flashinfer, scales = 1 / descales", (1 / qd[0], 1 / kd[0], 1 / vd[0]))):
                sq, sk, sv = (t.float().contiguous() for t in scales)

                fi = functools.partial(_flashinfer_call, flashinfer, q[0], k[0], v[0], sq, sk, sv, causal,
                                       d ** -0.5, a.backend)
                calls.append((label, fi))
            for label, fn in calls:
                try:
                    out = fn()
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a refusal or a failed JIT is the finding
                    bad += 1
                    print(f"| {d} | {causal} | {label} | failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120] if str(e) else ''} | | | |", flush=True)
                    continue
                err = rel(out, want)
                ms = time_callable(fn, a.device).median_ms
                print(f"| {d} | {causal} | {label} | {err:.3e} | {err / ref_err:.2f} | {ms:.4f} | "
                      f"{flops / ms / 1e9:.0f} |", flush=True)
        del x, q, k, v, deq
        if a.device == "cuda":
            torch.cuda.empty_cache()
    return 1 if bad else 0


def _flashinfer_call(flashinfer, q, k, v, sq, sk, sv, causal, scale, backend):
    """One sequence through ``single_prefill_with_kv_cache`` ([S, H, D]), bf16 out, as [1, S, H, D]."""
    out = flashinfer.single_prefill_with_kv_cache(q, k, v, scale_q=sq, scale_k=sk, scale_v=sv, o_dtype=torch.bfloat16,
                                                  causal=causal, sm_scale=scale, backend=backend)
    return out[None]


if __name__ == "__main__":
    sys.exit(main())
