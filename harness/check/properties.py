"""The property checks of a verification, besides the numbers: the output contract (shapes,
dtypes, device), inputs not written to, the convention for rows that see no key, and determinism
(two runs bitwise). Each returns a :class:`~harness.check.results.PropertyResult`.
"""

from __future__ import annotations

import math

import torch

from harness.cases import Case, LinearCase
from harness.check.results import PropertyResult, _Run, _run_inputs


def _contract_dtypes(case: Case) -> dict[str, tuple[torch.dtype, ...]]:
    """Allowed dtypes of each output tensor (gradients follow their inputs)."""
    dt = case.torch_dtype
    # fp64 cases: lse / final_state in fp64 (an fp32 one could not reach fp64 accuracy anyway).
    wide = (torch.float64,) if dt == torch.float64 else (torch.float32,)
    d = {"out": (dt,), "lse": wide, "final_state": wide, "dq": (dt,), "dk": (dt,), "dv": (dt,)}
    d.update(dg=(torch.float32,), dh0=(torch.float32,))
    if getattr(case, "fp8_grad", ""):  # an FP8 backward's gradients: in the dtype, float32, or read back from FP8
        d.update(dq=(dt, torch.float32), dk=(dt, torch.float32), dv=(dt, torch.float32))
    return d


def _compare_dtype(name: str, case: Case) -> torch.dtype:
    """The dtype whose rounding sets a tensor's floor (the contract's first choice)."""
    return _contract_dtypes(case)[name][0]


