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

import torch

from harness.adapters.base import LinearAdapter, LinearOutput, Unsupported, default_scale
from harness.adapters.optional import call_params, import_attr
from harness.adapters.registry import register
from harness.cases import LinearCase


@functools.cache
def _probe(attr: str):
    """(function, None) or (None, reason) for ``fla.ops.simple_gla.<attr>``."""
    return import_attr("fla.ops.simple_gla", attr, label="fla")


class _FLAAdapter(LinearAdapter):
    function: str = ""
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
        return None

    def run(self, case: LinearCase, *, q, k, v, g=None, g_gamma=None, initial_state=None) -> LinearOutput:
        fn, why = _probe(self.function)
        if fn is None:
            raise Unsupported(why)
        kw = dict(scale=default_scale(case), initial_state=initial_state, output_final_state=True)
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
