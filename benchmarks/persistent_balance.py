"""How evenly the persistent Gluon forward's static round-robin (tile t to program t mod the grid) spreads causal
work, per tile order (kernels/flash_attn/fp8_gluon.py ``_p_coords``, ``TILE_ORDERS``): a model, no GPU.

    python benchmarks/persistent_balance.py [--programs 132] [--overhead 1.5]

The model is ``fp8_gluon.persistent_balance`` (the route asks it too: configs.FWD_PERSISTENT_BALANCE_MARGIN): a
tile's cost is the key blocks it reads (causal: its query block's position, heaviest first) plus ``--overhead``
blocks of per-tile work (prologue, epilogue). Printed per shape and order: mean program load / the largest (1.00:
every program finishes together; the kernel's time follows the largest load). Session 31 read the measured kv-head
order at MHA causal 16k at 0.72-0.79x the one-program-a-tile kernel where this model gives it 0.64 against the
query-block order's 0.94; the model is the prediction for the snaking order, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.flash_attn.fp8_gluon import TILE_ORDERS, persistent_balance  # noqa: E402

#: (label, batch, query heads, kv heads, tokens): the FA sweep's causal hd 128 cells and real models' (probe shapes)
SHAPES = (("sweep S512", 32, 16, 16, 512), ("sweep S1k", 16, 16, 16, 1024), ("sweep S4k", 4, 16, 16, 4096),
          ("sweep S16k", 1, 16, 16, 16384), ("Llama-3-8B S8k", 1, 32, 8, 8192), ("Llama-3-70B S4k", 1, 64, 8, 4096),
          ("MQA 32/1 B2 S4k", 2, 32, 1, 4096), ("Llama-3-8B B4 S2k", 4, 32, 8, 2048),
          ("Llama-3-8B B2 S2k", 2, 32, 8, 2048))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=132, help="the grid (the H100 SXM's 132 SMs)")
    ap.add_argument("--overhead", type=float, default=1.5, help="a tile's fixed work, in key blocks")
    a = ap.parse_args(argv)
    orders = TILE_ORDERS
    print("| shape | " + " | ".join(orders) + " |")
    print("|---|" + "---|" * len(orders))
    for label, b, h, hk, s in SHAPES:
        cells = (f"{persistent_balance(o, b, h, hk, s, s, a.programs, overhead=a.overhead):.2f}" for o in orders)
        print(f"| {label} causal | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
