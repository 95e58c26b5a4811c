"""The CPU suite's sm_90a compiles of the Gluon kernels, shared by their tests (test_bwd_gluon.py, test_gluon_ws.py,
test_fp8_gluon.py).

Gluon has no interpreter, so on a machine without a GPU a kernel is checked by compiling it for sm_90a
(benchmarks/fp8_gluon_ptxas.py: registers, spills, shared memory, wgmmas) in a subprocess (the suite runs Triton's
interpreter, which the Gluon compiler cannot use). Each pytest-xdist worker that needs a module's reports compiles
them itself: making one worker wait for another's compile instead read 34 s slower on the whole suite with a cold
Triton cache (session 43: the waiting worker idles, while compiling it shares the other's cache entries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sm90_reports(specs, dump: Path | None = None, jobs: int = 2) -> dict:
    """spec -> fp8_gluon_ptxas.py's report for each of ``specs`` (repeats dropped); with ``dump``, each PTX written
    into that folder (the report's "ptx_file"). The specs are shared out over ``jobs`` subprocesses run together
    (interleaved, so each gets a like mix of kernels): a module's compile is the CPU suite's longest item (~190 s cold
    for test_bwd_gluon.py's 135 specs in one process on the 2-core CI machine, session 60), and the other worker's
    tests leave a core idle for part of it."""
    unique = list(dict.fromkeys(specs))
    dumped = ["--dump", str(dump)] if dump is not None else []
    parts = [unique[i::jobs] for i in range(max(1, min(jobs, len(unique))))]
    runs = [subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fp8_gluon_ptxas.py"), "--json", *dumped,
                              *part], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=dict(os.environ, TRITON_INTERPRET="0")) for part in parts]
    reports = {}
    try:
        for run in runs:
            out, err = run.communicate(timeout=600)
            assert run.returncode == 0, err[-3000:]
            reports.update((r["spec"], r) for r in map(json.loads, out.splitlines()))
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    missing = [spec for spec in unique if spec not in reports]
    assert not missing, f"no report for {missing}"
    return reports
