"""The warp-specialised Gluon dK / dV kernel (kernels/flash_attn/bwd_gluon.py) against the Triton backward's dK / dV
kernel (bwd.py ``_bwd_dkdv_kernel``, its launch replayed alone) and the whole Triton backward, H100.

    python benchmarks/gluon_bwd_probe.py [--head-dims 64,128] [--seqlens 1024,4096,16384] [--masks no,yes]
        [--configs 64,2 32,3] [--models] [--repeat 2] [--check-only]

1. Correctness first, on fresh random inputs (odd lengths, GQA / MQA, Sq != Sk causal, rows that see no key): dK
   and dV of every config against the FP64 oracle beside the Triton backward's error on the same inputs (dK / dV
   poisoned first); above 2x the Triton error plus a bf16 floor reads FAIL and the script exits 1 before timing.
2. Kernel time (CUDA events through the harness's timer: warm-up, L2 flushed, median), every kernel of a cell in
   one process, interleaved ``--repeat`` times: the FA sweep's shapes (16k tokens, hidden 2048) and with
   ``--models`` Llama-3-8B (GQA 32/8, 8k) and Llama-3-70B (64/8, 4k), causal. The Triton backward in its split
   mode (FLASH_ATTN_BWD=split: dK / dV without dQ's atomics, as this kernel) at its pinned first picks
   (FLASH_ATTN_AUTOTUNE=0) and without a group split; its dK / dV launch replayed alone with the same tensors; and
   the whole backward with its dK / dV on the Gluon kernel (FLASH_ATTN_BWD=gluon: configs.BWD_GLUON_DKDV_TRY).
   Rows ``| hd | causal | shape | kernel | config | ms | TFLOP/s (dK / dV's 4 matmuls) | / triton dkdv |``, then
   each cell's fastest repeat per config (``| summary | ... |``).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

#: (name, batch, seqlen, query heads, kv heads, head dim): real models' causal training calls
MODELS = (("Llama-3-8B", 1, 8192, 32, 8, 128), ("Llama-3-70B", 1, 4096, 64, 8, 128))
DEFAULT_CONFIGS = ("64,2", "32,3")


def _config(spec: str) -> dict:
    """BLOCK_M,STAGES -> dkdv_gluon's keywords."""
    parts = [int(x) for x in spec.split(",")]
    if len(parts) != 2:
        raise SystemExit(f"--configs {spec}: want BLOCK_M,STAGES")
    return dict(zip(("block_m", "num_stages"), parts))


def _inputs(b, sq, sk, hq, hk, d, seed, dtype=torch.bfloat16):
    """q, dO [B, Sq, Hq, D] and k, v [B, Sk, Hk, D], fresh normal values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, do = (torch.randn(b, sq, hq, d, generator=g).to("cuda", dtype) for _ in range(2))
    k, v = (torch.randn(b, sk, hk, d, generator=g).to("cuda", dtype) for _ in range(2))
    return q, k, v, do


def _mask(causal):
    return dict(causal=causal, window_left=-1, window_right=0 if causal else -1)


def _forward(q, k, v, do, causal):
    """The in-repo forward's out and lse, and delta = rowsum(dO * O) ([B, Hq, Sq] fp32, as the backward makes it)."""
    from kernels.flash_attn.fwd import flash_attn_fwd

    out, lse = flash_attn_fwd(q, k, v, softmax_scale=q.shape[-1] ** -0.5, **_mask(causal))
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    return out, lse, delta


def _whole(q, k, v, do, out, lse, causal, mode):
    """The whole backward as a callable, its launches left by a first call under FLASH_ATTN_BWD=``mode`` (read by
    a signature's first call only: the replays keep them), and its replay cache."""
    from kernels.flash_attn import bwd

    cache, before = {}, os.environ.get("FLASH_ATTN_BWD")
    whole = functools.partial(bwd.flash_attn_bwd, do, q, k, v, out, lse, softmax_scale=q.shape[-1] ** -0.5,
                              split=1, launches=cache, **_mask(causal))
    os.environ["FLASH_ATTN_BWD"] = mode
    try:
        whole()
    finally:
        os.environ["FLASH_ATTN_BWD"] = before or ""
    return whole, cache


def _triton_dkdv(q, k, v, do, out, lse, delta, causal):
    """(the whole Triton backward as a callable, its dK / dV launch alone as a callable): the backward runs once
    to leave its launches (split mode, no group split), the dK / dV one is then replayed with this call's
    tensors."""
    from kernels.flash_attn import bwd

    whole, cache = _whole(q, k, v, do, out, lse, causal, "split")
    launch = next(x for x in cache["plan"][3] if x.compiled.name == "_bwd_dkdv_kernel")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Lse": lse, "Delta": delta, "DK": dk, "DV": dv,
               "DQacc": bwd._unused_buffer(q.device), "CuSeqQ": None, "CuSeqK": None}
    return whole, functools.partial(launch, tensors)


