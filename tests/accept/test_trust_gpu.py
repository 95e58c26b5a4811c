"""The parent's clock on a GPU: a candidate whose process claims a hundredth of its device time is
flagged, an honest one is not (issue 15; the CPU twin is in test_trust.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cases import SoftmaxCase

IMPLS = Path(__file__).resolve().parent / "impls"


@pytest.mark.gpu
@pytest.mark.timing  # the parent's clock against the child's: run alone (gpu-tests' timing stage), as the CPU twin
def test_parents_clock_flags_a_patched_timer_on_cuda_and_passes_an_honest_one(tmp_path, monkeypatch):
    from harness.accept import speed
    from harness.accept.isolation import Isolator
    from harness.accept.judge import declared_adapter

    monkeypatch.chdir(IMPLS)
    iso = Isolator(tmp_path, start_method="spawn")
    # Long enough that the plain-torch candidate is not launch-bound (its kernels outlast their launches).
    case = SoftmaxCase(2, 16, 16, 2048, 2048, 64, causal=True, dtype="bf16")
    found = {}
    for module in ("forges_timer", "correct_softmax"):
        hello = {"impl": f"{module}:flash_attn_func", "family": "softmax", "device": "cuda", "threads": None}
        with iso.open(hello, timeout=300, name=f"probe-{module}") as s:
            probe = s.probe
        declared = declared_adapter(probe["adapter"], "softmax", probe["capabilities"])
        section = speed.run_speed(iso, hello=hello, declared=declared, family="softmax", device="cuda", cases=[case],
                                  backward=True, base_seed=0, timeout=300, out_dir=tmp_path / module, baselines=())
        assert section["status"] == "measured", section
        (res,) = section["cases"]
        cand = next(r for r in res["rows"] if r["candidate"])
        found[module] = {
            "clock": [c["detail"] for c in section["failed_checks"] if c["check"] == "parent_clock"],
            "cells": {m: (c.get("median_ms"), (c.get("observed") or {}).get("per_call_ms"), c.get("launch_bound"))
                      for m, c in cand["modes"].items()},
            "recheck": res["recheck"]["status"],
        }
    print(found)
    assert {d.split(":")[0] for d in found["forges_timer"]["clock"]} == {"fwd", "bwd", "fwd+bwd"}, found
    assert found["correct_softmax"]["clock"] == [], found
    assert found["forges_timer"]["recheck"] == found["correct_softmax"]["recheck"] == "pass"
    iso.cleanup()
