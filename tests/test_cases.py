"""The case model: readable, stable ids; seeded inputs identical across calls; presets."""

import pytest
import torch

from harness.cases import LinearCase, SoftmaxCase, make_inputs, visible_pairs
from harness.presets import PRESETS, preset


def test_ids_are_readable():
    assert SoftmaxCase(2, 8, 2, 1024, 1024, 64, causal=True, dtype="bf16").id == "B2-H8/2-S1024x1024-D64-causal-bf16"
    assert SoftmaxCase(1, 4, 4, 5, 9, 192, d_v=128, window=(8, 0), softcap=30.0).id == "B1-H4-S5x9-D192v128-win8x0-cap30-fp32"
    vl = SoftmaxCase(0, 2, 1, 0, 0, 32, varlen=((3, 4), (0, 2)))
    assert vl.id == "B2-H2/1-varlen[3x4,0x2]-D32-fp32" and vl.batch == 2 and vl.seqlen_k == 4
    assert LinearCase(4, 32, 1024, 64, gate="g", gate_n=0.1, dtype="fp16").id == "B4-H32-T1024-K64V64-g(n=0.1)-h0-dhT-fp16"


def test_inputs_are_seeded_and_never_zero():
    case = SoftmaxCase(1, 2, 1, 7, 9, 16, dtype="bf16")
    a, b, c = make_inputs(case, 0), make_inputs(case, 0), make_inputs(case, 1)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors().values(), b.tensors().values()))
    assert not torch.equal(a.q, c.q)
    assert a.q.dtype == torch.bfloat16 and a.k.shape == (1, 9, 1, 16) and a.grad_out.shape == (1, 7, 2, 16)
    assert (a.q != 0).float().mean() > 0.99
    lin = make_inputs(LinearCase(1, 2, 5, 4, gate="g", gate_n=0.1), 0)
    assert (lin.g < 0).all() and lin.initial_state.shape == (1, 2, 4, 4)


def test_invalid_cases_are_rejected():
    with pytest.raises(ValueError, match="heads_k"):
        SoftmaxCase(1, 6, 4, 8, 8, 32)
    with pytest.raises(ValueError, match="dtype"):
        SoftmaxCase(1, 4, 4, 8, 8, 32, dtype="fp7")
    with pytest.raises(ValueError, match="gate"):
        LinearCase(1, 1, 8, 8, gate="alibi")


def test_visible_pairs_is_exact():
    assert visible_pairs(4, 4, causal=True, window=(-1, -1)) == 10
    assert visible_pairs(2, 5, causal=True, window=(-1, -1)) == 4 + 5  # bottom-right aligned
    assert visible_pairs(5, 2, causal=True, window=(-1, -1)) == 1 + 2
    assert visible_pairs(6, 6, causal=False, window=(1, 1)) == 16


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_and_ids_are_unique(name):
    cases = preset(name)
    assert cases and len({c.id for c in cases}) == len(cases)
    assert all(c.dtype == "fp16" for c in preset(name, dtypes=["fp16"]))


def test_fa_sweep_shape():
    cases = preset("fa-sweep")
    assert len(cases) == 24
    assert all(c.batch * c.seqlen_q == 16384 and c.heads_q * c.d == 2048 for c in cases)


def test_every_case_id_reads_back_as_its_case():
    from harness.accept.profiles import PROFILES
    from harness.cases import case_from_id
    from harness.presets import PRESETS, preset

    cases = [c for p in PROFILES.values() for fam in ("softmax", "linear") for c in p.cases(fam) + p.bench_cases(fam)]
    cases += [c for name in PRESETS for c in preset(name)]
    assert len(cases) > 200
    for c in cases:
        assert case_from_id(c.id) == c, c.id


def test_fuzzed_case_ids_read_back_too():
    # the fuzzer's draws reach one-sided windows ("win8x-1") and tiny values ("scale1e-05"), whose "-"
    # is not a part separator; its report's shrink commands take these ids
    import random

    from harness.cases import SoftmaxCase, case_from_id
    from harness.check import fuzz as F

    rng = random.Random(0)
    drawn = [F.draw(rng, fam, ["bf16", "fp32"]) for fam in ("softmax", "linear", "decode") for _ in range(300)]
    drawn += [SoftmaxCase(1, 1, 1, 11, 2, 16, window=(8, -1), dtype="bf16"),
              SoftmaxCase(1, 1, 1, 11, 2, 16, window=(-1, 8), scale=1e-5, softcap=1e-3, dtype="bf16")]
    assert any(-1 in c.window and c.window != (-1, -1) for c in drawn if hasattr(c, "window"))
    for c in drawn:
        assert case_from_id(c.id) == c, c.id


def test_a_case_id_that_does_not_parse_says_which_part():
    import pytest

    from harness.cases import case_from_id

    with pytest.raises(ValueError, match="unknown part 'sideways'"):
        case_from_id("B1-H2-S8x8-D16-sideways-fp32")
    with pytest.raises(ValueError, match="expected a dtype"):
        case_from_id("B1-H2-S8x8-D16-causal")
    with pytest.raises(ValueError, match="reads back as"):
        case_from_id("B1-H2-S8x8-D16-scale0.50-fp32")
