"""The in-repo Triton kernels of ``kernels/``: ``triton_fa`` (with ``triton_fa_det`` and its FP8 forward
``triton_fa_fp8``),
``triton_la_chunk`` and ``triton_decode``.

* ``triton_fa``: ``kernels.flash_attn.flash_attn_func(q, k, v, *, causal, softmax_scale,
  window_size, return_lse=case.return_lse, deterministic=False)`` (and ``flash_attn_varlen_func`` for
  varlen cases). ``deterministic=False`` (where the function takes it) is flash-attn's default and the
  vendor kernels' timed path: the fused backward's dQ by TMA reduce (sm90, configs.BWD_GLUON_FUSED's cells: hd 64 /
  128, MHA and GQA / MQA, from 1k-8k by cell), so the adapter declares those cells' backward nondeterministic
  (two runs' dQ may differ by fp32 rounding there: reported with the spread) and every other cell's deterministic
  (a difference fails).
* ``triton_fa_det``: the same call with ``deterministic=True``, the kernel's own default (its backward in a fixed
  order, bitwise reproducible: what a user calling ``flash_attn_func`` with no keyword gets: the split kernels, or
  the fused kernel with its dQ adds ordered where configs.BWD_GLUON_FUSED_ORDERED routes it); on an sm90 GPU only,
  where the two calls differ.
* ``triton_la_chunk``: ``kernels.linear_attn.chunk_linear_attn(q, k, v, g, g_gamma, *, scale,
  initial_state, output_final_state=True)``.
* ``triton_decode``: ``kernels.decode.decode_attention(q, k_cache, v_cache, k, v, *, cache_seqlens,
  block_table, causal, softmax_scale, window_size, softcap, return_lse=True, validate=False)``
  (flash-attn's ``flash_attn_with_kvcache``; the harness validates the inputs itself, so the
  kernel's device-reading checks are off, as in a timed loop).

All speak the harness's layouts. The kernels are imported on first need, so a kernel module
that does not import yet (being written, or broken) makes its adapter report why instead of
taking the registry down. Without CUDA they run only in Triton's CPU interpreter
(``TRITON_INTERPRET=1``, read by Triton when the kernels are defined: set it before the run).
The interpreter multiplies bf16 bit patterns in ``tl.dot`` (triton issue 11584), so bf16 is a
GPU-only check.
"""

from __future__ import annotations

import functools
import importlib
import os
import re

import torch

from harness.adapters.base import (
    Adapter,
    DecodeAdapter,
    DecodeOutput,
    LinearAdapter,
    LinearOutput,
    SoftmaxAdapter,
    SoftmaxOutput,
    Unsupported,
    scale_kwargs,
)
from harness.adapters.optional import call_params, positional_order
from harness.adapters.registry import register
from harness.cases import DecodeCase, LinearCase, SoftmaxCase

NEEDS_CUDA = "needs CUDA, or TRITON_INTERPRET=1 for the Triton CPU interpreter"
INTERPRETER_BF16 = (
    "the Triton interpreter multiplies bf16 bit patterns in tl.dot (triton issue 11584): "
    "bf16 is checked on the GPU"
)
# A kernel's ValueError that states a limit rather than a bad argument: "unsupported: ..." or
# "<argument>: unsupported: ...".
_UNSUPPORTED = re.compile(r"^(\w+: )?unsupported\b")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _import(module: str):
    """(module, None) or (None, reason). Cached: a kernel module is imported once per process."""
    try:
        return importlib.import_module(module), None
    except Exception as e:  # SyntaxError, ImportError, a Triton error at decoration: all reasons
        return None, f"in-repo kernel not importable: {module}: {type(e).__name__}: {e}"


def _device_reason(case, device) -> str | None:
    device = torch.device(device)
    if device.type == "cuda":
        return None
    if device.type != "cpu" or not interpreting():
        return NEEDS_CUDA
    if case.dtype == "bf16" and not getattr(case, "fp8", ""):  # FP8 cases: fp8 dots, bf16 only the output
        return INTERPRETER_BF16
    return None


def _module_and_reason(adapter, case, device):
    """(kernel module, None), or (None, the reason) from the checks both in-repo adapters share:
    the case's family, the device / interpreter, then the kernel importing. The device comes
    before the import on purpose: Triton fixes a kernel's interpreter mode when its module is
    imported, so importing it where it cannot run would leave a compiled-mode kernel behind for
    a later interpreter run in the same process."""
    reason = Adapter.supports(adapter, case, device) or _device_reason(case, device)
    if reason:
        return None, reason
    mod, why = _import(adapter.module)
    return mod, why


