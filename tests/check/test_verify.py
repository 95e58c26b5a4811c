"""The verification runner: correct backends pass, each deliberately wrong one fails for its reason,
bad inputs are refused before anything runs, poisoning and global state behave."""

import dataclasses
import json
import math

import pytest
import torch
import wrong_impls as w

from harness.adapters.base import (
    LinearAdapter,
    LinearOutput,
    SoftmaxAdapter,
    SoftmaxOutput,
    Unsupported,
    default_scale,
)
from harness.adapters.eager import eager_attention
from harness.cases import LinearCase, SoftmaxCase, make_inputs
from harness.check.verify import CaseResult, check_inputs, poisoned_memory, prepare, verify

SQUARE = SoftmaxCase(2, 4, 4, 64, 64, 64, causal=True)
ODD = SoftmaxCase(2, 4, 4, 37, 37, 32)  # 37 rows: a partial last block of 16
GQA = SoftmaxCase(1, 4, 2, 33, 70, 32, causal=True)
DEAD_ROWS = SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True)  # Sq > Sk causal: 37 rows see no key
LONG_ROWS = SoftmaxCase(1, 2, 2, 32, 256, 32)  # 256 keys per row: where an fp16 accumulator drifts
LINEAR = LinearCase(1, 2, 63, 32, gate="g", gate_n=1.0)


# --------------------------------------------------------------------------------------------
# Correct backends pass
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "backend,case",
    [("sdpa_math", SQUARE), ("sdpa_math", GQA), ("eager", DEAD_ROWS), ("eager_linear", LINEAR)],
    ids=lambda x: getattr(x, "id", x),
)
def test_correct_backend_passes_across_seeds(backend, case, seed, dtype):
    r = verify(backend, case.with_dtype(dtype), seed=seed)
    assert r.status == "pass", r.message()
    assert {t.name for t in r.tensors} >= {"out", "dq", "dk", "dv"}
    assert r.property("determinism").status == "pass"
    assert r.property("inputs_unchanged").status == "pass"


def test_fp64_path_has_fp64_reference_and_sane_bounds():
    case = ODD.with_dtype("fp64")
    b = prepare(case)
    assert 0 < b.reference_errors["out"] < 1e-14  # fp64 reference: rounding level, not fp32's 1e-7
    r = verify("sdpa_math", case, baseline=b)
    assert r.status == "pass", r.message()
    for t in r.tensors:
        assert 0 < t.floor < 1e-15 and t.allowed < 1e-13


class _Fp32Inside(SoftmaxAdapter):
    """Takes fp64 inputs, computes in fp32, returns fp64: looks right, is not fp64-accurate."""

    name = "fp32_inside"

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        from harness.adapters.eager import eager_attention

        out, lse = eager_attention(q.float(), k.float(), v.float(), **case.oracle_kwargs)
        return SoftmaxOutput(out.double(), lse.double())


def test_fp64_candidate_computing_in_fp32_fails():
    r = verify(_Fp32Inside(), ODD.with_dtype("fp64"))
    assert r.status == "fail"
    assert "out" in r.failures and "lse" in r.failures


def test_eager_is_fp64_accurate_on_fp64_inputs():
    assert verify("eager", ODD.with_dtype("fp64")).status == "pass"


# --------------------------------------------------------------------------------------------
# Deliberately wrong implementations are rejected, for the right reason
# --------------------------------------------------------------------------------------------

WRONG = [
    # (implementation, case, dtypes, names that must fail, names that must not fail)
    (w.OffByOneCausal, SQUARE, ("fp32", "fp16"), {"out"}, set()),
    (w.ScaleIgnored, ODD, ("fp32", "fp16"), {"out"}, set()),
    (w.LowPrecisionAccumulation, LONG_ROWS, ("fp32", "fp16"), {"out"}, set()),
    (w.GQAWrongHeads, GQA, ("fp32", "fp16"), {"out", "dk", "dv"}, set()),
    (w.DqScaled, SQUARE, ("fp32", "fp16"), {"dq"}, {"out", "lse", "dk", "dv"}),
    (w.LastBlockUnwritten, ODD, ("fp32", "fp16"), {"out"}, set()),
    (w.InputMutated, ODD, ("fp32",), {"inputs_unchanged"}, {"out", "lse"}),
    (w.MaskedRowsNaN, DEAD_ROWS, ("fp32",), {"masked_rows", "out"}, {"lse"}),
    (w.NoisyBackward, ODD, ("fp32", "fp16"), {"determinism"}, {"out", "lse"}),
    (w.LinearGateIgnored, LINEAR, ("fp32", "fp16"), {"out", "final_state", "dg"}, set()),
    (w.LinearNoFinalState, LINEAR, ("fp32",), {"contract"}, {"out"}),
]


