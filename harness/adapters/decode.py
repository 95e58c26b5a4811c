"""Decode backends (attention over a KV cache, flash-attn's ``flash_attn_with_kvcache`` contract).

* ``decode_eager``: writes the new tokens into the cache, gathers each sequence's keys and values
  (through the page table), and runs :func:`harness.adapters.eager.eager_attention` per sequence:
  input-dtype matmuls, fp32 softmax. Also the tolerance engine's reference for decode cases.
* ``decode_sdpa``: the same gather, then one torch SDPA call over the batch padded to its longest
  sequence with a bottom-right mask: the "gather then SDPA" baseline a serving stack without a
  paged kernel runs.

Both take any page size and run on CPU and CUDA. The in-repo paged kernel is ``triton_decode``
(:mod:`harness.adapters.inrepo`). The vendor peers, when installed (CUDA only):

* ``flash_attn_kvcache`` / ``flash_attn3_kvcache``: flash-attn 2's / 3's ``flash_attn_with_kvcache``,
  the contract itself (the new tokens appended by the kernel). FA2 pages must hold a multiple of
  256 tokens; FA3 names the page table ``page_table``.
* ``flash_attn_cute_decode``: flash-attn-4's ``flash_attn_varlen_func`` with ``page_table`` and
  ``seqused_k``. It has no cache append: the new tokens are written first by
  :func:`write_new_tokens` (one ``index_copy_`` per cache, on the device, as a serving stack's
  cache-write kernel does), and the timing includes that write.
* ``flex_decode``: torch FlexAttention (compiled) over the paged pool itself, as torch's
  ``PagedAttention`` does: the pool ``(num_blocks, page, Hk, D)`` viewed head-major as one long
  sequence (no copy), a block mask whose key blocks are each sequence's pages in table order, and a
  mask_mod mapping a pool position back to the sequence's logical position (page table inverse,
  built on the device). New tokens are written first, as for flash-attn-4.
"""

from __future__ import annotations

import functools
import importlib
import math

import torch

from harness.adapters.base import DecodeAdapter, DecodeOutput, Unsupported, scale_kwargs
from harness.adapters.eager import eager_attention, visibility_mask
from harness.adapters.optional import call_params, import_attr
from harness.adapters.registry import register
from harness.cases import DecodeCase
from harness.oracle.decode import gather


def write_and_gather(k_cache, v_cache, cache_seqlens, block_table, k, v):
    """Write ``k``, ``v`` into the caches in place (when appending); per sequence, its keys and
    values (cache then new tokens), as lists of (L_b, Hk, D) tensors."""
    lengths = cache_seqlens.long()
    if k is not None:
        write_new_tokens(k_cache, v_cache, k, v, cache_seqlens, block_table)
        lengths = lengths + k.shape[1]
    return gather(k_cache, v_cache, block_table, lengths)


_HOST_GATHER = "it gathers each sequence's keys by its length, read on the host (a synchronisation per call)"


class DecodeEagerAdapter(DecodeAdapter):
    name = "decode_eager"
    description = "gather the cache per sequence, then materialised attention (fp32 softmax): the reference"
    no_cuda_graph = _HOST_GATHER

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        keys, vals = write_and_gather(k_cache, v_cache, cache_seqlens, block_table, k, v)
        outs, lses = [], []
        for b, (kb, vb) in enumerate(zip(keys, vals)):
            o, lse = eager_attention(q[b : b + 1], kb[None], vb[None], causal=case.causal,
                                     window_size=case.window, softcap=case.softcap, **scale_kwargs(case, "softmax_scale"))
            outs.append(o)
            lses.append(lse)
        return DecodeOutput(torch.cat(outs), torch.cat(lses))


