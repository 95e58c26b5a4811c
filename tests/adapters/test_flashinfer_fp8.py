"""The flashinfer FP8 adapter's plumbing on the CPU, against a stand-in for flashinfer's ragged wrapper: the
plan it makes (indptrs, heads, head dims, mask, softmax scale, dtypes), the per-head scales it passes
(flashinfer multiplies: real = FP8 value x scale), the ragged views, the lse's base and layout, one plan
per shape, and what it refuses. The stand-in runs the eager FP8 reference per sequence with the scales
it was given, so a wrong scale, view or mask in the adapter shows as a wrong output. flashinfer itself
runs on the GPU only (benchmarks/device_show.sh flashinfer-fp8)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.adapters import flashinfer_fp8 as F
from harness.adapters.eager import eager_fp8_attention
from harness.cases import case_from_id, make_softmax_inputs


class _Wrapper:
    made: list = []

    def __init__(self, workspace, layout, backend):
        assert layout == "NHD" and backend == "fa3" and workspace.dtype == torch.uint8
        self.plans = []
        _Wrapper.made.append(self)

    def plan(self, qo_indptr, kv_indptr, hq, hk, d, head_dim_vo, causal, sm_scale, q_data_type, kv_data_type,
             o_data_type):
        assert q_data_type == kv_data_type == torch.float8_e4m3fn and head_dim_vo == d
        self.plans.append(dict(qo=qo_indptr.tolist(), kv=kv_indptr.tolist(), hq=hq, hk=hk, d=d, causal=causal,
                               scale=sm_scale, out=o_data_type))

    def run(self, q, k, v, scale_q, scale_k, scale_v, return_lse=False, lse_base="log2"):
        p = self.plans[-1]
        assert q.shape == (p["qo"][-1], p["hq"], p["d"]) and k.shape == (p["kv"][-1], p["hk"], p["d"])
        assert scale_q.shape == (p["hq"],) and scale_k.shape == scale_v.shape == (p["hk"],)
        g = p["hq"] // p["hk"]
        outs, lses = [], []
        for b in range(len(p["qo"]) - 1):  # each sequence alone, with the per-head scales as given
            qs, ks = slice(p["qo"][b], p["qo"][b + 1]), slice(p["kv"][b], p["kv"][b + 1])
            per_q = scale_q.view(p["hk"], g)
            assert torch.equal(per_q, per_q[:, :1].expand_as(per_q))  # one q factor per kv head's group
            o, lse = eager_fp8_attention(q[None, qs], k[None, ks], v[None, ks], per_q[:, 0][None], scale_k[None],
                                         scale_v[None], causal=p["causal"], softmax_scale=p["scale"],
                                         out_dtype=p["out"])
            outs.append(o[0])
            lses.append(lse[0].transpose(0, 1))  # (S, Hq): flashinfer's "NH" layout
        out, lse = torch.cat(outs), torch.cat(lses)
        if lse_base == "log2":
            lse = lse / math.log(2)
        return (out, lse) if return_lse else out


@pytest.fixture
def fake(monkeypatch):
    _Wrapper.made = []
    F._planned.cache_clear()
    F._SCALES.clear()
    monkeypatch.setattr(F, "_wrapper_class", lambda: (_Wrapper, None))
    monkeypatch.setattr(F, "_workspace", lambda device: torch.empty(16, dtype=torch.uint8))  # no CUDA here
    yield _Wrapper.made
    F._planned.cache_clear()


def _inputs(case, seed=0):
    """The harness's own FP8 inputs of ``case`` (drawn in fp32, quantised by harness.fp8), as keywords."""
    x = make_softmax_inputs(case, seed)
    return dict(q=x.q, k=x.k, v=x.v, q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale)


@pytest.mark.parametrize("case_id", ["B2-H4/2-S19x37-D64-causal-e4m3-bf16", "B3-H4-S24x24-D64-e4m3-fp16",
                                     "B1-H4/1-S16x16-D64-scale0.5-e4m3-bf16",
                                     "B1-H4/2-S24x24-D64-causal-e4m3-perhead-bf16"])
def test_the_planned_call_computes_the_fp8_contract(fake, case_id):
    case = case_from_id(case_id)
    x = _inputs(case)
    got = F.FlashinferFP8().run(case, **x)
    scale = case.scale if case.scale is not None else 1 / math.sqrt(case.d)
    want, lse = eager_fp8_attention(x["q"], x["k"], x["v"], x["q_descale"], x["k_descale"], x["v_descale"],
                                    causal=case.causal, softmax_scale=scale, out_dtype=case.torch_dtype)
    assert got.out.shape == want.shape and torch.equal(got.out, want)
    assert got.lse.shape == lse.shape and torch.allclose(got.lse, lse, rtol=0, atol=1e-6)  # natural log
    plan = fake[0].plans[0]
    rows = list(range(case.batch + 1))
    assert plan["qo"] == [r * case.seqlen_q for r in rows] and plan["kv"] == [r * case.seqlen_k for r in rows]
    assert (plan["hq"], plan["hk"], plan["causal"], plan["scale"], plan["out"]) == (
        case.heads_q, case.heads_k, case.causal, scale, case.torch_dtype)


