"""Known defects of other people's backends, found by this harness: the one list.

A backend that fails the tolerance engine on a case is a failure, and stays one, unless the
failure is recorded here with where it was seen and what was measured. A recorded failure is
reported as "known" (``python -m harness run`` shows it and does not count it toward the exit
status; the plugin's adapter matrix marks it xfail). The match is strict both ways: a recorded
defect that no longer reproduces fails the test suite, so a fixed backend gets its entry removed
instead of hiding a regression later. The evidence for each entry is in docs/known-issues.md.

Two kinds of entry: a *wrong result* (``outcome="fail"``: the tolerance engine rejects it) and a
*crash* (``outcome="error"``: the call raises, and ``signature`` is text its error must contain).
A crash that is sticky (a lost CUDA context) takes its process with it, so the plugin's adapter
matrix does not run recorded crashes in its own process (xfail, not run); the strict re-check
runs each entry's ``example`` in a process of its own (tests/check/test_known_issues.py, GPU).
The main job runs them like any pair: its worker pool replaces the process that crashed.

Only third-party backends belong here, never the in-repo kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.cases import Case, LinearCase, SoftmaxCase


@dataclass(frozen=True)
class KnownIssue:
    backends: tuple[str, ...]
    applies: Callable[[Case], bool]
    summary: str
    seen: str  # versions and device where it was measured
    #: GPU architectures it was measured on: elsewhere the backend may dispatch other kernels, so
    #: the entry does not apply (and cannot turn a pass there into an "unexpected pass").
    archs: tuple[str, ...] = ("sm90",)
    #: "fail" (a wrong result) or "error" (a crash: the error text contains ``signature``)
    outcome: str = "fail"
    signature: str = ""
    #: a case it was measured on (the strict re-check runs it)
    example: Case | None = None

    def matches(self, backend: str, case: Case, device) -> bool:
        if backend not in self.backends or not self.applies(case):
            return False
        return _arch(device) in self.archs

    def explains(self, status: str, reason: str) -> bool:
        """Whether a result with ``status`` and ``reason`` is this defect (a crash: its signature)."""
        return status == self.outcome and (self.outcome == "fail" or self.signature in (reason or ""))

    @property
    def crash(self) -> bool:
        return self.outcome == "error"

    def describe(self) -> str:
        return f"known defect: {self.summary} (seen: {self.seen}; docs/known-issues.md)"


def _arch(device) -> str | None:
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    from harness.arch import arch_of

    return arch_of(torch.cuda.get_device_capability(device))


def _causal_more_queries_than_keys_half(case: Case) -> bool:
    # cuDNN attention runs fp16/bf16 only: in fp32 the default dispatch picks another kernel (passes)
    return (isinstance(case, SoftmaxCase) and case.causal and not case.is_varlen
            and case.seqlen_q > case.seqlen_k and case.dtype in ("fp16", "bf16"))


def _head_dim_16(case: Case) -> bool:
    return isinstance(case, SoftmaxCase) and case.d == 16


def _strong_per_step_decay(case: Case) -> bool:
    # shrunk on the H100 (docs/repro/fla/): the decay and the final state's gradient are both needed
    return isinstance(case, LinearCase) and case.gate == "g" and case.gate_n <= 0.1 and case.grad_final_state


def _linear_fp32(case: Case) -> bool:
    return isinstance(case, LinearCase) and case.dtype == "fp32"


def _misaligned(dtypes: tuple[str, ...]) -> Callable[[Case], bool]:
    """Softmax cases whose q, k, v start off a 16-byte boundary (the ``offset`` layout), in ``dtypes``."""
    return lambda case: isinstance(case, SoftmaxCase) and case.layout == "offset" and case.dtype in dtypes


def _recurrent_fp32_scaled_transposed(case: Case) -> bool:
    # measured on exactly this combination; which of the three triggers it is not known yet
    return (isinstance(case, LinearCase) and case.dtype == "fp32" and case.layout == "transposed"
            and case.scale is not None)


_OFFSET = SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset", dtype="fp16")  # the presets' misaligned case


KNOWN: tuple[KnownIssue, ...] = (  # all measured on one H100 (sm90)
    KnownIssue(
        backends=("sdpa_cudnn", "sdpa"),  # the default dispatch picks cuDNN for this case on the H100
        applies=_causal_more_queries_than_keys_half,
        summary="torch SDPA's cuDNN backend, bottom-right causal with more queries than keys: the query "
        "rows that see no key are not zero (out error ~0.6 rel-RMS) and dk/dv take gradient from them",
        seen="torch 2.11.0+cu130, cuDNN 9.19, H100, fp16/bf16, B1-H4/1-S70x33-D16-causal",
    ),
    KnownIssue(
        backends=("flash_attn_cute",),
        applies=_head_dim_16,
        summary="flash-attn-4 at head dim 16: dq is 0 on rows where it is not (dq error 108-683x the "
        "eager reference's); out, dk, dv pass",
        seen="flash-attn-4 4.0.0b36, cutlass-dsl 4.8.1, H100, fp16/bf16, B1-H4/1-S70x33-D16-causal",
    ),
    KnownIssue(
        backends=("fla_fused_chunk",),
        applies=_strong_per_step_decay,
        summary="fla fused_chunk_simple_gla, strong per-step decay (log-sigmoid(x)/0.1): dg error "
        "42-67x the eager reference's (allowed 10x); out, state, dq, dk, dv pass",
        seen="fla-core 0.6.0, triton 3.6.0, H100, fp16/bf16, B1-H2-T63-K32V32-g(n=0.1)",
    ),
    KnownIssue(
        backends=("fla_chunk", "fla_fused_chunk"),
        applies=_linear_fp32,
        summary="fla chunk / fused_chunk kernels with fp32 inputs multiply in TF32 (Triton's default dot "
        "precision, 10-bit mantissa): every output ~1.5e-3 rel-RMS, 2500-9700x an fp32 reference's "
        "error; fla's fused_recurrent (no tensor-core dots) passes",
        seen="fla-core 0.6.0, triton 3.6.0, H100, fp32, every gate (T33-T127, K32-64)",
    ),
    KnownIssue(
        backends=("sdpa_flash",),
        applies=_misaligned(("fp16", "bf16")),
        outcome="error",
        signature="misaligned address",
        summary="torch SDPA's flash backend with q, k, v starting off a 16-byte boundary: the kernel "
        "crashes with 'CUDA error: misaligned address', and the error is sticky (the process's CUDA "
        "context is lost); torch's dispatcher does not check the alignment",
        seen="torch 2.11.0+cu130, H100, fp16/bf16, B1-H4/2-S26x26-D32-causal-offset",
        example=_OFFSET,
    ),
    KnownIssue(
        backends=("sdpa_efficient",),
        applies=_misaligned(("fp32",)),
        outcome="error",
        signature="misaligned address",
        summary="torch SDPA's memory-efficient backend in fp32 with q, k, v starting off a 16-byte "
        "boundary: 'CUDA error: misaligned address', sticky (in fp16 / bf16 it refuses the case "
        "cleanly: 'p.query_ptr is not correctly aligned')",
        seen="torch 2.11.0+cu130, H100, fp32, B1-H4/2-S26x26-D32-causal-offset",
        example=SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset", dtype="fp32"),
    ),
    KnownIssue(
        backends=("sdpa_cudnn", "sdpa"),  # the default dispatch picks cuDNN for this case on the H100
        applies=_misaligned(("fp16", "bf16")),
        summary="torch SDPA's cuDNN backend with q, k, v starting off a 16-byte boundary: silently "
        "wrong (out error 1.39 rel-RMS, 543-4282x the reference's; dq, dk, dv wrong too)",
        seen="torch 2.11.0+cu130, cuDNN 9.19, H100, fp16/bf16, B1-H4/2-S26x26-D32-causal-offset",
        example=_OFFSET,
    ),
    KnownIssue(
        backends=("fla_recurrent",),
        applies=_recurrent_fp32_scaled_transposed,
        summary="fla fused_recurrent_simple_gla in fp32 with a scale passed and transposed (non-contiguous) "
        "inputs: final_state 5.27x the reference's error (allowed 3x), dk, dv, dh0 too; small in absolute "
        "terms (6.3e-7 rel-RMS); not yet known whether the layout or the scale triggers it",
        seen="fla-core 0.6.0, triton 3.6.0, H100, fp32, B1-H2-T40-K32V32-g_gamma(n=1)-scale0.0625-transposed",
        example=LinearCase(1, 2, 40, 32, gate="g_gamma", scale=0.0625, layout="transposed", dtype="fp32"),
    ),
)


def lookup(backend: str, case: Case, device) -> KnownIssue | None:
    """The recorded defect of ``backend`` that covers ``case`` on ``device``, else None."""
    return next((k for k in KNOWN if k.matches(backend, case, device)), None)


def explaining(backend: str, case: Case, device, status: str, reason: str) -> KnownIssue | None:
    """The recorded defect that explains a result of ``backend`` on ``case`` (its status, and for a
    crash the signature in ``reason``), else None."""
    issue = lookup(backend, case, device)
    return issue if issue is not None and issue.explains(status, reason) else None
