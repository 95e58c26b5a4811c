"""V with its keys contiguous, for the FP8 forward's P V on Hopper (and Q, K, dO for the FP8 backward).

Hopper's FP8 MMA reads its B operand K-major: for P V that is V with the keys contiguous,
[B, Hk, Dv, Sk], where callers hold V as [B, Sk, Hk, Dv] (flash-attn's layout). The FP8 forward
copies it once per call; the FP8 backward copies Q, K and dO the same way (dK += dS^T Q, dQ += dS K and
dV += P^T dO reduce over the sequence). A copy by torch (``vt[...] = v.permute(0, 2, 3, 1)``) moves one byte per
thread with strided reads: 0.216 ms for 32 MiB of V on the H100 (310 GB/s), a fifth of the FP8
forward's time at 4k tokens (docs/perf/flash_attn.md, session 14). ``_transpose_kernel`` moves
[BLOCK_S, BLOCK_D] tiles instead: rows of BLOCK_D bytes read, rows of BLOCK_S bytes written, the
transpose done on chip.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launcher
from . import configs

#: Keys and value dims per program: 256-byte rows written, 64-byte rows read (one byte per element).
BLOCK_S = 256
BLOCK_D = 64
#: The copy's rows are padded to this many keys: every stride a 16-byte multiple (tensor descriptors).
KEY_PAD = 16


@triton.jit
def _transpose_kernel(V, VT, seqlen, head_dim, num_heads, stride_vb, stride_vs, stride_vh,
                      stride_tb, stride_th, stride_td,
                      BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """VT[b, h, d, s] = V[b, s, h, d] for one [BLOCK_S keys, BLOCK_D dims] tile."""
    pid_s = tl.program_id(0)
    pid_d = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (offs_s[:, None] < seqlen) & (offs_d[None, :] < head_dim)
    x = tl.load(V + b * stride_vb + h * stride_vh + offs_s[:, None].to(tl.int64) * stride_vs + offs_d[None, :],
                mask=mask)
    tl.store(VT + b * stride_tb + h * stride_th + offs_d[:, None].to(tl.int64) * stride_td + offs_s[None, :],
             tl.trans(x), mask=tl.trans(mask))


def v_keys_contiguous(v: torch.Tensor, launches: dict | None = None) -> torch.Tensor:
    """V [B, Sk, Hk, Dv] (its last dim contiguous) copied to [B, Hk, Dv, Sk] with the keys contiguous,
    rows padded to ``KEY_PAD`` keys; returns the view of the real keys. Any [B, S, H, D] tensor of one-byte
    elements the same way (the FP8 backward's Q, K and dO). On a GPU (and under the
    interpreter) one launch of ``_transpose_kernel``, the bytes moved as bytes (any one-byte dtype);
    elsewhere torch's copy. ``launches``: a dict this call may replay its launch from and leave it in
    (kernels/launcher.py; the caller keys it on v's shape, strides and alignment)."""
    b, sk, hk, dv = v.shape
    vt = torch.empty((b, hk, dv, -(-sk // KEY_PAD) * KEY_PAD), device=v.device, dtype=v.dtype)
    if v.numel() == 0:
        return vt[..., :sk]
    if v.element_size() != 1 or not (v.is_cuda or configs.interpreting()):
        vt[..., :sk] = v.permute(0, 2, 3, 1)
        return vt[..., :sk]
    tensors = {"V": v.view(torch.uint8), "VT": vt.view(torch.uint8)}
    replay = launches.get("copy") if launches is not None else None
    if replay is None or not replay(tensors):
        src, dst = tensors["V"], tensors["VT"]
        args = dict(tensors, seqlen=sk, head_dim=dv, num_heads=hk, stride_vb=src.stride(0), stride_vs=src.stride(1),
                    stride_vh=src.stride(2), stride_tb=dst.stride(0), stride_th=dst.stride(1),
                    stride_td=dst.stride(2), BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D)
        launch = launcher.launch(_transpose_kernel, (triton.cdiv(sk, BLOCK_S), triton.cdiv(dv, BLOCK_D), b * hk),
                                 args, num_warps=4)
        if launches is not None and launch is not None:
            launches["copy"] = launch
    return vt[..., :sk]
