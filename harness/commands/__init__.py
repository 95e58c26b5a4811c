"""One module per ``python -m harness`` command, each with ``add_arguments(parser)`` and
``main(args) -> int`` (wired by :mod:`harness.cli`), thin over the library:

* :mod:`.run`: the main job (:mod:`harness.check.selfcheck`, :mod:`harness.check.matrix`);
* :mod:`.golden`: the golden store (:mod:`harness.check.golden`);
* :mod:`.bench`: benchmarks (:mod:`harness.perf.bench`, :mod:`harness.perf.reports`);
* :mod:`.compare`: two benchmark runs compared (:mod:`harness.perf.reports.compare`);
* :mod:`.accept`: the vendor acceptance check (:mod:`harness.accept`);
* :mod:`.fuzz`, :mod:`.shrink`: random edge cases; a failure shrunk to a standalone repro
  (:mod:`harness.check.fuzz`, :mod:`harness.check.shrink`, :mod:`harness.check.repro`);
* :mod:`.audit`: published claims audited (:mod:`harness.perf.claims`, :mod:`harness.perf.audit`).
"""
