"""The list of known third-party defects: what each entry covers, and how a run reports one."""

import pytest
import torch

from harness.cases import LinearCase, SoftmaxCase
from harness.check import matrix
from harness.check.known_issues import KNOWN, lookup
from harness.check.verify import CaseResult

CUDNN_CASE = SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True, dtype="bf16")


@pytest.fixture
def on_sm90(monkeypatch):
    """A CUDA device of the architecture the entries were measured on (an H100), on any machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def test_entries_cover_what_was_measured_and_nothing_else(on_sm90, monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert lookup("sdpa_cudnn", CUDNN_CASE, cuda) and lookup("sdpa", CUDNN_CASE, cuda)
    assert lookup("sdpa_cudnn", CUDNN_CASE, cpu) is None  # measured on the GPU only
    assert lookup("sdpa_flash", CUDNN_CASE, cuda) is None
    assert lookup("sdpa_cudnn", SoftmaxCase(1, 4, 1, 33, 70, 16, causal=True, dtype="bf16"), cuda) is None
    assert lookup("flash_attn_cute", CUDNN_CASE, cuda)
    assert lookup("flash_attn_cute", SoftmaxCase(1, 4, 1, 70, 33, 32, causal=True), cuda) is None
    assert lookup("sdpa", SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True, dtype="fp32"), cuda) is None  # no cuDNN in fp32
    strong = LinearCase(1, 2, 63, 32, gate="g", gate_n=0.1, dtype="fp16")
    assert lookup("fla_fused_chunk", strong, cuda) and not lookup("fla_chunk", strong, cuda)
    assert lookup("fla_fused_chunk", LinearCase(1, 2, 63, 32, gate="g", gate_n=1.0, dtype="bf16"), cuda) is None
    no_dht = LinearCase(1, 2, 63, 32, gate="g", gate_n=0.1, grad_final_state=False, dtype="fp16")
    assert lookup("fla_fused_chunk", no_dht, cuda) is None  # the shrinker: without dhT it passes
    fp32 = LinearCase(1, 2, 70, 32, gate="g_gamma", dtype="fp32")  # TF32 products
    assert lookup("fla_chunk", fp32, cuda) and lookup("fla_fused_chunk", fp32, cuda)
    assert lookup("fla_recurrent", fp32, cuda) is None and lookup("fla_chunk", LinearCase(1, 2, 70, 32, dtype="fp16"), cuda) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert lookup("sdpa_cudnn", CUDNN_CASE, cuda) is None  # measured on sm90 only
    # never the in-repo kernels: their failures are ours to fix
    assert not any({"triton_fa", "triton_la_chunk"} & set(k.backends) for k in KNOWN)


def test_main_job_reports_a_known_defect_without_failing_the_run(on_sm90):
    r = CaseResult("sdpa_cudnn", CUDNN_CASE.id, "softmax", "bf16", "cuda:0", 0, "fail", "out: error 0.7")
    ok = CaseResult("eager", CUDNN_CASE.id, "softmax", "bf16", "cuda:0", 0, "pass")
    matrix.mark_known_issues([r, ok], [CUDNN_CASE], torch.device("cuda", 0))
    assert "known defect" in r.known_issue and not ok.known_issue
    summary = matrix.summary([r, ok])
    assert summary["known"] == 1 and summary["fail"] == 0
    row = matrix._rows([r, ok])[0]
    assert row[2] == "known" and "docs/known-issues.md" in row[4]


OFFSET = SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset", dtype="fp16")


def test_misaligned_start_entries_cover_their_backends_and_dtypes_only(on_sm90):
    cuda = torch.device("cuda")
    flash = lookup("sdpa_flash", OFFSET, cuda)
    assert flash and flash.crash and flash.signature == "misaligned address"
    assert lookup("sdpa_flash", SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True), cuda) is None  # aligned
    assert lookup("sdpa_efficient", OFFSET, cuda) is None  # fp16: a clean refusal, not a defect
    fp32 = SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset", dtype="fp32")
    assert lookup("sdpa_efficient", fp32, cuda).crash
    wrong = lookup("sdpa_cudnn", OFFSET, cuda)
    assert wrong and not wrong.crash and lookup("sdpa", OFFSET, cuda) is wrong
    assert lookup("flash_attn_cute", OFFSET, cuda) is None and lookup("flex", OFFSET, cuda) is None
    recurrent = LinearCase(1, 2, 40, 32, gate="g_gamma", scale=0.0625, layout="transposed", dtype="fp32")
    assert lookup("fla_recurrent", recurrent, cuda)
    assert lookup("fla_recurrent", LinearCase(1, 2, 40, 32, gate="g_gamma", layout="transposed", dtype="fp32"), cuda) is None
    assert lookup("fla_recurrent", LinearCase(1, 2, 40, 32, gate="g_gamma", scale=0.0625, dtype="fp32"), cuda) is None
    for k in KNOWN:  # every entry's example is a case it covers
        assert k.example is None or any(k.matches(b, k.example, cuda) for b in k.backends), k.summary


def test_a_recorded_crash_is_known_only_with_its_signature(on_sm90):
    device = torch.device("cuda", 0)
    crash = CaseResult("sdpa_flash", OFFSET.id, "softmax", "fp16", "cuda:0", 0, "error",
                       "run raised AcceleratorError: CUDA error: misaligned address")
    other = CaseResult("sdpa_flash", OFFSET.id, "softmax", "fp16", "cuda:0", 0, "error",
                       "run raised RuntimeError: CUDA out of memory")
    wrong = CaseResult("sdpa_flash", OFFSET.id, "softmax", "fp16", "cuda:0", 0, "fail", "out: error 1.4")
    matrix.mark_known_issues([crash, other, wrong], [OFFSET], device)
    assert "misaligned address" in crash.known_issue and not other.known_issue and not wrong.known_issue
    assert matrix.summary([crash, other, wrong]) == {"pass": 0, "fail": 1, "error": 1, "unsupported": 0, "known": 1}


_RECHECK = """
import json, sys, torch
from harness.adapters import registry
from harness.cases import case_from_id
from harness.check import matrix
for _ in range(int(sys.argv[4])):  # an intermittent defect: up to this many checks, the first failing one counts
    r = matrix._verify_one(registry.get(sys.argv[1]), case_from_id(sys.argv[2]), int(sys.argv[3]), torch.device("cuda"), True)
    if r.status != "pass":
        break
