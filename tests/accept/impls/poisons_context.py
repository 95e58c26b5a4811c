"""Wrong on causal cases, as an illegal memory access is on a GPU: the call raises, and the process's
CUDA context stays broken (every later call raises the same error). Simulated on the CPU by telling
the child's context check that the context is lost, as ``torch.cuda.synchronize`` would. Right on
every other case in a process that has not met a causal one."""

from __future__ import annotations

import harness.accept.runner as _runner

try:
    from .correct_softmax import flash_attn_func as _correct
except ImportError:  # imported as a top-level module from this directory
    from correct_softmax import flash_attn_func as _correct

_POISONED = False
ERROR = "CUDA error: an illegal memory access was encountered (simulated)"


def flash_attn_func(q, k, v, **kw):
    global _POISONED
    if _POISONED:
        raise RuntimeError(ERROR)
    if not kw.get("causal"):
        return _correct(q, k, v, **kw)
    _POISONED = True
    _runner._context_lost = lambda device: f"AcceleratorError: {ERROR}"
    raise RuntimeError(ERROR)
