"""What the sm_90a compile reports share (ptxas_report.py, flash_attn_ptxas.py, fp8_gluon_ptxas.py,
wide_ptxas.py): the H100 target, a compile bound the way Triton's launcher binds a call, and Triton's
bundled ptxas, whose -v report gives a kernel's registers and spills."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)


def compile_call(fn, call: dict):
    """``fn`` (a @triton.jit or @gluon.jit function) compiled for sm_90a with the keyword arguments
    ``call`` (tensors may live on the CPU), bound by the launcher's own binder: 16-byte divisible
    pointers and integers carry their divisibility, as on a GPU launch."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(TARGET)
    bound, spec, options = create_function_from_signature(fn.signature, fn.params, backend)(**call)
    options, signature, constexprs, attrs = fn._pack_args(backend, call, bound, spec, options)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source
    else:
        source = ASTSource
    return triton.compile(source(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_usage(ptx: str) -> dict:
    """{"regs", "spill_stores", "spill_loads"} (bytes) of ``ptx`` assembled for sm_90a; -1 where
    ptxas reported nothing. "log": ptxas's whole report (its warnings, e.g. serialised wgmmas)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        err = subprocess.run([PTXAS, "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", err)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", err)
    return {"regs": int(regs.group(1)) if regs else -1,
            "spill_stores": int(spill.group(1)) if spill else -1, "spill_loads": int(spill.group(2)) if spill else -1,
            "log": err}