def test_a_wrong_scale_shows(fake, monkeypatch):
    """The stand-in is strict enough to catch the mistake the adapter guards against: flashinfer's scales
    taken as 1 / descale (the other convention) give another output."""
    case = case_from_id("B2-H4/2-S19x37-D64-causal-e4m3-bf16")
    x = _inputs(case)
    right = F.FlashinferFP8().run(case, **x).out
    real = F.head_scales
    monkeypatch.setattr(F, "head_scales", lambda q, k, v, g: tuple(1 / t for t in real(q, k, v, g)))
    F._SCALES.clear()
    assert not torch.allclose(F.FlashinferFP8().run(case, **x).out.float(), right.float(), rtol=0.1, atol=0.1)


def test_one_plan_per_shape_and_scales_made_once(fake):
    case = case_from_id("B2-H4/2-S19x37-D64-causal-e4m3-bf16")
    adapter = F.FlashinferFP8()
    x = _inputs(case, 0)
    adapter.run(case, **x)
    first = F.head_scales(x["q_descale"], x["k_descale"], x["v_descale"], 2)
    adapter.run(case, **x)
    assert len(fake) == 1 and F.head_scales(x["q_descale"], x["k_descale"], x["v_descale"], 2) is first
    x["k_descale"].mul_(2.0)  # changed in place: made again
    again = F.head_scales(x["q_descale"], x["k_descale"], x["v_descale"], 2)
    assert again is not first and torch.equal(again[1], x["k_descale"][0])
    other = case_from_id("B2-H4/2-S20x37-D64-causal-e4m3-bf16")
    adapter.run(other, **_inputs(other))
    assert len(fake) == 2


def test_what_it_refuses(fake, monkeypatch):
    adapter, cuda = F.FlashinferFP8(), torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ok = "B1-H4/2-S40x40-D64-e4m3-bf16"
    assert adapter.supports(case_from_id(ok), cuda) is None
    assert adapter.supports(case_from_id("B1-H4/2-S40x40-D64-causal-e4m3-perhead-bf16"), cuda) is None
    for case_id, words in [("B2-H4/2-S40x40-D64-causal-e4m3-perhead-bf16", "per (sequence, head)"),
                           ("B1-H4/2-S40x40-D64-cap30-e4m3-bf16", "soft cap"),
                           ("B1-H4/2-S40x40-D64-win8x0-e4m3-bf16", "sliding window"),
                           ("B1-H4/2-S40x40-D32-e4m3-bf16", "head dims 64, 128, 256"),
                           ("B1-H4/2-S40x40-D64v32-e4m3-bf16", "equal q/k and v head dims"),
                           ("B1-H4/2-S40x40-D64-e4m3-o8-bf16", "FP8 output"),
                           ("B1-H4/2-S40x40-D64-e4m3-grad_e4m3-bf16", "no FP8 backward"),
                           ("B1-H4/2-S40x40-D64-bf16", "FP8 cases")]:
        assert words in adapter.supports(case_from_id(case_id), cuda), case_id
    assert "needs CUDA" in adapter.supports(case_from_id(ok), torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert "sm90" in adapter.supports(case_from_id(ok), cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(F, "_wrapper_class", lambda: (None, "flashinfer-python not installed (x)"))
    assert "not installed" in adapter.supports(case_from_id(ok), cuda)


def test_the_accept_shim_is_the_adapters_call(fake):
    """harness.accept.shims:flashinfer_fp8 (flash-attn 3's FP8 signature, for `harness accept`) gives the
    adapter's output; what flashinfer cannot express is NotImplementedError (accept's "unsupported"):
    windows, softcap, descales that differ between the sequences of a batch."""
    from harness.accept import shims

    case = case_from_id("B2-H4/2-S19x37-D64-causal-e4m3-bf16")
    x = _inputs(case)
    want = F.FlashinferFP8().run(case, **x).out
    got = shims.flashinfer_fp8(**x, causal=True)
    assert torch.equal(got, want)
    with pytest.raises(NotImplementedError, match="sliding window"):
        shims.flashinfer_fp8(**x, causal=True, window_size=(8, 0))
    with pytest.raises(NotImplementedError, match="soft cap"):
        shims.flashinfer_fp8(**x, softcap=30.0)
    per_head = case_from_id("B2-H4/2-S24x24-D64-causal-e4m3-perhead-bf16")
    with pytest.raises(NotImplementedError, match="differ between sequences"):
        shims.flashinfer_fp8(**_inputs(per_head), causal=True)