print(json.dumps({"status": r.status, "reason": r.reason}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the recorded defects were measured on a GPU (an H100)")
@pytest.mark.parametrize("entry", [k for k in KNOWN if k.example is not None], ids=lambda k: k.backends[0])
def test_recorded_defect_still_reproduces_in_a_process_of_its_own(entry):
    """Strict both ways for the entries with an example, crashes included: each backend runs the
    example in a fresh process (a sticky crash must not take this one's CUDA context)."""
    import json
    import subprocess
    import sys

    device = torch.device("cuda")
    if not entry.matches(entry.backends[0], entry.example, device):
        pytest.skip(f"measured on {', '.join(entry.archs)}; this GPU is another architecture")
    for backend in entry.backends:
        run = subprocess.run([sys.executable, "-c", _RECHECK, backend, entry.example.id, str(entry.seed),
                              str(entry.attempts)], capture_output=True, text=True, timeout=300)
        got = json.loads(run.stdout.strip().splitlines()[-1])
        if got["status"] == "unsupported":
            pytest.skip(f"{backend}: {got['reason']}")
        assert entry.explains(got["status"], got["reason"]), (
            f"recorded defect no longer reproduces for {backend} ({got['status']}: {got['reason']}): "
            f"remove it from harness/check/known_issues.py: {entry.summary}")


def test_session_10_fuzz_entries_cover_their_minimal_triggers_only(on_sm90):
    from harness.cases import case_from_id

    cuda = torch.device("cuda")
    known = lambda backend, case_id: lookup(backend, case_from_id(case_id), cuda)  # noqa: E731
    # cuDNN: the first rows see no key (causal, or a window's right side) -- 10 queries over 2 keys pass
    assert known("sdpa_cudnn", "B1-H1-S11x2-D16-win0x8-bf16") and known("sdpa", "B1-H3-S359x15-D128-win0x8-bf16")
    assert known("sdpa_cudnn", "B1-H1-S10x2-D16-win0x8-bf16") is None
    assert known("sdpa_cudnn", "B1-H1-S11x2-D16-win8x-1-bf16") is None  # no right bound: every row sees keys
    # flash-attn-4 dq: head dim 40 / 48 / 80 past 64 query rows (64 passes; 64 and 96 are fine dims)
    assert known("flash_attn_cute", "B1-H1-S65x3-D48-bf16") and known("flash_attn_cute", "B1-H1-S65x2-D40-fp16")
    assert known("flash_attn_cute", "B2-H2/1-varlen[7x33,1947x97]-D80-causal-scale1-offset-fp16")
    assert known("flash_attn_cute", "B1-H1-S64x3-D48-bf16") is None
    assert known("flash_attn_cute", "B1-H1-S65x3-D96-bf16") is None
    # FLA fused_chunk: strong constant decay, d_k != d_v, more than one 64-step chunk
    assert known("fla_fused_chunk", "B2-H1-T65-K16V128-g_gamma(n=0.1)-fp16")
    assert known("fla_fused_chunk", "B2-H1-T64-K16V128-g_gamma(n=0.1)-fp16") is None
    assert known("fla_fused_chunk", "B2-H1-T65-K64V64-g_gamma(n=0.1)-fp16") is None
    assert known("fla_chunk", "B2-H1-T65-K16V128-g_gamma(n=0.1)-fp16") is None
    # FLA fused_chunk dg over long sequences (session 13's shrink): per-step gate n=1, dhT, 1000+ steps
    assert known("fla_fused_chunk", "B1-H1-T7999-K64V64-g(n=1)-dhT-bf16")
    assert known("fla_fused_chunk", "B4-H4-T1998-K64V64-g(n=1)-h0-dhT-bf16")
    assert known("fla_fused_chunk", "B1-H1-T999-K64V64-g(n=1)-dhT-bf16") is None
    assert known("fla_fused_chunk", "B1-H1-T7999-K64V64-g(n=1)-bf16") is None  # without dhT it passes
    assert known("fla_chunk", "B1-H1-T7999-K64V64-g(n=1)-dhT-bf16") is None
    # torch SDPA cuDNN's non-repeatable decode forward: that case only (its values matter), and only
    # a determinism failure is that defect
    cudnn_decode = known("decode_sdpa", "B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16")
    assert cudnn_decode and cudnn_decode.attempts > 1
    assert cudnn_decode.explains("fail", "determinism: forward differs between two runs: max |diff| 1.5e-05")
    assert not cudnn_decode.explains("fail", "out: error 0.3 is 50x the reference's")
    assert known("decode_sdpa", "B4-H8/1-Q1-L725-P64-new-D192-scale0.0625-fp16") is None
    # flash-attn-4's decode path crashes with d_v != d only
    crash = known("flash_attn_cute_decode", "B1-H1-Q1-L0-contig-D32v96-bf16")
    assert crash and crash.crash and crash.signature == "illegal memory access"
    assert known("flash_attn_cute_decode", "B1-H1-Q1-L0-contig-D32-bf16") is None
