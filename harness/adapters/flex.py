"""FlexAttention under ``torch.compile``: the ``flex`` adapter.

Masks use flash-attn's bottom-right convention through a ``mask_mod`` (causal and local windows,
offset ``Sk - Sq``), softcap through a ``score_mod`` (FlexAttention applies the scale before the
score_mod), GQA through ``enable_gqa=True``; the lse comes from ``return_lse=True`` (natural log,
as the oracle's; checked against it in the tests).

A compiled FlexAttention that silently runs its eager fallback is 10-50x slower and would be
timed as if it were the kernel (seen on the H100: hd128 at 5-14 TFLOP/s after the recompile
limit). So the compiled function uses ``fullgraph=True``: a graph break raises instead of falling
back, and hitting dynamo's recompile limit raises ``FailOnRecompileLimitHit``. Both, and any
graph break counted by dynamo during the call, become ``Unsupported("flex fell back to eager: ...")``.
Every case is its own compile (``dynamic=False``: static shapes give the tuned kernels), so the
recompile limit is raised to ``FLEX_RECOMPILE_LIMIT`` for the duration of each call only.

CPU: FlexAttention compiles forward-only there (no backward, no lse under torch.compile), so the
adapter is CUDA-only.
"""

from __future__ import annotations

import functools
import importlib

import torch

from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput, Unsupported, scale_kwargs
from harness.adapters.registry import register
from harness.cases import SoftmaxCase

# Each distinct (shape, mask, softcap, dtype) compiles once; a sweep visits a few dozen. Beyond
# this many compiles of the one function, dynamo would fall back to eager: reported, not timed.
FLEX_RECOMPILE_LIMIT = 256
# Block masks are rebuilt only for a new (Sq, Sk, mask, device); a sweep holds a few at once.
BLOCK_MASK_CACHE = 32


@functools.cache
def _compiled_flex():
    """flex_attention compiled once per process, lazily (importing torch.compile costs seconds)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False, fullgraph=True)


def mask_mod_for(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int]):
    """A FlexAttention mask_mod for flash-attn's bottom-right causal / window, or None (no mask)."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    offset = seqlen_k - seqlen_q

    def mask_mod(b, h, q_idx, kv_idx):
        diag = q_idx + offset
        if right >= 0 and left >= 0:
            return (kv_idx <= diag + right) & (kv_idx >= diag - left)
        if right >= 0:
            return kv_idx <= diag + right
        return kv_idx >= diag - left

    return mask_mod


@functools.cache
def score_mod_for(softcap: float):
    """A score_mod applying ``softcap * tanh(score / softcap)``, or None. Cached: one function
    object per softcap, so dynamo's guards on it match on the next call instead of recompiling."""
    if not softcap:
        return None
    cap = float(softcap)

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return score_mod


