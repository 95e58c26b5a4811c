"""``python -m harness run``: self-checks, the table, the reports, the exit status, bad arguments."""

import argparse
import json
import os
import signal

import pytest
import torch
import wrong_impls as w

from harness.adapters import registry
from harness.check import matrix, selfcheck
from harness.commands import run as run_command


def _args(*argv):
    p = argparse.ArgumentParser()
    run_command.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def scratch_registry(monkeypatch):
    registry.all_adapters()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return registry


def test_oracle_self_checks_pass():
    checks = selfcheck.self_checks()
    assert len(checks) >= 8
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert any("masked rows" in c.name for c in checks) and any("g_gamma" in c.name for c in checks)


def test_run_passes_writes_reports_and_prints_table(tmp_path, capsys):
    handler = signal.getsignal(signal.SIGTERM)
    code = run_command.main(
        _args(
            "--backends",
            "eager,eager_linear,sdpa_math",
            "--dtypes",
            "fp32",
            "--out",
            str(tmp_path),
            "--no-progress",
        )
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert signal.getsignal(signal.SIGTERM) is handler  # the run's SIGTERM handler is put back
    assert "OK   softmax" in out and "OK   linear" in out
    assert any(line.split()[:3] == ["eager", "B2-H4-S37x37-D32-fp32", "pass"] for line in out.splitlines())
    assert "softcap is not supported by torch SDPA" in out  # skip reason column
    assert "verdict: PASS" in out
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["exit_code"] == 0 and doc["summary"]["fail"] == 0
    assert doc["summary"]["pass"] == 15 + 8 + 13  # sdpa_math: no softcap, no varlen
    assert doc["meta"]["seed"] == 0 and doc["meta"]["torch"] == torch.__version__
    assert {r["status"] for r in doc["results"]} == {"pass", "unsupported"}
    md = (tmp_path / "report.md").read_text()
    assert "| sdpa_math | B1-H2-S40x40-D32-cap5-fp32 | skip |" in md and "verdict: **PASS**" in md
    # where the time went: per backend, compile (first call less the second) apart from run time
    assert "workers: 1 (auto: no GPU" in out and "kernel configs pinned" in out
    assert "time per backend" in out and "slowest 5 cells:" in out
    assert "## Where the time went" in md and "Slowest cells:" in md
    timed = [r for r in doc["results"] if r["status"] == "pass"]
    assert all({"first_call_s", "second_call_s", "judge_s"} <= set(r["timings"]) for r in timed)
    assert sum("baseline_s" in r["timings"] for r in timed) == len({r["case"] for r in timed})  # once per case
    assert doc["meta"]["tuning"].startswith("kernel configs pinned")
    assert "FLASH_ATTN_AUTOTUNE" not in os.environ  # set for the run, put back after it


def test_auto_workers_follow_the_gpus_and_cores():
    assert run_command.auto_jobs(2, 0)[0] == 1
    assert run_command.auto_jobs(16, 1)[0] == 16 and run_command.auto_jobs(4, 1)[0] == 4
    assert run_command.auto_jobs(64, 2)[0] == 32 and run_command.auto_jobs(128, 8)[0] == 128
    assert "16 CPU cores, 1 GPU(s)" in run_command.auto_jobs(16, 1)[1]


def test_run_fails_with_exit_1_when_a_backend_fails(tmp_path, capsys, scratch_registry):
    scratch_registry.register(w.ScaleIgnored())
    code = run_command.main(
        _args(
            "--backends",
            "eager,wrong_scale_ignored",
            "--preset",
            "small",
            "--dtypes",
            "fp32",
            "--out",
            str(tmp_path),
            "--no-progress",
        )
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "wrong_scale_ignored" in out and "FAIL" in out and "verdict: FAIL" in out
    doc = json.loads((tmp_path / "report.json").read_text())
    bad = [r for r in doc["results"] if r["status"] == "fail"]
    assert bad and all(r["backend"] == "wrong_scale_ignored" and "out" in r["failures"] for r in bad)
    assert "## Failures" in (tmp_path / "report.md").read_text()


def test_failed_self_check_fails_the_job(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(selfcheck, "_linear_self_checks", lambda: [("linear broken", 1e-3)])
    code = run_command.main(
        _args(
            "--backends",
            "eager",
            "--preset",
            "small",
            "--dtypes",
            "fp32",
            "--out",
            str(tmp_path),
            "--no-progress",
        )
    )
    assert code == 1
    assert "FAIL linear broken" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--preset", "nope"), "--preset: unknown preset 'nope'"),
        (("--dtypes", "fp8"), "--dtypes: unknown dtype 'fp8'"),
        (("--backends", "eager,nope"), "--backends: unknown backend 'nope'"),
        (("--seed", "-1"), "--seed: expected a non-negative integer"),
        (("--jobs", "0"), "--jobs: expected a positive integer"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(argv, message, capsys, tmp_path):
    assert run_command.main(_args(*argv, "--out", str(tmp_path))) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()  # refused before anything ran


def test_cpu_run_turns_on_the_triton_interpreter(monkeypatch, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("the interpreter is only switched on without CUDA")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run_command.main(
        _args("--backends", "eager", "--preset", "nope", "--out", str(tmp_path))
    )  # exits 2, after setting it
    assert os.environ.get("TRITON_INTERPRET") == "1"


def test_cli_lists_and_parses_run():
    from harness.cli import build_parser

    args = build_parser("run").parse_args(["run", "--preset", "small", "--seed", "3"])
    assert args._module is run_command and args.seed == "3"


def test_parallel_workers_give_the_same_verdicts_in_the_same_order():
    from harness.presets import preset

    cases = preset("small", ["fp32"])[:3]
    adapters = [registry.get("eager"), registry.get("sdpa_math")]
    serial = matrix.run_all(cases, adapters, seed=0, device=torch.device("cpu"), progress=False)
    parallel = matrix.run_all(cases, adapters, seed=0, device=torch.device("cpu"), progress=False, jobs=2)
    assert [(r.backend, r.case, r.status) for r in parallel] == [(r.backend, r.case, r.status) for r in serial]
    assert {r.status for r in parallel} == {"pass"}


def test_a_worker_that_lost_its_cuda_context_is_replaced_alone(capsys):
    """On the H100 one misaligned address (a sticky CUDA error) made its worker fail every pair it took
    afterwards, instantly, so it took most of them (221 errors); then the whole pool was restarted
    (each restart re-compiles every backend). Now only that worker is replaced, after its pair."""
    import faulty_workers as fw

    adapters = [registry.get("eager"), registry.get(fw.CULPRIT)]
    results = matrix.run_all(fw.CASES, adapters, seed=0, device=torch.device("cpu"), progress=False, jobs=2,
                             worker=fw.loses_context)
    assert [(r.backend, r.case) for r in results] == [(a.name, c.id) for c in fw.CASES for a in adapters]
    assert {r.status for r in results} == {"pass"}, [r.reason for r in results]
    # one replacement per sdpa_math pair: each lost the context once it had finished
    assert capsys.readouterr().err.count("worker process replaced (a worker lost its CUDA context") == len(fw.CASES)


def test_pairs_that_compile_are_handed_out_first():
    from harness.presets import preset

    cases = preset("small", ["fp32"])[:2]
    adapters = [registry.get("eager"), registry.get("triton_fa"), registry.get("sdpa_math"), registry.get("flex")]
    order = matrix.submission_order(matrix._pairs(cases, adapters), cases, adapters, torch.device("cpu"))
    assert [(ci, adapters[ai].name) for ci, ai in order] == [
        (0, "triton_fa"), (0, "flex"), (1, "triton_fa"), (1, "flex"),
        (0, "eager"), (0, "sdpa_math"), (1, "eager"), (1, "sdpa_math")]


def test_recorded_crashes_are_handed_out_before_everything_else(monkeypatch):
    from harness.cases import SoftmaxCase

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # an H100, as the entries were measured on
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cases = [SoftmaxCase(1, 4, 2, 40, 40, 32, dtype="fp16"),
             SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset", dtype="fp16")]
    adapters = [registry.get("eager"), registry.get("triton_fa"), registry.get("sdpa_flash")]
    order = matrix.submission_order(matrix._pairs(cases, adapters), cases, adapters, torch.device("cuda"))
    assert [(ci, adapters[ai].name) for ci, ai in order][:3] == [(1, "sdpa_flash"), (0, "triton_fa"), (1, "triton_fa")]


def test_a_worker_that_dies_fails_only_its_own_pair():
    """A worker process that dies is replaced; only the pair that killed it is an error."""
    import faulty_workers as fw

    adapters = [registry.get("eager"), registry.get(fw.CULPRIT)]
    results = matrix.run_all(fw.CASES, adapters, seed=0, device=torch.device("cpu"), progress=False, jobs=2,
                             worker=fw.dies_on_the_second_case)
    status = {(r.backend, r.case): r for r in results}
    assert len(status) == 6
    bad = status[fw.CULPRIT, fw.CASES[1].id]
    assert bad.status == "error" and bad.reason == "the worker process died running it (exit code 3)", bad.reason
    assert all(r.status == "pass" for k, r in status.items() if k != (fw.CULPRIT, fw.CASES[1].id))


def test_an_interrupted_run_reports_what_finished(monkeypatch):
    from harness.presets import preset

    cases = preset("small", ["fp32"])[:3]
    calls = []

    def stop_after_two(adapter, case, seed, device, check_backward):
        if len(calls) == 2:
            raise KeyboardInterrupt  # what SIGTERM from a time limit becomes (harness/interrupts.py)
        calls.append(case.id)
        return real(adapter, case, seed, device, check_backward)

    real = matrix._verify_one
    monkeypatch.setattr(matrix, "_verify_one", stop_after_two)
    results = matrix.run_all(cases, [registry.get("eager")], seed=0, device=torch.device("cpu"), progress=False)
    assert [r.status for r in results] == ["pass", "pass", "error"]
    assert results[2].reason == "not run: the run was interrupted first"


def test_workers_spawn_for_a_gpu_and_fork_from_a_preloaded_server_on_a_cpu():
    """A CUDA context cannot be forked: GPU workers are spawned. CPU workers are forked from a server
    that imported torch once (each spawned worker would import it again: seconds per worker)."""
    assert matrix.worker_start("cuda") == {"start_method": "spawn"}
    assert matrix.worker_start(torch.device("cuda", 1)) == {"start_method": "spawn"}
    assert matrix.worker_start("cpu") == {"start_method": "forkserver"}
