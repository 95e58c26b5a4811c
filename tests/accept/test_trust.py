"""The judge runs in the parent: a candidate cannot write its own verdict (issue 15).

Each forging candidate (tests/accept/impls/forges_*.py) answers with noise and, on import, patches
the harness's judging code in its own process: the verifier and every anti-cheat check, the
tolerance engine's error functions, or the FP64 oracle (forges_anticheat: a kernel that caches
its last output, with the anti-cheat checks patched). While the judge ran in the candidate's
process each of them was ACCEPTED (shown once by running them against the previous commit; see
docs/accept/README.md). Now each must be REJECTED for the numbers: every case fails its
output tensor against the oracle the parent computed. A candidate that patches the timer to claim
a hundredth of its time is caught by the parent's clock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from multiprocessing import Pipe
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.accept import exchange, speed
from harness.cases import SoftmaxCase

IMPLS = Path(__file__).resolve().parent / "impls"
ROOT = Path(__file__).resolve().parents[2]
MHA = "B2-H4-S37x37-D32-fp32"
GQA = "B2-H4/2-S40x40-D32-causal-fp32"
DEAD_ROWS = "B1-H4/2-S70x33-D32-causal-fp32"


def accept(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    code = cli.main(["accept", "--device", "cpu", "--jobs", "2", "--out", str(out), *args])
    path = out / "report.json"
    return code, (json.loads(path.read_text()) if path.exists() else None)


@pytest.mark.parametrize("module", ["forges_verifier", "forges_tolerance", "forges_oracle"])
def test_candidate_that_patches_the_judge_in_its_process_is_rejected_for_the_numbers(module, tmp_path, monkeypatch):
    code, rep = accept(tmp_path, monkeypatch, "--impl", f"{module}:flash_attn_func", "--case", MHA, "--case", GQA,
                       "--case", DEAD_ROWS)
    assert code == 1 and rep["verdict"] == "REJECTED", rep and rep["reasons"]
    for entry in rep["cases"]:
        assert entry["status"] == "fail", (entry["case"], entry["reason"])
        out = next(c for c in entry["failed_checks"] if c["check"] == "out")
        # The numbers: noise is off by its own magnitude, millions of times the reference's error.
        assert out["kind"] == "tensor" and out["error"] > 0.5 and out["bound_ratio"] > 1e5, out
        assert {"dq", "dk", "dv"} <= {c["check"] for c in entry["failed_checks"]}
    assert module not in sys.modules  # the judge never imported it


def test_cached_outputs_with_the_anticheat_checks_patched_are_rejected_for_the_numbers(tmp_path, monkeypatch):
    """A kernel that returns its last output to the next same-shape call, with every anti-cheat check
    patched to "pass" in its process: the judge sees the second call's output equal, bit for bit, to
    the first call's, for other inputs."""
    code, rep = accept(tmp_path, monkeypatch, "--impl", "forges_anticheat:flash_attn_func", "--case", MHA, "--case", GQA)
    assert code == 1 and rep["verdict"] == "REJECTED"
    for entry in rep["cases"]:
        caching = next(c for c in entry["failed_checks"] if c["check"] == "caching")
        assert "bit for bit the output of the previous call" in caching["detail"], caching
        assert not {"out", "dq", "dk", "dv"} & {c["check"] for c in entry["failed_checks"]}  # only its cache lies


def test_the_judge_reads_and_removes_only_the_files_it_named(tmp_path, monkeypatch):
    import sys as _sys

    _sys.path.insert(0, str(IMPLS))
    try:
        from forges_answer_path import VICTIM
    finally:
        _sys.path.remove(str(IMPLS))
        _sys.modules.pop("forges_answer_path", None)
        _sys.modules.pop("_reference", None)
    Path(VICTIM).write_text("a file of the user's")
    try:
        code, rep = accept(tmp_path, monkeypatch, "--impl", "forges_answer_path:flash_attn_func", "--case", GQA)
        assert Path(VICTIM).read_text() == "a file of the user's"  # neither read as tensors nor deleted
    finally:
        Path(VICTIM).unlink(missing_ok=True)
    assert code == 1 and rep["cases"][0]["status"] == "error"
    assert "naming" in rep["cases"][0]["reason"] and "instead of the file it was given" in rep["cases"][0]["reason"]


