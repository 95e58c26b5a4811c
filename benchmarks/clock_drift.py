"""Does the GPU's speed drift while a benchmark runs? One kernel timed again and again, each timing beside
nvidia-smi's reading of the SM clock, power draw, temperature and active throttle reasons (read-only queries).

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/clock_drift.py [--rounds 12] [--head-dim 128] [--seqlen 4096] [--causal]

The kernel: the in-repo FP8 forward on the FA sweep's shape (16k tokens, hidden 2048), V already keys-contiguous
(kernel alone), at its first listed config. Rows: `| round | ms | SM MHz | W | C | throttle reasons |`; a kernel
whose time moves with the clock is the machine, not the kernel (session 26: repeats 10-40% apart in one call).
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def smi(index: int) -> list[str]:
    """nvidia-smi's current SM MHz, watts, degrees C and active clock-event (throttle) reasons as a hex mask."""
    out = ""
    for fields in (FIELDS, FIELDS.replace("clocks_event_reasons", "clocks_throttle_reasons")):  # older drivers
        try:
            done = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={fields}",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError) as e:
            return [f"nvidia-smi: {type(e).__name__}"] * 4
        out = done.stdout.strip()
        if done.returncode == 0 and out:
            break
    return [x.strip() for x in out.split(",")] if out else ["-"] * 4


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
        before = smi(index)
        ms = time_callable(call, "cuda").median_ms
        after = smi(index)
        print(f"| {r} | {ms:.4f} | {before[0]} -> {after[0]} | {after[1]} | {after[2]} | {before[3]} -> {after[3]} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
