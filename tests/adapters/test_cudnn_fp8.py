"""The cuDNN FP8 adapter's plumbing on the CPU, against a stand-in for the frontend module: the graph
it declares (strides in cuDNN's (B, H, S, D) order, per-tensor descales, P's scale, bottom-right
masks, the softmax scale when the case leaves it to the callee), one graph per shape, and what it
refuses. The stand-in executes the declared graph with the eager FP8 reference, so a wrong stride,
factor or mask in the adapter shows as a wrong output. cuDNN itself runs on the GPU only
(benchmarks/device_show.sh cudnn-fp8)."""

from __future__ import annotations

import math
import types

import pytest
import torch

from harness import fp8
from harness.adapters import cudnn_fp8 as C
from harness.adapters.eager import eager_fp8_attention, eager_fp8_attention_backward
from harness.cases import case_from_id, make_softmax_inputs


class _T:
    def __init__(self, **kw):
        self.kw = kw

    def __getattr__(self, name):  # set_uid, set_output, set_dim, set_stride, set_data_type: chainable
        if name.startswith("set_"):
            return lambda *a: self
        raise AttributeError(name)


def _fake_cudnn(built: list):
    enum = types.SimpleNamespace
    mod = types.ModuleType("cudnn")
    mod.data_type = enum(FLOAT="f32", FP8_E4M3="e4m3", FP8_E5M2="e5m2", BFLOAT16="bf16", HALF="f16")
    mod.diagonal_alignment = enum(BOTTOM_RIGHT="bottom_right", TOP_LEFT="top_left")
    mod.heur_mode = enum(A="A", FALLBACK="FALLBACK")
    mod.create_handle = lambda: "handle"
    mod.set_stream = lambda handle, stream: None

    class Graph:
        def __init__(self, **kw):
            self.tensors, self.kw, self.backward = {}, None, False
            built.append(self)

        def tensor(self, uid, dim, stride, data_type):
            self.tensors[uid] = (tuple(dim), tuple(stride))
            return _T(uid=uid)

        def sdpa_fp8(self, **kw):
            self.kw = kw
            return _T(), _T(), _T(), _T()

        def sdpa_fp8_backward(self, **kw):
            self.kw, self.backward = kw, True
            return tuple(_T() for _ in range(7))

        def __getattr__(self, name):  # validate, build_operation_graph, ...: no-ops
            if name == "get_workspace_size":
                return lambda: 0
            return lambda *a, **k: None

        def execute(self, pack, workspace, handle=None):
            if self.backward:
                return self.execute_backward(pack)
            G = C._Graph
            q, k, v = pack[G.Q], pack[G.K], pack[G.V]
            for uid, t in ((G.Q, q), (G.K, k), (G.V, v)):  # the declared strides are the tensors' own
                assert self.tensors[uid] == C._bhsd(t), uid
            assert float(pack[G.SS]) == C.P_SCALE and float(pack[G.DS]) == pytest.approx(1 / C.P_SCALE)
            fp8_out = pack[G.O].dtype == torch.float8_e4m3fn
            assert float(pack[G.SO]) == (pytest.approx(1 / float(pack[G.DV])) if fp8_out else 1.0)
            left, right = self.kw.get("left_bound", 0) - 1, self.kw.get("right_bound", -1)  # left_bound: a length
            if left >= 0 or right >= 0:  # bottom-right as flash-attn's; top-left is the same band when Sq == Sk
                assert self.kw["diagonal_alignment"] == ("top_left" if q.shape[1] == k.shape[1] else "bottom_right")
            B, Hk = q.shape[0], k.shape[2]
            per = [pack[uid].reshape(()).expand(B, Hk) for uid in (G.DQ, G.DK, G.DV)]
            out, lse = eager_fp8_attention(q, k, v, *per, softmax_scale=self.kw["attn_scale"],
                                           window_size=(left, right), out_dtype=torch.float32)
            if fp8_out:  # written in e4m3 with the graph's output scale
                out = (out * pack[G.SO].reshape(())).clamp(-448, 448)
            pack[G.O].copy_(out.to(pack[G.O].dtype))
            pack[G.STATS].copy_(lse[..., None])

        def execute_backward(self, pack):
            G = C._BwdGraph
            q, k, v, o, do = (pack[u] for u in (G.Q, G.K, G.V, G.O, G.DO))
            for uid, t in ((G.Q, q), (G.K, k), (G.V, v), (G.O, o), (G.DO, do)):
                assert self.tensors[uid] == C._bhsd(t), uid
            assert float(pack[G.SCALE_S]) == C.P_SCALE and float(pack[G.DESC_S]) == pytest.approx(1 / C.P_SCALE)
            B, Hk = q.shape[0], k.shape[2]

            def one(uid, inverse=False):
                t = pack[uid].reshape(()).expand(B, Hk)
                return 1 / t if inverse else t

            assert float(pack[G.SCALE_DP]) == pytest.approx(1 / float(pack[G.DESC_DP]))
            left, right = self.kw.get("left_bound", 0) - 1, self.kw.get("right_bound", -1)  # left_bound: a length
            out = fp8.dequantize(o, one(G.DESC_O), dtype=torch.float32)
            fmt = "e5m2" if do.dtype == torch.float8_e5m2 else "e4m3"
            grads = eager_fp8_attention_backward(
                q, k, v, one(G.DESC_Q), one(G.DESC_K), one(G.DESC_V), out, pack[G.STATS][..., 0], do, one(G.DESC_DO),
                one(G.DESC_DP), one(G.SCALE_DQ, True), one(G.SCALE_DK, True), one(G.SCALE_DV, True),
                softmax_scale=self.kw["attn_scale"], window_size=(left, right), grad_fmt=fmt)
            for uid, scale, g in zip((G.DQ, G.DK, G.DV), (G.SCALE_DQ, G.SCALE_DK, G.SCALE_DV), grads):
                pack[uid].copy_((g * pack[scale].reshape(())).to(pack[uid].dtype))

    mod.pygraph = Graph
    return mod


