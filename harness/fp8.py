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
"""

from __future__ import annotations

import torch

#: FP8 formats a case may ask for: name -> (torch dtype, largest finite value).
FORMATS: dict[str, tuple[torch.dtype, float]] = {"e4m3": (torch.float8_e4m3fn, 448.0)}
#: The descale inputs an FP8 case passes, in the order of flash-attn 3's keywords.
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


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


def round_output(out: torch.Tensor, v_descale: torch.Tensor, name: str) -> torch.Tensor:
    """An FP8 kernel's output as it is when written in the format ``name`` and read back: ``out``
    (batch, seq, heads, dim) times ``scale_o = 1 / v_descale`` (per (batch, kv head), shared by the
    group's query heads: |O| <= max|V| = 448 x v_descale, so the format's whole range is used),
    rounded to the format, divided back; float32. The reference of ``fp8_out`` cases does this, and
    an adapter whose kernel writes FP8 output reads it back the same way."""
    dtype, top = fmt(name)
    H = out.shape[2]
    vs = v_descale.float().repeat_interleave(H // v_descale.shape[1], dim=1)[:, None, :, None]  # (B, 1, H, 1)
    return ((out.float() / vs).clamp(-top, top).to(dtype).float() * vs)


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
