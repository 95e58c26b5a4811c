"""Memory of one training step of an attention call, from the CUDA caching allocator's statistics.

Every number is in MiB *above what was allocated before the forward* (the inputs and everything
else alive), so it is what the attention call itself costs:

* ``fwd_peak``: peak during the forward (outputs, saved tensors, workspaces, temporaries);
* ``saved``: what the forward leaves alive besides the tensors it returned (the activations
  autograd keeps for the backward: lse, P for eager, ...);
* ``out``: the returned tensors (out, lse / final_state);
* ``bwd_peak``: peak during the backward (includes ``saved`` + ``out`` still alive, the gradients
  and the backward's workspaces);
* ``peak``: the larger of the two: the step's peak.

``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` gives the peaks;
``torch.cuda.memory_allocated`` the live bytes. A CPU has no allocator statistics: None.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass

import torch

from harness.cases import Case
from harness.perf.timing import Workload, loss_pairs

MIB = float(1 << 20)


@dataclass
class MemoryStats:
    """MiB above the pre-forward allocation (see the module docstring); None where not measured."""

    inputs: float
    fwd_peak: float
    out: float
    saved: float
    bwd_peak: float | None
    peak: float

    def to_dict(self) -> dict:
        return {f"{k}_mib": v for k, v in asdict(self).items()}


def _storage_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            st = t.untyped_storage()
            key = st.data_ptr()
            if key not in seen:
                seen.add(key)
                total += st.nbytes()
    return total


def measure_memory(adapter, case: Case, inputs, device) -> MemoryStats | None:
    """One forward (and backward when the adapter is differentiable) of ``adapter`` on ``case``
    with the allocator's peak statistics reset around each; None on a CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    work = Workload(adapter, case, [inputs], "fwd")
    in_bytes = _storage_bytes(inputs.tensors().values()) + _storage_bytes(work.sets[0][1].values())
    gc.collect()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    output = work.forward(0)
    torch.cuda.synchronize(device)
    fwd_peak = torch.cuda.max_memory_allocated(device) - base
    live = torch.cuda.memory_allocated(device) - base
    returned = [output.out, getattr(output, "lse", None), getattr(output, "final_state", None)]
    out_bytes = _storage_bytes(returned)
    bwd_peak = None
    if work.grad:
        outs, grads = loss_pairs(case, output, inputs)
        leaves = [x for x in work.sets[0][1].values() if x.requires_grad]
        if outs:
            torch.cuda.reset_peak_memory_stats(device)
            g = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
            torch.cuda.synchronize(device)
            bwd_peak = (torch.cuda.max_memory_allocated(device) - base) / MIB
            del g
    del output
    return MemoryStats(
        inputs=in_bytes / MIB,
        fwd_peak=fwd_peak / MIB,
        out=out_bytes / MIB,
        saved=max(0, live - out_bytes) / MIB,
        bwd_peak=bwd_peak,
        peak=max(fwd_peak / MIB, bwd_peak or 0.0),
    )
