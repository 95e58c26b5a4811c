"""Cases: one frozen dataclass per attention family, a readable id, and seeded inputs.

A case's id is its test id, its report row and the key of its golden file, so it must be stable
and readable: ``B2-H8/2-S1024x1024-D64-causal-bf16``.

Inputs are generated on the CPU with a ``torch.Generator`` seeded from ``sha256(case.id, seed)``,
in float32, then rounded to the case's dtype and moved: the same tensors on every machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass
from typing import Literal

import torch

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_of(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {name!r}") from None


def _seed_from(*parts: object) -> int:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _num(x: float) -> str:
    return f"{x:g}"


#: How the inputs are laid out in memory when the candidate receives them (same values every time):
#: "contiguous"; "transposed" (each tensor a transposed view of a (B, H, S, D) buffer, or
#: (H, total, D) for varlen); "offset" (each tensor starts one element into its buffer: its data
#: pointer is off every 16-byte boundary for 16-bit dtypes); "qkvpacked" (q, k, v are views
#: ``packed[:, :, i]`` of one (B, S, 3, H, D) tensor, flash-attn's qkvpacked layout, passed to the
#: plain entry point; softmax MHA with d == d_v and Sq == Sk only).
LAYOUTS = ("contiguous", "transposed", "offset", "qkvpacked")
#: The inputs an adapter's ``run`` receives, by name, for every family (grad_out and
#: grad_final_state are the loss's, not the candidate's). Decode caches are written in place by
#: each call (the same slots with the same values, so repeated calls see identical inputs).
RUN_INPUT_NAMES = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "q_descale", "k_descale", "v_descale",
                   "g", "g_gamma", "initial_state", "k_cache", "v_cache", "cache_seqlens", "block_table")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def _check_scale(scale) -> None:
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected None (the callee's default) or a finite positive number, got {scale!r}")


def apply_layout(case, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` (the inputs a candidate receives) re-laid out as ``case.layout`` says: the same
    values (and the same autograd graph: gradients reach the given tensors), other strides or
    storage offsets. Integer tensors (cu_seqlens) and 1-D ones stay as they are."""
    layout = getattr(case, "layout", "contiguous")
    if layout == "contiguous":
        return dict(tensors)
    if layout == "qkvpacked":
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        packed = torch.stack([q, k, v], dim=2)  # (B, S, 3, H, D)
        return {**tensors, "q": packed[:, :, 0], "k": packed[:, :, 1], "v": packed[:, :, 2]}
    out = {}
    for name, t in tensors.items():
        if not t.is_floating_point() or t.dim() < 2:
            out[name] = t
        elif layout == "transposed":
            # a buffer with the first two (varlen: the two leading) dims swapped, viewed back
            a, b = (1, 2) if t.dim() == 4 else (0, 1)
            out[name] = t.transpose(a, b).contiguous().transpose(a, b)
        else:  # offset
            flat = torch.cat([t.new_zeros(1), t.reshape(-1)])
            out[name] = flat[1:].view(t.shape)
    return out


