"""The adapter contract: how the harness runs one attention implementation on one case.

An adapter is a small object with a ``name``, a ``family`` ("softmax" or "linear"), a
``supports(case, device)`` that returns ``None`` or a reason in plain words, and ``run(...)``.

``run`` receives the harness's layout (flash-attn's (B, S, H, D) for softmax, FLA's (B, T, H, D)
for linear), converts to whatever the backend wants, and returns the outputs in the harness's
layout. Gradients are taken by the caller through torch autograd on the returned tensors, so
``run`` must stay differentiable when ``differentiable`` is True.
"""

from __future__ import annotations

import abc
import weakref
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from harness.cases import Case, LinearCase, SoftmaxCase

Family = Literal["softmax", "linear", "decode"]


class MadeOnce:
    """Values an adapter derives from input tensors (an FP8 descale's reciprocal, a backend's own scale
    layout), made once per set of tensors as a user holding them would, not inside every timed call; made
    again when one of them changes in place (its version counter) or is another tensor at a reused id.
    Weak: nothing is kept alive. At most ``limit`` entries (then all are dropped)."""

    def __init__(self, limit: int = 64):
        self._hits: dict[tuple[int, ...], tuple] = {}
        self._limit = limit

    def get(self, tensors: tuple[torch.Tensor, ...], make):
        """``make()``'s value for ``tensors``, made on the first call and after any of them changed."""
        key, versions = tuple(id(t) for t in tensors), tuple(t._version for t in tensors)
        hit = self._hits.get(key)
        if hit is None or any(r() is not t for r, t in zip(hit[0], tensors)) or hit[1] != versions:
            if len(self._hits) >= self._limit:
                self._hits.clear()
            hit = self._hits[key] = (tuple(weakref.ref(t) for t in tensors), versions, make())
        return hit[2]

    def clear(self) -> None:
        self._hits.clear()


class Unsupported(Exception):
    """Raised by ``run`` when the backend finds out late that it cannot run a case.

    The message is the reason, in words a user understands ("head dim 256 not supported").
    """


@dataclass
class SoftmaxOutput:
    """out (B, Sq, Hq, Dv) (varlen: (total_q, Hq, Dv)); lse (B, Hq, Sq) (varlen: (Hq, total_q))
    when the backend returns it, else None.

    ``out_descale``: set by a backend that writes its output in an FP8 format with a scale (the
    ``fp8_out`` cases): ``out`` is then the FP8 tensor as the kernel wrote it and ``out_descale``
    the float32 factor its real values are multiplied by ((B, Hk), one per kv head's group of query
    heads, or one element for the whole tensor). The harness reads the real values back
    (:func:`harness.fp8.read_back`) when it checks them, not inside the timed call: the kernel's
    work ends with the FP8 write, and a read-back kernel would be timed as the backend's."""

    out: torch.Tensor
    lse: torch.Tensor | None = None
    out_descale: torch.Tensor | None = None


@dataclass
class LinearOutput:
    """out (B, T, H, V); final_state (B, H, K, V)."""

    out: torch.Tensor
    final_state: torch.Tensor | None = None


@dataclass
class DecodeOutput:
    """out (B, Sq, Hq, Dv); lse (B, Hq, Sq) when the backend returns it, else None. The cache the
    backend received is written in place (the new tokens at ``cache_seqlens``)."""

    out: torch.Tensor
    lse: torch.Tensor | None = None


