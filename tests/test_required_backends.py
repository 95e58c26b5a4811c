"""On a GPU: every backend the architecture requires (harness/arch.py) runs and passes.

``nox -s gpu-tests`` passes the list in ``ATTN_HARNESS_REQUIRE``; run directly, the list comes
from the GPU present. A required backend that is missing or unsupported FAILS here (it is never
skipped): a GPU CI job must not go green because a backend silently disappeared.
"""

import os
import warnings

import pytest
import torch

from harness.adapters import registry
from harness.arch import DTYPES, GATE_FALLBACK, arch_of, required_backends
from harness.cases import LinearCase, SoftmaxCase
from harness.check.verify import verify


def _params():
    env = os.environ.get("ATTN_HARNESS_REQUIRE")
    dtypes = [os.environ["ATTN_HARNESS_DTYPE"]] if os.environ.get("ATTN_HARNESS_DTYPE") else list(DTYPES)
    if env:
        return [(name, dt) for dt in dtypes for name in env.split(",") if name]
    if not torch.cuda.is_available():
        return []
    arch = arch_of(torch.cuda.get_device_capability())
    return [(name, dt) for dt in dtypes for name in required_backends(arch, dt)]


def _representative(family: str, dtype: str, gate: str = "g"):
    """A GPU-sized case with causal masking and GQA (softmax) or a per-step gate (linear)."""
    if family == "softmax":
        return SoftmaxCase(2, 8, 2, 256, 256, 64, causal=True, dtype=dtype)
    return LinearCase(2, 4, 256, 64, gate=gate, dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,dtype", _params() or [pytest.param(None, None, marks=pytest.mark.skip(
    reason="no CUDA device visible, so no architecture to require backends for"))])
def test_required_backend_runs_and_passes(backend, dtype):
    try:
        adapter = registry.get(backend)
    except KeyError as e:
        pytest.fail(f"required backend {backend!r} is not registered here: {e}")
    case = _representative(adapter.family, dtype)
    reason = adapter.supports(case, torch.device("cuda"))
    if reason is not None and adapter.family == "linear" and backend in GATE_FALLBACK:
        # a refusal harness/arch.py records: held to the fallback gate instead, saying why
        warnings.warn(f"{backend} held to gate {GATE_FALLBACK[backend]!r} instead of 'g': {reason}", stacklevel=1)
        case = _representative(adapter.family, dtype, GATE_FALLBACK[backend])
        reason = adapter.supports(case, torch.device("cuda"))
    assert reason is None, f"required backend {backend} cannot run {case.id}: {reason}"
    result = verify(adapter, case, seed=0, device="cuda")
    assert result.passed, result.message()