@functools.lru_cache(maxsize=BLOCK_MASK_CACHE)
def _block_mask(seqlen_q: int, seqlen_k: int, causal: bool, window: tuple[int, int], device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    mod = mask_mod_for(seqlen_q, seqlen_k, causal, window)
    if mod is None:
        return None
    return create_block_mask(mod, None, None, seqlen_q, seqlen_k, device=device)


def flex_args(case: SoftmaxCase, q, k, v) -> tuple[tuple, dict]:
    """flex_attention's (args, kwargs) for harness-layout q (B, Sq, Hq, D), k, v (B, Sk, Hk, D/Dv).

    The block mask is built (or fetched from the cache) here, outside any timed or compiled call.
    """
    Sq, Sk = q.shape[1], k.shape[1]
    kw = dict(
        score_mod=score_mod_for(case.softcap),
        block_mask=_block_mask(Sq, Sk, case.causal, tuple(case.window), str(q.device)),
        **scale_kwargs(case, "scale"),
        return_lse=True,
    )
    if case.heads_q != case.heads_k:
        kw["enable_gqa"] = True
    return (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), kw


def flex_call(fn, case: SoftmaxCase, q, k, v):
    """Run ``fn`` (flex_attention, compiled or not) on harness-layout q, k, v -> (out, lse).

    Returns out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) fp32, natural log.
    """
    args, kw = flex_args(case, q, k, v)
    out, lse = fn(*args, **kw)
    return out.transpose(1, 2), lse


def _limit_name() -> str:
    cfg = importlib.import_module("torch._dynamo.config")
    return "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"


def _dynamo_fallbacks() -> int:
    """Graph breaks and unimplemented constructs (a recompile-limit hit is one) dynamo has counted."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())


def call_without_fallback(compiled, *args, recompile_limit: int = FLEX_RECOMPILE_LIMIT, **kwargs):
    """Call a ``torch.compile(..., fullgraph=True)`` function; a fallback to eager raises Unsupported.

    The recompile limit is raised to ``recompile_limit`` for this call only (never lowered).
    Hitting it, a graph break, or any fallback dynamo counts during the call becomes
    ``Unsupported("flex fell back to eager: <reason>")``: timing an eager fallback as the kernel
    is the failure this guards against.
    """
    dynamo = importlib.import_module("torch._dynamo")
    dexc = importlib.import_module("torch._dynamo.exc")
    limit = _limit_name()
    hit = getattr(dexc, "FailOnRecompileLimitHit", None) or getattr(dexc, "FailOnCacheLimitHit", None)
    value = max(recompile_limit, getattr(dynamo.config, limit))
    before = _dynamo_fallbacks()
    try:
        with dynamo.config.patch(**{limit: value}):
            result = compiled(*args, **kwargs)
    except Exception as e:
        text = str(e) + " " + str(e.__cause__ or "")
        if (
            (hit is not None and isinstance(e, hit))
            or "recompile limit" in text
            or "cache_size_limit" in text
        ):
            raise Unsupported(
                f"flex fell back to eager: dynamo's {limit} ({value}) "
                "was hit: too many compiles of flex_attention in one process"
            ) from None
        if isinstance(e, dexc.Unsupported):
            raise Unsupported(f"flex fell back to eager: graph break: {_first_line(e)}") from None
        if "NoValidChoicesError" in text:
            # inductor found no kernel template that fits the shape (seen on the H100 for head
            # dim 16 with 70 queries x 33 keys): torch's refusal, not a wrong answer
            raise Unsupported(f"FlexAttention cannot compile this case: {_first_line(e)}") from None
        if "must be divisible by BLOCK_M and BLOCK_N" in text:
            # flex's own check: the block mask's blocks (flex_decode: the pages) are smaller than
            # the tile of the template inductor picked (fuzzed on the H100: 16- and 32-token pages
            # at some head dims); a clean refusal
            raise Unsupported(f"FlexAttention cannot compile this case: {_first_line(e)}") from None
        if isinstance(e, NotImplementedError) or "NotImplementedError" in str(e):
            raise Unsupported(
                f"unsupported: FlexAttention cannot compile this case: {_first_line(e)}"
            ) from None
        raise
    if _dynamo_fallbacks() != before:
        raise Unsupported("flex fell back to eager: dynamo counted a graph break or fallback during the call")
    return result


class FlexAdapter(SoftmaxAdapter):
    name = "flex"
    compiles_per_shape = True
    description = "torch FlexAttention under torch.compile (fullgraph, static shapes); fallbacks reported"

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        if torch.device(device).type != "cuda":
            return "needs CUDA (FlexAttention compiles forward-only on CPU: no backward, no lse)"
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError as e:
            return f"FlexAttention not available in torch {torch.__version__}: {e}"
        if case.is_varlen:
            return "variable-length (packed) batches are not wired for flex (would need a document mask)"
        if case.dtype == "fp64":
            return "FlexAttention's Triton kernels take fp16/bf16/fp32, not fp64"
        return None

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        if case.is_varlen:
            raise Unsupported("variable-length (packed) batches are not wired for flex")
        args, kw = flex_args(case, q, k, v)
        out, lse = call_without_fallback(_compiled_flex(), *args, **kw)
        return SoftmaxOutput(out.transpose(1, 2), lse)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(e).__name__


register(FlexAdapter)
