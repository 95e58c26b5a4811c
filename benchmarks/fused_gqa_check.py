"""The fused Gluon backward (FLASH_ATTN_BWD=fused) against the default split route, whole backwards in one process
(CUDA events, median; the Triton kernels autotuned): the GQA shapes it lost on in session 34 (Llama-3-8B 32/8 at 8k,
Llama-3-70B 64/8 at 4k, causal) at group splits 1, 2 and 4, MHA with the same 32 query heads, and FA-sweep cells.
Rows ``| shape | route | split | ms |``. ``--kernels``: instead, the dK / dV kernels alone (launch replayed) on the
GQA shapes and MHA 32/32, causal then without a mask: the split route's, the fused one (and with its adds in an adder
warp), and the fused one with its dQ partials stored instead of added (``dq_sink`` 1) or dropped (2), to tell the
adds' cost from the dQ matmuls' (those two leave dQ wrong).

    python benchmarks/fused_gqa_check.py [--kernels | --walks | --route-walks]

``--walks``: the dK / dV kernels (split route's and fused) with each program's (head, tile) steps walked three ways
(kernels/flash_attn/bwd_gluon.py ``_walk_bounds``), at 2 and 3 stages, three interleaved repeats. ``--route-walks``:
the whole default backward on the GQA shapes as routed (the flat walk) against the nested walk, same run.
"""
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from harness.perf.timing import time_callable  # noqa: E402
from kernels.flash_attn import bwd  # noqa: E402
from kernels.flash_attn.fwd import flash_attn_fwd  # noqa: E402

#: (label, batch, seqlen, query heads, kv heads, head dim, causal)
CELLS = (("Llama-3-8B", 1, 8192, 32, 8, 128, True), ("MHA 32/32", 1, 8192, 32, 32, 128, True),
         ("Llama-3-70B", 1, 4096, 64, 8, 128, True), ("sweep", 4, 4096, 16, 16, 128, False),
         ("sweep", 4, 4096, 16, 16, 128, True), ("sweep", 1, 16384, 16, 16, 128, True),
         ("sweep", 2, 8192, 32, 32, 64, False))


#: ``--kernels``' cells: the GQA shapes and MHA 32/32 causal, then the same shapes without a mask (every program
#: of a kv head walks the same tiles in the same order: whether the GQA export cost follows the causal walk)
KERNEL_CELLS = CELLS[:3] + tuple(c[:-1] + (False, ) for c in CELLS[:3])


