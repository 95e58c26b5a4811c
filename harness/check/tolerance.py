"""The pass rule: how close a candidate must come to the FP64 oracle, per tensor and dtype.

For every output tensor the engine knows three numbers, all relative RMS errors against the
oracle computed on the same (already rounded) inputs:

* ``error``: the candidate's;
* ``reference_error``: that of the eager reference computed in the candidate's dtype (matmuls in
  the dtype, softmax / state in fp32), i.e. what this dtype can achieve with careful code;
* ``floor``: ``FLOOR_FACTOR`` x the error of rounding the oracle tensor itself to the tensor's
  dtype (at least ``MIN_ROUNDING_UNITS`` x its unit roundoff), so the bound never collapses to 0
  when the reference happens to be exact (all-zero rows, tiny cases, fp64); raised to
  :data:`HARDWARE_FLOORS` where the hardware a correct kernel runs on cannot do better (FP8 lse).

A tensor passes when ``error <= factor x reference_error + floor`` and every element is finite
where the oracle is finite. ``factor`` comes from :data:`FACTORS`, one row per (tensor, dtype)
with the reason beside it. Everything here is a pure function of tensors.
"""

from __future__ import annotations

__all__ = [
    "FACTORS",
    "FLOOR_FACTOR",
    "HARDWARE_FLOORS",
    "MIN_ROUNDING_UNITS",
    "TENSOR_NAMES",
    "UNIT_ROUNDOFF",
    "Factor",
    "TensorReport",
    "WorstElement",
    "compare_tensor",
    "factor_for",
    "floor_for",
    "fp8_lse_floor",
    "hardware_floor",
    "nonfinite_count",
    "rel_rms_error",
    "rounding_error",
    "worst_element",
]

import math
from dataclasses import asdict, dataclass

import torch

# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

#: Unit roundoff 2**-p of each dtype (half the gap between 1 and the next number).
UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}

#: The floor is this many times the relative RMS error of rounding the oracle itself to the
#: tensor's dtype: a perfect kernel (exact accumulation, one final rounding) scores exactly 1x.
#: The floor only has to keep a correct kernel passing when the reference is (nearly) exact, so
#: 1x is enough; 2x (flash-attn 3's atol) let an fp16 accumulator through on short rows.
FLOOR_FACTOR = 1.0

#: Lower bound of the rounding error, in units of the unit roundoff u. Rounding normally costs
#: 0.35-0.45 u RMS (measured on Gaussian data: the relative error is uniform in +-ulp/2 and the
#: RMS weighs it by magnitude), so u / 4 acts only when rounding is (nearly) exact: an fp64
#: oracle rounded to fp64, all-zero or integer-valued tensors. It keeps the floor above 0.
MIN_ROUNDING_UNITS = 0.25


@dataclass(frozen=True)
class Factor:
    """Allowed multiple of the reference's error for one (tensor, dtype), and why."""

    value: float
    reason: str


_LOW = ("fp16", "bf16")

