"""Probing optional packages (flash-attn, FLA, ...) without importing them at module top level.

Adapters call these the first time they need a backend; a missing or broken package becomes a
reason in words (what ``supports`` returns), never an import error at harness start-up.
"""

from __future__ import annotations

import functools
import importlib
import inspect


def import_attr(module: str, attr: str, *, label: str | None = None):
    """``(obj, None)`` for ``module.attr``, or ``(None, reason)`` when it cannot be had.

    ``label`` names the package in the reason (default: ``module``).
    """
    label = label or module
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return None, f"{label} not installed ({e})"
    except Exception as e:  # a broken install (ABI mismatch, missing CUDA libs) is a reason too
        return None, f"{label} failed to import: {type(e).__name__}: {e}"
    obj = getattr(mod, attr, None)
    if obj is None:
        return None, f"{module} has no {attr} (not installed, or an unsupported version)"
    return obj, None


@functools.cache
def call_params(fn) -> frozenset[str]:
    """Names of ``fn``'s parameters (empty when its signature cannot be read): which keyword
    arguments a backend's version accepts."""
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()