def _as_unsupported(e: ValueError) -> Unsupported | None:
    """The kernel's "[arg: ]unsupported: <reason>" ValueError as Unsupported, else None."""
    msg = str(e).strip()
    m = _UNSUPPORTED.match(msg)
    return Unsupported(msg[len(m.group(1) or "") :]) if m else None


class _StatedLimits:
    """Around a kernel call: its "[arg: ]unsupported: <reason>" ValueError becomes Unsupported (a
    limit the kernel states); any other error propagates as it is. A class, not a generator
    context manager: it wraps every timed call, and the host time of a call is measured too."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is not None and issubclass(kind, ValueError):
            unsup = _as_unsupported(e)
            if unsup is not None:
                raise unsup from None
        return False


_stated_limits = _StatedLimits


def _sm90(device) -> bool:
    """Whether ``device`` is an sm90 (Hopper) CUDA GPU: where the in-repo kernel's fused backward runs."""
    dev = torch.device(device) if device is not None else None
    return dev is not None and dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] == 9


class TritonFA(SoftmaxAdapter):
    name = "triton_fa"
    compiles_per_shape = True
    description = "in-repo Triton flash attention (kernels/flash_attn), forward + backward"
    module = "kernels.flash_attn"
    #: the ``deterministic`` keyword passed to flash_attn_func where it takes one: False, the fast backward
    #: (flash-attn's default, the vendor kernels' timed path); :class:`TritonFADeterministic` passes True
    call_deterministic: bool = False

    def deterministic_backward_for(self, case, device) -> bool:
        """False on the calls whose backward adds in arrival order: the cells the kernel's fused backward takes
        when called with ``deterministic=False`` (``configs.fused_bwd_cell``: dense bf16 / fp16 on an sm90 GPU,
        causal or no mask, no softcap), and every call under ``FLASH_ATTN_BWD=atomic`` (dQ by atomics). True
        elsewhere: a difference between two runs there fails the determinism check."""
        if os.environ.get("FLASH_ATTN_BWD", "") == "atomic":
            return False
        if self.call_deterministic:
            return True
        if not isinstance(case, SoftmaxCase) or case.is_varlen or case.fp8 or case.softcap or \
                case.dtype not in ("bf16", "fp16") or case.window[0] >= 0 or (case.window[1] >= 0 and not case.causal):
            return True
        if not _sm90(device):
            return True
        mod, _ = _import(self.module)
        if mod is None or "deterministic" not in call_params(mod.flash_attn_func):
            return True  # (not called with deterministic=False)
        try:
            cell = getattr(importlib.import_module(self.module + ".configs"), "fused_bwd_cell", None)
        except ImportError:  # a kernel module without the in-repo configs: no fused route to declare
            return True
        return cell is None or cell(case.d, case.d_v or case.d, case.heads_q != case.heads_k, case.causal,
                                    min(case.seqlen_q, case.seqlen_k)) is None

    def supports(self, case, device):
        mod, reason = _module_and_reason(self, case, device)
        if reason:
            return reason
        if case.softcap and "softcap" not in call_params(mod.flash_attn_func):
            return "softcap is not supported by this triton_fa (its flash_attn_func has no softcap parameter)"
        if self.call_deterministic:
            if "deterministic" not in call_params(mod.flash_attn_func):
                return (f"{self.name} passes deterministic=True, and this kernels.flash_attn.flash_attn_func has no "
                        "deterministic parameter (triton_fa times its only backward)")
            if not _sm90(device):
                return (f"{self.name} calls what triton_fa calls on this device (the kernel's nondeterministic fused "
                        "backward runs on sm90 GPUs only): run triton_fa here")
        if case.is_varlen and not hasattr(mod, "flash_attn_varlen_func"):
            return "triton_fa has no varlen entry point (kernels.flash_attn.flash_attn_varlen_func) yet"
        check = getattr(mod, "unsupported_reason", None)
        if check is not None:
            form = {"varlen": case.is_varlen} if "varlen" in call_params(check) else {}
            for dim in dict.fromkeys((case.d, case.d_v)):  # the value head dim may differ (MLA: 192 / 128)
                reason = check(dim, case.torch_dtype, **form)
                if reason:
                    return reason
        if case.call == "positional":
            order, why = positional_order(mod.flash_attn_func)
            if order is None:
                return f"kernels.flash_attn.flash_attn_func has no positional form: {why}"
        return None

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        mod, why = _import(self.module)
        if mod is None:
            raise Unsupported(why)
        kw = dict(
            causal=case.causal,
            **scale_kwargs(case, "softmax_scale"),
            window_size=tuple(case.window),
            return_lse=case.return_lse,
        )
        if case.softcap:
            kw["softcap"] = case.softcap
        with _stated_limits():
            if case.is_varlen:
                fn = getattr(mod, "flash_attn_varlen_func", None)
                if fn is None:
                    raise Unsupported("triton_fa has no varlen entry point yet")
                # the harness checked the offsets itself: no per-call host copy of them in the kernel
                extra = {"validate": False} if "validate" in call_params(fn) else {}
                res = fn(
                    q,
                    k,
                    v,
                    cu_seqlens_q.to(torch.int32),
                    cu_seqlens_k.to(torch.int32),
                    case.seqlen_q,
                    case.seqlen_k,
                    **kw,
                    **extra,
                )
            else:
                if "deterministic" in call_params(mod.flash_attn_func):  # False: the fast backward, as FA2/3/4's
                    kw["deterministic"] = self.call_deterministic  # default; True: the kernel's own default
                res = mod.flash_attn_func(q, k, v, **kw)
        out, lse = res if case.return_lse else (res, None)
        return SoftmaxOutput(out, lse)


