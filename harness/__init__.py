"""attn-harness: the reference test harness for attention kernels.

Folders say what lives there (docs/architecture.md draws the data flow):

* ``cases.py`` / ``presets.py``: the case model and named sets of cases;
* ``oracle/``: the FP64 references;
* ``check/``: the correctness side (tolerance rule, verification runner, property checks, golden
  store, known third-party defects, the main job's library);
* ``perf/``: the performance side (timer, FLOP and byte models, roofline, memory, the bench runner,
  reports and comparison);
* ``adapters/``: the one registry of backends; ``accept/``: the vendor acceptance check (a judge
  process and the candidate's process);
* ``commands/``: one module per ``python -m harness`` command, thin over the above; ``cli.py``
  wires them; ``plugin.py``: the pytest plugin.

Modules that moved keep their old import path as an alias of the same module object
(``harness.verify`` is ``harness.check.verify``), so code written against the old layout, and its
monkeypatches, keep working.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: old module path -> where it lives now (the same module object is returned for both).
MOVED = {
    "harness.verify": "harness.check.verify",
    "harness.tolerance": "harness.check.tolerance",
    "harness.golden": "harness.check.golden",
    "harness.known_issues": "harness.check.known_issues",
    "harness.timing": "harness.perf.timing",
    "harness.flops": "harness.perf.flops",
    "harness.roofline": "harness.perf.roofline",
    "harness.memory": "harness.perf.memory",
    "harness.bench": "harness.perf.bench",
    "harness.reports": "harness.perf.reports",
    "harness.reports.compare": "harness.perf.reports.compare",
    "harness.reports.markdown": "harness.perf.reports.markdown",
    "harness.reports.plots": "harness.perf.reports.plots",
    "harness.reports.schema": "harness.perf.reports.schema",
    "harness.main_job": "harness.commands.run",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module path to the module at its new path (one object, two names)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
