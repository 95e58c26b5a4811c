"""How evenly the persistent Gluon forward's static round-robin (tile t to program t mod the grid) spreads causal
work, per tile order (kernels/flash_attn/fp8_gluon.py ``_p_coords``, ``TILE_ORDERS``): a model, no GPU.

    python benchmarks/persistent_balance.py [--programs 132] [--overhead 1.5]

A tile's cost is the key blocks it reads (causal: its query block's position, heaviest first) plus ``--overhead``
blocks of per-tile work (prologue, epilogue). Printed per shape and order: mean program load / the largest (1.00:
every program finishes together; the kernel's time follows the largest load). Session 31 read the measured kv-head
order at MHA causal 16k at 0.72-0.79x the one-program-a-tile kernel where this model gives it 0.64 against the
query-block order's 0.94; the model is the prediction for the snaking order, not a measurement.
"""

from __future__ import annotations

import argparse

#: (label, batch, query heads, kv heads, tokens): the FA sweep's causal hd 128 cells and real models' (probe shapes)
SHAPES = (("sweep S512", 32, 16, 16, 512), ("sweep S1k", 16, 16, 16, 1024), ("sweep S4k", 4, 16, 16, 4096),
          ("sweep S16k", 1, 16, 16, 16384), ("Llama-3-8B S8k", 1, 32, 8, 8192), ("Llama-3-70B S4k", 1, 64, 8, 4096),
          ("MQA 32/1 B2 S4k", 2, 32, 1, 4096))


def tile_blocks(order: str, batch: int, heads: int, kv_heads: int, n_m: int) -> list[int]:
    """Each tile's query block index (0: the first, lightest causal block) in the kernel's tile order."""
    group = heads // kv_heads
    blocks = []
    for t in range(batch * heads * n_m):
        if order == "query":
            pid_m = t // (batch * heads)
        else:
            unit, r = divmod(t, n_m * group)
            pid_m = r // group
            if order == "kv-snake" and unit % 2:
                pid_m = n_m - 1 - pid_m
        blocks.append(n_m - 1 - pid_m)  # causal: the heaviest first
    return blocks


def balance(order: str, batch: int, heads: int, kv_heads: int, tokens: int, programs: int, overhead: float) -> float:
    n_m = -(-tokens // 128)
    load = [0.0] * min(programs, batch * heads * n_m)
    for t, m in enumerate(tile_blocks(order, batch, heads, kv_heads, n_m)):
        load[t % len(load)] += m + 1 + overhead
    return sum(load) / len(load) / max(load)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=132, help="the grid (the H100 SXM's 132 SMs)")
    ap.add_argument("--overhead", type=float, default=1.5, help="a tile's fixed work, in key blocks")
    a = ap.parse_args(argv)
    orders = ("query", "kv", "kv-snake")
    print("| shape | " + " | ".join(orders) + " |")
    print("|---|" + "---|" * len(orders))
    for label, b, h, hk, s in SHAPES:
        cells = (f"{balance(o, b, h, hk, s, a.programs, a.overhead):.2f}" for o in orders)
        print(f"| {label} causal | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
