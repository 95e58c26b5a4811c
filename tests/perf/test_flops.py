"""The FLOP and byte models: the FA papers' formula where it applies, exact pair counts elsewhere."""

import pytest

from harness.adapters.eager import visibility_mask
from harness.cases import LinearCase, SoftmaxCase
from harness.perf import flops


def brute_pairs(case: SoftmaxCase) -> int:
    lens = case.varlen or [(case.seqlen_q, case.seqlen_k)] * case.batch
    total = 0
    for sq, sk in lens:
        m = visibility_mask(sq, sk, case.causal, case.window, "cpu")
        total += sq * sk if m is None else int(m.sum())
    return total


def test_non_causal_matches_fa_formula():
    c = SoftmaxCase(4, 16, 16, 2048, 2048, 128, dtype="bf16")
    assert flops.softmax_flops(c, "fwd") == 4 * 4 * 16 * 2048**2 * 128


def test_backward_is_2_5x_forward_when_dv_equals_d():
    c = SoftmaxCase(2, 8, 8, 512, 512, 64, causal=True, dtype="bf16")
    fwd, bwd, e2e = (flops.softmax_flops(c, m) for m in flops.MODES)
    assert bwd == pytest.approx(flops.SOFTMAX_BWD_FACTOR * fwd)
    assert e2e == pytest.approx(3.5 * fwd)


def test_causal_counts_the_visible_triangle_exactly():
    n = 512
    c = SoftmaxCase(1, 1, 1, n, n, 64, causal=True)
    assert flops.softmax_flops(c) == 4 * 64 * n * (n + 1) // 2
    half = 4 * n * n * 64 / 2  # the papers' approximation
    assert flops.softmax_flops(c) / half - 1 == pytest.approx(1 / n)


@pytest.mark.parametrize("case", [
    SoftmaxCase(2, 4, 2, 33, 70, 32, causal=True),
    SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True),
    SoftmaxCase(2, 2, 2, 48, 48, 32, window=(8, 4)),
    SoftmaxCase(1, 2, 2, 40, 64, 32, window=(5, -1)),
    SoftmaxCase(1, 4, 2, 0, 0, 32, causal=True, varlen=((17, 17), (0, 5), (40, 40), (9, 30))),
], ids=lambda c: c.id)
def test_masks_and_unequal_lengths_count_exactly(case):
    pairs = brute_pairs(case)
    assert flops.softmax_flops(case, "fwd") == 2 * pairs * case.heads_q * (case.d + case.d_v)


def test_dv_different_from_d_counts_each_product():
    c = SoftmaxCase(1, 2, 2, 24, 24, 48, d_v=32)
    pairs = 24 * 24 * 2
    assert flops.softmax_flops(c, "fwd") == 2 * pairs * (48 + 32)
    assert flops.softmax_flops(c, "bwd") == 2 * pairs * (3 * 48 + 2 * 32)


def test_gqa_changes_bytes_not_flops():
    mha = SoftmaxCase(2, 32, 32, 1024, 1024, 128, causal=True, dtype="bf16")
    gqa = SoftmaxCase(2, 32, 8, 1024, 1024, 128, causal=True, dtype="bf16")
    assert flops.softmax_flops(mha) == flops.softmax_flops(gqa)
    assert flops.softmax_bytes(gqa) < flops.softmax_bytes(mha)
    # q and out (+ lse) unchanged, k and v a quarter
    e = 2
    kv = 2 * 2 * 1024 * 32 * 128 * e
    assert flops.softmax_bytes(mha) - flops.softmax_bytes(gqa) == pytest.approx(kv * 3 / 4)


def test_linear_model_by_hand():
    c = LinearCase(1, 2, 128, 32, 16, gate="g_gamma", dtype="fp16")
    C = flops.LINEAR_CHUNK
    per_token = 2 * C * (32 + 16) + 4 * 32 * 16
    assert flops.linear_flops(c, "fwd") == 2 * 128 * per_token
    assert flops.linear_flops(c, "bwd") == flops.LINEAR_BWD_FACTOR * flops.linear_flops(c, "fwd")
    assert flops.flops(c, "fwd+bwd") == pytest.approx((1 + flops.LINEAR_BWD_FACTOR) * flops.flops(c, "fwd"))


def test_bytes_count_each_tensor_once():
    c = SoftmaxCase(1, 2, 2, 16, 16, 8, dtype="fp16")
    q = k = v = o = 16 * 2 * 8 * 2
    lse = 16 * 2 * 4
    assert flops.min_bytes(c, "fwd") == q + k + v + o + lse
    assert flops.min_bytes(c, "bwd") == (q + k + v + 2 * o + lse) + (q + k + v)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode"):
        flops.flops(SoftmaxCase(1, 1, 1, 4, 4, 8), "backward")
