"""A user's callable as an adapter: ``--impl module:function``.

Softmax callables follow flash-attn's signature::

    fn(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0)
        -> out  or  (out, lse, ...)

with q (B, Sq, Hq, D), k, v (B, Sk, Hk, D/Dv), out (B, Sq, Hq, Dv), lse (B, Hq, Sq) natural log.
``softcap=`` is passed only when the case has one; ``softmax_scale=`` only when the case sets one
(``case.scale``): otherwise the keyword is omitted and the callable's default must be d ** -0.5.
Positional cases (``case.call == "positional"``, ids ``...-positional-<dtype>``) pass the same
values after q, k, v by position, in the order of the callable's signature (or of its declared
``"positional"`` list, for a wrapper over ``*args``); a callable with keyword-only parameters has
no positional form and the case is unsupported for it.
A callable whose signature has ``return_lse`` gets it: True, or False on the out-only cases
(``case.return_lse``, ids ending ``-nolse-<dtype>``), which must then return out alone and are
judged on out and the gradients (a kernel whose out-only path differs is caught). Variable-length cases go only to callables
that declare ``"varlen": True`` (see below); they are called as::

    fn(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
       window_size[, softcap])   with q (total_q, Hq, D), lse (Hq, total_q).

Linear callables follow FLA's::

    fn(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None, output_final_state=True)
        -> (o, final_state)

(``scale=`` likewise: omitted unless the case sets one; the default must be K ** -0.5.)

Decode callables (``family="decode"``) follow flash-attn's ``flash_attn_with_kvcache``::

    fn(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal,
       window_size, [softmax_scale], [softcap]) -> out  or  (out, lse, ...)

with q (B, Sq, Hq, D); k_cache, v_cache (B, capacity, Hk, D) or, paged, (num_blocks, page_size,
Hk, D) with block_table int32 (B, pages); cache_seqlens int32 (B,); k, v (B, Sq, Hk, D) the new
tokens, which the callable writes into the cache at ``cache_seqlens`` (in place) before attending.
The harness checks the written cache slot by slot.
Inputs arrive in the layout the case names (``case.layout``: contiguous, transposed views,
a storage offset, or views of one packed qkv tensor): a callable must honour strides and offsets.

Gradients are taken through torch autograd on the returned tensors. A callable raising
``NotImplementedError`` for a case declares it unsupported (the message is the reason).

Optional capability declaration, read by ``supports`` (every key optional, defaults shown)::

    fn.attn_capabilities = {
        "causal": True, "window": True, "softcap": True, "gqa": True,
        "varlen": False,            # the varlen calling convention above
        "backward": True,           # False: forward-only, gradients are not checked
        "dtypes": ["fp16", "bf16", "fp32", "fp64"],
        "devices": ["cpu", "cuda"],
        "deterministic_backward": True,   # False: a documented nondeterministic backward (atomics)
                                          # is reported with its spread, not failed
        "nondifferentiable_inputs": [],   # inputs treated as constants, e.g. ["g_gamma"] (FLA)
        "paged": True,              # decode: a paged cache (block_table)
        "append": True,             # decode: new k, v written into the cache by the callable
        "positional": None,         # softmax: the parameter names a positional call passes after
                                    # q, k, v, in order (None: read from the signature; a wrapper
                                    # over *args declares e.g. flash-attn 2's ["dropout_p",
                                    # "softmax_scale", "causal", "window_size", "softcap"])
        "fp8": False,               # softmax: FP8 cases (q, k, v in e4m3 with q_descale, k_descale,
                                    # v_descale (B, Hk) float32 keywords, flash-attn 3's FP8 call)
        "lse_empty_rows": None,     # softmax / decode: the lse written on rows that see no key when
                                    # it is not -inf (flash-attn: float("inf")); the harness maps it
                                    # to -inf on those rows only, after the call (not timed)
        "fp8_backward": None,       # softmax FP8: a callable for the FP8 backward of fp8_grad cases,
                                    # bwd(q, k, v, out, lse, grad_out, *, causal, window_size,
                                    # [softmax_scale,] q_descale, k_descale, v_descale, do_descale,
                                    # ds_descale) -> (dq, dk, dv) in the case's dtype or float32, on
                                    # this callable's own out / lse; dO in the case's gradient format
                                    # (harness.fp8: ds_descale is dS's, the gradient of Q K^T)
    }
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

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
from harness.adapters.optional import call_params, call_positionally, positional_order
from harness.cases import DecodeCase, LinearCase, SoftmaxCase

CAPABILITY_ATTR = "attn_capabilities"
# Defaults when a callable declares nothing: everything but varlen (whose calling convention a
# callable must opt into).
DEFAULT_CAPABILITIES: dict[str, Any] = {
    "causal": True,
    "window": True,
    "softcap": True,
    "gqa": True,
    "varlen": False,
    "backward": True,
    "dtypes": None,  # None: any
    "devices": None,
    "deterministic_backward": True,
    "nondifferentiable_inputs": (),
    "paged": True,
    "append": True,
    "fp8": False,
    "positional": None,  # None: the signature's order; a list of names for a wrapper over *args
    "lse_empty_rows": None,  # None: -inf, the contract's; a float: what the callable writes instead
    "fp8_backward": None,  # None: no FP8 backward; a callable: the FP8 backward of fp8_grad cases
}
_FEATURE_WORDS = {
    "causal": "causal",
    "window": "window",
    "softcap": "softcap",
    "gqa": "GQA/MQA",
    "varlen": "varlen",
    "paged": "paged-cache",
    "append": "cache-append",
    "fp8": "FP8 (e4m3 with descales)",
}


def load_callable(spec: str):
    """``"module:function"`` (the function may be a dotted attribute path) -> the callable.

    The module is imported with the current directory on ``sys.path``, so a file ``mykernel.py``
    next to where the harness runs is found as ``mykernel:attention``. Errors are ValueErrors
    saying what is wrong.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"--impl: expected MODULE:CALLABLE, got {spec!r}")
    mod_name, attr_path = (part.strip() for part in spec.split(":"))
    if not mod_name or not attr_path:
        raise ValueError(f"--impl: expected MODULE:CALLABLE, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj = importlib.import_module(mod_name)
    except Exception as e:
        raise ValueError(f"cannot import module {mod_name}: {type(e).__name__}: {e}") from e
    owner = mod_name
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"module {mod_name} has no attribute {attr_path}"
                if owner == mod_name
                else f"{owner} has no attribute {part}"
            )
        obj = getattr(obj, part)
        owner = f"{owner}.{part}"
    if not callable(obj):
        raise ValueError(f"{spec} is not callable (it is a {type(obj).__name__})")
    return obj


