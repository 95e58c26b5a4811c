"""The FP64 oracle of decode attention over a KV cache (flash-attn's ``flash_attn_with_kvcache``).

:func:`decode_attention` writes the new k, v into a copy of the cache at each sequence's
``cache_seqlens`` (through the page table when paged), gathers each sequence's keys and values
(its cache and the new tokens), and hands them to :func:`harness.oracle.softmax_attention_varlen`:
bottom-right aligned masks, so the new queries see the whole cache. The result carries the cache as
it must look after the step (``k_cache``, ``v_cache``: exact copies, compared bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.oracle.softmax import softmax_attention_varlen


@dataclass
class DecodeResult:
    """out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) in float64 (rows that see no key: out 0, lse -inf);
    k_cache, v_cache: the cache after the step, in its own dtype and layout."""

    out: torch.Tensor
    lse: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"out": self.out, "lse": self.lse, "k_cache": self.k_cache, "v_cache": self.v_cache}


def slot_index(k_cache: torch.Tensor, block_table: torch.Tensor | None, lengths: torch.Tensor) -> list[torch.Tensor]:
    """Per sequence b, the flat slot of each of its first ``lengths[b]`` positions in the cache viewed
    as (slots, Hk, D). With P = ``k_cache.shape[1]`` (the capacity of a contiguous cache, the page
    size of a paged one): contiguous ``b * P + pos``; paged ``block_table[b, pos // P] * P + pos % P``."""
    P = k_cache.shape[1]
    out = []
    for b in range(int(lengths.shape[0])):
        pos = torch.arange(int(lengths[b]), device=lengths.device)
        out.append(b * P + pos if block_table is None else block_table[b, pos // P].long() * P + pos % P)
    return out


def write_new(k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    """Write ``k``, ``v`` (B, Sq, Hk, D) into the caches at ``cache_seqlens``, in place."""
    Sq = k.shape[1]
    flat_k, flat_v = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
    for b, slots in enumerate(slot_index(k_cache, block_table, cache_seqlens.long() + Sq)):
        flat_k[slots[-Sq:]] = k[b]
        flat_v[slots[-Sq:]] = v[b]


def gather(k_cache, v_cache, block_table, lengths) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per sequence b, its first ``lengths[b]`` keys and values, as lists of (L_b, Hk, D) tensors."""
    flat_k, flat_v = k_cache.reshape(-1, *k_cache.shape[2:]), v_cache.reshape(-1, *v_cache.shape[2:])
    slots = slot_index(k_cache, block_table, lengths)
    return [flat_k[s] for s in slots], [flat_v[s] for s in slots]


def append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Copies of the caches with ``k``, ``v`` (B, Sq, Hk, D) written at ``cache_seqlens``."""
    kc, vc = k_cache.clone(), v_cache.clone()
    if k is not None:
        write_new(kc, vc, k, v, cache_seqlens, block_table)
    return kc, vc


def decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None, *, causal=True,
                     softmax_scale=None, window_size=(-1, -1), softcap=0.0) -> DecodeResult:
    """FP64 decode attention (see the module docstring). q (B, Sq, Hq, D); caches contiguous
    (B, capacity, Hk, D / Dv) or paged (num_blocks, page_size, Hk, D / Dv) with ``block_table``."""
    B, Sq, Hq, D = q.shape
    kc, vc = append_to_cache(k_cache, v_cache, k, v, cache_seqlens, block_table)
    lengths = cache_seqlens.long() + (Sq if k is not None else 0)
    keys, vals = gather(kc, vc, block_table, lengths)
    keys = torch.cat(keys) if keys else kc.reshape(-1, *kc.shape[2:])[:0]
    vals = torch.cat(vals) if vals else vc.reshape(-1, *vc.shape[2:])[:0]
    cu_q = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32, device=q.device)
    cu_k = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    r = softmax_attention_varlen(q.reshape(B * Sq, Hq, D), keys, vals, cu_q, cu_k, causal=causal,
                                 softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    out = r.out.reshape(B, Sq, Hq, -1)
    lse = r.lse.reshape(Hq, B, Sq).permute(1, 0, 2).contiguous()
    return DecodeResult(out, lse, kc, vc)
