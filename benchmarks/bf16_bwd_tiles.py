"""The bf16 backward's tiles at a head dim, each pair forced, against its own pick (GPU only; issue 16).

    python benchmarks/bf16_bwd_tiles.py [--head-dim 256] [--seqlen 4096] [--causal both]
        [--shape B,HQ,HK] [--softcap C] [--pairs 64,64,4,2,T/64,64,8,2,T ...]

FA-sweep shape (16k tokens, hidden 2048: H = 2048 / hd, 8 at hd 256) or ``--shape`` (GQA: query heads over kv
heads; the gradients' check takes kv head 0 and its whole query group). Rows: the backward on the tiles it
picks itself (``bwd_keep``'s first, FLASH_ATTN_AUTOTUNE=0; then autotuned over its list), then each ``DQ/DKDV`` pair forced past the
shared-memory filter; time from CUDA graphs (``flash_attn_bwd`` alone, on one forward), gradients compared
with the FP64 oracle on the first sequence and head (relative error, beside the pick's).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import time_pinned_pairs  # noqa: E402
from fp8_causal_probe import graph_ms  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--shape", default=None, metavar="B,HQ,HK",
                    help="batch, query heads, kv heads instead of the FA sweep's (Gemma-2-9B: 2,16,8)")
    ap.add_argument("--softcap", type=float, default=0.0)
    # hd 256's wgmma candidates from the sm_90a compile screen (session 22, flash_attn_ptxas.py --try): dQ 64x64 on
    # 8 warps, 2 stages (221-230 registers, no spill); dK/dV 64x64 on 8 warps, 2 stages (116-244 B of spills) and
    # 32x64 on 8 warps, 2 stages (8 B); the picked 32-row tiles run on mma.sync
    ap.add_argument("--pairs", nargs="+", default=["64,64,8,2,T/64,64,8,2,T", "64,64,8,2,T/32,64,8,2,T",
                                                   "64,64,4,2,T/64,64,8,2,T"])
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bf16_bwd_tiles: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    from harness.oracle import softmax_attention
    from kernels.flash_attn import configs
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    d, s = a.head_dim, a.seqlen
    h, b = 2048 // d if d < 256 else 8, max(1, 16384 // s)
    hk = h
    if a.shape:
        b, h, hk = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, s, hk, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    print("| hd | seqlen | causal | dQ tile | dK/dV tile | ms | TFLOP/s | rel err dq / dk / dv (FP64 oracle, b0, kv head 0 and its group) |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for causal in {"no": [False], "yes": [True], "both": [False, True]}[a.causal]:
        kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1,
                  softcap=a.softcap)
        flops = 4 * b * h * s * s * d * 2.5 / (2 if causal else 1)
        out, lse = flash_attn_fwd(q, k, v, **kw)
        # kv head 0's dK / dV sum over its whole query group (heads 0 .. h / hk - 1): the oracle takes them all
        group = h // hk
        one = [t[:1, :, :n].double() for t, n in ((q, group), (k, 1), (v, 1), (do, group))]
        orc = softmax_attention(*one, causal=causal, softcap=a.softcap)
        want = (orc.dq, orc.dk, orc.dv)
        call = functools.partial(flash_attn_bwd, do, q, k, v, out, lse, **kw)

        def row(dq_t, dkdv_t, call=call, causal=causal, flops=flops, want=want):
            grads = call()[:3]
            errs = [float((gr[:1, :, :w.shape[2]].double() - w).norm() / w.norm()) for gr, w in zip(grads, want)]
            ms = graph_ms(call)
            print(f"| {d} | {s} | {causal} | {dq_t} | {dkdv_t} | {ms:.3f} | {flops / ms / 1e9:.0f} | "
                  f"{' / '.join(f'{e:.1e}' for e in errs)} |", flush=True)

        row("picked", "untuned first")
        os.environ["FLASH_ATTN_AUTOTUNE"] = "1"
        row("picked", "autotuned")
        os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
        time_pinned_pairs(configs, [pair.split("/") for pair in a.pairs], row, f"{d} | {s} | {causal}", 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
