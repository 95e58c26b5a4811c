"""Wrong: P V is accumulated in the input dtype (fp16 / bf16), one key at a time, instead of in an
fp32 accumulator. fp32 inputs accumulate in fp32 (correct), so only 16-bit cases show it."""

import torch

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    acc = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.float32
    return _ref(q, k, v, acc_dtype=acc, **kw)