# --------------------------------------------------------------------------------------------
# Softmax attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxCase:
    """One softmax-attention problem in flash-attn's layout (batch, seqlen, heads, dim).

    ``varlen`` is a tuple of (seqlen_q, seqlen_k) pairs, one per sequence; when set, the case is a
    packed variable-length batch (``batch`` is then ``len(varlen)`` and ``seqlen_q/k`` the maxima).
    """

    batch: int
    heads_q: int
    heads_k: int
    seqlen_q: int
    seqlen_k: int
    d: int
    d_v: int | None = None
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dtype: str = "fp32"
    varlen: tuple[tuple[int, int], ...] | None = None
    #: None: the ``softmax_scale`` keyword is omitted and the callee's default (d ** -0.5, the
    #: contract's) must apply; a number: passed explicitly.
    scale: float | None = None
    #: memory layout of the inputs as the candidate receives them (:data:`LAYOUTS`)
    layout: str = "contiguous"
    #: "" or an FP8 format ("e4m3"): q, k, v are then passed quantised, with descales
    #: (:mod:`harness.fp8`), and ``dtype`` is the output's dtype (fp16 / bf16); forward only unless ``fp8_grad``
    fp8: str = ""
    #: FP8 cases: one quantisation factor per (sequence, kv head) instead of one per tensor, with
    #: heads drawn at different magnitudes (a kernel must index its descales, not read one)
    fp8_per_head: bool = False
    #: FP8 cases: the kernel writes the output in the FP8 format with an output scale (cuDNN's FP8
    #: forward on Hopper) and the harness compares it dequantised, in ``dtype``; the reference rounds
    #: its output the same way (harness.fp8.round_output). Id ``...-o8-...``.
    fp8_out: bool = False
    #: FP8 cases: "" (forward only) or the FP8 format of the backward ("e4m3", "e5m2"): gradients are
    #: checked too, dO arrives in that format with its descale, and the kernel quantises dS (and, with
    #: ``fp8_out``, writes dQ / dK / dV) in it with the descales the case gives (harness.fp8's
    #: GRAD_DESCALE_NAMES). Id ``...-grad_e5m2-...``.
    fp8_grad: str = ""
    #: False: the callee is asked for the output alone (``return_lse=False``, or flash-attn 2's
    #: ``return_attn_probs=False``, where its signature has the keyword) and no lse is compared, so
    #: a kernel's out-only path is checked too; True: lse is asked for where the callee can return it
    return_lse: bool = True
    #: "keyword" (the harness's keywords by name) or "positional" (after q, k, v, the callee's
    #: parameters by position, in the order its signature or its declared ``"positional"`` gives:
    #: flash-attn 2 allows ``flash_attn_func(q, k, v, 0.0, scale, True)``)
    call: str = "keyword"

    family: Literal["softmax"] = dataclasses.field(default="softmax", init=False, repr=False)

    def __post_init__(self):
        if self.varlen is not None:
            lens = tuple((int(a), int(b)) for a, b in self.varlen)
            object.__setattr__(self, "varlen", lens)
            object.__setattr__(self, "batch", len(lens))
            object.__setattr__(self, "seqlen_q", max((a for a, _ in lens), default=0))
            object.__setattr__(self, "seqlen_k", max((b for _, b in lens), default=0))
        object.__setattr__(self, "window", tuple(int(w) for w in self.window))
        if self.d_v is None:
            object.__setattr__(self, "d_v", self.d)
        dtype_of(self.dtype)
        if self.heads_k <= 0 or self.heads_q % self.heads_k:
            raise ValueError(
                f"heads_k: heads_q ({self.heads_q}) must be a positive multiple of heads_k ({self.heads_k})"
            )
        if min(self.batch, self.d, self.d_v) <= 0 or min(self.seqlen_q, self.seqlen_k) < 0:
            raise ValueError(f"case sizes must be positive: {self}")
        _check_scale(self.scale)
        _check_layout(self.layout)
        if self.layout == "qkvpacked" and (
            self.varlen is not None or self.heads_q != self.heads_k or self.d != self.d_v
            or self.seqlen_q != self.seqlen_k
        ):
            raise ValueError("layout: 'qkvpacked' needs MHA (heads_q == heads_k), d == d_v, Sq == Sk and no varlen")
        if self.fp8:
            from harness import fp8

            fp8.fmt(self.fp8)
            if self.dtype not in ("fp16", "bf16"):
                raise ValueError(f"fp8: the output dtype of an FP8 case is fp16 or bf16, got {self.dtype}")
            if self.fp8 not in fp8.INPUT_FORMATS:
                raise ValueError(f"fp8: q, k, v come in {', '.join(fp8.INPUT_FORMATS)}, got {self.fp8!r}")
            if self.varlen is not None or self.layout != "contiguous":
                raise ValueError("fp8: FP8 cases are dense and contiguous (varlen and layouts are not modelled)")
            if self.fp8_grad:
                fp8.fmt(self.fp8_grad)
                if self.softcap:
                    raise ValueError("fp8_grad: the FP8 backward is modelled without softcap")
        elif self.fp8_per_head or self.fp8_out or self.fp8_grad:
            raise ValueError("fp8_per_head, fp8_out, fp8_grad: knobs of FP8 cases (set fp8)")
        if self.call not in ("keyword", "positional"):
            raise ValueError(f"call: expected 'keyword' or 'positional', got {self.call!r}")
        if self.call == "positional" and (self.is_varlen or self.fp8):
            raise ValueError("call: the positional form is modelled for the dense bf16/fp16/fp32 entry point only")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def is_varlen(self) -> bool:
        return self.varlen is not None

    @property
    def has_window(self) -> bool:
        return self.window != (-1, -1)

    @property
    def id(self) -> str:
        heads = f"H{self.heads_q}" if self.heads_q == self.heads_k else f"H{self.heads_q}/{self.heads_k}"
        if self.varlen is not None:
            seq = "varlen[" + ",".join(f"{a}x{b}" for a, b in self.varlen) + "]"
            parts = [f"B{self.batch}", heads, seq]
        else:
            parts = [f"B{self.batch}", heads, f"S{self.seqlen_q}x{self.seqlen_k}"]
        parts.append(f"D{self.d}" if self.d_v == self.d else f"D{self.d}v{self.d_v}")
        if self.causal:
            parts.append("causal")
        if self.has_window:
            parts.append(f"win{self.window[0]}x{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{_num(self.softcap)}")
        if self.scale is not None:
            parts.append(f"scale{_num(self.scale)}")
        if self.layout != "contiguous":
            parts.append(self.layout)
        if self.fp8:
            parts.append(self.fp8)
        if self.fp8_per_head:
            parts.append("perhead")
        if self.fp8_out:
            parts.append("o8")
        if self.fp8_grad:
            parts.append(f"grad_{self.fp8_grad}")
        if not self.return_lse:
            parts.append("nolse")
        if self.call != "keyword":
            parts.append(self.call)
        parts.append(self.dtype)
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id

    @property
    def factor_dtype(self) -> str:
        """The tolerance table's row: the FP8 format when the inputs are FP8, else ``dtype``."""
        return self.fp8 or self.dtype

    def factor_dtype_of(self, name: str) -> str:
        """The tolerance row of tensor ``name``: the backward's FP8 format for an ``fp8_grad`` case's
        gradients, else :attr:`factor_dtype`."""
        return self.fp8_grad if self.fp8_grad and name in ("dq", "dk", "dv") else self.factor_dtype

    def with_dtype(self, dtype: str) -> SoftmaxCase:
        return dataclasses.replace(self, dtype=dtype)

    @property
    def effective_scale(self) -> float:
        """The scale the scores are multiplied by: ``scale``, or the contract's default d ** -0.5."""
        return self.d**-0.5 if self.scale is None else float(self.scale)

    @property
    def oracle_kwargs(self) -> dict:
        """Keyword arguments of ``harness.oracle.softmax_attention`` for this case."""
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap,
                    softmax_scale=self.scale)

    def visible_pairs(self) -> int:
        """Exact number of (query, key) pairs a query sees, summed over the batch (one head).

        Used by the FLOP model: causal, window and seqlen_q != seqlen_k are counted exactly.
        """
        lens = self.varlen if self.varlen is not None else [(self.seqlen_q, self.seqlen_k)] * self.batch
        return sum(visible_pairs(sq, sk, causal=self.causal, window=self.window) for sq, sk in lens)


