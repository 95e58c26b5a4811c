"""Decode attention over a contiguous or paged KV cache: a split-K Triton kernel (flash-decoding)
with a combine step, flash-attn's ``flash_attn_with_kvcache`` contract (:func:`decode_attention`)."""

from kernels.decode.interface import decode_attention

__all__ = ["decode_attention"]