@pytest.mark.parametrize(
    "impl,case,dtype,must_fail,must_pass",
    [(i, c, dt, f, p) for i, c, dts, f, p in WRONG for dt in dts],
    ids=[f"{i.name}-{dt}" for i, _, dts, _, _ in WRONG for dt in dts],
)
def test_wrong_implementation_is_rejected_for_its_reason(impl, case, dtype, must_fail, must_pass):
    r = verify(impl(), case.with_dtype(dtype))
    assert r.status == "fail", r.message()
    assert must_fail <= set(r.failures), r.message()
    assert not (must_pass & set(r.failures)), r.message()
    first = min(must_fail)
    assert first in r.reason or any(n in r.reason for n in must_fail)


def test_unwritten_block_reports_nonfinite_and_its_first_index():
    r = verify(w.LastBlockUnwritten(), ODD, check_backward=False)
    out = r.tensor("out")
    assert out.nonfinite == ODD.batch * 5 * ODD.heads_q * ODD.d  # rows 32..36 of each batch
    assert out.worst.index[1] >= 32 and math.isnan(out.worst.value)
    assert "non-finite" in r.reason


def test_input_mutation_names_the_input():
    r = verify(w.InputMutated(), ODD)
    assert r.reason.startswith("inputs_unchanged")
    assert "q (" in r.property("inputs_unchanged").detail


def test_documented_masked_row_behaviour_is_reported_not_failed():
    r = verify(w.MaskedRowsNaNDocumented(), DEAD_ROWS)
    assert r.status == "pass", r.message()
    prop = r.property("masked_rows")
    assert prop.status == "documented" and "documented" in prop.detail


def test_a_declared_lse_on_empty_rows_is_mapped_by_the_checker_on_those_rows_only():
    # lse_empty_rows (flash-attn's +inf): the checker maps it outside the timed call, on dead rows only
    ok = verify(w.EmptyRowsPlusInfLse(), DEAD_ROWS)
    assert ok.status == "pass" and ok.property("masked_rows").status == "pass", ok.message()
    undeclared = verify(w.EmptyRowsPlusInfUndeclared(), DEAD_ROWS)
    assert undeclared.property("masked_rows").status == "fail", undeclared.message()
    live = verify(w.EmptyRowsPlusInfOnALiveRow(), DEAD_ROWS)
    assert live.status == "fail" and "lse" in live.failures, live.message()


def test_masked_rows_property_passes_for_the_oracle_convention():
    r = verify("eager", DEAD_ROWS)
    assert r.property("masked_rows").status == "pass"
    assert verify("eager", ODD).property("masked_rows").status == "skipped"


def test_documented_nondeterministic_backward_is_reported_with_spread():
    r = verify(w.NoisyBackwardDocumented(), ODD)
    assert r.status == "pass", r.message()
    prop = r.property("determinism")
    assert prop.status == "documented" and "dk" in prop.detail and "max |run1 - run2|" in prop.detail


def test_nondeterminism_declared_per_case_is_documented_only_on_those_cases():
    """An adapter may declare its backward nondeterministic case by case (``deterministic_backward_for``, as the
    in-repo kernel does for its fused-backward cells): those cases read "documented", the others still fail."""

    class PerCase(w.NoisyBackward):
        name = "per_case_nondeterministic_backward"

        def deterministic_backward_for(self, case, device):
            return case.seqlen_k != ODD.seqlen_k  # only ODD's key length is declared nondeterministic

    r = verify(PerCase(), ODD)
    assert r.status == "pass" and r.property("determinism").status == "documented", r.message()
    r = verify(PerCase(), dataclasses.replace(ODD, seqlen_k=ODD.seqlen_k + 1))
    assert r.property("determinism").status == "fail", r.message()


