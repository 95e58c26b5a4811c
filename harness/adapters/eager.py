"""Eager torch attention: "the reference in the candidate's dtype", and the ``eager`` adapters.

These plain functions compute attention the way a careful eager implementation would in the
candidate's dtype: matmuls in the input dtype, softmax (resp. the linear-attention state and
decays) in float32. The tolerance engine measures how far *this* lands from the FP64 oracle to
learn what error a given dtype costs; a kernel is then judged against that yardstick.

Conventions are flash-attn's / FLA's, exactly as in :mod:`harness.oracle`:

* softmax: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv); masks bottom-right aligned
  (query i sees key j iff ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, -1 unbounded,
  ``causal`` sets right = 0); GQA: query head h reads kv head ``h // (Hq // Hk)``; softcap
  ``cap * tanh(s / cap)`` after the scale; a row with no visible key gives out 0, lse -inf and no
  gradient (never NaN).
* linear: q, k (B, T, H, K), v (B, T, H, V); ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``,
  ``o_t = scale * q_t S_t``.
"""

from __future__ import annotations

import math

import torch

from harness.adapters.base import (
    LinearAdapter,
    LinearOutput,
    SoftmaxAdapter,
    SoftmaxOutput,
    Unsupported,
    scale_kwargs,
)
from harness.adapters.registry import register
from harness.cases import LinearCase, SoftmaxCase

# Chunk length of the eager linear attention: FLA's chunk kernels use 64, so the eager reference
# rounds its intra-chunk products the same way; the decays are cumulated within a chunk only.
LINEAR_CHUNK = 64


# --------------------------------------------------------------------------------------------
# Softmax attention
# --------------------------------------------------------------------------------------------


def visibility_mask(sq: int, sk: int, causal: bool, window_size, device) -> torch.Tensor | None:
    """Boolean (sq, sk), True where query i may see key j under flash-attn's bottom-right
    convention; None when every key is visible (no causal mask, no window)."""
    left, right = (int(w) for w in window_size)
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + right
    if left >= 0:
        mask &= j >= i - left
    return mask


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised softmax attention in the input dtype with an fp32 softmax; differentiable.

    Args:
        q: (B, Sq, Hq, D); k: (B, Sk, Hk, D); v: (B, Sk, Hk, Dv); one float dtype; Hq % Hk == 0.
        causal: bottom-right aligned causal mask (flash-attn >= 2.1).
        softmax_scale: defaults to D ** -0.5.
        window_size: (left, right), -1 unbounded.
        softcap: > 0 applies ``softcap * tanh(scores / softcap)``.

    Returns:
        out (B, Sq, Hq, Dv) in the input dtype; lse (B, Hq, Sq) float32, natural log, -inf for rows
        that see no key (their out is 0 and they pass no gradient).

    Precision: Q K^T in the input dtype; scale, softcap, mask, softmax and lse in float32;
    probabilities cast back to the input dtype; P V in the input dtype. Memory: Sq x Sk fp32 scores.
    """
    _, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k: heads_q ({Hq}) must be a multiple of heads_k ({Hk})")
    scale = D**-0.5 if softmax_scale is None else float(softmax_scale)
    dt = q.dtype
    # Softmax precision: float32, or the input's own when wider (an fp64 run stays fp64).
    acc = torch.promote_types(dt, torch.float32)
    if Hk != Hq:
        k = k.repeat_interleave(Hq // Hk, dim=2)
        v = v.repeat_interleave(Hq // Hk, dim=2)
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D)
    s = torch.matmul(qh, kh.transpose(-1, -2)).to(acc) * scale  # (B, H, Sq, Sk) fp32 (or fp64)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = visibility_mask(Sq, Sk, causal, window_size, q.device)
    if mask is None and Sk > 0:
        p = torch.softmax(s, dim=-1)
        lse = torch.logsumexp(s, dim=-1)
    else:
        if mask is None:
            mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
        live = mask.any(dim=-1)  # (Sq,) rows that see at least one key
        # Dead rows are softmaxed over unmasked (finite) scores and then zeroed: masking them to
        # all -inf would make softmax and its backward produce NaN.
        s = s.masked_fill(~(mask | ~live.unsqueeze(-1)), -math.inf)
        p = torch.softmax(s, dim=-1) * live.unsqueeze(-1)
        lse = torch.logsumexp(s, dim=-1).masked_fill(~live, -math.inf)
    out = torch.matmul(p.to(dt), vh)  # (B, H, Sq, Dv)
    return out.transpose(1, 2), lse


def eager_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed variable-length batch, one :func:`eager_attention` per sequence.

    q: (total_q, Hq, D), k: (total_k, Hk, D), v: (total_k, Hk, Dv); cu_seqlens_q / _k: (B + 1,)
    int offsets from 0. Keyword arguments as :func:`eager_attention`.

    Returns out (total_q, Hq, Dv) in the input dtype and lse (Hq, total_q) float32.
    """
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    if len(cq) != len(ck):
        raise ValueError(f"cu_seqlens_k: expected {len(cq)} entries like cu_seqlens_q, got {len(ck)}")
    Hq, Dv = q.shape[1], v.shape[2]
    outs, lses = [], []
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        n_q = cq[b + 1] - cq[b]
        if n_q == 0:
            continue
        if ck[b + 1] == ck[b]:
            # No keys at all: every row is dead. Multiplying q by 0 keeps the graph connected.
            outs.append(q[qs, :, :1].expand(n_q, Hq, Dv).to(q.dtype) * 0)
            lses.append(torch.full((Hq, n_q), -math.inf, dtype=torch.float32, device=q.device))
            continue
        o, lse = eager_attention(q[qs].unsqueeze(0), k[ks].unsqueeze(0), v[ks].unsqueeze(0), **kwargs)
        outs.append(o[0])
        lses.append(lse[0])
    if not outs:
        return q.new_zeros(0, Hq, Dv), torch.zeros(Hq, 0, dtype=torch.float32, device=q.device)
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