def capabilities(fn) -> dict[str, Any]:
    """The callable's declared capabilities merged over :data:`DEFAULT_CAPABILITIES`."""
    declared = getattr(fn, CAPABILITY_ATTR, None) or {}
    if not isinstance(declared, dict):
        raise ValueError(f"{CAPABILITY_ATTR}: expected a dict, got {type(declared).__name__}")
    unknown = set(declared) - set(DEFAULT_CAPABILITIES)
    if unknown:
        raise ValueError(
            f"{CAPABILITY_ATTR}: unknown keys {sorted(unknown)}; known: {sorted(DEFAULT_CAPABILITIES)}"
        )
    empty = declared.get("lse_empty_rows")
    if empty is not None and (isinstance(empty, bool) or not isinstance(empty, (int, float))):
        raise ValueError(f"{CAPABILITY_ATTR}: lse_empty_rows: a float (e.g. float('inf')) or None, got {empty!r}")
    return {**DEFAULT_CAPABILITIES, **declared}


def _attention_needs(case) -> dict[str, bool]:
    """The declarable features a softmax or decode case uses (mask, softcap, GQA)."""
    return {"causal": case.causal, "window": case.has_window, "softcap": bool(case.softcap),
            "gqa": case.heads_q != case.heads_k}


def _common_reason(caps, case, device, needs: dict[str, bool] | None = None) -> str | None:
    """Why the declarations rule ``case`` out: a feature it ``needs`` that is declared absent, its
    dtype or the device; else None."""
    for feature, needed in (needs or {}).items():
        if needed and not caps[feature]:
            return f"declares no {_FEATURE_WORDS[feature]} support"
    dtypes = caps["dtypes"]
    if dtypes is not None and case.dtype not in dtypes:
        return f"declares dtypes {', '.join(dtypes)} only, not {case.dtype}"
    devices = caps["devices"]
    dev = torch.device(device).type
    if devices is not None and dev not in devices:
        return f"declares devices {', '.join(devices)} only, not {dev}"
    return None


