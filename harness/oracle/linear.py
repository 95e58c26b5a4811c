"""FP64 chunked (gated) linear-attention oracle: forward, final state and analytic gradients.

FLA's conventions (``fla.ops.simple_gla``): q, k (B, T, H, K), v (B, T, H, V); per-step log-decay
``g`` (B, T, H) or constant per-head ``g_gamma`` (H,).

Recurrence:  S_t = exp(g_t) S_{t-1} + k_t^T v_t,   o_t = scale * q_t S_t,   S_0 = initial_state.

The sequence is cut into chunks of ``CHUNK`` steps. Within a chunk the decay between steps i >= j
is exp(b_i - b_j) with b the cumulative log-decay *inside the chunk*; differences are masked to
-inf above the diagonal before exp, so nothing is ever exponentiated over the whole sequence
(exp of a 64k-step cumulative log-decay underflows even float64). One state per chunk boundary is
kept for the backward; no T x T matrix is formed.

Gradient of the log-decay: with G_t the cumulative log-decay, every term of the loss that holds
exp(+G_t) is linear in q_t and every term with exp(-G_t) is linear in k_t, hence
dL/dG_t = q_t . dq_t - k_t . dk_t (+ <dS_T, S_T> at the last step), and dg is its reverse
cumulative sum (for g_gamma: summed over batch and time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Chunk length of the fp64 computation: long enough for large matmuls, short enough that a
# chunk's (CHUNK x CHUNK) intra-chunk block per head stays small.
CHUNK = 64


@dataclass
class LinearResult:
    """Oracle result, all float64 on the input's device.

    out: (B, T, H, V); final_state: (B, H, K, V); with grad_out: dq, dk (B, T, H, K), dv (B, T, H, V),
    dg (B, T, H) for ``g`` or (H,) for ``g_gamma`` (None without a gate), dh0 (B, H, K, V) when an
    initial state was given.
    """

    out: torch.Tensor
    final_state: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None
    dg: torch.Tensor | None = None
    dh0: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("out", "final_state", "dq", "dk", "dv", "dg", "dh0")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def _check(q, k, v, grad_out, g, g_gamma, initial_state, grad_final_state):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (batch, seqlen, heads, dim), got shape {tuple(t.shape)}")
    B, T, H, K = q.shape
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"k: expected shape {(B, T, H, K)} like q, got {tuple(k.shape)}")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v: expected shape ({B}, {T}, {H}, V), got {tuple(v.shape)}")
    V = v.shape[3]
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if g is not None and g_gamma is not None:
        raise ValueError("g, g_gamma: give at most one of them")
    expected = {
        "g": (B, T, H),
        "g_gamma": (H,),
        "initial_state": (B, H, K, V),
        "grad_final_state": (B, H, K, V),
        "grad_out": (B, T, H, V),
    }
    given = dict(g=g, g_gamma=g_gamma, initial_state=initial_state, grad_final_state=grad_final_state, grad_out=grad_out)
    for name, t in given.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating-point torch.Tensor of shape {expected[name]}")
        if tuple(t.shape) != expected[name]:
            raise ValueError(f"{name}: expected shape {expected[name]}, got {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device}, got {t.device}")


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor | None = None,
    *,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    grad_final_state: torch.Tensor | None = None,
) -> LinearResult:
    """Gated linear attention in float64 (chunked), forward and analytic gradients.

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V); any float dtype, one device.
        grad_out: (B, T, H, V), gradient of the loss w.r.t. out; enables the backward.
        g: (B, T, H) per-step log-decay, or g_gamma: (H,) constant per-head log-decay (at most
            one; neither means plain causal linear attention).
        scale: defaults to K ** -0.5.
        initial_state: (B, H, K, V) S_0 (zeros when None).
        grad_final_state: (B, H, K, V) gradient w.r.t. the final state (zeros when None).

    Returns:
        :class:`LinearResult` (out, final_state; dq, dk, dv, dg, dh0 with grad_out).
    """
    _check(q, k, v, grad_out, g, g_gamma, initial_state, grad_final_state)
    B, T, H, K = q.shape
    V = v.shape[3]
    C = CHUNK
    N = max(1, -(-T // C))
    pad = N * C - T
    dev, f64 = q.device, torch.float64
    scale = K**-0.5 if scale is None else float(scale)

    def chunks(x):  # (B, T, H, X) -> (B, H, N, C, X), zero-padded at the end
        x = x.to(f64).permute(0, 2, 1, 3)
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(B, H, N, C, x.shape[-1])

    qc, kc, vc = chunks(q), chunks(k), chunks(v)
    if g is not None:
        gt = g.to(f64).permute(0, 2, 1)  # (B, H, T)
    elif g_gamma is not None:
        gt = g_gamma.to(f64).view(1, H, 1).expand(B, H, T)
    else:
        gt = torch.zeros(B, H, T, dtype=f64, device=dev)
    # Padded steps get log-decay 0 (no decay) and zero k, v: they change nothing.
    gc = torch.nn.functional.pad(gt, (0, pad)).reshape(B, H, N, C)
    b = gc.cumsum(-1)  # cumulative log-decay inside each chunk only
    b_last = b[..., -1:]  # (B, H, N, 1)
    causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    diff = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, float("-inf"))
    decay = diff.exp()  # (B, H, N, C, C): exp(b_i - b_j) for j <= i, else 0
    q_in = qc * b.exp().unsqueeze(-1)  # q_i exp(b_i): reads the state entering the chunk
    k_out = kc * (b_last - b).exp().unsqueeze(-1)  # k_j exp(b_L - b_j): writes the state leaving it

    attn = torch.matmul(qc, kc.transpose(-1, -2)).mul_(decay).mul_(scale)  # (B, H, N, C, C)
    update = torch.matmul(k_out.transpose(-1, -2), vc)  # (B, H, N, K, V)
    chunk_decay = b_last.exp().unsqueeze(-1)  # (B, H, N, 1, 1)

    state = (
        initial_state.to(f64).clone() if initial_state is not None else torch.zeros(B, H, K, V, dtype=f64, device=dev)
    )
    states_in = torch.empty(B, H, N, K, V, dtype=f64, device=dev)  # state entering each chunk
    for n in range(N):
        states_in[:, :, n] = state
        state = state * chunk_decay[:, :, n] + update[:, :, n]
    final_state = state

    out_c = torch.matmul(attn, vc) + scale * torch.matmul(q_in, states_in)

    def unchunk(x):  # (B, H, N, C, X) -> (B, T, H, X)
        return x.reshape(B, H, N * C, x.shape[-1])[:, :, :T].permute(0, 2, 1, 3).contiguous()

    result = LinearResult(out=unchunk(out_c), final_state=final_state)
    if grad_out is None:
        return result

    doc = chunks(grad_out)
    # Reverse walk: dS_out[n] is the gradient w.r.t. the state leaving chunk n.
    w = scale * torch.matmul(q_in.transpose(-1, -2), doc)  # (B, H, N, K, V): chunk n's use of its input state
    dstate = (
        grad_final_state.to(f64).clone()
        if grad_final_state is not None
        else torch.zeros(B, H, K, V, dtype=f64, device=dev)
    )
    dstates_out = torch.empty(B, H, N, K, V, dtype=f64, device=dev)
    for n in reversed(range(N)):
        dstates_out[:, :, n] = dstate
        dstate = dstate * chunk_decay[:, :, n] + w[:, :, n]
    dh0 = dstate

    dattn = torch.matmul(doc, vc.transpose(-1, -2)).mul_(decay).mul_(scale)  # dL/d(q_i . k_j)
    dq_c = torch.matmul(dattn, kc) + scale * b.exp().unsqueeze(-1) * torch.matmul(doc, states_in.transpose(-1, -2))
    dk_c = torch.matmul(dattn.transpose(-1, -2), qc) + (b_last - b).exp().unsqueeze(-1) * torch.matmul(
        vc, dstates_out.transpose(-1, -2)
    )
    dv_c = torch.matmul(attn.transpose(-1, -2), doc) + torch.matmul(k_out, dstates_out)

    dq, dk, dv = unchunk(dq_c), unchunk(dk_c), unchunk(dv_c)
    result.dq, result.dk, result.dv = dq, dk, dv
    result.dh0 = dh0 if initial_state is not None else None
    if g is not None or g_gamma is not None:
        q64, k64 = q.to(f64), k.to(f64)
        dG = (q64 * dq).sum(-1) - (k64 * dk).sum(-1)  # (B, T, H)
        if grad_final_state is not None and T > 0:
            dG[:, -1] += (grad_final_state.to(f64) * final_state).sum((-1, -2))
        dg = dG.flip(1).cumsum(1).flip(1)  # dg_s = sum_{t >= s} dL/dG_t
        result.dg = dg if g is not None else dg.sum((0, 1))
    return result
