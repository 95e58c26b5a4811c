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

from harness.cases import Case, DecodeCase, LinearCase, SoftmaxCase, case_from_id


@dataclass(frozen=True)
class KnownIssue:
    backends: tuple[str, ...]
    applies: Callable[[Case], bool]
    summary: str
    seen: str  # versions and device where it was measured
    #: GPU architectures it was measured on: elsewhere the backend may dispatch other kernels, so
    #: the entry does not apply (and cannot turn a pass there into an "unexpected pass").
    archs: tuple[str, ...] = ("sm90",)
    #: "fail" (a wrong result) or "error" (a crash); a result is this defect when its reason also
    #: contains ``signature`` (a crash's error text, or the failed check a wrong result names)
    outcome: str = "fail"
    signature: str = ""
    #: a case it was measured on (the strict re-check runs it) and the input seed it fails with
    #: (defects found by the fuzzer can depend on the values: its shrinks keep the fuzz's seed)
    example: Case | None = None
    seed: int = 0
    #: checks of the example the strict re-check may take: more than 1 for a defect that shows in
    #: some runs only (its first failing check counts)
    attempts: int = 1

    def matches(self, backend: str, case: Case, device) -> bool:
        if backend not in self.backends or not self.applies(case):
            return False
        return _arch(device) in self.archs

    def explains(self, status: str, reason: str) -> bool:
        """Whether a result with ``status`` and ``reason`` is this defect (a crash: its signature)."""
        return status == self.outcome and self.signature in (reason or "")

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


def _rows_without_a_key_half(case: Case) -> bool:
    """Dense fp16/bf16 cases where the first query rows see no key: bottom-right alignment with more
    queries than keys and a right bound (causal: 0, or a window's right side) that leaves row 0 short:
    row i sees keys up to i + (Sk - Sq) + right. cuDNN attention runs fp16/bf16 only: in fp32 the
    default dispatch picks another kernel (passes)."""
    if not isinstance(case, SoftmaxCase) or case.is_varlen or case.dtype not in ("fp16", "bf16"):
        return False
    right = 0 if case.causal else case.window[1]
    return right >= 0 and case.seqlen_q - case.seqlen_k > right


def _fa4_dq_head_dims_past_one_block(case: Case) -> bool:
    # shrunk on the H100 (session 10): head dim 40 / 48 (80 shrinks to 40), more than 64 query rows
    # (65 fails, 64 passes), 2-3 keys are enough; GQA, causal, softcap not needed. 24, 64, 96, 128 pass.
    if not isinstance(case, SoftmaxCase) or case.d not in (40, 48, 80):
        return False
    rows = [q for q, _ in case.varlen] if case.is_varlen else [case.seqlen_q]
    return max(rows, default=0) > 64


def _head_dim_16(case: Case) -> bool:
    return isinstance(case, SoftmaxCase) and case.d == 16


def _strong_per_step_decay(case: Case) -> bool:
    # shrunk on the H100 (docs/repro/fla/): the decay and the final state's gradient are both needed
    return isinstance(case, LinearCase) and case.gate == "g" and case.gate_n <= 0.1 and case.grad_final_state


def _per_step_decay_long_with_dht(case: Case) -> bool:
    # shrunk on the H100 (session 13, docs/repro/fla-dg-long/): the per-step gate (n=1) and the final
    # state's gradient both needed, the initial state not; the dg error grows with the sequence (at
    # 1000-2000 steps 10.1-10.3x on some inputs, 12-14.5x at 4000-8000), measured at n=1 only
    return (isinstance(case, LinearCase) and case.gate == "g" and case.gate_n == 1.0 and case.grad_final_state
            and case.seqlen >= 1000)


def _strong_constant_decay_d_k_not_d_v(case: Case) -> bool:
    # shrunk on the H100 (session 10): the decay and d_k != d_v both needed, more than one 64-step chunk
    return (isinstance(case, LinearCase) and case.gate == "g_gamma" and case.gate_n <= 0.1
            and case.d_k != case.d_v and case.seqlen > 64)


def _decode_d_v_not_d(case: Case) -> bool:
    return isinstance(case, DecodeCase) and case.d_v != case.d