class DecodeGatherSDPAAdapter(DecodeAdapter):
    name = "decode_sdpa"
    description = "gather the cache, pad the batch to its longest sequence, one torch SDPA call with a mask"
    no_cuda_graph = _HOST_GATHER

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        if case.softcap:
            return "softcap is not supported by torch SDPA"
        return None

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        keys, vals = write_and_gather(k_cache, v_cache, cache_seqlens, block_table, k, v)
        B, Sq, Hq, _ = q.shape
        L = max((t.shape[0] for t in keys), default=0)
        Hk, Dv = k_cache.shape[2], v_cache.shape[-1]
        if L == 0:  # no sequence has a key: every row is masked (out 0)
            return DecodeOutput(q.new_zeros(B, Sq, Hq, Dv), None)
        kp = q.new_zeros(B, L, Hk, q.shape[-1])
        vp = q.new_zeros(B, L, Hk, Dv)
        mask = torch.zeros(B, 1, Sq, L, dtype=torch.bool, device=q.device)
        for b, (kb, vb) in enumerate(zip(keys, vals)):
            n = kb.shape[0]
            # right-aligned: each sequence's keys end at L, so the bottom-right mask of length n applies
            kp[b, L - n :], vp[b, L - n :] = kb, vb
            vis = visibility_mask(Sq, n, case.causal, case.window, q.device)
            mask[b, 0, :, L - n :] = True if vis is None else vis
        live = mask.any(-1, keepdim=True)
        mask = mask | ~live  # rows that see nothing: any finite row, zeroed below
        qh, kh, vh = q.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2)
        kw = dict(**scale_kwargs(case, "scale"))
        if Hk != Hq:
            kh, vh = kh.repeat_interleave(Hq // Hk, dim=1), vh.repeat_interleave(Hq // Hk, dim=1)
        out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, **kw)
        out = out * live.to(out.dtype)
        return DecodeOutput(out.transpose(1, 2), None)


