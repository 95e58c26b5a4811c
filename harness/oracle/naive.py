"""Independent naive formulas, float64, materialised, differentiable by autograd.

They share no code with the oracles and are only for small shapes: the tests compare the
oracles' values and analytic gradients against these and torch.autograd.
"""

from __future__ import annotations

import torch


def naive_softmax_attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0):
    """q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv) -> (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)).

    Builds the full (Sq, Sk) score matrix per head with an explicit per-element mask loop
    (written independently of the oracle's block mask). Rows with no visible key give out 0.
    """
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = D**-0.5 if softmax_scale is None else softmax_scale
    kk = k.repeat_interleave(Hq // Hk, dim=2)
    vv = v.repeat_interleave(Hq // Hk, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window_size
    if causal:
        right = 0
    allowed = [[True] * Sk for _ in range(Sq)]
    for i in range(Sq):
        for j in range(Sk):
            diag = i + Sk - Sq
            if right >= 0 and j > diag + right:
                allowed[i][j] = False
            if left >= 0 and j < diag - left:
                allowed[i][j] = False
    allowed = torch.tensor(allowed, dtype=torch.bool, device=q.device).reshape(Sq, Sk)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    row_ok = allowed.any(dim=-1)
    p = torch.where(row_ok[:, None], torch.exp(s - torch.where(row_ok, lse, 0.0)[..., None]), 0.0)
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return out, lse


def naive_linear_attention(q, k, v, *, g=None, g_gamma=None, scale=None, initial_state=None):
    """Step-by-step recurrence S_t = exp(g_t) S_{t-1} + k_t^T v_t, o_t = scale q_t S_t.

    q, k (B, T, H, K), v (B, T, H, V) -> (out (B, T, H, V), final_state (B, H, K, V)).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    S = initial_state if initial_state is not None else q.new_zeros(B, H, K, V)
    outs = []
    for t in range(T):
        if g is not None:
            S = S * torch.exp(g[:, t])[..., None, None]
        elif g_gamma is not None:
            S = S * torch.exp(g_gamma)[None, :, None, None]
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, dim=1), S
