"""The speed section (CUDA only): the candidate against the baselines present, on the profile's
benchmark cases, with the harness's timer, FLOP model and roofline rules.

Per benchmark case one child process (:func:`bench_task`) times the candidate and every baseline
whose adapter ``supports()`` the case, in each mode (fwd; with a backward-checking profile also bwd
and fwd+bwd) with :func:`harness.timing.time_adapter` (CUDA events on the calling stream, warm-up,
L2 flush and input rotation, one device sync at the end), converts to TFLOP/s with
:func:`harness.flops.flops`, and applies :func:`harness.roofline.check` (a rate above the device's
measured matmul / copy ceilings, a backward faster than half its forward, ...). Right after the
candidate's timing the same process verifies the case again on fresh inputs: a kernel whose
results change once timed (a fast path after N calls) is caught.

Rejects: the candidate's re-check after timing fails, or one of its timings is flagged
implausible by the roofline rules. Ratios to the baselines are reported, not judged (the profile
states no speed claim).
"""

from __future__ import annotations

import math
from pathlib import Path

#: Baselines timed beside the candidate when their adapter supports the case on this machine.
BASELINES = {
    "softmax": ("sdpa_cudnn", "sdpa_flash", "flash_attn_cute", "flash_attn3", "flash_attn", "triton_fa"),
    "linear": ("fla_chunk", "fla_fused_chunk", "triton_la_chunk"),
}
#: Seed offset of the bench inputs and of the re-check after timing (distinct from the
#: correctness seeds, reproducible from the base seed).
BENCH_SEED_OFFSET = 2_000_003
#: Per bench case limit (seconds): JIT of several backends, up to 3 modes each (~0.2 s of timed
#: work plus warm-up per mode), then a full verification of a large case against the FP64 oracle.
BENCH_TIMEOUT_S = 600.0


def available() -> str | None:
    """None when the timing modules are importable, else why not."""
    try:
        import harness.flops
        import harness.roofline
        import harness.timing  # noqa: F401
    except ImportError as e:
        return f"harness.timing / harness.flops / harness.roofline not importable ({e})"
    return None


def modes_for(backward: bool) -> tuple[str, ...]:
    return ("fwd", "bwd", "fwd+bwd") if backward else ("fwd",)


def bench_task(req: dict) -> dict:
    """Child side: time candidate + baselines on one case, then re-check the candidate."""
    import torch

    from harness import flops as flop_model
    from harness import roofline, timing
    from harness.accept import anticheat
    from harness.accept.worker import case_from_dict
    from harness.adapters import registry

    case = case_from_dict(req["case"])
    dev = torch.device(req["device"])
    seed = int(req["seed"])
    cand = registry.from_spec(req["impl"], req["family"])
    backward = bool(req["backward"]) and bool(getattr(cand, "differentiable", True))
    modes = modes_for(backward)
    peaks = roofline.device_peaks(dev, (case.dtype,))  # from / into the shared cache: a device fact
    from harness.accept.worker import use_scratch_cache

    use_scratch_cache(req)  # the re-check's oracle below is for a fresh seed: scratch only
    rows = []
    candidate_timed = 0
    for name in (cand.name, *BASELINES.get(case.family, ())):
        try:
            adapter = cand if name == cand.name else registry.get(name)
        except KeyError:
            continue
        reason = adapter.supports(case, dev)
        if reason:
            rows.append({"backend": name, "candidate": name == cand.name, "unsupported": str(reason)})
            continue
        ms_by_mode, cells = {}, {}
        for mode in modes:
            if mode != "fwd" and not getattr(adapter, "differentiable", True):
                continue
            try:
                t = timing.time_adapter(adapter, case, mode, seed=seed, device=dev)
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, the run goes on
                line = str(e).strip().splitlines()[0] if str(e).strip() else ""
                cells[mode] = {"error": f"{type(e).__name__}: {line}"[:300]}
                continue
            ms = t.median_ms
            ms_by_mode[mode] = ms
            if name == cand.name:
                candidate_timed += t.reps + t.warmup_calls
            cells[mode] = {
                "median_ms": ms, "spread": t.spread, "reps": t.reps, "clock": t.clock,
                "tflops": flop_model.flops(case, mode) / (ms * 1e-3) / 1e12 if ms > 0 else math.inf,
                "launch_bound": t.launch_bound,
            }
        for mode, reasons in roofline.check(case, ms_by_mode, peaks).items():
            if mode in cells:
                cells[mode]["flags"] = reasons
        rows.append({"backend": name, "candidate": name == cand.name, "modes": cells})
    recheck, result = anticheat.recheck_after_calls(
        cand, case, warm_seed=seed, check_seed=seed + 1, device=dev, backward=backward, calls=0,
        after=f"timing ({candidate_timed} timed and warm-up calls of the candidate)",
    )
    rc = recheck.to_dict()
    if result is not None and result.status != "pass":
        rc["result"] = result.to_dict()
    return {"case": case.id, "modes": list(modes), "rows": rows, "peaks": peaks.to_dict(), "recheck": rc}


# --------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------


