"""Tile and launch choices of the in-repo decode kernel, measured side by side (issue 18).

    python benchmarks/tune_decode.py [--cases ID,ID] [--configs NAME,NAME] [--out DIR]

For each case (default: the decode preset's cells the issue's bar is set on, plus the ones the
first GPU run found weak) and each named :class:`kernels.decode.interface.DecodeConfig`, the kernel
is captured in a CUDA graph (``validate=False``, the cache append included) and timed with the
harness's loop (CUDA events, warm-up, median; L2 flushed between repetitions). Each config's output
is compared with the default config's on the same inputs (a tuning run must not buy speed with a
wrong answer). Prints GB/s (``harness.perf.flops.decode_bytes``) and its share of the copy rate
measured in the same run, and writes tune.json / tune.md to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.cases import DecodeCase, case_from_id, make_decode_inputs  # noqa: E402
from harness.perf.flops import decode_bytes  # noqa: E402
from harness.perf.roofline import measure_copy_gbps  # noqa: E402
from harness.perf.timing import time_callable  # noqa: E402
from kernels.decode.interface import CONFIG, WIDE_CONFIG, decode_attention  # noqa: E402

DEFAULT_CASES = (
    "B16-H32/8-Q1-L32768r-P64-new-D128-bf16",
    "B8-H32/8-Q1-L8192-P64-new-D128-bf16",
    "B32-H32/8-Q1-L16384r-P64-new-D128-bf16",
    "B16-H32/8-Q1-L32768r-P16-new-D128-bf16",
    "B1-H32/8-Q1-L131072-P64-new-D128-bf16",
    "B16-H32/1-Q1-L32768r-P64-new-D128-bf16",
    "B8-H32-Q1-L16384r-P64-new-D128-bf16",
    "B16-H32/8-Q1-L32768r-P64-new-D128-win4095x0-bf16",
    "B32-H128/1-Q1-L4096r-P64-new-D576v512-bf16",
)
_R = dataclasses.replace
CONFIGS = {
    "default": CONFIG,
    "ppsm2": _R(CONFIG, programs_per_sm=2),
    "ppsm4": _R(CONFIG, programs_per_sm=4),
    "chunk1k": _R(CONFIG, min_chunk=1024),
    "share20": _R(CONFIG, max_partial_share=0.2),
    "s4": _R(CONFIG, num_stages=4),
    "n128": _R(CONFIG, block_n=128),
    "n128w8": _R(CONFIG, block_n=128, num_warps=8),
    "fuse": _R(CONFIG, fuse_append=True),  # the split kernel appends the new tokens itself: no append launch
    # head dims above 256 (absorbed MLA)
    "wide": WIDE_CONFIG,
    "wide-r64": _R(WIDE_CONFIG, block_r_max=64),
    "wide-r64n16": _R(WIDE_CONFIG, block_r_max=64, block_n=16),
    "wide-r32": _R(WIDE_CONFIG, block_r_max=32),
    "wide-w4": _R(WIDE_CONFIG, num_warps=4),
    "wide-r64s1": _R(WIDE_CONFIG, block_r_max=64, num_stages=1),
    "wide-fuse": _R(WIDE_CONFIG, fuse_append=True),
}
WIDE_NAMES = {n for n in CONFIGS if n.startswith("wide")}


def run_case(case: DecodeCase, names: list[str], device, copy_gbps: float) -> list[dict]:
    x = make_decode_inputs(case, seed=0, device=device)
    t = x.tensors()
    wide = max(case.d, case.d_v) > 256
    rows, ref = [], None
    for name in names:
        if (name in WIDE_NAMES) != wide:
            continue
        cfg = CONFIGS[name]
        k_cache, v_cache = t["k_cache"].clone(), t["v_cache"].clone()

        def step(cfg=cfg, k_cache=k_cache, v_cache=v_cache):
            return decode_attention(t["q"], k_cache, v_cache, t.get("k"), t.get("v"), cache_seqlens=t["cache_seqlens"],
                                    block_table=t.get("block_table"), causal=case.causal, window_size=case.window,
                                    softcap=case.softcap, softmax_scale=case.scale, validate=False, config=cfg)

        try:
            out = step()
            torch.cuda.synchronize(device)
            err = None
            if ref is None:
                ref = out.float()
            else:
                err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                step()
            timing = time_callable(graph.replay, device, flush=True)
        except Exception as e:  # a config that does not compile or fit is reported, the sweep goes on
            rows.append({"case": case.id, "config": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"})
            print(f"{case.id:50s} {name:10s} {rows[-1]['error']}", flush=True)
            continue
        ms = timing.median_ms
        gbps = decode_bytes(case) / ms / 1e6
        rows.append({"case": case.id, "config": name, "params": dataclasses.asdict(cfg), "ms": ms,
                     "spread": timing.spread, "gbps": gbps, "of_copy": gbps / copy_gbps, "diff_vs_default": err})
        print(f"{case.id:50s} {name:10s} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / copy_gbps:5.1f}%"
              + (f"  diff {err:.1e}" if err is not None else ""), flush=True)
        del graph
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out", default="reports/tune-decode")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_decode: needs a CUDA GPU (it times the kernel from a CUDA graph)", file=sys.stderr)
        return 2
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"tune_decode: unknown config(s) {unknown}; known: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    copy = measure_copy_gbps(device)
    print(f"copy rate {copy:.0f} GB/s ({torch.cuda.get_device_name(device)})", flush=True)
    rows = []
    for cid in (c for c in args.cases.split(",") if c):
        rows += run_case(case_from_id(cid), names, device, copy)
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps({"copy_gbps": copy, "rows": rows}, indent=1) + "\n")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    md = [f"copy rate {copy:.0f} GB/s; % of it per (case, config); best per case in bold", "",
          "| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in cases:
        got = {r["config"]: r for r in rows if r["case"] == c}
        best = max((r["gbps"] for r in got.values() if "gbps" in r), default=None)
        cells = []
        for n in names:
            r = got.get(n)
            if r is None:
                cells.append("")
            elif "error" in r:
                cells.append("error")
            else:
                v = f"{100 * r['of_copy']:.0f}%"
                cells.append(f"**{v}**" if r["gbps"] == best else v)
        md.append(f"| {c} | " + " | ".join(cells) + " |")
    (out / "tune.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
