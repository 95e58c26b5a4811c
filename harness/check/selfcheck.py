"""The main job's first step: the FP64 oracles against the independent naive formulas.

Forward and analytic gradients of :mod:`harness.oracle` against :mod:`harness.oracle.naive`
(autograd, float64) on tiny cases, softmax and linear; each a :class:`SelfCheck`, OK when the
largest relative error is below :data:`SELF_CHECK_RTOL`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: The oracles are float64 throughout and so are the naive formulas: they agree to rounding
#: (~1e-16); anything above this is a bug in one of them.
SELF_CHECK_RTOL = 1e-10


@dataclass
class SelfCheck:
    name: str
    max_rel_error: float
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _rel(a, b) -> float:
    import torch

    keep = torch.isfinite(b)
    if not bool((torch.isfinite(a) == keep).all()):
        return float("inf")  # non-finite in different places (e.g. lse -inf vs a number)
    a, b = a[keep], b[keep]
    if b.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _softmax_self_checks() -> list[tuple[str, float]]:
    import torch

    from harness.oracle import softmax_attention, softmax_attention_varlen
    from harness.oracle.naive import naive_softmax_attention

    gen = torch.Generator().manual_seed(1234)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    configs = [
        ("softmax B2-H2-S5x7-D4", dict(sq=5, sk=7, hq=2, hk=2, kw={})),
        ("softmax B2-H4/2-S5x7-D4-causal", dict(sq=5, sk=7, hq=4, hk=2, kw=dict(causal=True))),
        ("softmax B2-H2/1-S7x5-D4-causal (masked rows)", dict(sq=7, sk=5, hq=2, hk=1, kw=dict(causal=True))),
        ("softmax B2-H2-S9x9-D4-win2x1", dict(sq=9, sk=9, hq=2, hk=2, kw=dict(window_size=(2, 1)))),
        ("softmax B2-H2-S6x6-D4-cap2", dict(sq=6, sk=6, hq=2, hk=2, kw=dict(softcap=2.0))),
    ]
    out = []
    for name, c in configs:
        q = rnd(2, c["sq"], c["hq"], 4).requires_grad_()
        k = rnd(2, c["sk"], c["hk"], 4).requires_grad_()
        v = rnd(2, c["sk"], c["hk"], 3).requires_grad_()
        do = rnd(2, c["sq"], c["hq"], 3)
        o_ref, lse_ref = naive_softmax_attention(q, k, v, **c["kw"])
        grads = torch.autograd.grad(o_ref, (q, k, v), do)
        r = softmax_attention(q.detach(), k.detach(), v.detach(), do, **c["kw"])
        errs = [_rel(r.out, o_ref.detach()), _rel(r.lse, lse_ref.detach())]
        errs += [_rel(a, b) for a, b in zip((r.dq, r.dk, r.dv), grads)]
        out.append((name, max(errs)))
    # varlen against one naive call per sequence (a zero-length query sequence included)
    lens = [(3, 5), (0, 2), (4, 4)]
    q, k, v = rnd(7, 2, 4), rnd(11, 1, 4), rnd(11, 1, 3)
    do = rnd(7, 2, 3)
    cq = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    ck = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    r = softmax_attention_varlen(q, k, v, cq, ck, do, causal=True)
    errs = []
    for b, (lq, _lk) in enumerate(lens):
        if lq == 0:
            continue
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        o_ref, lse_ref = naive_softmax_attention(q[qs][None], k[ks][None], v[ks][None], causal=True)
        errs += [_rel(r.out[qs], o_ref[0]), _rel(r.lse[:, qs], lse_ref[0])]
    out.append(("softmax varlen[3x5,0x2,4x4]-causal (forward)", max(errs)))
    return out


def _linear_self_checks() -> list[tuple[str, float]]:
    import torch

    from harness.oracle import linear_attention
    from harness.oracle.naive import naive_linear_attention

    gen = torch.Generator().manual_seed(4321)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    B, T, H, K, V = 2, 70, 2, 4, 3  # T crosses the oracle's 64-step chunk boundary
    out = []
    for gate in ("none", "g", "g_gamma"):
        q, k, v = (
            rnd(B, T, H, K).requires_grad_(),
            rnd(B, T, H, K).requires_grad_(),
            rnd(B, T, H, V).requires_grad_(),
        )
        g = torch.nn.functional.logsigmoid(rnd(B, T, H)).requires_grad_() if gate == "g" else None
        gg = torch.nn.functional.logsigmoid(3 + rnd(H)).requires_grad_() if gate == "g_gamma" else None
        h0 = rnd(B, H, K, V).requires_grad_()
        do, dht = rnd(B, T, H, V), rnd(B, H, K, V)
        o_ref, s_ref = naive_linear_attention(q, k, v, g=g, g_gamma=gg, initial_state=h0)
        leaves = [t for t in (q, k, v, g if g is not None else gg, h0) if t is not None]
        grads = torch.autograd.grad((o_ref, s_ref), leaves, (do, dht))
        r = linear_attention(
            q.detach(),
            k.detach(),
            v.detach(),
            do,
            g=None if g is None else g.detach(),
            g_gamma=None if gg is None else gg.detach(),
            initial_state=h0.detach(),
            grad_final_state=dht,
        )
        mine = [r.dq, r.dk, r.dv] + ([r.dg] if gate != "none" else []) + [r.dh0]
        errs = [_rel(r.out, o_ref.detach()), _rel(r.final_state, s_ref.detach())]
        errs += [_rel(a, b) for a, b in zip(mine, grads)]
        out.append((f"linear B{B}-H{H}-T{T}-K{K}V{V}-{gate}-h0-dhT", max(errs)))
    return out


def self_checks() -> list[SelfCheck]:
    """The oracles against the naive formulas: forward and gradients, float64, tiny shapes."""
    results = []
    for group in (_softmax_self_checks, _linear_self_checks):
        try:
            for name, err in group():
                ok = err <= SELF_CHECK_RTOL
                results.append(
                    SelfCheck(name, err, ok, "" if ok else f"max rel error {err:.3g} > {SELF_CHECK_RTOL:g}")
                )
        except Exception as e:  # an oracle that crashes is a failed self-check, not a crashed job
            results.append(
                SelfCheck(group.__name__.strip("_"), float("inf"), False, f"{type(e).__name__}: {e}")
            )
    return results