@pytest.fixture
def fake(monkeypatch):
    built: list = []
    mod = _fake_cudnn(built)
    monkeypatch.setattr(C, "_cudnn", lambda: (mod, None))
    monkeypatch.setattr(C, "_handle", lambda index: "handle")
    monkeypatch.setattr(C, "_stream", lambda device: 0)
    C._graph.cache_clear()
    C._bwd_graph.cache_clear()
    yield built
    C._graph.cache_clear()
    C._bwd_graph.cache_clear()


def _inputs(case, seed=0):
    """The harness's own FP8 inputs of ``case`` (drawn in fp32, quantised by harness.fp8), as keywords."""
    x = make_softmax_inputs(case, seed)
    return dict(q=x.q, k=x.k, v=x.v, q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale)


@pytest.mark.parametrize("case_id", ["B2-H4/2-S19x37-D32-causal-e4m3-bf16", "B1-H2-S24x24-D32v16-win4x2-e4m3-fp16",
                                     "B1-H4/1-S16x16-D32-scale0.5-e4m3-bf16", "B2-H4/2-S19x37-D32-causal-e4m3-o8-bf16",
                                     "B2-H4/2-S40x40-D32-causal-e4m3-o8-bf16"])
def test_the_declared_graph_computes_the_fp8_contract(fake, case_id):
    case = case_from_id(case_id)
    x = _inputs(case)
    got = C.CudnnFP8().run(case, **x)
    scale = case.scale if case.scale is not None else 1 / math.sqrt(case.d)
    want, lse = eager_fp8_attention(x["q"], x["k"], x["v"], x["q_descale"], x["k_descale"], x["v_descale"],
                                    causal=case.causal, softmax_scale=scale, window_size=case.window,
                                    out_dtype=case.torch_dtype, out_fp8="e4m3" if case.fp8_out else "")
    assert torch.equal(got.lse, lse)
    if case.fp8_out:  # the e4m3 values as written, read back by the harness: the same values as the reference's
        assert got.out.dtype == torch.float8_e4m3fn and got.out_descale is not None
        read = fp8.read_back(got.out, got.out_descale, case.torch_dtype)
        assert torch.allclose(read.float(), want.float(), rtol=2**-8, atol=0)
    else:
        assert torch.equal(got.out, want) and got.out_descale is None
    graph = fake[0]
    assert graph.kw["attn_scale"] == scale and graph.kw["generate_stats"] and not graph.kw["use_causal_mask"]
    if case.causal:
        assert graph.kw["right_bound"] == 0 and "left_bound" not in graph.kw


def test_one_graph_per_shape(fake):
    case = case_from_id("B2-H4/2-S19x37-D32-causal-e4m3-bf16")
    adapter = C.CudnnFP8()
    adapter.run(case, **_inputs(case, 0))
    adapter.run(case, **_inputs(case, 1))
    assert len(fake) == 1
    other = case_from_id("B2-H4/2-S20x37-D32-causal-e4m3-bf16")
    adapter.run(other, **_inputs(other))
    assert len(fake) == 2