def test_dq_off_by_one_percent_fails_in_fp16_across_seeds():
    for seed in range(3):
        r = verify(w.DqScaled(), SQUARE.with_dtype("fp16"), seed=seed, check_determinism=False)
        assert r.failures == ["dq"], r.message()


# --------------------------------------------------------------------------------------------
# Status: unsupported, error, contract
# --------------------------------------------------------------------------------------------


class _Raises(SoftmaxAdapter):
    name = "raises"

    def __init__(self, exc):
        self.exc = exc
        self.calls = 0

    def run(self, case, **inputs):
        self.calls += 1
        raise self.exc


def test_unsupported_raised_late_gives_unsupported_with_reason():
    r = verify(_Raises(Unsupported("head dim 256 not supported")), ODD)
    assert r.status == "unsupported" and r.reason == "head dim 256 not supported"


def test_supports_reason_gives_unsupported_without_running():
    a = _Raises(RuntimeError("must not run"))
    a.supports = lambda case, device: "needs a GPU"
    r = verify(a, ODD)
    assert (r.status, r.reason, a.calls) == ("unsupported", "needs a GPU", 0)


def test_crashing_candidate_is_an_error_with_traceback():
    r = verify(_Raises(RuntimeError("illegal memory access")), ODD)
    assert r.status == "error" and "RuntimeError: illegal memory access" in r.reason
    assert "illegal memory access" in r.error_traceback


class _WrongDtype(SoftmaxAdapter):
    name = "wrong_dtype"

    def run(self, case, *, q, k, v, **_):
        out, lse = eager_attention(
            q.float(), k.float(), v.float(), causal=case.causal, softmax_scale=default_scale(case)
        )
        return SoftmaxOutput(out, lse)


def test_output_dtype_against_contract():
    r = verify(_WrongDtype(), ODD.with_dtype("fp16"))
    assert r.status == "fail" and "contract" in r.failures
    assert "out dtype torch.float32" in r.property("contract").detail


class _ReturnsTuple(SoftmaxAdapter):
    name = "returns_tuple"

    def run(self, case, *, q, k, v, **_):
        return eager_attention(q, k, v, causal=case.causal, softmax_scale=default_scale(case))


def test_wrong_return_type_fails_contract():
    r = verify(_ReturnsTuple(), ODD)
    assert r.status == "fail" and r.failures == ["contract"] and "SoftmaxOutput" in r.reason


class _HeadsFirst(SoftmaxAdapter):
    name = "heads_first"

    def run(self, case, *, q, k, v, **_):
        out, lse = eager_attention(q, k, v, causal=case.causal, softmax_scale=default_scale(case))
        return SoftmaxOutput(out.transpose(1, 2), lse)  # (B, H, S, D): the wrong layout


def test_wrong_output_layout_fails_contract_not_autograd():
    r = verify(_HeadsFirst(), ODD)
    assert r.status == "fail" and r.failures == ["contract"]
    assert "out: shape (2, 4, 37, 32), the contract says (2, 37, 4, 32)" in r.reason


class _ForwardOnly(SoftmaxAdapter):
    name = "forward_only"
    differentiable = False

    def run(self, case, *, q, k, v, **_):
        with torch.no_grad():
            out, lse = eager_attention(q, k, v, causal=case.causal, softmax_scale=default_scale(case))
        return SoftmaxOutput(out, lse)


def test_inference_only_adapter_checks_forward_only():
    r = verify(_ForwardOnly(), SQUARE)
    assert r.status == "pass", r.message()
    assert {t.name for t in r.tensors} == {"out", "lse"}
    assert r.property("backward").status == "skipped"


# --------------------------------------------------------------------------------------------
# Results serialise
# --------------------------------------------------------------------------------------------


def test_case_result_round_trips_through_json():
    r = verify(w.LastBlockUnwritten(), ODD)  # inf / NaN numbers included
    d = json.loads(json.dumps(r.to_dict()))
    back = CaseResult.from_dict(d)
    assert back.to_dict() == r.to_dict()
    assert back.failures == r.failures and back.status == "fail"
    assert "out" in r.message() and "FAIL" in r.message()