class Adapter(abc.ABC):
    """Base class of every backend adapter. Subclasses set ``name``, ``family``, ``description``."""

    name: ClassVar[str]
    family: ClassVar[Family]
    description: ClassVar[str] = ""
    #: False for inference-only backends: the harness then checks the forward only.
    differentiable: ClassVar[bool] = True
    #: True when ``run`` takes FP8 cases (q, k, v quantised, ``q_descale`` / ``k_descale`` /
    #: ``v_descale`` keywords, :mod:`harness.fp8`); every other backend refuses them.
    fp8: ClassVar[bool] = False
    #: True for FP8 kernels that have no bf16/fp16/fp32 path: they refuse every other case.
    fp8_only: ClassVar[bool] = False
    #: None when a call can be captured in a CUDA graph; else why not (it reads device values on
    #: the host). The timer then does not try (a failed capture can hold its memory pool).
    no_cuda_graph: ClassVar[str | None] = None
    #: True when the first call of a new shape compiles (Triton, inductor, CuTe DSL JIT): seconds,
    #: against milliseconds for a precompiled library. The main job starts these pairs first, so
    #: that its last minutes are not one worker compiling while the others idle.
    compiles_per_shape: ClassVar[bool] = False
    #: False when the backend documents a nondeterministic backward (atomics): determinism is
    #: then reported with its spread instead of failed (per case: :meth:`deterministic_backward_for`).
    deterministic_backward: ClassVar[bool] = True
    #: The lse this backend writes on query rows that see no key, where it is not the oracle's -inf
    #: (flash-attn: +inf). The harness maps it to -inf on those rows only, when it checks the output:
    #: not inside the timed call, where the few kernels of the mapping would be timed as the backend's.
    lse_empty_rows: ClassVar[float | None] = None
    #: True when the backend has an FP8 backward (:meth:`SoftmaxAdapter.run_fp8_backward`): the
    #: gradients of ``fp8_grad`` cases are then checked; FP8 gradients are not taken through autograd.
    fp8_backward: ClassVar[bool] = False

    def deterministic_backward_for(self, case: Case, device) -> bool:
        """Whether this backend's backward on ``case`` (on ``device``) is declared bitwise reproducible: the
        class's :attr:`deterministic_backward` unless a backend knows better per case."""
        return self.deterministic_backward

    def supports(self, case: Case, device: torch.device) -> str | None:
        """None when this adapter can run ``case`` on ``device``, else the reason in plain words."""
        if case.family != self.family:
            return f"{self.family}-attention backend; this is a {case.family} case"
        if getattr(case, "fp8", "") and not self.fp8:
            return (f"FP8 ({case.fp8}) inputs with descales: not a path of this backend "
                    "(an FP8 backend declares fp8 = True)")
        if self.fp8_only and not getattr(case, "fp8", ""):
            return "an FP8 kernel: it runs FP8 cases (e4m3 q, k, v with descales) only"
        return None

    @abc.abstractmethod
    def run(self, case: Case, **inputs: torch.Tensor):
        """Run the forward. Softmax: ``q, k, v`` (and ``cu_seqlens_q``, ``cu_seqlens_k`` for varlen
        cases) -> :class:`SoftmaxOutput`. Linear: ``q, k, v`` and optional ``g``, ``g_gamma``,
        ``initial_state`` -> :class:`LinearOutput`."""

    def __repr__(self) -> str:
        return f"<adapter {self.name} ({self.family})>"


class SoftmaxAdapter(Adapter):
    family: ClassVar[Family] = "softmax"

    @abc.abstractmethod
    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput: ...

    def run_fp8_backward(self, case: SoftmaxCase, forward: SoftmaxOutput, *, q, k, v, q_descale, k_descale,
                         v_descale, grad_out, do_descale, ds_descale, dq_descale, dk_descale,
                         dv_descale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The FP8 backward of an ``fp8_grad`` case (backends declaring ``fp8_backward``): ``forward``
        is this adapter's own :meth:`run` answer on the same inputs (its out, as written, and its lse),
        ``grad_out`` dO in the case's ``fp8_grad`` format with ``do_descale``; ``ds_descale`` the factor
        dS (the scaled scores' gradient) is quantised with, ``dq/dk/dv_descale`` those of FP8 gradients
        (:mod:`harness.fp8`). Returns (dq, dk, dv): in the case's dtype or float32, or for ``fp8_out``
        cases in the ``fp8_grad`` format, whose real values are the tensors times their descales."""
        raise Unsupported(f"{self.name} has no FP8 backward")


class LinearAdapter(Adapter):
    family: ClassVar[Family] = "linear"

    @abc.abstractmethod
    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput: ...


class DecodeAdapter(Adapter):
    """Attention over a KV cache (flash-attn's ``flash_attn_with_kvcache``); forward only."""

    family: ClassVar[Family] = "decode"
    differentiable: ClassVar[bool] = False

    @abc.abstractmethod
    def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None) -> DecodeOutput: ...


def fp8_backward_reason(adapter, case: Case) -> str | None:
    """None when the FP8 backward of FP8 case ``case`` can run on ``adapter``, else why not."""
    if not getattr(case, "fp8_grad", ""):
        return "a forward-only FP8 case (no fp8_grad)"
    if not getattr(adapter, "fp8_backward", False):
        return f"{getattr(adapter, 'name', 'this backend')} has no FP8 backward"
    return None


def has_backward(adapter, case: Case) -> bool:
    """Whether (adapter, case) has gradients to check and time: an FP8 case through the backend's FP8
    backward (:func:`fp8_backward_reason`), any other through autograd on a differentiable backend."""
    if getattr(case, "fp8", ""):
        return fp8_backward_reason(adapter, case) is None
    return bool(getattr(adapter, "differentiable", True))


def default_scale(case: Case) -> float:
    """The scale the case's scores are multiplied by: its ``scale``, else the contract's default
    head dim ** -0.5 (``case.effective_scale``)."""
    return case.effective_scale


def scale_kwargs(case: Case, name: str) -> dict:
    """The scale keyword a backend is called with: none when ``case.scale`` is None (the callee's
    default must then be the contract's d ** -0.5: a kernel with another default fails those cases),
    else ``{name: case.scale}``."""
    return {} if case.scale is None else {name: float(case.scale)}
