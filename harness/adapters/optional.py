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


#: flash-attn 2's positional order after q, k, v (``flash_attn_func(q, k, v, dropout_p, softmax_scale,
#: causal, window_size, softcap, ...)``) and the values a call fills in for parameters it skips.
FA2_POSITIONAL = ("dropout_p", "softmax_scale", "causal", "window_size", "softcap")
POSITIONAL_FILL = {"dropout_p": 0.0, "softmax_scale": None, "causal": False, "window_size": (-1, -1), "softcap": 0.0}


def positional_order(fn, declared=None) -> tuple[tuple[str, ...] | None, str]:
    """The names a positional call of ``fn`` passes after q, k, v, in order, and where the order
    comes from; ``(None, why)`` when ``fn`` has no positional form the harness can call.

    ``declared`` (a callable's ``"positional"`` capability, e.g. :data:`FA2_POSITIONAL`) wins: a
    wrapper over ``*args`` can only say so. Otherwise the signature's positional-or-keyword
    parameters after the first three."""
    if declared:
        return tuple(declared), "declared"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, "its signature cannot be read and it declares no 'positional' order"
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None, "it takes *args and declares no 'positional' order"
    names = tuple(p.name for p in params[3:] if p.kind is p.POSITIONAL_OR_KEYWORD)
    if not names:
        return None, "its parameters after q, k, v are keyword-only"
    return names, "signature"


def call_positionally(fn, head: tuple, kw: dict, order: tuple[str, ...]):
    """``fn(*head, a, b, ...)`` with the keywords of ``kw`` that ``order`` lists passed by position
    (up to the last one ``kw`` sets; a skipped one gets its default from ``fn``'s signature, else
    from :data:`POSITIONAL_FILL`, else it is an error), the rest of ``kw`` by keyword. flash-attn-4,
    for one, has ``qv`` and ``gather_kv_indices`` before ``softmax_scale``."""
    try:
        defaults = {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
    except (TypeError, ValueError):
        defaults = {}
    kw = dict(kw)
    used = [i for i, name in enumerate(order) if name in kw]
    pos = []
    for name in order[: used[-1] + 1] if used else ():
        if name in kw:
            pos.append(kw.pop(name))
        elif name in defaults or name in POSITIONAL_FILL:
            pos.append(defaults[name] if name in defaults else POSITIONAL_FILL[name])
        else:
            raise TypeError(f"positional call: no value for {name!r} (between keywords the harness passes)")
    return fn(*head, *pos, **kw)
