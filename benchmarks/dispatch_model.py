"""How long a one-program-a-tile causal grid keeps the GPU's SMs busy, per grid order: a list-scheduling model of
the GPU's dispatch, no GPU.

    python benchmarks/dispatch_model.py [--sms 132] [--overhead 0]

The GPU starts a grid's programs in order (program_id(0) fastest) as SMs free up, one program an SM (the Gluon
backward kernels' shared memory allows one). A causal program's work falls or grows with its block: a dK / dV
program of key block j walks the query tiles from j's diagonal on (heavy first blocks), a dQ program of query block
i the key blocks up to i's diagonal (heavy last blocks). Its cost here is heads x tile steps (+ ``--overhead`` steps
of fixed work). Printed per shape and kernel: the span (the last SM's finish) over the mean load, for the default
grid (blocks first, units second: each (batch, kv head, group part) unit's blocks in a row) and with the units first
(every unit's first block before any unit's second: bwd_gluon.dkdv_grid's ``units_first``; the dQ kernel's walks
its query blocks last first, heaviest first: bwd_gluon.dq_grid's). 1.00: every SM busy until the end; the kernel's
time follows the span.

Session 59 wrote this model down in configs.BWD_GLUON_UNITS_FIRST's note (64/8 4k 1.59 -> 1.00-1.03); session 60
measured units first on the whole backward at 1.19-1.21x there (docs/perf/gluon-s60).
"""

from __future__ import annotations

import argparse
import heapq


def program_costs(kernel: str, seqlen: int, block: int, tile: int, heads: int, overhead: float = 0.0) -> list[float]:
    """Cost of each block's program of one unit, in its grid order: ``kernel`` "dkdv" (blocks of ``block`` keys
    walking ``tile``-row query tiles from their diagonal on) or "dq" (blocks of ``block`` queries walking
    ``tile``-key blocks up to their diagonal), causal, ``heads`` query heads a program, equal sequence lengths."""
    if kernel not in ("dkdv", "dq"):
        raise ValueError(f"kernel must be 'dkdv' or 'dq', got {kernel!r}")
    if min(seqlen, block, tile, heads) <= 0:
        raise ValueError("seqlen, block, tile and heads must be positive")
    blocks, tiles = -(-seqlen // block), -(-seqlen // tile)
    if kernel == "dkdv":
        return [heads * (tiles - (j * block) // tile) + overhead for j in range(blocks)]
    return [heads * min(tiles, -(-min(seqlen, (i + 1) * block) // tile)) + overhead for i in range(blocks)]


def span_over_mean(costs: list[float], sms: int) -> float:
    """Greedy list scheduling of ``costs`` in order onto ``sms`` machines: the last finish over the mean load."""
    if sms <= 0 or not costs:
        raise ValueError("needs a positive SM count and at least one program")
    free = [0.0] * min(sms, len(costs))
    heapq.heapify(free)
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free) / (sum(costs) / sms)


def grid_costs(kernel: str, units: int, seqlen: int, block: int, tile: int, heads: int, units_first: bool,
               overhead: float = 0.0) -> list[float]:
    """Every program's cost in dispatch order: ``units`` copies of :func:`program_costs`, blocks first (the default)
    or units first (the dQ kernel's then last block first, as its UNITS_FIRST walks them)."""
    one = program_costs(kernel, seqlen, block, tile, heads, overhead)
    if units_first:
        return [c for c in (one[::-1] if kernel == "dq" else one) for _ in range(units)]
    return [c for _ in range(units) for c in one]


#: (label, kernel, units, seqlen, block, tile, heads a program): the split route's causal kernels on the models
#: preset's rows and session 60's A/B rows. dK / dV: units = batch x kv heads x group split, 128 keys a program
#: (bwd_gluon.BLOCK_N; hd 256's kernel 64), 64-row query tiles. dQ: units = batch x query heads, 128 query rows a
#: program, key blocks of configs.BWD_GLUON's block_n (hd 128 and 192: 64, hd 256: 32).
SHAPES = (
    ("Llama-3-70B 64/8 4k, dK / dV", "dkdv", 8, 4096, 128, 64, 8),
    ("Llama-3-8B 32/8 4k, dK / dV", "dkdv", 8, 4096, 128, 64, 4),
    ("Llama-3-8B B4 32/8 2k, dK / dV", "dkdv", 32, 2048, 128, 64, 4),
    ("Llama-3-8B 32/8 8k, dK / dV", "dkdv", 8, 8192, 128, 64, 4),
    ("MHA B2 H16 2k, dK / dV", "dkdv", 32, 2048, 128, 64, 1),
    ("MHA B2 H16 4k, dK / dV", "dkdv", 32, 4096, 128, 64, 1),
    ("Gemma-2-9B B2 16/8 4k hd 256, dK / dV", "dkdv", 16, 4096, 64, 64, 2),
    ("DeepSeek-V3 MLA H128 4k 192 / 128, dK / dV", "dkdv", 128, 4096, 128, 32, 1),
    ("Llama-3-70B 64/8 4k, dQ", "dq", 64, 4096, 128, 64, 1),
    ("Llama-3-8B 32/8 4k, dQ", "dq", 32, 4096, 128, 64, 1),
    ("Gemma-2-9B B2 16/8 4k hd 256, dQ", "dq", 32, 4096, 128, 32, 1),
    ("DeepSeek-V3 MLA H128 4k 192 / 128, dQ", "dq", 128, 4096, 128, 64, 1),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132, help="the GPU's SMs, one program each (H100 SXM / H200: 132)")
    ap.add_argument("--overhead", type=float, default=0.0, help="a program's fixed work, in tile steps")
    a = ap.parse_args(argv)
    print("| shape | programs | blocks first | units first |")
    print("|---|---|---|---|")
    for label, kernel, units, seqlen, block, tile, heads in SHAPES:
        cells = [span_over_mean(grid_costs(kernel, units, seqlen, block, tile, heads, first, a.overhead), a.sms)
                 for first in (False, True)]
        programs = units * -(-seqlen // block)
        print(f"| {label} | {programs} | {cells[0]:.2f} | {cells[1]:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