# (tensors, dtypes, factor, reason). Calibration (CPU, seeds 0..7, presets small + small-linear,
# fp32 + fp16): the largest error / reference-error of a correct backend (sdpa_math, sdpa, the
# in-repo Triton kernels under the interpreter) was 1.3x for out / lse, 1.8x for dq / dk / dv /
# final_state, 1.5x for dh0, 6.1x for dg; every bound below leaves room for that spread, and
# every deliberately wrong kernel of tests/wrong_impls.py lands above it (tests/check/test_verify.py).
_TABLE: list[tuple[tuple[str, ...], tuple[str, ...], float, str]] = [
    (
        ("out", "lse"),
        _LOW,
        2.0,
        "flash-attn's own test rule: a fused kernel must be within 2x the error of the eager "
        "reference in the same dtype (both round P and O once to the dtype)",
    ),
    (
        ("out",),
        ("e4m3",),
        2.0,
        "FP8 cases (harness.fp8): P quantised to e4m3 for P V dominates (1-2.5% rel-RMS against the "
        "oracle on the dequantised inputs); a flash kernel quantises P against its running maximum "
        "instead of the final one: 0.98-1.0x the reference (key blocks of 16 / 64 / 128, 6 cases x 4 "
        "seeds, CPU); a descale ignored or applied twice costs >10x",
    ),
    (
        ("lse",),
        ("e4m3",),
        5.0,
        "FP8 cases: m and l are fp32 (l summed from P before its cast, flash-attn 3's convention), so "
        "the fp32 rule applies: blockwise running maxima measured up to 1.13x; the FP8 tensor cores' "
        "accumulator sets a floor under it (HARDWARE_FLOORS)",
    ),
    (
        ("out", "lse"),
        ("fp32",),
        5.0,
        "fp32 errors (~1e-7) are dominated by summation order and the exp a kernel uses: correct "
        "backends reach 1.8x on the CPU (sdpa's flash path, windowed case) and 3.5x on the H100 "
        "(torch SDPA's fp32 fused kernel against cuBLAS matmuls, decode D32 L100: 1.8e-7 against "
        "5.1e-8, twice); any real bug costs >1e-4, i.e. >1000x",
    ),
    (
        ("out", "lse"),
        ("fp64",),
        10.0,
        "fp64 errors (~1e-16) are pure summation-order noise, varying several-fold between "
        "correct algorithms; any bug or fp32 step costs >1e-8, far above 10x",
    ),
    (
        ("final_state",),
        _LOW,
        2.0,
        "FLA's chunk kernels carry the state in fp32 like the reference; the inputs' rounding "
        "dominates, so a correct kernel matches it closely",
    ),
    (("final_state",), ("fp32",), 3.0, "summation order, as for out in fp32"),
    (("final_state",), ("fp64",), 10.0, "summation-order noise, as for out in fp64"),
    (
        ("dq", "dk", "dv"),
        _LOW,
        3.0,
        "backward kernels recompute P from lse and round dS and P to the dtype before two more "
        "matmuls, so gradients scatter more than the forward; flash-attn's tests bound gradients "
        "at 2x the reference's max error plus a rounding atol, a rel-RMS bound at 3x is of the "
        "same strength; a 1% error in dq still lands at ~6x the bound in fp16",
    ),
    (
        ("dq", "dk", "dv"),
        ("e4m3", "e5m2"),
        2.0,
        "FP8 backward (fp8_grad cases; cuDNN's sdpa_fp8_backward convention, harness.adapters.eager): "
        "dS quantised to the gradients' format dominates (e5m2 keeps 2 mantissa bits, e4m3 3), then P in "
        "e4m3 for dV; a kernel doing the same quantisations differs from the reference only in fp32 "
        "summation order and where its roundings fall: cuDNN 9.19's sdpa_fp8_backward measured 0.98-1.06x on "
        "the H100, 1.65x on dq with a 128-key window (session 19, docs/bench/h100-fp8-bwd-s19); a descale "
        "ignored, dS cast unscaled or the softmax scale left out costs >3x (tests/check/test_fp8_backward.py)",
    ),
    (
        ("dq", "dk", "dv"),
        ("fp32",),
        4.0,
        "fp32 gradients sum over the whole sequence (dk, dv) in an order of the kernel's choosing; "
        "correct backends reach 1.8x, 4x leaves room for longer sequences",
    ),
    (("dq", "dk", "dv"), ("fp64",), 10.0, "summation-order noise, as for out in fp64"),
    (
        ("dh0",),
        _LOW + ("fp32",),
        3.0,
        "dh0 is the reverse state recurrence, the forward's twin, with one more matmul",
    ),
    (("dh0",), ("fp64",), 10.0, "summation-order noise, as for out in fp64"),
    (
        ("dg",),
        _LOW + ("fp32",),
        10.0,
        "dg = reverse cumsum of q.dq - k.dk (FLA's formula, used by the kernels): a difference of "
        "two large terms, so the kernels' rounding of dq, dk is amplified, while the reference's "
        "autograd path avoids the cancellation; correct kernels measured up to 6.1x (fp16) and 3.3x "
        "(fp32); a 1% error in dg still lands above 10x",
    ),
    (("dg",), ("fp64",), 10.0, "summation-order noise, as for out in fp64"),
]

#: (tensor, dtype name) -> :class:`Factor`; the single source of the tolerance factors.
FACTORS: dict[tuple[str, str], Factor] = {
    (t, dt): Factor(f, reason) for tensors, dtypes, f, reason in _TABLE for t in tensors for dt in dtypes
}

