"""The flash-attention packages: ``flash_attn`` (FA2), ``flash_attn3`` (FA3, ``flash_attn_interface``)
and ``flash_attn_cute`` (flash-attn-4, ``flash_attn.cute``: the FA3-class CuTe kernels).

All three speak the harness's layout natively (q (B, S, H, D), varlen (total, H, D) with int32
``cu_seqlens``), bottom-right causal / window masks, GQA by head count, and return a natural-log
lse (B, H, Sq) / (H, total_q). Each package is probed once, on first need.

Two conventions are normalised here, documented rather than hidden:
* window bounds: flash-attn 2/3 take -1 for "unbounded"; flash-attn-4 takes None (a -1 there
  would be read as a bound), so -1 is passed to it as None.
* rows that see no key: FA2 writes lse = +inf for them, the oracle -inf. On rows the case's mask
  makes empty (and only there) +inf is turned into -inf; anywhere else a +inf is left for the
  verification runner to flag.
"""

from __future__ import annotations

import functools
import math
import warnings

import torch

from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput, Unsupported, scale_kwargs
from harness.adapters.optional import call_params, call_positionally, import_attr, positional_order
from harness.adapters.registry import register
from harness.cases import SoftmaxCase

# FA2's kernels are instantiated for head dims up to 256 (rounded up to a multiple of 8).
FA2_MAX_HEAD_DIM = 256
# FA3's Hopper kernels: head dims up to 256.
FA3_MAX_HEAD_DIM = 256


@functools.cache
def _probe_fa2():
    fn, why = import_attr("flash_attn", "flash_attn_func")
    if fn is None:
        if "not installed" in why:
            return None, None, "flash_attn not installed"
        if "has no" in why:  # e.g. only flash-attn-4's flash_attn.cute namespace is installed
            return (
                None,
                None,
                "flash_attn (FA2) not installed: the flash_attn package found has no flash_attn_func",
            )
        return None, None, f"flash_attn (FA2): {why}"
    varlen, _ = import_attr("flash_attn", "flash_attn_varlen_func")
    return fn, varlen, None


@functools.cache
def _probe_fa3():
    fn, why = import_attr("flash_attn_interface", "flash_attn_func")
    if fn is None:
        if "not installed" in why:
            return None, None, "flash_attn_interface (FA3) not installed"
        return None, None, f"flash_attn_interface (FA3): {why}"
    varlen, _ = import_attr("flash_attn_interface", "flash_attn_varlen_func")
    return fn, varlen, None


@functools.cache
def _probe_fa4():
    fn, why = import_attr("flash_attn.cute.interface", "flash_attn_func")
    if fn is None:
        if "not installed" in why:
            return None, None, "flash_attn.cute (flash-attn-4) not installed"
        return None, None, f"flash_attn.cute (flash-attn-4): {why}"
    varlen, _ = import_attr("flash_attn.cute.interface", "flash_attn_varlen_func")
    # flash-attn-4 4.0.0b36 with cutlass-dsl 4.8 warns on every compile that an internal argument
    # (aux_data) is not a JIT argument: ~1 KB per shape, which buried the run logs on the H100.
    # Its own internals, nothing a user can act on; only that message is silenced.
    warnings.filterwarnings("ignore", message=r"Argument aux_data .*cannot be converted to a JitArgument",
                            category=UserWarning)
    return fn, varlen, None


def _split(res):
    """out, or (out, lse, ...), or (out, lse) -> (out, lse or None)."""
    if isinstance(res, torch.Tensor):
        return res, None
    out = res[0]
    lse = res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None
    return out, lse


