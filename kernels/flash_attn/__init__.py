"""In-repo Triton flash attention (forward + backward), flash-attn's layout and conventions."""

from .interface import (
    FP8_GRAD_DTYPES,
    FP8_OUT_DTYPES,
    flash_attn_fp8_bwd_func,
    flash_attn_fp8_func,
    flash_attn_func,
    flash_attn_varlen_func,
    fp8_bwd_unsupported_reason,
    unsupported_reason,
)

__all__ = ["FP8_GRAD_DTYPES", "FP8_OUT_DTYPES", "flash_attn_fp8_bwd_func", "flash_attn_fp8_func", "flash_attn_func", "flash_attn_varlen_func",
           "fp8_bwd_unsupported_reason", "unsupported_reason"]