def write_new_tokens(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Write ``k``, ``v`` (B, Sq, Hk, D) into the caches at ``cache_seqlens`` in place, on the device
    (no host synchronisation: the slots are computed from the device tensors)."""
    B, Sq, Hk = k.shape[0], k.shape[1], k.shape[2]
    pos = cache_seqlens.long()[:, None] + torch.arange(Sq, device=k.device)[None, :]
    if block_table is None:
        slot = torch.arange(B, device=k.device)[:, None] * k_cache.shape[1] + pos
    else:
        page = k_cache.shape[1]
        slot = block_table.long().gather(1, pos // page) * page + pos % page
    slot = slot.reshape(-1)
    k_cache.view(-1, Hk, k_cache.shape[-1]).index_copy_(0, slot, k.reshape(-1, Hk, k.shape[-1]))
    v_cache.view(-1, Hk, v_cache.shape[-1]).index_copy_(0, slot, v.reshape(-1, Hk, v.shape[-1]))


def _unsupported_from(e: Exception, words: str) -> Unsupported | None:
    """A vendor's stated limit (an assert, NotImplementedError, "not supported" RuntimeError) as
    Unsupported; anything else is left to fail the case."""
    msg = str(e).strip()
    if isinstance(e, (AssertionError, NotImplementedError)) or (
        isinstance(e, RuntimeError) and any(w in msg for w in ("only support", "not supported", "does not support"))
    ):
        return Unsupported(f"unsupported: {words}: {msg or type(e).__name__}")
    return None


class _VendorDecode(DecodeAdapter):
    """Shared checks of the vendor decode peers: package present, CUDA, dtype, head dims."""

    lse_empty_rows = math.inf  # flash-attn's lse on rows that see no key (the oracle: -inf)

    module: str = ""
    function: str = ""
    package_words: str = ""
    dtypes: tuple[str, ...] = ("fp16", "bf16")
    max_head_dim: int = 256
    page_multiple: int = 1
    needs_cuda: bool = True  # the tests turn this off to drive the adapter with a fake package

    def probe(self):
        return _probe(self.module, self.function, self.package_words)

    def call(self, fn, case: DecodeCase, *args, **kw) -> DecodeOutput:
        """``fn(*args, **kw)`` -> out or (out, lse, ...); a stated limit becomes Unsupported."""
        try:
            res = fn(*args, **kw)
        except (AssertionError, NotImplementedError, RuntimeError) as e:
            unsup = _unsupported_from(e, self.package_words)
            if unsup is None:
                raise
            raise unsup from None
        out, lse = (res, None) if isinstance(res, torch.Tensor) else (res[0], res[1])
        return DecodeOutput(out, _lse_or_none(lse, case))

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        fn, why = self.probe()
        if fn is None:
            return why
        if self.needs_cuda and (torch.device(device).type != "cuda" or not torch.cuda.is_available()):
            return f"needs CUDA ({self.package_words} has CUDA kernels only)"
        if case.dtype not in self.dtypes:
            return f"{self.package_words} takes {'/'.join(self.dtypes)} only, not {case.dtype}"
        if max(case.d, case.d_v) > self.max_head_dim:
            return f"head dim {max(case.d, case.d_v)} not supported by {self.package_words} (max {self.max_head_dim})"
        if case.paged and case.page_size % self.page_multiple:
            return f"{self.package_words} needs pages of a multiple of {self.page_multiple} tokens, not {case.page_size}"
        if case.softcap and "softcap" not in call_params(fn):
            return f"this {self.package_words} version has no softcap"
        return None


@functools.cache
def _probe(module: str, function: str, words: str):
    fn, why = import_attr(module, function)
    if fn is None:
        return None, (f"{words} not installed" if "not installed" in why else f"{words}: {why}")
    return fn, None


class FlashAttnKVCache(_VendorDecode):
    name = "flash_attn_kvcache"
    description = "flash-attn 2's flash_attn_with_kvcache (appends the new tokens itself); pages of a multiple of 256 tokens"
    module = "flash_attn"
    function = "flash_attn_with_kvcache"
    package_words = "flash_attn (FA2)"
    page_multiple = 256
    table_kw = "block_table"

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        fn, why = self.probe()
        if fn is None:
            raise Unsupported(why)
        params = call_params(fn)
        kw = dict(k=k, v=v, cache_seqlens=cache_seqlens, causal=case.causal, window_size=tuple(case.window),
                  **scale_kwargs(case, "softmax_scale"))
        if block_table is not None:
            kw["page_table" if "page_table" in params else "block_table"] = block_table
        if case.softcap:
            kw["softcap"] = case.softcap
        if "return_softmax_lse" in params:
            kw["return_softmax_lse"] = True
        return self.call(fn, case, q, k_cache, v_cache, **kw)


class FlashAttn3KVCache(FlashAttnKVCache):
    name = "flash_attn3_kvcache"
    description = "flash-attn 3's flash_attn_with_kvcache (flash_attn_interface, sm90), paged through page_table"
    module = "flash_attn_interface"
    package_words = "flash_attn_interface (FA3)"
    page_multiple = 1


class FlashAttnCuteDecode(_VendorDecode):
    name = "flash_attn_cute_decode"
    compiles_per_shape = True
    description = ("flash-attn-4's flash_attn_varlen_func over a paged cache (page_table, seqused_k); "
                   "new tokens written first with index_copy_")
    module = "flash_attn.cute.interface"
    function = "flash_attn_varlen_func"
    package_words = "flash_attn.cute (flash-attn-4)"

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        fn, why = self.probe()
        if fn is None:
            raise Unsupported(why)
        used = cache_seqlens
        if k is not None:
            write_new_tokens(k_cache, v_cache, k, v, cache_seqlens, block_table)
            used = cache_seqlens + k.shape[1]
        # flash-attn-4 spells an unbounded window None (-1 would be a bound)
        window = tuple(None if w < 0 else w for w in case.window)
        kw = dict(seqused_k=used.to(torch.int32), causal=case.causal, window_size=window, return_lse=True,
                  **scale_kwargs(case, "softmax_scale"))
        if block_table is not None:
            kw["page_table"] = block_table.to(torch.int32)
        if case.softcap:
            kw["softcap"] = case.softcap
        return self.call(fn, case, q, k_cache, v_cache, **kw)


class _FlexPagedState:
    """Device tensors the flex_decode mask reads, kept per (batch, pool, sequence) shape and filled in
    place each call: the mask_mod closes over the same tensor objects, so the compiled kernel is
    reused (dynamo guards a closure's tensors by shape, a fresh closure would recompile)."""

    def __init__(self, B: int, num_blocks: int, page: int, Sq: int, left: int, right: int, device):
        self.inverse = torch.full((B, num_blocks), -1, dtype=torch.int32, device=device)  # pool page -> page index
        self.lengths = torch.zeros(B, dtype=torch.int32, device=device)
        inverse, lengths = self.inverse, self.lengths

        def mask_mod(b, h, q_idx, kv_idx):
            slot = inverse[b, kv_idx // page]
            pos_k = slot * page + kv_idx % page  # the key's position in its sequence
            n = lengths[b]
            pos_q = n - Sq + q_idx
            ok = (slot >= 0) & (pos_k < n)
            if right >= 0:
                ok = ok & (pos_k <= pos_q + right)
            if left >= 0:
                ok = ok & (pos_k >= pos_q - left)
            return ok

        self.mask_mod = mask_mod

    def fill(self, block_table, lengths) -> None:
        B, pages = block_table.shape
        self.inverse.fill_(-1)
        idx = torch.arange(pages, dtype=torch.int32, device=block_table.device).expand(B, pages)
        self.inverse.scatter_(1, block_table.long(), idx)
        self.lengths.copy_(lengths)


@functools.lru_cache(maxsize=8)
def _flex_paged_state(B, num_blocks, page, Sq, left, right, device):
    return _FlexPagedState(B, num_blocks, page, Sq, left, right, device)


class FlexPagedDecode(DecodeAdapter):
    name = "flex_decode"
    compiles_per_shape = True
    description = ("torch FlexAttention (compiled) over the paged pool viewed head-major, pages as key blocks "
                   "through a page-table mask (torch's PagedAttention scheme); new tokens written first")
    #: False: eager flex_attention (the tests' CPU path: FlexAttention compiles forward-only on CPU)
    compiled: bool = True
    needs_cuda: bool = True

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        if self.needs_cuda and torch.device(device).type != "cuda":
            return "needs CUDA (FlexAttention's paged decode is a compiled GPU kernel)"
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError as e:
            return f"FlexAttention not available in torch {torch.__version__}: {e}"
        if not case.paged:
            return "contiguous caches: use flex on the softmax family (this adapter reads a paged pool)"
        if case.page_size % 16 or case.page_size & (case.page_size - 1):
            # 48-token pages: inductor's Triton compile fails (SubprocException) on every fuzzed case
            # on the H100 (torch 2.13): the kernels tile a key block with power-of-two ranges
            return (f"FlexAttention's key blocks (pages here) must hold a power of two >= 16 tokens, "
                    f"not {case.page_size}")
        return None

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        from harness.adapters.flex import _compiled_flex, call_without_fallback, score_mod_for

        if block_table is None:
            raise Unsupported("flex_decode reads a paged cache; this case has a contiguous one")
        B, Sq, Hq, _ = q.shape
        num_blocks, page, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
        lengths = cache_seqlens
        if k is not None:
            write_new_tokens(k_cache, v_cache, k, v, cache_seqlens, block_table)
            lengths = cache_seqlens + k.shape[1]
        left, right = case.window
        if case.causal:
            right = 0
        state = _flex_paged_state(B, num_blocks, page, Sq, left, right, str(q.device))
        state.fill(block_table, lengths)
        # each sequence's key blocks: its pages in table order, as many as its length needs
        used = torch.div(lengths + page - 1, page, rounding_mode="floor").to(torch.int32)
        mask = BlockMask.from_kv_blocks(used.view(B, 1, 1), block_table.to(torch.int32).view(B, 1, 1, -1),
                                        BLOCK_SIZE=(max(16, Sq), page), mask_mod=state.mask_mod,
                                        seq_lengths=(Sq, num_blocks * page), compute_q_blocks=False)
        pool_k = k_cache.view(1, num_blocks * page, Hk, -1).transpose(1, 2)  # (1, Hk, pool, D): a view
        pool_v = v_cache.view(1, num_blocks * page, Hk, -1).transpose(1, 2)
        kw = dict(score_mod=score_mod_for(case.softcap), block_mask=mask, return_lse=True,
                  enable_gqa=Hq != Hk, **scale_kwargs(case, "scale"))
        if self.compiled:
            out, lse = call_without_fallback(_compiled_flex(), q.transpose(1, 2), pool_k, pool_v, **kw)
        else:
            out, lse = flex_attention(q.transpose(1, 2), pool_k, pool_v, **kw)
        return DecodeOutput(out.transpose(1, 2), lse)


def _lse_or_none(lse, case: DecodeCase):
    """The vendor's lse when it has the contract's (B, Hq, Sq) shape, as the kernel wrote it (flash-attn:
    +inf on rows that see no key; the adapters declare ``lse_empty_rows`` and the checker maps them)."""
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (case.batch, case.heads_q, case.seqlen_q):
        return None
    return lse


register(DecodeEagerAdapter)
register(DecodeGatherSDPAAdapter)
for _cls in (FlashAttnKVCache, FlashAttn3KVCache, FlashAttnCuteDecode, FlexPagedDecode):
    register(_cls)
