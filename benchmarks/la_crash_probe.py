"""Which launch of the in-repo linear-attention forward faults (issue 17's fuzz, session 10: illegal
memory accesses at K=32, V=128 with an initial state, e.g. B1-H1-T1184-K32V128-g(n=0.1)-h0-bf16).

Each (K, V, config, TMA on/off) runs in a process of its own (a fault kills the CUDA context): the
forward, then the backward, synchronised. Prints one line per launch and a table last.

    python benchmarks/la_crash_probe.py [--what fwd|bwd] [--dims 32x128 ...] [--T 65] [--jobs 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, torch
import kernels.linear_attn.configs as cfg
from kernels.linear_attn.chunk import chunk_linear_attn
a = json.loads(sys.argv[1])
cfg.FWD_TMA = cfg.BWD_TMA = a["tma"]
if a.get("cfg") is not None:
    cfg.CONFIG_OVERRIDE = {"fwd": a["cfg"]}
if a.get("bwd") is not None:
    cfg.CONFIG_OVERRIDE = {"bwd": a["bwd"]}
if a.get("plan") is not None:
    cfg.PLAN_OVERRIDE = a["plan"]
torch.manual_seed(0)
B, T, H, K, V = 1, a["T"], 1, a["K"], a["V"]
dt = torch.bfloat16
q = torch.randn(B, T, H, K, device="cuda", dtype=dt, requires_grad=True)
k = (torch.randn(B, T, H, K, device="cuda", dtype=dt) / 4).requires_grad_()
v = torch.randn(B, T, H, V, device="cuda", dtype=dt, requires_grad=True)
g = (-0.1 * torch.rand(B, T, H, device="cuda")).requires_grad_()
h0 = torch.randn(B, H, K, V, device="cuda", requires_grad=True) if a["h0"] else None
for _ in range(a.get("repeat", 1)):
    o, ht = chunk_linear_attn(q, k, v, g=g, initial_state=h0, output_final_state=True)
    torch.cuda.synchronize()
    print("forward ok", flush=True)
    (o.float().sum() + ht.sum()).backward()
    torch.cuda.synchronize()
print("ok", float(o.float().abs().max()))
"""


def _one(a: dict) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(a)], capture_output=True, text=True, env=env,
                       timeout=300)
    if p.returncode == 0:
        return a, "ok"
    err = [ln for ln in p.stderr.strip().splitlines() if "Error:" in ln]
    where = "backward" if "forward ok" in p.stdout else "forward"
    return a, f"FAIL in the {where} rc={p.returncode}: {(err[-1] if err else p.stderr.strip()[-200:])[:160]}"


def _label(a: dict) -> str:
    extra = " ".join(f"{k}={a[k]}" for k in ("cfg", "bwd", "plan") if a.get(k) is not None)
    return f"K{a['K']} V{a['V']} T{a['T']} h0={a['h0']} tma={a['tma']} {extra or '(autotuned)'}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", nargs="+", default=["32x128", "32x256", "32x64", "64x128", "128x32"])
    ap.add_argument("--T", nargs="+", type=int, default=[65])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="forward + backward this many times per launch config")
    ap.add_argument("--what", choices=("fwd", "bwd"), default="bwd",
                    help="fwd: every forward config (session 10's first run); bwd: every backward config and plan")
    args = ap.parse_args()
    import kernels.linear_attn.configs as cfg

    runs = []
    for dims in args.dims:
        K, V = map(int, dims.split("x"))
        for T in args.T:
            if args.what == "fwd":
                for h0 in (True, False):
                    runs.append(dict(K=K, V=V, T=T, h0=h0, tma=True))  # autotuned, as users call it
                    for tma in (True, False):
                        for BV, w, s in cfg._fwd_list():
                            if BV <= V:
                                runs.append(dict(K=K, V=V, T=T, h0=h0, tma=tma,
                                                 cfg={"BV": BV, "num_warps": w, "num_stages": s}))
            else:  # the backward: each searched config, the planned split and the smallest one
                runs.append(dict(K=K, V=V, T=T, h0=True, tma=True, repeat=args.repeat))
                plans = [None, {"SPLIT": True, "BV": 32, "BKD": 32, "BK": 32}]
                for w, st in ((8, 1), (4, 1), *cfg.BWD_WARPS_STAGES):  # 1 stage: the list before session 10
                    for plan in plans:
                        for tma in (True, False):
                            runs.append(dict(K=K, V=V, T=T, h0=True, tma=tma, plan=plan, repeat=args.repeat,
                                             bwd={"num_warps": w, "num_stages": st}))
    print(f"{len(runs)} launches, {args.jobs} at a time", flush=True)
    bad = []
    with cf.ThreadPoolExecutor(args.jobs) as ex:
        for a, res in ex.map(_one, runs):
            print(f"{_label(a)}: {res}", flush=True)
            if res != "ok":
                bad.append((a, res))
    print(f"\n{len(bad)} of {len(runs)} launches failed")
    for a, res in bad:
        print(f"  {_label(a)}: {res}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
