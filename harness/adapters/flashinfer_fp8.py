"""``flashinfer_fp8``: flashinfer's FP8 prefill on Hopper (``flashinfer-python``; its FlashAttention-3
kernels, ``backend="fa3"``), the second vendor FP8 backend of issue 19 beside cuDNN's.

How a call maps onto flashinfer: a batch of equal-length sequences is one ragged batch
(``BatchPrefillWithRaggedKVCacheWrapper``, NHD layout): q, k, v are the case's e4m3 tensors viewed as
[B * S, H, D] (no copy; a case whose batch and sequence dims cannot be merged without one is refused),
planned once per (shape, mask, softmax scale, output dtype, device) with ``qo_indptr`` / ``kv_indptr``
= 0, S, 2S, ..., as users plan once and run many times. flashinfer's FP8 scales are per head and
multiply (``real = fp8 value x scale``: the descale convention, checked on the H100 in session 23,
``benchmarks/flashinfer_fp8_probe.py``): ``scale_q`` has one entry per query head, ``scale_k`` and
``scale_v`` one per kv head, shared by every sequence of the batch. The harness's descales are
(batch, kv head) (flash-attn 3's convention): a per-tensor case passes its one factor (row 0, query
heads repeated over their group); a per-head case runs when the batch has one sequence and is refused
otherwise, with that reason. The scale tensors are made once per descale tensor (and again after it
changes in place), so the timed call is the wrapper's run. Causal is flashinfer's bottom-right mask
(the last query sees the last key), flash-attn's. The lse comes back in natural log (``lse_base="ln"``),
[B * S, Hq], viewed as (B, Hq, S).

Refused, with reasons: windows (its FP8 path asserts ``window_left == -1``), softcap (its FP8 variant
has no logits cap), ``d_v != d`` (its FP8 entry asserts equal head dims), head dims other than 64 / 128
/ 256 (the sm90 kernels it builds), FP8 output, FP8 gradients, GPUs other than sm90. (FP8 cases are
dense and contiguous: no varlen or packed layouts reach it.)

The call itself is :func:`flashinfer_fp8_attention`, which accept's shim
(``harness.accept.shims:flashinfer_fp8``) calls too. flashinfer JIT-compiles each (dtype, head dim) module
with nvcc on first use (111-118 s each on the H100 box, session 23: ``device_show.sh flashinfer-warm``), then
keeps it in its cache (~/.cache/flashinfer).
"""

from __future__ import annotations

import functools
import math

import torch

from harness.adapters.base import MadeOnce, SoftmaxAdapter, SoftmaxOutput, Unsupported
from harness.adapters.optional import import_attr
from harness.adapters.registry import register
from harness.cases import SoftmaxCase

#: Head dims flashinfer's sm90 FP8 prefill is built for.
HEAD_DIMS = (64, 128, 256)
#: What flashinfer's FP8 path cannot run, in the adapter's refusals and the accept shim's NotImplementedError.
NO_WINDOW = "flashinfer's FP8 prefill has no sliding window (it asserts window_left == -1)"
NO_SOFTCAP = "flashinfer's FP8 attention variant has no logits soft cap"
#: Bytes of the float workspace each planned wrapper owns (flashinfer's examples use 128 MiB).
WORKSPACE_BYTES = 128 * 1024 * 1024


@functools.cache
def _wrapper_class():
    """flashinfer's ragged batch-prefill wrapper class, or None with why not (imported once: flashinfer's
    ``__init__`` imports all of its submodules)."""
    return import_attr("flashinfer", "BatchPrefillWithRaggedKVCacheWrapper", label="flashinfer-python")


@functools.lru_cache(maxsize=8)
def _planned(key):
    """A wrapper planned for ``key`` = (B, Sq, Sk, Hq, Hk, D, causal, scale, out dtype, device index)."""
    B, Sq, Sk, Hq, Hk, D, causal, scale, out_dtype, index = key
    cls, why = _wrapper_class()
    if cls is None:
        raise NotImplementedError(why)
    wrapper = cls(_workspace(torch.device("cuda", index)), "NHD", backend="fa3")
    rows = torch.arange(B + 1, dtype=torch.int32)
    wrapper.plan(rows * Sq, rows * Sk, Hq, Hk, D, head_dim_vo=D, causal=causal, sm_scale=scale,
                 q_data_type=torch.float8_e4m3fn, kv_data_type=torch.float8_e4m3fn, o_data_type=out_dtype)
    return wrapper


def _workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)


#: flashinfer's per-head scales and whether every sequence's descale row equals the first, made once per set
#: of descale tensors.
_SCALES = MadeOnce()


