"""A backend that can be made slower on purpose: the GPU demonstration of the regression gate.

    nox --no-venv -s bench -- --attn-impl benchmarks.slowed_backend:attention \
        --attn-backends benchmarks.slowed_backend:attention --attn-preset configs --attn-dtypes bf16
    SLOWED_BACKEND_EXTRA_RUNS=1 nox --no-venv -s bench-compare -- (same options)   # fails the gate
    nox --no-venv -s bench-compare -- (same options)                               # passes

``attention`` is torch SDPA with the flash backend forced, in flash-attn's layout and signature.
With ``SLOWED_BACKEND_EXTRA_RUNS=N`` it computes the same attention N more times (the results
are discarded, so the output and gradients stay exactly right): the work, and so the device time,
grows about (N + 1) times while every correctness check still passes. Only the gate can tell.
"""

from __future__ import annotations

import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def _sdpa(q, k, v, causal, scale):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=scale,
            enable_gqa=k.shape[2] != q.shape[2],
        )
    return o.transpose(1, 2)


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
    """q: [B, S, Hq, D], k / v: [B, S, Hk, D] -> out [B, S, Hq, D]. No windows (NotImplementedError)."""
    if tuple(window_size) != (-1, -1):
        raise NotImplementedError("sliding windows are not supported by this demo backend")
    if v.shape[-1] != q.shape[-1]:
        raise NotImplementedError("torch's flash backend needs the value head dim equal to the query's")
    out = _sdpa(q, k, v, causal, softmax_scale)
    for _ in range(int(os.environ.get("SLOWED_BACKEND_EXTRA_RUNS", "0"))):
        out = out + 0 * _sdpa(q, k, v, causal, softmax_scale)  # same value, twice the work (and its backward)
    return out


# torch's flash backward accumulates dq in an order that varies between runs (seen on the H100:
# dq differs by up to 5e-4 between two runs); declared, so the harness reports it instead of failing.
attention.attn_capabilities = {"deterministic_backward": False, "varlen": False}
