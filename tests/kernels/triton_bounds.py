"""Out-of-bounds accesses of a Triton kernel, caught on the CPU.

Under ``TRITON_INTERPRET=1`` every load, store and atomic of a kernel is a numpy operation on raw
addresses, and nothing checks them: a kernel that reads one row past a tensor gets whatever lies
there (and on the GPU faults, or worse, does not). :func:`bounds_checked` wraps the interpreter's
memory operations so that each enabled (unmasked) address must lie inside the storage of one of the
launch's tensor arguments (tensor descriptors: their base tensor); anything else raises
:class:`OutOfBounds` naming the operation, the program and the first stray address.
"""

from __future__ import annotations

import contextlib

import numpy as np


class OutOfBounds(AssertionError):
    pass


def _element_bytes(handle) -> int:
    return max(1, handle.get_element_ty().primitive_bitwidth // 8)


@contextlib.contextmanager
def bounds_checked():
    """Within the block, interpreted launches check every enabled address (see the module doc)."""
    from triton.runtime import interpreter as interp

    ranges: list[tuple[int, int]] = []
    builder = interp.InterpreterBuilder
    saved = {name: getattr(builder, name) for name in ("create_masked_load", "create_masked_store",
                                                        "create_atomic_rmw")}
    saved_init = interp.GridExecutor._init_args_hst

    def add(arg) -> None:
        if isinstance(arg, (tuple, list)):
            for a in arg:
                add(a)
        elif hasattr(arg, "block_shape") and hasattr(arg, "base"):
            add(arg.base)
        elif hasattr(arg, "untyped_storage"):
            s = arg.untyped_storage()
            ranges.append((s.data_ptr(), s.data_ptr() + s.nbytes()))

    def init(self, args_dev, kwargs):
        args_hst, kwargs_hst = saved_init(self, args_dev, kwargs)
        ranges.clear()
        add(list(args_hst) + list(kwargs_hst.values()))
        return args_hst, kwargs_hst

    def check(kind: str, ptrs, mask) -> None:
        enabled = np.broadcast_to(mask.data, ptrs.data.shape) if mask is not None else np.ones(ptrs.data.shape, bool)
        addrs = ptrs.data[enabled].astype(np.uint64)
        if addrs.size == 0:
            return
        width = _element_bytes(ptrs)
        inside = np.zeros(addrs.shape, dtype=bool)
        for lo, hi in ranges:
            inside |= (addrs >= lo) & (addrs + width <= hi)
        if not inside.all():
            stray = addrs[~inside]
            raise OutOfBounds(f"{kind} of {stray.size} element(s) outside every tensor argument, program "
                              f"{getattr(interp.interpreter_builder, 'grid_idx', '?')}: first at {int(stray[0]):#x}; "
                              f"arguments at {[(hex(lo), hi - lo) for lo, hi in ranges]}")

    def load(self, ptrs, mask, other, *a, **k):
        check("load", ptrs, mask)
        return saved["create_masked_load"](self, ptrs, mask, other, *a, **k)

    def store(self, ptrs, value, mask, *a, **k):
        check("store", ptrs, mask)
        return saved["create_masked_store"](self, ptrs, value, mask, *a, **k)

    def atomic(self, op, ptr, val, mask, *a, **k):
        check("atomic", ptr, mask)
        return saved["create_atomic_rmw"](self, op, ptr, val, mask, *a, **k)

    builder.create_masked_load, builder.create_masked_store, builder.create_atomic_rmw = load, store, atomic
    interp.GridExecutor._init_args_hst = init
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(builder, name, fn)
        interp.GridExecutor._init_args_hst = saved_init
