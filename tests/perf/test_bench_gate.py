"""The regression gate bites: pytest-benchmark's --benchmark-compare-fail over the harness's
replayed times fails when a backend got slower and passes when the baseline is re-run.

This is the mechanism of ``nox -s bench`` / ``nox -s bench-compare`` shown on the CPU (host
clock): the candidate's work is dominated by a fixed sleep, so its medians are stable to a few
percent even on a loaded 2-core machine; the slowed run doubles that sleep.
"""

import os
import textwrap
from pathlib import Path

import pytest

# a 2x slowdown measured on the host clock: run alone (the README's test command runs `-m timing` serially)
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]

pytest_plugins = ["pytester"]

CANDIDATE = textwrap.dedent(
    """
    import os, time
    import pytest
    from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput
    from harness.adapters.eager import eager_attention
    from harness.cases import SoftmaxCase
    from harness.perf.timing import TimerOptions, device_time_replay, record_in_benchmark, time_adapter

    class Candidate(SoftmaxAdapter):
        name = "candidate"

        def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
            out, lse = eager_attention(q, k, v, **case.oracle_kwargs)
            time.sleep(float(os.environ["CANDIDATE_MS"]) / 1e3)  # the deliberately slowed part
            return SoftmaxOutput(out, lse)

    @pytest.mark.benchmark(timer=device_time_replay)
    def test_candidate_fwd(benchmark):
        case = SoftmaxCase(1, 2, 2, 32, 32, 16)
        timing = time_adapter(Candidate(), case, "fwd", device="cpu", options=TimerOptions(reps=15, warmup_ms=5))
        record_in_benchmark(benchmark, timing)
    """
)
# A slowdown of 2x against a gate of 25%: far apart, so the test cannot flake either way.
GATE = "--benchmark-compare-fail=median:25%"


def test_compare_gate_fails_on_slowed_backend_and_passes_on_rerun(pytester, monkeypatch, tmp_path):
    pytester.makepyfile(test_candidate=CANDIDATE)
    storage = f"--benchmark-storage={tmp_path / 'store'}"
    # The child pytest imports the harness from this checkout, installed or not.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("CANDIDATE_MS", "4")
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)  # this suite under -n: the child is a plain pytest run
    base = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-autosave", storage)
    assert base.ret == 0, base.stdout.str()

    monkeypatch.setenv("CANDIDATE_MS", "8")
    slowed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-compare", GATE, storage)
    assert slowed.ret != 0
    assert "Performance has regressed" in slowed.stdout.str() + slowed.stderr.str()

    monkeypatch.setenv("CANDIDATE_MS", "4")
    rerun = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-compare", GATE, storage)
    assert rerun.ret == 0, rerun.stdout.str()
