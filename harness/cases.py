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
        parts.append(self.dtype)
        return "-".join(parts)

    def __str__(self) -> str:
        return self.id

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


@dataclass
class SoftmaxInputs:
    """Seeded inputs. Dense: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv), grad_out like out.
    Varlen: packed (total, H, D) tensors plus int32 ``cu_seqlens_q`` / ``cu_seqlens_k`` (B + 1,)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grad_out: torch.Tensor
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"q": self.q, "k": self.k, "v": self.v, "grad_out": self.grad_out}
        if self.cu_seqlens_q is not None:
            out["cu_seqlens_q"] = self.cu_seqlens_q
            out["cu_seqlens_k"] = self.cu_seqlens_k
        return out

    def to(self, device) -> SoftmaxInputs:
        return SoftmaxInputs(**{k: v.to(device) for k, v in self.tensors().items()})


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
class LinearInputs:
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

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def to(self, device) -> LinearInputs:
        return LinearInputs(**{k: v.to(device) for k, v in self.tensors().items()})


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


Case = SoftmaxCase | LinearCase

_SOFTMAX_ID = re.compile(
    r"^B(?P<b>\d+)-H(?P<hq>\d+)(?:/(?P<hk>\d+))?-(?:S(?P<sq>\d+)x(?P<sk>\d+)|varlen\[(?P<varlen>[\dx,]*)\])"
    r"-D(?P<d>\d+)(?:v(?P<dv>\d+))?(?P<rest>(?:-[^-]+)*)$")
_LINEAR_ID = re.compile(
    r"^B(?P<b>\d+)-H(?P<h>\d+)-T(?P<t>\d+)-K(?P<k>\d+)V(?P<v>\d+)-(?P<gate>nogate|g_gamma\(n=[^)]+\)|g\(n=[^)]+\))"
    r"(?P<rest>(?:-[^-]+)*)$")


def case_from_id(case_id: str) -> Case:
    """The case whose :attr:`id` is ``case_id`` (a replay's or a shrink's input); ValueError naming
    the part that does not parse."""
    m = _LINEAR_ID.match(case_id)
    if m:
        gate = m["gate"]
        kw: dict = {"gate": "none" if gate == "nogate" else gate.split("(")[0]}
        if gate != "nogate":
            kw["gate_n"] = float(gate.split("=", 1)[1].rstrip(")"))
        kw.update(initial_state=False, grad_final_state=False)
        parts = [p for p in m["rest"].split("-") if p]
        if not parts or parts[-1] not in DTYPES:
            raise ValueError(f"case id {case_id!r}: expected a dtype ({', '.join(DTYPES)}) at the end")
        kw["dtype"] = parts.pop()
        for p in parts:
            if p == "h0":
                kw["initial_state"] = True
            elif p == "dhT":
                kw["grad_final_state"] = True
            elif p.startswith("scale"):
                kw["scale"] = float(p[5:])
            elif p in LAYOUTS:
                kw["layout"] = p
            else:
                raise ValueError(f"case id {case_id!r}: unknown part {p!r}")
        case = LinearCase(int(m["b"]), int(m["h"]), int(m["t"]), int(m["k"]), int(m["v"]), **kw)
    else:
        m = _SOFTMAX_ID.match(case_id)
        if not m:
            raise ValueError(f"case id {case_id!r}: neither a softmax (B2-H8/2-S1024x1024-D64-...-bf16) nor a "
                             "linear (B4-H32-T1024-K64V64-g(n=1)-...-fp16) case id")
        hq = int(m["hq"])
        kw = {"d_v": int(m["dv"]) if m["dv"] else None}
        parts = [p for p in m["rest"].split("-") if p]
        if not parts or parts[-1] not in DTYPES:
            raise ValueError(f"case id {case_id!r}: expected a dtype ({', '.join(DTYPES)}) at the end")
        kw["dtype"] = parts.pop()
        for p in parts:
            if p == "causal":
                kw["causal"] = True
            elif p.startswith("win"):
                left, right = p[3:].split("x")
                kw["window"] = (int(left), int(right))
            elif p.startswith("cap"):
                kw["softcap"] = float(p[3:])
            elif p.startswith("scale"):
                kw["scale"] = float(p[5:])
            elif p in LAYOUTS:
                kw["layout"] = p
            else:
                raise ValueError(f"case id {case_id!r}: unknown part {p!r}")
        if m["varlen"] is not None:
            lens = tuple(tuple(int(x) for x in pair.split("x")) for pair in m["varlen"].split(",") if pair)
            case = SoftmaxCase(len(lens), hq, int(m["hk"] or hq), 0, 0, int(m["d"]), varlen=lens, **kw)
        else:
            case = SoftmaxCase(int(m["b"]), hq, int(m["hk"] or hq), int(m["sq"]), int(m["sk"]), int(m["d"]), **kw)
    if case.id != case_id:  # a number written another way ("scale0.50"): the id must be canonical
        raise ValueError(f"case id {case_id!r} reads back as {case.id!r}: use the id the harness prints")
    return case


def make_inputs(case: Case, seed: int = 0, device="cpu"):
    """Seeded inputs for either family."""
    if isinstance(case, SoftmaxCase):
        return make_softmax_inputs(case, seed, device)
    if isinstance(case, LinearCase):
        return make_linear_inputs(case, seed, device)
    raise TypeError(f"case: expected SoftmaxCase or LinearCase, got {type(case).__name__}")
