"""Shims: packages whose signature is not flash-attn 2's, adapted for ``--impl``.

``harness.accept.shims:flash_attn_cute`` is flash-attn-4 (``flash_attn.cute.interface``) in the
user-callable contract of :mod:`harness.adapters.user`:

* window bounds: the contract's -1 ("unbounded") is flash-attn-4's None (a -1 there is a bound);
* lse: requested when the function has ``return_lse``, returned as flash-attn-4 writes it: +inf for
  rows that see no key, declared (``lse_empty_rows``) so that the judge maps it to -inf on those rows
  after the call, outside the timed one (as for the ``flash_attn_cute`` adapter);
* flash-attn-4 states its limits with asserts: they become NotImplementedError ("unsupported");
* ``deterministic=True`` is passed when the function takes it: its default backward accumulates
  dq with atomics, which the acceptance determinism check (two runs bitwise equal) fails, and the
  user-callable contract has no way yet to declare a nondeterministic backward.
  ``flash_attn_cute_fast`` is the default (atomic) backward, for the speed numbers.

``harness.accept.shims:flashinfer_fp8`` is flashinfer's FP8 prefill (``flashinfer-python``, fa3 kernels, sm90)
in flash-attn 3's FP8 convention (e4m3 q, k, v, (batch, kv head) descales by keyword, bf16 out), through the
``flashinfer_fp8`` adapter's call (:func:`harness.adapters.flashinfer_fp8.flashinfer_fp8_attention`): what
flashinfer cannot express (windows, softcap, descales that differ between sequences) is NotImplementedError.
"""

from __future__ import annotations

import math


def _cute(q, k, v, *, causal, softmax_scale, window_size, softcap, deterministic):
    from harness.adapters.flash_attn import _probe_fa4, _split
    from harness.adapters.optional import call_params

    fn, _, why = _probe_fa4()
    if fn is None:
        raise NotImplementedError(why)
    params = call_params(fn)
    left, right = (int(w) for w in window_size)
    kw = {"softmax_scale": softmax_scale, "causal": causal}
    if (left, right) != (-1, -1) or "window_size" in params:
        kw["window_size"] = (None if left < 0 else left, None if right < 0 else right)
    if softcap:
        kw["softcap"] = softcap
    if "return_lse" in params:
        kw["return_lse"] = True
    if deterministic and "deterministic" in params:
        kw["deterministic"] = True
    try:
        res = fn(q, k, v, **kw)
    except (AssertionError, NotImplementedError) as e:
        raise NotImplementedError(f"flash_attn.cute (flash-attn-4): {e}") from None
    out, lse = _split(res)
    B, Sq, Hq, _ = q.shape
    if lse is not None and tuple(lse.shape) != (B, Hq, Sq):
        lse = None  # another layout: not comparable, so not returned
    return (out, lse) if lse is not None else out


def flash_attn_cute(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0):
    """flash-attn-4 with a deterministic backward where available; q (B, Sq, Hq, D) -> (out, lse)."""
    return _cute(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                 deterministic=True)


def flash_attn_cute_fast(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0):
    """flash-attn-4 with its default (atomic, nondeterministic) backward."""
    return _cute(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size, softcap=softcap,
                 deterministic=False)


_CAPS = {"dtypes": ["fp16", "bf16"], "devices": ["cuda"], "varlen": False, "lse_empty_rows": math.inf}
flash_attn_cute.attn_capabilities = dict(_CAPS)
flash_attn_cute_fast.attn_capabilities = dict(_CAPS)


def flash_attn_cute_decode(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                           window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    """flash-attn-4's paged path in the decode contract (``flash_attn_with_kvcache``), through the
    ``flash_attn_cute_decode`` adapter: the new tokens written with ``index_copy_`` first, then
    ``flash_attn_varlen_func(q, k_cache, v_cache, seqused_k=..., page_table=...)``."""
    from harness.adapters.base import Unsupported
    from harness.adapters.decode import FlashAttnCuteDecode
    from harness.cases import DTYPE_NAMES, DecodeCase

    B, Sq, Hq, D = q.shape
    paged = block_table is not None
    case = DecodeCase(B, Hq, k_cache.shape[2], Sq, 0, D, d_v=v_cache.shape[-1],
                      page_size=k_cache.shape[1] if paged else 0, append=k is not None, causal=causal,
                      window=tuple(window_size), softcap=softcap, scale=softmax_scale,
                      dtype=DTYPE_NAMES.get(q.dtype, "fp32"))
    adapter = FlashAttnCuteDecode()
    reason = adapter.supports(case, q.device)
    if reason:
        raise NotImplementedError(reason)
    try:
        res = adapter.run(case, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                          block_table=block_table, k=k, v=v)
    except Unsupported as e:
        raise NotImplementedError(str(e)) from None
    # lse as flash-attn-4 writes it (+inf on rows that see no key: declared, mapped by the judge)
    return (res.out, res.lse) if res.lse is not None else res.out


flash_attn_cute_decode.attn_capabilities = {"dtypes": ["fp16", "bf16"], "devices": ["cuda"],
                                            "lse_empty_rows": math.inf}


def flashinfer_fp8(q, k, v, *, q_descale, k_descale, v_descale, causal=False, softmax_scale=None,
                   window_size=(-1, -1), softcap=0.0):
    from harness.adapters.flashinfer_fp8 import NO_SOFTCAP, NO_WINDOW, flashinfer_fp8_attention

    if tuple(window_size) != (-1, -1):
        raise NotImplementedError(NO_WINDOW)
    if softcap:
        raise NotImplementedError(NO_SOFTCAP)
    return flashinfer_fp8_attention(q, k, v, q_descale, k_descale, v_descale, causal=causal,
                                    softmax_scale=softmax_scale)


flashinfer_fp8.attn_capabilities = {"fp8": True, "backward": False, "dtypes": ["bf16"], "devices": ["cuda"]}
