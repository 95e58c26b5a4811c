"""Markdown report: a header saying how the numbers were taken, sweep summaries (TFLOP/s by
sequence length), then one table per case like the seeds' (fwd / bwd / fwd+bwd ms, TFLOP/s,
speedup, memory). A cell that is not a plain measurement says what it is instead:
"implausible: check the measurement", "OOM: <reason>", "not timed: <reason>", "unsupported: <reason>".
"""

from __future__ import annotations

import math

from harness.perf.flops import LINEAR_BWD_FACTOR, LINEAR_CHUNK, SOFTMAX_BWD_FACTOR
from harness.perf.reports import group_of
from harness.perf.roofline import BWD_MIN_FRACTION, E2E_MIN_FRACTION, IMPLAUSIBLE, PEAK_MARGIN
from harness.perf.timing import LAUNCH_BOUND_FRACTION

MODES = ("fwd", "bwd", "fwd+bwd")
#: Reasons are cut to this length in table cells (the JSON has them whole).
REASON_CHARS = 140
DASH = "–"


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _short(text: str, n: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def fmt_ms(ms: float) -> str:
    return f"{ms:.4g}"


def fmt_rate(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def row_status_text(rec: dict) -> str | None:
    """The text of a row that was not timed at all (None when it was)."""
    st, why = rec["status"], _short(rec.get("reason", ""))
    if st == "unsupported":
        return f"unsupported: {why}"
    if st == "not-timed":
        return f"not timed: {why}"
    if st == "oom" and not rec.get("modes"):
        return f"OOM: {why}"
    if st == "error":
        return f"error: {why}"
    return None


def _note(notes: list[str] | None, text: str) -> str:
    """Append ``text`` to the report's numbered notes; the cell's " [n]" mark ("" without notes)."""
    if notes is None:
        return ""
    notes.append(text)
    return f" [{len(notes)}]"


def cell_text(cell: dict | None, what: str, notes: list[str] | None = None) -> str:
    """One mode's cell as table text: ``what`` is "ms", "tflops", "gbps" or "speedup"."""
    if cell is None:
        return DASH
    st = cell.get("status")
    if st == "implausible":
        return IMPLAUSIBLE + (_note(notes, cell.get("reason", "")) if what == "ms" else "")
    if st == "oom":
        return f"OOM: {_short(cell.get('reason', ''))}" if what == "ms" else "OOM"
    if st == "unsupported":
        return f"unsupported: {_short(cell.get('reason', ''))}" if what == "ms" else DASH
    if st == "error":
        return f"error: {_short(cell.get('reason', ''))}" if what == "ms" else DASH
    if st != "ok":
        return DASH
    # launch-bound: the number is an upper bound of the device time, mostly the host's launches
    bound = cell.get("launch_bound")
    if what == "ms":
        # over several rounds (bench --rounds): the larger of the first round's IQR and the rounds' range
        spread = max(cell.get("spread", 0), cell.get("round_spread", 0))
        text = f"{fmt_ms(cell['median_ms'])} ±{100 * spread / 2:.0f}%"
        if cell.get("unsteady"):  # the number stands, with why it may be off
            text += " unsteady" + _note(notes, cell["unsteady"])
        return text + " launch-bound" + _note(notes, bound) if bound else text
    if what in ("tflops", "gbps"):
        return ">=" + fmt_rate(cell[what]) if bound else fmt_rate(cell[what])
    if what == "speedup":
        s = cell.get("speedup")
        return "launch-bound" if bound or cell.get("speedup_launch_bound") else (f"{s:.2f}x" if s else DASH)
    raise ValueError(f"what: expected ms, tflops, gbps or speedup, got {what!r}")


def _mem(rec: dict, key: str) -> str:
    m = rec.get("memory")
    if not m:
        return DASH
    if "error" in m:
        return _short(m["error"], 60) if key == "fwd_peak_mib" else DASH
    v = m.get(key)
    return DASH if v is None else f"{v:.0f}" if v >= 10 else f"{v:.2g}"


def _clock_words(data: dict) -> str:
    s = data.get("settings", {})
    if s.get("clock") == "host":
        return ("**HOST TIME**: `time.perf_counter` around each call on the CPU, not device time "
                "(the CPU path exists for tests and dry runs)" + _rounds_words(s))
    graphs = "CUDA-graph replay" if s.get("cuda_graphs") else "no CUDA graphs"
    st = s.get("settle")
    if not st:  # reports from before settling existed
        settle = "no settling windows"
    elif st.get("max_ms", 0) <= 0:
        settle = "settling off"
    else:
        settle = (f"then settled: {st['window_ms']:g} ms windows of back-to-back repetitions until two agree within "
                  f"{100 * st['tol']:g}% (at least {st['min_ms']:g} ms, at most {st['max_ms']:g} ms; else \"unsteady\")")
    return ("**device time**: CUDA events around each repetition on the stream, one synchronise at the end; "
            f"warm-up {s.get('warmup_ms', '?')} ms (JIT, autotune, torch.compile excluded), {settle}; L2 flushed and "
            f"inputs rotated when the working set fits in L2 (flush: {s.get('flush_l2', 'auto')}); {graphs}; "
            f"repetitions for ~{s.get('target_ms', '?')} ms of work ({s.get('min_reps', '?')}..{s.get('max_reps', '?')}); "
            "median shown, ±half the interquartile range" + _rounds_words(s))


def _rounds_words(settings: dict) -> str:
    """What ``bench --rounds`` changed in the numbers (nothing for one round)."""
    asked = settings.get("rounds") or 1
    if asked <= 1:
        return ""
    done = settings.get("rounds_done") or 1
    got = f"{done} of {asked}" if done != asked else f"{asked}"
    return (f"; every cell timed in {got} passes over the whole run, the median of the passes' medians shown, ± half "
            "the larger of the first pass's interquartile range and the passes' range (each cell's passes in the JSON: "
            "round_ms)")


def header_lines(data: dict) -> list[str]:
    dev, ver, peaks = data.get("device", {}), data.get("versions", {}), data.get("peaks") or {}
    clocks = dev.get("clocks") or {}
    clock_txt = ", ".join(f"{k} {v}" for k, v in clocks.items() if k != "source" and v not in (None, ""))
    lines = [
        "# Attention benchmark",
        "",
        f"- command: `{data.get('command', '?')}`",
        f"- created: {data.get('created', '?')} ({data.get('seconds', '?')} s)",
        f"- device: {dev.get('name', '?')} {dev.get('capability', '')} "
        f"{('(' + str(dev['sm_count']) + ' SMs, ' + str(dev.get('memory_gib')) + ' GiB)') if dev.get('sm_count') else ''}".rstrip(),
        f"- clocks: {clock_txt or 'not available'}" + (f" (from {clocks['source']})" if clocks.get("source") else ""),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in ver.items() if v),
        f"- timing: {_clock_words(data)}",
    ]
    if data.get("settings", {}).get("interrupted"):
        lines.insert(2, f"- **interrupted** ({data['settings']['interrupted']}): the cells that finished before it; the "
                        "others read \"not run: the bench was interrupted\"")
    if data.get("settings", {}).get("clock") != "host":
        lines.append(f"- launch-bound: a number whose repetition the host took longer to enqueue (less the L2 flush "
                     f"the device ran meanwhile) than {LAUNCH_BOUND_FRACTION:g}x the time measured is mostly launch "
                     "latency: it reads \"launch-bound\" with a note, its TFLOP/s is a lower bound (\">=\"), it has no "
                     "speedup and is left out of the plots; `--cuda-graphs` times the device alone.")
    if peaks:
        mm = ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in peaks.get("matmul_tflops", {}).items())
        lines.append(f"- measured ceilings ({peaks.get('measured_at', '')}): dense matmul {mm}; copy "
                     f"{peaks.get('copy_gbps') or 0:.3g} GB/s. Results above them (x{PEAK_MARGIN:g}), a backward faster "
                     f"than {BWD_MIN_FRACTION:g}x its forward (device clock only: a host clock's small case is mostly "
                     f"per-operation host work), or a fwd+bwd faster than {E2E_MIN_FRACTION:g}x its forward "
                     f"read \"{IMPLAUSIBLE}\".")
    lines += [
        ("- FLOPs (`harness/perf/flops.py`): softmax counts exactly the visible (query, key) pairs (causal, window, "
         "Sq != Sk), per query head (GQA does not reduce them); forward 2(d + d_v) per pair, backward 2(3d + 2d_v) "
         f"({SOFTMAX_BWD_FACTOR:g}x forward when d_v = d). Linear attention: chunked algorithm (chunk {LINEAR_CHUNK}) "
         f"as executed, backward {LINEAR_BWD_FACTOR:g}x forward."),
        ("- memory: MiB above what was allocated before the forward (CUDA allocator statistics): fwd = forward peak, "
         "bwd = backward peak, saved = what the forward keeps alive besides its outputs, peak = the step's peak."),
        (f"- seed {data.get('settings', {}).get('seed', 0)}; speedup = baseline median / this median "
         f"(baseline: first of {', '.join(data.get('settings', {}).get('baseline', []) or [])} in the case's family)."),
        "",
    ]
    return lines


