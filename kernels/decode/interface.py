"""``decode_attention``: flash-attn's ``flash_attn_with_kvcache`` contract, on the split-K kernel.

Validates its arguments (a ValueError naming the argument, before any launch), writes the new
tokens into the cache in place (no device-to-host copy: the slots come from ``cache_seqlens`` and
the page table on the device), picks the number of splits from the batch, the kv heads and the
device's multiprocessors, then launches :mod:`kernels.decode.kernel`.
"""

from __future__ import annotations

import math

import torch
import triton

from kernels.decode.kernel import _combine_kernel, _split_kernel
from kernels.flash_attn.configs import interpreting, patch_interpreter_scalar_index

#: Keys per block of the split kernel at most (a page size's largest divisor up to this when paged).
BLOCK_N = 64
#: Pages must hold a whole number of key blocks (one block never straddles two pages), and tl.dot
#: needs 16 keys: a page size must be a multiple of 16.
PAGE_MULTIPLE = 16
#: Query rows (group heads x new tokens) per program at most; 16 when the head dim is above 256
#: (a wider tile would not fit in registers).
BLOCK_R_MAX = 64
#: Splits aim at this many programs per multiprocessor (a B=1 decode must still fill the GPU).
PROGRAMS_PER_SM = 2
#: The interpreter (CPU) runs programs serially: a few splits suffice to test the combine.
INTERPRET_SPLITS = 3
MAX_HEAD_DIM = 1024


def _check(q, k_cache, v_cache, k, v, cache_seqlens, block_table, window_size, validate):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-dim tensor, got {getattr(t, 'shape', type(t).__name__)}")
    B, Sq, Hq, D = q.shape
    Hk = k_cache.shape[2]
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q: unsupported: dtype {q.dtype} (fp16, bf16 or fp32; the kernel accumulates in fp32)")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache / v_cache: dtype {k_cache.dtype} / {v_cache.dtype} must be q's {q.dtype}")
    if k_cache.shape[-1] != D:
        raise ValueError(f"k_cache: head dim {k_cache.shape[-1]} does not match q's {D}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's {tuple(k_cache.shape)}")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k_cache: heads_q ({Hq}) must be a multiple of the cache's heads ({Hk})")
    if max(D, v_cache.shape[-1]) > MAX_HEAD_DIM:
        raise ValueError(f"q / v_cache: head dims up to {MAX_HEAD_DIM}, got {D} / {v_cache.shape[-1]}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q, k_cache, v_cache: the last (head) dim must be contiguous")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens: expected an int tensor of shape ({B},), got {getattr(cache_seqlens, 'shape', cache_seqlens)}")
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new tensors or neither")
    if k is not None and (k.shape != (B, Sq, Hk, D) or v.shape[:3] != (B, Sq, Hk)):
        raise ValueError(f"k / v: expected ({B}, {Sq}, {Hk}, ...) new tokens, got {tuple(k.shape)} / {tuple(v.shape)}")
    if block_table is not None:
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table: expected (batch={B}, pages), got {tuple(block_table.shape)}")
        page = k_cache.shape[1]
        if page % PAGE_MULTIPLE:
            raise ValueError(f"k_cache: page size {page} is not a multiple of {PAGE_MULTIPLE}")
        capacity = block_table.shape[1] * page
    else:
        capacity = k_cache.shape[1]
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache: a contiguous cache has one row per sequence ({B}), got {k_cache.shape[0]}")
    left, right = (int(w) for w in window_size)
    if validate:  # reads device tensors (a synchronisation): off in timed loops
        new = Sq if k is not None else 0
        lens = cache_seqlens.to(torch.int64)
        if bool((lens < 0).any()) or bool((lens + new > capacity).any()):
            top = int((lens + new).max())
            raise ValueError(f"cache_seqlens: a sequence needs {top} slots (with {new} new), above the "
                             f"cache's capacity of {capacity}")
        if block_table is not None:
            lo, hi = int(block_table.min()), int(block_table.max())
            if lo < 0 or hi >= k_cache.shape[0]:
                raise ValueError(f"block_table: entries must be pages 0..{k_cache.shape[0] - 1}, found {lo}..{hi}")
    return B, Sq, Hq, Hk, D, capacity, left, right


