"""Test-suite setup: the Triton interpreter on a machine without CUDA, and the harness plugin.

The plugin normally arrives through its ``pytest11`` entry point (``pip install -e .``). A plain
source checkout (the GPU box runs from the repo root) has no entry point, so it is loaded here;
loading it both ways would make pytest refuse a plugin registered under two names.
"""

import os
import sys
from pathlib import Path

try:
    import harness  # noqa: F401
except ImportError:  # run as plain `pytest` from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

if not torch.cuda.is_available():
    # Triton reads this when a kernel is defined (at import), so it must be set before any
    # in-repo kernel is imported: the CPU suite runs them in Triton's interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["pytester"]  # tests/test_plugin.py drives the plugin in throwaway projects
# Imported already means the entry point (or `-p harness.plugin`) registered it.
if "harness.plugin" not in sys.modules:
    pytest_plugins.append("harness.plugin")


def _param_dtypes(item) -> set[str]:
    """The dtypes a parametrised test runs in (torch dtypes, dtype names, cases with a dtype)."""
    from harness.cases import DTYPE_NAMES

    found = set()
    for v in getattr(getattr(item, "callspec", None), "params", {}).values():
        v = getattr(v, "dtype", v)
        if isinstance(v, torch.dtype) and v in DTYPE_NAMES:
            found.add(DTYPE_NAMES[v])
        elif isinstance(v, str) and v in DTYPE_NAMES.values():
            found.add(v)
    return found


def pytest_collection_modifyitems(config, items):
    # `nox -s "gpu-tests(dtype=..., arch=...)"` is one session per dtype: tests parametrised over
    # dtypes outside the attn plugin's --attn-dtypes (the kernel tests) run in their own dtype's
    # session only, not three times
    session_dtype = os.environ.get("ATTN_HARNESS_DTYPE")
    if not session_dtype:
        return
    keep, drop = [], []
    for item in items:
        dts = _param_dtypes(item)
        (drop if dts and session_dtype not in dts else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
