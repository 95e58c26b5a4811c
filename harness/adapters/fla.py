"""flash-linear-attention (``fla`` from fla-core): the simple_gla kernels for the linear family.

* ``fla_chunk``: ``fla.ops.simple_gla.chunk_simple_gla`` (chunked, many small kernels);
* ``fla_fused_chunk``: ``fused_chunk_simple_gla`` (one fused kernel; fastest at D = 64 on the H100);
* ``fla_recurrent``: ``fused_recurrent_simple_gla`` (step by step).

FLA's signature is the harness's: ``fn(q, k, v, g=None, g_gamma=None, scale=None,
initial_state=None, output_final_state=False) -> (o, final_state)`` in (B, T, H, K) layout, the
state (B, H, K, V). fla-core 0.6 has no ``head_first`` (passing it raises); older versions that
declare it get ``head_first=False``. The Triton kernels need a CUDA device; fla is probed once.
"""

from __future__ import annotations

import functools
import os

import torch

from harness.adapters.base import LinearAdapter, LinearOutput, Unsupported, scale_kwargs
from harness.adapters.optional import call_params, import_attr
from harness.adapters.registry import register
from harness.cases import LinearCase


@functools.cache
def _probe(attr: str):
    """(function, None) or (None, reason) for ``fla.ops.simple_gla.<attr>``."""
    return import_attr("fla.ops.simple_gla", attr, label="fla")


#: ``ATTN_HARNESS_FLA_AUTOTUNE=0``: FLA's autotuners take their first (pruned) config instead of
#: compiling and timing every one. For correctness runs (``nox -s gpu-tests`` sets it): on the
#: H100, first-time tuning cost ~100 s per small case (fla_chunk: 651 s for 6 cases of
#: ``python -m harness run``), far more than the check itself. Never set it for benchmarks.
AUTOTUNE_ENV = "ATTN_HARNESS_FLA_AUTOTUNE"


@functools.cache
def pin_first_configs() -> bool:
    """Make FLA's Triton autotuners choose their first pruned config without compiling the others
    (only autotuners of functions defined in ``fla``; everyone else's tuning is untouched)."""
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.prune_configs

    def prune_configs(self, *args, **kwargs):
        pruned = original(self, *args, **kwargs)
        if getattr(self.base_fn, "__module__", "").startswith("fla.") and len(pruned) > 1:
            return pruned[:1]  # the tuner then compiles and times this one only
        return pruned

    Autotuner.prune_configs = prune_configs
    return True


def pin_if_requested() -> None:
    """Pin FLA's tuners (pin_first_configs) when ATTN_HARNESS_FLA_AUTOTUNE=0 asks for it: the adapter
    and any test that calls FLA directly go through here."""
    if os.environ.get(AUTOTUNE_ENV, "1") == "0":
        pin_first_configs()


@functools.cache
def gated_chunk_backward_refusal() -> str | None:
    """fla-core 0.6 refuses the per-step-gate backward of its chunk kernels on Hopper with Triton
    3.4 to 3.7.0 (wrong results, its issue #640) unless tilelang is installed: say so up front, in
    FLA's own terms, instead of erroring mid-backward."""
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:
        return None  # another fla version: let it run and speak for itself
    if not (IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1):
        return None
    import importlib.util

    if importlib.util.find_spec("tilelang") is not None:
        return None
    import triton

    return (f"fla refuses the per-step-gate (g) chunk backward on Hopper with Triton {triton.__version__} "
            "(wrong results, fla issue #640): needs Triton >= 3.7.1 or tilelang")


class _FLAAdapter(LinearAdapter):
    function: str = ""
    compiles_per_shape = True  # Triton kernels
    # FLA's simple_gla kernels treat g_gamma as a constant decay: no gradient reaches it.
    nondifferentiable_inputs = ("g_gamma",)

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        fn, why = _probe(self.function)
        if fn is None:
            return why
        if torch.device(device).type != "cuda":
            return "fla needs a CUDA device (its Triton kernels run on the GPU)"
        if case.dtype == "fp64":
            return "fla's Triton kernels take fp16/bf16/fp32, not fp64"
        if self.function == "chunk_simple_gla" and case.gate == "g":
            return gated_chunk_backward_refusal()
        return None

    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput:
        fn, why = _probe(self.function)
        if fn is None:
            raise Unsupported(why)
        pin_if_requested()
        kw = dict(**scale_kwargs(case, "scale"), initial_state=initial_state, output_final_state=True)
        if g is not None:
            kw["g"] = g
        if g_gamma is not None:
            if "g_gamma" not in call_params(fn):
                raise Unsupported(f"this fla version's {self.function} has no g_gamma")
            kw["g_gamma"] = g_gamma
        if "head_first" in call_params(fn):
            kw["head_first"] = False
        o, final_state = fn(q, k, v, **kw)
        return LinearOutput(o, final_state)


class FLAChunk(_FLAAdapter):
    name = "fla_chunk"
    function = "chunk_simple_gla"
    description = "fla simple_gla, chunked Triton kernels (chunk_simple_gla)"


class FLAFusedChunk(_FLAAdapter):
    name = "fla_fused_chunk"
    function = "fused_chunk_simple_gla"
    description = "fla simple_gla, one fused chunk kernel (fused_chunk_simple_gla)"


class FLARecurrent(_FLAAdapter):
    name = "fla_recurrent"
    function = "fused_recurrent_simple_gla"
    description = "fla simple_gla, fused recurrent kernel (fused_recurrent_simple_gla)"


for _cls in (FLAChunk, FLAFusedChunk, FLARecurrent):
    register(_cls)
