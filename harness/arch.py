"""GPU architectures the GPU suite is matrixed over, and what each must run.

``REQUIRED`` is the one table of expectations: on a GPU of that architecture, in that dtype,
every listed backend must be registered and run the GPU suite's cases; a required backend that
is missing or unsupported fails ``nox -s gpu-tests`` instead of being skipped.
``WHEN_INSTALLED`` backends become required as soon as their package is importable there.
"""

from __future__ import annotations

import importlib.util

ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")
# fp8 is in no row: no adapter in the registry runs fp8 attention with gradients (FA3's fp8
# path is forward-only and FA3 is not installable on the GPU box); add it when one does.
DTYPES = ("fp16", "bf16", "fp32")

_HALF = ("sdpa_math", "sdpa_flash", "sdpa_efficient", "triton_fa", "triton_la_chunk", "eager", "eager_linear")
_FP32 = ("sdpa_math", "sdpa_efficient", "triton_fa", "triton_la_chunk", "eager", "eager_linear")

REQUIRED: dict[tuple[str, str], tuple[str, ...]] = {}
for _arch in ARCHS:
    for _dt in DTYPES:
        req = _FP32 if _dt == "fp32" else _HALF
        # cuDNN attention in torch targets sm80+ half precision; checked on sm90 here.
        if _dt != "fp32" and _arch in ("sm90", "sm100"):
            req = req + ("sdpa_cudnn",)
        REQUIRED[(_arch, _dt)] = req

# Backends required whenever their package is installed: (backend, module probed, archs, dtypes).
# FA2 is probed by its own module: flash-attn-4 installs into the same ``flash_attn`` package.
WHEN_INSTALLED = (
    ("flash_attn", "flash_attn.flash_attn_interface", ARCHS, ("fp16", "bf16")),
    ("flash_attn3", "flash_attn_interface", ("sm90",), ("fp16", "bf16")),
    ("flash_attn_cute", "flash_attn.cute", ("sm90", "sm100"), ("fp16", "bf16")),
    ("fla_chunk", "fla", ARCHS, ("fp16", "bf16")),
)


# Required linear backends are held to a per-step-gate case ("g"); one listed here that refuses it
# on the machine at hand (its supports() gives the reason, which the test reports) is held to the
# gate named here instead. fla_chunk: harness.adapters.fla.gated_chunk_backward_refusal says when
# and why (not imported here: this module stays torch-free for nox); the adapter matrix covers
# every gate it runs.
GATE_FALLBACK = {"fla_chunk": "g_gamma"}


def arch_of(capability: tuple[int, int]) -> str:
    """(9, 0) -> 'sm90'; (12, 0) -> 'sm120'."""
    major, minor = capability
    return f"sm{major}{minor}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except Exception:  # a broken optional package is "not installed" here; its adapter says why
        return False


def required_backends(arch: str, dtype: str) -> tuple[str, ...]:
    """Backends that must run on ``arch`` in ``dtype`` (installed optional ones included)."""
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {', '.join(ARCHS)}, got {arch!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    extra = tuple(
        name for name, module, archs, dtypes in WHEN_INSTALLED if arch in archs and dtype in dtypes and _installed(module)
    )
    return REQUIRED[(arch, dtype)] + extra


def probe() -> dict:
    """The CUDA devices visible here: {'count': N, 'archs': ['sm90', ...], 'names': [...]}."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "count": n,
        "archs": [arch_of(torch.cuda.get_device_capability(i)) for i in range(n)],
        "names": [torch.cuda.get_device_name(i) for i in range(n)],
    }


if __name__ == "__main__":  # `python -m harness.arch`: the probe as JSON (used by the nox sessions)
    import json

    print(json.dumps(probe()))
