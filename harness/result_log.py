"""A streamed record of a pytest run: one JSON line per finished test (``--attn-result-log``).

pytest prints its summary, failures and ``--durations`` only at the very end; a run cut by a time
limit, or hung while xdist tears its workers down, leaves none of it. This log is written line by
line as tests finish (by the controller under xdist), so it always says what passed, what failed
(with the failure text), what was skipped and why, and how long each test took.

    python -m harness.result_log reports/gpu-tests-sm90-fp16/correctness.jsonl [--slowest 20]

prints the counts, the failures, the slowest tests, and whether the run reached its end.

    python -m harness.result_log --compare ONE.jsonl OTHER.jsonl

says whether two runs of the same suite (e.g. on one GPU and on all GPUs) gave every test the same
outcome, with both wall times; exit status 1 when an outcome differs or a test ran in one only.
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
    outcome = Counter(_outcome(r) for r in tests)
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


def _outcome(r: dict) -> str:
    if r.get("xfail"):
        return "xfailed" if r["outcome"] == "skipped" else "xpassed"
    return r["outcome"]


def compare(one: list[dict], other: list[dict]) -> tuple[bool, str]:
    """(same, text): every test's outcome in two runs of one suite, and the runs' wall times."""
    def by_id(recs):
        return {r["id"]: _outcome(r) for r in recs if "id" in r}

    def wall(recs):
        fin = next((r for r in recs if r.get("event") == "finish"), None)
        return f"{fin['elapsed']:.0f} s (exit {fin['exitstatus']})" if fin else "did NOT finish"

    a, b = by_id(one), by_id(other)
    out = [f"first:  {len(a)} tests, {wall(one)}", f"second: {len(b)} tests, {wall(other)}"]
    diff = [f"  {t}: {a.get(t, 'not run')} -> {b.get(t, 'not run')}" for t in sorted(a.keys() | b.keys())
            if a.get(t) != b.get(t)]
    out.append(f"{len(diff)} tests differ" + (":" if diff else " (same outcome for every test)"))
    return not diff, "\n".join(out + diff)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="summarise a --attn-result-log file, or compare two")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--slowest", type=int, default=20)
    ap.add_argument("--compare", action="store_true", help="compare the outcomes of two logs (exit 1 if any differ)")
    a = ap.parse_args(argv)
    if a.compare:
        if len(a.paths) != 2:
            ap.error(f"--compare takes exactly two logs, got {len(a.paths)}")
        same, text = compare(load(a.paths[0]), load(a.paths[1]))
        print(text)
        return 0 if same else 1
    for p in a.paths:
        print(f"== {p}")
        print(summarize(load(p), a.slowest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
