"""Time the wide-head-dim kernels (kernels/flash_attn/wide.py) on the attention-layers preset's absorbed
MLA shapes, beside torch's mem-efficient SDPA (the one other backend that runs these head dims).

    python benchmarks/bench_wide.py [--cases 576,1088,2112] [--causal] [--no-sdpa] [--workspace BYTES]
    python benchmarks/bench_wide.py --smoke      # CPU: tiny shapes under the Triton interpreter

Per case: median device ms of wide_fwd and of wide_bwd (from the forward's out and lse), their
TFLOP/s (forward 2 B Hq Sq Sk (d + d_v); backward 2 B Hq Sq Sk (3 d + 2 d_v), the five matmuls; causal
halves both), peak memory above the inputs, and the same for SDPA (EFFICIENT_ATTENTION; K and V
expanded to the query heads as views; its backward timed as forward + backward minus forward), and
the relative difference of the two outputs. Prediction to check: docs/perf/flash_attn.md, session 12.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {"576": (2, 2048, 32, 1, 576, 512), "1088": (1, 4096, 64, 1, 1088, 1024), "2112": (1, 2048, 128, 1, 2112, 2048)}
SMOKE = {"576": (1, 20, 4, 1, 576, 512), "288": (1, 33, 4, 2, 288, 256)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="576,1088,2112")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-sdpa", action="store_true")
    ap.add_argument("--workspace", type=int, default=None, help="workspace_bytes of the wide kernels")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    a = ap.parse_args(argv)
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from harness.perf.timing import TimerOptions

    dev = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else torch.bfloat16
    table = SMOKE if a.smoke else CASES
    opts = TimerOptions(warmup_ms=1, reps=3) if a.smoke else TimerOptions()
    print("| case | impl | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | peak MiB over inputs | out rel diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name in (table if a.smoke else a.cases.split(",")):
        run_case(name, table[name], a, dev, dtype, opts)
    return 0


def run_case(name, shape, a, dev, dtype, opts) -> None:
    import torch

    from harness.perf.timing import time_callable
    from kernels.flash_attn.wide import wide_bwd, wide_fwd

    b, s, hq, hk, d, dv = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda *dims: torch.randn(*dims, generator=g).to(dev, dtype)  # noqa: E731
    q, k, v, do = mk(b, s, hq, d), mk(b, s, hk, d), mk(b, s, hk, dv), mk(b, s, hq, dv)
    scale = d ** -0.5
    frac = 0.5 if a.causal else 1.0
    pairs = b * hq * s * s * frac
    f_fwd, f_bwd = 2 * pairs * (d + dv), 2 * pairs * (3 * d + 2 * dv)
    kw = dict(softmax_scale=scale, causal=a.causal, workspace_bytes=a.workspace)

    def peak(fn):
        if dev != "cuda":
            return float("nan")
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    out, lse = wide_fwd(q, k, v, **kw)
    t_f = time_callable(lambda: wide_fwd(q, k, v, **kw), dev, options=opts).median_ms
    t_b = time_callable(lambda: wide_bwd(do, q, k, v, out, lse, **kw), dev, mode="bwd", options=opts).median_ms
    mem = max(peak(lambda: wide_fwd(q, k, v, **kw)), peak(lambda: wide_bwd(do, q, k, v, out, lse, **kw)))
    row = f"| {name}/{dv} B{b} S{s} H{hq}/{hk}{' causal' if a.causal else ''}"
    print(f"{row} | wide | {t_f:.3f} | {f_fwd / t_f / 1e9:.0f} | {t_b:.3f} | {f_bwd / t_b / 1e9:.0f} | {mem:.0f} | |",
          flush=True)
    if a.no_sdpa or dev != "cuda":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2) for x in (q, k.expand(b, s, hq, d), v.expand(b, s, hq, dv)))
    qg, kg, vg = (x.detach().requires_grad_() for x in (qt, kt, vt))

    def sdpa(grad: bool):
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=a.causal, scale=scale)
            if grad:
                torch.autograd.grad(o, (qg, kg, vg), do.transpose(1, 2))
            return o

    try:
        ref = sdpa(False)
        t_sf = time_callable(lambda: sdpa(False), dev, options=opts).median_ms
        t_sb = time_callable(lambda: sdpa(True), dev, mode="bwd", options=opts).median_ms - t_sf
        mem_s = peak(lambda: sdpa(True))
        diff = ((ref.transpose(1, 2).float() - out.float()).norm() / ref.float().norm()).item()
        print(f"{row} | sdpa mem-efficient | {t_sf:.3f} | {f_fwd / t_sf / 1e9:.0f} | {t_sb:.3f} | "
              f"{f_bwd / t_sb / 1e9:.0f} | {mem_s:.0f} | {diff:.2e} |", flush=True)
    except RuntimeError as e:  # e.g. no kernel for this shape on this build
        print(f"{row} | sdpa mem-efficient | failed: {str(e).splitlines()[0][:120]} | | | | | |", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
