"""What the sm_90a compile reports share (ptxas_report.py, flash_attn_ptxas.py, wide_ptxas.py): the
H100 target, and Triton's bundled ptxas, whose -v report gives a kernel's registers and spills."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

TARGET = GPUTarget("cuda", 90, 32)
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
