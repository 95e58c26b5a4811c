"""Registers, spills and time of the in-repo flash-attention kernels on one shape (GPU).

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/kernel_regs.py [--shape 4,4096,16,128] [--causal] [--dv 128]
        [--no-split]

Runs ``kernels.flash_attn.flash_attn_func`` forward and backward once on bf16 inputs of the shape
(batch, seqlen, heads, head dim), then prints, for every compiled variant of each kernel, its
registers per thread, spilled bytes and shared memory (what ptxas reported), and the forward and
backward times through the harness timer. Run it before and after a change to the kernels'
source that should not change the generated code (a refactor into shared ``@triton.jit``
helpers): the rows must match. ``--dv``: a value head dim of its own (MLA's 192 / 128);
``--no-split``: q / k head dims that are not a power of two padded, as before the head-dim split
(configs.HEAD_DIM_SPLIT off), for a before / after in one process.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.perf.timing import time_callable  # noqa: E402


def _compiled(fn):
    """Every compiled kernel of a (possibly autotuned) Triton function, on every device."""
    from triton.runtime.autotuner import Autotuner

    if isinstance(fn, Autotuner):  # it wraps the JITFunction (a JITFunction's own .fn is the Python function)
        fn = fn.fn
    for caches in fn.device_caches.values():
        yield from caches[0].values()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4,4096,16,128")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dv", type=int, default=None, help="value head dim (default: the head dim)")
    ap.add_argument("--no-split", action="store_true", help="pad q / k head dims instead of splitting them")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_regs: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels.flash_attn import bwd, configs, flash_attn_func, fwd

    configs.HEAD_DIM_SPLIT = not args.no_split
    b, s, h, d = (int(x) for x in args.shape.split(","))
    dv = args.dv or d
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, n, generator=g).to("cuda", torch.bfloat16) for n in (d, d, dv, dv))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    out = flash_attn_func(q, k, v, causal=args.causal)
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    print("| kernel | registers | spill bytes | shared bytes |\n|---|---|---|---|")
    for name, fn in (("_fwd_kernel", fwd._fwd_kernel), ("_bwd_preprocess", bwd._bwd_preprocess),
                     ("_bwd_dkdv_kernel", bwd._bwd_dkdv_kernel), ("_bwd_dq_kernel", bwd._bwd_dq_kernel)):
        for kern in _compiled(fn):
            kern._init_handles()
            print(f"| {name} | {kern.n_regs} | {kern.n_spills} | {kern.metadata.shared} |")
    t_fwd = time_callable(lambda: flash_attn_func(q, k, v, causal=args.causal), "cuda", flush=True).median_ms
    t_bwd = time_callable(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), "cuda",
                          mode="bwd", flush=True).median_ms
    print(f"\nB{b} S{s} H{h} D{d}{'' if dv == d else f' v{dv}'}{' padded' if args.no_split else ''} "
          f"{'causal' if args.causal else 'full'} bf16: forward {t_fwd:.3f} ms, "
          f"backward {t_bwd:.3f} ms (harness timer, median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
