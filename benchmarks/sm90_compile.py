"""What the sm_90a compile reports share (ptxas_report.py, flash_attn_ptxas.py, fp8_gluon_ptxas.py,
wide_ptxas.py): the H100 target, a compile bound the way Triton's launcher binds a call, Triton's
bundled ptxas, whose -v report gives a kernel's registers and spills, and its nvdisasm, whose SASS
gives each loop's instruction mix (``sass_loops``)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)
#: PTX (its sha256) -> the ``ptxas -v`` report of Triton's own assembly of it in this process (``_keep_ptxas_logs``)
_PTXAS_LOGS: dict[str, str] = {}


def _ptx_key(ptx: str) -> str:
    return hashlib.sha256(ptx.encode()).hexdigest()


def _keep_ptxas_logs() -> None:
    """Keep the report of the ``ptxas -v`` run Triton's compile makes (its cubin stage passes ``-v`` and prints the
    report when ``knobs.nvidia.dump_ptxas_log`` is set) by its PTX, so that :func:`ptxas_usage` reads it instead of
    assembling the same PTX a second time: half of the subprocess time of a cold compile (session 52: the CPU suite's
    sm_90a fixtures). A compile that Triton's cache answers runs no ptxas: :func:`ptxas_usage` runs its own then."""
    from triton import knobs
    from triton.backends.nvidia.compiler import CUDABackend

    made = CUDABackend.make_cubin
    if getattr(made, "keeps_ptxas_logs", False):
        return

    def make_cubin(self, src, metadata, opt, capability):
        out, before = io.StringIO(), knobs.nvidia.dump_ptxas_log
        knobs.nvidia.dump_ptxas_log = True
        try:
            with contextlib.redirect_stdout(out):
                cubin = made(self, src, metadata, opt, capability)
        finally:
            knobs.nvidia.dump_ptxas_log = before
        _PTXAS_LOGS[_ptx_key(src)] = out.getvalue()
        return cubin

    make_cubin.keeps_ptxas_logs = True
    CUDABackend.make_cubin = make_cubin


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
    _keep_ptxas_logs()
    return triton.compile(source(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def ptxas_usage(ptx: str) -> dict:
    """{"regs", "spill_stores", "spill_loads"} (bytes) of ``ptx`` assembled for sm_90a; -1 where
    ptxas reported nothing. "log": ptxas's whole report (its warnings, e.g. serialised wgmmas): the report of
    Triton's own assembly where :func:`compile_call` made this PTX in this process, else this function's run."""
    err = _PTXAS_LOGS.get(_ptx_key(ptx))
    if err is None:
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
NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_SASS_LABEL = re.compile(r"^\s*\.(L_x_\d+):")
_SASS_BRANCH = re.compile(r"BRA\s+`?\(?\.(L_x_\d+)")


def sass_loops(cubin: bytes, min_len: int = 100) -> list[dict]:
    """Each loop of a compiled kernel's SASS (a branch back to an earlier label; nested loops are listed
    with their bodies, the outer ones holding the inner ones) of at least ``min_len`` instructions, in
    address order: {"start", "end" (byte addresses), "count", "ops" (a Counter of opcodes without their
    modifiers: MUFU, SHFL, QGMMA, ...)}. Per iteration of an inner loop, "count" is what one warp issues."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([NVDISASM, "-c", path], capture_output=True, text=True, check=True).stdout
    labels, instrs, pending = {}, [], []
    for line in sass.splitlines():
        m = _SASS_LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _SASS_LINE.search(line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            instrs.append((addr, m.group(2)))
    loops = []
    for addr, text in instrs:
        m = _SASS_BRANCH.search(text)
        if not m or labels.get(m.group(1), addr) >= addr:
            continue
        body = [t for a, t in instrs if labels[m.group(1)] <= a <= addr]
        if len(body) >= min_len:
            ops = collections.Counter(t.split()[1 if t.startswith("@") else 0].split(".")[0] for t in body)
            loops.append({"start": labels[m.group(1)], "end": addr, "count": len(body), "ops": ops})
    return sorted(loops, key=lambda x: x["start"])