def summary_tables(data: dict) -> list[str]:
    """TFLOP/s per backend (rows) and sequence length (columns) for each sweep and mode; decode
    (forward only, memory-bound): GB/s per cache length."""
    groups: dict[str, dict[str, dict[int, str]]] = {}
    seqlens: dict[str, set] = {}
    modes = data.get("settings", {}).get("modes") or list(MODES)
    for rec in data["results"]:
        label, s = group_of(rec)
        if s is None:
            continue
        decode = rec["family"] == "decode"
        for mode in modes:
            if decode and mode != "fwd":
                continue
            key = f"{label}, {mode}"
            cell = rec.get("modes", {}).get(mode)
            if rec["status"] in ("unsupported",):
                continue
            if cell is None and rec["status"] == "ok":
                continue
            text = (row_status_text(rec) or DASH) if cell is None else cell_text(cell, "gbps" if decode else "tflops")
            if text.startswith(("not timed", "error", "OOM")):
                text = text.split(":")[0]
            groups.setdefault(key, {}).setdefault(rec["backend"], {})[s] = text
            seqlens.setdefault(key, set()).add(s)
    lines = []
    for key, rows in groups.items():
        cols = sorted(seqlens[key])
        if len(cols) < 2:
            continue
        metric = "GB/s by cache length" if key.startswith("decode ") else "TFLOP/s"
        lines += [f"### {metric}, {key}", "", "| backend | " + " | ".join(str(c) for c in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for backend, vals in rows.items():
            lines.append(f"| {backend} | " + " | ".join(_esc(vals.get(c, DASH)) for c in cols) + " |")
        lines.append("")
    return lines


def _shape_key(rec: dict) -> str:
    """The case id without its FP8 words: an e4m3 cell and its bf16 twin share it."""
    return "-".join(p for p in rec["case"].split("-") if p not in ("e4m3", "o8", "perhead")
                    and not p.startswith("grad_"))


def _timed_ms(rec: dict, mode: str) -> float | None:
    """A record's median ms in ``mode`` where it is a device-bound measurement (not launch-bound)."""
    cell = (rec.get("modes") or {}).get(mode) or {}
    if cell.get("status") != "ok" or cell.get("launch_bound") or "median_ms" not in cell:
        return None
    return float(cell["median_ms"])


def accuracy_table(data: dict) -> list[str]:
    """Where a run has FP8 cells: each cell's out error against the FP64 oracle (from its correctness
    check), the bf16 cells of the same shape beside them, so the report shows what FP8 costs in
    accuracy next to what it saves in time (each FP8 cell's time against the fastest real-dtype cell of
    its shape in the run, per mode)."""
    recs = [r for r in data["results"] if r.get("family") == "softmax" and "out_error" in r.get("verify", {})]
    fp8_shapes = {_shape_key(r) for r in recs if (r.get("params") or {}).get("fp8")}
    if not fp8_shapes:
        return []
    modes = [m for m in ("fwd", "bwd") if any(_timed_ms(r, m) for r in recs)]
    fastest: dict[tuple[str, str], tuple[float, str]] = {}  # (shape, mode) -> the fastest real-dtype cell
    for r in recs:
        for m in modes:
            ms = _timed_ms(r, m)
            key = (_shape_key(r), m)
            if ms is not None and not (r.get("params") or {}).get("fp8") and ms < fastest.get(key, (math.inf,))[0]:
                fastest[key] = (ms, r["backend"])
    lines = ["### Accuracy: errors against the FP64 oracle, bf16 and FP8 cells side by side", "",
             "Rel-RMS error of each cell's correctness check (on the verified case: fewer heads when the "
             "full one's reference would not fit), and its ratio to the eager reference of the same dtype "
             "(for FP8: the eager FP8 path, P in e4m3; its backward: dS in the gradients' format). Gradients "
             "where the check compared them (bf16 autograd, the FP8 backward of fp8_grad cells). Speed: an FP8 "
             "cell's time against the fastest bf16 / fp16 cell of its shape in this run (that cell's median / "
             "this one's; above 1x the FP8 cell is faster), per mode.", "",
             "| shape | backend | inputs | out rel-RMS error | x the reference's | dq / dk / dv rel-RMS error "
             "| x the reference's | speed: x the fastest bf16 cell" + (f" ({' / '.join(modes)})" if modes else "")
             + " |", "|---|---|---|---|---|---|---|---|"]
    order = sorted(recs, key=lambda r: (_shape_key(r), bool((r.get("params") or {}).get("fp8")), r["backend"]))
    for r in order:
        key = _shape_key(r)
        if key not in fp8_shapes:
            continue
        params = r.get("params") or {}
        form = (f"{params['fp8']}" + (", per head" if params.get("fp8_per_head") else "")
                + (f", {params['fp8']} out" if params.get("fp8_out") else "")
                + (f", {params['fp8_grad']} grads" if params.get("fp8_grad") else "")) if params.get("fp8") else r["dtype"]
        v = r["verify"]
        g = v.get("grad_errors") or {}
        errs = " / ".join(f"{g[n][0]:.3g}" for n in ("dq", "dk", "dv") if n in g) or DASH
        ratios = " / ".join(f"{g[n][1]:.2f}x" for n in ("dq", "dk", "dv") if n in g) or DASH
        speed = DASH
        if params.get("fp8") and modes:
            parts = []
            for m in modes:
                ms, best = _timed_ms(r, m), fastest.get((key, m))
                parts.append(f"{best[0] / ms:.2f}x ({best[1]})" if ms and best else DASH)
            speed = " / ".join(parts)
        lines.append(f"| {_esc(key)} | {r['backend']} | {form} | {v['out_error']:.3g} | {v['out_ratio']:.2f}x "
                     f"| {errs} | {ratios} | {speed} |")
    return lines + [""]


def case_tables(data: dict) -> list[str]:
    host = data.get("settings", {}).get("clock") == "host"
    unit = "ms (host time)" if host else "ms"
    order: list[str] = []
    by_case: dict[str, list[dict]] = {}
    for rec in data["results"]:
        if rec["case"] not in by_case:
            order.append(rec["case"])
        by_case.setdefault(rec["case"], []).append(rec)
    lines: list[str] = []
    notes: list[str] = []
    for case_id in order:
        recs = by_case[case_id]
        base = next((r.get("baseline") for r in recs if r.get("baseline")), None)
        lines += [f"### {case_id}", ""]
        verified = {r["verify"].get("case") for r in recs if r.get("verify", {}).get("reduced")}
        if verified:
            lines += [(f"Correctness verified on {', '.join(sorted(verified))} (fewer heads/batch: the full case's "
                       "eager reference would not fit); timed on the full case."), ""]
        if all(r.get("family") == "decode" for r in recs):
            lines += _decode_table(recs, base, unit, notes, data)
            continue
        head = [f"fwd {unit}", f"bwd {unit}", f"fwd+bwd {unit}", "fwd TFLOP/s", "bwd TFLOP/s", "fwd+bwd TFLOP/s",
                f"speedup vs {base or 'baseline'} (fwd / bwd / fwd+bwd)", "fwd MiB", "bwd MiB", "saved MiB", "peak MiB",
                "first call (fwd, ms)"]
        lines += ["| backend | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        for rec in recs:
            row_text = row_status_text(rec)
            if row_text is not None:
                cells = [row_text] + [DASH] * (len(head) - 1)
            else:
                m = rec.get("modes", {})
                cells = [cell_text(m.get(x), "ms", notes) for x in MODES]
                cells += [cell_text(m.get(x), "tflops") for x in MODES]
                cells.append(" / ".join(cell_text(m.get(x), "speedup") for x in MODES))
                cells += [_mem(rec, k) for k in ("fwd_peak_mib", "bwd_peak_mib", "saved_mib", "peak_mib")]
                first = (m.get("fwd") or {}).get("first_call_ms")
                cells.append(fmt_ms(first) if first is not None else DASH)
            lines.append(f"| {rec['backend']} | " + " | ".join(_esc(c) for c in cells) + " |")
        lines.append("")
    if notes:
        lines += ["### Flagged measurements", ""]
        lines += [f"{i}. {_esc(n)}" for i, n in enumerate(notes, 1)]
        lines.append("")
    return lines


def _decode_table(recs: list[dict], base: str | None, unit: str, notes: list[str], data: dict) -> list[str]:
    """A decode case: forward only, memory-bound: its GB/s (``decode_bytes``), the share of the
    device's measured copy rate, and tokens/s (the batch's new tokens per second of this attention
    call alone: the seed's inference unit, for the attention part of a layer)."""
    copy = (data.get("peaks") or {}).get("copy_gbps")
    head = [f"fwd {unit}", "GB/s", "of copy rate", "tokens/s", "TFLOP/s", f"speedup vs {base or 'baseline'}",
            "fwd MiB", "first call (ms)"]
    lines = ["| backend | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for rec in recs:
        row_text = row_status_text(rec)
        if row_text is not None:
            cells = [row_text] + [DASH] * (len(head) - 1)
        else:
            c = rec.get("modes", {}).get("fwd")
            ok = bool(c) and c.get("status") == "ok"
            share = f"{100 * c['gbps'] / copy:.0f}%" if ok and copy else DASH
            first = (c or {}).get("first_call_ms")
            p = rec.get("params", {})
            tokens = f"{p['batch'] * p['seqlen_q'] / (c['median_ms'] * 1e-3):.4g}" if ok else DASH
            cells = [cell_text(c, "ms", notes), cell_text(c, "gbps"), share, tokens, cell_text(c, "tflops"),
                     cell_text(c, "speedup"), _mem(rec, "fwd_peak_mib"), fmt_ms(first) if first is not None else DASH]
        lines.append(f"| {rec['backend']} | " + " | ".join(_esc(x) for x in cells) + " |")
    return lines + [""]


def render(data: dict, plots=()) -> str:
    """The whole markdown report."""
    lines = header_lines(data)
    summary = summary_tables(data)
    if summary:
        lines += ["## Sweeps", ""] + summary
    accuracy = accuracy_table(data)
    if accuracy:
        lines += ["## Accuracy", ""] + accuracy
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.as_posix()})" for p in plots] + [""]
    lines += ["## Per case", ""] + case_tables(data)
    return "\n".join(lines)


def summary_lines(data: dict) -> list[str]:
    """A few lines for the terminal: counts per status and the sweep tables."""
    counts: dict[str, int] = {}
    for rec in data["results"]:
        statuses = [c.get("status") for c in rec.get("modes", {}).values()] or [rec["status"]]
        for st in statuses:
            counts[st] = counts.get(st, 0) + 1
    clock = data.get("settings", {}).get("clock")
    lines = summary_tables(data)
    lines.append(f"bench: {len(data['results'])} (case, backend) pairs; cells: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                 + (" -- HOST TIME (CPU), not device time" if clock == "host" else " -- device time (CUDA events)"))
    return lines