def run_speed(isolator, *, impl: str, family: str, device: str, cases, backward: bool, base_seed: int,
              timeout: float, out_dir: Path, log=print) -> dict:
    """Run :func:`bench_task` per case in a child; return the report's speed section."""
    from harness.accept.worker import case_to_dict

    why = available()
    if why:
        return {"status": "not measured", "reason": why}
    if not cases:
        return {"status": "not measured", "reason": "the profile has no benchmark case for this family"}
    results, failed = [], []
    for case in cases:
        req = {"task": "bench", "impl": impl, "family": family, "case": case_to_dict(case), "device": device,
               "backward": backward, "seed": base_seed + BENCH_SEED_OFFSET}
        o = isolator.run(req, timeout=timeout, name=f"bench-{case.id}")
        log(f"  speed {case.id}: {o.kind} ({o.seconds:.1f} s)")
        if not o.ok:
            failed.append({"case": case.id, "check": "speed_" + o.kind, "kind": "isolation", "detail": o.reason,
                           "log_tail": o.log_tail[-1500:]})
            continue
        r = o.result
        results.append(r)
        rc = r["recheck"]
        if rc["status"] == "fail":
            failed.append({"case": case.id, "check": "recheck_after_timing", "kind": "anticheat",
                           "detail": rc["detail"]})
        for row in r["rows"]:
            if not row["candidate"]:
                continue
            for mode, cell in (row.get("modes") or {}).items():
                if cell.get("flags"):
                    from harness.roofline import IMPLAUSIBLE

                    failed.append({"case": case.id, "check": "roofline", "kind": "speed",
                                   "detail": f"{mode}: {IMPLAUSIBLE}: " + "; ".join(cell["flags"])})
    section = {"status": "measured", "cases": results, "failed_checks": failed}
    section["markdown"] = _markdown(results, failed)
    plot = _plot(results, Path(out_dir) / "speed.png")
    if plot:
        section["plot"] = str(plot)
        section["markdown"] += ["", f"![TFLOP/s per backend]({Path(plot).name})"]
    return section


def _cand_tflops(row_by, cand, mode):
    c = (row_by.get(cand) or {}).get("modes", {}).get(mode, {})
    return c.get("tflops") if not (c.get("flags") or c.get("launch_bound")) else None


def _markdown(results: list[dict], failed: list[dict]) -> list[str]:
    L = [("Device time (CUDA events, warm-up, L2 flush / input rotation when the working set is small), "
         "TFLOP/s from `harness/flops.py` (visible pairs counted exactly), ratio = candidate / baseline. "
         "Flagged rates (roofline rules) print as implausible, never as a number; a launch-bound time (the "
         "host's launches, not the kernels) is marked and gets no ratio."), ""]
    for r in results:
        cand = next((row["backend"] for row in r["rows"] if row["candidate"]), None)
        row_by = {row["backend"]: row for row in r["rows"]}
        L += [f"### `{r['case']}`", "", "| backend | " + " | ".join(f"{m} ms | {m} TFLOP/s | {m} ratio" for m in r["modes"]) + " |",
              "|---|" + "---|---|---|" * len(r["modes"])]
        for row in r["rows"]:
            name = row["backend"] + (" (candidate)" if row["candidate"] else "")
            if "unsupported" in row:
                L.append(f"| {name} | " + " | ".join(["-"] * 3 * len(r["modes"])) + " |")
                continue
            cells = []
            for m in r["modes"]:
                c = row["modes"].get(m)
                if c is None:
                    cells += ["-", "-", "-"]
                elif "error" in c:
                    cells += ["error", "-", "-"]
                elif c.get("flags"):
                    cells += [f"{c['median_ms']:.4g}", "implausible", "-"]
                else:
                    ct = _cand_tflops(row_by, cand, m)
                    ratio = "-" if row["candidate"] or not ct or not c["tflops"] else f"{ct / c['tflops']:.2f}x"
                    ms = f"{c['median_ms']:.4g} (±{100 * c['spread']:.0f}%)"
                    if c.get("launch_bound"):  # mostly the host's launches (harness.timing.Timing.launch_bound)
                        ms, ratio = ms + " launch-bound", "-"
                    cells += [ms, f"{c['tflops']:.1f}", ratio]
            L.append(f"| {name} | " + " | ".join(cells) + " |")
        unsup = [f"{row['backend']}: {row['unsupported']}" for row in r["rows"] if "unsupported" in row]
        if unsup:
            L += ["", "Not timed: " + "; ".join(unsup)]
        L += ["", f"Re-check after timing: {r['recheck']['status']} - {r['recheck']['detail']}", ""]
    for f in failed:
        L.append(f"- **{f['check']}** `{f['case']}`: {f['detail']}")
    return L


def _plot(results: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = []
    for r in results:
        for row in r["rows"]:
            for m, c in (row.get("modes") or {}).items():
                if "tflops" in c and not c.get("flags") and math.isfinite(c["tflops"]):
                    series.append((f"{r['case']}\n{m}", row["backend"], c["tflops"], row["candidate"]))
    if not series:
        return None
    groups = list(dict.fromkeys(s[0] for s in series))
    backends = list(dict.fromkeys(s[1] for s in series))
    width = 0.8 / max(1, len(backends))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(groups)), 4.5))
    for j, b in enumerate(backends):
        xs, ys = [], []
        for i, g in enumerate(groups):
            v = next((s[2] for s in series if s[0] == g and s[1] == b), None)
            if v is not None:
                xs.append(i + j * width)
                ys.append(v)
        ax.bar(xs, ys, width, label=b)
    ax.set_xticks([i + width * (len(backends) - 1) / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, fontsize=6)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
