"""Triton's interpreter without two of its repeated costs (the CPU suite's speed; same results).

Under ``TRITON_INTERPRET=1`` the kernels run as Python over numpy, and two costs repeat in Triton 3.6
without changing anything:

* A launch (``GridExecutor.__call__``) swaps the language's builtins for numpy-backed ones, runs every
  program, then puts them back. Every call of a ``@triton.jit`` helper inside the kernel
  (``InterpretedFunction.__call__``) re-runs that swap: ``inspect.getmembers`` over ``tl``,
  ``tl.tensor``, ``tl.math`` and the tensor-descriptor type, finding every builtin already swapped.
  :func:`patch_lang_once_per_launch` skips a helper's swap when the launch has already swapped every
  language module the helper sees (its globals' ``tl`` / ``tl.core``); any other helper, and every
  call outside a launch, is swapped as before. (The helpers' swaps were never undone: a launch now
  leaves ``triton.language`` as it found it.)
* ``_get_np_dtype`` (a Triton type to its numpy storage type, for every operation) builds its table
  of 18 types on each call. :func:`memoize_np_dtype` keeps each answer: Triton types compare and hash
  by name, and the answer depends on the type alone.

Together they take 30-35 % off the interpreted kernel tests (one process, triton 3.6.0; the first
alone about 25 %). tests/test_interpreter_patching.py checks that results are bitwise unchanged.
Applied to the Triton versions they were checked on only (:data:`CHECKED_VERSIONS`).
"""

from __future__ import annotations

import threading

#: The Triton releases whose interpreter these were checked against (3.6.0: CI and the GPU box).
CHECKED_VERSIONS = ("3.6.",)


def install() -> list[str]:
    """Apply both (idempotent); the names of those applied (none on another Triton version)."""
    import triton

    if not triton.__version__.startswith(CHECKED_VERSIONS):
        return []
    return [f.__name__ for f in (patch_lang_once_per_launch, memoize_np_dtype) if f()]


def patch_lang_once_per_launch() -> bool:
    import triton.language as tl
    from triton.runtime import interpreter as ti

    if not all(hasattr(ti, n) for n in ("_patch_lang", "_LangPatchScope", "GridExecutor", "InterpretedFunction")):
        return False
    if getattr(ti._patch_lang, "once_per_launch", False):
        return True
    real_patch, real_launch = ti._patch_lang, ti.GridExecutor.__call__
    local = threading.local()  # per thread: the language modules the running launch swapped

    def patch_lang(fn):
        swapped = getattr(local, "swapped", None)
        mods = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if swapped is not None and mods and mods <= swapped:
            return ti._LangPatchScope()  # nothing to swap; the launch's own scope restores
        if swapped is not None:
            swapped |= mods
        return real_patch(fn)

    def launch(self, *args, **kwargs):
        outer = getattr(local, "swapped", None)
        local.swapped = set()
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            local.swapped = outer

    patch_lang.once_per_launch = True
    patch_lang.real, launch.real = real_patch, real_launch  # for tests/test_interpreter_patching.py
    ti._patch_lang = patch_lang
    ti.GridExecutor.__call__ = launch
    return True


def memoize_np_dtype() -> bool:
    from triton.runtime import interpreter as ti

    if not hasattr(ti, "_get_np_dtype"):
        return False
    if getattr(ti._get_np_dtype, "memoized", False):
        return True
    real = ti._get_np_dtype
    known: dict = {}

    def get_np_dtype(tt_dtype):
        try:
            found = known.get(tt_dtype)
        except TypeError:  # not hashable: as before
            return real(tt_dtype)
        if found is None:
            found = known[tt_dtype] = real(tt_dtype)
        return found

    get_np_dtype.memoized = True
    get_np_dtype.real = real
    ti._get_np_dtype = get_np_dtype
    return True
