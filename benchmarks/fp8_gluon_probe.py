"""The Gluon FP8 forwards (kernels/flash_attn/fp8_gluon.py) against the Triton one (fwd.py), H100.

    python benchmarks/fp8_gluon_probe.py [--check-only] [--head-dims 64,128,256] [--seqlens 4096,16384]
        [--masks no,yes] [--gluon 64,128,3[,1] ws:128,3 ...] [--repeat 3] [--quick-check]

1. Correctness first, on fresh random inputs (odd lengths, GQA, seqlen_q != seqlen_k causal): each
   kernel's out against the FP64 oracle on the dequantised inputs, the Gluon kernel's error beside the
   Triton kernel's on the same inputs (both quantise P to e4m3, so their errors should match); lse
   too. Outputs are poisoned (NaN) before each run. A Gluon row more than 1.5x the Triton error (plus
   1e-3) reads FAIL and the script exits 1 before timing.
2. Kernel time (V already keys-contiguous; the V copy is the same for both), FA sweep shapes (16k
   tokens, hidden 2048; hd 256 with 8 heads), CUDA events via the harness's timer, median; the Triton
   kernel at its first listed config (FLASH_ATTN_AUTOTUNE=0), the Gluon kernels at each ``--gluon``
   BLOCK_M,BLOCK_N,STAGES[,OVERLAP] (one warpgroup) or ws:BLOCK_N,STAGES[,REGS] (warp-specialised);
   interleaved ``--repeat`` times (single runs misled by 5-15% in session 16: use 3). Rows: `| hd | causal | seqlen | kernel |
   config | ms | TFLOP/s | / triton |`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

# each head dim's best measured config of both kernels (session 16, docs/perf/fp8-s16/)
GLUON_DEFAULT = {64: ["64,128,3,1", "ws:128,3"], 128: ["64,128,3,1", "ws:128,3"], 256: ["64,64,3,1", "ws:64,3"]}


def _inputs(b, sq, sk, hq, hk, d, seed):
    from harness import fp8

    g = torch.Generator(device="cpu").manual_seed(seed)
    xq = torch.randn(b, sq, hq, d, generator=g).to("cuda")
    xk, xv = (torch.randn(b, sk, hk, d, generator=g).to("cuda") for _ in range(2))
    return fp8.quantize(xq, "e4m3", hk), fp8.quantize(xk, "e4m3", hk), fp8.quantize(xv, "e4m3", hk)


def _spec(spec: str) -> dict:
    """BLOCK_M,BLOCK_N,STAGES[,OVERLAP] -> fp8_fwd_gluon's keywords; ws:BLOCK_N,STAGES[,REGS] -> the
    warp-specialised kernel's (with "ws": True)."""
    if spec.startswith("ws:"):
        parts = [int(x) for x in spec[3:].split(",")]
        return dict(zip(("block_n", "num_stages", "consumer_regs"), parts), ws=True)
    parts = [int(x) for x in spec.split(",")]
    kw = dict(zip(("block_m", "block_n", "num_stages", "overlap"), parts))
    if len(parts) not in (3, 4):
        raise SystemExit(f"--gluon {spec}: want BLOCK_M,BLOCK_N,STAGES[,OVERLAP]")
    return kw


def _gluon_call(q, k, vt, descales, scale, causal, spec, poison=False):
    """A no-argument call of the Gluon kernel ``spec`` names (see _spec)."""
    from kernels.flash_attn.fp8_gluon import fp8_fwd_gluon, fp8_fwd_gluon_ws

    kw = _spec(spec)
    fn = fp8_fwd_gluon_ws if kw.pop("ws", False) else fp8_fwd_gluon
    return functools.partial(fn, q, k, vt, descales, softmax_scale=scale, causal=causal, poison=poison, **kw)


