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


# FP8 training: the forward above with the FP8 backward beside it (attn_capabilities["fp8_backward"])
def _fp8_backward(flaws=()):
    from harness.adapters.eager import eager_fp8_attention_backward

    def bwd(q, k, v, out, lse, grad_out, *, causal, window_size, softmax_scale=None, q_descale, k_descale,
            v_descale, do_descale, ds_descale):
        fmt = "e5m2" if grad_out.dtype == torch.float8_e5m2 else "e4m3"
        dq, dk, dv, _ = eager_fp8_attention_backward(
            q, k, v, q_descale, k_descale, v_descale, out, lse, grad_out, do_descale, ds_descale, causal=causal,
            softmax_scale=softmax_scale, window_size=window_size, grad_fmt=fmt, flaws=flaws)
        return dq.to(out.dtype), dk.to(out.dtype), dv.to(out.dtype)

    return bwd


def training(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    """Right: the flash-style FP8 forward and the FP8 backward."""
    return _call(q, k, v, q_descale, k_descale, v_descale, **kw)


def training_ignores_do_descale(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, **kw):
    """Its backward takes dO's FP8 values for the real ones."""
    return _call(q, k, v, q_descale, k_descale, v_descale, **kw)


training.attn_capabilities = {"fp8": True, "fp8_backward": _fp8_backward()}
training_ignores_do_descale.attn_capabilities = {"fp8": True, "fp8_backward": _fp8_backward(("do_descale_ignored",))}
