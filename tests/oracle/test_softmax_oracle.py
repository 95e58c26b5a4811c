"""Proof that the FP64 softmax oracle is right: naive formula + autograd, gradcheck, blocking,
varlen, masked rows, input validation and memory."""

import itertools
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import harness.oracle.softmax as softmax_mod
from harness.oracle import softmax_attention, softmax_attention_varlen
from harness.oracle.naive import naive_softmax_attention

f64 = torch.float64
# Both sides are float64; only summation order differs.
REL_TOL = 1e-12


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=f64)


# (Sq, Sk, Hq, Hk, D, Dv): equal lengths, Sq < Sk, Sq > Sk, GQA, MQA, d_v != d.
SHAPES = [(9, 9, 2, 2, 8, 8), (5, 11, 4, 2, 8, 6), (11, 5, 4, 1, 8, 8), (7, 7, 3, 1, 4, 12)]
MASKS = [
    dict(causal=False),
    dict(causal=True),
    dict(window_size=(3, 2)),
    dict(window_size=(2, 0)),
    dict(window_size=(-1, 1)),
    dict(causal=True, window_size=(4, -1)),
]
SOFTCAPS = [0.0, 2.5]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "Sq{}-Sk{}-H{}/{}-D{}v{}".format(*s))
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("softcap", SOFTCAPS, ids=lambda c: f"cap{c}")
def test_matches_naive_formula_with_autograd(shape, mask, softcap):
    Sq, Sk, Hq, Hk, D, Dv = shape
    q = rand(2, Sq, Hq, D, seed=1).requires_grad_()
    k = rand(2, Sk, Hk, D, seed=2).requires_grad_()
    v = rand(2, Sk, Hk, Dv, seed=3).requires_grad_()
    do = rand(2, Sq, Hq, Dv, seed=4)
    out, lse = naive_softmax_attention(q, k, v, softcap=softcap, **mask)
    out.backward(do)
    r = softmax_attention(q.detach(), k.detach(), v.detach(), do, softcap=softcap, **mask)
    assert rel(r.out, out) < REL_TOL
    assert torch.equal(torch.isneginf(r.lse), torch.isneginf(lse))
    finite = torch.isfinite(lse)
    assert (r.lse[finite] - lse[finite]).abs().max().item() < REL_TOL * 10
    for name, got, want in (("dq", r.dq, q.grad), ("dk", r.dk, k.grad), ("dv", r.dv, v.grad)):
        assert rel(got, want) < REL_TOL, name
    assert r.out.dtype == f64 and r.out.shape == (2, Sq, Hq, Dv) and r.lse.shape == (2, Hq, Sq)


def test_default_scale_and_custom_scale():
    q, k, v = rand(1, 6, 2, 16, seed=5), rand(1, 6, 2, 16, seed=6), rand(1, 6, 2, 16, seed=7)
    base = softmax_attention(q, k, v)
    explicit = softmax_attention(q, k, v, softmax_scale=16**-0.5)
    assert torch.equal(base.out, explicit.out)
    other = softmax_attention(q, k, v, softmax_scale=0.3)
    ref, _ = naive_softmax_attention(q, k, v, softmax_scale=0.3)
    assert rel(other.out, ref) < REL_TOL and rel(other.out, base.out) > 1e-3


class _OracleFn(torch.autograd.Function):
    """Exposes the oracle's analytic gradients to autograd so gradcheck can test them against
    finite differences (independent of the naive formula)."""

    @staticmethod
    def forward(ctx, q, k, v, kwargs):
        ctx.save_for_backward(q, k, v)
        ctx.kwargs = kwargs
        return softmax_attention(q, k, v, **kwargs).out

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        r = softmax_attention(q, k, v, do, **ctx.kwargs)
        return r.dq, r.dk, r.dv, None


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(causal=True), dict(window_size=(1, 1), softcap=1.5)], ids=["plain", "causal", "win-cap"]
)
def test_gradcheck_finite_differences(kwargs):
    q = rand(1, 4, 2, 3, seed=8).requires_grad_()
    k = rand(1, 5, 1, 3, seed=9).requires_grad_()
    v = rand(1, 5, 1, 2, seed=10).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, c: _OracleFn.apply(a, b, c, kwargs), (q, k, v))


