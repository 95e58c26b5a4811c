"""Work functions for tests/check/test_pool.py (module-level: spawned processes import them)."""

import os
import time

RETIRED = False


def run(task):
    """``task`` is (what, seconds): sleep, then return this process's pid; "retire" marks the process
    unusable after its task (as a lost CUDA context does), "die" kills it mid-task."""
    global RETIRED
    what, seconds = task
    time.sleep(seconds)
    if what == "die":
        os._exit(7)
    if what == "raise":
        raise ValueError("bad input")
    if what == "retire":
        RETIRED = True
    return os.getpid()


def unusable():
    return "retired (simulated lost context)" if RETIRED else None


def environ(name):
    """The value of variable ``name`` in this process (None when unset)."""
    return os.environ.get(name)