def _cell(label, b, s, hq, hk, d, causal) -> dict:
    """A cell's GPU inputs (fresh random bf16 q, k, v, dO), the in-repo forward's out and lse, delta = rowsum(dO * O)
    [B, Hq, S], its mask keywords and its row label."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, do = (torch.randn(b, s, hq, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, s, hk, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    mask = dict(causal=causal, window_left=-1, window_right=0 if causal else -1)
    out, lse = flash_attn_fwd(q, k, v, softmax_scale=d ** -0.5, **mask)
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    return dict(q=q, k=k, v=v, do=do, out=out, lse=lse, delta=delta, mask=mask,
                shape=f"{label} B{b} S{s} H{hq}/{hk} D{d}{' causal' if causal else ''}")


def kernels() -> int:
    from kernels.flash_attn.bwd_gluon import dkdv_gluon

    print("| shape | kernel | ms |\n|---|---|---|")
    for cell in KERNEL_CELLS:
        x = _cell(*cell)
        d, causal, shape = cell[5], cell[6], x["shape"]
        q, k, v, do, lse, delta = (x[n] for n in ("q", "k", "v", "do", "lse", "delta"))
        kw = dict(softmax_scale=d ** -0.5, causal=causal, block_m=64, num_stages=2)
        for name, extra in (("dK / dV (split route)", {}), ("fused", dict(fused=True)),
                            ("fused, adder warp", dict(fused=True, adder=True)),
                            ("fused, dQ stored", dict(fused=True, dq_sink=1)),
                            ("fused, dQ dropped", dict(fused=True, dq_sink=2))):
            fn = functools.partial(dkdv_gluon, q, k, v, do, lse, delta, launches={}, **kw, **extra)
            fn()
            torch.cuda.synchronize()
            print(f"| {shape} | {name} | {time_callable(fn, 'cuda').median_ms:.4f} |", flush=True)
    return 0


#: ``--walks``' rows: (kernel, dkdv_gluon's keywords) per bwd_gluon._walk_bounds order
WALKS = (("dK / dV", {}), ("dK / dV, flat walk", dict(walk=1)), ("dK / dV, lockstep", dict(walk=2)),
         ("fused", dict(fused=True)), ("fused, flat walk", dict(fused=True, walk=1)),
         ("fused, lockstep", dict(fused=True, walk=2)), ("fused, lockstep, adder", dict(fused=True, walk=2, adder=True)))


def walks(stages=(2, 3)) -> int:
    """The dK / dV kernels alone (launch replayed) on the GQA shapes (causal and not) and MHA 32/32 causal, each
    program's (head, tile) steps walked three ways (bwd_gluon._walk_bounds: heads outside, one flat loop, lockstep),
    interleaved over three repeats; rows ``| shape | kernel | stages | ms |``."""
    from kernels.flash_attn.bwd_gluon import dkdv_gluon

    print("| shape | kernel | stages | ms |\n|---|---|---|---|")
    for cell in KERNEL_CELLS[:4]:
        x = _cell(*cell)
        d, causal, shape = cell[5], cell[6], x["shape"]
        q, k, v, do, lse, delta = (x[n] for n in ("q", "k", "v", "do", "lse", "delta"))
        fns = [(name, st, functools.partial(dkdv_gluon, q, k, v, do, lse, delta, launches={}, softmax_scale=d ** -0.5,
                                            causal=causal, block_m=64, num_stages=st, **extra))
               for name, extra in WALKS for st in stages]
        for _ in range(3):
            for name, st, fn in fns:
                fn()
                torch.cuda.synchronize()
                print(f"| {shape} | {name} | {st} | {time_callable(fn, 'cuda').median_ms:.4f} |", flush=True)
        del q, k, v, do, lse, delta, fns, x
        torch.cuda.empty_cache()
    return 0


def route_walks() -> int:
    """The whole default backward (deterministic split route; Triton autotuned as a user's call) on the GQA shapes,
    causal and not, as routed (configs.bwd_walk: the dK / dV kernel's flat walk at hd 128) against the same route
    with the nested walk (bwd_walk forced to 0), interleaved over three repeats; rows ``| shape | route | ms |``."""
    from kernels.flash_attn import configs

    os.environ["FLASH_ATTN_AUTOTUNE"] = "1"
    routed = configs.bwd_walk
    print("| shape | route | ms |\n|---|---|---|")
    for cell in (KERNEL_CELLS[0], KERNEL_CELLS[2], KERNEL_CELLS[3]):
        x = _cell(*cell)
        d, shape, mask = cell[5], x["shape"], x["mask"]
        q, k, v, do, out, lse = (x[n] for n in ("q", "k", "v", "do", "out", "lse"))
        fns = []
        for name, walk in (("routed (flat walk)", routed), ("nested walk", lambda q, k: 0)):
            configs.bwd_walk = walk  # read by the first call of each (its launches are then replayed)
            fn = functools.partial(bwd.flash_attn_bwd, do, q, k, v, out, lse, softmax_scale=d ** -0.5,
                                   launches={}, **mask)
            fn()
            torch.cuda.synchronize()
            fns.append((name, fn))
        configs.bwd_walk = routed
        for _ in range(3):
            for name, fn in fns:
                print(f"| {shape} | {name} | {time_callable(fn, 'cuda').median_ms:.4f} |", flush=True)
        del q, k, v, do, out, lse, fns, x
        torch.cuda.empty_cache()
    return 0


def main() -> int:
    if "--kernels" in sys.argv[1:]:
        return kernels()
    if "--walks" in sys.argv[1:]:
        return walks()
    if "--route-walks" in sys.argv[1:]:
        return route_walks()
    os.environ["FLASH_ATTN_AUTOTUNE"] = "1"
    print("| shape | route | split | ms |\n|---|---|---|---|")
    for cell in CELLS:
        x = _cell(*cell)
        _, _, _, hq, hk, d, _ = cell
        shape, mask = x["shape"], x["mask"]
        q, k, v, do, out, lse = (x[n] for n in ("q", "k", "v", "do", "out", "lse"))
        for mode in ("", "fused"):
            for split in ((1, 2, 4) if hq != hk else (1, )):
                os.environ["FLASH_ATTN_BWD"] = mode
                fn = functools.partial(bwd.flash_attn_bwd, do, q, k, v, out, lse, softmax_scale=d ** -0.5,
                                       split=split, launches={}, **mask)
                fn()
                torch.cuda.synchronize()
                ms = time_callable(fn, "cuda").median_ms
                print(f"| {shape} | {mode or 'split route'} | {split} | {ms:.4f} |", flush=True)
        del q, k, v, do, out, lse, x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