def check(dims, specs) -> bool:
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.bwd_gluon import dkdv_gluon

    ok = True
    print("| check | hd | causal | B Sq Sk Hq/Hk | config | max err dK | max err dV | triton's dK / dV | |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    cases = [(2, 1000, 1000, 4, 2), (1, 300, 1000, 4, 4), (1, 1000, 300, 2, 1), (1, 64, 64, 2, 2)]
    for d in dims:
        for causal in (False, True):
            for b, sq, sk, hq, hk in cases:
                q, k, v, do = _inputs(b, sq, sk, hq, hk, d, seed=sq + sk + d)
                out, lse, delta = _forward(q, k, v, do, causal)
                ref = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal,
                                        softmax_scale=d ** -0.5)
                _, dk_t, dv_t = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=d ** -0.5, **_mask(causal))
                e_t = [(x.double() - r).abs().max().item() for x, r in ((dk_t, ref.dk), (dv_t, ref.dv))]
                floor = [2e-3 * r.abs().max().item() for r in (ref.dk, ref.dv)]
                for spec in specs:
                    dk, dv = dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=d ** -0.5, causal=causal, poison=True,
                                        **_config(spec))
                    e = [(x.double() - r).abs().max().item() for x, r in ((dk, ref.dk), (dv, ref.dv))]
                    good = all(x == x and x <= 2 * t + f for x, t, f in zip(e, e_t, floor))
                    ok &= good
                    print(f"| check | {d} | {causal} | {b} {sq} {sk} {hq}/{hk} | {spec} | {e[0]:.4g} | {e[1]:.4g} | "
                          f"{e_t[0]:.4g} / {e_t[1]:.4g} | {'ok' if good else 'FAIL'} |", flush=True)
    return ok


def _cells(dims, seqlens, masks, models):
    for d in dims:
        for s in seqlens:
            for causal in masks:
                yield f"sweep S{s}", max(1, 16384 // s), s, 2048 // d, 2048 // d, d, causal
    if models:
        for name, b, s, hq, hk, d in MODELS:
            if d in dims:
                yield f"{name} B{b} S{s}", b, s, hq, hk, d, True


def timing(dims, specs, seqlens, masks, repeat, models):
    from harness.perf.timing import time_callable
    from kernels.flash_attn.bwd_gluon import dkdv_gluon

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    print("| hd | causal | shape | kernel | config | ms | TFLOP/s | / triton dkdv |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    best = {}
    for label, b, s, hq, hk, d, causal in _cells(dims, seqlens, masks, models):
        q, k, v, do = _inputs(b, s, s, hq, hk, d, seed=0)
        out, lse, delta = _forward(q, k, v, do, causal)
        flops = 4 * 2 * b * hq * s * s * d // (2 if causal else 1)  # dK / dV's four matmuls
        whole, dkdv = _triton_dkdv(q, k, v, do, out, lse, delta, causal)
        with_gluon = _whole(q, k, v, do, out, lse, causal, "gluon")[0]  # configs.BWD_GLUON_DKDV_TRY's config
        calls = [("triton", "dkdv", dkdv), ("triton", "whole bwd", whole), ("gluon dkdv", "whole bwd", with_gluon)]
        for spec in specs:
            calls.append(("gluon", spec, functools.partial(dkdv_gluon, q, k, v, do, lse, delta,
                                                           softmax_scale=d ** -0.5, causal=causal, launches={},
                                                           **_config(spec))))
        cell = best.setdefault((d, "yes" if causal else "no", f"{label} H{hq}/{hk}"), {})
        for _ in range(repeat):
            ref = None
            for name, cfg, fn in calls:
                ms = timed(fn)
                ref = ref or ms
                cell[name, cfg] = min(ms, cell.get((name, cfg), ms))
                print(f"| {d} | {'yes' if causal else 'no'} | {label} H{hq}/{hk} | {name} | {cfg} | {ms:.4f} | "
                      f"{flops / ms / 1e9:.0f} | {ref / ms:.3f} |", flush=True)
        del q, k, v, do, out, lse, delta, calls
        torch.cuda.empty_cache()
    print("\n| summary | hd | causal | shape | config | best ms | / triton dkdv | / triton whole bwd |")
    print("|---|---|---|---|---|---|---|---|")
    for (d, causal, shape), cell in best.items():
        for (name, cfg), ms in cell.items():
            if name.startswith("gluon"):
                per_dkdv = "-" if cfg == "whole bwd" else f"{cell['triton', 'dkdv'] / ms:.3f}"  # (a whole backward)
                print(f"| summary | {d} | {causal} | {shape} | {name}: {cfg} | {ms:.4f} | {per_dkdv} | "
                      f"{cell['triton', 'whole bwd'] / ms:.3f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), metavar="BLOCK_M,STAGES")
    ap.add_argument("--models", action="store_true", help="also Llama-3-8B / 70B's causal calls (GQA)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args(argv)
    for spec in a.configs:
        _config(spec)
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("gluon_bwd_probe: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    os.environ["FLASH_ATTN_BWD"] = "split"  # dK / dV without the atomic dQ: the same work as this kernel
    dims = [int(x) for x in a.head_dims.split(",")]
    if not check(dims, a.configs):
        print("gluon_bwd_probe: the Gluon kernel failed the check; no timing", file=sys.stderr)
        return 1
    if not a.check_only:
        timing(dims, a.configs, [int(x) for x in a.seqlens.split(",")],
               [{"no": False, "yes": True}[m] for m in a.masks.split(",")], a.repeat, a.models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
