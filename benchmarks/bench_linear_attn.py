"""Benchmark: in-repo Triton chunked linear attention vs FLA's chunk_simple_gla / fused_chunk_simple_gla.

Correctness first (a slice against the FP64 oracle, beside FLA's error on the same inputs), then
timings: forward and forward+backward, ms (CUDA events, median, L2 flushed between reps by
the harness timer, harness/perf/timing.py), achieved bandwidth from a counted-bytes model, peak memory.

    python benchmarks/bench_linear_attn.py --dims 64 128 --T 1024 2048 4096 8192 16384 --dtypes fp16 bf16

Bytes that must move (each input read once, each output written once), elt = dtype size:
    forward          B*T*H*(2K + 2V)*elt           q, k, v in; o out
    backward         B*T*H*(4K + 3V)*elt           q, k, v, do in; dq, dk, dv out
    forward+backward B*T*H*(6K + 5V)*elt
(g_gamma decay, as the FLA numbers in GPU.md; a per-step g adds 4 bytes a step in, 4 out.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():  # a smoke run on the CPU: the kernels under Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


_T0 = time.time()


def log(*a):
    # elapsed seconds first: on the GPU box, compile time (FLA autotunes dozens of configs per new
    # dtype / gate flag) is what runs a call out of its limit, and this shows where it went
    print(f"[{time.time() - _T0:6.1f}s]", *a, flush=True)


def load_fla():
    try:
        import fla
        from fla.ops.simple_gla import chunk_simple_gla, fused_chunk_simple_gla
        return {"fla_chunk": chunk_simple_gla, "fla_fused": fused_chunk_simple_gla}, getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - the benchmark runs without FLA, saying so
        log(f"FLA not available ({type(e).__name__}: {e}); timing ours only")
        return {}, None


def ours_fn(chunk_size=64):
    """Ours, autotuned, with the default backward plan and the given chunk size (rows a step)."""
    from kernels.linear_attn import chunk_linear_attn
    from kernels.linear_attn import configs as cfg

    def f(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None, output_final_state=False):
        cfg.PLAN_OVERRIDE = None
        return chunk_linear_attn(q, k, v, g, g_gamma, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, chunk_size=chunk_size)
    return f


def ours_alt_fn():
    """Ours with the other backward plan: all-split walks with 32-wide blocks (configs.bwd_plan)."""
    from kernels.linear_attn import chunk_linear_attn
    from kernels.linear_attn import configs as cfg

    def f(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None, output_final_state=False):
        K, V = q.shape[-1], v.shape[-1]
        # stays set for the backward that follows; ours_fn clears it
        cfg.PLAN_OVERRIDE = dict(SPLIT=True, BV=min(V, 32), BKD=min(K, 32), BK=min(K, 32))
        return chunk_linear_attn(q, k, v, g, g_gamma, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state)
    return f


def inputs(B, T, H, K, V, dtype, gate, seed=0, h0=False):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    r = lambda *s: torch.randn(*s, device=DEVICE, generator=gen)
    x = dict(q=r(B, T, H, K).to(dtype), k=r(B, T, H, K).to(dtype), v=r(B, T, H, V).to(dtype), g=None, g_gamma=None)
    if isinstance(gate, float):
        x["g"] = torch.nn.functional.logsigmoid(r(B, T, H)) / gate
    elif gate == "gamma":
        x["g_gamma"] = torch.log(1 - 2.0 ** (-5.0 - torch.arange(H, device=DEVICE, dtype=torch.float32)))
    x["initial_state"] = r(B, H, K, V) if h0 else None
    x["do"] = r(B, T, H, V).to(dtype)
    x["dht"] = r(B, H, K, V)
    return x


# ---------------------------------------------------------------------------------------------
# correctness slice
# ---------------------------------------------------------------------------------------------


def errors(fn, x):
    """rel-RMS error of every tensor vs the FP64 oracle (final state gradient included)."""
    from harness.oracle import linear_attention
    leaves = {n: x[n].detach().clone().requires_grad_(n not in ("g_gamma",))
              for n in ("q", "k", "v", "g", "g_gamma", "initial_state") if x[n] is not None}
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], g=leaves.get("g"), g_gamma=leaves.get("g_gamma"),
               initial_state=leaves.get("initial_state"), output_final_state=True)
    torch.autograd.backward([o, ht], [x["do"], x["dht"].to(ht.dtype)])
    orc = linear_attention(x["q"], x["k"], x["v"], x["do"], g=x["g"], g_gamma=x["g_gamma"],
                           initial_state=x["initial_state"], grad_final_state=x["dht"])
    cand = {"out": o, "final_state": ht, "dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad}
    if x["g"] is not None:
        cand["dg"] = leaves["g"].grad
    if x["initial_state"] is not None:
        cand["dh0"] = leaves["initial_state"].grad
    exp = orc.tensors()
    out = {}
    for n, c in cand.items():
        e = exp[n]
        c = c.detach().double() if c is not None else torch.zeros_like(e)
        out[n] = float((c - e).norm() / e.norm()) if torch.isfinite(c).all() else float("inf")
    return out


def correctness(args, fns):
    from harness.adapters.eager import eager_linear_attention
    from kernels.linear_attn import configs as cfg

    def eager(q, k, v, g=None, g_gamma=None, *, initial_state=None, output_final_state=True, scale=None):
        return eager_linear_attention(q, k, v, g=g, g_gamma=g_gamma, initial_state=initial_state)

    cfg.AUTOTUNE = False  # default configs: this part checks numbers, not speed
    rows, worst = [], 0.0
    gates = [None if x == "none" else ("gamma" if x == "gamma" else float(x)) for x in args.gates]
    for D in args.dims:
        for dn in args.dtypes:
            for gate in gates:
                x = inputs(2, args.check_T, 4, D, D, DTYPES[dn], gate, seed=D, h0=True)
                e_ours = errors(ours_fn(), x)
                e_ref = errors(eager, x)
                e_fla = {}
                fla_here = args.check_fla == "all" or (args.check_fla == "gamma" and gate == "gamma")
                for fname in ("fla_chunk", "fla_fused"):  # FLA's error: the first of its two that runs
                    if fla_here and fname in fns and not e_fla:
                        try:
                            e_fla = errors(fns[fname], x)
                            fla_used = fname
                        except Exception as e:  # noqa: BLE001 - FLA 0.6 refuses gated chunk bwd on Hopper+triton<3.7.1
                            log(f"  {fname} failed on D={D} {dn} gate={gate}: {str(e)[:120]}")
                for n in e_ours:
                    r_ref = e_ours[n] / max(e_ref[n], 1e-30)
                    r_fla = e_ours[n] / e_fla[n] if n in e_fla and e_fla[n] > 0 else float("nan")
                    if n in e_fla:
                        worst = max(worst, r_fla)
                    rows.append(dict(D=D, dtype=dn, gate=str(gate), tensor=n, ours=e_ours[n], eager=e_ref[n],
                                     fla=e_fla.get(n), fla_fn=fla_used if e_fla else None,
                                     ours_over_eager=r_ref, ours_over_fla=r_fla))
                summary = " ".join(f"{n}={e_ours[n]:.1e}({e_ours[n] / max(e_ref[n], 1e-30):.2f}x eager"
                                   + (f",{e_ours[n] / e_fla[n]:.2f}x fla)" if n in e_fla else ")")
                                   for n in e_ours)
                log(f"check D={D} {dn} gate={gate} (FLA: {fla_used if e_fla else '-'}): {summary}")
    cfg.AUTOTUNE = True
    log(f"check: worst ours/FLA error ratio {worst:.2f} (limit 1.5)")
    return rows


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------


def bytes_model(B, T, H, K, V, elt):
    n = B * T * H
    return {"fwd": n * (2 * K + 2 * V) * elt, "fwdbwd": n * (6 * K + 5 * V) * elt, "bwd": n * (4 * K + 3 * V) * elt}


def copy_bandwidth():
    """The card's copy ceiling: bytes read + written by a 2 GiB device-to-device copy, per second."""
    from harness.perf.timing import time_callable
    if DEVICE != "cuda":
        return float("nan")
    src = torch.empty(2**30, dtype=torch.float16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_callable(lambda: dst.copy_(src), "cuda").median_ms
    return 2 * 2**31 / (ms * 1e-3)


def time_case(fn, x, mode):
    from harness.perf.timing import time_callable
    q, k, v = x["q"], x["k"], x["v"]
    if mode == "fwd":
        def run():
            fn(q, k, v, g=x["g"], g_gamma=x["g_gamma"])
    else:
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))

        def run():
            o, _ = fn(qq, kk, vv, g=x["g"], g_gamma=x["g_gamma"])
            torch.autograd.grad(o, (qq, kk, vv), x["do"])
    run()
    if DEVICE != "cuda":  # smoke run: one timed call, no meaning beyond "it runs"
        t = time.perf_counter()
        run()
        return (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    return time_callable(run, "cuda", flush=True).median_ms


def outputs(fn, x, fwd_only=False):
    """out, dq, dk, dv of one fwd+bwd (fp32 copies); out alone with fwd_only."""
    leaves = [x[n].detach().clone().requires_grad_(not fwd_only) for n in ("q", "k", "v")]
    o, _ = fn(*leaves, g=x["g"], g_gamma=x["g_gamma"])
    grads = () if fwd_only else torch.autograd.grad(o, leaves, x["do"])
    return [t.detach().float() for t in (o, *grads)]


def disagreement(fn, ref, x, fwd_only=False):
    """Largest rel-RMS difference of out / dq / dk / dv (out alone with fwd_only) between fn and ref
    (FLA) at a timed shape. The correctness slice runs default configs at one small shape; this
    checks the configs that autotune picked for the timed shapes (two fp16 results differ by ~1e-3;
    a broken config by ~1)."""
    a, b = outputs(fn, x, fwd_only), outputs(ref, x, fwd_only)
    return max(float((u - w).norm() / w.norm()) for u, w in zip(a, b))


def peak_memory(fn, x):
    """MiB above the inputs: forward peak, activations saved for the backward, backward peak."""
    MiB = 2**20
    if DEVICE != "cuda":
        return {}
    qq, kk, vv = (t.detach().requires_grad_() for t in (x["q"], x["k"], x["v"]))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o, _ = fn(qq, kk, vv, g=x["g"], g_gamma=x["g_gamma"])
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    saved = torch.cuda.memory_allocated() - base - o.numel() * o.element_size()
    torch.cuda.reset_peak_memory_stats()
    base2 = torch.cuda.memory_allocated()
    g = torch.autograd.grad(o, (qq, kk, vv), x["do"])
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base2
    del o, g
    return {"fwd_peak_MiB": fwd_peak / MiB, "saved_MiB": saved / MiB, "bwd_peak_MiB": bwd_peak / MiB}


# Forward configs the --sweep times beside the launch list (configs.fwd_configs): BV = 16 gives 4
# programs a head (512 at B4 H32 K=V=64); with tensor descriptors it compiles to 104-128 registers
# (ptxas_report.py), so 4 programs fit an SM and all 512 run in one wave.
SWEEP_EXTRA_FWD = [(16, 4, 2), (16, 4, 3)]


def sweep(args, fns):
    """--sweep: every launch config of ours, forced one at a time (no autotune), beside FLA, at each
    D / dtype / T: the forward per (chunk size, BV, warps, stages) and fwd+bwd per backward config
    (the forward autotuned; --sweep-only picks one part), each with its tiles through block pointers and
    through tensor descriptors (TMA); prints the ranking. Which config autotune should find, measured in one run."""
    import triton

    from kernels.linear_attn import configs as cfg

    gate = {"gamma": "gamma", "g": 1.0, "none": None}[args.gate]
    ours, ref = ours_fn(), next((fns[n] for n in ("fla_chunk", "fla_fused") if n in fns), None)
    tma_defaults = cfg.FWD_TMA, cfg.BWD_TMA
    out = []
    for D in args.dims:
        for dn in args.dtypes:
            for T in args.T:
                x = inputs(args.B, T, args.H, D, D, DTYPES[dn], gate, seed=T)
                res = {}
                for n, f in fns.items():
                    if n.startswith("fla"):
                        res[n] = time_case(f, x, "fwd")
                        if args.sweep_only != "fwd":
                            res[f"{n} fwd+bwd"] = time_case(f, x, "fwdbwd")
                plan = cfg.bwd_plan(D, D)
                try:
                    for bt in ([] if args.sweep_only == "bwd" else args.sweep_chunks):
                        fn_bt = ours_fn(bt)
                        BT = cfg.internal_chunk(bt, D, D)
                        cands = cfg.fwd_configs() + [triton.Config({"BV": bv}, num_warps=w, num_stages=st)
                                                     for bv, w, st in SWEEP_EXTRA_FWD]
                        fwd_list = cfg.prune_by_resources(cands, dict(KD=D, VD=D, BT=BT, q=x["q"]))
                        for c in fwd_list:
                            for tma in (False, True):
                                cfg.FWD_TMA = tma
                                over = dict(BV=c.kwargs["BV"], num_warps=c.num_warps, num_stages=c.num_stages)
                                cfg.CONFIG_OVERRIDE = {"fwd": over}
                                name = (f"ours fwd BT{BT} BV{over['BV']} w{c.num_warps} s{c.num_stages} "
                                        f"{'tma' if tma else 'ptr'}")
                                try:
                                    res[name] = time_case(fn_bt, x, "fwd")
                                    if ref is not None:
                                        d = disagreement(fn_bt, ref, x, fwd_only=True)
                                        if d > 1e-2:
                                            name_bad = name + f" DISAGREES {d:.1e}"
                                            res[name_bad] = res.pop(name)
                                except Exception as e:  # noqa: BLE001
                                    log(f"{name}: FAILED {type(e).__name__}: {str(e)[:150]}")
                    cfg.FWD_TMA = tma_defaults[0]  # the fwd+bwd rows: the default forward, autotuned
                    for c in ([] if args.sweep_only == "fwd" else cfg.bwd_configs()):
                        if c.num_warps == 4 and not plan["SPLIT"] and D * D > 64 * 64:
                            continue
                        for tma in (False, True):
                            cfg.BWD_TMA = tma
                            cfg.CONFIG_OVERRIDE = {"bwd": dict(num_warps=c.num_warps, num_stages=c.num_stages)}
                            name = f"ours fwd+bwd (bwd w{c.num_warps} s{c.num_stages} {'tma' if tma else 'ptr'})"
                            try:
                                res[name] = time_case(ours, x, "fwdbwd")
                                if ref is not None:
                                    d = disagreement(ours, ref, x)
                                    if d > 1e-2:
                                        res[name + f" DISAGREES {d:.1e}"] = res.pop(name)
                            except Exception as e:  # noqa: BLE001
                                log(f"{name}: FAILED {type(e).__name__}: {str(e)[:150]}")
                finally:
                    cfg.CONFIG_OVERRIDE = None
                    cfg.FWD_TMA, cfg.BWD_TMA = tma_defaults
                log(f"sweep D={D} {dn} T={T}:")
                for name, ms in sorted(res.items(), key=lambda kv: (("fwd+bwd" in kv[0]), kv[1])):
                    log(f"  {ms:8.3f} ms  {name}")
                out.append(dict(D=D, dtype=dn, T=T, ms=res))
                with open(os.path.join(args.out, "sweep_linear_attn.json"), "w") as fh:
                    json.dump(out, fh, indent=1)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"], choices=list(DTYPES))
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--gate", default="gamma", help="'gamma' (constant decay, GPU.md's FLA numbers), 'g' or 'none'")
    ap.add_argument("--check-T", type=int, default=1000, help="sequence length of the correctness slice")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--check-fla", choices=["all", "gamma", "none"], default="gamma",
                    help="FLA's error beside ours: every gate (each gate flag costs FLA a new autotune, minutes "
                         "on the H100 box), only g_gamma (one gate flag instead of three), or none")
    ap.add_argument("--gates", nargs="+", default=["none", "0.1", "1", "10", "gamma"],
                    help="gates of the correctness slice: none, gamma, or n of log-sigmoid(x)/n")
    ap.add_argument("--time-budget", type=float, default=480.0,
                    help="seconds after which no new timing case starts (the table covers what ran)")
    ap.add_argument("--backends", nargs="+", default=["ours", "fla_chunk", "fla_fused"],
                    help="also: ours_alt (backward all split, 32-wide blocks), ours_bt128 (128-row chunks)")
    ap.add_argument("--out", default=os.environ.get("OUT", "reports"), help="folder for the JSON results")
    ap.add_argument("--sweep", action="store_true",
                    help="time every launch config of ours (forced, no autotune) beside FLA instead of the table")
    ap.add_argument("--sweep-chunks", type=int, nargs="+", default=[64, 128],
                    help="chunk sizes of the --sweep's forward configs")
    ap.add_argument("--sweep-only", choices=["fwd", "bwd"],
                    help="--sweep: only the forward configs, or only the backward configs (fwd+bwd rows)")
    args = ap.parse_args()

    import triton
    fla_fns, fla_version = load_fla()
    fns = {"ours": ours_fn(), "ours_alt": ours_alt_fn(), "ours_bt128": ours_fn(128), **fla_fns}
    fns = {n: f for n, f in fns.items() if n in args.backends}
    env = dict(torch=torch.__version__, triton=triton.__version__, fla=fla_version,
               device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (Triton interpreter)",
               cuda=torch.version.cuda)
    log("env:", json.dumps(env))
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        sweep(args, fns)
        return
    t0 = time.time()
    check = [] if args.skip_check else correctness(args, fns)
    log(f"correctness slice: {time.time() - t0:.0f}s")
    bw = copy_bandwidth()
    log(f"copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")

    gate = {"gamma": "gamma", "g": 1.0, "none": None}[args.gate]
    rows = []
    for D in args.dims:
        for dn in args.dtypes:
            dtype = DTYPES[dn]
            for T in args.T:
                if time.time() - _T0 > args.time_budget:
                    log(f"time budget {args.time_budget:.0f}s spent: skipping D={D} {dn} T={T}")
                    continue
                x = inputs(args.B, T, args.H, D, D, dtype, gate, seed=T)
                bm = bytes_model(args.B, T, args.H, D, D, dtype.itemsize)
                row = dict(D=D, dtype=dn, T=T)
                for name, fn in fns.items():
                    for mode in (("fwdbwd",) if name == "ours_alt" else ("fwd", "fwdbwd")):  # alt: same fwd
                        t1 = time.time()
                        try:
                            ms = time_case(fn, x, mode)
                        except Exception as e:  # noqa: BLE001 - report and go on
                            log(f"{name} {mode} D={D} {dn} T={T}: FAILED {type(e).__name__}: {str(e)[:200]}")
                            ms = float("nan")
                        row[f"{name}_{mode}_ms"] = ms
                        row[f"{name}_{mode}_TBps"] = bm[mode] / (ms * 1e-3) / 1e12
                        log(f"  {name:9s} {mode:6s} D={D} {dn} T={T:6d}: {ms:.3f} ms "
                            f"({bm[mode] / (ms * 1e-3) / bw:.0%} of copy bw) [{time.time() - t1:.1f}s]")
                    ref = next((fns[n] for n in ("fla_chunk", "fla_fused") if n in fns), None)
                    if name.startswith("ours") and ref is not None:
                        try:
                            row[f"{name}_vs_fla"] = d = disagreement(fn, ref, x)
                            log(f"  {name:9s} vs FLA (out, dq, dk, dv): max rel-RMS difference {d:.1e}"
                                + ("  <-- DISAGREES" if d > 1e-2 else ""))
                        except Exception as e:  # noqa: BLE001
                            log(f"  {name} vs FLA: FAILED {type(e).__name__}: {str(e)[:200]}")
                    if T == max(args.T) and name in ("ours", "fla_chunk", "fla_fused"):
                        try:
                            row.update({f"{name}_{k}": v for k, v in peak_memory(fn, x).items()})
                        except Exception as e:  # noqa: BLE001
                            log(f"{name} memory: FAILED {e}")
                rows.append(row)
                with open(os.path.join(args.out, "bench_linear_attn.json"), "w") as fh:  # partial results survive a kill
                    json.dump(dict(env=env, args=vars(args), copy_TBps=bw / 1e12, check=check, timing=rows), fh, indent=1)
                del x
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()

    res = dict(env=env, args=vars(args), copy_TBps=bw / 1e12, check=check, timing=rows)
    with open(os.path.join(args.out, "bench_linear_attn.json"), "w") as fh:
        json.dump(res, fh, indent=1)

    try:  # which configs autotune chose (for the notes)
        from kernels.linear_attn import chunk as la
        for name, kern in (("fwd", la._fwd_kernel_tuned), ("bwd", la._bwd_kernel_tuned)):
            for key, c in kern.cache.items():
                log(f"autotune {name}: {key[:12]} -> {c}")
    except Exception as e:  # noqa: BLE001
        log(f"autotune cache not readable: {e}")

    # the short table, last
    names = list(fns)
    fla_names = [n for n in names if n.startswith("fla")]
    log("\n| D | dtype | T | ours fwd | ours f+b | FLA fwd | FLA f+b | fwd x | f+b x | ours fwd %bw | ours f+b %bw | vs FLA |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        of, ob = r.get("ours_fwd_ms", float("nan")), r.get("ours_fwdbwd_ms", float("nan"))
        ff = min((r[f"{n}_fwd_ms"] for n in fla_names), default=float("nan"))
        fb = min((r[f"{n}_fwdbwd_ms"] for n in fla_names), default=float("nan"))
        pf = r.get("ours_fwd_TBps", float("nan")) * 1e12 / bw
        pct = r.get("ours_fwdbwd_TBps", float("nan")) * 1e12 / bw
        log(f"| {r['D']} | {r['dtype']} | {r['T']} | {of:.3f} | {ob:.3f} | {ff:.3f} | {fb:.3f} | "
            f"{ff / of:.2f} | {fb / ob:.2f} | {pf:.0%} | {pct:.0%} | {r.get('ours_vs_fla', float('nan')):.0e} |")
    variants = [n for n in names if n.startswith("ours_")]
    if variants:
        log("\n| D | dtype | T | " + " | ".join(f"{n} fwd | {n} f+b | f+b x FLA" for n in variants) + " |")
        log("|---|---|---|" + "---|---|---|" * len(variants))
        for r in rows:
            fb = min((r[f"{n}_fwdbwd_ms"] for n in fla_names), default=float("nan"))
            cells = []
            for n in variants:
                vf, vb = r.get(f"{n}_fwd_ms", float("nan")), r.get(f"{n}_fwdbwd_ms", float("nan"))
                cells.append(f"{vf:.3f} | {vb:.3f} | {fb / vb:.2f}")
            log(f"| {r['D']} | {r['dtype']} | {r['T']} | " + " | ".join(cells) + " |")
    for r in rows:
        if "ours_saved_MiB" in r:
            mem = " ".join(f"{n}: fwd {r.get(f'{n}_fwd_peak_MiB', float('nan')):.0f} saved "
                           f"{r.get(f'{n}_saved_MiB', float('nan')):.0f} bwd {r.get(f'{n}_bwd_peak_MiB', float('nan')):.0f}"
                           for n in names)
            log(f"mem MiB D={r['D']} {r['dtype']} T={r['T']}: {mem}")


if __name__ == "__main__":
    main()
