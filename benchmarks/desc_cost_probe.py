"""What making a TMA descriptor on the device costs a program (issue 19: is it part of the FP8 forward's per-program
fixed cost?). The forward makes 4-6 descriptors in every program (`fwd._make_desc`: a 128-byte tensor map written
in shared memory, copied to global memory with a release fence, then an acquire fence before its first TMA load).

    python benchmarks/desc_cost_probe.py [--descs 6] [--programs 2048] [--seqlen 4096] [--head-dim 64] [--check]
    python benchmarks/desc_cost_probe.py --compile   # sm_90a on any machine: tensor-map fences and TMA loads each

Two kernels load the same DESCS tiles per program (one [BLOCK_M, D] e4m3 tile each, summed so nothing is dead):
"one" through a single descriptor, "each" through a descriptor made for each tile. Their difference, spread over
the SM slots the programs ran in, is what DESCS - 1 descriptors cost a program; compared with the forward's
program time (`--forward-us`, default the hd 64 causal 4k FP8 program: 0.523 ms x 528 slots / 2048 programs).
Device time from CUDA-graph replay of 20 launches, median of the harness's timer, the two kernels interleaved
`--repeat` times. `--check`: the two kernels' sums agree (also under TRITON_INTERPRET=1 on a CPU). `--compile`:
both kernels compiled for sm_90a (no GPU needed; not under the interpreter), the PTX's tensor-map fences (one per
descriptor made) and TMA loads counted, so a compiler that folded the extra descriptors away shows here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _tiles_kernel(X, Out, seqlen, stride_s, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DESCS: tl.constexpr,
                  EACH: tl.constexpr):
    """Program (m, bh): DESCS tiles of rows [(m + i) * BLOCK_M % seqlen, ...) of head bh's [seqlen, HEAD_DIM] rows,
    summed into Out[bh, m]; EACH: a descriptor made for each tile, else one for all."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = X + bh * seqlen * stride_s
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    desc = tl.make_tensor_descriptor(base, shape=[seqlen, HEAD_DIM], strides=[stride_s, 1],
                                     block_shape=[BLOCK_M, HEAD_DIM])
    for i in tl.static_range(DESCS):
        row = ((pid_m + i) * BLOCK_M) % seqlen
        if EACH and i > 0:  # a new one per tile; its bounds as the first's (seqlen + 0 * i would be folded)
            d = tl.make_tensor_descriptor(base, shape=[seqlen + (bh >> 40).to(tl.int32) * i, HEAD_DIM],
                                          strides=[stride_s, 1], block_shape=[BLOCK_M, HEAD_DIM])
            acc += d.load([row, 0]).to(tl.float32)
        else:
            acc += desc.load([row, 0]).to(tl.float32)
    tl.store(Out + bh * tl.num_programs(0) + pid_m, tl.sum(acc))


def run(x, out, descs: int, each: bool, block_m: int):
    heads, seqlen, d = x.shape
    grid = (out.shape[1], heads)
    _tiles_kernel[grid](x, out, seqlen, x.stride(1), HEAD_DIM=d, BLOCK_M=block_m, DESCS=descs, EACH=each,
                        num_warps=4)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--descs", type=int, default=6, help="tiles (and, in 'each', descriptors) per program")
    ap.add_argument("--programs", type=int, default=2048, help="programs per launch (the 4k causal forward's)")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-m", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--forward-us", type=float, default=0.523e3 * 528 / 2048,
                    help="a forward program's time in the slot, us (default: hd 64 causal 4k FP8, session 26)")
    ap.add_argument("--check", action="store_true", help="only check that both kernels sum the same tiles")
    ap.add_argument("--compile", action="store_true",
                    help="only compile both for sm_90a and count their descriptors and TMA loads (no GPU needed)")
    args = ap.parse_args(argv)
    if args.compile:
        return _compile_counts(args)
    from kernels import launcher

    interpret = triton.knobs.runtime.interpret if hasattr(triton.knobs, "runtime") else False
    device = "cpu" if interpret or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.check:
        print("desc_cost_probe: timing needs a CUDA GPU (--check runs under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    if device == "cuda":
        launcher.ensure_allocator()  # device-side descriptors take their global scratch from Triton's allocator
    heads = max(1, args.programs // max(1, args.seqlen // args.block_m))
    per_head = -(-args.programs // heads)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(heads, args.seqlen, args.head_dim, generator=g).clamp(-4, 4).to(torch.float8_e4m3fn).to(device)
    one = torch.empty(heads, per_head, dtype=torch.float32, device=device)
    each = torch.empty_like(one)
    run(x, one, args.descs, False, args.block_m)
    run(x, each, args.descs, True, args.block_m)
    same = torch.equal(one, each)
    print(f"check: the two kernels' sums {'agree' if same else 'DIFFER'} ({heads} heads x {per_head} programs, "
          f"{args.descs} tiles a program)")
    if not same:
        return 1
    if args.check:
        return 0
    # device time of one call from CUDA-graph replay (this script's folder is on the path when it runs)
    from fp8_causal_probe import graph_ms

    def graph_us(fn):
        return graph_ms(fn) * 1e3

    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}; DESCS {args.descs}, BLOCK_M {args.block_m}, hd {args.head_dim}, {heads * per_head} programs")
    print("| repeat | one descriptor us | one per tile us | extra us a launch |")
    print("|---|---|---|---|", flush=True)
    extras = []
    for r in range(args.repeat):
        a = graph_us(lambda: run(x, one, args.descs, False, args.block_m))
        b = graph_us(lambda: run(x, each, args.descs, True, args.block_m))
        extras.append(b - a)
        print(f"| {r} | {a:.2f} | {b:.2f} | {b - a:.2f} |", flush=True)
    extras.sort()
    mid = extras[len(extras) // 2]
    slots = props.multi_processor_count * 4  # the FP8 hd 64 forward's four programs an SM
    per_program = mid * slots / (heads * per_head)
    print(f"median extra {mid:.2f} us a launch: about {per_program:.2f} us of slot time for {args.descs - 1} more "
          f"descriptors a program ({slots} slots), {100 * per_program / args.forward_us:.1f}% of a {args.forward_us:.0f} "
          "us forward program (an upper bound: a slot's other programs may hide part of it)")
    return 0


def _compile_counts(args) -> int:
    """Both kernels compiled for sm_90a (sm90_compile.compile_call, CPU tensors): a row each with the descriptors
    made (tensor-map release fences in the PTX), the TMA loads and ptxas's registers."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sm90_compile import compile_call, ptxas_usage

    x = torch.empty(8, args.seqlen, args.head_dim, dtype=torch.float8_e4m3fn)
    out = torch.empty(8, max(1, args.seqlen // args.block_m), dtype=torch.float32)
    print("| kernel | descriptors made | TMA loads | registers |")
    print("|---|---|---|---|")
    for each in (False, True):
        k = compile_call(_tiles_kernel, dict(X=x, Out=out, seqlen=args.seqlen, stride_s=args.head_dim,
                                             HEAD_DIM=args.head_dim, BLOCK_M=args.block_m, DESCS=args.descs,
                                             EACH=each, num_warps=4, num_stages=1))
        ptx = k.asm["ptx"]
        print(f"| {'each' if each else 'one'} | {ptx.count('tensormap.cp_fenceproxy')} | "
              f"{ptx.count('cp.async.bulk.tensor')} | {ptxas_usage(ptx)['regs']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