def test_correct_candidate_is_accepted_and_never_imported_by_the_judge(tmp_path, monkeypatch):
    vendor = tmp_path / "vendor"  # a module name no other test imports
    vendor.mkdir()
    (vendor / "vendor_kernel_t15.py").write_text((IMPLS / "_reference.py").read_text())
    monkeypatch.chdir(vendor)
    out = tmp_path / "out"
    code = cli.main(["accept", "--device", "cpu", "--jobs", "2", "--out", str(out), "--case", GQA,
                     "--impl", "vendor_kernel_t15:flash_attn_func"])
    rep = json.loads((out / "report.json").read_text())
    assert code == 0 and rep["verdict"] == "ACCEPTED", rep["reasons"]
    assert "vendor_kernel_t15" not in sys.modules


@pytest.mark.timing  # the parent's clock against the child's: run alone
def test_timer_patched_to_claim_a_hundredth_is_caught_by_the_parents_clock(tmp_path, monkeypatch):
    code, rep = accept(tmp_path, monkeypatch, "--impl", "forges_timer:flash_attn_func", "--case", GQA, "--speed")
    assert code == 1 and rep["verdict"] == "REJECTED"
    assert all(c["status"] == "pass" for c in rep["cases"])  # its answers are right: only its times lie
    clock = [c for c in rep["speed"]["failed_checks"] if c["check"] == "parent_clock"]
    assert {c["detail"].split(":")[0] for c in clock} == {"fwd", "bwd", "fwd+bwd"}, rep["speed"]["failed_checks"]
    assert speed.PARENT_CLOCK in clock[0]["detail"]
    assert any("parent_clock" in r for r in rep["reasons"])


@pytest.mark.timing  # the parent's clock against the child's: run alone
def test_honest_timer_passes_the_parents_clock(tmp_path, monkeypatch):
    code, rep = accept(tmp_path, monkeypatch, "--impl", "correct_softmax:flash_attn_func", "--case", GQA, "--speed")
    assert code == 0 and rep["verdict"] == "ACCEPTED", rep["reasons"]
    sp = rep["speed"]
    assert sp["status"] == "measured" and sp["clock"] == "host" and not sp["failed_checks"]
    (case,) = sp["cases"]
    cand = next(r for r in case["rows"] if r["candidate"])
    for mode, cell in cand["modes"].items():
        seen = cell["observed"]
        assert seen["calls"] >= speed.OBSERVE_PROBE_CALLS and len(seen["walls_ms"]) == speed.OBSERVE_WINDOWS, mode
        assert cell["median_ms"] >= speed.PLAUSIBLE_FRACTION_HOST * seen["per_call_ms"], (mode, cell)
    assert {r["backend"] for r in case["rows"]} >= {"eager", "sdpa_math"}  # baselines, in their own child
    assert case["recheck"]["status"] == "pass"


def test_clock_rule():
    seen = {"calls": 100, "windows": 3, "wall_ms": 100.0, "per_call_ms": 1.0}
    assert speed.clock_flag(1.0, seen) is None and speed.clock_flag(0.7, seen) is None
    assert speed.clock_flag(0.6, seen) and speed.clock_flag(0.6, seen, "host") is None  # a CPU's looser bound
    assert speed.clock_flag(0.4, seen, "host")
    flag = speed.clock_flag(0.1, seen)
    assert flag.startswith(speed.PARENT_CLOCK) and "0.1 ms" in flag and "100 back-to-back calls" in flag


def test_judges_sources_changing_during_the_run_rejects(tmp_path, monkeypatch):
    import harness.accept as A

    digests = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(A, "source_digest", lambda: next(digests))
    code, rep = accept(tmp_path, monkeypatch, "--impl", "correct_softmax:flash_attn_func", "--case", GQA)
    assert code == 1 and rep["verdict"] == "REJECTED"
    assert "changed on disk during the run" in rep["reasons"][0] and "aaaa" in rep["reasons"][0]


