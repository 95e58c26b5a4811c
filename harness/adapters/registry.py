"""The one registry of adapters.

Built-in adapters live in the modules of ``BUILTIN_MODULES``; each module calls :func:`register`
at import. Those modules import nothing optional at top level: optional packages (flash_attn,
fla, ...) are probed inside ``supports`` / ``run`` the first time they are needed.

Vendor packages register through the entry-point group ``attn_harness.adapters``: each entry
point names an :class:`Adapter` subclass, an instance, or a zero-argument factory returning one.
A user's callable joins with :func:`from_spec` ("module:function").
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings

from harness.adapters.base import Adapter

ENTRY_POINT_GROUP = "attn_harness.adapters"

BUILTIN_MODULES = (
    "harness.adapters.eager",
    "harness.adapters.torch_sdpa",
    "harness.adapters.flex",
    "harness.adapters.flash_attn",
    "harness.adapters.fla",
    "harness.adapters.inrepo",
    "harness.adapters.decode",
    "harness.adapters.cudnn_fp8",
    "harness.adapters.flashinfer_fp8",
)

_REGISTRY: dict[str, Adapter] = {}
_loaded = False


def register(adapter: Adapter | type[Adapter], *, replace: bool = False) -> Adapter:
    """Add an adapter (instance or class) under its ``name``; returns the instance."""
    inst = adapter() if isinstance(adapter, type) else adapter
    if not isinstance(inst, Adapter):
        raise TypeError(f"adapter: expected an Adapter subclass or instance, got {type(inst).__name__}")
    if inst.name in _REGISTRY and not replace and _REGISTRY[inst.name] is not inst:
        raise ValueError(f"adapter: the name {inst.name!r} is already registered")
    _REGISTRY[inst.name] = inst
    return inst


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real import error inside an existing module must surface
                raise
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, (type, Adapter)):
                obj = obj()
            register(obj, replace=True)
        except Exception as e:  # a broken vendor plugin must not take the harness down
            warnings.warn(f"entry point {ep.name!r} ({ep.value}) of {ENTRY_POINT_GROUP} failed to load: {e}")


def get(name: str) -> Adapter:
    """The adapter registered as ``name``; ``module:function`` specs are turned into callables'
    adapters (family inferred softmax; use :func:`from_spec` to choose)."""
    _load()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        return from_spec(name)
    raise KeyError(f"unknown backend {name!r}; known: {', '.join(sorted(_REGISTRY))}")


def all_adapters(family: str | None = None) -> list[Adapter]:
    """Every registered adapter (of ``family`` when given), in registration order."""
    _load()
    return [a for a in _REGISTRY.values() if family is None or a.family == family]


def names(family: str | None = None) -> list[str]:
    return [a.name for a in all_adapters(family)]


def from_spec(spec: str, family: str = "softmax", *, name: str | None = None) -> Adapter:
    """Wrap a user's callable, given as ``module:function``, in an adapter and register it.

    Softmax callables follow flash-attn's ``fn(q, k, v, *, causal=False, softmax_scale=None,
    window_size=(-1, -1), ...) -> out or (out, lse)``; linear ones FLA's ``fn(q, k, v, g=None,
    g_gamma=None, *, scale=None, initial_state=None, output_final_state=False) -> (o, final_state)``.
    """
    from harness.adapters.user import load_callable, make_callable_adapter

    fn = load_callable(spec)
    adapter = make_callable_adapter(fn, family=family, name=name or spec)
    return register(adapter, replace=True)
