"""Does the GPU's speed drift while a benchmark runs? One kernel timed again and again, each timing beside
nvidia-smi's reading of the SM clock, power draw, temperature and active throttle reasons (read-only queries).

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/clock_drift.py [--rounds 12] [--head-dim 128] [--seqlen 4096] [--causal]

The kernel: the in-repo FP8 forward on the FA sweep's shape (16k tokens, hidden 2048), V already keys-contiguous
(kernel alone), at its first listed config. Rows: `| round | ms | SM MHz | W | C | throttle reasons |`; a kernel
whose time moves with the clock is the machine, not the kernel (session 26: one kernel 0.43-0.57 ms in one call at a
steady clock).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("clock_drift: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness import fp8
    from harness.perf.bench import nvidia_smi_clocks
    from harness.perf.timing import time_callable
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    d, s = args.head_dim, args.seqlen
    h, b = (8 if d == 256 else 2048 // d), max(1, 16384 // s)
    g = torch.Generator(device="cpu").manual_seed(0)
    (q, qs), (k, ks), (v, vs) = (fp8.quantize(torch.randn(b, s, h, d, generator=g).to("cuda"), "e4m3", h)
                                 for _ in range(3))
    vt = v_keys_contiguous(v, mma_order=True)
    call = functools.partial(flash_attn_fwd, q, k, vt, descales=(qs, ks, vs), out_dtype=torch.bfloat16,
                             v_transposed=True, v_mma_order=True, softmax_scale=d ** -0.5, causal=args.causal,
                             window_left=-1, window_right=0 if args.causal else -1)
    call()
    torch.cuda.synchronize()
    index = torch.cuda.current_device()
    print(f"FP8 forward, kernel alone: B{b} S{s} H{h} D{d} {'causal' if args.causal else 'full'}, "
          f"{torch.cuda.get_device_name(index)}")
    print("| round | ms | SM MHz | W | C | throttle reasons |")
    print("|---|---|---|---|---|---|", flush=True)
    for r in range(args.rounds):
        before = nvidia_smi_clocks(index)
        ms = time_callable(call, "cuda").median_ms
        after = nvidia_smi_clocks(index)
        print(f"| {r} | {ms:.4f} | {before.get('sm_mhz', '-')} -> {after.get('sm_mhz', '-')} | "
              f"{after.get('power_w', '-')} | {after.get('temperature_c', '-')} | "
              f"{before.get('clock_event_reasons', '-')} -> {after.get('clock_event_reasons', '-')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