def _write_new(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Write the new tokens at cache_seqlens (in place), without leaving the device."""
    B, Sq, Hk = k.shape[0], k.shape[1], k.shape[2]
    pos = cache_seqlens.to(torch.int64)[:, None] + torch.arange(Sq, device=k.device)[None, :]
    if block_table is None:
        slot = torch.arange(B, device=k.device)[:, None] * k_cache.shape[1] + pos
    else:
        page = k_cache.shape[1]
        slot = block_table.to(torch.int64).gather(1, pos // page) * page + pos % page
    slot = slot.reshape(-1)
    k_cache.view(-1, Hk, k_cache.shape[-1]).index_copy_(0, slot, k.reshape(-1, Hk, k.shape[-1]))
    v_cache.view(-1, Hk, v_cache.shape[-1]).index_copy_(0, slot, v.reshape(-1, Hk, v.shape[-1]))


def decode_attention(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                     softmax_scale=None, window_size=(-1, -1), softcap=0.0, num_splits=None, return_lse=False,
                     validate=True):
    """Attention of ``q`` (B, Sq, Hq, D) over a KV cache, after appending ``k``, ``v`` (B, Sq, Hk, D).

    k_cache / v_cache: contiguous (B, capacity, Hk, D / Dv), or paged (num_blocks, page_size, Hk, D /
    Dv) with ``block_table`` (B, pages) int32; ``cache_seqlens`` (B,) int32: each sequence's length
    before the step. Masks bottom-right aligned (the new tokens see the whole cache). Returns out
    (B, Sq, Hq, Dv), and lse (B, Hq, Sq) float32 with ``return_lse``. The cache is written in place.
    ``validate=False`` skips the checks that read device tensors (for timed loops).
    """
    B, Sq, Hq, Hk, D, capacity, left, right = _check(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                     window_size, validate)
    if causal:
        right = 0
    Dv = v_cache.shape[-1]
    scale = D**-0.5 if softmax_scale is None else float(softmax_scale)
    if k is not None:
        _write_new(k_cache, v_cache, k, v, cache_seqlens, block_table)
    lens = cache_seqlens.to(torch.int32) + (Sq if k is not None else 0)
    G = Hq // Hk
    paged = block_table is not None
    block_n = PAGE_MULTIPLE if interpreting() else BLOCK_N
    if paged:
        block_n = math.gcd(k_cache.shape[1], block_n)
    rows = G * Sq
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_DV = max(16, triton.next_power_of_2(Dv))
    BLOCK_R = min(max(16, triton.next_power_of_2(rows)), BLOCK_R_MAX if max(D, Dv) <= 256 else 16)
    rblocks = triton.cdiv(rows, BLOCK_R)
    if num_splits is None:
        if interpreting() or q.device.type != "cuda":
            num_splits = INTERPRET_SPLITS
        else:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            num_splits = max(1, min(math.ceil(PROGRAMS_PER_SM * sms / (B * Hk * rblocks)),
                                    math.ceil(capacity / block_n)))
    chunk = triton.cdiv(triton.cdiv(capacity, num_splits), block_n) * block_n
    num_splits = max(1, triton.cdiv(capacity, chunk))
    mid_o = torch.empty(B, Hq, Sq, num_splits, Dv, device=q.device, dtype=torch.float32)
    mid_m = torch.empty(B, Hq, Sq, num_splits, device=q.device, dtype=torch.float32)
    mid_l = torch.empty(B, Hq, Sq, num_splits, device=q.device, dtype=torch.float32)
    table = block_table if paged else lens  # a placeholder pointer when contiguous
    if interpreting():
        patch_interpreter_scalar_index()
    _split_kernel[(B * Hk * rblocks, num_splits)](
        q, k_cache, v_cache, lens, table, mid_o, mid_m, mid_l,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        table.stride(0) if paged else 0,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_o.stride(3),
        mid_m.stride(0), mid_m.stride(1), mid_m.stride(2),
        scale, float(softcap or 0.0), chunk,
        HK=Hk, RBLOCKS=rblocks, G=G, SQ=Sq, PAGE=k_cache.shape[1] if paged else 1, PAGED=paged,
        LEFT=left, RIGHT=right, HAS_SOFTCAP=bool(softcap),
        D=D, DV=Dv, BLOCK_R=BLOCK_R, BLOCK_N=block_n, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: full-precision dots, not TF32
    )
    out = torch.empty(B, Sq, Hq, Dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, Sq, device=q.device, dtype=torch.float32)
    _combine_kernel[(B * Hq * Sq,)](
        mid_o, mid_m, mid_l, out, lse,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_o.stride(3),
        mid_m.stride(0), mid_m.stride(1), mid_m.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        num_splits,
        HQ=Hq, SQ=Sq, DV=Dv, BLOCK_S=max(2, triton.next_power_of_2(num_splits)), BLOCK_DV=BLOCK_DV,
    )
    return (out, lse) if return_lse else out
