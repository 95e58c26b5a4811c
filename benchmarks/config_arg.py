"""The `--try BM,BN,WARPS,STAGES,T|P` argument the kernel-config scripts share (fp8_configs.py,
fp8_causal_probe.py, flash_attn_ptxas.py). No imports of the project: a script that runs an older
tree's kernels (PYTHONPATH=that tree) can use it without putting this tree on the path."""

from __future__ import annotations


def parse_config(text: str) -> tuple:
    """'128,64,8,3,T' -> (128, 64, 8, 3, True): BLOCK_M, BLOCK_N, warps, stages, TMA (T) or pointers (P)."""
    parts = text.split(",")
    if len(parts) != 5 or parts[4] not in ("T", "P") or not all(x.isdigit() for x in parts[:4]):
        raise ValueError(f"expected BM,BN,WARPS,STAGES,T|P, got {text!r}")
    return (*map(int, parts[:4]), parts[4] == "T")