def check(gluon_cfgs, quick=False) -> bool:
    from harness import fp8
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    ok = True
    print("| check | hd | causal | B Sq Sk Hq/Hk | kernel | config | max err out | max err lse | triton's |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    cases = [(2, 1000, 1000, 4, 2), (1, 300, 1000, 4, 4), (1, 1000, 300, 2, 1), (1, 64, 64, 2, 2)]
    if quick:  # GQA with a partial block, and rows that see no key
        cases = cases[::2]
    for d in sorted(gluon_cfgs):
        for causal in (False, True):
            for n, (b, sq, sk, hq, hk) in enumerate(cases):
                (q, qs), (k, ks), (v, vs) = _inputs(b, sq, sk, hq, hk, d, seed=100 + n)
                ref = softmax_attention(fp8.dequantize(q, qs), fp8.dequantize(k, ks), fp8.dequantize(v, vs),
                                        causal=causal, softmax_scale=d ** -0.5)
                vt = v_keys_contiguous(v)  # the Gluon kernel's V: keys in order; the Triton kernel's in the MMA order
                o_t, l_t = flash_attn_fwd(q, k, v_keys_contiguous(v, mma_order=True), softmax_scale=d ** -0.5,
                                          causal=causal, window_left=-1, window_right=0 if causal else -1,
                                          descales=(qs, ks, vs), out_dtype=torch.bfloat16, v_transposed=True,
                                          v_mma_order=True, max_num_imprecise_acc=None)
                seen = ref.lse > float("-inf")
                e_t = (o_t.double() - ref.out).abs().max().item()
                le_t = (l_t.double() - ref.lse)[seen].abs().max().item() if seen.any() else 0.0
                for spec in gluon_cfgs[d]:
                    try:
                        o_g, l_g = _gluon_call(q, k, vt, (qs, ks, vs), d ** -0.5, causal, spec, poison=True)()
                    except Exception as e:  # a config that does not compile or fit: say so and go on
                        print(f"| check | {d} | {causal} | {b} {sq} {sk} {hq}/{hk} | gluon | {spec} | "
                              f"{type(e).__name__}: {str(e).splitlines()[0][:60]} | | |", flush=True)
                        continue
                    torch.cuda.synchronize()
                    e_g = (o_g.double() - ref.out).abs().max().item()
                    empty_ok = bool((l_g[~seen] == float("-inf")).all()) and bool((o_g.double()[
                        ~seen.transpose(1, 2).unsqueeze(-1).expand_as(o_g)] == 0).all())
                    le_g = (l_g.double() - ref.lse)[seen].abs().max().item() if seen.any() else 0.0
                    good = (e_g == e_g and e_g <= 1.5 * e_t + 1e-3 and le_g <= 1.5 * le_t + 1e-3 and empty_ok)
                    ok &= good
                    print(f"| check | {d} | {causal} | {b} {sq} {sk} {hq}/{hk} | gluon | {spec} | {e_g:.4g} | "
                          f"{le_g:.3g} | {e_t:.4g} / {le_t:.3g} {'ok' if good else 'FAIL'} |", flush=True)
    return ok


def timing(gluon_cfgs, seqlens, masks, repeat):
    from harness.perf.timing import time_callable
    from kernels.flash_attn import configs
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    print("| hd | causal | seqlen | kernel | config | ms | TFLOP/s | / triton |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for d in sorted(gluon_cfgs):
        heads = 8 if d == 256 else 2048 // d
        for s in seqlens:
            b = max(1, 16384 // s)
            (q, qs), (k, ks), (v, vs) = _inputs(b, s, s, heads, heads, d, seed=0)
            vt = v_keys_contiguous(v)  # the Gluon kernel's V: keys in order; the Triton kernel's in the MMA order
            vt_mma = v_keys_contiguous(v, mma_order=True)
            for causal in masks:
                flops = 4 * b * heads * s * s * d // (2 if causal else 1)
                calls = [("triton", str(configs.fwd_keep(d, 1, 90, causal)[0]),
                          functools.partial(flash_attn_fwd, q, k, vt_mma, softmax_scale=d ** -0.5, causal=causal,
                                            window_left=-1, window_right=0 if causal else -1, descales=(qs, ks, vs),
                                            out_dtype=torch.bfloat16, v_transposed=True, v_mma_order=True,
                                            max_num_imprecise_acc=None))]
                for spec in gluon_cfgs[d]:
                    calls.append(("gluon", spec, _gluon_call(q, k, vt, (qs, ks, vs), d ** -0.5, causal, spec)))
                for _ in range(repeat):
                    base = None
                    for name, cfg, fn in calls:
                        try:
                            ms = timed(fn)
                        except Exception as e:
                            print(f"| {d} | {causal} | {s} | {name} | {cfg} | {type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:60]} | | |", flush=True)
                            continue
                        base = base or ms
                        print(f"| {d} | {'yes' if causal else 'no'} | {s} | {name} | {cfg} | {ms:.4f} | "
                              f"{flops / ms / 1e9:.0f} | {base / ms:.3f} |", flush=True)
            del q, k, v, vt
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--gluon", nargs="+", default=None, metavar="BLOCK_M,BLOCK_N,STAGES[,OVERLAP]",
                    help="Gluon configs for every head dim (default: each kernel's best per head dim; ws:BLOCK_N,"
                    "STAGES[,REGS] is the warp-specialised kernel); OVERLAP: the one-warpgroup kernel's "
                    "wgmma overlap bits (1: S_{j+1} during softmax j, 2: P_j V_j in flight into the next block)")
    ap.add_argument("--quick-check", action="store_true", help="two of the four check shapes")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_gluon_probe: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    dims = [int(x) for x in a.head_dims.split(",")]
    cfgs = {d: a.gluon or GLUON_DEFAULT[d] for d in dims}
    if not check(cfgs, a.quick_check):
        print("fp8_gluon_probe: the Gluon kernel failed the check; no timing", file=sys.stderr)
        return 1
    if not a.check_only:
        timing(cfgs, [int(x) for x in a.seqlens.split(",")], [{"no": False, "yes": True}[m] for m in
                                                              a.masks.split(",")], a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
