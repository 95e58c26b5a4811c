"""V with its keys contiguous, for the FP8 forward's P V on Hopper (and Q, K, dO for the FP8 backward).

Hopper's FP8 MMA reads its B operand K-major: for P V that is V with the keys contiguous,
[B, Hk, Dv, Sk], where callers hold V as [B, Sk, Hk, Dv] (flash-attn's layout). The FP8 forward
copies it once per call; the FP8 backward copies Q, K and dO the same way (dK += dS^T Q, dQ += dS K and
dV += P^T dO reduce over the sequence). A copy by torch (``vt[...] = v.permute(0, 2, 3, 1)``) moves one byte per
thread with strided reads: 0.216 ms for 32 MiB of V on the H100 (310 GB/s), a fifth of the FP8
forward's time at 4k tokens (docs/perf/flash_attn.md, session 14). ``_transpose_kernel`` moves
[BLOCK_S, BLOCK_D] tiles instead: rows of BLOCK_D bytes read, rows of BLOCK_S bytes written, the
transpose done on chip.

``mma_order=True`` (the FP8 forward's V): within each group of 16 keys the keys are also permuted, key
``8b + 2c + r`` written to position ``4c + 2b + r`` (``mma_order_position``). The forward's P is an
accumulator of Hopper's MMA, whose registers hold, per thread and 16 keys, the columns {2c, 2c + 1, 2c + 8,
2c + 9}, while the FP8 MMA reads its A operand as four consecutive keys per register ({4c .. 4c + 3}):
Triton moved P between the two with 16 shuffles and 16 byte permutes per 64 x 128 block (sm_90a SASS). P V
sums over the keys, so the forward takes P's registers as they are (``fwd._keys_in_mma_order``, a relabelling
that compiles to nothing) and V's keys in the same order, as flash-attn 3 orders V in shared memory. The
padding of the last group is written with zeros (a real key of it may land there, and the forward reads it).
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
#: Keys per group of the MMA order (half an FP8 MMA's depth); the padding (KEY_PAD) keeps whole groups.
MMA_GROUP = 16


def mma_order_position(n):
    """Where key ``n`` (an int or an integer tensor) goes in the MMA order: within its group of 16,
    8b + 2c + r -> 4c + 2b + r (b, r bits, c two bits)."""
    return (n & ~15) | (((n >> 1) & 3) << 2) | (((n >> 3) & 1) << 1) | (n & 1)


@triton.jit
def _mma_order_source(k):
    """The key that lands at position ``k`` of the MMA order (the inverse of mma_order_position)."""
    return (k & ~15) | (((k >> 1) & 1) << 3) | (((k >> 2) & 3) << 1) | (k & 1)


@triton.jit
def _transpose_kernel(V, VT, seqlen, head_dim, num_heads, stride_vb, stride_vs, stride_vh,
                      stride_tb, stride_th, stride_td, padded,
                      BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, MMA_ORDER: tl.constexpr = False):
    """VT[b, h, d, s] = V[b, s, h, d] for one [BLOCK_S keys, BLOCK_D dims] tile; MMA_ORDER: VT[b, h, d, k] =
    V[b, source(k), h, d], and zeros at positions up to ``padded`` whose key is past the sequence."""
    pid_s = tl.program_id(0)
    pid_d = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    if MMA_ORDER:
        src = _mma_order_source(offs_s)
        out_mask = (offs_s[:, None] < padded) & (offs_d[None, :] < head_dim)
    else:
        src = offs_s
        out_mask = (offs_s[:, None] < seqlen) & (offs_d[None, :] < head_dim)
    mask = (src[:, None] < seqlen) & (offs_d[None, :] < head_dim)
    x = tl.load(V + b * stride_vb + h * stride_vh + src[:, None].to(tl.int64) * stride_vs + offs_d[None, :],
                mask=mask, other=0)
    tl.store(VT + b * stride_tb + h * stride_th + offs_d[:, None].to(tl.int64) * stride_td + offs_s[None, :],
             tl.trans(x), mask=tl.trans(out_mask))


def v_keys_contiguous(v: torch.Tensor, launches: dict | None = None, mma_order: bool = False) -> torch.Tensor:
    """V [B, Sk, Hk, Dv] (its last dim contiguous) copied to [B, Hk, Dv, Sk] with the keys contiguous,
    rows padded to ``KEY_PAD`` keys; returns the view of the real keys. ``mma_order``: the keys in the
    MMA order of each group of 16 (see the module docstring), the padding zeros; the view still has Sk
    keys, the padding lies past it (the forward reads it). Any [B, S, H, D] tensor of one-byte
    elements the same way (the FP8 backward's Q, K and dO). On a GPU (and under the
    interpreter) one launch of ``_transpose_kernel``, the bytes moved as bytes (any one-byte dtype);
    elsewhere torch's copy. ``launches``: a dict this call may replay its launch from and leave it in
    (kernels/launcher.py; the caller keys it on v's shape, strides and alignment)."""
    b, sk, hk, dv = v.shape
    padded = -(-sk // KEY_PAD) * KEY_PAD  # whole groups of the MMA order (KEY_PAD % MMA_GROUP == 0)
    vt = torch.empty((b, hk, dv, padded), device=v.device, dtype=v.dtype)
    if v.numel() == 0:
        return vt[..., :sk]
    if v.element_size() != 1 or not (v.is_cuda or configs.interpreting()):
        if mma_order:
            vt.zero_()
            vt[..., mma_order_position(torch.arange(sk, device=v.device))] = v.permute(0, 2, 3, 1)
        else:
            vt[..., :sk] = v.permute(0, 2, 3, 1)
        return vt[..., :sk]
    tensors = {"V": v.view(torch.uint8), "VT": vt.view(torch.uint8)}
    replay = launches.get("copy") if launches is not None else None
    if replay is None or not replay(tensors):
        src, dst = tensors["V"], tensors["VT"]
        args = dict(tensors, seqlen=sk, head_dim=dv, num_heads=hk, stride_vb=src.stride(0), stride_vs=src.stride(1),
                    stride_vh=src.stride(2), stride_tb=dst.stride(0), stride_th=dst.stride(1),
                    stride_td=dst.stride(2), padded=padded, BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D, MMA_ORDER=mma_order)
        launch = launcher.launch(_transpose_kernel, (triton.cdiv(padded, BLOCK_S), triton.cdiv(dv, BLOCK_D), b * hk),
                                 args, num_warps=4)
        if launches is not None and launch is not None:
            launches["copy"] = launch
    return vt[..., :sk]
