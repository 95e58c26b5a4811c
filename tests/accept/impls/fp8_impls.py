"""FP8 callables (flash-attn 3's FP8 call: q, k, v in e4m3 with q_descale, k_descale, v_descale of
shape (B, Hk)) that each ignore one descale: the FP8 values taken for the real ones in that place."""

import torch

from harness.adapters.eager import eager_fp8_attention

CAPS = {"fp8": True, "backward": False}


def _call(q, k, v, q_descale, k_descale, v_descale, *, causal=False, softmax_scale=None, window_size=(-1, -1),
          softcap=0.0):
    return eager_fp8_attention(q, k, v, q_descale, k_descale, v_descale, causal=causal, softmax_scale=softmax_scale,
                               window_size=window_size, softcap=softcap, out_dtype=torch.bfloat16, block_n=64)


def ignores_q_descale(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    return _call(q, k, v, torch.ones_like(q_descale), k_descale, v_descale, **kw)


def ignores_k_descale(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    return _call(q, k, v, q_descale, torch.ones_like(k_descale), v_descale, **kw)


def ignores_v_descale(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    return _call(q, k, v, q_descale, k_descale, torch.ones_like(v_descale), **kw)


for _fn in (ignores_q_descale, ignores_k_descale, ignores_v_descale):
    _fn.attn_capabilities = CAPS


def correct(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    """Right: a flash-style FP8 forward (keys in blocks of 64, P quantised against the running maximum)."""
    return _call(q, k, v, q_descale, k_descale, v_descale, **kw)


def reads_one_descale(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    """Reads the [0, 0] entry of each descale for the whole tensor: right while quantisation is per
    tensor, wrong with a factor per (sequence, kv head)."""
    one = [torch.full_like(d, float(d[0, 0])) for d in (q_descale, k_descale, v_descale)]
    return _call(q, k, v, *one, **kw)


for _fn in (correct, reads_one_descale):
    _fn.attn_capabilities = CAPS
