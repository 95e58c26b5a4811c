"""The tolerance engine: the factor table, the floor rule, the metrics and the verdict."""

import json
import math

import pytest
import torch

from harness.cases import DTYPES
from harness.check import tolerance
from harness.check.tolerance import (
    FACTORS,
    FLOOR_FACTOR,
    TENSOR_NAMES,
    UNIT_ROUNDOFF,
    compare_tensor,
    factor_for,
    floor_for,
    rel_rms_error,
    rounding_error,
    worst_element,
)


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("tensor", TENSOR_NAMES)
def test_every_tensor_and_dtype_has_a_reasoned_factor(tensor, dtype):
    f = factor_for(tensor, dtype)
    assert 1.0 <= f.value <= 20.0
    assert len(f.reason) > 20  # a reason, not a placeholder
    assert factor_for(tensor, DTYPES[dtype]) == f  # torch dtypes resolve to the same row


def test_table_follows_the_field_forward_2x_gradients_3_to_5x_in_low_precision():
    for dt in ("fp16", "bf16"):
        assert FACTORS[("out", dt)].value == 2.0
        for g in ("dq", "dk", "dv"):
            assert 3.0 <= FACTORS[(g, dt)].value <= 5.0


def test_unknown_tensor_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"tensor: no tolerance factor for \('dz'"):
        factor_for("dz", "fp16")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_floor_never_collapses_to_zero(dtype):
    dt = DTYPES[dtype]
    exact = torch.zeros(10, dtype=torch.float64)  # rounding an all-zero oracle is exact
    assert floor_for(exact, dt) == pytest.approx(
        FLOOR_FACTOR * tolerance.MIN_ROUNDING_UNITS * UNIT_ROUNDOFF[dt]
    )
    assert floor_for(torch.arange(8.0, dtype=torch.float64), dt) > 0  # integers: exact in every dtype
    assert floor_for(_randn(1000), dt) > 0


def test_floor_is_the_rounding_error_of_the_oracle_itself():
    x = _randn(4096)
    r16 = rounding_error(x, torch.float16)
    assert 0.3 * UNIT_ROUNDOFF[torch.float16] < r16 < 0.6 * UNIT_ROUNDOFF[torch.float16]
    assert floor_for(x, "fp16") == pytest.approx(FLOOR_FACTOR * r16)
    assert rounding_error(x, torch.bfloat16) > 4 * r16  # bf16 has 3 fewer mantissa bits (8x)
    assert rounding_error(x, torch.float64) == 0.0  # the fp64 oracle rounds exactly: clamp needed


def test_rel_rms_error_value_and_nonfinite_handling():
    e = torch.tensor([3.0, 4.0, -math.inf], dtype=torch.float64)  # lse of a masked row: -inf
    c = torch.tensor([3.0, 4.5, 123.0])
    assert rel_rms_error(c, e) == pytest.approx(0.1)  # ||(0, 0.5)|| / ||(3, 4)||, -inf left out
    assert rel_rms_error(torch.tensor([3.0, math.nan, 0.0]), e) == math.inf
    assert rel_rms_error(torch.zeros(3), torch.zeros(3, dtype=torch.float64)) == 0.0
    with pytest.raises(ValueError, match="candidate: shape"):
        rel_rms_error(torch.zeros(2), torch.zeros(3))


def test_worst_element_index_and_values():
    e = torch.zeros(2, 3, 4, dtype=torch.float64)
    c = torch.zeros(2, 3, 4)
    c[1, 2, 3] = 0.5
    c[0, 1, 1] = -0.25
    w = worst_element(c, e)
    assert (w.index, w.value, w.expected, w.abs_error) == ((1, 2, 3), 0.5, 0.0, 0.5)
    c[0, 0, 2] = math.nan  # a non-finite element wins
    assert worst_element(c, e).index == (0, 0, 2)


def test_pass_rule_factor_times_reference_plus_floor():
    e = _randn(64, 64)
    floor = floor_for(e, "fp16")
    ref = 4e-4
    allowed = 2.0 * ref + floor
    noise = _randn(64, 64, seed=1)
    noise *= 1 / float(torch.linalg.vector_norm(noise))
    scale = float(torch.linalg.vector_norm(e))
    inside = e + noise * scale * allowed * 0.99
    outside = e + noise * scale * allowed * 1.01
    ok = compare_tensor("out", inside, e, reference_error=ref, dtype="fp16")
    bad = compare_tensor("out", outside, e, reference_error=ref, dtype="fp16")
    assert ok.passed and ok.allowed == pytest.approx(allowed) and ok.budget == pytest.approx(0.99)
    assert not bad.passed and bad.reason.startswith("out: error")
    assert bad.ratio == pytest.approx(bad.error / ref)


def test_exact_reference_does_not_fail_a_kernel_at_rounding_level():
    # The known failure of the bare 2x rule: reference error 0 means any rounding fails.
    e = _randn(256)
    rounded = e.to(torch.float16)
    r = compare_tensor("out", rounded, e, reference_error=0.0, dtype="fp16")
    assert r.passed and r.ratio == math.inf and r.budget <= 1.0


