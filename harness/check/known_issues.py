"""Known defects of other people's backends, found by this harness: the one list.

A backend that fails the tolerance engine on a case is a failure, and stays one, unless the
failure is recorded here with where it was seen and what was measured. A recorded failure is
reported as "known" (``python -m harness run`` shows it and does not count it toward the exit
status; the plugin's adapter matrix marks it xfail). The match is strict both ways: a recorded
defect that no longer reproduces fails the test suite, so a fixed backend gets its entry removed
instead of hiding a regression later. The evidence for each entry is in docs/known-issues.md.

Only *correctness* failures of third-party backends belong here, never the in-repo kernels.
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

    def matches(self, backend: str, case: Case, device) -> bool:
        if backend not in self.backends or not self.applies(case):
            return False
        return _arch(device) in self.archs

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
    return isinstance(case, LinearCase) and case.gate == "g" and case.gate_n <= 0.1


def _linear_fp32(case: Case) -> bool:
    return isinstance(case, LinearCase) and case.dtype == "fp32"


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
)


def lookup(backend: str, case: Case, device) -> KnownIssue | None:
    """The recorded defect of ``backend`` that covers ``case`` on ``device``, else None."""
    return next((k for k in KNOWN if k.matches(backend, case, device)), None)
