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


def sm90_reports(specs, dump: Path | None = None) -> dict:
    """spec -> fp8_gluon_ptxas.py's report for each of ``specs`` (repeats dropped); with ``dump``, each PTX written
    into that folder (the report's "ptx_file")."""
    dumped = ["--dump", str(dump)] if dump is not None else []
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp8_gluon_ptxas.py"), "--json", *dumped,
                          *dict.fromkeys(specs)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env=dict(os.environ, TRITON_INTERPRET="0"))
    assert run.returncode == 0, run.stderr[-3000:]
    return {r["spec"]: r for r in map(json.loads, run.stdout.splitlines())}
