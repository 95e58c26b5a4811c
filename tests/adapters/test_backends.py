"""Every registered adapter that runs on this machine, across the small presets, via the plugin.

On CPU: eager, eager_linear, sdpa_math (and torch's CPU flash / default dispatch), the in-repo
Triton kernels under the interpreter (fp32 / fp16; bf16 is skipped with the interpreter's
reason). With CUDA: every adapter in fp16 / bf16 / fp32. Unsupported pairs are skipped with the
adapter's own reason; the parametrisation (--attn-backends / --attn-dtypes / --attn-preset /
--attn-seed) comes from the plugin.
"""

import os

import pytest

from harness.check.known_issues import lookup

pytestmark = pytest.mark.matrix


def _interpreted(adapter, device) -> bool:
    """The in-repo Triton kernels on CPU run in Triton's interpreter, one program at a time: a
    second run for determinism proves nothing there and doubles the suite's slowest tests."""
    return (
        device.type == "cpu"
        and os.environ.get("TRITON_INTERPRET") == "1"
        and adapter.__module__.endswith(".inrepo")
    )


def test_backend_matches_oracle(attn_check, attn_adapter, attn_case, attn_device):
    kw = {"check_determinism": not _interpreted(attn_adapter, attn_device)}
    known = lookup(attn_adapter.name, attn_case, attn_device)
    if known and known.crash:  # a sticky crash would take this test process's CUDA context with it
        pytest.xfail(f"not run here: {known.describe()}; re-checked in a process of its own by "
                     "tests/check/test_known_issues.py")
    if known:  # strict both ways: it must still fail, and then it is an expected failure
        result = attn_check.run(attn_adapter, attn_case, **kw)
        if result.status == "unsupported":
            pytest.skip(f"{result.backend}: {result.reason}")
        assert result.status == "fail", (
            f"recorded defect no longer reproduces ({result.status}): remove it from harness/check/known_issues.py: "
            f"{known.summary}"
        )
        pytest.xfail(known.describe())
    result = attn_check(attn_adapter, attn_case, **kw)
    assert result.status == "pass"
    assert result.tensors, "a passing result compared at least one tensor"
    assert all(t.passed for t in result.tensors)
