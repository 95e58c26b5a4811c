from .chunk import chunk_linear_attn

__all__ = ["chunk_linear_attn"]
