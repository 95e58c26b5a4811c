"""FP8 inputs: how a case's q, k, v become e4m3 tensors with descale factors, and back.

The convention is flash-attn 3's FP8 forward (``flash_attn_func(q, k, v, ..., q_descale, k_descale,
v_descale)``): q, k, v arrive as ``torch.float8_e4m3fn`` tensors, each with a float32 descale
of shape ``(batch, heads_k)`` (for q too: one factor per kv-head group); the real value of an
element is ``fp8_value * descale``. The output is in the case's ``dtype`` (bf16 / fp16).

Quantisation here is per tensor (the factor maps the tensor's largest magnitude to the format's
largest finite value, 448 for e4m3, so the quantised values use the format's whole range; the
descale tensor holds that one factor in every entry) or, with the case knob ``fp8_per_head``, per
(sequence, kv head). The FP64 oracle works on the dequantised
values (``fp8_value * descale`` in float64): the error of quantising the inputs is not the kernel's.

The backward (cases with ``fp8_grad``: cuDNN's ``sdpa_fp8_backward`` convention) adds dO in the gradients'
format (e4m3 or e5m2) with its descale and the descales of what the kernel quantises (dS, and FP8
gradients): :data:`GRAD_DESCALE_NAMES`, :func:`grad_descales`; the oracle also sees dO dequantised.
"""

from __future__ import annotations

import torch

#: FP8 formats a case may ask for: name -> (torch dtype, largest finite value).
FORMATS: dict[str, tuple[torch.dtype, float]] = {"e4m3": (torch.float8_e4m3fn, 448.0),
                                                  "e5m2": (torch.float8_e5m2, 57344.0)}
#: Formats q, k, v may come in (e5m2 only for gradients: its 2 mantissa bits are the backward's trade).
INPUT_FORMATS = ("e4m3",)
#: The descale inputs an FP8 case passes, in the order of flash-attn 3's keywords.
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")
#: The extra inputs of an FP8 case that checks gradients (``fp8_grad``), each (batch, heads_k) float32:
#: dO's descale (dO arrives in the ``fp8_grad`` format), and the descales the kernel quantises with:
#: dS (the gradient of the unscaled scores Q K^T, softmax scale folded in: cuDNN's ``descale_dP``;
#: quantised for the dQ and dK matmuls) and, for ``fp8_out`` cases, its FP8
#: dQ, dK, dV. Each factor is amax / the format's largest value, the amax taken from the FP8 reference's
#: own fp32 values of that tensor (what delayed scaling converges to; :func:`grad_descales`).
#: ``fp8_grad`` cases draw dO at this magnitude (standard normal times it): a loss averaged over
#: thousands of tokens gives gradients this small, so a backward that casts dO or dS to FP8 without
#: their scales flushes them towards zero and fails, as it would in training.
GRAD_OUT_MAGNITUDE = 2.0**-12
GRAD_DESCALE_NAMES = ("do_descale", "ds_descale", "dq_descale", "dk_descale", "dv_descale")


def fmt(name: str) -> tuple[torch.dtype, float]:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"fp8: expected one of {', '.join(FORMATS)}, got {name!r}") from None


