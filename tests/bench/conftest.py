"""pytest-benchmark benchmarks of the attention backends (device time; see ``harness.perf.timing``).

Run them explicitly (they are skipped in a plain test run: timing every backend on every case is
minutes, not a test)::

    python -m pytest tests/bench --attn-preset fa-sweep --attn-dtypes bf16 \\
        --attn-backends sdpa_flash,sdpa_cudnn,flex --benchmark-autosave
    python -m pytest tests/bench ... --benchmark-compare --benchmark-compare-fail=median:5%

Cases and backends come from the harness plugin's options (``--attn-preset``, ``--attn-case``, ``--attn-dtypes``,
``--attn-backends``). At the end of the session the harness's own reports (markdown, JSON, PNG)
are written to ``$ATTN_BENCH_OUT`` (default ``reports/pytest-bench-<timestamp>``).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SKIP_REASON = ("benchmarks run when asked: give the path tests/bench, or --benchmark-only / "
               "--benchmark-autosave / --benchmark-save / --benchmark-json / --benchmark-compare")


def _asked(config: pytest.Config) -> bool:
    for arg in config.args:
        p = Path(arg.split("::")[0]).resolve()
        if p == HERE or HERE in p.parents:
            return True
    opts = ("benchmark_only", "benchmark_autosave", "benchmark_save", "benchmark_json", "benchmark_compare")
    return any(config.getoption(o, default=None) for o in opts)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked(config):
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


class Session:
    """The harness runner shared by the benchmarks of one session, and the records they fill."""

    def __init__(self, device):
        from harness.perf.bench import Bench

        self.device = device
        self.runner = Bench(device)
        self.records: dict[tuple[str, str], dict] = {}
        self.memory_done: set[tuple[str, str]] = set()
        self.started = time.time()
        self._env: dict | None = None

    @property
    def env(self) -> dict:
        """Device, clocks and versions (queried once per session)."""
        if self._env is None:
            from harness.perf.bench import environment

            self._env = environment(self.device)
        return self._env

    def peaks(self, dtype: str):
        from harness.perf import roofline

        self.runner.peaks = roofline.device_peaks(self.device, [dtype])
        return self.runner.peaks

    def record(self, adapter, case) -> dict:
        key = (adapter.name, case.id)
        if key not in self.records:
            self.records[key] = self.runner.new_record(adapter, case)
        return self.records[key]

    def write_reports(self) -> Path | None:
        if not self.records:
            return None
        from harness.perf.bench import DEFAULT_BASELINE, add_speedups, report_data
        from harness.perf.reports import write_reports

        results = list(self.records.values())
        for rec in results:
            self.runner.settle(rec)
        baselines = DEFAULT_BASELINE[self.device.type].split(",")
        add_speedups(results, baselines)
        opts = self.runner.options
        settings = {"presets": None, "modes": ["fwd", "bwd", "fwd+bwd"], "seed": self.runner.seed,
                    "target_ms": opts.target_ms, "warmup_ms": opts.warmup_ms, "min_reps": opts.min_reps,
                    "max_reps": opts.max_reps, "reps": opts.reps, "flush_l2": opts.flush_l2,
                    "cuda_graphs": opts.cuda_graph, "clock": "cuda-events" if self.device.type == "cuda" else "host",
                    "backends": sorted({r["backend"] for r in results}), "baseline": baselines}
        data = report_data(results, self.device, settings, self.runner.peaks,
                           "python -m pytest tests/bench (pytest-benchmark)", time.time() - self.started)
        default = Path("reports") / f"pytest-bench-{datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
        out = Path(os.environ.get("ATTN_BENCH_OUT") or default)
        write_reports(data, out)
        return out


@pytest.fixture(scope="session")
def bench_session(attn_device):
    session = Session(attn_device)
    yield session
    out = session.write_reports()
    if out is not None:
        print(f"\nattn-harness benchmark reports: {out}")
