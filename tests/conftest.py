"""Test-suite setup: the Triton interpreter on a machine without CUDA, and the harness plugin.

The plugin normally arrives through its ``pytest11`` entry point (``pip install -e .``). A plain
source checkout (the GPU box runs from the repo root) has no entry point, so it is loaded here;
loading it both ways would make pytest refuse a plugin registered under two names.
"""

import os
import sys
from pathlib import Path

import pytest

try:
    import harness  # noqa: F401
except ImportError:  # run as plain `pytest` from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

pytest_plugins = ["pytester"]  # tests/test_plugin.py drives the plugin in throwaway projects
# Imported already means the entry point (or `-p harness.plugin`) registered it.
if "harness.plugin" not in sys.modules:
    pytest_plugins.append("harness.plugin")


#: Thread-count variables read by torch (OpenMP), numpy's OpenBLAS and MKL when they load.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _xdist_workers(config) -> int:
    """How many pytest-xdist workers this run starts (0 without -n)."""
    n = getattr(config.option, "numprocesses", None)
    if n in ("auto", "logical"):
        return os.cpu_count() or 1
    try:
        return int(n or 0)
    except (TypeError, ValueError):
        return 0


def _interpreter_without_cuda() -> None:
    """Without CUDA the CPU suite runs the in-repo kernels in Triton's interpreter, which Triton reads
    when a kernel is defined (at import): set before any in-repo kernel is imported. With it, two of
    the interpreter's repeated costs go (tests/interpreter_patching.py)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") == "1":
        import interpreter_patching

        interpreter_patching.install()


def _distributes(config) -> bool:
    """This process is the xdist controller of a distributed run: it collects and runs no test (its
    workers do), so it need not import torch (2-3 s before it can start them). As xdist decides it."""
    return (getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None))
            and not config.getvalue("collectonly") and not hasattr(config, "workerinput"))


@pytest.hookimpl(tryfirst=True)
def pytest_report_header(config):
    _interpreter_without_cuda()  # before the plugin's header reports TRITON_INTERPRET (the controller too)


def pytest_configure(config):
    # `-n 2` on a 2-core machine: each worker's torch and OpenBLAS would start one thread per core,
    # so 2 workers (and the children they start) run 4+ spinning threads on 2 cores, and an OpenMP
    # region waits for a descheduled thread (the suite's small ops: several times slower). Give each
    # worker its share of the cores. Set here, in the controller before it starts the workers, the
    # variables reach the workers' torch / numpy at import and every process a test starts; a
    # variable the user set is kept. Without -n nothing changes (the timing tests run alone).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0) or _xdist_workers(config)
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for var in _THREAD_VARS:
            os.environ.setdefault(var, share)
        if "PYTEST_XDIST_WORKER" in os.environ:  # a worker: its torch may have loaded before this ran
            import torch

            try:
                torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
            except ValueError:  # the user's own setting, not a number: left to torch
                pass
    if not _distributes(config):
        _interpreter_without_cuda()


def _param_dtypes(item) -> set[str]:
    """The dtypes a parametrised test runs in (torch dtypes, dtype names, cases with a dtype)."""
    import torch

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
    # The tests that read a module's sm_90a compile reports (the ``compiled`` fixtures: 1-3 minutes of compiling
    # with a cold Triton cache) go first, in collection order otherwise. pytest-xdist's worksteal hands each worker
    # half of the list and steals from the tail of a worker's queue: so the fixtures start at once on one worker,
    # while the other runs the rest, and no module's tests are split over two workers that would each compile its
    # reports (session 52's durations: test_gluon_ws.py's fixture set up on both workers, 79 s and 23 s).
    items[:] = sorted(items, key=lambda item: "compiled" not in getattr(item, "fixturenames", ()))
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


@pytest.fixture(scope="session")
def forked_python():
    """``run([sys.executable, "-c", CODE, *ARGS], cwd=, env=, timeout=, check=)``: a fresh ``python -c``
    (tests/forked_python.py) forked from one server per test process that has imported torch: the
    scripts skip torch's 2-4 s import each."""
    from forked_python import ForkedPython

    runner = ForkedPython()
    yield runner.run
    runner.close()