def _declared_unsupported(e: NotImplementedError) -> Unsupported:
    return Unsupported(
        f"declared unsupported by the implementation: {str(e).strip() or 'NotImplementedError'}"
    )


def _softmax_result(res) -> SoftmaxOutput:
    if isinstance(res, torch.Tensor):
        return SoftmaxOutput(res, None)
    if isinstance(res, (tuple, list)) and res and isinstance(res[0], torch.Tensor):
        lse = res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None
        return SoftmaxOutput(res[0], lse)
    raise TypeError(
        f"user callable: expected a Tensor (out) or a tuple (out, lse, ...), got {type(res).__name__}"
    )


class _FromCallable:
    """What both callable adapters read off the callable: its name and declared capabilities."""

    name = "user"  # replaced per instance

    def __init__(self, fn, name: str):
        self.fn = fn
        self.name = name
        self.caps = capabilities(fn)
        empty = self.caps["lse_empty_rows"]
        self.lse_empty_rows = None if empty is None else float(empty)
        self.differentiable = bool(self.caps["backward"])
        self.deterministic_backward = bool(self.caps["deterministic_backward"])
        self.nondifferentiable_inputs = tuple(self.caps["nondifferentiable_inputs"])
        self.fp8 = bool(self.caps["fp8"])
        # a callable here; True where only the declaration travelled (the acceptance check's parent)
        self.fp8_backward = bool(self.caps["fp8_backward"])
        self.description = f"user callable {name}"


