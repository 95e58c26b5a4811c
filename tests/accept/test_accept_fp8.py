"""``python -m harness accept --profile fp8`` (CPU-sized: fp8-cpu): a right FP8 callable is accepted;
one that ignores a descale, one that reads a single descale for per-head factors, and a kernel
without an FP8 path are rejected, each for its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import cli

IMPLS = Path(__file__).resolve().parent / "impls"


def accept(tmp_path, monkeypatch, impl):
    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    code = cli.main(["accept", "--device", "cpu", "--jobs", "2", "--profile", "fp8", "--impl", impl, "--out", str(out)])
    return code, json.loads((out / "report.json").read_text())


def test_a_right_fp8_kernel_is_accepted(tmp_path, monkeypatch):
    code, rep = accept(tmp_path, monkeypatch, "fp8_impls:correct")
    assert code == 0 and rep["verdict"] == "ACCEPTED", rep["reasons"]
    assert rep["profile"]["name"] == "fp8-cpu" and all("e4m3" in c["case"] for c in rep["cases"])


@pytest.mark.parametrize("impl, words", [
    ("fp8_impls:ignores_v_descale", "out"),
    ("fp8_impls:reads_one_descale", "perhead"),
    ("correct_softmax:flash_attn_func", "FP8"),
])
def test_wrong_or_missing_fp8_is_rejected(tmp_path, monkeypatch, impl, words):
    code, rep = accept(tmp_path, monkeypatch, impl)
    assert code == 1 and rep["verdict"] == "REJECTED"
    assert any(words in r for r in rep["reasons"]), rep["reasons"]


def test_the_fp8_speed_section_times_the_fp8_peers(tmp_path, monkeypatch):
    # --speed on a CPU (host time): the FP8 bench case timed beside the FP8 reference; the bf16
    # baselines are listed as refusing FP8 cases
    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    code = cli.main(["accept", "--device", "cpu", "--jobs", "2", "--profile", "fp8", "--impl", "fp8_impls:correct",
                     "--speed", "--out", str(out)])
    rep = json.loads((out / "report.json").read_text())
    assert code == 0 and rep["speed"]["status"] == "measured", rep["speed"]
    (case,) = rep["speed"]["cases"]
    rows = {r["backend"]: r for r in case["rows"]}
    assert "e4m3" in case["case"] and rows["fp8_impls:correct"]["modes"]["fwd"]["median_ms"] > 0
    assert rows["eager_fp8"]["modes"]["fwd"]["median_ms"] > 0 and "FP8" in rows["sdpa_math"]["unsupported"]


@pytest.mark.parametrize("impl, verdict", [
    ("fp8_impls:training", "ACCEPTED"),
    ("fp8_impls:training_ignores_do_descale", "REJECTED"),
    ("fp8_impls:correct", "REJECTED"),  # no FP8 backward declared: the profile requires one
])
def test_fp8_training_accepts_a_right_fp8_backward_only(tmp_path, monkeypatch, impl, verdict):
    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    code = cli.main(["accept", "--device", "cpu", "--jobs", "2", "--profile", "fp8-training", "--impl", impl,
                     "--out", str(out)])
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == verdict and code == (0 if verdict == "ACCEPTED" else 1), rep["reasons"]
    assert rep["profile"]["name"] == "fp8-training-cpu"
    if impl.endswith("do_descale"):
        assert any("dq" in r or "dv" in r for r in rep["reasons"]), rep["reasons"]
    if impl.endswith("correct"):
        assert any("FP8 backward" in r for r in rep["reasons"]), rep["reasons"]
