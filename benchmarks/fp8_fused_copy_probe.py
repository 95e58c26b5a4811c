"""The FP8 forward's fused V copy (v_layout.fused_copy) against the launched copy, on one FA-sweep shape:
the compiled kernels' registers and shared memory, out bitwise against the launched copy's (pinned
config), the call's time for SLICES / LOOKAHEAD_ITEMS variants (CUDA events, median), the counters'
state after the runs.

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/fp8_fused_copy_probe.py [--shape 4,4096,32,64] [--causal]
        [--slices 8,1,16] [--lookahead 256,1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4,4096,32,64", help="batch,seqlen,heads,head dim")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--slices", default="8,1,16")
    ap.add_argument("--lookahead", default="256,1000000")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_fused_copy_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    from harness import fp8
    from harness.perf.timing import time_callable
    from kernels.flash_attn import fwd, v_layout

    b, s, h, d = (int(x) for x in a.shape.split(","))
    g = torch.Generator(device="cpu").manual_seed(0)
    (q, qs), (k, ks), (v, vs) = (fp8.quantize(torch.randn(b, s, h, d, generator=g).to("cuda"), "e4m3", h)
                                 for _ in range(3))
    kw = dict(softmax_scale=d ** -0.5, causal=a.causal, window_left=-1, window_right=0 if a.causal else -1,
              descales=(qs, ks, vs), out_dtype=torch.bfloat16, v_transposed=True)
    flops = 4 * b * h * s * s * d // (2 if a.causal else 1)
    copy_launch: dict = {}
    want = fwd.flash_attn_fwd(q, k, v_layout.v_keys_contiguous(v), **kw, launches=copy_launch)[0]
    c = copy_launch["fwd"].compiled
    print(f"copy kernel: {c.n_regs} registers, {c.metadata.shared} B shared", flush=True)

    def copied():
        return fwd.flash_attn_fwd(q, k, v_layout.v_keys_contiguous(v), **kw)

    def fused():
        return fwd.flash_attn_fwd(q, k, v_layout.keys_contiguous_buffer(v), **kw, v_natural=v)

    variants = [(int(sl), int(la)) for sl in a.slices.split(",") for la in a.lookahead.split(",")]
    sync = v_layout.sync_buffer(q.device, 1)
    print("| variant | ms | TFLOP/s | out == copy's | counters zero |")
    print("|---|---|---|---|---|", flush=True)
    for rep in range(a.repeat):
        ms = time_callable(copied, "cuda").median_ms
        print(f"| launched copy | {ms:.4f} | {flops / ms / 1e9:.0f} | - | - |", flush=True)
        for sl, la in variants:
            v_layout.SLICES, v_layout.LOOKAHEAD_ITEMS = sl, la
            vt = v_layout.keys_contiguous_buffer(v)
            vt.view(torch.uint8).fill_(0x7F)
            launch: dict = {}
            got = fwd.flash_attn_fwd(q, k, vt, **kw, v_natural=v, launches=launch)[0]
            torch.cuda.synchronize()
            if rep == 0:
                fc = launch["fwd"].compiled
                print(f"| fused SLICES {sl}: {fc.n_regs} registers, {fc.metadata.shared} B shared | | | | |", flush=True)
            same = torch.equal(got, want)
            ms = time_callable(fused, "cuda").median_ms
            print(f"| fused SLICES {sl} LOOKAHEAD_ITEMS {la} | {ms:.4f} | {flops / ms / 1e9:.0f} | {same} "
                  f"| {not sync.any().item()} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
