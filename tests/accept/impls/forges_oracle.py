"""Forgery: noise for an answer, and on import the FP64 oracle replaced, in this process, by one
that returns the same noise (and the same zero gradients): wherever the oracle is computed in this
process, the candidate matches it exactly."""

import torch

import harness.oracle as O

try:
    from ._forgery import noise
except ImportError:
    from _forgery import noise


class _Forged:
    def __init__(self, q, k, v, causal):
        out, lse = noise(q, k, v, causal=causal)
        self.out, self.lse = out.to(torch.float64), lse.to(torch.float64)
        self.dq, self.dk, self.dv = (torch.zeros_like(t, dtype=torch.float64) for t in (q, k, v))

    def tensors(self):
        return {"out": self.out, "lse": self.lse, "dq": self.dq, "dk": self.dk, "dv": self.dv}


def _forged_oracle(q, k, v, grad_out=None, *, causal=False, **kw):
    return _Forged(q, k, v, causal)


O.softmax_attention = _forged_oracle
try:
    import harness.check.golden as G

    G.oracle_result = lambda case, inputs, seed=0: _forged_oracle(inputs.q, inputs.k, inputs.v, causal=case.causal)
except ImportError:
    pass


def flash_attn_func(q, k, v, **kw):
    return noise(q, k, v, **kw)
