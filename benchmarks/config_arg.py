"""The `--try BM,BN,WARPS,STAGES,T|P` argument the kernel-config scripts share (fp8_configs.py, fp8_causal_probe.py,
flash_attn_ptxas.py, fp8_bwd_configs.py, bf16_bwd_tiles.py), and the backward's tiles pinned from two of them; the
Gluon probes' `--shapes B,S,HQ,HK` (gluon_bwd_probe.py, gluon_ws_probe.py). No imports of the project: a script that
runs an older tree's kernels (PYTHONPATH=that tree) can use it without putting this tree on the path."""

from __future__ import annotations


def parse_config(text: str) -> tuple:
    """'128,64,8,3,T' -> (128, 64, 8, 3, True): BLOCK_M, BLOCK_N, warps, stages, TMA (T) or pointers (P)."""
    parts = text.split(",")
    if len(parts) != 5 or parts[4] not in ("T", "P") or not all(x.isdigit() for x in parts[:4]):
        raise ValueError(f"expected BM,BN,WARPS,STAGES,T|P, got {text!r}")
    return (*map(int, parts[:4]), parts[4] == "T")


def parse_shape(spec: str) -> tuple[int, int, int, int]:
    """B,S,HQ,HK -> (batch, seqlen, query heads, kv heads); query heads a multiple of kv heads (SystemExit else)."""
    parts = spec.split(",")
    if len(parts) != 4 or not all(x.isdigit() and int(x) > 0 for x in parts) or int(parts[2]) % int(parts[3]):
        raise SystemExit(f"shape {spec}: want B,S,HQ,HK (positive; HQ a multiple of HK)")
    return tuple(int(x) for x in parts)


def pinned_backward(configs, dq: str, dkdv: str):
    """A stand-in for ``configs.prune_bwd`` (kernels.flash_attn.configs, passed in) that gives the dQ kernel
    the ``dq`` tile and the dK/dV kernel the ``dkdv`` tile, past the shared-memory filter (a tile that does not
    fit fails to launch): assign it to ``configs.prune_bwd`` and put the real one back after."""
    picks = {False: configs._cfg(*parse_config(dq)), True: configs._cfg(*parse_config(dkdv))}
    return lambda space, named, **kwargs: [picks[kwargs["RESIDENT_N"]]]


def time_pinned_pairs(configs, pairs, row, lead: str, blanks: int) -> None:
    """``row(dq, dkdv)`` for each (dq, dkdv) tile pair, pinned by :func:`pinned_backward` (the real
    ``configs.prune_bwd`` back after); a pair that does not compile or fit prints its table row as
    ``| lead | dq | dkdv | failed: ... |`` and ``blanks`` empty cells, and the next pair runs."""
    real = configs.prune_bwd
    try:
        for dq, dkdv in pairs:
            configs.prune_bwd = pinned_backward(configs, dq, dkdv)
            try:
                row(dq, dkdv)
            except Exception as e:  # noqa: BLE001 - a pair that does not compile or fit: say so
                print(f"| {lead} | {dq} | {dkdv} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} |"
                      + " |" * blanks, flush=True)
    finally:
        configs.prune_bwd = real
