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
