"""The Gluon FP8 forwards (kernels/flash_attn/fp8_gluon.py; the warp-specialised one runs FP8 hd 256).

Gluon has no interpreter, so on the CPU the kernel is compiled for sm_90a (Triton's bundled ptxas, through
benchmarks/fp8_gluon_ptxas.py):
it must lower its dots to Hopper's wgmma, keep the overlap that was measured (OVERLAP = 1) free of
ptxas's serialisation, and fit the registers the measurements were taken at. On an sm90 GPU (marked
``gpu``) it runs against the FP64 oracle on the dequantised inputs, within 2x the eager FP8
reference's error, as the Triton FP8 forward is held.
"""

from __future__ import annotations

import sys

import pytest
import torch
from sm90_compiles import sm90_reports

from kernels.flash_attn import fp8_gluon

E4M3 = torch.float8_e4m3fn
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.fixture(scope="module")
def compiled():
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    # hd 64 causal at the measured tile (OVERLAP = 1), both overlaps, the warp-specialised hd 256 with
    # bf16 and e4m3 output (one subprocess, four compiles: ~11 s of the CPU suite)
    return sm90_reports(["64,64,128,1,1", "64,64,64,0,3", "ws:256,64,3,1", "ws:256,64,3,1,1"])


@pytest.mark.parametrize("spec, max_regs", [("64,64,128,1,1", 232)])
def test_compiles_to_fp8_wgmma_without_serialisation(compiled, spec, max_regs):
    r = compiled[spec]
    assert r["wgmma"] > 0  # the dots run on Hopper's FP8 tensor cores
    assert not r["serialized"]
    assert 0 < r["regs"] <= max_regs and r["spill"] == 0


def test_the_warp_specialised_kernel_gives_its_consumers_the_registers(compiled):
    """hd 256 (what flash_attn_fp8_func sends to it): a loader warp at 24 registers, the consumer
    warpgroups at 240 and more, no spill, no serialised wgmma, FP8 wgmma in both consumers, and each
    consumer's ping-pong wait that retires S_{j+1} while P_j V_j stays in flight (the schedule measured
    1.05-1.13x the one that waited for both, session 17)."""
    from kernels.flash_attn import configs

    assert set(configs.FP8_GLUON_WS) <= set(fp8_gluon.HEAD_DIMS)
    r = compiled["ws:256,64,3,1"]
    assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 240
    assert r["spill"] == 0 and not r["serialized"] and r["wgmma"] > 0
    assert r["smem"] <= 227 * 1024
    assert r["wait_one_pending"] >= 2  # one per consumer partition


def test_the_fp8_output_variant_compiles_as_the_bf16_one(compiled):
    """e4m3 output (OUT_FP8): the same consumers (registers, wgmmas, ping-pong waits), half the output's
    shared memory."""
    bf16, e4m3 = compiled["ws:256,64,3,1"], compiled["ws:256,64,3,1,1"]
    for key in ("regs", "spill", "wgmma", "serialized", "setmaxnreg", "wait_one_pending"):
        assert e4m3[key] == bf16[key], key
    assert e4m3["smem"] == bf16["smem"] - 2 * 64 * 256  # two consumers' [64, 256] tiles, 1 byte less each


def test_both_overlaps_are_serialised_by_ptxas(compiled):
    """Why OVERLAP = 3 is not the default: ptxas serialises the wgmmas (and it measured slower)."""
    assert compiled["64,64,64,0,3"]["serialized"]


@pytest.mark.parametrize("run", [fp8_gluon.fp8_fwd_gluon, fp8_gluon.fp8_fwd_gluon_ws], ids=["one-wg", "ws"])
@pytest.mark.parametrize("bad, match", [
    (dict(d=96), "head dims"), (dict(hk=3), "multiple"), (dict(block_m=128), "must be 64"),
    (dict(num_stages=2), "at least 3"), (dict(dtype=torch.bfloat16), "float8_e4m3fn"), (dict(), "sm90 GPU")])
