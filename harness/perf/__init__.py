"""The performance side: how fast is a kernel, honestly?

* :mod:`.timing`: the timer (warm-up, settling, CUDA events, L2 flush, rotation, graphs,
  launch-bound rule);
* :mod:`.flops`: the exact FLOP and byte models;
* :mod:`.roofline`: the device's measured ceilings and the implausibility rules;
* :mod:`.memory`: allocator statistics of a run (forward, backward, saved, peak);
* :mod:`.bench`: ``harness bench``'s library: correctness gate, then timing and memory per cell;
* :mod:`.reports`: markdown, JSON schema, plots, and the spread-aware comparison of two runs.
"""