#: (tensor, case dtype) -> a relative-RMS floor set by the arithmetic the hardware offers a correct
#: kernel rather than by rounding the result, and why. The bound's floor is the larger of this and
#: the rounding floor.
HARDWARE_FLOORS: dict[tuple[str, str], Factor] = {
    ("lse", "e4m3"): Factor(
        2.0**-14,
        "Hopper's FP8 tensor cores (wgmma) add an FP8 dot's products in an accumulator that keeps about "
        "14 bits (DeepSeek-V3 technical report, section 3.3.2; hence Triton's max_num_imprecise_acc), so "
        "S = Q K^T of one head-dim-deep dot carries ~2^-14 relative error and lse with it, while the eager "
        "reference accumulates in fp32. Measured on the H100 (session 11): cuDNN 9.19's FP8 SDPA 1.3-1.4e-5 "
        "(D128 S64, 350x the reference's 4e-8), the in-repo kernel without promotion 3.4-4.7e-6 (hd 64/128, "
        "S 4k-16k), promoting after every MMA 4.5e-8 at 0.5-0.6x the speed. out keeps its rule (P in e4m3 "
        "dominates it: the same 2.5e-2 either way). The 2^-14 is relative to the products the accumulator "
        "adds: a case's floor is fp8_lse_floor's, this value scaled by its inputs' magnitudes against its lse "
        "(scale-1 scores raise it)",
    ),
}


def fp8_lse_floor(q, k, q_descale, k_descale, scale: float, lse: torch.Tensor) -> float:
    """The FP8 lse floor of one case, from its inputs: :data:`HARDWARE_FLOORS`'s 2^-14 is relative to
    the magnitudes the accumulator adds, not to S. Score (i, j) carries at most ~2^-14 x scale x
    sum_d |q_id k_jd| <= 2^-14 x scale x ||q_i|| x max_j ||k_j|| (Cauchy-Schwarz; dequantised, per
    query head and its kv head), and a row's lse moves by at most its scores' largest error. The
    floor is the rel-RMS of that bound over the rows lse is finite in, never below 2^-14. With the
    usual scale 1/sqrt(d) it stays near 2^-14; with scale 1 (T5-style) the products add up to more
    than the lse (the in-repo kernel read 6.15e-5 on B2-H4/2-S64x64-D64-scale1 on the H100, session
    18, against a fixed floor of 6.10e-5). q (B, Sq, Hq, D), k (B, Sk, Hk, D) in FP8 with their (B, Hk)
    descales; lse (B, Hq, Sq), the oracle's."""
    from harness import fp8

    base = HARDWARE_FLOORS[("lse", "e4m3")].value
    qd = fp8.dequantize(q, q_descale)  # float64
    kd = fp8.dequantize(k, k_descale)
    B, _, Hq, _ = qd.shape
    Hk = kd.shape[2]
    if kd.shape[1] == 0 or qd.shape[1] == 0:
        return base
    q_norm = torch.linalg.vector_norm(qd, dim=-1)  # (B, Sq, Hq)
    k_max = torch.linalg.vector_norm(kd, dim=-1).amax(dim=1).repeat_interleave(Hq // Hk, dim=1)  # (B, Hq)
    bound = (base * abs(scale)) * q_norm.transpose(1, 2) * k_max[:, :, None]  # (B, Hq, Sq)
    lse = lse.to(bound.device, torch.float64)
    live = torch.isfinite(lse)
    if not live.any():
        return base
    size = float(torch.linalg.vector_norm(lse[live]))
    if size == 0.0:
        return base
    return max(base, float(torch.linalg.vector_norm(bound[live])) / size)


def hardware_floor(tensor: str, case_dtype: str | torch.dtype) -> float:
    """The :data:`HARDWARE_FLOORS` entry of ``tensor`` in a case of ``case_dtype``, else 0."""
    hit = HARDWARE_FLOORS.get((tensor, _dtype_name(case_dtype)))
    return hit.value if hit else 0.0


#: Tensors the engine knows, in report order.
TENSOR_NAMES = ("out", "lse", "final_state", "dq", "dk", "dv", "dg", "dh0")


def factor_for(tensor: str, dtype: str | torch.dtype) -> Factor:
    """The factor of ``tensor`` ("out", "dq", ...) for a case of ``dtype`` ("fp16" or torch dtype)."""
    name = _dtype_name(dtype)
    try:
        return FACTORS[(tensor, name)]
    except KeyError:
        known = sorted({t for t, _ in FACTORS})
        raise ValueError(
            f"tensor: no tolerance factor for ({tensor!r}, {name!r}); tensors: {known}"
        ) from None


def _dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    from harness.cases import DTYPE_NAMES

    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(
            f"dtype: expected a float dtype of {sorted(DTYPE_NAMES.values())}, got {dtype}"
        ) from None


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    from harness.cases import dtype_of

    return dtype_of(dtype)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def rel_rms_error(candidate: torch.Tensor, expected: torch.Tensor) -> float:
    """``||candidate - expected||_2 / ||expected||_2`` over the elements where ``expected`` is
    finite; inf when the candidate is not finite there. An all-zero ``expected`` divides by 1
    (the error is then absolute), so the number stays comparable between two candidates."""
    if tuple(candidate.shape) != tuple(expected.shape):
        raise ValueError(
            f"candidate: shape {tuple(candidate.shape)} differs from the expected {tuple(expected.shape)}"
        )
    e = expected.detach().to(torch.float64)
    c = candidate.detach().to(device=e.device, dtype=torch.float64)
    keep = torch.isfinite(e)
    if not bool(keep.all()):
        e, c = e[keep], c[keep]
    if e.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(c).all()):
        return math.inf
    denom = float(torch.linalg.vector_norm(e))
    return float(torch.linalg.vector_norm(c - e)) / (denom if denom > 0 else 1.0)


