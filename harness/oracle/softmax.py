"""FP64 softmax-attention oracle: forward (out, lse) and analytic gradients, memory-linear.

Conventions (flash-attn's; see README "Oracle conventions"):

* Layout: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv); out (B, Sq, Hq, Dv); lse (B, Hq, Sq).
* GQA/MQA: query head h reads kv head ``h // (Hq // Hk)``.
* Masks are bottom-right aligned: with ``offset = Sk - Sq``, query i sees key j iff
  ``i + offset - left <= j <= i + offset + right`` (a bound of -1 is unbounded); ``causal`` sets
  right = 0.
* ``softcap > 0``: scores become ``softcap * tanh(scores / softcap)`` (after the scale).
* A query row that sees no key has out = 0, lse = -inf, and contributes nothing to any gradient.

The computation walks over blocks of query rows; each block sees the full key range it can see,
so its softmax is exact and the forward and backward of that block are finished in one visit.
Nothing of size Sq x Sk is ever held: peak memory is one block's score tile plus the inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Elements of one block's fp64 score tile (batch x heads x block_q x keys). About six tiles are
# alive at the peak of the backward (scores, probabilities, dP/dS, logsumexp's and the mask's
# temporaries), so 2**20 elements (8 MiB) on a CPU keep the live peak near 60 MiB at seqlen 8192
# (measured: tests/oracle, test_memory_is_linear_in_sequence_length); a GPU gets 2**26 (512 MiB
# per tile) so its matmuls are large enough to run near the float64 matmul rate.
TILE_ELEMENTS = {"cpu": 2**20, "cuda": 2**26}


@dataclass
class SoftmaxResult:
    """Oracle result, all float64 on the input's device.

    out: (B, Sq, Hq, Dv); lse: (B, Hq, Sq) natural-log sum-exp of the scaled (capped) scores,
    -inf for rows with no visible key; dq, dk, dv: shaped like q, k, v (None without grad_out).
    For the varlen entry point the leading batch dimension is absent and lse is (Hq, total_q).
    """

    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor | None = None
    dk: torch.Tensor | None = None
    dv: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        names = ("out", "lse", "dq", "dk", "dv")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def _check_float(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")


def _check_options(window_size, softcap, softmax_scale) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair (left, right) of ints, got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each bound must be >= 0 or -1 (unbounded), got {window_size!r}")
    if softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"softcap: expected a finite value >= 0, got {softcap!r}")
    if softmax_scale is not None and not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite number or None, got {softmax_scale!r}")
    return left, right


def _check_dense(q, k, v, grad_out) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims (batch, seqlen, heads, dim), got shape {tuple(t.shape)}")
    B, Sq, Hq, D = q.shape
    if k.shape[0] != B:
        raise ValueError(f"k: batch {k.shape[0]} does not match q's batch {B}; expected ({B}, seqlen_k, heads_k, {D})")
    if k.shape[3] != D:
        raise ValueError(f"k: head dim {k.shape[3]} does not match q's {D}; expected ({B}, seqlen_k, heads_k, {D})")
    Sk, Hk = k.shape[1], k.shape[2]
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k: heads_q ({Hq}) must be a multiple of heads_k ({Hk})")
    if v.shape[:3] != (B, Sk, Hk):
        raise ValueError(f"v: expected shape ({B}, {Sk}, {Hk}, d_v) to match k, got {tuple(v.shape)}")
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}")
    if grad_out is not None:
        _check_float("grad_out", grad_out)
        want = (B, Sq, Hq, v.shape[3])
        if tuple(grad_out.shape) != want:
            raise ValueError(f"grad_out: expected shape {want} (the output's), got {tuple(grad_out.shape)}")
        if grad_out.device != q.device:
            raise ValueError(f"grad_out: expected device {q.device}, got {grad_out.device}")


def _tile_rows(device: torch.device, batch_heads: int, seqlen_k: int) -> int:
    budget = TILE_ELEMENTS["cuda" if device.type == "cuda" else "cpu"]
    return max(1, budget // max(1, batch_heads * max(seqlen_k, 1)))


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> SoftmaxResult:
    """Softmax attention in float64, forward and (with ``grad_out``) analytic gradients.

    Args:
        q: (batch, seqlen_q, heads_q, d); k: (batch, seqlen_k, heads_k, d);
        v: (batch, seqlen_k, heads_k, d_v); any float dtype, one device. heads_q % heads_k == 0.
        grad_out: (batch, seqlen_q, heads_q, d_v), the gradient of the loss w.r.t. out.
        causal: bottom-right aligned causal mask (flash-attn >= 2.1).
        softmax_scale: defaults to d ** -0.5.
        window_size: (left, right) local window, -1 meaning unbounded.
        softcap: > 0 applies softcap * tanh(scores / softcap).

    Returns:
        :class:`SoftmaxResult` with out (B, Sq, Hq, Dv), lse (B, Hq, Sq), and dq, dk, dv.
        Rows that see no key: out 0, lse -inf, zero gradient contribution.
    """
    _check_dense(q, k, v, grad_out)
    left, right = _check_options(window_size, softcap, softmax_scale)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if causal:
        right = 0
    return _attention_fp64(q, k, v, grad_out, scale, left, right, float(softcap))


def _attention_fp64(q, k, v, grad_out, scale, left, right, softcap) -> SoftmaxResult:
    B, Sq, Hq, D = q.shape
    Sk, Hk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = Hq // Hk
    dev = q.device
    f64 = torch.float64
    # (B, Hk, G, S, D): query head h = kv * G + g, so a kv head's group is contiguous.
    qh = q.to(f64).permute(0, 2, 1, 3).reshape(B, Hk, G, Sq, D)
    kh = k.to(f64).permute(0, 2, 1, 3).unsqueeze(2)  # (B, Hk, 1, Sk, D)
    vh = v.to(f64).permute(0, 2, 1, 3).unsqueeze(2)  # (B, Hk, 1, Sk, Dv)
    out = torch.zeros(B, Hk, G, Sq, Dv, dtype=f64, device=dev)
    lse = torch.full((B, Hk, G, Sq), -math.inf, dtype=f64, device=dev)
    want_grad = grad_out is not None
    if want_grad:
        doh = grad_out.to(f64).permute(0, 2, 1, 3).reshape(B, Hk, G, Sq, Dv)
        dq = torch.zeros_like(qh)
        dk = torch.zeros(B, Hk, Sk, D, dtype=f64, device=dev)
        dv = torch.zeros(B, Hk, Sk, Dv, dtype=f64, device=dev)

    offset = Sk - Sq
    rows = _tile_rows(dev, B * Hq, Sk)
    for i0 in range(0, Sq, rows):
        i1 = min(Sq, i0 + rows)
        # Keys any row of this block can see: skip fully masked key ranges (halves causal work).
        j0 = 0 if left < 0 else max(0, i0 + offset - left)
        j1 = Sk if right < 0 else min(Sk, i1 - 1 + offset + right + 1)
        if j1 <= j0:
            continue  # every row of the block sees nothing: out 0, lse -inf, no gradient
        qb, kb, vb = qh[:, :, :, i0:i1], kh[:, :, :, j0:j1], vh[:, :, :, j0:j1]
        # The scale is folded into the (small) query block: one pass over the tile saved.
        s = torch.matmul(qb * scale, kb.transpose(-1, -2))  # (B, Hk, G, bq, bk)
        if softcap > 0:
            s.div_(softcap).tanh_()
            tanh_s = s.clone() if want_grad else None
            s.mul_(softcap)
        mask = _block_mask(i0, i1, j0, j1, offset, left, right, dev)
        if mask is not None:
            s.masked_fill_(~mask, -math.inf)
        lse_b = torch.logsumexp(s, dim=-1, keepdim=True)  # -inf for rows that see no key
        # Fused softmax (one read, one write of the tile); rows that see no key come out NaN
        # and are zeroed by row, which costs a pass only when such rows exist.
        p = torch.softmax(s, dim=-1)
        del s
        dead = torch.isneginf(lse_b)
        if bool(dead.any()):
            p.masked_fill_(dead, 0.0)
        ob = torch.matmul(p, vb)
        out[:, :, :, i0:i1] = ob
        lse[:, :, :, i0:i1] = lse_b.squeeze(-1)
        if not want_grad:
            continue
        dob = doh[:, :, :, i0:i1]
        delta = (dob * ob).sum(dim=-1, keepdim=True)  # D = rowsum(dO * O)
        dp = torch.matmul(dob, vb.transpose(-1, -2))
        ds = dp.sub_(delta).mul_(p)  # dS = P * (dP - D), in place over dP
        if softcap > 0:
            ds.mul_(tanh_s.square_().neg_().add_(1.0))  # d(cap * tanh(x / cap))/dx = 1 - tanh^2
        dq[:, :, :, i0:i1] = torch.matmul(ds, kb).mul_(scale)
        dk[:, :, j0:j1] += torch.matmul(ds.transpose(-1, -2), qb).sum(dim=2).mul_(scale)
        dv[:, :, j0:j1] += torch.matmul(p.transpose(-1, -2), dob).sum(dim=2)

    result = SoftmaxResult(
        out=out.reshape(B, Hq, Sq, Dv).permute(0, 2, 1, 3).contiguous(),
        lse=lse.reshape(B, Hq, Sq).contiguous(),
    )
    if want_grad:
        result.dq = dq.reshape(B, Hq, Sq, D).permute(0, 2, 1, 3).contiguous()
        result.dk = dk.permute(0, 2, 1, 3).contiguous()
        result.dv = dv.permute(0, 2, 1, 3).contiguous()
    return result


def _block_mask(i0, i1, j0, j1, offset, left, right, device):
    """Boolean (bq, bk) visibility of rows i0:i1 against keys j0:j1, or None when all visible."""
    if left < 0 and right < 0:
        return None
    i = torch.arange(i0, i1, device=device).unsqueeze(1) + offset
    j = torch.arange(j0, j1, device=device).unsqueeze(0)
    mask = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + right
    if left >= 0:
        mask &= j >= i - left
    return None if bool(mask.all()) else mask


def _check_cu_seqlens(name: str, cu, total: int, batch: int | None) -> list[int]:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.is_floating_point() or cu.is_complex():
        raise ValueError(f"{name}: expected a 1-D integer tensor of shape (batch + 1,), got {cu!r:.80}")
    vals = [int(x) for x in cu.tolist()]
    if batch is not None and len(vals) != batch + 1:
        raise ValueError(f"{name}: expected shape ({batch + 1},) like cu_seqlens_q, got ({len(vals)},)")
    if not vals or vals[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {vals[:1]}")
    if any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(f"{name}: must be non-decreasing, got {vals}")
    if vals[-1] != total:
        raise ValueError(f"{name}: last entry {vals[-1]} must equal the packed length {total}")
    return vals


def softmax_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    grad_out: torch.Tensor | None = None,
    *,
    causal: bool = False,
    softmax_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> SoftmaxResult:
    """Variable-length batch in flash-attn's packed convention.

    q: (total_q, heads_q, d), k: (total_k, heads_k, d), v: (total_k, heads_k, d_v);
    cu_seqlens_q / cu_seqlens_k: (batch + 1,) int offsets starting at 0. Sequence b is
    q[cu_q[b]:cu_q[b+1]] against k/v[cu_k[b]:cu_k[b+1]]; zero-length sequences are allowed
    (a query with no keys is a masked row: out 0, lse -inf).

    Returns out (total_q, heads_q, d_v), lse (heads_q, total_q) and dq, dk, dv like q, k, v.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_float(name, t)
        if t.dim() != 3:
            raise ValueError(f"{name}: expected 3 dims (total_tokens, heads, dim), got shape {tuple(t.shape)}")
    left, right = _check_options(window_size, softcap, softmax_scale)
    Hq, D = q.shape[1], q.shape[2]
    if k.shape[2] != D:
        raise ValueError(f"k: head dim {k.shape[2]} does not match q's {D}")
    Hk = k.shape[1]
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k: heads_q ({Hq}) must be a multiple of heads_k ({Hk})")
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v: expected shape ({k.shape[0]}, {Hk}, d_v) to match k, got {tuple(v.shape)}")
    if grad_out is not None:
        _check_float("grad_out", grad_out)
        want = (q.shape[0], Hq, v.shape[2])
        if tuple(grad_out.shape) != want:
            raise ValueError(f"grad_out: expected shape {want} (the output's), got {tuple(grad_out.shape)}")
    cq = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], None)
    ck = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], len(cq) - 1)
    scale = D**-0.5 if softmax_scale is None else float(softmax_scale)
    if causal:
        right = 0

    dev, f64 = q.device, torch.float64
    out = torch.zeros(q.shape[0], Hq, v.shape[2], dtype=f64, device=dev)
    lse = torch.full((Hq, q.shape[0]), -math.inf, dtype=f64, device=dev)
    grads = grad_out is not None
    if grads:
        dq, dk, dv = (torch.zeros(t.shape, dtype=f64, device=dev) for t in (q, k, v))
    for b in range(len(cq) - 1):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if cq[b + 1] == cq[b]:
            continue
        if ck[b + 1] == ck[b]:
            continue  # no keys: masked rows, already out 0 / lse -inf / zero grads
        r = _attention_fp64(
            q[qs].unsqueeze(0), k[ks].unsqueeze(0), v[ks].unsqueeze(0),
            grad_out[qs].unsqueeze(0) if grads else None, scale, left, right, float(softcap),
        )
        out[qs] = r.out[0]
        lse[:, qs] = r.lse[0]
        if grads:
            dq[qs], dk[ks], dv[ks] = r.dq[0], r.dk[0], r.dv[0]
    result = SoftmaxResult(out=out, lse=lse)
    if grads:
        result.dq, result.dk, result.dv = dq, dk, dv
    return result
