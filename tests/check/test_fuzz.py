"""The fuzzer: edge-skewed draws, a run that is a function of its seed, failures found and recorded
with the command that shrinks them, a crashing candidate that does not stop the run."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness import cli
from harness.check import fuzz as F

IMPLS = Path(__file__).resolve().parents[1] / "accept" / "impls"


def _run(tmp_path, monkeypatch, *args, out="out"):
    monkeypatch.chdir(IMPLS)
    code = cli.main(["fuzz", "--device", "cpu", "--out", str(tmp_path / out), *args])
    lines = [json.loads(x) for x in (tmp_path / out / "fuzz.jsonl").read_text().splitlines()] \
        if (tmp_path / out / "fuzz.jsonl").exists() else []
    return code, lines


def test_draws_reach_the_edges():
    rng = random.Random(0)
    soft = [F.draw(rng, "softmax", ["fp32"]) for _ in range(600)]
    dense = [c for c in soft if not c.is_varlen]
    assert any(c.seqlen_q == 0 for c in dense) and any(c.seqlen_k == 1 for c in dense)
    assert any(c.seqlen_q > c.seqlen_k for c in dense) and any(c.seqlen_q < c.seqlen_k for c in dense)
    assert {c.heads_q // c.heads_k for c in soft} >= {1, 2, 16}
    assert any(c.is_varlen and any(a == 0 or b == 0 for a, b in c.varlen) for c in soft)
    assert any(c.has_window and c.causal for c in soft) and any(c.softcap for c in soft)
    assert {c.layout for c in soft} >= {"contiguous", "transposed", "offset"} and any(c.scale for c in soft)
    lin = [F.draw(rng, "linear", ["fp32"]) for _ in range(200)]
    assert {c.gate for c in lin} == {"none", "g", "g_gamma"} and any(c.gate_n == 0.05 for c in lin)


def test_decode_draws_reach_the_edges():
    rng = random.Random(1)
    dec = [F.draw(rng, "decode", ["fp32"]) for _ in range(400)]
    assert any(c.cache_len == 0 for c in dec) and any(c.cache_len == 1 for c in dec)
    assert {c.page_size for c in dec} == set(F.PAGE_SIZES) and {c.seqlen_q for c in dec} == set(F.NEW_TOKENS)
    assert any(not c.append for c in dec) and any(not c.ragged for c in dec) and any(not c.causal for c in dec)
    assert {c.heads_q // c.heads_k for c in dec} >= {1, 2, 16}
    assert any(c.has_window for c in dec) and any(c.softcap for c in dec) and any(c.d_v != c.d for c in dec)


def test_decode_fuzzing_finds_a_kernel_that_ignores_the_page_table(tmp_path, monkeypatch):
    code, lines = _run(tmp_path, monkeypatch, "--impl", "decode_impls:ignores_block_table", "--family", "decode",
                       "--max-cases", "16", "--seed", "5")
    assert code == 1 and len(lines) == 16
    failed = [x for x in lines if x["status"] == "fail"]
    assert failed and all("-contig-" not in x["case"] for x in failed)  # only paged caches expose it
    assert any(x["status"] == "pass" and "-contig-" in x["case"] for x in lines)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert "--family decode" in rep["failures"][0]["shrink"] and "--family decode" in rep["replay"]


def test_a_run_is_a_function_of_its_seed(tmp_path, monkeypatch):
    args = ("--backends", "eager", "--max-cases", "8", "--seed", "3", "--budget", "5m")
    code1, a = _run(tmp_path, monkeypatch, *args, out="a")
    code2, b = _run(tmp_path, monkeypatch, *args, out="b")
    assert code1 == code2 == 0
    assert [(x["case"], x["seed"]) for x in a] == [(x["case"], x["seed"]) for x in b] and len(a) == 8
    rep = json.loads((tmp_path / "a" / "report.json").read_text())
    assert rep["seed"] == 3 and "--seed 3" in rep["replay"]


def test_finds_a_bug_of_two_features_and_says_how_to_shrink_it(tmp_path, monkeypatch):
    code, lines = _run(tmp_path, monkeypatch, "--impl", "wrong_combo:attn", "--max-cases", "40", "--seed", "7")
    assert code == 1
    failed = [x for x in lines if x["status"] == "fail"]
    assert failed and all("-causal-" in x["case"] and "-cap" in x["case"] for x in failed)
    passed = [x for x in lines if x["status"] == "pass"]
    assert passed and not any("-causal-" in x["case"] and "-cap" in x["case"] for x in passed)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["failures"][0]["shrink"].startswith("python -m harness shrink --impl wrong_combo:attn")
    assert "## Failures" in (tmp_path / "out" / "report.md").read_text()


def test_a_crashing_candidate_is_a_failure_per_case_not_a_dead_run(tmp_path, monkeypatch):
    code, lines = _run(tmp_path, monkeypatch, "--impl", "crashes:flash_attn_func", "--max-cases", "2", "--seed", "1",
                       "--timeout", "60")
    assert code == 1 and len(lines) == 2
    assert all(x["status"] == "error" and "SIGABRT" in x["reason"] for x in lines)


def test_bad_arguments_exit_2(tmp_path, monkeypatch, capsys):
    code, _ = _run(tmp_path, monkeypatch, "--backends", "nope")
    assert code == 2 and "unknown backend 'nope'" in capsys.readouterr().err
    code, _ = _run(tmp_path, monkeypatch, "--backends", "eager", "--budget", "ten minutes")
    assert code == 2 and "--budget" in capsys.readouterr().err
    code, _ = _run(tmp_path, monkeypatch, "--backends", "eager_linear")
    assert code == 2 and "linear-attention backend" in capsys.readouterr().err


def test_all_backends_runs_what_is_here_and_names_the_rest(tmp_path, monkeypatch):
    code, lines = _run(tmp_path, monkeypatch, "--backends", "all", "--family", "linear", "--dtypes", "fp32",
                       "--max-cases", "1", "--seed", "5")
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    ran = {r["backend"] for r in lines}
    assert code == 0 and "eager_linear" in ran and "triton_la_chunk" in ran
    assert set(rep["per_backend"]) == ran and not ran & set(rep["skipped_backends"])
    if "fla_chunk" not in ran:  # fla is an optional peer: absent, it sits out with that reason
        assert "not installed" in rep["skipped_backends"]["fla_chunk"]
    assert "Not run here" in (tmp_path / "out" / "report.md").read_text() or not rep["skipped_backends"]


def test_fp8_only_backends_refuse_other_dtypes():
    import torch

    from harness.adapters import registry
    from harness.cases import SoftmaxCase

    case = SoftmaxCase(batch=1, heads_q=2, heads_k=2, seqlen_q=8, seqlen_k=8, d=32, dtype="fp16")
    for name in ("eager_fp8", "triton_fa_fp8"):
        assert "FP8 cases" in registry.get(name).supports(case, torch.device("cpu"))


def test_a_lost_cuda_context_costs_one_case_not_the_rest(tmp_path, monkeypatch):
    # a sticky error (illegal memory access) breaks the child for good: it says so with the case's
    # result and exits, and the next case gets a fresh child instead of the same error again
    code, lines = _run(tmp_path, monkeypatch, "--impl", "poisons_context:flash_attn_func", "--max-cases", "8",
                       "--seed", "2", "--timeout", "60")
    causal = ["-causal-" in x["case"] for x in lines]
    assert code == 1 and len(lines) == 8 and causal.index(True) < len(causal) - 1 - causal[::-1].index(False)
    for x, c in zip(lines, causal):
        if c:
            assert x["status"] == "error" and "illegal memory access" in x["reason"]
        else:  # a fresh child: the broken one's error does not follow it
            assert x["status"] in ("pass", "unsupported"), x


def test_a_time_limits_sigterm_still_writes_the_report(tmp_path):
    # a time limit's SIGTERM (GNU timeout's) arrives while a case hangs in its child: the run stops and reports what finished
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "harness", "fuzz", "--impl", "hangs:flash_attn_func", "--device",
                             "cpu", "--budget", "5m", "--timeout", "100", "--seed", "1", "--out", str(tmp_path / "out")],
                            cwd=IMPLS, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        # the SIGTERM must find the run in its loop (a case hanging in its child), not still importing:
        # wait for the line the fuzzer prints as the loop starts (a machine under load takes seconds)
        deadline = time.monotonic() + 60
        started = ""
        while "Ctrl-C or SIGTERM" not in started and time.monotonic() < deadline:
            started = proc.stderr.readline() or started
        assert "Ctrl-C or SIGTERM" in started, "the fuzz run did not start its loop within 60 s"
        time.sleep(1.0)  # the first case's child starts and hangs
        proc.send_signal(signal.SIGTERM)
        stderr = started + proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert "interrupted (SIGTERM)" in stderr, stderr[-2000:]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["seed"] == 1 and rep["cases"] == 0 and (tmp_path / "out" / "report.md").exists()
