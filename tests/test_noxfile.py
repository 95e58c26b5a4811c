"""The nox sessions: the matrix ids, and gpu-tests failing loudly on a machine without a GPU."""

import subprocess
import sys

import pytest
import torch

from harness.arch import ARCHS, DTYPES, REQUIRED, arch_of, required_backends


def _nox(*args):
    return subprocess.run([sys.executable, "-m", "nox", *args], capture_output=True, text=True, timeout=120)


def test_sessions_and_matrix_ids():
    pytest.importorskip("nox")
    out = _nox("-l").stdout
    for name in ("tests", "bench", "bench-compare", "golden", "accept", "lint"):
        assert f" {name} " in out or f" {name}\n" in out or f"* {name}" in out or f"- {name}" in out, name
    for dt in DTYPES:
        for arch in ARCHS:
            assert f"gpu-tests(dtype='{dt}', arch='{arch}')" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a machine without a GPU")
def test_gpu_tests_fail_without_a_gpu():
    pytest.importorskip("nox")
    res = _nox("--no-venv", "-s", "gpu-tests(dtype='bf16', arch='sm90')")
    assert res.returncode != 0
    assert "needs a CUDA device and none is visible" in res.stdout + res.stderr


def test_required_backends_table():
    assert arch_of((9, 0)) == "sm90" and arch_of((12, 0)) == "sm120"
    sm90 = required_backends("sm90", "bf16")
    assert {"sdpa_flash", "sdpa_cudnn", "triton_fa", "triton_la_chunk"} <= set(sm90)
    assert "sdpa_flash" not in REQUIRED[("sm90", "fp32")]  # FA2 has no fp32 path
    with pytest.raises(ValueError, match="arch"):
        required_backends("sm70", "bf16")