@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window_size=(5, 3)), dict(causal=True, softcap=3.0)])
def test_blocked_equals_unblocked(monkeypatch, mask):
    q, k, v, do = rand(2, 37, 4, 8, seed=11), rand(2, 45, 2, 8, seed=12), rand(2, 45, 2, 8, seed=13), rand(
        2, 37, 4, 8, seed=14
    )
    whole = softmax_attention(q, k, v, do, **mask)
    # One-row tiles, then three-row tiles: every block boundary and key-range trim is exercised.
    for budget in (1, 3 * 2 * 4 * 45):
        monkeypatch.setitem(softmax_mod.TILE_ELEMENTS, "cpu", budget)
        blocked = softmax_attention(q, k, v, do, **mask)
        for name, t in whole.tensors().items():
            assert torch.allclose(blocked.tensors()[name], t, rtol=1e-13, atol=1e-14, equal_nan=False), name


def test_fully_masked_rows_are_zero_with_neg_inf_lse_and_no_gradient():
    # causal with Sq > Sk: the first Sq - Sk query rows see no key.
    Sq, Sk = 7, 3
    q, k, v, do = rand(1, Sq, 2, 4, seed=15), rand(1, Sk, 2, 4, seed=16), rand(1, Sk, 2, 4, seed=17), rand(
        1, Sq, 2, 4, seed=18
    )
    r = softmax_attention(q, k, v, do, causal=True)
    dead = Sq - Sk
    assert torch.all(r.out[:, :dead] == 0)
    assert torch.all(torch.isneginf(r.lse[:, :, :dead])) and torch.isfinite(r.lse[:, :, dead:]).all()
    assert torch.all(r.dq[:, :dead] == 0)
    for t in r.tensors().values():
        assert not torch.isnan(t).any()
    # The dead rows' grad_out must not reach dk / dv.
    do2 = do.clone()
    do2[:, :dead] = rand(1, dead, 2, 4, seed=19)
    r2 = softmax_attention(q, k, v, do2, causal=True)
    assert torch.equal(r.dk, r2.dk) and torch.equal(r.dv, r2.dv)


def test_window_rows_with_no_key_inside_are_masked():
    # window (0, 0) with Sk < Sq: rows whose diagonal falls before key 0 see nothing.
    r = softmax_attention(rand(1, 6, 1, 4, seed=20), rand(1, 2, 1, 4, seed=21), rand(1, 2, 1, 4, seed=22),
                          window_size=(0, 0))
    assert torch.isneginf(r.lse[0, 0, :4]).all() and torch.isfinite(r.lse[0, 0, 4:]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_equals_per_sequence_loop(causal):
    lens = [(5, 5), (0, 4), (7, 3), (3, 0), (9, 12)]
    Hq, Hk, D, Dv = 4, 2, 8, 6
    tq, tk = sum(a for a, _ in lens), sum(b for _, b in lens)
    q, k, v, do = rand(tq, Hq, D, seed=23), rand(tk, Hk, D, seed=24), rand(tk, Hk, Dv, seed=25), rand(
        tq, Hq, Dv, seed=26
    )
    cu_q = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32)
    r = softmax_attention_varlen(q, k, v, cu_q, cu_k, do, causal=causal)
    assert r.out.shape == (tq, Hq, Dv) and r.lse.shape == (Hq, tq)
    for b, (lq, lk) in enumerate(lens):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lq == 0:
            continue
        if lk == 0:
            assert torch.all(r.out[qs] == 0) and torch.isneginf(r.lse[:, qs]).all() and torch.all(r.dq[qs] == 0)
            continue
        one = softmax_attention(q[qs][None], k[ks][None], v[ks][None], do[qs][None], causal=causal)
        assert torch.allclose(r.out[qs], one.out[0], rtol=0, atol=0)
        assert torch.equal(r.lse[:, qs], one.lse[0])
        assert torch.equal(r.dq[qs], one.dq[0]) and torch.equal(r.dk[ks], one.dk[0]) and torch.equal(r.dv[ks], one.dv[0])


def test_low_precision_inputs_are_computed_in_float64():
    q = rand(1, 8, 2, 16, seed=27).to(torch.bfloat16)
    k = rand(1, 8, 2, 16, seed=28).to(torch.bfloat16)
    v = rand(1, 8, 2, 16, seed=29).to(torch.bfloat16)
    r = softmax_attention(q, k, v)
    ref, _ = naive_softmax_attention(q.double(), k.double(), v.double())
    assert r.out.dtype == f64 and rel(r.out, ref) < REL_TOL