# --------------------------------------------------------------------------------------------
# Bad inputs are refused before anything runs, naming the argument
# --------------------------------------------------------------------------------------------


def _bad(mutate, case=ODD):
    inputs = make_inputs(case, 0)
    mutate(inputs)
    return inputs


BAD_INPUTS = [
    (
        "layout",
        lambda i: setattr(i, "q", i.q.transpose(1, 2).contiguous()),
        r"q: expected shape .*\(batch, heads, seqlen, dim\)",
    ),
    ("rank", lambda i: setattr(i, "k", i.k[0]), r"k: expected rank 4"),
    ("dtype", lambda i: setattr(i, "v", i.v.half()), r"v: dtype torch.float16 does not match"),
    ("device", lambda i: setattr(i, "k", i.k.to("meta")), r"k: device meta does not match"),
    (
        "heads",
        lambda i: setattr(i, "k", i.k[:, :, :3]),
        r"k: heads_q \(4\) must be a multiple of heads_k \(3\)",
    ),
    (
        "nan",
        lambda i: i.v.view(-1).__setitem__(5, math.nan),
        r"v: 1 non-finite element\(s\).*first at \[0, 0, 0, 5\]",
    ),
    ("inf", lambda i: i.grad_out.view(-1).__setitem__(0, math.inf), r"grad_out: 1 non-finite"),
    ("missing", lambda i: setattr(i, "grad_out", None), r"grad_out: missing"),
]


@pytest.mark.parametrize(
    "mutate,message", [(m, msg) for _, m, msg in BAD_INPUTS], ids=[n for n, _, _ in BAD_INPUTS]
)
def test_bad_input_is_refused_naming_the_argument(mutate, message):
    spy = _Raises(RuntimeError("must not run"))
    with pytest.raises(ValueError, match=message):
        verify(spy, ODD, inputs=_bad(mutate))
    assert spy.calls == 0


