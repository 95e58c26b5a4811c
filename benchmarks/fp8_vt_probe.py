"""How the FP8 forward gets V^T (issue 19's 4k must): the call through ``flash_attn_fp8_func`` with each
``v_layout`` mode ("launch": the copy launched first; "helper": the helper kernel on a side stream beside the
forward; "self": the forward's programs alone), beside the kernel alone on a finished V^T and the in-repo
bf16 forward, in one run, interleaved.

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/fp8_vt_probe.py [--head-dims 64,128] [--seqlens 4096,16384]
        [--masks no,yes] [--modes launch,helper,self] [--repeat 2] [--here]

Shapes: the FA sweep's (16k tokens, hidden 2048). Before timing, each mode's output is checked bitwise
against the "launch" mode's, on two different V in turn (a forward reading V^T before its copy finished
would read the other V's). Rows: ``| hd | causal | seqlen | what | ms | TFLOP/s | bf16 / this |``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

if "--here" in sys.argv:  # import this tree, not the one on PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--masks", default="no,yes", help="comma list of no (full square) and yes (causal)")
    ap.add_argument("--modes", default="launch,helper,self")
    ap.add_argument("--helpers", default="", help="comma list of HELPERS_PER_SM values to time the helper at "
                    "(rows 'helper h=N c=CHUNK'; default: v_layout's)")
    ap.add_argument("--chunks", default="", help="comma list of CHUNK values (keys per work item) for those rows")
    ap.add_argument("--repeat", type=int, default=2, help="time each variant this many times, interleaved")
    ap.add_argument("--here", action="store_true", help="import this tree (default: PYTHONPATH's)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_vt_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("FLASH_ATTN_AUTOTUNE", "0")
    from harness import fp8
    from harness.perf.timing import time_callable
    from kernels.flash_attn import flash_attn_fp8_func, flash_attn_func, v_layout
    from kernels.flash_attn.fwd import flash_attn_fwd

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    def in_mode(mode, fn, helpers=None, chunk=None):
        def call():
            old = v_layout.VT_MODE, v_layout.HELPERS_PER_SM, v_layout.CHUNK
            v_layout.VT_MODE = mode
            v_layout.HELPERS_PER_SM = helpers or old[1]
            v_layout.CHUNK = chunk or old[2]
            try:
                return fn()
            finally:
                v_layout.VT_MODE, v_layout.HELPERS_PER_SM, v_layout.CHUNK = old
        return call

    variants = [(m, None, None) for m in args.modes.split(",")]
    variants += [("helper", int(h), int(c)) for h in args.helpers.split(",") if h
                 for c in (args.chunks or str(v_layout.CHUNK)).split(",")]

    bad = 0
    print("| hd | causal | seqlen | what | ms | TFLOP/s | bf16 / this |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        heads = 8 if d == 256 else 2048 // d
        for s in (int(x) for x in args.seqlens.split(",")):
            b = max(1, 16384 // s)
            g = torch.Generator(device="cpu").manual_seed(0)
            x = [torch.randn(b, s, heads, d, generator=g).to("cuda") for _ in range(4)]
            (q, qs), (k, ks), (v, vs), (v2, vs2) = (fp8.quantize(t, "e4m3", heads) for t in x)
            qb, kb, vb = (t.to(torch.bfloat16) for t in x[:3])
            vt = v_layout.v_keys_contiguous(v)
            for causal in [{"no": False, "yes": True}[m] for m in args.masks.split(",")]:
                flops = 4 * b * heads * s * s * d // (2 if causal else 1)

                fp8_call = functools.partial(flash_attn_fp8_func, q, k, causal=causal)

                # the check: every mode bitwise the launched copy's, V and v2 alternating
                for vv, vvs in ((v, vs), (v2, vs2), (v, vs), (v2, vs2)):
                    one = functools.partial(fp8_call, vv, qs, ks, vvs)
                    want = in_mode("launch", one)()
                    for mode, hh, cc in variants:
                        got = in_mode(mode, one, hh, cc)()
                        if not torch.equal(got, want):
                            bad += 1
                            diff = (got.float() - want.float()).abs()
                            print(f"| {d} | {causal} | {s} | MISMATCH {mode}: {int((diff > 0).sum())} elements, max "
                                  f"{float(diff.max()):.3g}, NaN {int(got.isnan().sum())} |", flush=True)
                kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1)
                calls = [(f"FP8 call, V^T {m}" + (f" h={hh} c={cc}" if hh else ""),
                          in_mode(m, functools.partial(fp8_call, v, qs, ks, vs), hh, cc)) for m, hh, cc in variants]
                calls.append(("FP8 kernel alone (V^T ready)",
                              functools.partial(flash_attn_fwd, q, k, vt, descales=(qs, ks, vs),
                                                out_dtype=torch.bfloat16, v_transposed=True, **kw)))
                calls.append(("bf16 call", functools.partial(flash_attn_func, qb, kb, vb, causal=causal)))
                times: dict = {}
                for _ in range(args.repeat):
                    for name, fn in calls:
                        times.setdefault(name, []).append(timed(fn))
                ref = min(times["bf16 call"])
                for name, _fn in calls:
                    ms = min(times[name])
                    rep = " / ".join(f"{t:.4f}" for t in times[name])
                    print(f"| {d} | {'yes' if causal else 'no'} | {s} | {name} | {rep} | {flops / ms / 1e9:.0f} | "
                          f"{ref / ms:.3f} |", flush=True)
            del x, q, k, v, v2, vt, qb, kb, vb
            torch.cuda.empty_cache()
    print(f"mismatches: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
