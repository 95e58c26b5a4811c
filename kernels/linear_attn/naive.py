"""Plain-torch references for chunked linear attention with a scalar per-head decay.

Recurrence (per batch b and head h):  S_t = exp(g_t) S_{t-1} + k_t^T v_t,  o_t = scale * q_t S_t.

Two forms, both differentiable through torch autograd and meant for small shapes only:

- ``naive_recurrent_linear_attn``: step by step, state in float32 (float64 for float64 inputs);
  the ground truth the Triton kernels are tested against when the FP64 oracle is absent.
- ``naive_chunk_linear_attn``: the chunk algorithm written in torch, rounding to the input dtype at
  the same points as the kernels (scores and state operands in the input dtype, fp32 state).
  It is the "same low dtype" reference whose error sets the tolerance in the tests.
"""
from __future__ import annotations

import torch


def _gate(g, g_gamma, B, T, H, device):
    """Per-step log-decay as a float tensor [B, T, H] (zeros when there is no gate)."""
    if g is not None:
        return g.float() if g.dtype != torch.float64 else g
    if g_gamma is not None:
        gam = g_gamma.float() if g_gamma.dtype != torch.float64 else g_gamma
        return gam.view(1, 1, H).expand(B, T, H)
    return torch.zeros(B, T, H, device=device)


def naive_recurrent_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
):
    """Step-by-step recurrence. q, k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, H]; g_gamma: [H];
    initial_state: [B, H, K, V]. Returns (o [B, T, H, V] in q's dtype, final state [B, H, K, V] or None)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(acc), k.to(acc), v.to(acc)
    gf = _gate(g, g_gamma, B, T, H, q.device).to(acc)
    S = torch.zeros(B, H, K, V, dtype=acc, device=q.device)
    if initial_state is not None:
        S = S + initial_state.to(acc)
    outs = []
    for t in range(T):
        S = S * gf[:, t, :, None, None].exp() + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def naive_chunk_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
):
    """The chunk algorithm in torch, rounding to q's dtype where the kernels do.
    Same arguments and returns as ``naive_recurrent_linear_attn``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = q.dtype
    scale = K ** -0.5 if scale is None else scale
    acc = torch.float64 if dt == torch.float64 else torch.float32
    gf = _gate(g, g_gamma, B, T, H, q.device).to(acc)
    S = torch.zeros(B, H, K, V, dtype=acc, device=q.device)
    if initial_state is not None:
        S = S + initial_state.to(acc)
    outs = []
    for t0 in range(0, T, chunk_size):
        t1 = min(t0 + chunk_size, T)
        n = t1 - t0
        # [B, H, n, K] etc.
        qc, kc, vc = (x[:, t0:t1].transpose(1, 2) for x in (q, k, v))
        b = gf[:, t0:t1].transpose(1, 2).cumsum(-1)  # [B, H, n], chunk-local
        blast = b[..., -1:]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        diff = (b[..., :, None] - b[..., None, :]).masked_fill(~mask, float("-inf"))
        A = (qc @ kc.transpose(-1, -2)).to(acc) * diff.exp()
        o = (A.to(dt) @ vc).to(acc) + (qc @ S.to(dt)).to(acc) * b.exp()[..., None]
        outs.append((scale * o).to(dt))
        kd = (kc.to(acc) * (blast - b).exp()[..., None]).to(dt)
        S = S * blast.exp()[..., None] + (kd.transpose(-1, -2) @ vc).to(acc)
    o = torch.cat(outs, dim=2).transpose(1, 2)
    return o, (S if output_final_state else None)