def test_linear_gate_checks_name_the_argument():
    with pytest.raises(ValueError, match=r"g: expected dtype torch.float32"):
        check_inputs(LINEAR, _bad(lambda i: setattr(i, "g", i.g.double()), LINEAR))
    with pytest.raises(ValueError, match=r"g_gamma: not an input"):
        check_inputs(LINEAR, _bad(lambda i: setattr(i, "g_gamma", torch.zeros(2)), LINEAR))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(adapter=42), r"adapter: expected an Adapter"),
        (dict(adapter="no_such_backend"), r"adapter: unknown backend"),
        (dict(case="B2-H4"), r"case: expected a SoftmaxCase"),
        (dict(seed=-1), r"seed: expected a non-negative int"),
        (dict(device="cuda:0" if not torch.cuda.is_available() else "nonsense"), r"device:"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    args = dict(adapter="eager", case=ODD) | kwargs
    with pytest.raises(ValueError, match=message):
        verify(args.pop("adapter"), args.pop("case"), **args)


# --------------------------------------------------------------------------------------------
# Poisoning and global state
# --------------------------------------------------------------------------------------------


def _global_state():
    import torch.utils.deterministic as det

    return (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        det.fill_uninitialized_memory,
    )


def test_poisoned_memory_fills_empty_with_nan_and_restores_state():
    before = _global_state()
    with poisoned_memory(torch.device("cpu")):
        assert torch.isnan(torch.empty(1000)).all()
        assert torch.isnan(torch.empty_like(torch.ones(3, 5, dtype=torch.float16))).all()
    assert _global_state() == before


def test_poisoned_memory_restores_state_after_an_exception():
    before = _global_state()
    with pytest.raises(RuntimeError), poisoned_memory(torch.device("cpu")):
        raise RuntimeError("candidate crashed")
    assert _global_state() == before
    verify(_Raises(RuntimeError("boom")), ODD)
    assert _global_state() == before


# --------------------------------------------------------------------------------------------
# Inputs a backend treats as constants
# --------------------------------------------------------------------------------------------

G_GAMMA = LinearCase(1, 2, 70, 32, gate="g_gamma", initial_state=False, grad_final_state=False)


class _ConstantGamma(LinearAdapter):
    """g_gamma detached, as FLA does (it is a constant there)."""

    name = "constant_g_gamma"

    def run(self, case, *, q, k, v, g=None, g_gamma=None, initial_state=None):
        from harness.adapters.eager import eager_linear_attention

        o, s = eager_linear_attention(
            q, k, v, g_gamma=g_gamma.detach(), scale=default_scale(case), initial_state=initial_state
        )
        return LinearOutput(o, s)


class _DeclaredConstantGamma(_ConstantGamma):
    name = "declared_constant_g_gamma"
    nondifferentiable_inputs = ("g_gamma",)


def test_undeclared_missing_gradient_fails_and_says_why():
    r = verify(_ConstantGamma(), G_GAMMA)
    assert r.failures == ["dg"]
    assert "no gradient reaches g_gamma" in r.reason


def test_declared_constant_input_is_documented_not_failed():
    r = verify(_DeclaredConstantGamma(), G_GAMMA)
    assert r.status == "pass", r.message()
    assert r.tensor("dg") is None
    assert r.property("backward").status == "documented" and "g_gamma" in r.property("backward").detail


# --------------------------------------------------------------------------------------------
# FP8 cases (harness.fp8): each FP8 bug rejected for its own reason, a correct variant accepted
# --------------------------------------------------------------------------------------------

FP8 = SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3")
#: scores of several units (scale 1.0, T5-style): exp(S) without the maximum taken out exceeds 448
FP8_HOT = SoftmaxCase(2, 4, 2, 64, 64, 64, scale=1.0, dtype="bf16", fp8="e4m3")
#: one factor per (sequence, kv head), heads at different magnitudes
FP8_PER_HEAD = SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_per_head=True)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "impl, case, must_fail, must_pass, words",
    [
        (w.FP8DescaleIgnored, FP8, {"out", "lse"}, set(), "the reference's"),
        (w.FP8DescaleTwice, FP8, {"out", "lse"}, set(), "the reference's"),
        (w.FP8UnscaledP, FP8_HOT, {"out"}, {"lse"}, "the reference's"),
        (w.FP8HalfAccumulation, FP8, {"out"}, set(), "non-finite"),
        (w.FP8DescaleFirstEntry, FP8_PER_HEAD, {"out"}, set(), "the reference's"),
    ],
    ids=["descale-ignored", "descale-twice", "unscaled-p", "fp16-accumulation", "descale-first-entry"],
)
def test_wrong_fp8_kernel_is_rejected_for_its_reason(impl, case, must_fail, must_pass, words, seed):
    r = verify(impl(), case, seed=seed)
    assert r.status == "fail", r.message()
    assert must_fail <= set(r.failures), r.message()
    assert not (must_pass & set(r.failures)), r.message()
    assert words in r.message(), r.message()


def test_fp8_output_knob_rounds_the_reference_and_rejects_a_mismatch():
    # fp8_out cases: the reference's output is written in e4m3 with scale_o = 1 / v_descale and read
    # back, so an FP8-output kernel is judged against that. A limit, measured here: rounding the output to e4m3 when bf16 was asked costs only
    # ~1.65x the reference's error (P's rounding dominates both), inside the 2x bound: not rejected.
    o8 = dataclasses.replace(FP8, fp8_out=True)
    assert o8.id.endswith("-e4m3-o8-bf16")
    assert verify("eager_fp8", o8).status == "pass"
    assert verify(w.FP8OutputRounded(), o8).status == "pass"  # the right thing for this case
    rounded = verify(w.FP8OutputRounded(), FP8).tensor("out")
    assert rounded.passed and 1.3 < rounded.ratio < 2.0, rounded.summary()
    with pytest.raises(ValueError, match="knobs of FP8 cases"):
        SoftmaxCase(1, 2, 2, 8, 8, 16, dtype="bf16", fp8_out=True)