class CallableSoftmaxAdapter(_FromCallable, SoftmaxAdapter):
    """Adapter around a flash-attn-style callable (see the module docstring)."""

    def supports(self, case, device):
        if case.family == "softmax" and case.fp8 and not self.caps["fp8"]:
            return "declares no FP8 (e4m3 with descales) support"
        if getattr(case, "fp8_out", False):
            return ("an FP8-output case (O written in e4m3 with its scale): the callable contract is flash-attn "
                    "3's FP8 call, bf16 / fp16 output")
        reason = super().supports(case, device)
        if reason:
            return reason
        why = _common_reason(self.caps, case, device, _attention_needs(case) | {"varlen": case.is_varlen})
        if why is None and case.call == "positional":
            order, src = positional_order(self.fn, self.caps["positional"])
            why = None if order else f"no positional form: {src}"
        return why

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, q_descale=None,
            k_descale=None, v_descale=None) -> SoftmaxOutput:
        kw: dict[str, Any] = dict(
            causal=case.causal, window_size=tuple(case.window), **scale_kwargs(case, "softmax_scale")
        )
        if case.fp8:
            kw.update(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        if case.softcap:
            kw["softcap"] = case.softcap
        if "return_lse" in call_params(self.fn):  # flash-attn-4's keyword: off on the out-only cases
            kw["return_lse"] = case.return_lse
        if case.is_varlen:
            if not self.caps["varlen"]:
                raise Unsupported("declares no varlen support")
            kw.update(
                cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k,
                max_seqlen_q=case.seqlen_q,
                max_seqlen_k=case.seqlen_k,
            )
        try:
            if case.call == "positional":
                order, src = positional_order(self.fn, self.caps["positional"])
                if order is None:
                    raise Unsupported(f"no positional form: {src}")
                res = call_positionally(self.fn, (q, k, v), kw, order)
            else:
                res = self.fn(q, k, v, **kw)
        except NotImplementedError as e:
            raise _declared_unsupported(e) from None
        if kw.get("return_lse") is False and not isinstance(res, torch.Tensor):
            raise TypeError(f"return_lse=False: expected the output tensor alone, got a {type(res).__name__} "
                            "(a caller unpacking one tensor would break)")
        return _softmax_result(res)

    def run_fp8_backward(self, case, forward, *, q, k, v, q_descale, k_descale, v_descale, grad_out, do_descale,
                         ds_descale, dq_descale, dk_descale, dv_descale):
        bwd = self.caps["fp8_backward"]
        if not callable(bwd):
            raise Unsupported("declares no FP8 backward (attn_capabilities['fp8_backward'])")
        if forward.lse is None:
            raise Unsupported("the FP8 backward needs the forward's lse: this call returned none")
        kw: dict[str, Any] = dict(causal=case.causal, window_size=tuple(case.window),
                                  **scale_kwargs(case, "softmax_scale"), q_descale=q_descale, k_descale=k_descale,
                                  v_descale=v_descale, do_descale=do_descale, ds_descale=ds_descale)
        try:
            res = bwd(q, k, v, forward.out, forward.lse, grad_out, **kw)
        except NotImplementedError as e:
            raise _declared_unsupported(e) from None
        if not (isinstance(res, (tuple, list)) and len(res) == 3):
            raise TypeError(f"fp8_backward: expected (dq, dk, dv), got {type(res).__name__}")
        return tuple(res)


class CallableLinearAdapter(_FromCallable, LinearAdapter):
    """Adapter around an FLA-style callable (see the module docstring)."""

    def supports(self, case, device):
        return super().supports(case, device) or _common_reason(self.caps, case, device)

    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput:
        try:
            res = self.fn(
                q,
                k,
                v,
                g=g,
                g_gamma=g_gamma,
                **scale_kwargs(case, "scale"),
                initial_state=initial_state,
                output_final_state=True,
            )
        except NotImplementedError as e:
            raise _declared_unsupported(e) from None
        if not (isinstance(res, (tuple, list)) and len(res) >= 2 and isinstance(res[0], torch.Tensor)):
            raise TypeError(f"user callable: expected (o, final_state), got {type(res).__name__}")
        return LinearOutput(res[0], res[1])


class CallableDecodeAdapter(_FromCallable, DecodeAdapter):
    """Adapter around a ``flash_attn_with_kvcache``-style callable (see the module docstring).
    Forward only, whatever ``backward`` declares: decode has no gradients."""

    def __init__(self, fn, name: str):
        super().__init__(fn, name)
        self.differentiable = False

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        needs = _attention_needs(case) | {"paged": case.paged, "append": case.append}
        return _common_reason(self.caps, case, device, needs)

    def run(self, case: DecodeCase, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None,
            v=None) -> DecodeOutput:
        kw: dict[str, Any] = dict(cache_seqlens=cache_seqlens, block_table=block_table, causal=case.causal,
                                  window_size=tuple(case.window), **scale_kwargs(case, "softmax_scale"))
        if case.softcap:
            kw["softcap"] = case.softcap
        try:
            res = self.fn(q, k_cache, v_cache, k, v, **kw)
        except NotImplementedError as e:
            raise _declared_unsupported(e) from None
        out = _softmax_result(res)
        return DecodeOutput(out.out, out.lse)


FAMILIES = {"softmax": CallableSoftmaxAdapter, "linear": CallableLinearAdapter, "decode": CallableDecodeAdapter}


def make_callable_adapter(fn, family: str = "softmax", name: str | None = None) -> Adapter:
    """Wrap ``fn`` in an adapter of ``family`` ("softmax", "linear" or "decode") registered as ``name``."""
    name = name or getattr(fn, "__qualname__", None) or repr(fn)
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(map(repr, FAMILIES))}, got {family!r}")
    return FAMILIES[family](fn, name)