# --------------------------------------------------------------------------------------------
# Linear attention
# --------------------------------------------------------------------------------------------


def eager_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated linear attention (FLA's simple_gla), matmuls in the input dtype; differentiable.

    Args:
        q, k: (B, T, H, K); v: (B, T, H, V), one float dtype.
        g: (B, T, H) per-step log-decay, or g_gamma: (H,) constant log-decay (at most one).
        scale: defaults to K ** -0.5.
        initial_state: (B, H, K, V), float32 preferred.

    Returns:
        o (B, T, H, V) in the input dtype; final_state (B, H, K, V) float32.

    Precision (mirrors FLA's chunk kernels): Q K^T, P V, Q S and K^T V are matmuls in the input
    dtype (the state is cast to it for Q S); decays exp(b_i - b_j) use the log-decay cumulated
    *within a chunk* of ``LINEAR_CHUNK`` steps, masked to -inf above the diagonal before exp,
    in float32; the state is carried in float32.
    """
    if g is not None and g_gamma is not None:
        raise ValueError("g, g_gamma: give at most one of them")
    B, T, H, K = q.shape
    V = v.shape[-1]
    # State and decays in float32, or the input's own precision when wider (fp64 stays fp64).
    dt, f32, dev = q.dtype, torch.promote_types(q.dtype, torch.float32), q.device
    scale = K**-0.5 if scale is None else float(scale)
    C = LINEAR_CHUNK
    N = max(1, -(-T // C))
    pad = N * C - T

    def chunks(x):  # (B, T, H, X) -> (B, H, N, C, X), zero-padded at the end
        x = torch.nn.functional.pad(x.transpose(1, 2), (0, 0, 0, pad))
        return x.reshape(B, H, N, C, x.shape[-1])

    qc, kc, vc = chunks(q), chunks(k), chunks(v.to(dt))
    if g is not None:
        gt = g.to(f32).transpose(1, 2)  # (B, H, T)
    elif g_gamma is not None:
        gt = g_gamma.to(f32).view(1, H, 1).expand(B, H, T)
    else:
        gt = torch.zeros(B, H, T, dtype=f32, device=dev)
    # Padded steps: log-decay 0 and zero k, v, so they change nothing.
    b = torch.nn.functional.pad(gt, (0, pad)).reshape(B, H, N, C).cumsum(-1)
    b_last = b[..., -1:]
    causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    decay = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(~causal, -math.inf).exp()  # (B, H, N, C, C)

    attn = torch.matmul(qc, kc.transpose(-1, -2)).to(f32) * decay * scale  # intra-chunk
    o_intra = torch.matmul(attn.to(dt), vc).to(f32)
    k_out = (kc.to(f32) * (b_last - b).exp().unsqueeze(-1)).to(dt)  # k_j exp(b_L - b_j)
    update = torch.matmul(k_out.transpose(-1, -2), vc).to(f32)  # (B, H, N, K, V)
    chunk_decay = b_last.exp().unsqueeze(-1)  # (B, H, N, 1, 1)

    state = (
        initial_state.to(f32) if initial_state is not None else torch.zeros(B, H, K, V, dtype=f32, device=dev)
    )
    states_in = []
    for n in range(N):
        states_in.append(state)
        state = state * chunk_decay[:, :, n] + update[:, :, n]
    s_in = torch.stack(states_in, dim=2)  # (B, H, N, K, V) state entering each chunk
    o_inter = torch.matmul(qc, s_in.to(dt)).to(f32) * (b.exp().unsqueeze(-1) * scale)
    o = (o_intra + o_inter).to(dt).reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2)
    return o, state


# --------------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------------


class EagerAdapter(SoftmaxAdapter):
    name = "eager"
    description = "materialised torch attention in the input dtype, fp32 softmax (every feature, varlen, lse)"

    def supports(self, case, device):
        return super().supports(case, device)

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        kw = dict(
            causal=case.causal,
            **scale_kwargs(case, "softmax_scale"),
            window_size=case.window,
            softcap=case.softcap,
        )
        if case.is_varlen:
            if cu_seqlens_q is None or cu_seqlens_k is None:
                raise Unsupported("varlen case given without cu_seqlens_q / cu_seqlens_k")
            out, lse = eager_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)
        else:
            out, lse = eager_attention(q, k, v, **kw)
        return SoftmaxOutput(out, lse)


def _fp8_heads(q, k, v, softmax_scale):
    """(group size, softmax scale, q, k, v as float32 (B, Hq, S, D) tensors, k and v repeated over each
    kv head's query heads) of FP8 q (B, Sq, Hq, D), k, v (B, Sk, Hk, D): the values stay in FP8 units."""
    Hq, Hk = q.shape[2], k.shape[2]
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k: heads_q ({Hq}) must be a multiple of heads_k ({Hk})")
    G = Hq // Hk
    scale = q.shape[3] ** -0.5 if softmax_scale is None else float(softmax_scale)
    return (G, scale, q.float().transpose(1, 2), k.float().repeat_interleave(G, dim=2).transpose(1, 2),
            v.float().repeat_interleave(G, dim=2).transpose(1, 2))


def eager_fp8_attention(q, k, v, q_descale, k_descale, v_descale, *, causal=False, softmax_scale=None,
                        window_size=(-1, -1), softcap=0.0, out_dtype=torch.bfloat16, block_n=None, out_fp8=""):
    """What an FP8 attention forward must compute (flash-attn 3's convention, :mod:`harness.fp8`).

    q, k, v in an FP8 format with ``(B, Hk)`` float32 descales. Q K^T from the FP8 values with
    float32 accumulation (the products of two FP8 values are exact in float32), times
    ``q_descale * k_descale * scale``; softcap and masks; the row maximum subtracted, P = exp(...)
    in float32 (at most 1) and its row sum l taken in float32; P cast to the inputs' FP8 format for
    P V (float32 accumulation); then ``v_descale / l``; out cast to ``out_dtype``. ``block_n``: None
    subtracts each row's final maximum; a number walks the keys in blocks of that size with a
    running maximum, as a flash kernel does (P is then quantised relative to the maximum so far:
    different roundings, equally correct). Rows that see no key: out 0, lse -inf. ``out_fp8``: an FP8
    format the output is written in before it is read back (:func:`harness.fp8.round_output`).
    """
    B, Sq, Hq, D = q.shape
    Sk = k.shape[1]
    G, scale, qh, kh, vh = _fp8_heads(q, k, v, softmax_scale)
    low = q.dtype
    factor = (q_descale.float() * k_descale.float()).repeat_interleave(G, dim=1)[:, :, None, None] * scale
    vs = v_descale.float().repeat_interleave(G, dim=1)[:, :, None, None]
    mask = visibility_mask(Sq, Sk, causal, window_size, q.device)
    step = Sk if block_n is None else max(1, int(block_n))
    m = torch.full((B, Hq, Sq, 1), float("-inf"), device=q.device)
    lsum = torch.zeros((B, Hq, Sq, 1), device=q.device)
    acc = torch.zeros((B, Hq, Sq, vh.shape[-1]), device=q.device)
    for j in range(0, Sk, step):
        s = torch.matmul(qh, kh[:, :, j : j + step].transpose(-1, -2)) * factor
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if mask is not None:
            s = s.masked_fill(~mask[:, j : j + step], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)  # float32, at most 1
        lsum = lsum * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + torch.matmul(p.to(low).float(), vh[:, :, j : j + step])
        m = m_new
    live = lsum > 0
    out = torch.where(live, acc * vs / torch.where(live, lsum, torch.ones_like(lsum)), torch.zeros_like(acc))
    lse = torch.where(live, m + torch.log(torch.where(live, lsum, torch.ones_like(lsum))),
                      torch.full_like(m, float("-inf")))
    out = out.transpose(1, 2)
    if out_fp8:
        from harness import fp8

        out = fp8.round_output(out, v_descale, out_fp8)
    return out.to(out_dtype), lse.squeeze(-1)


#: e4m3's largest value: P (<= 1) is quantised with this scale for the P^T dO product, as in the forward.
P_SCALE = 448.0
#: Elements of one (batch, heads, rows, keys) block of the FP8 backward (float32): query rows go in
#: chunks of at most this many scores, so long sequences fit (a 16k x 16k head is 1 GiB a matrix).
FP8_BWD_BLOCK = 2**26


def eager_fp8_attention_backward(q, k, v, q_descale, k_descale, v_descale, out, lse, grad_out, do_descale,
                                 ds_descale=None, dq_descale=None, dk_descale=None, dv_descale=None, *,
                                 causal=False, softmax_scale=None, window_size=(-1, -1), grad_fmt="e4m3",
                                 flaws=()):
    """What an FP8 attention backward must compute (cuDNN's ``sdpa_fp8_backward`` convention, harness.fp8).

    q, k, v in FP8 with ``(B, Hk)`` descales; ``out`` (B, Sq, Hq, Dv) the forward's output as real values
    (read back when it was written in FP8); ``lse`` (B, Hq, Sq) natural log; ``grad_out`` dO in the format
    ``grad_fmt`` with ``do_descale``. Per block of query rows, all float32 with FP8 operands:
    S = Q K^T x descales x scale, P = exp(S - lse) (0 on masked pairs and dead rows); dV += P^T dO with
    P quantised to e4m3 (scale 448, as in the forward); dP = dO V^T; D = rowsum(dO o O);
    dS = scale x P o (dP - D), the gradient of the unscaled scores Q K^T (cuDNN's: the softmax scale
    folded in), quantised to ``grad_fmt`` with ``ds_descale``; dQ = dS K, dK += dS^T Q (GQA: summed
    over a group's query heads). ``ds_descale``
    None: dS is not quantised (the pass :func:`harness.fp8.grad_descales` takes its amaxes from).
    ``dq/dk/dv_descale``: the gradients are written in ``grad_fmt`` with them and read back (``fp8_out``).
    Returns (dq, dk, dv, ds_amax), float32 real values. ``flaws``: deliberate defects for the wrong
    kernels of tests/wrong_impls.py ("do_descale_ignored", "ds_unscaled", "no_softmax_scale",
    "delta_from_fp8_units"); never set by the harness."""
    from harness import fp8

    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    G, scale, qh, kh, vh = _fp8_heads(q, k, v, softmax_scale)  # FP8 units
    grad_scale = 1.0 if "no_softmax_scale" in flaws else scale

    def per_q(descale):  # (B, Hk) -> (B, Hq, 1, 1)
        return descale.float().repeat_interleave(G, dim=1)[:, :, None, None]

    qd, kd, vd = per_q(q_descale), per_q(k_descale), per_q(v_descale)
    dod = torch.ones_like(qd) if "do_descale_ignored" in flaws else per_q(do_descale)
    doh = grad_out.float().transpose(1, 2)  # (B, Hq, Sq, Dv), FP8 units
    oh = out.float().transpose(1, 2)  # real values
    if "delta_from_fp8_units" in flaws:
        oh = oh / per_q(v_descale)
    lse4 = lse.float()[..., None]  # (B, Hq, Sq, 1)
    mask = visibility_mask(Sq, Sk, causal, window_size, q.device)
    low, top = fp8.fmt(grad_fmt)
    dsd = per_q(ds_descale) if ds_descale is not None else None
    dq = torch.zeros(B, Hq, Sq, D, device=q.device)
    dk = torch.zeros(B, Hq, Sk, D, device=q.device)
    dv = torch.zeros(B, Hq, Sk, vh.shape[-1], device=q.device)
    ds_amax = 0.0
    rows = max(1, FP8_BWD_BLOCK // max(1, B * Hq * Sk))
    for i in range(0, Sq, rows):
        sl = slice(i, i + rows)
        s = torch.matmul(qh[:, :, sl], kh.transpose(-1, -2)) * (qd * kd * scale)
        if mask is not None:
            s = s.masked_fill(~mask[sl], float("-inf"))
        live = torch.isfinite(lse4[:, :, sl])
        p = torch.where(live, torch.exp(s - torch.where(live, lse4[:, :, sl], torch.zeros_like(lse4[:, :, sl]))),
                        torch.zeros_like(s))
        p8 = (p * P_SCALE).to(torch.float8_e4m3fn).float()  # P in e4m3, P_SCALE units
        dv += torch.matmul(p8.transpose(-1, -2), doh[:, :, sl]) * (dod / P_SCALE)
        dp = torch.matmul(doh[:, :, sl], vh.transpose(-1, -2)) * (dod * vd)
        delta = (doh[:, :, sl] * dod * oh[:, :, sl]).sum(-1, keepdim=True)
        ds = p * (dp - delta) * grad_scale
        ds_amax = max(ds_amax, float(ds.abs().amax())) if ds.numel() else ds_amax
        if dsd is not None:
            if "ds_unscaled" in flaws:  # cast as it is: values past the format's top saturate, small ones vanish
                ds = ds.clamp(-top, top).to(low).float()
            else:
                ds = (ds / dsd).clamp(-top, top).to(low).float() * dsd
        dq[:, :, sl] = torch.matmul(ds, kh) * kd
        dk += torch.matmul(ds.transpose(-1, -2), qh[:, :, sl]) * qd
    dq = dq.transpose(1, 2)
    dk = dk.reshape(B, Hk, G, Sk, D).sum(2).transpose(1, 2)
    dv = dv.reshape(B, Hk, G, Sk, -1).sum(2).transpose(1, 2)
    if dq_descale is not None:
        dq, dk, dv = (fp8.round_to(t, d, grad_fmt) for t, d in ((dq, dq_descale), (dk, dk_descale), (dv, dv_descale)))
    return dq, dk, dv, ds_amax


class EagerFP8Adapter(SoftmaxAdapter):
    name = "eager_fp8"
    description = ("FP8 (e4m3) attention as an FP8 kernel must compute it: fp32-accumulated QK^T of the FP8 values, "
                   "descales, P quantised to FP8 for PV (the reference of FP8 cases)")
    fp8 = fp8_only = True
    differentiable = False
    fp8_backward = True
    #: deliberate defects of the backward (tests/wrong_impls.py); empty here
    flaws: tuple[str, ...] = ()

    def run(self, case: SoftmaxCase, *, q, k, v, q_descale=None, k_descale=None, v_descale=None,
            cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        if not case.fp8 or q_descale is None or k_descale is None or v_descale is None:
            raise Unsupported("eager_fp8 runs FP8 cases (quantised q, k, v with q/k/v_descale)")
        out, lse = eager_fp8_attention(q, k, v, q_descale, k_descale, v_descale, causal=case.causal,
                                       **scale_kwargs(case, "softmax_scale"), window_size=case.window,
                                       softcap=case.softcap, out_dtype=case.torch_dtype,
                                       out_fp8=case.fp8 if case.fp8_out else "")
        return SoftmaxOutput(out, lse)

    def run_fp8_backward(self, case, forward, *, q, k, v, q_descale, k_descale, v_descale, grad_out, do_descale,
                         ds_descale, dq_descale, dk_descale, dv_descale):
        if forward.lse is None:
            raise Unsupported("eager_fp8's backward needs the forward's lse")
        dq, dk, dv, _ = eager_fp8_attention_backward(
            q, k, v, q_descale, k_descale, v_descale, forward.out, forward.lse, grad_out, do_descale, ds_descale,
            *((dq_descale, dk_descale, dv_descale) if case.fp8_out else (None, None, None)), causal=case.causal,
            **scale_kwargs(case, "softmax_scale"), window_size=case.window, grad_fmt=case.fp8_grad, flaws=self.flaws)
        return dq, dk, dv


class EagerLinearAdapter(LinearAdapter):
    name = "eager_linear"
    description = f"chunked torch linear attention (chunk {LINEAR_CHUNK}), input-dtype matmuls, fp32 state"

    def supports(self, case, device):
        return super().supports(case, device)

    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput:
        o, state = eager_linear_attention(
            q, k, v, g=g, g_gamma=g_gamma, **scale_kwargs(case, "scale"), initial_state=initial_state
        )
        return LinearOutput(o, state)


register(EagerAdapter)
register(EagerFP8Adapter)
register(EagerLinearAdapter)