def test_what_it_refuses(fake, monkeypatch):
    adapter, cuda = C.CudnnFP8(), torch.device("cuda")
    assert "per tensor" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-causal-e4m3-perhead-bf16"), cuda)
    assert "softcap" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-cap30-e4m3-bf16"), cuda)
    assert "FP8 cases" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-bf16"), cuda)
    assert "needs CUDA" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-e4m3-bf16"), torch.device("cpu"))
    assert adapter.supports(case_from_id("B1-H4/2-S40x40-D64-e4m3-bf16"), cuda) is None
    assert "fp8_out only" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-e4m3-grad_e4m3-bf16"), cuda)
    monkeypatch.setattr(C, "_cudnn", lambda: (None, "nvidia-cudnn-frontend not installed"))
    assert "not installed" in adapter.supports(case_from_id("B1-H4/2-S40x40-D64-e4m3-bf16"), cuda)


def test_the_timed_call_is_the_graph_alone(fake):
    """Nothing but the graph's execution in run(): P's scales are made once per device, 1 / v_descale
    once per descale tensor (again after it changes in place), and an FP8 output is not read back."""
    case = case_from_id("B1-H4/2-S40x40-D32-causal-e4m3-o8-bf16")
    x = _inputs(case)
    adapter = C.CudnnFP8()
    adapter.run(case, **x)
    misses = C._constants.cache_info().misses
    first = C._reciprocal(x["v_descale"])
    got = adapter.run(case, **x)
    assert C._constants.cache_info().misses == misses and C._reciprocal(x["v_descale"]) is first
    assert got.out.dtype == torch.float8_e4m3fn and got.out_descale.reshape(()) == x["v_descale"][0, 0]
    x["v_descale"].mul_(2.0)  # changed in place: the cached reciprocal is stale and is made again
    again = C._reciprocal(x["v_descale"])
    assert again is not first and float(again) == pytest.approx(1 / float(x["v_descale"][0, 0]))


@pytest.mark.parametrize("case_id", ["B1-H2-S32x32-D32-causal-e4m3-o8-grad_e4m3-bf16",
                                     "B2-H4/2-S19x37-D32-win6x0-e4m3-o8-grad_e5m2-bf16"])
def test_the_declared_backward_graph_computes_the_fp8_backward_contract(fake, case_id):
    """The backward graph's scalars follow harness.fp8's contract: the stand-in executes the eager FP8
    backward from what the adapter put in the graph, so the read-back gradients equal the reference's."""
    from harness.adapters.eager import EagerFP8Adapter
    from harness.cases import make_inputs

    case = case_from_id(case_id)
    x = make_inputs(case, 0)
    run_in = dict(q=x.q, k=x.k, v=x.v, q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale)
    grad_in = {n: getattr(x, n) for n in ("grad_out",) + fp8.GRAD_DESCALE_NAMES}
    adapter = C.CudnnFP8()
    got = adapter.run_fp8_backward(case, adapter.run(case, **run_in), **run_in, **grad_in)
    ref = EagerFP8Adapter()
    want = ref.run_fp8_backward(case, ref.run(case, **run_in), **run_in, **grad_in)
    for name, g, r in zip(("dq", "dk", "dv"), got, want):
        assert g.dtype == x.grad_out.dtype  # as written, in the gradients' format
        read = fp8.dequantize(g, getattr(x, f"{name}_descale"), dtype=torch.float32)
        assert float((read - r).norm() / r.norm()) < 0.05, name  # an e4m3 ulp here and there; a wrong factor: >= 100%
    bwd = fake[-1]
    assert bwd.backward and bwd.kw["attn_scale"] == pytest.approx(case.d ** -0.5) and not bwd.kw["use_causal_mask"]
    assert bwd.tensors[C._BwdGraph.DO] == C._bhsd(x.grad_out)


def test_the_backward_refuses_a_bf16_forward_output(fake):
    from harness.cases import make_inputs

    case = case_from_id("B1-H2-S32x32-D32-causal-e4m3-grad_e4m3-bf16")
    x = make_inputs(case, 0)
    run_in = dict(q=x.q, k=x.k, v=x.v, q_descale=x.q_descale, k_descale=x.k_descale, v_descale=x.v_descale)
    adapter = C.CudnnFP8()
    with pytest.raises(C.Unsupported, match="fp8_out"):
        adapter.run_fp8_backward(case, adapter.run(case, **run_in), **run_in,
                                 **{n: getattr(x, n) for n in ("grad_out",) + fp8.GRAD_DESCALE_NAMES})
