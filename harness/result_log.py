"""A streamed record of a pytest run: one JSON line per finished test (``--attn-result-log``).

pytest prints its summary, failures and ``--durations`` only at the very end; a run cut by a time
limit, or hung while xdist tears its workers down, leaves none of it. This log is written line by
line as tests finish (by the controller under xdist), so it always says what passed, what failed
(with the failure text), what was skipped and why, and how long each test took.

    python -m harness.result_log reports/gpu-tests-sm90-fp16/correctness.jsonl [--slowest 20]

prints the counts, the failures, the slowest tests, and whether the run reached its end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest


class ResultLog:
    """--attn-result-log: one JSON line per test report, flushed at once (see the option's help)."""

    def __init__(self, path: str):
        self.t0 = time.time()
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole session
        self.fh.write(json.dumps({"event": "start", "time": self.t0, "argv": sys.argv[1:]}) + "\n")

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # a test's outcome is its call report, or a setup / teardown report that failed or skipped
        if report.when != "call" and report.outcome == "passed":
            return
        rec = {"id": report.nodeid, "when": report.when, "outcome": report.outcome,
               "seconds": round(report.duration, 3), "elapsed": round(time.time() - self.t0, 1)}
        if hasattr(report, "wasxfail"):
            rec["xfail"] = report.wasxfail or True
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            rec["text"] = str(report.longrepr[2])  # (file, line, "Skipped: reason"): the reason is the news
        elif report.outcome != "passed":
            rec["text"] = (report.longreprtext or "")[-3000:]
        self.fh.write(json.dumps(rec) + "\n")

    @pytest.hookimpl(tryfirst=True)  # before xdist tears its workers down (which can hang)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        self.fh.write(json.dumps({"event": "finish", "exitstatus": int(exitstatus),
                                  "elapsed": round(time.time() - self.t0, 1)}) + "\n")
        self.fh.close()


def load(path: str | Path) -> list[dict]:
    """The records of the *last* run in the file (the file is appended to)."""
    recs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    starts = [i for i, r in enumerate(recs) if r.get("event") == "start"]
    return recs[starts[-1]:] if starts else recs


def summarize(recs: list[dict], slowest: int = 20) -> str:
    tests = [r for r in recs if "id" in r]
    finish = next((r for r in recs if r.get("event") == "finish"), None)
    outcome = Counter("xfailed" if r.get("xfail") and r["outcome"] == "skipped" else
                      ("xpassed" if r.get("xfail") else r["outcome"]) for r in tests)
    out = [f"{len(tests)} test reports: " + ", ".join(f"{n} {k}" for k, n in sorted(outcome.items()))]
    out.append(f"run finished after {finish['elapsed']:.0f} s, exit status {finish['exitstatus']}" if finish
               else f"run did NOT finish (last report at {max((r['elapsed'] for r in tests), default=0):.0f} s)")
    for r in tests:
        if r["outcome"] == "failed":
            lines = r.get("text", "").splitlines()
            # pytest's "E   ..." line, or the harness's one-line verdict ("... FAIL - out: error ...")
            first = next((ln for ln in lines if ln.startswith("E ")), None) or \
                next((ln for ln in lines if " FAIL - " in ln), lines[0] if lines else "")
            out.append(f"FAILED ({r['when']}) {r['id']}: {first[:300]}")
    out.append(f"slowest {slowest}:")
    for r in sorted(tests, key=lambda r: -r["seconds"])[:slowest]:
        out.append(f"  {r['seconds']:7.1f} s  {r['outcome']:7s} {r['id']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="summarise a --attn-result-log file")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--slowest", type=int, default=20)
    a = ap.parse_args(argv)
    for p in a.paths:
        print(f"== {p}")
        print(summarize(load(p), a.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
