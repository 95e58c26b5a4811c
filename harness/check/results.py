"""What a verification returns: :class:`CaseResult` (one per adapter, case, seed, device) with a
:class:`~harness.check.tolerance.TensorReport` per compared tensor and a :class:`PropertyResult` per
property; and :class:`_Run`, one call's tensors as the judge sees them. Plain dataclasses:
``to_dict`` gives JSON-ready dicts, ``from_dict`` reads them back (reports, the acceptance check).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch

from harness.cases import RUN_INPUT_NAMES, Case
from harness.check import tolerance
from harness.check.tolerance import TensorReport, WorstElement

Status = Literal["pass", "fail", "unsupported", "error"]
PropertyStatus = Literal["pass", "fail", "documented", "skipped"]

#: Property names, in report order ("backward" appears only when gradients were not all checked).
PROPERTIES = ("contract", "inputs_unchanged", "masked_rows", "cache_write", "determinism", "backward")

#: Gradient name of each differentiable input.
GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg", "initial_state": "dh0"}



@dataclass
class PropertyResult:
    """One checked property. ``status``: "pass", "fail", "documented" (differs from the oracle's
    convention in the way the backend documents: reported, not failed) or "skipped"."""

    name: str
    status: PropertyStatus
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class CaseResult:
    """The verdict for one (backend, case, seed, device).

    ``tensors``: one report per compared tensor (out, lse, final_state, dq, ...);
    ``properties``: contract, inputs_unchanged, masked_rows, determinism;
    ``failures``: names of the failed tensors / properties (empty unless status is "fail");
    ``reason``: one line (the first failure, the unsupported reason, or the exception).
    """

    backend: str
    case: str
    family: str
    dtype: str
    device: str
    seed: int
    status: Status
    reason: str = ""
    tensors: list[TensorReport] = field(default_factory=list)
    properties: list[PropertyResult] = field(default_factory=list)
    seconds: float = 0.0
    error_traceback: str = ""
    #: set when the failure is a recorded third-party defect (harness.check.known_issues); status stays "fail"
    known_issue: str = ""
    #: where the seconds went: first_call_s (compiles, JIT and autotuning land here), second_call_s
    #: (the same call again: run time), judge_s; baseline_s when the caller built the oracle for it
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def compile_s(self) -> float | None:
        """First call less the second: what compilation, JIT and autotuning cost (None without both)."""
        a, b = self.timings.get("first_call_s"), self.timings.get("second_call_s")
        return None if a is None or b is None else max(0.0, a - b)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def failures(self) -> list[str]:
        return [t.name for t in self.tensors if not t.passed] + [p.name for p in self.properties if p.failed]

    @property
    def max_ratio(self) -> float | None:
        """Largest error / reference-error over the tensors (None when nothing was compared)."""
        return max((t.ratio for t in self.tensors), default=None)

    @property
    def max_budget(self) -> float | None:
        """Largest error / allowed over the tensors (<= 1 means every tensor is inside its bound)."""
        return max((t.budget for t in self.tensors), default=None)

    def tensor(self, name: str) -> TensorReport | None:
        return next((t for t in self.tensors if t.name == name), None)

    def property(self, name: str) -> PropertyResult | None:
        return next((p for p in self.properties if p.name == name), None)

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "case": self.case,
            "family": self.family,
            "dtype": self.dtype,
            "device": self.device,
            "seed": self.seed,
            "status": self.status,
            "reason": self.reason,
            "failures": self.failures,
            "max_ratio": tolerance._json_number(self.max_ratio),
            "max_budget": tolerance._json_number(self.max_budget),
            "seconds": round(self.seconds, 4),
            "tensors": [t.to_dict() for t in self.tensors],
            "properties": [p.to_dict() for p in self.properties],
            "error_traceback": self.error_traceback,
            "known_issue": self.known_issue,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> CaseResult:
        def num(v):
            if v == "inf":
                return math.inf
            if v == "-inf":
                return -math.inf
            return math.nan if v is None else v

        tensors = []
        for t in d.get("tensors", []):
            t = dict(t)
            w = t.pop("worst")
            worst = (
                WorstElement(tuple(w["index"]), *(num(w[k]) for k in ("value", "expected", "abs_error")))
                if w
                else None
            )
            for k in (
                "error",
                "reference_error",
                "factor",
                "floor",
                "allowed",
                "ratio",
                "budget",
                "max_abs_error",
            ):
                t[k] = num(t[k])
            tensors.append(TensorReport(**{**t, "shape": tuple(t["shape"]), "worst": worst}))
        return cls(
            backend=d["backend"],
            case=d["case"],
            family=d["family"],
            dtype=d["dtype"],
            device=d["device"],
            seed=d["seed"],
            status=d["status"],
            reason=d.get("reason", ""),
            tensors=tensors,
            properties=[PropertyResult(**p) for p in d.get("properties", [])],
            seconds=d.get("seconds", 0.0),
            error_traceback=d.get("error_traceback", ""),
            known_issue=d.get("known_issue", ""),
            timings=dict(d.get("timings") or {}),
        )

    def message(self) -> str:
        """Readable multi-line report: the verdict, then one line per tensor and property."""
        head = f"{self.backend} on {self.case} (seed {self.seed}, {self.device}): {self.status.upper()}"
        lines = [head + (f" - {self.reason}" if self.reason else "")]
        for t in self.tensors:
            lines.append(f"  [{'ok' if t.passed else 'FAIL'}] {t.summary()}")
        for p in self.properties:
            mark = {"pass": "ok", "fail": "FAIL", "documented": "doc", "skipped": "--"}[p.status]
            lines.append(f"  [{mark}] {p.name}: {p.detail}")
        if self.error_traceback:
            lines.append(self.error_traceback.rstrip())
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# One call, as the judge sees it
# --------------------------------------------------------------------------------------------


@dataclass
class _Run:
    output: object  # SoftmaxOutput | LinearOutput as returned
    tensors: dict[str, torch.Tensor]  # out, lse / final_state, grads; detached
    passed_inputs: dict[str, torch.Tensor]  # what the candidate received (to check mutation)
    missing_grads: tuple[str, ...] = ()  # inputs no gradient reached (their grads are zeros)
    #: device type of each output where it ran, when the tensors were moved since (the acceptance
    #: check's parent reads them back from the child's files); None: the tensors' own devices
    devices: dict[str, str] | None = None


def _run_inputs(case: Case, inputs) -> dict[str, torch.Tensor]:
    """The tensors ``adapter.run`` receives (no grad_out / grad_final_state)."""
    t = inputs.tensors()
    return {n: t[n] for n in RUN_INPUT_NAMES if n in t}


