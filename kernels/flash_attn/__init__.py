"""In-repo Triton flash attention (forward + backward), flash-attn's layout and conventions."""

from .interface import flash_attn_fp8_func, flash_attn_func, flash_attn_varlen_func, unsupported_reason

__all__ = ["flash_attn_fp8_func", "flash_attn_func", "flash_attn_varlen_func", "unsupported_reason"]
