"""Worker functions for ``harness.check.matrix.run_all`` that fail the way GPU worker processes do
(used by tests/commands/test_run.py; module-level so that spawned workers can import them)."""

import os

from harness.check import matrix
from harness.presets import preset

CASES = preset("small", ["fp32"])[:3]
CULPRIT = "sdpa_math"


def loses_context(task):
    """After sdpa_math's pairs the process's CUDA context is "lost", as after a misaligned address."""
    out = matrix._worker(task)
    if task[0] == CULPRIT:
        matrix._LOST = "AcceleratorError: CUDA error: misaligned address (simulated)"
    return out


def dies_on_the_second_case(task):
    """sdpa_math on the second case kills its worker process (a segfault in a kernel, an abort)."""
    if task[0] == CULPRIT and task[1].id == CASES[1].id:
        os._exit(3)
    return matrix._worker(task)
