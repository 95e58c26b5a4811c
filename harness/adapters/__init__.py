"""Backend adapters: the contract (:mod:`.base`) and the one registry (:mod:`.registry`).

Importing this package imports no backend and no optional dependency; the built-in adapter
modules load on the first registry lookup, and each probes its optional package only when a
case first needs it.
"""

from harness.adapters.base import (
    Adapter,
    LinearAdapter,
    LinearOutput,
    SoftmaxAdapter,
    SoftmaxOutput,
    Unsupported,
    default_scale,
)
from harness.adapters.registry import (
    BUILTIN_MODULES,
    ENTRY_POINT_GROUP,
    all_adapters,
    from_spec,
    get,
    names,
    register,
)

__all__ = [
    "BUILTIN_MODULES",
    "ENTRY_POINT_GROUP",
    "Adapter",
    "LinearAdapter",
    "LinearOutput",
    "SoftmaxAdapter",
    "SoftmaxOutput",
    "Unsupported",
    "all_adapters",
    "default_scale",
    "from_spec",
    "get",
    "names",
    "register",
]
