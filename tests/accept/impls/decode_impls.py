"""Decode callables in flash-attn's ``flash_attn_with_kvcache`` signature, for the acceptance tests:
one correct (plain torch, built on ``_reference.attention``) and three wrong ones, each with one bug
seen in real decode kernels.

``attn(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
window_size=(-1, -1), softmax_scale=None, softcap=0.0) -> (out, lse)``; the new tokens are written
into the cache at ``cache_seqlens`` in place.
"""

from __future__ import annotations

import torch
from _reference import attention


def _slots(b, n, k_cache, block_table):
    pos = torch.arange(n, device=k_cache.device)
    if block_table is None:
        return b * k_cache.shape[1] + pos
    page = k_cache.shape[1]
    return block_table[b, pos // page].long() * page + pos % page


def _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, kw, *, write_shift=0, table=None,
            write=True):
    table = block_table if table is None else table
    flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    Sq = q.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        slots = _slots(b, n + (Sq if k is not None else 0) + write_shift, k_cache, table)
        keys, vals = flat_k[slots[:n]], flat_v[slots[:n]]
        if k is not None:
            if write:
                flat_k[slots[n + write_shift:]] = k[b]
                flat_v[slots[n + write_shift:]] = v[b]
            keys, vals = torch.cat([keys, k[b]]), torch.cat([vals, v[b]])
        o, lse = attention(q[b : b + 1], keys[None], vals[None], **kw)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def _kw(causal, window_size, softmax_scale, softcap):
    kw = dict(causal=causal, window_size=window_size, softcap=softcap)
    if softmax_scale is not None:
        kw["softmax_scale"] = softmax_scale
    return kw


def attn(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
         window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Correct."""
    return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                   _kw(causal, window_size, softmax_scale, softcap))


def writes_wrong_slot(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                      window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Attends right, writes the new tokens one slot too far: this step's output is right."""
    return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                   _kw(causal, window_size, softmax_scale, softcap), write_shift=1)


def ignores_block_table(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                        window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Reads sequence b's pages as b * pages + i: right only for a pool in order."""
    table = None
    if block_table is not None:
        B, pages = block_table.shape
        table = torch.arange(B * pages, device=block_table.device, dtype=block_table.dtype).view(B, pages)
    return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                   _kw(causal, window_size, softmax_scale, softcap), table=table)


def contiguous_only(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                    window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Correct, but declares no paged cache: a serving profile requires one."""
    if block_table is not None:
        raise NotImplementedError("paged KV cache")
    return attn(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, causal=causal, window_size=window_size,
                softmax_scale=softmax_scale, softcap=softcap)


contiguous_only.attn_capabilities = {"paged": False}
