"""What the flash-attention kernel tests (test_flash_attn.py, test_flash_attn_wide.py) share: one
tolerance rule against the FP64 oracle for both kernels, and NaN-poisoned allocations (the decode tests too).

Tolerance rule: the kernel's error against the FP64 oracle may be at most ERR_FACTOR x the error of
a plain torch reference computed in the same dtype (fp32 softmax), plus a small per-dtype floor.
Errors are relative Frobenius norms.
"""

import torch

# The kernel may be this many times worse than the same-dtype torch reference: it rounds P and dS
# to the input dtype once per block like any fused kernel, and sums in a different order.
ERR_FACTOR = 3.0
# Absolute floor on the relative error: the reference can be exact by accident on tiny shapes
# (e.g. one key: P = 1), and fp32 answers differ from fp64 by summation order alone.
ERR_FLOOR = {torch.float32: 2e-6, torch.float16: 2e-4, torch.bfloat16: 2e-3}
# lse is always fp32 in the kernel; its error (absolute, natural-log units) is set by the dot.
LSE_ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def poison_allocations(monkeypatch):
    """Every torch.empty / empty_like / Tensor.new_empty made from now on starts as NaN (float), workspaces
    included: an output element a kernel forgot to write, or a workspace element read that no kernel wrote,
    shows up as NaN instead of as stale memory that looks fine. The kernels' kept workspace
    (kernels/launcher.py: the flash backward's and the decode split's scratch) is not kept meanwhile: every call's scratch is a fresh, poisoned one (a byte
    buffer: 0xFF bytes, NaN in every fp32 word)."""
    from kernels import launcher

    real_empty, real_empty_like, real_new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def _poison(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype == torch.uint8:
            t.fill_(0xFF)
        return t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: _poison(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: _poison(real_empty_like(*a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: _poison(real_new_empty(self, *a, **kw)))
    monkeypatch.setattr(launcher, "WORKSPACE_KEEP_BYTES", -1)


def rel_err(x, ref):
    """||x - ref|| / ||ref||; where ref is exactly 0 (e.g. dq with a single key) the rms of x instead:
    inputs are N(0, 1), so that is the error relative to an O(1) answer."""
    x, ref = x.double(), ref.double()
    denom = ref.norm() if ref.norm() > 0 else max(ref.numel(), 1) ** 0.5
    return ((x - ref).norm() / denom).item()


def within_tolerance(name, cand, ref_same_dtype, oracle, dtype):
    """Raise AssertionError naming the tensor if cand is NaN/inf or too far from the oracle."""
    assert torch.isfinite(cand).all(), f"{name}: non-finite values"
    c, r = rel_err(cand, oracle), rel_err(ref_same_dtype, oracle)
    bound = ERR_FACTOR * r + ERR_FLOOR[dtype]
    assert c <= bound, f"{name}: error {c:.3e} > {bound:.3e} (same-dtype torch reference {r:.3e})"


def assert_matches_oracle(out, lse, grads, ref_out, ref_grads, orc, dtype):
    """out and (dq, dk, dv) against the FP64 oracle ``orc`` by the tolerance rule (the same-dtype
    reference's ``ref_out`` / ``ref_grads`` set each bound), each gradient shaped like the oracle's
    in the inputs' dtype; lse with the oracle's -inf rows, no NaN, elsewhere within LSE_ATOL."""
    within_tolerance("out", out, ref_out, orc.out, dtype)
    for name, cand, ref, o in zip(("dq", "dk", "dv"), grads, ref_grads, (orc.dq, orc.dk, orc.dv)):
        assert cand.shape == o.shape and cand.dtype == dtype, name
        within_tolerance(name, cand, ref, o, dtype)
    masked = torch.isneginf(orc.lse)
    assert torch.equal(torch.isneginf(lse), masked), "lse: -inf pattern differs from the oracle's"
    assert not torch.isnan(lse).any()
    if (~masked).any():
        lse_err = (lse.double() - orc.lse)[~masked].abs().max().item()
        assert lse_err <= LSE_ATOL[dtype], f"lse: max abs error {lse_err:.3e}"
