"""``python -m harness compare``: a change counts only above the threshold *and* k x the combined
run-to-run spread; status changes are reported; exit codes."""

import json

import pytest

from harness import cli
from harness.perf.reports import compare


def data(cells: dict, device="NVIDIA H100 80GB HBM3") -> dict:
    """cells: (case, backend, mode) -> (median_ms, spread) or a status string."""
    recs: dict = {}
    for (case, backend, mode), v in cells.items():
        rec = recs.setdefault((case, backend), {"case": case, "backend": backend, "status": "ok", "reason": "",
                                                "modes": {}})
        if isinstance(v, str):
            rec["modes"][mode] = {"status": v, "reason": "CUDA out of memory" if v == "oom" else ""}
        else:
            rec["modes"][mode] = {"status": "ok", "median_ms": v[0], "spread": v[1]}
    return {"schema": "attn-harness-bench", "schema_version": 1, "created": "t", "device": {"name": device},
            "settings": {"clock": "cuda-events"}, "versions": {"torch": "2.11"}, "results": list(recs.values())}


K = ("B1-H16-S8192x8192-D128-bf16", "sdpa_flash", "fwd")


def one(old, new, **kw):
    return compare.compare(data({K: old}), data({K: new}), **kw)[0]


def test_change_above_threshold_and_spread_counts():
    r = one((1.0, 0.01), (1.10, 0.01))
    assert r["verdict"] == "slower" and r["counted"] and r["change"] == pytest.approx(0.10)
    assert one((1.0, 0.01), (0.8, 0.01))["verdict"] == "faster"


def test_change_within_the_run_to_run_spread_does_not_count():
    r = one((1.0, 0.08), (1.10, 0.08))  # combined spread 11%: 10% is noise at k = 2
    assert r["verdict"] == "same (within spread)" and not r["counted"]
    assert one((1.0, 0.08), (1.10, 0.08), k=0.5)["verdict"] == "slower"


def test_small_change_does_not_count_however_tight():
    assert one((1.0, 0.001), (1.03, 0.001))["verdict"] == "same (under threshold)"


def test_status_changes_are_reported():
    r = one((1.0, 0.01), "oom")
    assert r["verdict"].startswith("now OOM") and r["counted"] and r["lost"]
    assert one("oom", (1.0, 0.01))["verdict"] == "now timed (was OOM)"


def test_cli_exit_codes(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(data({K: (1.0, 0.01)})))
    new.write_text(json.dumps(data({K: (1.2, 0.01)}, device="NVIDIA H200")))
    assert cli.main(["compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "**slower**" in out and "+20.0%" in out and "different devices" in out
    assert cli.main(["compare", str(old), str(new), "--fail-on-regression"]) == 1
    assert cli.main(["compare", str(old), str(old), "--fail-on-regression"]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmarks": []}))  # a pytest-benchmark file, not ours
    assert cli.main(["compare", str(bad), str(new)]) == 2
    assert "not an attn-harness benchmark JSON" in capsys.readouterr().err


def test_launch_bound_change_says_so():
    old, new = data({K: (1.0, 0.01)}), data({K: (1.2, 0.01)})
    new["results"][0]["modes"]["fwd"]["launch_bound"] = "launch-bound: ..."
    r = compare.compare(old, new)[0]
    assert r["verdict"] == "slower (launch-bound: host time)" and r["counted"]


def test_unsteady_change_says_so():
    old, new = data({K: (1.0, 0.01)}), data({K: (0.8, 0.01)})
    old["results"][0]["modes"]["fwd"]["unsteady"] = "unsteady: ..."
    r = compare.compare(old, new)[0]
    assert r["verdict"] == "faster (unsteady device: see the report's note)" and r["counted"]
