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
from triton.language.extra.cuda import gdc_launch_dependents

from .. import launcher
from . import configs

#: Keys and value dims per program (64-byte rows written and read, one byte per element), and its warps: the
#: fastest tile or within 0.2 us of it at the FA sweep's hd 64 and 128, 4k and 16k (session 25, H100, CUDA
#: graphs, docs/perf/fp8-s25/6-copy-tiles.md: 25.5-27.0 us against 26.9-27.5 for the 256 x 64 tiles before).
BLOCK_S = 64
BLOCK_D = 64
COPY_WARPS = 4
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
def _transpose_tile(V, VT, b, h, pid_s, pid_d, seqlen, head_dim, stride_vb, stride_vs, stride_vh,
                    stride_tb, stride_th, stride_td, padded,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, MMA_ORDER: tl.constexpr):
    """VT[b, h, d, s] = V[b, s, h, d] for one [BLOCK_S keys, BLOCK_D dims] tile; MMA_ORDER: VT[b, h, d, k] =
    V[b, source(k), h, d], and zeros at positions up to ``padded`` whose key is past the sequence."""
    s0 = pid_s * BLOCK_S
    d0 = pid_d * BLOCK_D
    rows = tl.arange(0, BLOCK_S)  # keys within the tile: 32-bit offsets from the tile's 64-bit corner
    cols = tl.arange(0, BLOCK_D)
    if MMA_ORDER:
        src = _mma_order_source(rows)  # a permutation within each 16 keys (BLOCK_S is a multiple of 16)
        out_mask = ((s0 + rows)[:, None] < padded) & ((d0 + cols)[None, :] < head_dim)
    else:
        src = rows
        out_mask = ((s0 + rows)[:, None] < seqlen) & ((d0 + cols)[None, :] < head_dim)
    mask = ((s0 + src)[:, None] < seqlen) & ((d0 + cols)[None, :] < head_dim)
    v_tile = V + b * stride_vb + h * stride_vh + s0.to(tl.int64) * stride_vs + d0
    x = tl.load(v_tile + src[:, None] * stride_vs + cols[None, :], mask=mask, other=0)
    t_tile = VT + b * stride_tb + h * stride_th + d0.to(tl.int64) * stride_td + s0
    tl.store(t_tile + cols[:, None] * stride_td + rows[None, :], tl.trans(x), mask=tl.trans(out_mask))