def test_refuses_what_it_cannot_run(run, bad, match):
    d, hk = bad.get("d", 64), bad.get("hk", 2)
    dt = bad.get("dtype", E4M3)
    q = torch.randn(1, 16, 4, d).to(dt)
    k = torch.randn(1, 16, hk, d).to(dt)
    vt = torch.randn(1, hk, d, 16).to(dt)
    ds = torch.ones(1, hk)
    kw = {key: bad[key] for key in ("block_m", "num_stages") if key in bad}
    if run is fp8_gluon.fp8_fwd_gluon_ws:
        if "block_m" in kw:
            pytest.skip("the warp-specialised kernel's tile is 128 rows: no block_m")
        kw = {key: 1 if key == "num_stages" else v for key, v in kw.items()}
        match = "at least 2" if match == "at least 3" else match
    with pytest.raises((ValueError, RuntimeError), match=match):
        run(q, k, vt, (ds, ds, ds), softmax_scale=0.1, causal=False, **kw)


@pytest.mark.parametrize("kernel", ["_fp8_fwd_kernel", "_fp8_fwd_ws_kernel"])
def test_launch_arguments_bind_to_the_kernels_parameters(kernel):
    """The wrappers pass the kernels' leading arguments positionally: each lands on its name."""
    import inspect

    q, k = torch.empty(2, 40, 8, 64, dtype=E4M3), torch.empty(2, 56, 2, 64, dtype=E4M3)
    vt = torch.empty(2, 2, 64, 64, dtype=E4M3)[..., :56]
    out, lse = torch.empty(2, 40, 8, 64, dtype=torch.bfloat16), torch.empty(2, 8, 40)
    ds = tuple(torch.full((2, 2), float(i + 1)) for i in range(3))
    args = fp8_gluon._launch_args(q, k, vt, out, lse, ds, 0.25)
    params = list(inspect.signature(getattr(fp8_gluon, kernel).fn).parameters)
    bound = dict(zip(params, args))
    assert bound["QDescale"] is ds[0] and bound["VDescale"] is ds[2] and bound["VT"] is vt and bound["Out"] is out
    assert (bound["stride_vb"], bound["stride_vh"], bound["stride_vd"]) == vt.stride()[:3]
    assert (bound["stride_ob"], bound["stride_os"], bound["stride_oh"]) == out.stride()[:3]
    assert (bound["stride_lb"], bound["stride_lh"]) == lse.stride()[:2]
    assert (bound["seqlen_q"], bound["seqlen_k"], bound["num_heads"], bound["group"], bound["sm_scale"]) == \
        (40, 56, 8, 4, 0.25)
    assert params[len(args)] == "HEAD_DIM"  # nothing positional left over


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon kernel uses Hopper's wgmma and TMA: needs an sm90 GPU")
@pytest.mark.parametrize("case_id", ["B2-H4/2-S45x70-D64-causal-e4m3-bf16", "B1-H4/1-S70x33-D64-causal-e4m3-bf16",
                                     "B2-H4/2-S200x200-D128-e4m3-bf16", "B1-H2-S130x300-D256-causal-e4m3-bf16"])
@pytest.mark.parametrize("overlap", [0, 1, 3, "ws"])
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
    args = (x.q, x.k, v_keys_contiguous(x.v), (x.q_descale, x.k_descale, x.v_descale))
    kw = dict(softmax_scale=scale, causal=c.causal, block_n=64 if c.d == 256 else 128, poison=True)
    if overlap == "ws":
        out, lse = fp8_gluon.fp8_fwd_gluon_ws(*args, **kw)
    else:
        out, lse = fp8_gluon.fp8_fwd_gluon(*args, overlap=overlap, **kw)
    ref, _ = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=c.causal,
                                 softmax_scale=scale, out_dtype=torch.bfloat16)
    assert torch.isfinite(out).all()
    err, ref_err = rel_err(out, orc.out), rel_err(ref, orc.out)
    assert err <= 2 * ref_err, f"out: {err:.3e} against the FP8 reference's {ref_err:.3e}"
    live = torch.isfinite(orc.lse)
    assert torch.equal(lse.isinf(), ~live)  # rows that see no key: lse -inf (and out 0)
    assert (out.transpose(1, 2)[~live] == 0).all()
    assert (lse.double() - orc.lse)[live].abs().max().item() <= 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="the Gluon kernel uses Hopper's wgmma and TMA: needs an sm90 GPU")
