"""The FP8 forward's hot loops as Hopper runs them, checked in the sm_90a SASS on the CPU (session 24).

The FP8 P V dot takes P from registers. With V's keys in the MMA order (v_layout) the kernel relabels P's
columns instead of moving them, which Triton must lower to nothing: the unmasked key loop keeps only the
row max / sum shuffles (8 per block) and no byte permutes, where P in key order takes 16 SHFL.IDX and 16
PRMT more. The causal diagonal runs in 64-key blocks at hd 64 (configs.fwd_narrow_diagonal), and the kernel's
first config stays within the 128 registers and the shared memory that let four programs share an SM. Compiled
through benchmarks/flash_attn_ptxas.py (Triton's bundled ptxas and nvdisasm) in a process of its own: this
suite runs Triton under its interpreter. A Triton upgrade that brings the shuffles back fails here before
any GPU run. The FP8 backward's dots that take dS, dS^T and P^T from registers get the same treatment from
copies of Q, K and dO in the MMA order (configs.FP8_BWD_MMA_ORDER).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _compile(*extra: str, forward: bool = True) -> dict:
    """{kernel name: its report} of benchmarks/flash_attn_ptxas.py --json on the FA sweep's hd 64 causal shape:
    the FP8 forward, or (forward=False) the FP8 backward's dQ and dK/dV kernels."""
    root = Path(__file__).resolve().parents[2]
    which = ["--fp8", "--kernels", "fwd"] if forward else ["--fp8-bwd", "e4m3", "--kernels", "dq", "dkdv"]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "flash_attn_ptxas.py"), "--shape", "4,4096,32,64",
                          "--causal", "--top", "1", "--json", *which, *extra],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), cwd=root,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return {r["kernel"]: r for r in map(json.loads, run.stdout.splitlines())}


def _innermost(report: dict) -> list[dict]:
    """The loops that hold no other loop: the forward's key loops (per 64 x 128 or 64 x 64 block)."""
    loops = report["loops"]
    return [x for x in loops if not any(y is not x and x["start"] <= y["start"] and y["end"] <= x["end"]
                                        for y in loops)]


@pytest.fixture(scope="module")
def reports():
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas and nvdisasm are Linux binaries")
    # ~13 s of the CPU suite: the forward both ways, the backward in the MMA order
    return {"mma": _compile()["fwd"], "keys": _compile("--key-order")["fwd"],
            "bwd-mma": _compile("--mma-order", forward=False)}


def test_p_in_the_mma_order_costs_no_shuffle(reports):
    unmasked = [x for x in _innermost(reports["mma"]) if not x["ops"].get("FSEL")]
    assert len(unmasked) == 1 and unmasked[0]["ops"]["MUFU"] == 66  # 64 exponentials of P + 2 rescales a block
    ops = unmasked[0]["ops"]
    assert ops.get("SHFL", 0) <= 8 and not ops.get("PRMT"), ops  # the row max and sum only
    keys = [x for x in _innermost(reports["keys"]) if not x["ops"].get("FSEL")][0]["ops"]
    assert keys["SHFL"] >= ops.get("SHFL", 0) + 16 and keys["PRMT"] >= 16, keys  # what the relabelling saves


def test_the_causal_diagonal_runs_in_64_key_blocks_within_four_programs_an_sm(reports):
    r = reports["mma"]
    assert r["config"][:2] == [64, 128] and r["wgmma"] > 0
    masked = [x["ops"]["MUFU"] for x in _innermost(r) if x["ops"].get("FSEL")]
    assert 34 in masked and max(masked) < 66, masked  # 64 x 64 blocks (32 exponentials + 2 rescales), no 64 x 128 one
    # the first config is the four-programs one (configs._FP8_FOUR_AN_SM): 65536 registers / (4 programs x 128
    # threads) and 4 x (its shared memory + the 1 KB the SM keeps per program) within the H100's 228 KB; what ptxas
    # spills under the cap (12 B in session 25's compile) stays out of the unmasked key loop, where the time goes,
    # and the masked loops only reload it (3 LDL a block then)
    assert r["maxnreg"] == 128 and r["config"][3] == 2 and r["regs"] <= 128
    assert 4 * (r["smem"] + 1024) <= 228 * 1024, r["smem"]
    inner = _innermost(r)
    assert r["spill"] <= 64 and not any(x["ops"].get("STL") for x in inner), r["spill"]
    assert all(x["ops"].get("LDL", 0) <= (0 if not x["ops"].get("FSEL") else 4) for x in inner), inner


def test_the_fp8_backward_in_the_mma_order_costs_no_shuffle(reports):
    """configs.FP8_BWD_MMA_ORDER (on since session 25's H100 timing, 4-11% faster): the copies of Q, K and dO in the MMA order
    take every shuffle and byte permute out of the dQ and dK / dV loops (in sequence order the dK / dV loops
    carry 32 SHFL and 32-33 PRMT a block, the dQ loops 8 and 8: session 24's compile)."""
    for name in ("dq", "dkdv"):
        r = reports["bwd-mma"][name]
        assert r["wgmma"] > 0 and r["spill"] == 0, name
        for loop in _innermost(r):
            assert not loop["ops"].get("SHFL") and loop["ops"].get("PRMT", 0) <= 1, (name, loop["ops"])


def test_desc_cost_probe_makes_a_descriptor_per_tile_where_it_says():
    """benchmarks/desc_cost_probe.py prices the forward's device-side descriptors by one kernel that makes one and
    another that makes one per tile: the compiler must keep every one (an earlier "make them twice" attempt was
    folded away). sm_90a compile in a process of its own, as _compile."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "desc_cost_probe.py"), "--compile"],
                         capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0"), cwd=root,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in run.stdout.splitlines() if line.startswith("| one") or line.startswith("| each")}
    assert rows == {"one": ["1", "6"], "each": ["6", "6"]}


def test_desc_cost_probe_kernels_sum_the_same_tiles(capsys):
    """Under the interpreter (this suite's Triton): the two kernels' sums agree, so their time difference is the
    descriptors' alone."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import desc_cost_probe
    finally:
        sys.path.pop(0)
    assert desc_cost_probe.main(["--check", "--programs", "16", "--seqlen", "128"]) == 0
    assert "sums agree" in capsys.readouterr().out