class TritonFADeterministic(TritonFA):
    """The in-repo kernel called as its own default, ``flash_attn_func(..., deterministic=True)``: the backward adds
    in a fixed order (the split route: dQ and dK / dV kernels of their own), bitwise the same on every run, where
    ``triton_fa`` times the fast one (``deterministic=False``: the fused backward's dQ by TMA reduce in arrival order
    on an sm90 GPU's fused cells, configs.BWD_GLUON_FUSED). Off those cells (another GPU, the interpreter, GQA,
    short sequences, fp32, masks other than causal) both backends run the same kernels. Varlen calls: the varlen
    entry point has no such keyword and is deterministic either way."""

    name = "triton_fa_det"
    description = ("in-repo Triton flash attention (kernels/flash_attn) with deterministic=True, its own default: "
                   "a bitwise-reproducible backward")
    call_deterministic = True


class TritonLAChunk(LinearAdapter):
    name = "triton_la_chunk"
    compiles_per_shape = True
    description = "in-repo Triton chunked linear attention (kernels/linear_attn), forward + backward"
    module = "kernels.linear_attn"
    deterministic_backward = False  # the backward accumulates its row dots (for dg) with atomics
    # g_gamma is a fixed per-head decay (RetNet-style), not a learned input: like FLA's
    # chunk_simple_gla, the kernel is differentiable in q, k, v, g and initial_state only.
    nondifferentiable_inputs = ("g_gamma",)

    def supports(self, case, device):
        mod, reason = _module_and_reason(self, case, device)
        if reason:
            return reason
        if case.dtype == "fp64":
            return "triton_la_chunk takes fp16/bf16/fp32, not fp64"
        cfg, _ = _import(self.module + ".configs")
        dims = getattr(cfg, "SUPPORTED_DIMS", None) if cfg is not None else None
        if dims is not None:
            for label, d in (("K", case.d_k), ("V", case.d_v)):
                if d not in dims:
                    supported = ", ".join(map(str, dims))
                    return f"head dim {label}={d} not supported by triton_la_chunk (supported: {supported})"
        return None

    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput:
        mod, why = _import(self.module)
        if mod is None:
            raise Unsupported(why)
        with _stated_limits():
            o, final_state = mod.chunk_linear_attn(
                q,
                k,
                v,
                g,
                g_gamma,
                **scale_kwargs(case, "scale"),
                initial_state=initial_state,
                output_final_state=True,
            )
        return LinearOutput(o, final_state)


class TritonDecode(DecodeAdapter):
    name = "triton_decode"
    compiles_per_shape = True
    description = "in-repo Triton split-K decode over a contiguous or paged KV cache (kernels/decode)"
    module = "kernels.decode"

    def supports(self, case, device):
        mod, reason = _module_and_reason(self, case, device)
        if reason:
            return reason
        if case.dtype == "fp64":
            return "triton_decode takes fp16/bf16/fp32, not fp64 (it accumulates in fp32)"
        iface, _ = _import(self.module + ".interface")
        multiple = getattr(iface, "PAGE_MULTIPLE", 16)
        if case.paged and case.page_size % multiple:
            return f"triton_decode needs a page size that is a multiple of {multiple}, not {case.page_size}"
        top = getattr(iface, "MAX_HEAD_DIM", None)
        if top is not None and max(case.d, case.d_v) > top:
            return f"head dim {max(case.d, case.d_v)} not supported by triton_decode (max {top})"
        return None

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None,
            v=None) -> DecodeOutput:
        mod, why = _import(self.module)
        if mod is None:
            raise Unsupported(why)
        with _stated_limits():
            out, lse = mod.decode_attention(
                q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
                causal=case.causal, window_size=tuple(case.window), softcap=case.softcap,
                **scale_kwargs(case, "softmax_scale"), return_lse=True, validate=False,
            )
        return DecodeOutput(out, lse)


