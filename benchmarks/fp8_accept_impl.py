"""The in-repo FP8 kernels as a user's callables, for `harness accept` (flash-attn 3's FP8 convention: e4m3
q, k, v and (B, Hk) float32 descales by keyword; bf16 out):

    python -m harness accept --impl benchmarks.fp8_accept_impl:attn --profile fp8 --device cuda
    python -m harness accept --impl benchmarks.fp8_accept_impl:train --profile fp8-training --device cuda

``attn``: the FP8 forward alone. ``train``: the FP8 forward returning its lse, with the FP8 backward
(``flash_attn_fp8_bwd_func``, gradients in the output's dtype) declared as ``attn_capabilities["fp8_backward"]``.
On a CPU they run under Triton's interpreter (TRITON_INTERPRET=1), at the profiles' CPU sizes.
"""
from kernels.flash_attn import flash_attn_fp8_bwd_func, flash_attn_fp8_func


def attn(q, k, v, *, q_descale, k_descale, v_descale, causal=False, softmax_scale=None, window_size=(-1, -1),
         softcap=0.0):
    return flash_attn_fp8_func(q, k, v, q_descale, k_descale, v_descale, causal=causal,
                               softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)


attn.attn_capabilities = {"fp8": True, "backward": False, "dtypes": ["bf16"], "devices": ["cuda", "cpu"]}


def train(q, k, v, *, q_descale, k_descale, v_descale, causal=False, softmax_scale=None, window_size=(-1, -1),
          softcap=0.0):
    return flash_attn_fp8_func(q, k, v, q_descale, k_descale, v_descale, causal=causal, softmax_scale=softmax_scale,
                               window_size=window_size, softcap=softcap, return_lse=True)


def train_backward(q, k, v, out, lse, grad_out, *, causal, window_size, softmax_scale=None, q_descale, k_descale,
                   v_descale, do_descale, ds_descale):
    return flash_attn_fp8_bwd_func(grad_out, q, k, v, out, lse, q_descale, k_descale, v_descale, do_descale,
                                   ds_descale, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                                   grad_dtype=out.dtype)


train.attn_capabilities = {"fp8": True, "fp8_backward": train_backward, "dtypes": ["bf16"],
                           "devices": ["cuda", "cpu"]}