def test_module_in_the_vendors_directory_does_not_shadow_the_judges_imports(tmp_path):
    """The vendor's directory holds the candidate and a file named like a module the judge imports
    after start (safetensors): the judge must import the installed one, not run the vendor's file."""
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    for name in ("_reference.py", "correct_softmax.py"):
        (vendor / name).write_text((IMPLS / name).read_text())
    marker = tmp_path / "imported-by"
    (vendor / "safetensors.py").write_text(
        "import importlib, os, sys\n"
        "with open(os.environ['SHADOW_MARKER'], 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
        "del sys.modules[__name__]\n"
        "sys.modules[__name__] = importlib.import_module(__name__)  # the real one, for whoever imported us\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), SHADOW_MARKER=str(marker))
    p = subprocess.Popen(
        [sys.executable, "-m", "harness", "accept", "--impl", "correct_softmax:flash_attn_func", "--device", "cpu",
         "--case", GQA, "--out", str(tmp_path / "out")],
        cwd=vendor, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0, out
    judge_pid = str(p.pid)
    importers = marker.read_text().split() if marker.exists() else []
    assert judge_pid not in importers, out


# --------------------------------------------------------------------------------------------
# The exchange: nothing the child sends can run code in the parent
# --------------------------------------------------------------------------------------------


def test_messages_are_json_only():
    import pickle

    a, b = Pipe()
    exchange.send(a, {"x": [1, 2.5, "y"]})
    assert exchange.receive(b) == {"x": [1, 2.5, "y"]}
    a.send_bytes(pickle.dumps({"x": 1}))  # what Connection.send would write: refused, never unpickled
    with pytest.raises(exchange.ExchangeError, match="not JSON"):
        exchange.receive(b)
    a.send_bytes(b"[1, 2]")
    with pytest.raises(exchange.ExchangeError, match="not a JSON object"):
        exchange.receive(b)


def test_tensor_files_round_trip_and_check_their_digest(tmp_path):
    t = {"out": torch.randn(2, 3).to(torch.bfloat16), "lse": torch.tensor([-float("inf"), 1.0]),
         "empty": torch.zeros(0, 4), "view": torch.randn(4, 4).t()}
    t["same"] = t["out"]  # one tensor returned twice: written as two
    sha = exchange.write_tensors(tmp_path / "a.safetensors", t)
    back = exchange.read_tensors(tmp_path / "a.safetensors", sha)
    assert set(back) == set(t) and all(torch.equal(back[k], t[k]) and back[k].dtype == t[k].dtype for k in t)
    with pytest.raises(exchange.ExchangeError, match="differs from the announced"):
        exchange.read_tensors(tmp_path / "a.safetensors", "0" * 64)
    (tmp_path / "b.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(exchange.ExchangeError, match="not a readable safetensors file"):
        exchange.read_tensors(tmp_path / "b.safetensors", None)


def test_cases_cross_as_json():
    case = SoftmaxCase(1, 4, 2, 0, 0, 32, causal=True, varlen=((17, 17), (0, 5)), window=(8, 0))
    assert exchange.case_from_dict(json.loads(json.dumps(exchange.case_to_dict(case)))) == case


def test_an_implausible_first_look_gets_a_second_one():
    """The parent's clock looks twice only where the first look makes the claim implausible, and keeps
    the faster look: a machine slowed for a moment (the first look at 4 ms a call) does not reject an
    honest 1 ms claim, while a claim under the bound at both looks stays flagged, naming both."""
    import time as _time

    class Session:  # the candidate's child, as _observe drives it: each loop_run sleeps per call
        def __init__(self, per_call_s):
            self.per_call_s = list(per_call_s)
            self.looks = 0

        def ask(self, op, **kw):
            if op == "loop_setup":
                self.looks += 1
            elif op == "loop_run":
                _time.sleep(kw["n"] * self.per_call_s[min(self.looks, len(self.per_call_s)) - 1])
            return {"status": "ok"}

    busy_then_quiet = Session([0.004, 0.001])
    seen = speed._observed(busy_then_quiet, {}, "fwd", 0, claimed_ms=1.0, clock="cuda-events")
    assert busy_then_quiet.looks == 2 and seen["other_look_ms"] > 3.0 and seen["per_call_ms"] < 1.4
    assert speed.clock_flag(1.0, seen) is None
    quiet = Session([0.001])
    seen = speed._observed(quiet, {}, "fwd", 0, claimed_ms=1.0, clock="cuda-events")
    assert quiet.looks == 1 and "other_look_ms" not in seen  # no second look where the first is plausible
    forger = Session([0.001, 0.001])
    seen = speed._observed(forger, {}, "fwd", 0, claimed_ms=0.1, clock="cuda-events")
    flag = speed.clock_flag(0.1, seen)
    assert forger.looks == 2 and flag and "a second look saw" in flag