def quantize(x: torch.Tensor, name: str, heads_k: int, *, per_head: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` (batch, seq, heads, dim) to the format ``name``: (fp8 tensor, descale
    ``(batch, heads_k)`` float32). Per tensor: one factor in every entry. ``per_head``: one factor
    per (sequence, kv head), shared by the query heads of its group."""
    dtype, top = fmt(name)
    B, S, H, D = x.shape
    if per_head:
        amax = x.detach().float().abs().reshape(B, S, heads_k, H // heads_k, D).amax(dim=(1, 3, 4))  # (B, Hk)
    else:
        amax = torch.full((B, heads_k), float(x.detach().abs().max()) if x.numel() else 0.0)
    amax = amax.to(device=x.device, dtype=torch.float32)
    scale = torch.where(amax > 0, top / amax.clamp_min(1e-30), torch.ones_like(amax))  # (B, Hk)
    per = scale.repeat_interleave(H // heads_k, dim=1)[:, None, :, None]
    q = (x.float() * per).clamp(-top, top).to(dtype)
    return q, (1.0 / scale).contiguous()


def descale_for(amax: float, name: str, batch: int, heads_k: int, device) -> torch.Tensor:
    """The (batch, heads_k) float32 descale that maps ``amax`` to the format's largest value (1 for 0)."""
    top = fmt(name)[1]
    value = amax / top if amax > 0 else 1.0
    return torch.full((batch, heads_k), value, dtype=torch.float32, device=device)


def round_to(x: torch.Tensor, descale: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` (batch, seq, heads, dim) as written in the format ``name`` with the (batch, heads_k)
    ``descale`` (divided by it, clamped to the format's range, rounded) and read back; float32."""
    dtype, top = fmt(name)
    H = x.shape[2]
    ds = descale.float().repeat_interleave(H // descale.shape[1], dim=1)[:, None, :, None]  # (B, 1, H, 1)
    return (x.float() / ds).clamp(-top, top).to(dtype).float() * ds


def round_output(out: torch.Tensor, v_descale: torch.Tensor, name: str) -> torch.Tensor:
    """An FP8 kernel's output as it is when written in the format ``name`` and read back: ``out``
    (batch, seq, heads, dim) times ``scale_o = 1 / v_descale`` (per (batch, kv head), shared by the
    group's query heads: |O| <= max|V| = 448 x v_descale, so the format's whole range is used),
    rounded to the format, divided back; float32. The reference of ``fp8_out`` cases does this, and
    an adapter whose kernel writes FP8 output reads it back the same way."""
    return round_to(out, v_descale, name)


def dequantize(x: torch.Tensor, descale: torch.Tensor, *, dtype=torch.float64) -> torch.Tensor:
    """``x`` (batch, seq, heads, dim) in FP8 times its ``(batch, heads_k)`` descale, in ``dtype``:
    query heads of a group share their kv head's factor."""
    B, _, H, _ = x.shape
    Hk = descale.shape[1]
    if descale.shape[0] != B or H % Hk:
        raise ValueError(f"descale: shape {tuple(descale.shape)} does not fit a ({B}, *, {H}, *) tensor")
    per_head = descale.to(dtype).repeat_interleave(H // Hk, dim=1)  # (B, H)
    return x.to(dtype) * per_head[:, None, :, None]


def read_back(out: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An FP8 output (batch, seq, heads, dim) as its real values in ``dtype``: ``out x descale``,
    the descale ``(batch, heads_k)`` (query heads of a group share their kv head's factor) or a
    single element (one factor for the tensor). :func:`round_output` is the reference's side of the
    same convention."""
    if descale.numel() == 1:
        return (out.float() * descale.float().reshape(())).to(dtype)
    if descale.dim() != 2:
        raise ValueError(f"out_descale: expected (batch, heads_k) or one element, got shape {tuple(descale.shape)}")
    return dequantize(out, descale, dtype=torch.float32).to(dtype)


def grad_descales(case, inputs) -> None:
    """Set ``inputs``' ds / dq / dk / dv descales (an ``fp8_grad`` case, dO already quantised): each
    the amax of that tensor in the FP8 reference's backward taken in float32 without quantising dS or
    the gradients (:func:`harness.adapters.eager.eager_fp8_attention_backward`), over the format's
    largest value: the scale delayed scaling converges to, so the format's whole range is used."""
    from harness.adapters.eager import eager_fp8_attention, eager_fp8_attention_backward

    kw = {"causal": case.causal, "softmax_scale": case.scale, "window_size": case.window}
    x = inputs
    out, lse = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, softcap=case.softcap,
                                   out_dtype=torch.float32, **kw)
    dq, dk, dv, ds_amax = eager_fp8_attention_backward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale,
                                                       out, lse, x.grad_out, x.do_descale, grad_fmt=case.fp8_grad,
                                                       **kw)
    B, Hk, dev = case.batch, case.heads_k, x.q.device
    x.ds_descale = descale_for(ds_amax, case.fp8_grad, B, Hk, dev)
    x.dq_descale, x.dk_descale, x.dv_descale = (
        descale_for(float(t.abs().amax()) if t.numel() else 0.0, case.fp8_grad, B, Hk, dev) for t in (dq, dk, dv))
