"""The in-repo FP8 forward as a user's callable, for `harness accept --profile fp8` (flash-attn 3's FP8
convention: e4m3 q, k, v and (B, Hk) float32 descales by keyword; bf16 out; forward only):

    python -m harness accept --impl benchmarks.fp8_accept_impl:attn --profile fp8 --device cuda

On a CPU it runs under Triton's interpreter (TRITON_INTERPRET=1), at the profile's CPU sizes.
"""
from kernels.flash_attn import flash_attn_fp8_func


def attn(q, k, v, *, q_descale, k_descale, v_descale, causal=False, softmax_scale=None, window_size=(-1, -1),
         softcap=0.0):
    return flash_attn_fp8_func(q, k, v, q_descale, k_descale, v_descale, causal=causal,
                               softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)


attn.attn_capabilities = {"fp8": True, "backward": False, "dtypes": ["bf16"], "devices": ["cuda", "cpu"]}
