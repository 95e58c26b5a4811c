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


def test_shards_partition_the_tests():
    from harness.multigpu import in_shard, parse_shard

    ids = [f"tests/x.py::test[{i}]" for i in range(200)]
    shards = [[t for t in ids if in_shard(t, (i, 3))] for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(ids) and all(shards)
    assert parse_shard("1/4") == (1, 4)
    with pytest.raises(ValueError, match="--attn-shard"):
        parse_shard("4/4")


def test_xdist_worker_pins_its_gpu(monkeypatch):
    from harness.multigpu import pin_xdist_worker

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("ATTN_HARNESS_PIN_GPUS", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert pin_xdist_worker() == "5"
    import os

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_merge_benchmark_json(tmp_path):
    import json

    from harness.multigpu import merge_benchmark_json

    for i in range(2):
        (tmp_path / f"p{i}.json").write_text(json.dumps({"machine_info": {"i": i}, "benchmarks": [{"fullname": f"t{i}"}]}))
    out = merge_benchmark_json([tmp_path / "p0.json", tmp_path / "p1.json"], tmp_path / "m.json")
    data = json.loads(out.read_text())
    assert [b["fullname"] for b in data["benchmarks"]] == ["t0", "t1"] and data["machine_info"] == {"i": 0}
    with pytest.raises(ValueError, match="two shards"):
        merge_benchmark_json([tmp_path / "p0.json", tmp_path / "p0.json"], tmp_path / "m2.json")
