"""Hopper's TMA reduce-add (``cp.reduce.async.bulk.tensor ... .add``) from Gluon, and what it sustains: the building
block a fused backward would send dQ through (flash-attn 3 adds each key block's dQ partial into an fp32 buffer this
way), measured before such a kernel is built (issue 16, session 33).

    python benchmarks/tma_reduce_probe.py [--rows 16384] [--dim 128] [--block 64] [--repeats 8,64] [--check-only]
    python benchmarks/tma_reduce_probe.py --ptx        # no GPU: compile for sm_90a and show the reduce instruction

Triton 3.6's Gluon wraps TMA loads and stores (``hopper.tma``) but not its reduce; the Gluon builder has the op
(``create_async_tma_reduce``), which ``kernels/flash_attn/bwd_gluon.tma_reduce_add`` wraps the way
``tma.async_copy_shared_to_global`` wraps the store (the fused backward adds its dQ partials with it). The kernel: each program writes a [BLOCK, DIM] fp32 tile (value: its program id + 1) into shared
memory once, then adds it into ``repeats`` row blocks of an fp32 buffer of ``rows`` x ``dim`` (block ``(pid + i) %
blocks``: every destination block receives ``repeats`` adds from different programs, as dQ's query blocks receive
one per key block), against the same volume through plain TMA stores and through per-element ``gl.atomic_add``.

1. Correctness: the buffer after one launch equals the sum torch computes from the same schedule (small integers in
   fp32: exact), zeroed (not poisoned: a reduce adds to what is there) before each check.
2. Time: CUDA events through the harness's timer (warm-up, median), GB/s of fp32 data added. Rows:
   ``| kind | rows x dim | block | repeats | ms | GB/s |``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma  # noqa: E402

from kernels.flash_attn.bwd_gluon import tma_reduce_add  # noqa: E402

#: how each program's tile reaches the buffer: TMA reduce-add, TMA store (the same bytes, no add: the ceiling),
#: per-element atomics from registers (FA2's dQ)
KINDS = ("tma-reduce", "tma-store", "atomic")


@gluon.jit
def _reduce_kernel(Dst, rows, repeats, BLOCK: gl.constexpr, DIM: gl.constexpr, KIND: gl.constexpr,
                   SL: gl.constexpr, num_warps: gl.constexpr):
    pid = gl.program_id(0)
    blocks = rows // BLOCK
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
    tile = gl.full([BLOCK, DIM], 1.0, gl.float32, layout) * (pid + 1).to(gl.float32)
    if KIND == 2:  # per-element atomics from registers
        r = gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
        c = gl.arange(0, DIM, layout=gl.SliceLayout(0, layout))
        offs = gl.expand_dims(r, 1) * DIM + gl.expand_dims(c, 0)
        for i in range(repeats):
            row0 = ((pid + i) % blocks) * BLOCK
            gl.atomic_add(Dst + row0 * DIM + offs, tile, sem="relaxed")
    else:
        desc = tma.make_tensor_descriptor(Dst, [rows, DIM], [DIM, 1], [BLOCK, DIM], SL)
        smem = gl.allocate_shared_memory(gl.float32, [BLOCK, DIM], SL)
        smem.store(tile)
        fence_async_shared()
        for i in range(repeats):
            row0 = ((pid + i) % blocks) * BLOCK
            if KIND == 0:
                tma_reduce_add(desc, [row0, 0], smem)
            else:
                tma.async_copy_shared_to_global(desc, [row0, 0], smem)
        tma.store_wait(pendings=0)


def arguments(dst, rows: int, dim: int, block: int, repeats: int, kind: str) -> dict:
    """Every argument of ``_reduce_kernel`` by name (a CPU compile binds the same)."""
    return dict(Dst=dst, rows=rows, repeats=repeats, BLOCK=block, DIM=dim, KIND=KINDS.index(kind),
                SL=gl.NVMMASharedLayout.get_default_for([block, dim], gl.float32), num_warps=4)


def launch(dst, block: int, repeats: int, kind: str, programs: int) -> None:
    from kernels import launcher

    launcher.ensure_allocator()  # device-side descriptors need Triton's scratch allocator
    _reduce_kernel[(programs,)](**arguments(dst, dst.shape[0], dst.shape[1], block, repeats, kind))


def expected(rows: int, dim: int, block: int, repeats: int, programs: int) -> torch.Tensor:
    """The buffer the reduce kinds leave in a zeroed ``rows`` x ``dim`` fp32 buffer: each program p adds p + 1 into
    row block (p + i) % blocks for i < repeats (tma-store's last writer is not defined: not checked)."""
    blocks = rows // block
    per_block = torch.zeros(blocks, dtype=torch.float64)
    for p in range(programs):
        for i in range(repeats):
            per_block[(p + i) % blocks] += p + 1
    return per_block.repeat_interleave(block)[:, None].expand(rows, dim).float()


def ptx_of(kind: str = "tma-reduce", rows: int = 1024, dim: int = 128, block: int = 64) -> str:
    """The kernel's PTX for sm_90a, compiled on the CPU (no GPU needed)."""
    from sm90_compile import compile_call

    dst = torch.empty(rows, dim)
    return compile_call(_reduce_kernel, arguments(dst, rows, dim, block, 4, kind)).asm["ptx"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--repeats", default="8,64", help="comma-separated: adds per program")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--ptx", action="store_true", help="no GPU: compile for sm_90a, print the reduce instructions")
    a = ap.parse_args(argv)
    if a.ptx:
        os.environ["TRITON_INTERPRET"] = "0"
        lines = [x.strip() for x in ptx_of(rows=a.rows, dim=a.dim, block=a.block).splitlines()
                 if "cp.reduce.async.bulk" in x]
        print("\n".join(lines) or "no cp.reduce.async.bulk in the PTX")
        return 0 if lines else 1
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("tma_reduce_probe: needs an sm90 GPU (or --ptx)", file=sys.stderr)
        return 2
    from harness.perf.timing import time_callable

    programs = torch.cuda.get_device_properties(0).multi_processor_count * 4
    dst = torch.zeros(a.rows, a.dim, device="cuda")
    ok = True
    for kind in ("tma-reduce", "atomic"):
        for repeats in (int(x) for x in a.repeats.split(",")):
            dst.zero_()
            launch(dst, a.block, repeats, kind, programs)
            torch.cuda.synchronize()
            want = expected(a.rows, a.dim, a.block, repeats, programs)
            good = torch.equal(dst.cpu(), want)
            ok &= good
            print(f"| check | {kind} | {a.rows} x {a.dim} | {a.block} | {repeats} | {'ok' if good else 'FAIL'} |")
    if not ok:
        print("tma_reduce_probe: a reduce left the wrong sums; no timing", file=sys.stderr)
        return 1
    if a.check_only:
        return 0
    print("| kind | rows x dim | block | repeats | ms | GB/s |")
    print("|---|---|---|---|---|---|", flush=True)
    for repeats in (int(x) for x in a.repeats.split(",")):
        moved = programs * repeats * a.block * a.dim * 4
        for kind in KINDS:
            ms = time_callable(lambda kind=kind, repeats=repeats: launch(dst, a.block, repeats, kind, programs),
                               "cuda").median_ms
            print(f"| {kind} | {a.rows} x {a.dim} | {a.block} | {repeats} | {ms:.4f} | {moved / ms / 1e6:.0f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