def test_an_fp8_output_with_its_descale_is_read_back_by_the_harness():
    # SoftmaxOutput.out_descale: the e4m3 output as written, read back outside the timed call
    o8 = dataclasses.replace(FP8, fp8_out=True)
    assert verify(w.FP8OutputWritten(), o8).status == "pass"
    wrong = verify(w.FP8OutputDescaleInverted(), o8)
    assert wrong.status == "fail" and "out" in wrong.failures, wrong.message()
    # on a bf16-output case an FP8 output breaks the contract, whatever its descale
    r = verify(w.FP8OutputWritten(), FP8)
    assert r.status == "fail" and "contract: out_descale" in r.message(), r.message()


def test_reading_one_descale_passes_per_tensor_cases_only():
    assert verify(w.FP8DescaleFirstEntry(), FP8).status == "pass"  # why per-head cases exist
    assert verify(w.FP8DescaleFirstEntry(), FP8_PER_HEAD).status == "fail"


@pytest.mark.parametrize("case", [FP8, FP8_HOT, FP8.with_dtype("fp16"), FP8_PER_HEAD,
                                  SoftmaxCase(1, 8, 1, 33, 200, 64, window=(20, 0), causal=True, softcap=5.0,
                                              dtype="bf16", fp8="e4m3")], ids=str)
def test_fp8_reference_and_a_flash_style_fp8_kernel_pass(case):
    for impl in ("eager_fp8", w.FP8OnlineCorrect()):
        r = verify(impl, case)
        assert r.status == "pass", r.message()


def test_a_backend_without_an_fp8_path_refuses_fp8_cases_with_the_reason():
    from harness.adapters import registry

    for name in registry.names():
        a = registry.get(name)
        reason = a.supports(FP8, torch.device("cpu"))
        if a.fp8:
            continue
        assert reason, f"{name} accepted an FP8 case without declaring an FP8 path"
    assert "FP8 (e4m3) inputs with descales" in registry.get("eager").supports(FP8, torch.device("cpu"))


def test_fp8_inputs_are_quantised_per_tensor_and_the_oracle_sees_their_values():
    from harness import fp8
    from harness.cases import make_inputs

    x = make_inputs(FP8, seed=3)
    assert x.q.dtype == torch.float8_e4m3fn and x.q_descale.shape == (2, 2)
    assert float(x.q.float().abs().max()) == 448.0  # the amax maps to the format's largest value
    assert torch.all(x.k_descale == x.k_descale[0, 0])  # one factor per tensor
    real = fp8.dequantize(x.q, x.q_descale)
    assert real.dtype == torch.float64 and 1.5 < float(real.abs().max()) < 6  # standard normal draws
    with pytest.raises(ValueError, match="fp8: expected one of e4m3"):
        SoftmaxCase(1, 1, 1, 4, 4, 16, dtype="bf16", fp8="e5m7")
    with pytest.raises(ValueError, match="output dtype of an FP8 case is fp16 or bf16"):
        SoftmaxCase(1, 1, 1, 4, 4, 16, dtype="fp32", fp8="e4m3")


def test_prepare_warms_the_cpu_workers_once_per_thread_count(monkeypatch):
    """verify.warm_cpu_workers runs before a baseline is built and before each candidate run (session 49: torch's first
    logsumexp of a process sometimes returned the worker thread's rows off by ~1e-5 relative, failing an exact eager
    candidate); its ops run once per intra-op thread count, none with one thread."""
    from harness import presets
    from harness.check import verify as verify_mod

    real, calls = verify_mod.warm_cpu_workers, []
    monkeypatch.setattr(verify_mod, "warm_cpu_workers", lambda: calls.append(1) or real())
    monkeypatch.setattr(verify_mod, "_WARM_THREADS", set())
    monkeypatch.setattr(verify_mod.torch, "get_num_threads", lambda: 3)
    case = presets.preset("small", ["fp32"])[0]
    base = verify_mod.prepare(case)
    assert calls == [1] and verify_mod._WARM_THREADS == {3}
    assert verify_mod.verify("eager", case, baseline=base).status == "pass"
    assert len(calls) >= 3  # (prepare, then each candidate run: two at least, the determinism check)
    monkeypatch.setattr(verify_mod.torch, "get_num_threads", lambda: 1)
    real()
    assert verify_mod._WARM_THREADS == {3}