def rounding_error(expected: torch.Tensor, dtype: str | torch.dtype) -> float:
    """Relative RMS error of rounding ``expected`` (the oracle) to ``dtype``: what a perfect
    kernel writing its result in that dtype would score. 0 when the rounding is exact."""
    dt = _torch_dtype(dtype)
    return rel_rms_error(expected.detach().to(dt), expected)


def floor_for(expected: torch.Tensor, dtype: str | torch.dtype) -> float:
    """``FLOOR_FACTOR * max(rounding_error(expected, dtype), MIN_ROUNDING_UNITS * u)`` with u the
    dtype's unit roundoff: never 0."""
    dt = _torch_dtype(dtype)
    return FLOOR_FACTOR * max(rounding_error(expected, dt), MIN_ROUNDING_UNITS * UNIT_ROUNDOFF[dt])


@dataclass
class WorstElement:
    """The element with the largest absolute error (or the first non-finite one)."""

    index: tuple[int, ...]
    value: float  # the candidate's
    expected: float  # the oracle's
    abs_error: float


def worst_element(candidate: torch.Tensor, expected: torch.Tensor) -> WorstElement | None:
    """Worst element over the positions where ``expected`` is finite; a non-finite candidate
    element there wins (its error is inf). None when no such position exists."""
    e = expected.detach().to(torch.float64)
    c = candidate.detach().to(device=e.device, dtype=torch.float64)
    if e.numel() == 0:
        return None
    keep = torch.isfinite(e)
    err = (c - e).abs()
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, math.inf))
    err = torch.where(keep, err, torch.full_like(err, -1.0))
    flat = int(torch.argmax(err))
    if float(err.reshape(-1)[flat]) < 0:
        return None
    idx = _unravel(flat, tuple(e.shape))
    return WorstElement(
        idx, float(c.reshape(-1)[flat]), float(e.reshape(-1)[flat]), float(err.reshape(-1)[flat])
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return tuple(reversed(idx))


def nonfinite_count(candidate: torch.Tensor, expected: torch.Tensor) -> int:
    """Elements that are NaN / inf in ``candidate`` where ``expected`` is finite (NaN-poisoned
    outputs make unwritten elements show up here)."""
    return int(
        (torch.isfinite(expected.detach()) & ~torch.isfinite(candidate.detach().to(expected.device))).sum()
    )


# --------------------------------------------------------------------------------------------
# The verdict for one tensor
# --------------------------------------------------------------------------------------------


@dataclass
class TensorReport:
    """The verdict for one output tensor. Errors are relative RMS against the oracle.

    ``allowed = factor * reference_error + floor``; ``ratio = error / reference_error`` (what the
    field reports: "1.3x the reference"); ``budget = error / allowed`` (<= 1 passes).
    """

    name: str
    dtype: str  # the dtype the contract asks for (sets the floor)
    shape: tuple[int, ...]
    error: float
    reference_error: float
    factor: float
    floor: float
    allowed: float
    ratio: float
    budget: float
    max_abs_error: float
    worst: WorstElement | None
    nonfinite: int
    passed: bool
    reason: str = ""  # one line when failed

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        if self.worst is not None:
            d["worst"]["index"] = list(self.worst.index)
        return {k: _json_number(v) for k, v in d.items()}

    def summary(self) -> str:
        """One readable line: error, ratio, bound, worst element."""
        line = (
            f"{self.name}: rel-RMS error {self.error:.3g} = {_fmt_ratio(self.ratio)} the reference's "
            f"{self.reference_error:.3g} "
            f"(allowed {self.factor:g}x + floor {self.floor:.2g} = {self.allowed:.3g})"
        )
        if self.nonfinite:
            line += f"; {self.nonfinite} non-finite element(s) where the oracle is finite"
        if self.worst is not None:
            w = self.worst
            line += (
                f"; max abs error {self.max_abs_error:.3g} at {list(w.index)}: got {w.value:.6g}, "
                f"expected {w.expected:.6g}"
            )
        return line


def _fmt_ratio(r: float) -> str:
    return "inf x" if math.isinf(r) else f"{r:.2f}x"


def _json_number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _json_number(x) for k, x in v.items()}
    return v


