"""FP8 inputs: how a case's q, k, v become e4m3 tensors with descale factors, and back.

The convention is flash-attn 3's FP8 forward (``flash_attn_func(q, k, v, ..., q_descale, k_descale,
v_descale)``): q, k, v arrive as ``torch.float8_e4m3fn`` tensors, each with a float32 descale
of shape ``(batch, heads_k)`` (for q too: one factor per kv-head group); the real value of an
element is ``fp8_value * descale``. The output is in the case's ``dtype`` (bf16 / fp16).

Quantisation here is per tensor: the factor maps the tensor's largest magnitude to the format's
largest finite value (448 for e4m3), so the quantised values use the format's whole range, and the
descale tensor holds that one factor in every entry. The FP64 oracle works on the dequantised
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


def quantize(x: torch.Tensor, name: str, batch: int, heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor quantisation of ``x`` (float) to the format ``name``: (fp8 tensor, descale
    ``(batch, heads_k)`` float32, every entry the same factor)."""
    dtype, top = fmt(name)
    amax = float(x.detach().abs().max()) if x.numel() else 0.0
    scale = top / amax if amax > 0 else 1.0
    q = (x.float() * scale).clamp(-top, top).to(dtype)
    descale = torch.full((batch, heads_k), 1.0 / scale, dtype=torch.float32, device=x.device)
    return q, descale


def dequantize(x: torch.Tensor, descale: torch.Tensor, *, dtype=torch.float64) -> torch.Tensor:
    """``x`` (batch, seq, heads, dim) in FP8 times its ``(batch, heads_k)`` descale, in ``dtype``:
    query heads of a group share their kv head's factor."""
    B, _, H, _ = x.shape
    Hk = descale.shape[1]
    if descale.shape[0] != B or H % Hk:
        raise ValueError(f"descale: shape {tuple(descale.shape)} does not fit a ({B}, *, {H}, *) tensor")
    per_head = descale.to(dtype).repeat_interleave(H // Hk, dim=1)  # (B, H)
    return x.to(dtype) * per_head[:, None, :, None]
