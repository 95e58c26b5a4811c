"""The correctness side: is a kernel right?

* :mod:`.tolerance`: the pass rule (error <= factor x the eager reference's error + a floor) and its
  factor table;
* :mod:`.verify`: one adapter on one case against the FP64 oracle (:mod:`harness.oracle`): inputs,
  baseline, the run with poisoned memory, the verdict;
* :mod:`.properties`: the property checks besides the numbers (contract, inputs unchanged, masked
  rows, determinism) and the result types;
* :mod:`.golden`: the golden store of oracle results (``golden/``) and the oracle cache;
* :mod:`.known_issues`: recorded defects of third-party backends;
* :mod:`.selfcheck`, :mod:`.matrix`: the main job's library (the oracles against the naive
  formulas; every backend on every case, in parallel, with its report);
* :mod:`.fuzz`, :mod:`.shrink`, :mod:`.repro`: random edge cases, a failing case shrunk to the
  smallest that fails the same way, and the standalone script that reproduces it.
"""
