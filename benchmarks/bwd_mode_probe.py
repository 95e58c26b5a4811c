"""The flash-attention backward's two structures on the shapes users run (issue 16): split (a dQ
kernel + a dK/dV kernel, 7 matmuls, deterministic) against atomic dQ (one dK/dV kernel that also
adds dS K into an fp32 dQ, 5 matmuls, Triton's vector atomics); cuDNN's backward (torch SDPA) in the
same run as the yardstick. (Session 17's "atomic-tma" mode, the dQ as TMA reduce-adds, is commit
b612dd3's kernel: 0.75-0.82x the split backward, reverted; docs/perf/flash_attn.md, session 17.)

    python benchmarks/bwd_mode_probe.py [--shapes mha128,llama8b,...] [--modes split,atomic]
        [--repeat 2] [--no-cudnn]

Each mode autotunes as a user's call does (its own tuning key), runs through the launchers' replay
caches, and its gradients are compared with the split backward's before it is timed (the split one
is checked against the FP64 oracle by the GPU tests). Times: device time per call (CUDA events, L2
flushed, median), modes interleaved ``--repeat`` times. Prints a markdown table last.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

#: name -> (batch, seqlen, query heads, kv heads, head dim, value head dim, causal)
SHAPES = {
    "mha64": (2, 2048, 32, 32, 64, 64, False),        # attention-layers' MHA-refs B2 S2048 H32 D64
    "gqa64": (2, 2048, 32, 8, 64, 64, False),         # GQA 32/8 D64
    "mqa64": (2, 2048, 16, 1, 64, 64, False),         # MQA 16/1 D64 (group split)
    "mha128": (1, 4096, 32, 32, 128, 128, False),     # MHA B1 S4096 H32 D128
    "mqa128": (1, 2048, 40, 1, 128, 128, False),      # MQA 40/1 D128 (group split)
    "llama8b": (1, 8192, 32, 8, 128, 128, True),      # Llama-3-8B causal 8k
    "mla": (1, 4096, 64, 64, 192, 128, False),        # MLA training form 192 / 128
    "sweep64c": (4, 4096, 32, 32, 64, 64, True),      # FA sweep hd 64 causal 4k
    "sweep128c": (4, 4096, 16, 16, 128, 128, True),   # FA sweep hd 128 causal 4k
}
MODES = ("split", "atomic")  # FLASH_ATTN_BWD's values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-cudnn", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bwd_mode_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness.perf.timing import time_callable
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.fwd import flash_attn_fwd

    modes = [m for m in args.modes.split(",") if m]
    rows = []
    for name in [s for s in args.shapes.split(",") if s]:
        rows += _shape(name, modes, args.repeat, not args.no_cudnn, time_callable, flash_attn_fwd, flash_attn_bwd)
        torch.cuda.empty_cache()
    print("\n| shape | B, S, H/Hk, d/dv, causal | mode | ms (each repeat) | split / this | cuDNN / this |")
    print("|---|---|---|---|---|---|")
    for name, (b, s, h, hk, d, dv, causal), m, t, split, cudnn in rows:
        best = min(t)
        print(f"| {name} | B{b} S{s} H{h}/{hk} d{d}/{dv} {'causal' if causal else 'full'} | {m} | "
              f"{' / '.join(f'{x:.3f}' for x in t)} | {split / best if split else float('nan'):.2f} | "
              f"{cudnn / best if cudnn else float('nan'):.2f} |")
    return 0


def _shape(name, modes, repeat, cudnn, time_callable, flash_attn_fwd, flash_attn_bwd) -> list:
    """Check and time every mode (and cuDNN) on one shape: its table rows."""
    b, s, h, hk, d, dv, causal = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, s, hk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, s, hk, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    do = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16, generator=gen)
    kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=-1)
    out, lse = flash_attn_fwd(q, k, v, **kw)
    ref, calls = None, {}
    for m in modes:
        cache = {}

        def call(m=m, cache=cache):
            os.environ["FLASH_ATTN_BWD"] = m
            return flash_attn_bwd(do, q, k, v, out, lse, **kw, launches=cache)

        call()  # autotunes
        grads = call()  # a replay
        torch.cuda.synchronize()
        if ref is None:
            ref = grads
        err = max(((g.float() - r.float()).abs().max() / r.float().abs().max()).item() for g, r in zip(grads, ref))
        ok = err < 2e-2 and all(torch.isfinite(g).all().item() for g in grads)
        print(f"{name} {m}: max |grad - split| / max |split| = {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
        if ok:
            calls[m] = call
    if cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != hk)
            calls["cudnn"] = lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True)
            calls["cudnn"]()
        except Exception as e:  # noqa: BLE001 - a refusal is reported, the run goes on
            print(f"{name} cudnn: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
    times = {m: [] for m in calls}
    for _ in range(repeat):
        for m, fn in calls.items():
            times[m].append(time_callable(fn, "cuda", mode="bwd", flush=True).median_ms)
    best = {m: min(t) for m, t in times.items()}
    rows = []
    for m, t in times.items():
        rows.append((name, (b, s, h, hk, d, dv, causal), m, t, best.get("split"), best.get("cudnn")))
        print(f"{name} {m}: " + " ".join(f"{x:.3f}" for x in t) + " ms", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
