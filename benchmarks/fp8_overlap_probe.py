"""The FP8 forward's V copy overlapped with the forward (configs.FP8_V_OVERLAP), timed as users call it (GPU only).

Issue 19's must counts the whole call: the copy of V to keys-contiguous (27 us at the FA sweep's 4k, ~5% of the
hd 64 causal call) and the forward. The overlap's modes (``--modes``): "counters", the copy signals each (batch,
kv head) done and the forward, launched with programmatic dependent launch, starts while the copy runs and waits
per head (kernels/flash_attn/v_layout.py, fwd._wait_ready); "pdl", the plain copy lets the forward launch as it
ends and the forward waits for all of it (griddepcontrol.wait). For each FA-sweep shape (16k tokens, hidden 2048)
this prints, per repeat and interleaved: ``flash_attn_fp8_func`` with the overlap off and in each mode, the bf16
``flash_attn_func`` forward, their ms (harness timer, median) and the FP8 / bf16 ratio; first, each mode's race
check: its outputs bitwise the plain call's, on two different V's called alternately (a forward that read a head
before its copy was done would read the other V's bytes left in the reused buffer), ``--checks`` times each.

    FLASH_ATTN_AUTOTUNE=0 python3 benchmarks/fp8_overlap_probe.py --head-dims 64,128 --seqlens 4096,16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="yes,no", help="comma list of yes, no")
    ap.add_argument("--out", default="bf16", choices=["bf16", "e4m3"], help="the FP8 forward's output dtype")
    ap.add_argument("--modes", default="counters,pdl", help="comma list of configs.FP8_V_OVERLAP's modes to time "
                    "beside the plain call: counters (per-head waits), pdl (the forward launched to start as the "
                    "copy ends)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--checks", type=int, default=10, help="alternating calls per setting in the race check")
    ap.add_argument("--signal-block-s", type=int, default=0, help="the signalling copy's keys per tile "
                    "(v_layout.SIGNAL_BLOCK_S; default: as set there)")
    args = ap.parse_args(argv)
    if args.signal_block_s:
        from kernels.flash_attn import v_layout

        v_layout.SIGNAL_BLOCK_S = args.signal_block_s
    if not torch.cuda.is_available():
        print("needs a GPU", file=sys.stderr)
        return 2
    from harness.perf.timing import time_callable

    out_dtype = torch.bfloat16 if args.out == "bf16" else torch.float8_e4m3fn

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    from kernels.flash_attn import v_layout

    print(f"device: {torch.cuda.get_device_name()}; FP8 out {args.out}; signalling copy: {v_layout.SIGNAL_BLOCK_S}-key "
          f"tiles, {v_layout.SIGNAL_PROGRAMS_PER_SM} program(s) an SM")
    print("| hd | seqlen | causal | what | ms | FP8 / bf16 |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for d in (int(x) for x in args.head_dims.split(",")):
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (c == "yes" for c in args.causal.split(",")):
                failed += _shape(d, s, causal, out_dtype, args, timed, [m for m in args.modes.split(",") if m])
    return 1 if failed else 0


def _shape(d: int, s: int, causal: bool, out_dtype, args, timed, modes) -> bool:
    """One FA-sweep shape's rows; True where the race check failed."""
    from kernels.flash_attn import configs
    from kernels.flash_attn.interface import flash_attn_fp8_func, flash_attn_func

    b, h = max(1, 16384 // s), 2048 // d
    torch.manual_seed(0)
    qb, kb, vb, vb2 = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v, v2 = (x.to(torch.float8_e4m3fn) for x in (qb, kb, vb, vb2))
    ds = torch.full((b, h), 1.0, device="cuda")

    def call(mode, vv=v):
        configs.FP8_V_OVERLAP = mode
        return flash_attn_fp8_func(q, k, vv, ds, ds, ds, causal=causal, out_dtype=out_dtype)

    worst = 0.0
    try:
        ref = {id(vv): call("", vv).float() for vv in (v, v2)}
        for mode in modes:
            for i in range(2 * args.checks):
                vv = (v, v2)[i % 2]
                worst = max(worst, (call(mode, vv).float() - ref[id(vv)]).abs().max().item())
            torch.cuda.synchronize()
            print(f"| {d} | {s} | {causal} | race check: max abs diff {mode} / off over {2 * args.checks} "
                  f"alternating calls | {worst:.3e} | |", flush=True)
        for _ in range(args.repeat):
            bf16 = timed(lambda: flash_attn_func(qb, kb, vb, causal=causal))
            for mode in [""] + modes:
                ms = timed(lambda m=mode: call(m))
                print(f"| {d} | {s} | {causal} | FP8 call, overlap {mode or 'off'} | {ms:.4f} | {bf16 / ms:.3f} |",
                      flush=True)
            print(f"| {d} | {s} | {causal} | bf16 forward | {bf16:.4f} | |", flush=True)
    finally:
        configs.FP8_V_OVERLAP = ""
    return worst != 0.0


if __name__ == "__main__":
    sys.exit(main())
