"""The FP8 backward contract (``fp8_grad`` cases, harness.fp8): the eager FP8 backward passes, each
deliberately wrong FP8 backward fails on the gradients its defect touches, the inputs and descales are
what the contract says, and the timer times the backend's FP8 backward alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tests.wrong_impls as w
from harness import fp8
from harness.cases import SoftmaxCase, case_from_id, make_inputs
from harness.check.verify import check_inputs, verify

E4M3 = SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3")
E5M2 = dataclasses.replace(E4M3, fp8_grad="e5m2")
O8 = SoftmaxCase(1, 2, 2, 64, 64, 128, dtype="bf16", fp8="e4m3", fp8_out=True, fp8_grad="e4m3")
SCALE1 = SoftmaxCase(2, 4, 2, 64, 64, 64, scale=1.0, dtype="bf16", fp8="e4m3", fp8_grad="e5m2")


def test_the_case_knob_its_id_and_its_inputs():
    assert E5M2.id == "B2-H4/2-S45x70-D32-causal-e4m3-grad_e5m2-bf16"
    assert case_from_id(E5M2.id) == E5M2 and case_from_id(O8.id) == O8
    x = make_inputs(E5M2, 0)
    check_inputs(E5M2, x)
    assert x.grad_out.dtype == torch.float8_e5m2
    for name in fp8.GRAD_DESCALE_NAMES:  # (batch, heads_k) float32, one factor per tensor
        d = getattr(x, name)
        assert d.shape == (2, 2) and d.dtype == torch.float32 and bool((d == d[0, 0]).all()) and float(d[0, 0]) > 0
    # dO at training size, its largest value mapped to the format's top
    assert float(x.grad_out.float().abs().max()) == fp8.fmt("e5m2")[1]
    assert float(fp8.dequantize(x.grad_out, x.do_descale).abs().max()) < 2**-8
    with pytest.raises(ValueError, match="knobs of FP8 cases"):
        SoftmaxCase(1, 2, 2, 8, 8, 16, dtype="bf16", fp8_grad="e5m2")
    with pytest.raises(ValueError, match="q, k, v come in"):
        SoftmaxCase(1, 2, 2, 8, 8, 16, dtype="bf16", fp8="e5m2")
    with pytest.raises(ValueError, match="without softcap"):
        SoftmaxCase(1, 2, 2, 8, 8, 16, softcap=5.0, dtype="bf16", fp8="e4m3", fp8_grad="e4m3")


def test_the_ds_descale_is_the_amax_of_the_scores_gradient_in_cudnns_units():
    # cuDNN's dS (its descale_dP / amax_dP) is the gradient of Q K^T: the softmax scale folded in
    from harness.adapters.eager import eager_fp8_attention, eager_fp8_attention_backward

    x = make_inputs(E4M3, 0)
    out, lse = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=True,
                                   out_dtype=torch.float32)
    *_, amax = eager_fp8_attention_backward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, out, lse,
                                            x.grad_out, x.do_descale, causal=True)
    qd = fp8.dequantize(x.q, x.q_descale).transpose(1, 2)
    kd = fp8.dequantize(x.k, x.k_descale).repeat_interleave(2, dim=2).transpose(1, 2)
    s = (qd @ kd.transpose(-1, -2)).requires_grad_(True)  # the unscaled scores, float64
    mask = torch.ones(45, 70, dtype=torch.bool).tril(70 - 45)
    p = torch.softmax((s * 32**-0.5).masked_fill(~mask, float("-inf")), -1)
    vd = fp8.dequantize(x.v, x.v_descale).repeat_interleave(2, dim=2).transpose(1, 2)
    do = fp8.dequantize(x.grad_out, x.do_descale).transpose(1, 2)
    (p @ vd).backward(do)
    assert amax == pytest.approx(float(s.grad.abs().max()), rel=0.05)
    assert float(x.ds_descale[0, 0]) == pytest.approx(amax / 448)


@pytest.mark.parametrize("case", [E4M3, E5M2, O8, SCALE1, dataclasses.replace(O8, fp8_grad="e5m2", causal=True)],
                         ids=str)
@pytest.mark.parametrize("impl", ["eager_fp8", w.FP8BackwardRowBlocks()], ids=["reference", "row_blocks"])
def test_the_fp8_backward_reference_and_a_blocked_one_pass(case, impl):
    r = verify(impl, case)
    assert r.status == "pass", r.reason
    assert {t.name for t in r.tensors} == {"out", "lse", "dq", "dk", "dv"}
    assert all(t.ratio < 1.1 for t in r.tensors), [(t.name, t.ratio) for t in r.tensors]
    assert not any(p.name == "backward" for p in r.properties)


@pytest.mark.parametrize(
    "impl, case, must_fail, must_pass",
    [
        (w.FP8BackwardDoDescaleIgnored, E5M2, {"dq", "dk", "dv"}, {"out", "lse"}),
        (w.FP8BackwardDsUnscaled, E4M3, {"dq", "dk"}, {"dv", "out"}),
        (w.FP8BackwardDsUnscaled, O8, {"dq", "dk"}, {"dv", "out"}),
        (w.FP8BackwardNoSoftmaxScale, E4M3, {"dq", "dk"}, {"dv"}),
        (w.FP8BackwardDeltaFromFP8Units, O8, {"dq", "dk"}, {"dv"}),
    ],
    ids=["do_descale_ignored", "ds_unscaled", "ds_unscaled_fp8_out", "no_softmax_scale", "delta_from_fp8_units"],
)
def test_a_wrong_fp8_backward_fails_on_what_it_breaks(impl, case, must_fail, must_pass):
    r = verify(impl(), case)
    failed = {t.name for t in r.tensors if not t.passed}
    assert r.status == "fail" and must_fail <= failed and not (must_pass & failed), (failed, r.reason)
    assert all(t.ratio > 3 for t in r.tensors if t.name in must_fail)


def test_what_the_backward_check_skips_says_why():
    fwd_only = dataclasses.replace(E4M3, fp8_grad="")
    r = verify("eager_fp8", fwd_only)
    assert "no fp8_grad" in next(p for p in r.properties if p.name == "backward").detail
    # an FP8 backend without an FP8 backward: its forward is still judged
    r = verify(w.FP8OnlineCorrect(), E4M3)
    assert r.status == "pass" and "has no FP8 backward" in next(p for p in r.properties if p.name == "backward").detail


class _MutatesDO(w._WrongFP8Backward):
    name = "wrong_fp8_bwd_writes_do"

    def run_fp8_backward(self, case, forward, *, grad_out, **kw):
        res = super().run_fp8_backward(case, forward, grad_out=grad_out, **kw)
        grad_out.view(torch.uint8)[0, 0, 0, 0] ^= 1
        return res


class _FP8GradsOnBf16Case(w._WrongFP8Backward):
    name = "wrong_fp8_bwd_fp8_grads"

    def run_fp8_backward(self, case, forward, **kw):
        return tuple(g.to(torch.float8_e4m3fn) for g in super().run_fp8_backward(case, forward, **kw))


def test_the_backward_contract_inputs_unchanged_and_output_formats():
    r = verify(_MutatesDO(), E4M3)
    assert r.status == "fail" and "grad_out" in r.reason
    r = verify(_FP8GradsOnBf16Case(), E4M3)  # FP8 gradients where the case asks for real ones
    assert r.status == "fail" and "only an fp8_out case's gradients are FP8" in r.reason


def test_the_timer_times_the_fp8_backward_alone():
    from harness.perf.timing import Workload, input_sets

    calls = []

    class Counting(w._WrongFP8Backward):
        name = "counting"

        def run(self, case, **kw):
            calls.append("fwd")
            return super().run(case, **kw)

        def run_fp8_backward(self, case, forward, **kw):
            calls.append("bwd")
            return super().run_fp8_backward(case, forward, **kw)

    work = Workload(Counting(), O8, input_sets(O8, 0, "cpu", 2), "bwd")
    work.prepare()
    assert calls == ["fwd", "fwd"]
    calls.clear()
    work.call(0), work.call(1)
    assert calls == ["bwd", "bwd"]
    with pytest.raises(ValueError, match="no fp8_grad"):
        Workload(Counting(), dataclasses.replace(O8, fp8_grad=""), input_sets(O8, 0, "cpu", 1), "bwd")


def test_a_user_callable_declares_its_fp8_backward():
    # the acceptance tests' FP8 training pair (the eager FP8 forward and backward as a user's callable)
    from harness.adapters.user import make_callable_adapter
    from tests.accept.impls import fp8_impls

    r = verify(make_callable_adapter(fp8_impls.training, name="mine"), E5M2)
    assert r.status == "pass" and {"dq", "dk", "dv"} <= {t.name for t in r.tensors}, r.reason
    r = verify(make_callable_adapter(fp8_impls.training_ignores_do_descale, name="mine"), E5M2)
    assert r.status == "fail" and r.reason.startswith("dq")
    # no FP8 backward declared (the forward-only FP8 callable): the forward is still judged
    r = verify(make_callable_adapter(fp8_impls.correct, name="mine"), E5M2)
    assert r.status == "pass" and "has no FP8 backward" in next(p for p in r.properties if p.name == "backward").detail