def compare_tensor(
    name: str,
    candidate: torch.Tensor,
    expected: torch.Tensor,
    *,
    reference_error: float,
    dtype: str | torch.dtype,
    case_dtype: str | torch.dtype | None = None,
    factor: float | None = None,
    floor: float = 0.0,
) -> TensorReport:
    """Judge one tensor.

    Args:
        name: "out", "lse", "final_state", "dq", "dk", "dv", "dg" or "dh0".
        candidate: the candidate's tensor, any float dtype, same shape as ``expected``.
        expected: the oracle's tensor (float64); non-finite elements (lse of masked rows) are
            left out of every metric.
        reference_error: rel-RMS error of the eager reference in the case's dtype.
        dtype: the dtype the contract gives this tensor (sets the floor: lse is fp32 in an fp16
            case, so its floor is fp32's rounding).
        case_dtype: the case's dtype (selects the factor); defaults to ``dtype``.
        factor: overrides the table.
        floor: a floor the case's inputs set (:func:`fp8_lse_floor`); the larger of it and the
            tensor's own floors applies.
    """
    case_dtype = dtype if case_dtype is None else case_dtype
    f = factor_for(name, case_dtype).value if factor is None else float(factor)
    shape = tuple(candidate.shape)
    tname = _dtype_name(dtype)
    if shape != tuple(expected.shape):
        return TensorReport(
            name,
            tname,
            shape,
            math.inf,
            reference_error,
            f,
            math.nan,
            math.nan,
            math.inf,
            math.inf,
            math.inf,
            None,
            0,
            False,
            f"{name}: shape {shape} differs from the oracle's {tuple(expected.shape)}",
        )
    err = rel_rms_error(candidate, expected)
    floor = max(floor_for(expected, dtype), hardware_floor(name, case_dtype), floor)
    allowed = f * reference_error + floor
    ratio = err / reference_error if reference_error > 0 else (0.0 if err == 0 else math.inf)
    worst = worst_element(candidate, expected)
    bad = nonfinite_count(candidate, expected)
    passed = bad == 0 and err <= allowed
    rep = TensorReport(
        name=name,
        dtype=tname,
        shape=shape,
        error=err,
        reference_error=reference_error,
        factor=f,
        floor=floor,
        allowed=allowed,
        ratio=ratio,
        budget=err / allowed,
        max_abs_error=worst.abs_error if worst else 0.0,
        worst=worst,
        nonfinite=bad,
        passed=passed,
    )
    if bad:
        rep.reason = f"{name}: {bad} non-finite element(s) where the oracle is finite (unwritten or overflow)"
        if worst is not None:
            rep.reason += f", first worst at {list(worst.index)} = {worst.value}"
    elif not passed:
        rep.reason = (
            f"{name}: error {err:.3g} is {_fmt_ratio(ratio)} the reference's {reference_error:.3g} "
            f"(allowed {f:g}x + floor {floor:.2g})"
        )
    return rep
