"""The FP8 backward's tiles, each forced, against the bf16 backward of the same shapes (GPU only).

    python benchmarks/fp8_bwd_configs.py [--head-dims 128] [--seqlens 4096] [--causal both] [--grad e4m3]
        [--dq 64,64,4,2,T ...] [--dkdv 64,128,8,2,T ...] [--routed [--routed-only]] [--orders keys,mma [--repeat N]]
        [--no-bf16]

FA-sweep shapes (16k tokens, hidden 2048). For each dQ tile with the first dK/dV tile, and each dK/dV tile
with the first dQ tile, ``flash_attn_fp8_bwd_func``
with its configs pinned (``configs.prune_bwd`` replaced by the tile as given, FLASH_ATTN_AUTOTUNE=0), timed from CUDA graphs (the
three sequence-contiguous copies included, as in a call), its gradients checked first against the eager
FP8 reference on the first sequence of the batch (relative error, real values, bf16 gradients: dS's
roundings differ where the sums' order does, a few percent at most). The bf16 backward's row:
the in-repo split backward autotuned (``flash_attn_bwd`` on bf16 tensors of the same shape). TFLOP/s with the
backward's 2.5x forward FLOPs, halved for causal. Default tiles: the bf16 lists' (what the autotuner picks
from today), plus larger dK/dV tiles that one-byte operands may afford.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import time_pinned_pairs  # noqa: E402
from fp8_causal_probe import graph_ms  # noqa: E402

DQ = ["64,64,4,2,T", "64,128,4,2,T", "128,64,8,2,T", "64,64,8,2,T"]
DKDV = ["64,128,8,2,T", "32,128,8,2,T", "64,64,8,2,T", "128,128,8,2,T", "64,128,8,3,T"]


def _inputs(b, s, h, d, grad):
    from harness import fp8

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g) for _ in range(3))
    q8, k8, v8 = (fp8.quantize(t, "e4m3", h) for t in (q, k, v))
    do8 = fp8.quantize(torch.randn(b, s, h, d, device="cuda", generator=g) * 2**-12, grad, h)
    return q8, k8, v8, do8


def _shape(d: int, s: int, causal: bool, a) -> None:
    """One shape's rows: the bf16 backward (autotuned), then each forced (dQ tile, dK/dV tile) pair."""
    from harness.adapters.eager import eager_fp8_attention_backward
    from kernels.flash_attn import configs, flash_attn_fp8_bwd_func, flash_attn_fp8_func, interface
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    h, b = 2048 // d, 16384 // s
    flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
    (q, qd), (k, kd), (v, vd), (do, dod) = _inputs(b, s, h, d, a.grad)
    out, lse = flash_attn_fp8_func(q, k, v, qd, kd, vd, causal=causal, return_lse=True)
    # the bf16 backward of the same shape (autotuned), the ratio's denominator
    bf16_ms = float("nan")
    if not a.no_bf16:
        os.environ["FLASH_ATTN_AUTOTUNE"] = "1"
        qb, kb, vb, dob = (t.float().to(torch.bfloat16) for t in (q, k, v, do))
        kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1)
        ob, lb = flash_attn_fwd(qb, kb, vb, **kw)
        bf16_ms = graph_ms(lambda: flash_attn_bwd(dob, qb, kb, vb, ob, lb, **kw))
        os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
        print(f"| {d} | {s} | {causal} | bf16 (autotuned) | | {bf16_ms:.3f} | {flops / bf16_ms / 1e9:.0f} | 1.00 | |",
              flush=True)
    # the FP8 reference on the first sequence: dS's amax (its descale), then the quantised pass
    top = 448.0 if a.grad == "e4m3" else 57344.0
    one = (q[:1], k[:1], v[:1], qd[:1], kd[:1], vd[:1], out[:1].float(), lse[:1], do[:1], dod[:1])
    amax = eager_fp8_attention_backward(*one, causal=causal, grad_fmt=a.grad)[3]
    ds = torch.full_like(qd, amax / top)
    ref = eager_fp8_attention_backward(*one, ds[:1], causal=causal, grad_fmt=a.grad)[:3]

    def call():
        return flash_attn_fp8_bwd_func(do, q, k, v, out, lse, qd, kd, vd, dod, ds, causal=causal,
                                       grad_dtype=torch.bfloat16)

    def row(dq_t, dkdv_t):
        interface._SIGNATURES.clear()  # the tiles as configs says now, not a replay of the last call's
        grads = call()
        errs = [float((g[:1].float() - r).norm() / r.norm()) for g, r in zip(grads, ref)]
        ms = graph_ms(call)
        print(f"| {d} | {s} | {causal} | {dq_t} | {dkdv_t} | {ms:.3f} | {flops / ms / 1e9:.0f} | "
              f"{bf16_ms / ms:.2f} | {' / '.join(f'{e:.1e}' for e in errs)} |", flush=True)

    if a.orders:  # the pinned first tiles with the copies in sequence order and in the MMA order, interleaved
        for _ in range(a.repeat):
            for order in a.orders.split(","):
                configs.FP8_BWD_MMA_ORDER = order == "mma"
                row("routed", f"untuned first, {order} order")
        configs.FP8_BWD_MMA_ORDER = False
        return
    if a.routed:  # the tiles the backward picks itself (configs.bwd_keep): its first, then autotuned
        for tune, label in (("0", "untuned first"), ("1", "autotuned")):
            os.environ["FLASH_ATTN_AUTOTUNE"] = tune
            row("routed", label)
        os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
        if a.routed_only:
            return
    # each kernel's tiles with the other's first one (the two kernels' times add up)
    pairs = [(t, a.dkdv[0]) for t in a.dq] + [(a.dq[0], t) for t in a.dkdv[1:]]
    time_pinned_pairs(configs, pairs, row, f"{d} | {s} | {causal}", 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="128")
    ap.add_argument("--seqlens", default="4096")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--grad", choices=["e4m3", "e5m2"], default="e4m3")
    ap.add_argument("--dq", nargs="+", default=DQ)
    ap.add_argument("--dkdv", nargs="+", default=DKDV)
    ap.add_argument("--routed", action="store_true",
                    help="first the backward on the tiles it picks itself (bwd_keep's first; then autotuned)")
    ap.add_argument("--routed-only", action="store_true", help="with --routed: no forced tiles")
    ap.add_argument("--orders", default="", help="comma list of keys, mma: only the backward on its first tiles with "
                    "the copies of Q, K, dO in sequence order / in the MMA order (configs.FP8_BWD_MMA_ORDER)")
    ap.add_argument("--repeat", type=int, default=1, help="with --orders: interleaved repeats")
    ap.add_argument("--no-bf16", action="store_true", help="no bf16 row (its autotuning takes a minute a shape)")
    a = ap.parse_args(argv)
    print("| hd | seqlen | causal | dQ tile | dK/dV tile | ms | TFLOP/s | x bf16 | rel err dq / dk / dv vs FP8 ref |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for d in (int(x) for x in a.head_dims.split(",")):
        for s in (int(x) for x in a.seqlens.split(",")):
            for causal in {"no": [False], "yes": [True], "both": [False, True]}[a.causal]:
                _shape(d, s, causal, a)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
