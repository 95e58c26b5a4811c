"""Proof that the FP64 chunked linear-attention oracle is right: the step-by-step recurrence with
autograd, odd lengths, every gate, gradcheck, chunk-size independence, and no overflow at 64k."""

import pytest
import torch

import harness.oracle.linear as linear_mod
from harness.oracle import linear_attention
from harness.oracle.naive import naive_linear_attention

f64 = torch.float64
REL_TOL = 1e-12


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=f64)


def make(B, T, H, K, V, gate, n, seed=0):
    q, k, v = rand(B, T, H, K, seed=seed), rand(B, T, H, K, seed=seed + 1), rand(B, T, H, V, seed=seed + 2)
    g = torch.nn.functional.logsigmoid(rand(B, T, H, seed=seed + 3)) / n if gate == "g" else None
    gg = torch.nn.functional.logsigmoid(2 + rand(H, seed=seed + 4)) / n if gate == "g_gamma" else None
    h0, do, dht = rand(B, H, K, V, seed=seed + 5), rand(B, T, H, V, seed=seed + 6), rand(B, H, K, V, seed=seed + 7)
    return q, k, v, g, gg, h0, do, dht


@pytest.mark.parametrize("T", [1, 63, 64, 65, 127])
@pytest.mark.parametrize("gate,n", [("none", 1), ("g", 0.1), ("g", 1), ("g", 10), ("g_gamma", 1)])
@pytest.mark.parametrize("with_state", [True, False], ids=["h0-dhT", "no-state"])
def test_matches_recurrence_with_autograd(T, gate, n, with_state):
    q, k, v, g, gg, h0, do, dht = make(2, T, 2, 8, 6, gate, n)
    leaves = [q, k, v, h0] + [x for x in (g, gg) if x is not None]
    for x in leaves:
        x.requires_grad_()
    o, s = naive_linear_attention(q, k, v, g=g, g_gamma=gg, initial_state=h0 if with_state else None)
    loss = (o * do).sum() + ((s * dht).sum() if with_state else 0)
    loss.backward()
    r = linear_attention(
        q.detach(), k.detach(), v.detach(), do, g=None if g is None else g.detach(),
        g_gamma=None if gg is None else gg.detach(), initial_state=h0.detach() if with_state else None,
        grad_final_state=dht if with_state else None,
    )
    assert rel(r.out, o) < REL_TOL and rel(r.final_state, s) < REL_TOL
    for name, got, want in (("dq", r.dq, q.grad), ("dk", r.dk, k.grad), ("dv", r.dv, v.grad)):
        assert rel(got, want) < REL_TOL, name
    if with_state:
        assert rel(r.dh0, h0.grad) < REL_TOL
    else:
        assert r.dh0 is None
    if gate != "none":
        # dg is a difference of O(1) terms (q.dq - k.dk) and is exactly 0 when T = 1 without a
        # state, so bound the error against max(|dg|, 1) rather than |dg|.
        want = (g if gate == "g" else gg).grad
        assert r.dg.shape == want.shape
        assert (r.dg - want).norm() <= 1e-11 * max(want.norm().item(), 1.0)
    else:
        assert r.dg is None


def test_scale_and_shapes():
    q, k, v, g, _, h0, do, _ = make(1, 10, 3, 4, 5, "g", 1)
    r = linear_attention(q, k, v, g=g, scale=0.7)
    o, s = naive_linear_attention(q, k, v, g=g, scale=0.7)
    assert rel(r.out, o) < REL_TOL and r.out.shape == (1, 10, 3, 5) and r.final_state.shape == (1, 3, 4, 5)
    assert r.dq is None


def test_gradcheck_finite_differences():
    q, k, v, g, _, h0, do, dht = make(1, 5, 1, 2, 3, "g", 1)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, h0):
            ctx.save_for_backward(q, k, v, g, h0)
            r = linear_attention(q, k, v, g=g, initial_state=h0)
            return r.out, r.final_state

        @staticmethod
        def backward(ctx, do, dht):
            q, k, v, g, h0 = ctx.saved_tensors
            r = linear_attention(q, k, v, do, g=g, initial_state=h0, grad_final_state=dht)
            return r.dq, r.dk, r.dv, r.dg, r.dh0

    args = [x.requires_grad_() for x in (q, k, v, g, h0)]
    assert torch.autograd.gradcheck(Fn.apply, args)


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunk_size_does_not_change_results(monkeypatch, chunk):
    q, k, v, g, _, h0, do, dht = make(2, 45, 2, 8, 8, "g", 0.1)
    ref = linear_attention(q, k, v, do, g=g, initial_state=h0, grad_final_state=dht)
    monkeypatch.setattr(linear_mod, "CHUNK", chunk)
    other = linear_attention(q, k, v, do, g=g, initial_state=h0, grad_final_state=dht)
    for name, t in ref.tensors().items():
        assert torch.allclose(other.tensors()[name], t, rtol=1e-11, atol=1e-12), name


def test_no_overflow_at_64k_steps_with_strong_decay():
    # Cumulative log-decay over 64k steps of logsigmoid(x)/0.1 is about -5e5: exp of it
    # underflows float64, and exp of its negative overflows. Chunk-local differences never do.
    T = 65536
    q, k, v, g, _, h0, do, dht = make(1, T, 1, 4, 4, "g", 0.1)
    assert g.sum().item() < -1e5
    r = linear_attention(q, k, v, do, g=g, initial_state=h0, grad_final_state=dht)
    for name, t in r.tensors().items():
        assert torch.isfinite(t).all(), name
    # The tail depends only on the last few hundred steps at this decay: compare with the
    # recurrence over the last 256 steps, started from zero state (the older state has decayed
    # by exp(-hundreds)).
    tail = slice(T - 256, T)
    o, s = naive_linear_attention(q[:, tail], k[:, tail], v[:, tail], g=g[:, tail])
    assert rel(r.out[:, -64:], o[:, -64:]) < 1e-10 and rel(r.final_state, s) < 1e-10


BAD = [
    ("k", dict(k=lambda t: t[:, :-1]), "like q"),
    ("v", dict(v=lambda t: t[:, :-1]), "expected shape"),
    ("g", dict(g=lambda t: t[..., :1]), "expected shape"),
    ("initial_state", dict(initial_state=lambda t: t[..., :2]), "expected shape"),
]


@pytest.mark.parametrize("arg,mutation,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_argument(arg, mutation, words):
    q, k, v, g, _, h0, do, _ = make(1, 6, 2, 4, 4, "g", 1)
    kw = dict(q=q, k=k, v=v, g=g, initial_state=h0)
    for name, f in mutation.items():
        kw[name] = f(kw[name])
    with pytest.raises(ValueError) as e:
        linear_attention(**kw)
    assert str(e.value).startswith(arg) and words in str(e.value)


def test_g_and_g_gamma_together_rejected():
    q, k, v, g, _, _, _, _ = make(1, 6, 2, 4, 4, "g", 1)
    with pytest.raises(ValueError, match="^g, g_gamma: give at most one"):
        linear_attention(q, k, v, g=g, g_gamma=torch.zeros(2, dtype=f64) - 0.1)
    with pytest.raises(ValueError, match="^q: expected 4 dims"):
        linear_attention(q[0], k, v)