def _check_contract(case: Case, run: _Run, expected: dict[str, torch.Tensor], device) -> PropertyResult:
    problems = []
    allowed = _contract_dtypes(case)
    for name, t in run.tensors.items():
        if name in expected and tuple(t.shape) != tuple(expected[name].shape):
            problems.append(f"{name} shape {tuple(t.shape)} != {tuple(expected[name].shape)}")
        if t.dtype not in allowed.get(name, (t.dtype,)):
            problems.append(f"{name} dtype {t.dtype} not in {[str(x) for x in allowed[name]]}")
        where = run.devices.get(name, t.device.type) if run.devices is not None else t.device.type
        if where != device.type:
            problems.append(f"{name} on {where}, inputs on {device}")
    if isinstance(case, LinearCase) and "final_state" not in run.tensors:
        problems.append("final_state not returned (LinearOutput.final_state is None)")
    if problems:
        return PropertyResult("contract", "fail", "; ".join(problems))
    return PropertyResult(
        "contract", "pass", "shapes, dtypes and device of every output as the contract says"
    )


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()]) if t.is_floating_point() else t


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bit pattern (NaN == NaN, -0.0 != 0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


#: Inputs a decode step writes (the new tokens into the cache): checked by :func:`_check_cache_write`.
WRITTEN_INPUTS = ("k_cache", "v_cache")


def _check_unchanged(case: Case, inputs, runs: list[_Run]) -> PropertyResult:
    originals = {**inputs.tensors(), **_run_inputs(case, inputs)}  # an FP8 backward also gets dO and descales
    changed: dict[str, str] = {}
    for run in runs:
        for name, t in run.passed_inputs.items():
            if name in WRITTEN_INPUTS:
                continue
            if name not in changed and not bitwise_equal(t, originals[name]):
                same_shape = t.shape == originals[name].shape and t.dtype == originals[name].dtype
                n = int((_bits(t) != _bits(originals[name])).sum()) if same_shape else t.numel()
                changed[name] = f"{name} ({n} element(s) changed)"
    if changed:
        detail = "the candidate wrote into its inputs: " + ", ".join(changed.values())
        return PropertyResult("inputs_unchanged", "fail", detail)
    return PropertyResult("inputs_unchanged", "pass", "every input bitwise equal after the run")


def _check_cache_write(case: Case, runs: list[_Run], expected: dict[str, torch.Tensor]) -> PropertyResult:
    """Decode: the caches after the step equal the oracle's bit for bit: the new tokens in exactly
    their slots (through the page table), every other slot untouched."""
    if not getattr(case, "append", False):
        what = "no new tokens: the cache must be left as it was"
    else:
        what = f"{case.seqlen_q} new token(s) per sequence written at cache_seqlens"
    problems = []
    for run in runs[:1]:
        for name in WRITTEN_INPUTS:
            got, want = run.passed_inputs.get(name), expected.get(name)
            if got is None or want is None:
                continue
            got = got.to(want.device)
            if bitwise_equal(got, want):
                continue
            slot_dims = tuple(range(2, want.dim()))
            wrong = (_bits(got) != _bits(want)).any(dim=slot_dims) if got.shape == want.shape else None
            n = int(wrong.sum()) if wrong is not None else -1
            problems.append(f"{name}: {n} slot(s) differ from the expected cache" if n >= 0 else
                            f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if problems:
        return PropertyResult("cache_write", "fail", "; ".join(problems) + f" ({what}; nothing else may change)")
    return PropertyResult("cache_write", "pass", f"cache as expected after the step ({what})")


def _masked_rows(case: Case, expected: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """Boolean mask in out's leading shape ((B, Sq, Hq) or (total_q, Hq)) of rows that see no key."""
    if isinstance(case, LinearCase):
        return None
    lse = expected["lse"]
    dead = torch.isneginf(lse)
    if not bool(dead.any()):
        return None
    return dead.movedim(-2, -1)  # (B, Hq, Sq) -> (B, Sq, Hq); (Hq, total) -> (total, Hq)


def _check_masked_rows(adapter, case: Case, run: _Run, dead: torch.Tensor | None) -> PropertyResult:
    if dead is None:
        return PropertyResult("masked_rows", "skipped", "no fully-masked rows in this case")
    n = int(dead.sum())
    out = run.tensors["out"]
    problems = []
    if tuple(out.shape[:-1]) == tuple(dead.shape):
        rows = out[dead.to(out.device)]
        if not bool((rows == 0).all()):
            bad = int((rows != 0).any(-1).sum())
            sample = rows[(rows != 0).any(-1)][0, :3].tolist()
            problems.append(f"out is not 0 on {bad} of {n} masked rows (e.g. {sample})")
    lse = run.tensors.get("lse")
    if lse is not None and tuple(lse.movedim(-2, -1).shape) == tuple(dead.shape):
        vals = lse.movedim(-2, -1)[dead.to(lse.device)]
        if not bool(torch.isneginf(vals).all()):
            problems.append(
                f"lse is not -inf on masked rows (e.g. {vals[~torch.isneginf(vals)][:3].tolist()})"
            )
    if not problems:
        return PropertyResult(
            "masked_rows", "pass", f"{n} fully-masked row(s): out 0, lse -inf as the oracle"
        )
    documented = getattr(adapter, "masked_rows", None)
    if documented:
        return PropertyResult(
            "masked_rows", "documented", "; ".join(problems) + f" - documented: {documented}"
        )
    return PropertyResult("masked_rows", "fail", "; ".join(problems) + " (oracle: out 0, lse -inf)")


def _check_determinism(adapter, first: _Run, second: _Run, checked_backward: bool, case=None,
                       device=None) -> PropertyResult:
    """Two runs bitwise equal; a backward difference is "documented" where the adapter declares that case's
    backward nondeterministic (``deterministic_backward_for``, else its ``deterministic_backward``)."""
    fwd_names = [n for n in first.tensors if n in ("out", "lse", "final_state")]
    diffs = {}
    for name, a in first.tensors.items():
        b = second.tensors.get(name)
        if b is None or not bitwise_equal(a, b):
            spread = math.inf
            if b is not None and a.shape == b.shape:
                spread = (
                    float((a.double() - b.double()).abs().nan_to_num(math.inf).max()) if a.numel() else 0.0
                )
            diffs[name] = spread
    if not diffs:
        what = "forward and backward" if checked_backward else "forward"
        return PropertyResult("determinism", "pass", f"two runs bitwise equal ({what})")
    text = ", ".join(f"{n} (max |run1 - run2| {s:.3g})" for n, s in diffs.items())
    if any(n in fwd_names for n in diffs):
        return PropertyResult("determinism", "fail", f"forward differs between two runs: {text}")
    per_case = getattr(adapter, "deterministic_backward_for", None)
    declared = per_case(case, device) if per_case is not None and case is not None else getattr(
        adapter, "deterministic_backward", True)
    if not declared:
        return PropertyResult("determinism", "documented", f"nondeterministic backward (documented): {text}")
    return PropertyResult("determinism", "fail", f"backward differs between two runs: {text}")