@triton.jit
def _transpose_kernel(V, VT, seqlen, head_dim, num_heads, stride_vb, stride_vs, stride_vh,
                      stride_tb, stride_th, stride_td, padded,
                      BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, MMA_ORDER: tl.constexpr = False,
                      LAUNCH_DEPENDENTS: tl.constexpr = False):
    """One tile per program (_transpose_tile): grid (key tiles, dim tiles, batch x heads). LAUNCH_DEPENDENTS: let a
    kernel launched next with programmatic dependent launch start once every program here has begun (it must
    wait for this grid, griddepcontrol.wait, before it reads VT)."""
    if LAUNCH_DEPENDENTS:
        gdc_launch_dependents()
    pid_bh = tl.program_id(2)
    _transpose_tile(V, VT, (pid_bh // num_heads).to(tl.int64), (pid_bh % num_heads).to(tl.int64), tl.program_id(0),
                    tl.program_id(1), seqlen, head_dim, stride_vb, stride_vs, stride_vh, stride_tb, stride_th,
                    stride_td, padded, BLOCK_S, BLOCK_D, MMA_ORDER)


@triton.jit
def _transpose_signal_kernel(V, VT, Ready, seqlen, head_dim, num_heads, stride_vb, stride_vs, stride_vh,
                             stride_tb, stride_th, stride_td, padded, n_s, n_d, total,
                             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, MMA_ORDER: tl.constexpr,
                             ASM: tl.constexpr):
    """The copy a consumer overlaps with (v_keys_contiguous's ``ready``): persistent programs take the tiles in
    (batch, head)-major order, program p the tiles p, p + P, ..., and after each tile add 1 to
    ``Ready[b * num_heads + h]`` with release semantics (a barrier after every thread's stores, then one atomic), so a
    consumer that reads n_s x n_d there may read that head's copy. First thing, each program lets a kernel
    launched after it with programmatic dependent launch start (griddepcontrol.launch_dependents): every
    program of this grid is then resident or done, so a consumer that spins on ``Ready`` cannot wait on a
    program that never runs. ASM: that griddepcontrol instruction (off under the interpreter, which runs programs
    one by one)."""
    if ASM:
        gdc_launch_dependents()
    per_bh = n_s * n_d
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        bh = t // per_bh
        r = t % per_bh
        _transpose_tile(V, VT, (bh // num_heads).to(tl.int64), (bh % num_heads).to(tl.int64), r // n_d, r % n_d,
                        seqlen, head_dim, stride_vb, stride_vs, stride_vh, stride_tb, stride_th, stride_td, padded,
                        BLOCK_S, BLOCK_D, MMA_ORDER)
        tl.debug_barrier()  # every thread's stores before the one atomic, whose release covers them
        tl.atomic_add(Ready + bh, 1, sem="release", scope="gpu")


def tiles_per_head(seqlen: int, head_dim: int) -> int:
    """How many tiles the signalling copy of one (batch, head) takes: what its ``ready`` counter reaches."""
    padded = -(-seqlen // KEY_PAD) * KEY_PAD
    return triton.cdiv(padded, SIGNAL_BLOCK_S) * triton.cdiv(head_dim, BLOCK_D)


#: The signalling copy (v_keys_contiguous's ``ready``) runs beside its consumer, so it is kept small: one
#: persistent program an SM of at most 16K registers (sm_90a: 128 registers x 128 threads at 256-key tiles, 96 at
#: 128-key ones; its loop's loads pipelined). The consumer, the FP8 hd 64 forward at four programs an SM (128
#: registers x 128 threads each: the whole register file), keeps three there while the copy runs; the copy has to
#: stay ahead of the forward's first wave only.
SIGNAL_PROGRAMS_PER_SM = 1
SIGNAL_BLOCK_S = 256


def v_keys_contiguous(v: torch.Tensor, launches: dict | None = None, mma_order: bool = False,
                      ready: torch.Tensor | None = None, launch_dependents: bool = False) -> torch.Tensor:
    """V [B, Sk, Hk, Dv] (its last dim contiguous) copied to [B, Hk, Dv, Sk] with the keys contiguous,
    rows padded to ``KEY_PAD`` keys; returns the view of the real keys. ``mma_order``: the keys in the
    MMA order of each group of 16 (see the module docstring), the padding zeros; the view still has Sk
    keys, the padding lies past it (the forward reads it). Any [B, S, H, D] tensor of one-byte
    elements the same way (the FP8 backward's Q, K and dO). On a GPU (and under the
    interpreter) one launch of ``_transpose_kernel``, the bytes moved as bytes (any one-byte dtype);
    elsewhere torch's copy. ``launches``: a dict this call may replay its launch from and leave it in
    (kernels/launcher.py; the caller keys it on v's shape, strides and alignment). ``ready``: int32 zeros
    [B * Hk] (GPU or interpreter): the copy then signals each (batch, head) done there, counting its tiles up to
    ``tiles_per_head(Sk, Dv)`` (``_transpose_signal_kernel``), so that a kernel launched next with programmatic
    dependent launch may start while it runs and read each head as soon as it is there (the FP8 forward's
    ``v_ready``). ``launch_dependents`` (GPU): the plain copy lets a kernel launched next with programmatic
    dependent launch start once all its programs have begun (the FP8 forward's ``v_after_copy``)."""
    b, sk, hk, dv = v.shape
    padded = -(-sk // KEY_PAD) * KEY_PAD  # whole groups of the MMA order (KEY_PAD % MMA_GROUP == 0)
    vt = torch.empty((b, hk, dv, padded), device=v.device, dtype=v.dtype)
    if v.numel() == 0:
        return vt[..., :sk]
    if v.element_size() != 1 or not (v.is_cuda or configs.interpreting()):
        if ready is not None:
            raise ValueError("ready: only for one-byte tensors on a GPU or under the interpreter")
        if mma_order:
            vt.zero_()
            vt[..., mma_order_position(torch.arange(sk, device=v.device))] = v.permute(0, 2, 3, 1)
        else:
            vt[..., :sk] = v.permute(0, 2, 3, 1)
        return vt[..., :sk]
    tensors = {"V": v.view(torch.uint8), "VT": vt.view(torch.uint8)}
    name = "copy-signal" if ready is not None else "copy-pdl" if launch_dependents else "copy"
    if ready is not None:
        if ready.dtype != torch.int32 or ready.numel() != b * hk or ready.device != v.device:
            raise ValueError(f"ready: expected int32 zeros [{b * hk}] on {v.device}, got {tuple(ready.shape)} "
                             f"{ready.dtype} on {ready.device}")
        tensors["Ready"] = ready
    replay = launches.get(name) if launches is not None else None
    if replay is None or not replay(tensors):
        src, dst = tensors["V"], tensors["VT"]
        args = dict(tensors, seqlen=sk, head_dim=dv, num_heads=hk, stride_vb=src.stride(0), stride_vs=src.stride(1),
                    stride_vh=src.stride(2), stride_tb=dst.stride(0), stride_th=dst.stride(1),
                    stride_td=dst.stride(2), padded=padded, BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D, MMA_ORDER=mma_order)
        n_d = triton.cdiv(dv, BLOCK_D)
        if ready is None:
            pdl = launch_dependents and not configs.interpreting()
            launch = launcher.launch(_transpose_kernel, (triton.cdiv(padded, BLOCK_S), n_d, b * hk),
                                     dict(args, LAUNCH_DEPENDENTS=pdl), num_warps=COPY_WARPS)
            if pdl:
                launcher.prefer_max_shared_memory(launch)  # so the forward's programs fit beside its last ones
        else:
            n_s = triton.cdiv(padded, SIGNAL_BLOCK_S)
            total = n_s * n_d * b * hk
            slots = 4 if configs.interpreting() else SIGNAL_PROGRAMS_PER_SM * configs.tensor_sm_count(v)
            launch = launcher.launch(_transpose_signal_kernel, (min(total, slots),), dict(
                args, n_s=n_s, n_d=n_d, total=total, BLOCK_S=SIGNAL_BLOCK_S, ASM=not configs.interpreting()),
                num_warps=4)
            launcher.prefer_max_shared_memory(launch)  # so its consumer's programs fit beside it
        if launches is not None and launch is not None:
            launches[name] = launch
    return vt[..., :sk]
