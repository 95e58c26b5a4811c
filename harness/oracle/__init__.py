"""FP64 reference oracles. Everything in the harness measures against these.

* :func:`softmax_attention` / :func:`softmax_attention_varlen`: softmax attention, flash-attn's
  layout and mask conventions, forward + analytic gradients, memory-linear in sequence length.
* :func:`linear_attention`: chunked gated linear attention, FLA's conventions, forward + final
  state + analytic gradients.
* :func:`decode_attention`: attention over a (paged) KV cache with new tokens appended, through
  the softmax oracle; the cache as it must look after the step.
* :mod:`harness.oracle.naive`: independent, materialised float64 formulas (autograd-able) used
  only to prove the oracles right on small shapes.
"""

from harness.oracle.decode import DecodeResult, decode_attention
from harness.oracle.linear import LinearResult, linear_attention
from harness.oracle.softmax import SoftmaxResult, softmax_attention, softmax_attention_varlen

# Bump when a change to the oracles could change any golden value.
ORACLE_VERSION = "1"

__all__ = [
    "ORACLE_VERSION",
    "DecodeResult",
    "decode_attention",
    "LinearResult",
    "SoftmaxResult",
    "linear_attention",
    "softmax_attention",
    "softmax_attention_varlen",
]