class TritonFAFP8(SoftmaxAdapter):
    name = "triton_fa_fp8"
    compiles_per_shape = True
    description = ("in-repo Triton flash attention forward on e4m3 q/k/v with descales (kernels/flash_attn "
                   "flash_attn_fp8_func): fp32-accumulated QK^T, P in e4m3 for PV, out bf16/fp16, or e4m3 "
                   "with the scale 1 / v_descale (fp8_out cases); its FP8 backward flash_attn_fp8_bwd_func "
                   "(fp8_grad cases: dO and dS in e4m3 / e5m2, gradients in the case's dtype or in FP8)")
    module = "kernels.flash_attn"
    fp8 = fp8_only = True
    differentiable = False
    #: flash_attn_fp8_bwd_func (fp8_grad cases), where the kernel module has it (supports says why not)
    fp8_backward = True

    def supports(self, case, device):
        mod, reason = _module_and_reason(self, case, device)  # the base checks (fp8_only) included
        if reason:
            return reason
        if getattr(case, "fp8_out", False) and torch.float8_e4m3fn not in getattr(mod, "FP8_OUT_DTYPES", ()):
            return "this kernels.flash_attn writes bf16 / fp16 output only (no FP8 output with a scale)"
        if not hasattr(mod, "flash_attn_fp8_func"):
            return "this kernels.flash_attn has no flash_attn_fp8_func"
        form = {"fp8": True} if "fp8" in call_params(mod.unsupported_reason) else {}
        for dim in dict.fromkeys((case.d, case.d_v)):
            reason = mod.unsupported_reason(dim, torch.bfloat16, **form)
            if reason:
                return reason
        if getattr(case, "fp8_grad", ""):
            if not hasattr(mod, "flash_attn_fp8_bwd_func"):
                return "this kernels.flash_attn has no FP8 backward (flash_attn_fp8_bwd_func)"
            if reason := mod.fp8_bwd_unsupported_reason(case.d, case.d_v):
                return reason
        return None

    def run(self, case: SoftmaxCase, *, q, k, v, q_descale=None, k_descale=None, v_descale=None,
            cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        mod, why = _import(self.module)
        if mod is None:
            raise Unsupported(why)
        with _stated_limits():
            res = mod.flash_attn_fp8_func(
                q, k, v, q_descale, k_descale, v_descale, causal=case.causal, window_size=tuple(case.window),
                softcap=case.softcap, out_dtype=torch.float8_e4m3fn if case.fp8_out else case.torch_dtype,
                return_lse=case.return_lse or bool(case.fp8_grad), **scale_kwargs(case, "softmax_scale"))
        out, lse = res if case.return_lse or case.fp8_grad else (res, None)
        # FP8 output: in V's units, read back by the harness with v_descale (outside the timed call)
        return SoftmaxOutput(out, lse, out_descale=v_descale if case.fp8_out else None)

    def run_fp8_backward(self, case, forward, *, q, k, v, q_descale, k_descale, v_descale, grad_out, do_descale,
                         ds_descale, dq_descale, dk_descale, dv_descale):
        mod, why = _import(self.module)
        if mod is None:
            raise Unsupported(why)
        if forward.lse is None:
            raise Unsupported("the FP8 backward needs the forward's lse")
        fp8_grads = {"grad_dtype": grad_out.dtype, "dq_descale": dq_descale, "dk_descale": dk_descale,
                     "dv_descale": dv_descale} if case.fp8_out else {"grad_dtype": case.torch_dtype}
        with _stated_limits():
            return mod.flash_attn_fp8_bwd_func(
                grad_out, q, k, v, forward.out, forward.lse, q_descale, k_descale, v_descale, do_descale, ds_descale,
                causal=case.causal, window_size=tuple(case.window), out_descale=forward.out_descale,
                **scale_kwargs(case, "softmax_scale"), **fp8_grads)


register(TritonFA)
register(TritonFADeterministic)
register(TritonFAFP8)
register(TritonLAChunk)
register(TritonDecode)