BAD = [
    ("q", lambda q, k, v: (q[0], k, v), "4 dims"),
    ("k", lambda q, k, v: (q, k[:1].expand(1, *k.shape[1:]).contiguous().repeat(3, 1, 1, 1), v), "batch"),
    ("k", lambda q, k, v: (q, k[..., :4], v), "head dim"),
    ("k", lambda q, k, v: (q[:, :, :3], k, v), "multiple of heads_k"),
    ("v", lambda q, k, v: (q, k, v[:, :3]), "v: expected shape"),
    ("q", lambda q, k, v: (q.to(torch.int32), k, v), "floating-point"),
]


@pytest.mark.parametrize("arg,mutate,words", BAD, ids=[f"{a}-{w}" for a, _, w in BAD])
def test_bad_input_names_argument(arg, mutate, words):
    q, k, v = rand(2, 5, 4, 8, seed=30), rand(2, 5, 2, 8, seed=31), rand(2, 5, 2, 8, seed=32)
    with pytest.raises(ValueError) as e:
        softmax_attention(*mutate(q, k, v))
    assert str(e.value).startswith(arg) and words in str(e.value)


def test_bad_grad_out_window_and_cu_seqlens():
    q, k, v = rand(1, 5, 2, 8, seed=33), rand(1, 5, 2, 8, seed=34), rand(1, 5, 2, 8, seed=35)
    with pytest.raises(ValueError, match="^grad_out: expected shape"):
        softmax_attention(q, k, v, rand(1, 5, 2, 7, seed=36))
    with pytest.raises(ValueError, match="^window_size"):
        softmax_attention(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="^softcap"):
        softmax_attention(q, k, v, softcap=-1.0)
    qp, kp, vp = q[0], k[0], v[0]
    good = torch.tensor([0, 5], dtype=torch.int32)
    for bad, words in [
        (torch.tensor([1, 5], dtype=torch.int32), "start at 0"),
        (torch.tensor([0, 4], dtype=torch.int32), "packed length"),
        (torch.tensor([0.0, 5.0]), "integer"),
        (torch.tensor([0, 6, 5], dtype=torch.int32), "non-decreasing"),
    ]:
        with pytest.raises(ValueError, match="^cu_seqlens_q") as e:
            softmax_attention_varlen(qp, kp, vp, bad, good)
        assert words in str(e.value)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected shape \(2,\)"):
        softmax_attention_varlen(qp, kp, vp, good, torch.tensor([0, 2, 5], dtype=torch.int32))


# Full fp64 score matrix at 8192 x 8192 for one head: the bound is a quarter of it.
MEMORY_SEQLEN = 8192
FULL_SCORES_BYTES = MEMORY_SEQLEN * MEMORY_SEQLEN * 8


def test_memory_is_linear_in_sequence_length():
    """Forward + backward at seqlen 8192, d 64, one head, on CPU: the peak resident memory grows
    by far less than one full score matrix (512 MiB). Run in a fresh process so the peak is
    this computation's alone, with glibc's mmap threshold pinned: its default threshold adapts
    to earlier frees, after which freed tiles stay resident and the peak RSS depends on the
    allocation history rather than on the memory the oracle holds."""
    code = textwrap.dedent(
        f"""
        import resource, torch
        from harness.oracle import softmax_attention
        torch.set_num_threads(2)
        S = {MEMORY_SEQLEN}
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(1, S, 1, 64, generator=g, dtype=torch.float64) for _ in range(4))
        softmax_attention(q[:, :64], k[:, :64], v[:, :64], do[:, :64], causal=True)  # warm allocator paths
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = softmax_attention(q, k, v, do, causal=True)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert torch.isfinite(r.dq).all()
        print((after - before) * 1024)
        """
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert res.returncode == 0, res.stderr
    peak_growth = int(res.stdout.strip().splitlines()[-1])
    assert peak_growth < FULL_SCORES_BYTES / 4, f"peak grew by {peak_growth / 2**20:.0f} MiB"
    assert not math.isnan(peak_growth)
