"""Registers, spills and the key loop's SASS of the decode split kernel for sm_90a, without a GPU.

    python benchmarks/decode_ptxas.py [--fuse-append both|on|off] [--cases TEXT] [--json]

Calls ``kernels.decode.decode_attention`` on CPU tensors of real models' decode steps with the kernels'
launches intercepted (``launcher.launch``: the interface works out every argument, config and grid as it
would on a GPU), then compiles the split kernel's launch for an H100 target (``sm90_compile.compile_call``:
pointers and ints carry the divisibility a GPU launch gives them) and runs Triton's bundled ptxas and
nvdisasm: registers, spills, and the instructions of the kernel's loops (the key loop first; "loads" counts
LDG / LDGSTS / UTMALDG, "mma" HMMA / HGMMA), shared memory, and the programs an SM holds by each. ``--fuse-append`` compiles the config's ``fuse_append`` off, on
or both (the split kernel appending the new tokens itself, interface.DecodeConfig): the key loop should be
the same instructions either way, the epilogue block holding the new tokens the only addition.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from sm90_compile import compile_call, ptxas_usage, sass_loops  # noqa: E402

from harness.cases import DecodeCase, make_decode_inputs  # noqa: E402
from kernels import launcher  # noqa: E402
from kernels.decode import interface  # noqa: E402

#: (name, case): the decode preset's kinds of step: GQA with vLLM's 16-token pages (a table entry per key),
#: 64-token pages (one per block), MQA with speculative tokens, and absorbed MLA (576 / 512, the wide config)
CASES = (
    ("Llama-3-8B B8 L4096 paged 16", DecodeCase(8, 32, 8, 1, 4096, 128, page_size=16, dtype="bf16")),
    ("Llama-3-8B B8 L4096 paged 64", DecodeCase(8, 32, 8, 1, 4096, 128, page_size=64, dtype="bf16")),
    ("MQA B8 L4096 4 new tokens", DecodeCase(8, 32, 1, 4, 4096, 128, dtype="bf16")),
    ("MLA absorbed B8 L4096 576/512", DecodeCase(8, 128, 1, 1, 4096, 576, d_v=512, page_size=64, dtype="bf16")),
)


#: An H100 SM's register file (32-bit registers) and the shared memory its programs may take (bytes)
SM_REGISTERS, SM_SHARED = 65536, 227 * 1024


def split_launch(case: DecodeCase, fuse: bool) -> tuple:
    """(kernel, kwargs with the launch options) of the split kernel for one step of ``case``, as the interface
    builds it (its default config for the head dims, ``fuse_append`` set to ``fuse``)."""
    x = make_decode_inputs(case, seed=0, device="cpu")
    base = interface.CONFIG if max(case.d, case.d_v) <= 256 else interface.WIDE_CONFIG
    seen = []

    def capture(jit_fn, grid, kwargs, **options):
        seen.append((jit_fn, dict(kwargs, **options)))

    real = launcher.launch
    launcher.launch = capture
    try:
        interface.decode_attention(x.q, x.k_cache, x.v_cache, x.k, x.v, cache_seqlens=x.cache_seqlens,
                                   block_table=x.block_table, num_splits=4, validate=False,
                                   config=dataclasses.replace(base, fuse_append=fuse))
    finally:
        launcher.launch = real
    (fn, call), = [(f, c) for f, c in seen if f.fn.__name__ == "_split_kernel"]
    return fn, call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuse-append", choices=("both", "on", "off"), default="both")
    ap.add_argument("--cases", default="", help="only the steps whose name matches this regular expression")
    ap.add_argument("--json", action="store_true", help="one JSON list of the rows instead of the table")
    args = ap.parse_args(argv)
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.fuse_append]
    rows = []
    for name, case in CASES:
        if not re.search(args.cases, name):
            continue
        for fuse in modes:
            fn, call = split_launch(case, fuse)
            compiled = compile_call(fn, call)
            use = ptxas_usage(compiled.asm["ptx"])
            shared, warps = compiled.metadata.shared, compiled.metadata.num_warps
            by_regs = SM_REGISTERS // (max(use["regs"], 1) * 32 * warps)
            by_shared = SM_SHARED // shared if shared else by_regs
            loops = [{"count": lp["count"], "loads": sum(lp["ops"][o] for o in ("LDG", "LDGSTS", "UTMALDG")),
                      "mma": sum(lp["ops"][o] for o in ("HMMA", "HGMMA"))}
                     for lp in sass_loops(compiled.asm["cubin"], min_len=20)]
            rows.append({"step": name, "fuse_append": fuse, "regs": use["regs"], "spill_stores": use["spill_stores"],
                         "spill_loads": use["spill_loads"], "shared": shared, "by_regs": by_regs,
                         "by_shared": by_shared, "programs": min(by_regs, by_shared), "loops": loops})
            if args.json:
                continue
            if len(rows) == 1:
                print("| step | fuse_append | registers | spill stores / loads (bytes) | shared KiB | programs an SM "
                      "(registers, shared) | loops: instructions (loads, mma) |")
                print("|---|---|---|---|---|---|---|")
            r = rows[-1]
            shown = ", ".join(f"{lp['count']} ({lp['loads']}, {lp['mma']})" for lp in loops)
            print(f"| {name} | {'on' if fuse else 'off'} | {r['regs']} | {r['spill_stores']} / {r['spill_loads']} | "
                  f"{shared / 1024:.1f} | {r['programs']} ({by_regs}, {by_shared}) | {shown or '-'} |", flush=True)
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    sys.exit(main())