def test_fp8_func_sends_what_the_ws_kernel_does_to_it(monkeypatch):
    """With configs.FP8_GLUON_WS listing hd 256 (as it ships), flash_attn_fp8_func runs it on the
    warp-specialised kernel; a window, fp16 out or accumulator promotion stay with the Triton kernel;
    both answers match the oracle."""
    from kernel_checks import rel_err

    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn import configs, flash_attn_fp8_func, interface

    monkeypatch.setattr(configs, "FP8_GLUON_WS", {256: (64, 3)})
    calls = []
    real = interface.fp8_fwd_gluon_ws
    monkeypatch.setattr(interface, "fp8_fwd_gluon_ws", lambda *a, **k: calls.append(1) or real(*a, **k))
    c = case_from_id("B2-H8/2-S301x301-D256-causal-e4m3-bf16")  # a shape no other test calls first
    x = harness_inputs(c, seed=5, device="cuda")
    orc = compute_oracle(c, x)
    ds = (x.q_descale, x.k_descale, x.v_descale)
    out = flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=True)
    assert len(calls) == 1
    triton_out = flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=True, max_num_imprecise_acc=0)
    flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=True, window_size=(64, 0))
    flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=True, out_dtype=torch.float16)
    assert len(calls) == 1
    assert rel_err(out, orc.out) <= 1.1 * rel_err(triton_out, orc.out) + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("case_id", ["B2-H8/2-S301x301-D256-causal-e4m3-o8-bf16", "B1-H4/1-S200x333-D64-e4m3-o8-bf16",
                                     "B2-H4/2-S256x256-D128-causal-e4m3-o8-bf16"])
def test_fp8_output_reads_back_as_the_fp8_output_reference(case_id):
    """out_dtype=float8_e4m3fn through flash_attn_fp8_func (hd 256 on the warp-specialised Gluon kernel,
    64 / 128 on the Triton one): e4m3 values in V's units, poisoned first, read back with v_descale within
    2x the FP8-output reference's error against the oracle; lse bitwise the bf16-output call's."""
    from kernel_checks import rel_err

    from harness import fp8
    from harness.adapters.eager import eager_fp8_attention
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn import configs, flash_attn_fp8_func

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the FP8 kernels' e4m3 output on the device)")
    c = case_from_id(case_id)
    x = harness_inputs(c, seed=6, device="cuda")
    orc = compute_oracle(c, x)
    ds = (x.q_descale, x.k_descale, x.v_descale)
    out, lse = flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=c.causal, out_dtype=E4M3, return_lse=True)
    lse16 = flash_attn_fp8_func(x.q, x.k, x.v, *ds, causal=c.causal, return_lse=True)[1]
    assert out.dtype == E4M3 and torch.equal(lse, lse16)
    read = fp8.read_back(out, x.v_descale, torch.float32)
    assert torch.isfinite(read).all()
    ref, _ = eager_fp8_attention(x.q, x.k, x.v, *ds, causal=c.causal, out_dtype=torch.float32, out_fp8="e4m3")
    err, ref_err = rel_err(read, orc.out), rel_err(ref, orc.out)
    assert err <= 2 * ref_err, f"out: {err:.3e} against the FP8-output reference's {ref_err:.3e}"
    if SM90 and c.d in configs.FP8_GLUON_WS:  # the Gluon kernel's output, poisoned before its run
        from kernels.flash_attn.v_layout import v_keys_contiguous

        bn, stages = configs.FP8_GLUON_WS[c.d]
        raw, _ = fp8_gluon.fp8_fwd_gluon_ws(x.q, x.k, v_keys_contiguous(x.v), ds, softmax_scale=c.d ** -0.5,
                                            causal=c.causal, block_n=bn, num_stages=stages, poison=True,
                                            out_dtype=E4M3)
        assert torch.equal(raw.view(torch.uint8), out.view(torch.uint8))
