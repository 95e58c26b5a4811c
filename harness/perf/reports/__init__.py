"""Benchmark reports: ``markdown.py`` (tables), ``plots.py`` (PNG, matplotlib imported lazily),
``compare.py`` (the ``compare`` subcommand), ``schema.py`` (the JSON's name, version, outline)."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(x):
    """JSON-safe: NaN / inf as strings, tuples as lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(data: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=1, allow_nan=False) + "\n")
    return path


def write_reports(data: dict, out, *, plots: bool = True) -> dict[str, Path]:
    """Write ``results.json``, ``report.md`` and (with ``plots``) PNGs under ``out``; returns kind -> path."""
    from harness.perf.reports import markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(data, out / "results.json")}
    pngs: list[Path] = []
    if plots:
        from harness.perf.reports import plots as plotting

        pngs = plotting.write_plots(data, out)
    md = out / "report.md"
    md.write_text(markdown.render(data, plots=[p.relative_to(out) for p in pngs]))
    paths["markdown"] = md
    for p in pngs:
        paths[f"plot {p.stem}"] = p
    return paths


# --------------------------------------------------------------------------------------------
# Grouping shared by the tables and the plots: a sweep is cases that differ only in seqlen.
# --------------------------------------------------------------------------------------------


def group_of(rec: dict) -> tuple[str, int | None]:
    """(label of the sweep a result belongs to, its sequence length); seqlen None for varlen
    cases and Sq != Sk (they only appear in the per-case tables)."""
    p = rec["params"]
    if rec["family"] == "softmax":
        heads = f"H{p['heads_q']}" if p["heads_q"] == p["heads_k"] else f"H{p['heads_q']}/{p['heads_k']}"
        hd = f"hd{p['d']}" if p["d_v"] == p["d"] else f"hd{p['d']}v{p['d_v']}"
        parts = [hd, heads, "causal" if p["causal"] else "non-causal"]
        if list(p.get("window") or [-1, -1]) != [-1, -1]:
            parts.append(f"win{p['window'][0]}x{p['window'][1]}")
        if p.get("softcap"):
            parts.append(f"cap{p['softcap']:g}")
        if p.get("fp8"):  # FP8 inputs: a sweep of its own beside the same shapes in bf16
            parts.append(p["fp8"])
            # and one per FP8 form, else the cells of two forms would share (and overwrite) one table
            parts += ["per-head"] * bool(p.get("fp8_per_head")) + [f"{p['fp8']} out"] * bool(p.get("fp8_out"))
            if p.get("fp8_grad"):
                parts.append(f"{p['fp8_grad']} grads")
        parts.append(p["dtype"])
        square = p.get("varlen") is None and p["seqlen_q"] == p["seqlen_k"]
        return " ".join(parts), (p["seqlen_q"] if square else None)
    if rec["family"] == "decode":  # a sweep over the cache length at one batch, page size and shape
        heads = f"H{p['heads_q']}" if p["heads_q"] == p["heads_k"] else f"H{p['heads_q']}/{p['heads_k']}"
        hd = f"hd{p['d']}" if p["d_v"] == p["d"] else f"hd{p['d']}v{p['d_v']}"
        parts = [f"B{p['batch']}", hd, heads, f"Q{p['seqlen_q']}", f"P{p['page_size']}" if p["page_size"] else "contig"]
        if list(p.get("window") or [-1, -1]) != [-1, -1]:
            parts.append(f"win{p['window'][0]}x{p['window'][1]}")
        parts.append(p["dtype"])
        return "decode " + " ".join(parts), p["cache_len"]
    parts = [f"K{p['d_k']}V{p['d_v']}", f"H{p['heads']}", p["gate"], p["dtype"]]
    return "linear " + " ".join(parts), p["seqlen"]