def _the_cudnn_decode_repeat_case(case: Case) -> bool:
    # value-dependent (docs/repro/sdpa-cudnn-decode/): other random inputs of the same shapes repeat
    # bitwise, so the entry covers the one case it was found on
    return isinstance(case, DecodeCase) and case.id == "B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16"


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
        applies=_rows_without_a_key_half,
        summary="torch SDPA's cuDNN backend, bottom-right masks with more queries than keys (causal, or a "
        "window whose right side leaves the first rows short): the query rows that see no key are not "
        "zero (out error 0.26-0.7 rel-RMS) and dq/dk/dv take gradient from them",
        seen="torch 2.11.0+cu130, cuDNN 9.19, H100, fp16/bf16, B1-H4/1-S70x33-D16-causal, "
        "B1-H3-S359x15-D128-win0x8 (fuzzer, session 10)",
        example=case_from_id("B1-H1-S11x2-D16-win0x8-bf16"),
    ),
    KnownIssue(
        backends=("flash_attn_cute",),
        applies=_head_dim_16,
        summary="flash-attn-4 at head dim 16: dq is 0 on rows where it is not (dq error 108-683x the "
        "eager reference's); out, dk, dv pass",
        seen="flash-attn-4 4.0.0b36, cutlass-dsl 4.8.1, H100, fp16/bf16, B1-H4/1-S70x33-D16-causal",
    ),
    KnownIssue(
        backends=("flash_attn_cute",),
        applies=_fa4_dq_head_dims_past_one_block,
        summary="flash-attn-4 at head dim 40, 48 or 80 with more than 64 query rows: dq wrong (46-1512x "
        "the eager reference's error); out, dk, dv pass",
        seen="flash-attn-4 4.0.0b36, cutlass-dsl 4.8.1, H100, fp16/bf16, fuzzer (session 10): "
        "B2-H4/1-S119x2031-D80-causal, B4-H32/2-S183x17-D48-cap50, varlen D80",
        example=case_from_id("B1-H1-S65x3-D48-bf16"),
    ),
    KnownIssue(
        backends=("fla_fused_chunk",),
        applies=_strong_per_step_decay,
        summary="fla fused_chunk_simple_gla, strong per-step decay (log-sigmoid(x)/0.1): dg error "
        "42-67x the eager reference's (allowed 10x); out, state, dq, dk, dv pass",
        seen="fla-core 0.6.0, triton 3.6.0, H100, fp16/bf16, B1-H2-T63-K32V32-g(n=0.1)",
    ),
    KnownIssue(
        backends=("fla_fused_chunk",),
        applies=_per_step_decay_long_with_dht,
        summary="fla fused_chunk_simple_gla, per-step decay (log-sigmoid, n=1) with the final state's gradient "
        "over 1000+ steps: the dg error grows with the sequence, 10-14.5x the eager reference's (allowed 10x; "
        "3.4e-2 rel-RMS at 7999 steps, where the in-repo kernel's is 0.02x the reference's); out, state, "
        "dq, dk, dv pass",
        seen="fla-core 0.6.0, triton 3.6.0, H100, bf16, fuzzer (session 10): B4-H4-T1998-K64V64-g(n=1)-h0-dhT; "
        "B4-H4-T4000 / T8000 (sessions 11, 13)",
        example=case_from_id("B1-H1-T7999-K64V64-g(n=1)-dhT-bf16"),
        seed=7,  # the shrink's seed (docs/repro/fla-dg-long/): 14.5x; at seed 202000615 this example passes (3.0x)
    ),
    KnownIssue(
        backends=("fla_fused_chunk",),
        applies=_strong_constant_decay_d_k_not_d_v,
        summary="fla fused_chunk_simple_gla, strong constant decay (g_gamma, log-sigmoid/0.1) with d_k != d_v "
        "and more than 64 steps: the final state is NaN (every element); out, dq, dk, dv pass",
        seen="fla-core 0.6.0, triton 3.6.0, H100, fp16, fuzzer (session 10): B3-H4-T1239-K64V32-g_gamma(n=0.1), "
        "B2-H1-T65-K32V128-g_gamma(n=0.1)-h0-dhT",
        example=case_from_id("B2-H1-T65-K16V128-g_gamma(n=0.1)-fp16"),
        seed=202000614,  # the shrink's seed (docs/repro/fla-gamma/); at seed 0 this example passes (H100, session 11)
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
    KnownIssue(
        backends=("decode_sdpa",),  # torch SDPA's default dispatch picks cuDNN for it on the H100
        applies=_the_cudnn_decode_repeat_case,
        signature="differs between two runs",
        summary="torch SDPA's cuDNN backend on one decode call's values (q 4x8x192 over 727 keys, one kv head "
        "expanded, fp16, scale 1/16): identical calls on the same tensors give one of two outputs (8-12 "
        "of 19 differ, by 1.5e-5); EFFICIENT and MATH repeat; other random values of the same shapes repeat",
        seen="torch 2.11.0+cu130, cuDNN 9.19, H100, fp16, fuzzer (session 10), standalone repro (session 13)",
        example=case_from_id("B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16"),
        seed=202000607,
        attempts=12,  # a determinism check sees it about half the time: 12 checks all passing is ~1 in 4000
    ),
    KnownIssue(
        backends=("flash_attn_cute_decode",),
        applies=_decode_d_v_not_d,
        outcome="error",
        signature="illegal memory access",
        summary="flash-attn-4's varlen call over a KV cache with d_v != d (seqused_k, paged or not): "
        "'CUDA error: an illegal memory access', sticky; with d_v == d it passes",
        seen="flash-attn-4 4.0.0b36, cutlass-dsl 4.8.1, H100, bf16/fp16, fuzzer (session 10): "
        "D16v128, D16v80, D32v96",
        example=case_from_id("B1-H1-Q1-L0-contig-D32v96-bf16"),
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