def test_fp8_lse_floor_is_the_fp8_accumulator_and_nothing_else_moves():
    # FP8 lse: an error at Hopper's FP8 accumulator (~2^-14, what cuDNN's FP8 SDPA shows) passes
    # against an fp32-accumulated reference; 8x more (a wider error than the tensor cores cause)
    # fails; the same errors in a bf16 case's lse and in an FP8 case's out keep their old rule.
    from harness.check.tolerance import HARDWARE_FLOORS, hardware_floor

    e = _randn(4, 256).abs() + 4.0  # lse-like values
    noise = _randn(4, 256, seed=3)
    noise *= float(torch.linalg.vector_norm(e)) / float(torch.linalg.vector_norm(noise))
    at_floor, above = e + noise * 2.0**-15, e + noise * 2.0**-11
    kw = dict(reference_error=4e-8, dtype="fp32")
    assert compare_tensor("lse", at_floor, e, case_dtype="e4m3", **kw).passed
    bad = compare_tensor("lse", above, e, case_dtype="e4m3", **kw)
    assert not bad.passed and bad.floor == pytest.approx(2.0**-14)
    assert not compare_tensor("lse", at_floor, e, case_dtype="bf16", **kw).passed
    assert not compare_tensor("out", at_floor, e, case_dtype="e4m3", **kw).passed
    assert hardware_floor("lse", "fp16") == 0.0 and set(HARDWARE_FLOORS) == {("lse", "e4m3")}
    assert all(len(f.reason) > 80 for f in HARDWARE_FLOORS.values())


def test_fp8_lse_floor_follows_the_magnitudes_the_accumulator_adds():
    """The accumulator's 2^-14 is relative to sum |q_d k_d| x scale, not to lse: scale 1 (T5-style)
    raises the floor with the scores' size; tiny scores keep the table's 2^-14; the floor is a rigorous
    bound of that premise (Cauchy-Schwarz over each row's largest key norm), worked out per head group."""
    from harness import fp8
    from harness.check.tolerance import fp8_lse_floor

    g = torch.Generator().manual_seed(0)
    q32, k32 = torch.randn(2, 64, 4, 64, generator=g), torch.randn(2, 80, 2, 64, generator=g)
    (q, qs), (k, ks) = fp8.quantize(q32, "e4m3", 2), fp8.quantize(k32, "e4m3", 2)
    qd, kd = fp8.dequantize(q, qs), fp8.dequantize(k, ks)

    def lse_of(scale):
        s = torch.einsum("bihd,bjhd->bhij", qd, kd.repeat_interleave(2, dim=2)) * scale
        return torch.logsumexp(s, dim=-1), s

    base = 2.0**-14
    usual, _ = lse_of(64**-0.5)
    hot, s = lse_of(1.0)
    f_usual, f_hot = fp8_lse_floor(q, k, qs, ks, 64**-0.5, usual), fp8_lse_floor(q, k, qs, ks, 1.0, hot)
    assert base <= f_usual < f_hot <= 8 * base  # scale 1: the products outgrow the lse
    # the premise's worst case, computed directly, sits under the floor's bound
    worst = base * torch.einsum("bihd,bjhd->bhij", qd.abs(), kd.abs().repeat_interleave(2, dim=2)).amax(-1)
    assert float(torch.linalg.vector_norm(worst)) / float(torch.linalg.vector_norm(hot)) <= f_hot
    tiny = fp8_lse_floor(q, k, qs * 1e-3, ks * 1e-3, 1.0, lse_of(1.0)[0] * 0 + 5.0)
    assert tiny == base
    masked = usual.clone()
    masked[..., 0] = float("-inf")  # rows that see no key are left out
    assert fp8_lse_floor(q, k, qs, ks, 64**-0.5, masked) == pytest.approx(f_usual, rel=0.05)


def test_fp64_candidate_bounds_are_sane():
    e = _randn(512)
    ref = 2e-16
    good = compare_tensor("out", e * (1 + 4e-16), e, reference_error=ref, dtype="fp64")
    fp32_inside = compare_tensor("out", e.float().double(), e, reference_error=ref, dtype="fp64")
    assert good.passed
    assert not fp32_inside.passed  # an fp32 intermediate in an fp64 kernel is caught


def test_nonfinite_candidate_fails_with_count_and_index():
    e = _randn(4, 8)
    c = e.clone()
    c[2, 5] = math.nan
    r = compare_tensor("dq", c, e, reference_error=1e-3, dtype="fp32")
    assert not r.passed and r.nonfinite == 1 and r.worst.index == (2, 5)
    assert "non-finite" in r.reason and "[2, 5]" in r.reason


def test_shape_mismatch_is_a_failed_report_not_a_crash():
    r = compare_tensor(
        "out", torch.zeros(2, 3), torch.zeros(3, 2, dtype=torch.float64), reference_error=1e-3, dtype="fp32"
    )
    assert not r.passed and "shape" in r.reason


def test_report_serialises_and_reads():
    e = _randn(4, 8)
    c = e.clone()
    c[0, 0] = math.inf
    r = compare_tensor("lse", c, e, reference_error=1e-7, dtype="fp32", case_dtype="fp16")
    d = json.loads(json.dumps(r.to_dict()))
    assert d["error"] == "inf" and d["worst"]["index"] == [0, 0] and d["shape"] == [4, 8]
    assert r.factor == FACTORS[("lse", "fp16")].value  # the factor follows the case's dtype
    assert r.floor == pytest.approx(floor_for(e, "fp32"))  # the floor follows the tensor's dtype
    text = r.summary()
    assert "lse" in text and "[0, 0]" in text and "non-finite" in text
