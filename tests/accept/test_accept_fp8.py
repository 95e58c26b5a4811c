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
    # the baselines that refused were asked again on the FP8-output twin, in their child, and refused it too
    assert not case["notes"] and not any(name.endswith("(FP8 out)") for name in rows), case["notes"]


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


def test_the_speed_section_times_fp8_output_only_peers_on_the_cases_twin():
    """cuDNN's FP8 graph builds only with FP8 output on Hopper (and its FP8 backward only after it): for an
    FP8 case with bf16 output, the peers timed in no mode are asked again on the case's FP8-output twin
    (same inputs, FLOPs), and a peer timed there replaces its row as "<name> (FP8 out)", with a ratio
    against the candidate and a note naming the twin; nothing is asked for non-FP8 or FP8-output cases."""
    from harness.accept import speed
    from harness.cases import case_from_id

    case = case_from_id("B4-H16-S4096x4096-D128-causal-e4m3-grad_e4m3-bf16")
    cell = lambda ms: {"median_ms": ms, "spread": 0.01, "reps": 10, "clock": "cuda-events"}  # noqa: E731
    rows = [{"backend": "mine", "candidate": True, "modes": {"fwd": cell(0.5), "bwd": cell(1.7)}},
            {"backend": "sdpa_cudnn", "candidate": False, "unsupported": "FP8 (e4m3) inputs: not a path"},
            {"backend": "cudnn_fp8", "candidate": False,
             "unsupported": "cuDNN's FP8 backward takes its forward's FP8 output: fp8_grad cases with fp8_out only"},
            {"backend": "triton_fa_fp8", "candidate": False, "modes": {"fwd": cell(0.5), "bwd": cell(1.68)}}]
    twin, names = speed.fp8_out_twin(case, rows)
    assert twin.fp8_out and twin.id == "B4-H16-S4096x4096-D128-causal-e4m3-o8-grad_e4m3-bf16"
    assert names == ("sdpa_cudnn", "cudnn_fp8")
    twin_rows = [{"backend": "sdpa_cudnn", "candidate": False, "unsupported": "FP8 (e4m3) inputs: not a path"},
                 {"backend": "cudnn_fp8", "candidate": False, "modes": {"fwd": cell(0.38), "bwd": cell(2.27)}}]
    notes = speed.merge_twin_rows(rows, twin_rows, twin.id)
    by = {r["backend"]: r for r in rows}
    assert "cudnn_fp8" not in by and by["cudnn_fp8 (FP8 out)"]["twin"] == twin.id
    assert "fp8_out only" in by["cudnn_fp8 (FP8 out)"]["real_out"] and "unsupported" in by["sdpa_cudnn"]
    assert len(notes) == 1 and twin.id in notes[0] and "cudnn_fp8 (FP8 out)" in notes[0]
    for r in rows:  # the rates the section computes, then its table: the twin row has a ratio
        for m, c in (r.get("modes") or {}).items():
            c["tflops"] = {"fwd": 100.0, "bwd": 250.0}[m] / c["median_ms"]
    table = speed._markdown([{"case": case.id, "family": "softmax", "modes": ["fwd", "bwd"], "rows": rows,
                              "recheck": {"status": "pass", "detail": "-"}, "notes": notes}], [])
    line = next(x for x in table if x.startswith("| cudnn_fp8 (FP8 out) |"))
    assert "0.76x" in line and "1.34x" in line, line  # 0.38 / 0.5 forward, 2.27 / 1.7 backward
    # nothing to ask: every peer timed, a real-output twin already, a non-FP8 case
    assert speed.fp8_out_twin(case, [rows[0], rows[3]]) is None
    assert speed.fp8_out_twin(twin, rows) is None
    assert speed.fp8_out_twin(case_from_id("B4-H16-S4096x4096-D128-causal-bf16"), rows) is None
    assert speed.merge_twin_rows(rows, twin_rows[:1], twin.id) == []
