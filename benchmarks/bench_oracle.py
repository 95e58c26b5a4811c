"""Rate of the FP64 softmax oracle on a GPU, against a float64 matmul measured in the same run.

    python benchmarks/bench_oracle.py [--seqlens 512 ... 16384] [--hd 64 128]

FLOPs: 4 * B * H * Sq * Sk * D forward (halved for causal), forward+backward = 3.5x forward.
Times: the harness timer (harness/perf/timing.py: CUDA events, a warm-up call, the median).
"""

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: python3 benchmarks/...
from harness.oracle import softmax_attention
from harness.perf.timing import TimerOptions, time_callable
from harness.presets import FA_SWEEP_HIDDEN, FA_SWEEP_TOKENS


def cuda_time(fn, reps):
    """Median seconds of ``fn`` with the harness timer (CUDA events, warm-up; ``reps`` repetitions:
    the oracle's calls take seconds, so no settling windows)."""
    t = time_callable(fn, "cuda", options=TimerOptions(reps=reps, warmup_ms=0.0, settle_max_ms=0.0))
    return statistics.median(t.times_ms) / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--hd", type=int, nargs="+", default=[64, 128])
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    dev = "cuda"
    n = 8192
    x, y = (torch.randn(n, n, device=dev, dtype=torch.float64) for _ in range(2))
    t = cuda_time(lambda: x @ y, 5)
    mm = 2 * n**3 / t / 1e12
    print(f"float64 matmul {n}^3: {mm:.1f} TFLOP/s")
    rows = []
    for d in a.hd:
        for causal in (False, True):
            for s in a.seqlens:
                b, h = FA_SWEEP_TOKENS // s, FA_SWEEP_HIDDEN // d
                q, k, v, do = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                tf = cuda_time(functools.partial(softmax_attention, q, k, v, causal=causal), a.reps)
                tb = cuda_time(functools.partial(softmax_attention, q, k, v, do, causal=causal), a.reps)
                rows.append((d, causal, s, flops / tf / 1e12, 3.5 * flops / tb / 1e12, tb))
                del q, k, v, do
                torch.cuda.empty_cache()
    print("\n| hd | causal | seqlen | fwd TFLOP/s | fwd+bwd TFLOP/s | fwd+bwd / matmul | fwd+bwd s |")
    print("|---|---|---|---|---|---|---|")
    for d, c, s, f, fb, tb in rows:
        print(f"| {d} | {c} | {s} | {f:.1f} | {fb:.1f} | {fb / mm:.2f} | {tb:.3f} |")
    print(f"\nfloat64 matmul (same run): {mm:.1f} TFLOP/s on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
