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
            write=True, whole_pages=False):
    """Per sequence: write the new tokens at cache_seqlens (+ ``write_shift``), read its cached keys
    through ``table`` (default: the page table), attend to them and the new tokens."""
    table = block_table if table is None else table
    flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        if k is not None and write:
            new = _slots(b, n + write_shift + k.shape[1], k_cache, table)[n + write_shift:]
            flat_k[new], flat_v[new] = k[b], v[b]
        n_read = n
        if whole_pages and table is not None:  # the bug: a sequence's last page read to its end
            page = k_cache.shape[1]
            n_read = -(-n // page) * page
        cached = _slots(b, n_read, k_cache, table)
        keys, vals = flat_k[cached], flat_v[cached]
        if k is not None:
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


def _ignoring(**drop):
    """A correct callable but for the keywords in ``drop`` (replaced by the given values)."""

    def fn(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
           window_size=(-1, -1), softmax_scale=None, softcap=0.0):
        kw = _kw(causal, window_size, softmax_scale, softcap) | drop
        if kw.get("softmax_scale", 0) is None:
            kw.pop("softmax_scale")
        return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, kw)

    return fn


ignores_causal = _ignoring(causal=False)
ignores_window = _ignoring(window_size=(-1, -1))
ignores_softcap = _ignoring(softcap=0.0)
ignores_scale = _ignoring(softmax_scale=None)  # the given scale dropped: d ** -0.5 always
def wrong_default_scale(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None,
                        causal=True, window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Defaults the scale to 1/d instead of 1/sqrt(d)."""
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -1.0
    return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table, _kw(causal, window_size, scale, softcap))


def reads_whole_pages(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                      window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """Reads each sequence's last page to its end: cache_seqlens honoured only to the page."""
    return _decode(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                   _kw(causal, window_size, softmax_scale, softcap), whole_pages=True)
