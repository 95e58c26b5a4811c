"""The persistent FP8 forward (kernels/flash_attn/fp8_persistent.py, an experiment) against the tuned
Triton FP8 forward on the FA sweep's shapes, kernel alone (V already keys-contiguous), H100.

    python benchmarks/fp8_persistent_probe.py [--head-dims 64,128] [--seqlens 4096,16384] [--repeat 3]

Each variant is first compared with the tuned kernel's output (rel-RMS difference; both quantise P
to e4m3, so ~1e-2 is a rounding difference, not a bug), then timed with CUDA events
(triton.testing.do_bench: warm-up, median), the variants interleaved per repeat.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402


def _one_shape(d: int, s: int, causal: bool, variants: list[str], repeat: int, sms: int) -> None:
    from harness import fp8
    from kernels.flash_attn.fp8_persistent import fp8_fwd_persistent
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    heads, b = 2048 // d, 16384 // s
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(b, s, heads, d, device="cuda", generator=g) for _ in range(3)]
    (q, qd), (k, kd), (v, vd) = (fp8.quantize(x, "e4m3", heads) for x in xs)
    vt = v_keys_contiguous(v)
    ds = (qd, kd, vd)
    scale = d ** -0.5
    flops = 4 * b * heads * s * s * d * (0.5 if causal else 1.0)

    def tuned():
        return flash_attn_fwd(q, k, vt, softmax_scale=scale, causal=causal, window_left=-1,
                              window_right=0 if causal else -1, descales=ds, out_dtype=torch.bfloat16,
                              v_transposed=True, max_num_imprecise_acc=None)[0]

    def persistent(spec):
        bm, bn, w, st, per = map(int, spec.split(","))
        return lambda: fp8_fwd_persistent(q, k, vt, ds, softmax_scale=scale, causal=causal, block_m=bm,
                                          block_n=bn, num_warps=w, num_stages=st, programs=per * sms)[0]

    fns = {"tuned": tuned, **{f"persistent {spec}": persistent(spec) for spec in variants}}
    ref = tuned().float()
    diffs = {}
    for name, fn in fns.items():
        try:
            out = fn().float()
            diffs[name] = float((out - ref).norm() / ref.norm())
        except Exception as e:  # a variant that does not compile or launch: say so, go on
            diffs[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    times = {n: [] for n in fns if not isinstance(diffs[n], str)}
    for _ in range(repeat):
        for n in times:
            times[n].append(triton.testing.do_bench(fns[n], warmup=25, rep=100))
    base = min(times["tuned"])
    for n in fns:
        if isinstance(diffs[n], str):
            print(f"| {d} | {causal} | {s} | {n} | {diffs[n]} | | | |")
            continue
        t = times[n]
        print(f"| {d} | {causal} | {s} | {n} | {' / '.join(f'{x:.4f}' for x in t)} | "
              f"{flops / min(t) / 1e9:.0f} | {base / min(t):.3f} | {diffs[n]:.2e} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["64,128,4,3,3", "64,128,4,2,3", "64,128,4,3,2"],
                    help="BLOCK_M,BLOCK_N,WARPS,STAGES,PROGRAMS_PER_SM")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (an H100)")
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| hd | causal | seqlen | kernel | ms (repeats) | TFLOP/s | x tuned | diff vs tuned |")
    print("|---|---|---|---|---|---|---|---|")
    for d in map(int, a.head_dims.split(",")):
        for causal in [{"no": False, "yes": True}[m] for m in a.masks.split(",")]:
            for s in map(int, a.seqlens.split(",")):
                _one_shape(d, s, causal, a.variants, a.repeat, sms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