def visible_range(i: int, seqlen_q: int, seqlen_k: int, *, causal: bool, window: tuple[int, int]):
    """Keys [lo, hi) visible to query i under flash-attn's bottom-right aligned convention."""
    left, right = window
    if causal:
        right = 0
    offset = seqlen_k - seqlen_q
    lo = 0 if left < 0 else max(0, i + offset - left)
    hi = seqlen_k if right < 0 else min(seqlen_k, i + offset + right + 1)
    return lo, max(lo, hi)


def visible_pairs(seqlen_q: int, seqlen_k: int, *, causal: bool, window: tuple[int, int]) -> int:
    """Number of visible (query, key) pairs; closed form per row, summed in O(seqlen_q)."""
    if not causal and tuple(window) == (-1, -1):
        return seqlen_q * seqlen_k
    total = 0
    for i in range(seqlen_q):
        lo, hi = visible_range(i, seqlen_q, seqlen_k, causal=causal, window=window)
        total += hi - lo
    return total


class _TensorFields:
    """``tensors()`` and ``to()`` of an inputs dataclass whose fields are all tensors (None: absent)."""

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def to(self, device):
        return type(self)(**{k: v.to(device) for k, v in self.tensors().items()})


@dataclass
class SoftmaxInputs(_TensorFields):
    """Seeded inputs. Dense: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv), grad_out like out.
    Varlen: packed (total, H, D) tensors plus int32 ``cu_seqlens_q`` / ``cu_seqlens_k`` (B + 1,)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    #: FP8 cases: (batch, heads_k) float32 factors, real value = fp8 value x descale (harness.fp8)
    q_descale: torch.Tensor | None = None
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None
    #: FP8 cases with ``fp8_grad``: grad_out is then in that format, and these are its descale and the
    #: descales of dS, dQ, dK, dV (harness.fp8.GRAD_DESCALE_NAMES), each (batch, heads_k) float32
    do_descale: torch.Tensor | None = None
    ds_descale: torch.Tensor | None = None
    dq_descale: torch.Tensor | None = None
    dk_descale: torch.Tensor | None = None
    dv_descale: torch.Tensor | None = None


def make_softmax_inputs(case: SoftmaxCase, seed: int = 0, device="cpu") -> SoftmaxInputs:
    """Seeded q, k, v, grad_out for ``case``: standard normal, rounded to the case's dtype."""
    gen = torch.Generator(device="cpu").manual_seed(_seed_from(case.id, seed))
    dt = case.torch_dtype

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dt)

    if case.varlen is not None:
        tq = sum(a for a, _ in case.varlen)
        tk = sum(b for _, b in case.varlen)
        q, k = randn(tq, case.heads_q, case.d), randn(tk, case.heads_k, case.d)
        v, do = randn(tk, case.heads_k, case.d_v), randn(tq, case.heads_q, case.d_v)
        cu_q = torch.tensor([0] + [a for a, _ in case.varlen], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu_k = torch.tensor([0] + [b for _, b in case.varlen], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return SoftmaxInputs(q, k, v, do, cu_q, cu_k).to(device)
    b, sq, sk = case.batch, case.seqlen_q, case.seqlen_k
    if case.fp8:  # drawn in fp32, then quantised per tensor or per (sequence, kv head) (harness.fp8)
        from harness import fp8

        raw = [torch.randn(*shape, generator=gen, dtype=torch.float32) for shape in (
            (b, sq, case.heads_q, case.d), (b, sk, case.heads_k, case.d), (b, sk, case.heads_k, case.d_v))]
        if case.fp8_per_head:  # heads at magnitudes 1/4..4: one factor for all would be visibly wrong
            mag = torch.exp2(torch.rand(3, b, case.heads_k, generator=gen) * 4 - 2)
            raw = [x * m.repeat_interleave(x.shape[2] // case.heads_k, dim=1)[:, None, :, None]
                   for x, m in zip(raw, mag)]
        do = randn(b, sq, case.heads_q, case.d_v)
        (q, qs), (k, ks), (v, vs) = (fp8.quantize(x, case.fp8, case.heads_k, per_head=case.fp8_per_head)
                                     for x in raw)
        inputs = SoftmaxInputs(q, k, v, do, q_descale=qs, k_descale=ks, v_descale=vs).to(device)
        if case.fp8_grad:  # dO in the backward's format (one factor), then the descales of what it makes
            small = do.float().to(device) * fp8.GRAD_OUT_MAGNITUDE
            inputs.grad_out, inputs.do_descale = fp8.quantize(small, case.fp8_grad, case.heads_k)
            fp8.grad_descales(case, inputs)
        return inputs
    q = randn(b, sq, case.heads_q, case.d)
    k = randn(b, sk, case.heads_k, case.d)
    v = randn(b, sk, case.heads_k, case.d_v)
    do = randn(b, sq, case.heads_q, case.d_v)
    return SoftmaxInputs(q, k, v, do).to(device)


# --------------------------------------------------------------------------------------------
# Linear attention
# --------------------------------------------------------------------------------------------

Gate = Literal["none", "g", "g_gamma"]


@dataclass(frozen=True)
class LinearCase:
    """One (gated) linear-attention problem in FLA's layout: q, k (B, T, H, K), v (B, T, H, V).

    ``gate``: "none" (plain causal linear attention), "g" (per-step log-decay (B, T, H)) or
    "g_gamma" (constant per-head log-decay (H,)). ``gate_n`` sets the strength: the log-decay is
    ``logsigmoid(x) / gate_n`` with x standard normal, so n = 0.1 is strong and n = 10 weak.
    """

    batch: int
    heads: int
    seqlen: int
    d_k: int
    d_v: int | None = None
    gate: Gate = "g"
    gate_n: float = 1.0
    initial_state: bool = True
    grad_final_state: bool = True
    dtype: str = "fp32"
    #: None: the ``scale`` keyword is omitted (the callee's default d_k ** -0.5); a number: passed
    scale: float | None = None
    #: memory layout of the inputs as the candidate receives them ("contiguous", "transposed", "offset")
    layout: str = "contiguous"

    family: Literal["linear"] = dataclasses.field(default="linear", init=False, repr=False)

    def __post_init__(self):
        if self.d_v is None:
            object.__setattr__(self, "d_v", self.d_k)
        dtype_of(self.dtype)
        if self.gate not in ("none", "g", "g_gamma"):
            raise ValueError(f"gate: expected 'none', 'g' or 'g_gamma', got {self.gate!r}")
        if min(self.batch, self.heads, self.seqlen, self.d_k, self.d_v) <= 0 or self.gate_n <= 0:
            raise ValueError(f"case sizes must be positive: {self}")
        if self.gate == "none":  # a decay strength without a decay: one case, one id
            object.__setattr__(self, "gate_n", 1.0)
        _check_scale(self.scale)
        _check_layout(self.layout)
        if self.layout == "qkvpacked":
            raise ValueError("layout: 'qkvpacked' is a softmax-attention layout")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def id(self) -> str:
        parts = [f"B{self.batch}", f"H{self.heads}", f"T{self.seqlen}", f"K{self.d_k}V{self.d_v}"]
        parts.append("nogate" if self.gate == "none" else f"{self.gate}(n={_num(self.gate_n)})")
        if self.initial_state:
            parts.append("h0")
        if self.grad_final_state:
            parts.append("dhT")
        if self.scale is not None:
            parts.append(f"scale{_num(self.scale)}")
        if self.layout != "contiguous":
            parts.append(self.layout)
        parts.append(self.dtype)
        return "-".join(parts)

    @property
    def effective_scale(self) -> float:
        """``scale``, or the contract's default d_k ** -0.5."""
        return self.d_k**-0.5 if self.scale is None else float(self.scale)

    @property
    def oracle_kwargs(self) -> dict:
        """Keyword arguments of ``harness.oracle.linear_attention`` for this case (besides the inputs)."""
        return dict(scale=self.scale)

    def __str__(self) -> str:
        return self.id

    def with_dtype(self, dtype: str) -> LinearCase:
        return dataclasses.replace(self, dtype=dtype)


@dataclass
class LinearInputs(_TensorFields):
    """Seeded inputs: q, k (B, T, H, K), v and grad_out (B, T, H, V); g (B, T, H) fp32 or g_gamma
    (H,) fp32 (log-decays stay fp32 as in FLA); initial_state and grad_final_state (B, H, K, V) fp32."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    g: torch.Tensor | None = None
    g_gamma: torch.Tensor | None = None
    initial_state: torch.Tensor | None = None
    grad_final_state: torch.Tensor | None = None


def make_linear_inputs(case: LinearCase, seed: int = 0, device="cpu") -> LinearInputs:
    """Seeded inputs for ``case`` (see :class:`LinearInputs`)."""
    gen = torch.Generator(device="cpu").manual_seed(_seed_from(case.id, seed))
    dt = case.torch_dtype
    B, T, H, K, V = case.batch, case.seqlen, case.heads, case.d_k, case.d_v

    def randn(*shape, dtype=dt):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    q, k, v, do = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V), randn(B, T, H, V)
    g = g_gamma = None
    if case.gate == "g":
        g = torch.nn.functional.logsigmoid(randn(B, T, H, dtype=torch.float32)) / case.gate_n
    elif case.gate == "g_gamma":
        # A constant per-head decay: logsigmoid of a value near 3 (decay ~0.95) scaled by 1/n.
        g_gamma = torch.nn.functional.logsigmoid(3.0 + randn(H, dtype=torch.float32)) / case.gate_n
    h0 = randn(B, H, K, V, dtype=torch.float32) if case.initial_state else None
    dht = randn(B, H, K, V, dtype=torch.float32) if case.grad_final_state else None
    return LinearInputs(q, k, v, do, g, g_gamma, h0, dht).to(device)


# --------------------------------------------------------------------------------------------
# Decode: attention over a KV cache (flash-attn's flash_attn_with_kvcache convention)
# --------------------------------------------------------------------------------------------


#: Pages a paged cache holds beyond what the batch needs (unused pages in the pool, as in serving).
DECODE_SPARE_PAGES = 3


@dataclass(frozen=True)
class DecodeCase:
    """One decode step over a KV cache: ``seqlen_q`` new query tokens (1 for decoding, 2-8 for
    speculative decoding) per sequence attend to that sequence's cache.

    ``cache_len``: the longest cache; with ``ragged`` the sequences' lengths differ
    (:attr:`cache_seqlens`: the first is ``cache_len``, the second 0, the third exactly one page,
    the rest uniform in 0..cache_len from a generator seeded by the batch and ``cache_len``), else
    every one is ``cache_len``.
    ``page_size``: 0 for a contiguous cache ``[B, Smax, Hk, D]``, else a paged cache
    ``[num_blocks, page_size, Hk, D]`` addressed through a shuffled ``block_table [B, max_pages]``.
    ``append``: new k, v ``[B, seqlen_q, Hk, D]`` are written into the cache at ``cache_seqlens``
    before attending (in place). Masks are bottom-right aligned, so the new tokens see the whole
    cache: query i of a sequence of L keys (cache + new) sees key j iff j <= L - seqlen_q + i.
    """

    batch: int
    heads_q: int
    heads_k: int
    seqlen_q: int
    cache_len: int
    d: int
    d_v: int | None = None
    page_size: int = 0
    ragged: bool = True
    append: bool = True
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dtype: str = "fp32"
    scale: float | None = None

    family: Literal["decode"] = dataclasses.field(default="decode", init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "window", tuple(int(w) for w in self.window))
        if self.d_v is None:
            object.__setattr__(self, "d_v", self.d)
        dtype_of(self.dtype)
        if self.heads_k <= 0 or self.heads_q % self.heads_k:
            raise ValueError(f"heads_k: heads_q ({self.heads_q}) must be a positive multiple of heads_k ({self.heads_k})")
        if min(self.batch, self.seqlen_q, self.d, self.d_v) <= 0 or self.cache_len < 0:
            raise ValueError(f"case sizes must be positive: {self}")
        if self.page_size < 0:
            raise ValueError(f"page_size: expected 0 (contiguous) or a positive page size, got {self.page_size}")
        _check_scale(self.scale)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def layout(self) -> str:
        return "contiguous"  # the decode contract fixes its tensors' layouts

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def has_window(self) -> bool:
        return self.window != (-1, -1)

    @property
    def capacity(self) -> int:
        """Slots each sequence needs: its cache plus the appended tokens (whole pages when paged)."""
        need = self.cache_len + (self.seqlen_q if self.append else 0)
        if self.paged:
            return -(-max(need, 1) // self.page_size) * self.page_size
        return max(need, 1)

    @property
    def pages_per_seq(self) -> int:
        return self.capacity // self.page_size if self.paged else 0

    @property
    def num_blocks(self) -> int:
        """Pages in the pool of a paged cache: the batch's and :data:`DECODE_SPARE_PAGES` unused ones."""
        return self.batch * self.pages_per_seq + DECODE_SPARE_PAGES if self.paged else 0

    @property
    def cache_seqlens(self) -> tuple[int, ...]:
        """Each sequence's cache length before the step (see the class docstring)."""
        if not self.ragged:
            return (self.cache_len,) * self.batch
        # Not seeded by the page size: the same shape paged, with other pages, or contiguous holds the
        # same lengths, so their timings compare.
        gen = torch.Generator(device="cpu").manual_seed(_seed_from("cache_seqlens", self.batch, self.cache_len))
        lens = []
        for b in range(self.batch):
            if b == 0:
                lens.append(self.cache_len)
            elif b == 1:
                lens.append(0)
            elif b == 2:
                lens.append(min(self.cache_len, self.page_size or 16))
            else:
                lens.append(int(torch.randint(0, self.cache_len + 1, (1,), generator=gen)))
        return tuple(lens)

    @property
    def kv_lengths(self) -> tuple[int, ...]:
        """Each sequence's keys during the step: its cache plus the appended tokens."""
        new = self.seqlen_q if self.append else 0
        return tuple(n + new for n in self.cache_seqlens)

    def visible_pairs(self) -> int:
        """Exact (query, key) pairs one head sees, summed over the batch (the FLOP model's count)."""
        return sum(visible_pairs(self.seqlen_q, n, causal=self.causal, window=self.window) for n in self.kv_lengths)

    @property
    def effective_scale(self) -> float:
        return self.d**-0.5 if self.scale is None else float(self.scale)

    @property
    def id(self) -> str:
        heads = f"H{self.heads_q}" if self.heads_q == self.heads_k else f"H{self.heads_q}/{self.heads_k}"
        parts = [f"B{self.batch}", heads, f"Q{self.seqlen_q}", f"L{self.cache_len}" + ("r" if self.ragged else ""),
                 f"P{self.page_size}" if self.paged else "contig"]
        if self.append:
            parts.append("new")
        parts.append(f"D{self.d}" if self.d_v == self.d else f"D{self.d}v{self.d_v}")
        if not self.causal:
            parts.append("nocausal")
        if self.has_window:
            parts.append(f"win{self.window[0]}x{self.window[1]}")
        if self.softcap:
            parts.append(f"cap{_num(self.softcap)}")
        if self.scale is not None:
            parts.append(f"scale{_num(self.scale)}")
        parts.append(self.dtype)
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id

    def with_dtype(self, dtype: str) -> DecodeCase:
        return dataclasses.replace(self, dtype=dtype)

    @property
    def oracle_kwargs(self) -> dict:
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap, softmax_scale=self.scale)


@dataclass
class DecodeInputs(_TensorFields):
    """q (B, Sq, Hq, D); k_cache, v_cache: contiguous (B, capacity, Hk, D / Dv) or paged
    (num_blocks, page_size, Hk, D / Dv); cache_seqlens int32 (B,); block_table int32 (B, pages) when
    paged; k, v (B, Sq, Hk, D / Dv) when appending. Every cache slot holds a finite value, the ones
    past a sequence's length too: a kernel that reads them gets a wrong answer, not a lucky zero."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None


def make_decode_inputs(case: DecodeCase, seed: int = 0, device="cpu") -> DecodeInputs:
    """Seeded inputs for ``case`` (see :class:`DecodeInputs`); the page table is a seeded shuffle."""
    gen = torch.Generator(device="cpu").manual_seed(_seed_from(case.id, seed))
    dt = case.torch_dtype
    B, Sq, Hq, Hk, D, Dv = case.batch, case.seqlen_q, case.heads_q, case.heads_k, case.d, case.d_v

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dt)

    q = randn(B, Sq, Hq, D)
    if case.paged:
        blocks = case.num_blocks
        k_cache, v_cache = randn(blocks, case.page_size, Hk, D), randn(blocks, case.page_size, Hk, Dv)
        order = torch.randperm(blocks, generator=gen)[: B * case.pages_per_seq]
        block_table = order.view(B, case.pages_per_seq).to(torch.int32)
    else:
        k_cache, v_cache = randn(B, case.capacity, Hk, D), randn(B, case.capacity, Hk, Dv)
        block_table = None
    k_new = randn(B, Sq, Hk, D) if case.append else None
    v_new = randn(B, Sq, Hk, Dv) if case.append else None
    lens = torch.tensor(case.cache_seqlens, dtype=torch.int32)
    return DecodeInputs(q, k_cache, v_cache, lens, block_table, k_new, v_new).to(device)


Case = SoftmaxCase | LinearCase | DecodeCase

_SOFTMAX_ID = re.compile(
    r"^B(?P<b>\d+)-H(?P<hq>\d+)(?:/(?P<hk>\d+))?-(?:S(?P<sq>\d+)x(?P<sk>\d+)|varlen\[(?P<varlen>[\dx,]*)\])"
    r"-D(?P<d>\d+)(?:v(?P<dv>\d+))?(?P<rest>(?:-[^-]+)*)$")
_DECODE_ID = re.compile(
    r"^B(?P<b>\d+)-H(?P<hq>\d+)(?:/(?P<hk>\d+))?-Q(?P<q>\d+)-L(?P<l>\d+)(?P<r>r?)-(?:P(?P<p>\d+)|contig)"
    r"(?P<new>-new)?-D(?P<d>\d+)(?:v(?P<dv>\d+))?(?P<rest>(?:-[^-]+)*)$")
_LINEAR_ID = re.compile(
    r"^B(?P<b>\d+)-H(?P<h>\d+)-T(?P<t>\d+)-K(?P<k>\d+)V(?P<v>\d+)-(?P<gate>nogate|g_gamma\(n=[^)]+\)|g\(n=[^)]+\))"
    r"(?P<rest>(?:-[^-]+)*)$")


def _id_tail(case_id: str, rest: str, flags: dict[str, tuple[str, object]], *, windows: bool = True,
             layouts: bool = True) -> dict:
    """The keyword arguments an id's tail spells: ``-<flag>...-<dtype>``, flags being the family's
    words (``flags``: word -> (field, value)), ``win<l>x<r>``, ``cap<x>``, ``scale<x>`` and a layout."""
    # "-" inside a part: a window's -1 ("win8x-1", "win-1x8") and a small value's exponent ("scale1e-05")
    parts = [p for p in re.split(r"(?<!x)(?<!win)(?<!\de)-", rest) if p]
    if not parts or parts[-1] not in DTYPES:
        raise ValueError(f"case id {case_id!r}: expected a dtype ({', '.join(DTYPES)}) at the end")
    kw: dict = {"dtype": parts.pop()}
    for p in parts:
        if p in flags:
            field, value = flags[p]
            kw[field] = value
        elif windows and p.startswith("win"):
            left, right = p[3:].split("x")
            kw["window"] = (int(left), int(right))
        elif windows and p.startswith("cap"):
            kw["softcap"] = float(p[3:])
        elif p.startswith("scale"):
            kw["scale"] = float(p[5:])
        elif layouts and p in LAYOUTS:
            kw["layout"] = p
        else:
            raise ValueError(f"case id {case_id!r}: unknown part {p!r}")
    return kw


def case_from_id(case_id: str) -> Case:
    """The case (softmax, linear or decode) whose :attr:`id` is ``case_id`` (a replay's or a shrink's
    input); ValueError naming
    the part that does not parse."""
    m = _DECODE_ID.match(case_id)
    if m:
        kw = {"d_v": int(m["dv"]) if m["dv"] else None, "ragged": bool(m["r"]), "append": bool(m["new"]),
              "page_size": int(m["p"] or 0)}
        kw.update(_id_tail(case_id, m["rest"], {"nocausal": ("causal", False)}, layouts=False))
        hq = int(m["hq"])
        case = DecodeCase(int(m["b"]), hq, int(m["hk"] or hq), int(m["q"]), int(m["l"]), int(m["d"]), **kw)
    elif m := _LINEAR_ID.match(case_id):
        gate = m["gate"]
        kw: dict = {"gate": "none" if gate == "nogate" else gate.split("(")[0]}
        if gate != "nogate":
            kw["gate_n"] = float(gate.split("=", 1)[1].rstrip(")"))
        kw.update(initial_state=False, grad_final_state=False)
        kw.update(_id_tail(case_id, m["rest"], {"h0": ("initial_state", True), "dhT": ("grad_final_state", True)},
                           windows=False))
        case = LinearCase(int(m["b"]), int(m["h"]), int(m["t"]), int(m["k"]), int(m["v"]), **kw)
    else:
        m = _SOFTMAX_ID.match(case_id)
        if not m:
            raise ValueError(f"case id {case_id!r}: neither a softmax (B2-H8/2-S1024x1024-D64-...-bf16), a "
                             "linear (B4-H32-T1024-K64V64-g(n=1)-...-fp16) nor a decode "
                             "(B16-H32/8-Q1-L4096r-P64-new-D128-bf16) case id")
        hq = int(m["hq"])
        kw = {"d_v": int(m["dv"]) if m["dv"] else None}
        kw.update(_id_tail(case_id, m["rest"], {"causal": ("causal", True), "e4m3": ("fp8", "e4m3"),
                                                "perhead": ("fp8_per_head", True), "o8": ("fp8_out", True),
                                                "grad_e4m3": ("fp8_grad", "e4m3"), "grad_e5m2": ("fp8_grad", "e5m2"), "nolse": ("return_lse", False),
                                                "positional": ("call", "positional")}))
        if m["varlen"] is not None:
            lens = tuple(tuple(int(x) for x in pair.split("x")) for pair in m["varlen"].split(",") if pair)
            case = SoftmaxCase(len(lens), hq, int(m["hk"] or hq), 0, 0, int(m["d"]), varlen=lens, **kw)
        else:
            case = SoftmaxCase(int(m["b"]), hq, int(m["hk"] or hq), int(m["sq"]), int(m["sk"]), int(m["d"]), **kw)
    if case.id != case_id:  # a number written another way ("scale0.50"): the id must be canonical
        raise ValueError(f"case id {case_id!r} reads back as {case.id!r}: use the id the harness prints")
    return case


def make_inputs(case: Case, seed: int = 0, device="cpu"):
    """Seeded inputs for any family."""
    if isinstance(case, SoftmaxCase):
        return make_softmax_inputs(case, seed, device)
    if isinstance(case, LinearCase):
        return make_linear_inputs(case, seed, device)
    if isinstance(case, DecodeCase):
        return make_decode_inputs(case, seed, device)
    raise TypeError(f"case: expected SoftmaxCase, LinearCase or DecodeCase, got {type(case).__name__}")