class _FlashAdapter(SoftmaxAdapter):
    """Shared supports / run; subclasses set the probe and limits."""

    deterministic_backward = False  # dq is accumulated with atomics unless deterministic=True
    lse_empty_rows = math.inf  # flash-attn's lse on rows that see no key (the oracle: -inf)
    package_words: str = ""
    min_capability: tuple[int, int] = (8, 0)
    max_capability: tuple[int, int] | None = None
    dtypes: tuple[str, ...] = ("fp16", "bf16")
    max_head_dim: int | None = None
    #: the backward asserts d == d_v when heads_q != heads_k (flash-attn-4 4.0.0b36, found by the fuzzer)
    gqa_backward_needs_same_dv: bool = False
    needs_same_dv: bool = False
    unbounded_window = -1  # how the package spells "no bound" in window_size

    def _probe(self):
        raise NotImplementedError

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        fn, varlen_fn, why = self._probe()
        if fn is None:
            return why
        device = torch.device(device)
        if device.type != "cuda":
            return f"needs CUDA ({self.package_words} has CUDA kernels only)"
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        cap = torch.cuda.get_device_capability(device)
        if cap < self.min_capability:
            return f"needs sm{self.min_capability[0]}{self.min_capability[1]}+"
        if self.max_capability is not None and cap > self.max_capability:
            return f"{self.package_words} runs on sm{self.min_capability[0]}{self.min_capability[1]} only"
        if case.dtype not in self.dtypes:
            return f"{self.package_words} takes {'/'.join(self.dtypes)} only, not {case.dtype}"
        if self.max_head_dim is not None and max(case.d, case.d_v) > self.max_head_dim:
            d = max(case.d, case.d_v)
            return f"head dim {d} not supported by {self.package_words} (max {self.max_head_dim})"
        if self.needs_same_dv and case.d_v != case.d:
            return (
                f"{self.package_words} needs the value head dim equal to the query's "
                f"(d_v {case.d_v} != d {case.d})"
            )
        if self.gqa_backward_needs_same_dv and case.heads_q != case.heads_k and case.d_v != case.d:
            return (f"{self.package_words}'s GQA backward requires head_dim == head_dim_v (its own assertion; "
                    f"d {case.d}, d_v {case.d_v}, heads {case.heads_q}/{case.heads_k})")
        if case.softcap and "softcap" not in call_params(varlen_fn if case.is_varlen else fn):
            return f"this {self.package_words} version has no softcap"
        if case.is_varlen and varlen_fn is None:
            return f"this {self.package_words} version has no flash_attn_varlen_func"
        if case.call == "positional":
            order, why = positional_order(fn)
            if order is None:
                return f"{self.package_words} has no positional form: {why}"
        return None

    def _window(self, case: SoftmaxCase):
        if self.unbounded_window == -1:
            return tuple(case.window)
        return tuple(self.unbounded_window if w < 0 else w for w in case.window)

    def _kwargs(self, fn, case: SoftmaxCase) -> dict:
        params = call_params(fn)
        kw = dict(**scale_kwargs(case, "softmax_scale"), causal=case.causal)
        if case.has_window or "window_size" in params:
            kw["window_size"] = self._window(case)
        if case.softcap:
            kw["softcap"] = case.softcap
        if "return_lse" in params:
            kw["return_lse"] = case.return_lse
        elif "return_attn_probs" in params:  # with dropout 0 this returns (out, lse, None): no probs computed
            kw["return_attn_probs"] = case.return_lse
        return kw

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        fn, varlen_fn, why = self._probe()
        if fn is None:
            raise Unsupported(why)
        try:
            if case.is_varlen:
                if varlen_fn is None:
                    raise Unsupported(f"this {self.package_words} version has no flash_attn_varlen_func")
                res = varlen_fn(
                    q,
                    k,
                    v,
                    cu_seqlens_q=cu_seqlens_q.to(torch.int32),
                    cu_seqlens_k=cu_seqlens_k.to(torch.int32),
                    max_seqlen_q=case.seqlen_q,
                    max_seqlen_k=case.seqlen_k,
                    **self._kwargs(varlen_fn, case),
                )
            elif case.call == "positional":  # the package's own positional order (its signature)
                res = call_positionally(fn, (q, k, v), self._kwargs(fn, case), positional_order(fn)[0])
            else:
                res = fn(q, k, v, **self._kwargs(fn, case))
        except (AssertionError, NotImplementedError) as e:
            # flash-attn-4 states its limits as asserts (head dims, dtypes, arch).
            raise Unsupported(f"unsupported: {self.package_words}: {e}") from None
        except RuntimeError as e:
            msg = str(e)
            if "only support" in msg or "not supported" in msg or "does not support" in msg:
                raise Unsupported(f"unsupported: {self.package_words}: {msg.strip()}") from None
            raise
        out, lse = _split(res)
        if lse is not None:
            want = (case.heads_q, q.shape[0]) if case.is_varlen else (case.batch, case.heads_q, case.seqlen_q)
            if tuple(lse.shape) != want:
                lse = None  # an older padded lse layout: not comparable, so not reported
        return SoftmaxOutput(out, lse)  # +inf on rows that see no key: lse_empty_rows (mapped by the checker)


class FlashAttn2(_FlashAdapter):
    name = "flash_attn"
    description = "flash-attn 2 package (flash_attn_func / flash_attn_varlen_func), sm80+"
    package_words = "flash_attn (FA2)"
    max_head_dim = FA2_MAX_HEAD_DIM
    needs_same_dv = True

    def _probe(self):
        return _probe_fa2()


class FlashAttn3(_FlashAdapter):
    name = "flash_attn3"
    description = "flash-attn 3 Hopper package (flash_attn_interface), sm90"
    package_words = "flash_attn_interface (FA3)"
    min_capability = (9, 0)
    max_capability = (9, 0)
    max_head_dim = FA3_MAX_HEAD_DIM

    def _probe(self):
        return _probe_fa3()


class FlashAttnCute(_FlashAdapter):
    name = "flash_attn_cute"
    compiles_per_shape = True
    description = "flash-attn-4 CuTe-DSL kernels (flash_attn.cute), FA3-class on sm90/sm100; JIT per shape"
    package_words = "flash_attn.cute (flash-attn-4)"
    unbounded_window = None  # FA4 spells "unbounded" None; -1 would be a bound
    gqa_backward_needs_same_dv = True

    def _probe(self):
        return _probe_fa4()


for _cls in (FlashAttn2, FlashAttn3, FlashAttnCute):
    register(_cls)
