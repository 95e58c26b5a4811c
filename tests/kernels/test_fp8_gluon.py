"""The experimental Gluon FP8 forward (kernels/flash_attn/fp8_gluon.py).

Gluon has no interpreter, so on the CPU the kernel is compiled for sm_90a (Triton's bundled ptxas, through
benchmarks/fp8_gluon_ptxas.py):
it must lower its dots to Hopper's wgmma, keep the overlap that was measured (OVERLAP = 1) free of
ptxas's serialisation, and fit the registers the measurements were taken at. On an sm90 GPU (marked
``gpu``) it runs against the FP64 oracle on the dequantised inputs, within 2x the eager FP8
reference's error, as the Triton FP8 forward is held.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.flash_attn import fp8_gluon

E4M3 = torch.float8_e4m3fn
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _compile_sm90a(*specs: str) -> dict:
    """{spec: report} from benchmarks/fp8_gluon_ptxas.py, run in its own process: this suite runs
    Triton under its interpreter on a machine without a GPU, which the Gluon compiler cannot use."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0")
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "fp8_gluon_ptxas.py"), "--json", *specs],
                         capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return {r["spec"]: r for r in map(json.loads, run.stdout.splitlines())}


@pytest.fixture(scope="module")
def compiled():
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    # hd 64 causal at the measured tile, hd 256 at its best tile (both OVERLAP = 1); both overlaps
    return _compile_sm90a("64,64,128,1,1", "256,64,64,0,1", "64,64,64,0,3")


@pytest.mark.parametrize("spec, max_regs", [("64,64,128,1,1", 232), ("256,64,64,0,1", 240)])
def test_compiles_to_fp8_wgmma_without_serialisation(compiled, spec, max_regs):
    r = compiled[spec]
    assert r["wgmma"] > 0  # the dots run on Hopper's FP8 tensor cores
    assert not r["serialized"]
    assert 0 < r["regs"] <= max_regs and r["spill"] == 0


def test_both_overlaps_are_serialised_by_ptxas(compiled):
    """Why OVERLAP = 3 is not the default: ptxas serialises the wgmmas (and it measured slower)."""
    assert compiled["64,64,64,0,3"]["serialized"]


@pytest.mark.parametrize("bad, match", [
    (dict(d=96), "head dims"), (dict(hk=3), "multiple"), (dict(block_m=128), "must be 64"),
    (dict(num_stages=2), "at least 3"), (dict(dtype=torch.bfloat16), "float8_e4m3fn"), (dict(), "sm90 GPU")])
def test_refuses_what_it_cannot_run(bad, match):
    d, hk = bad.get("d", 64), bad.get("hk", 2)
    dt = bad.get("dtype", E4M3)
    q = torch.randn(1, 16, 4, d).to(dt)
    k = torch.randn(1, 16, hk, d).to(dt)
    vt = torch.randn(1, hk, d, 16).to(dt)
    ds = torch.ones(1, hk)
    kw = {key: bad[key] for key in ("block_m", "num_stages") if key in bad}
    with pytest.raises((ValueError, RuntimeError), match=match):
        fp8_gluon.fp8_fwd_gluon(q, k, vt, (ds, ds, ds), softmax_scale=0.1, causal=False, **kw)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon kernel uses Hopper's wgmma and TMA: needs an sm90 GPU")
@pytest.mark.parametrize("case_id", ["B2-H4/2-S45x70-D64-causal-e4m3-bf16", "B1-H4/1-S70x33-D64-causal-e4m3-bf16",
                                     "B2-H4/2-S200x200-D128-e4m3-bf16", "B1-H2-S130x300-D256-causal-e4m3-bf16"])
@pytest.mark.parametrize("overlap", [0, 1, 3])
def test_matches_the_oracle_on_the_gpu(case_id, overlap):
    from kernel_checks import rel_err

    from harness.adapters.eager import eager_fp8_attention
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn.v_layout import v_keys_contiguous

    c = case_from_id(case_id)
    x = harness_inputs(c, seed=3, device="cuda")
    orc = compute_oracle(c, x)
    scale = c.scale if c.scale is not None else c.d ** -0.5
    out, lse = fp8_gluon.fp8_fwd_gluon(x.q, x.k, v_keys_contiguous(x.v), (x.q_descale, x.k_descale, x.v_descale),
                                       softmax_scale=scale, causal=c.causal, block_n=64 if c.d == 256 else 128,
                                       overlap=overlap, poison=True)
    ref, _ = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=c.causal,
                                 softmax_scale=scale, out_dtype=torch.bfloat16)
    assert torch.isfinite(out).all()
    err, ref_err = rel_err(out, orc.out), rel_err(ref, orc.out)
    assert err <= 2 * ref_err, f"out: {err:.3e} against the FP8 reference's {ref_err:.3e}"
    live = torch.isfinite(orc.lse)
    assert torch.equal(lse.isinf(), ~live)  # rows that see no key: lse -inf (and out 0)
    assert (out.transpose(1, 2)[~live] == 0).all()
    assert (lse.double() - orc.lse)[live].abs().max().item() <= 2e-2