def head_scales(q_descale, k_descale, v_descale, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flashinfer's (scale_q [Hq], scale_k [Hk], scale_v [Hk]) from the harness's (batch, kv head)
    descales: row 0 (the case's per-tensor factor, or its one sequence's per-head factors), q's
    repeated over the query heads of each kv head's group. NotImplementedError when the sequences' rows
    differ (per-(sequence, head) descales: flashinfer's scales are shared by the batch); that check reads
    the descales once, when their scales are made."""
    ds = (q_descale, k_descale, v_descale)

    def make():
        scales = (q_descale[0].float().repeat_interleave(group).contiguous(), k_descale[0].float().contiguous(),
                  v_descale[0].float().contiguous())
        return scales, all(torch.equal(t, t[:1].expand_as(t)) for t in ds)

    scales, shared = _SCALES.get(ds, make)
    if not shared:
        raise NotImplementedError("flashinfer's FP8 scales are per head, shared by every sequence of a batch; these "
                                  "descales differ between sequences")
    return scales


def flashinfer_fp8_attention(q, k, v, q_descale, k_descale, v_descale, *, causal=False, softmax_scale=None,
                             out_dtype=torch.bfloat16, return_lse=False):
    """flashinfer's FP8 prefill on flash-attn's layout: e4m3 q (B, Sq, Hq, D), k / v (B, Sk, Hk, D), (B, Hk)
    float32 descales (flash-attn 3's convention), bottom-right causal; returns out (B, Sq, Hq, D) in
    ``out_dtype`` and, with ``return_lse``, the natural-log lse (B, Hq, Sq). The adapter's call and the
    accept shim's (harness.accept.shims.flashinfer_fp8). NotImplementedError for what flashinfer cannot
    express (per-sequence descales, inputs whose batch and sequence dims do not merge without a copy)."""
    B, Sq, Hq, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(D)
    wrapper = _planned((B, Sq, Sk, Hq, Hk, D, bool(causal), float(scale), out_dtype, q.device.index or 0))
    scales = head_scales(q_descale, k_descale, v_descale, Hq // Hk)
    got = wrapper.run(_rows(q), _rows(k), _rows(v), *scales, return_lse=return_lse, lse_base="ln")
    out, lse = got if return_lse else (got, None)
    out = out.view(B, Sq, Hq, out.shape[-1])
    return (out, lse.view(B, Sq, Hq).permute(0, 2, 1)) if return_lse else out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) as flashinfer's ragged (B * S, H, D), a view."""
    try:
        return t.view(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])
    except RuntimeError:
        raise NotImplementedError("flashinfer's ragged layout needs the batch and sequence dims mergeable without a "
                                  "copy (these inputs' strides do not allow it)") from None


class FlashinferFP8(SoftmaxAdapter):
    name = "flashinfer_fp8"
    description = ("flashinfer's FP8 prefill (flashinfer-python, BatchPrefillWithRaggedKVCacheWrapper, backend "
                   "fa3, sm90): e4m3 q/k/v with per-head scales, bf16/fp16 out; planned once per shape, "
                   "JIT-compiled per head dim")
    fp8 = fp8_only = True
    differentiable = False
    compiles_per_shape = True

    def supports(self, case, device):
        if reason := super().supports(case, device):
            return reason
        if torch.device(device).type != "cuda":
            return "needs CUDA (flashinfer's FP8 prefill is a GPU kernel)"
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            return f"flashinfer's FP8 prefill (its fa3 kernels) is built for sm90 (Hopper); this GPU is sm{major}{minor}"
        if case.window != (-1, -1):
            return NO_WINDOW
        if case.softcap:
            return NO_SOFTCAP
        if case.d != case.d_v:
            return "flashinfer's FP8 prefill takes equal q/k and v head dims"
        if case.d not in HEAD_DIMS:
            return f"flashinfer's sm90 FP8 prefill is built for head dims {', '.join(map(str, HEAD_DIMS))}"
        if case.fp8_out:
            return "FP8 output: not wired in this adapter (it writes bf16 / fp16)"
        if case.fp8_grad:
            return "flashinfer has no FP8 backward"
        if case.fp8_per_head and case.batch > 1:
            return ("flashinfer's FP8 scales are per head, shared by every sequence of a batch; this case's "
                    "descales are per (sequence, head)")
        cls, why = _wrapper_class()
        return why if cls is None else None

    def run(self, case: SoftmaxCase, *, q, k, v, q_descale=None, k_descale=None, v_descale=None,
            cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        if q_descale is None or k_descale is None or v_descale is None:
            raise Unsupported("flashinfer_fp8 runs FP8 cases (e4m3 q, k, v with q/k/v_descale)")
        try:
            got = flashinfer_fp8_attention(q, k, v, q_descale, k_descale, v_descale, causal=case.causal,
                                           softmax_scale=case.scale, out_dtype=case.torch_dtype,
                                           return_lse=bool(case.return_lse))
        except NotImplementedError as e:
            raise Unsupported(str(e)) from None
        out, lse = got if case.return_lse else (got, None)
        return SoftmaxOutput(out, lse)


register(FlashinferFP8)
