"""``python -m harness compare OLD.json NEW.json``: per-case changes with a spread-aware verdict.

The rule (one place, with its reason): for each (case, backend, mode) timed in both files, with
``change = new_median / old_median - 1`` and each run's spread ``s = IQR / median`` of its
repetitions, the combined spread is ``sqrt(s_old**2 + s_new**2)``. A change counts only when

    |change| > THRESHOLD   and   |change| > K_SPREAD x combined spread

* the spread term: a difference smaller than a few times what the same code varies between its
  own repetitions is noise (two runs of one version differ by about that much);
* the threshold: repetitions within one run share clocks, temperature and neighbours, so their
  spread underestimates the run-to-run variation; a few percent (default 5%) covers that.

Verdicts: "slower" / "faster" (counted), "same" (under the threshold or within the spread,
with which of the two), and status changes ("now OOM", "now fails correctness", ...).
Exit status 1 with ``--fail-on-regression`` when any cell got slower, or a timed cell lost its
number; 2 on unreadable input.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from harness.perf.reports.schema import check_schema

#: Smallest relative change that can count (see the module docstring).
THRESHOLD = 0.05
#: A change must exceed this many combined spreads (IQR / median, combined in quadrature).
K_SPREAD = 2.0
MODES = ("fwd", "bwd", "fwd+bwd")


def load(path) -> dict:
    data = json.loads(Path(path).read_text())
    check_schema(data, str(path))
    return data


def _cells(data: dict) -> dict[tuple[str, str, str], dict]:
    out = {}
    for rec in data["results"]:
        modes = rec.get("modes") or {}
        for mode in MODES:
            if mode in modes:
                out[(rec["case"], rec["backend"], mode)] = modes[mode]
            elif rec["status"] != "ok":
                out[(rec["case"], rec["backend"], mode)] = {"status": rec["status"], "reason": rec.get("reason", "")}
    return out


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.inf


def verdict(old: dict, new: dict, *, threshold: float = THRESHOLD, k: float = K_SPREAD) -> dict:
    """{"verdict", "change", "noise", "counted"} for one cell present in both runs."""
    so, sn = old.get("status"), new.get("status")
    if so == "ok" and sn == "ok":
        change = new["median_ms"] / old["median_ms"] - 1.0
        noise = math.hypot(_num(old.get("spread", 0.0)), _num(new.get("spread", 0.0)))
        if abs(change) <= threshold:
            v, counted = "same (under threshold)", False
        elif abs(change) <= k * noise:
            v, counted = "same (within spread)", False
        else:
            v, counted = ("slower" if change > 0 else "faster"), True
        if old.get("launch_bound") or new.get("launch_bound"):
            v += " (launch-bound: host time)"  # still counted: the host's cost per call is real
        if old.get("unsteady") or new.get("unsteady"):
            v += " (unsteady device: see the report's note)"
        return {"verdict": v, "change": change, "noise": noise, "counted": counted}
    words = {"oom": "OOM", "implausible": "flagged implausible", "not-timed": "fails correctness / not timed",
             "unsupported": "unsupported", "error": "errors", "ok": "timed"}
    if so == sn:
        return {"verdict": f"still {words.get(sn, sn)}", "change": None, "noise": None, "counted": False}
    lost = so == "ok"
    return {"verdict": f"now {words.get(sn, sn)} (was {words.get(so, so)})", "change": None, "noise": None,
            "counted": lost, "lost": lost}


def compare(old: dict, new: dict, *, threshold: float = THRESHOLD, k: float = K_SPREAD) -> list[dict]:
    """One row per (case, backend, mode) in either run."""
    a, b = _cells(old), _cells(new)
    rows = []
    for key in list(a) + [x for x in b if x not in a]:
        case, backend, mode = key
        row = {"case": case, "backend": backend, "mode": mode,
               "old_ms": a.get(key, {}).get("median_ms"), "new_ms": b.get(key, {}).get("median_ms")}
        if key not in b:
            row.update(verdict="gone (not in NEW)", change=None, noise=None, counted=False)
        elif key not in a:
            row.update(verdict="new (not in OLD)", change=None, noise=None, counted=False)
        else:
            row.update(verdict(a[key], b[key], threshold=threshold, k=k))
        rows.append(row)
    return rows


def _warnings(old: dict, new: dict) -> list[str]:
    out = []
    do, dn = old.get("device", {}).get("name"), new.get("device", {}).get("name")
    if do != dn:
        out.append(f"different devices: {do} vs {dn}: the comparison mixes machines")
    co, cn = old.get("settings", {}).get("clock"), new.get("settings", {}).get("clock")
    if co != cn:
        out.append(f"different clocks: {co} vs {cn}")
    if "host" in (co, cn):
        out.append("host time (CPU) involved: not device time")
    vo, vn = old.get("versions", {}), new.get("versions", {})
    for key in ("torch", "triton", "cuda"):
        if vo.get(key) != vn.get(key):
            out.append(f"{key} changed: {vo.get(key)} -> {vn.get(key)}")
    return out


def render(rows: list[dict], old: dict, new: dict, *, threshold: float, k: float, show_all: bool = False) -> str:
    lines = [f"# compare: {old.get('created', '?')} -> {new.get('created', '?')}", "",
             (f"Rule: a change counts when |change| > {threshold:.0%} and > {k:g} x the combined spread "
              "sqrt(s_old^2 + s_new^2), s = IQR/median of each run's repetitions."), ""]
    lines += [f"- warning: {w}" for w in _warnings(old, new)]
    shown = [r for r in rows if show_all or r["counted"] or not r["verdict"].startswith(("same", "still"))]
    lines += ["", "| case | backend | mode | old ms | new ms | change | spread | verdict |", "|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "–" if x is None else f"{x:.4g}"
    for r in shown:
        ch = "–" if r.get("change") is None else f"{r['change']:+.1%}"
        sp = "–" if r.get("noise") is None else f"±{r['noise']:.1%}"
        v = f"**{r['verdict']}**" if r["counted"] else r["verdict"]
        lines.append(f"| {r['case']} | {r['backend']} | {r['mode']} | {fmt(r['old_ms'])} | {fmt(r['new_ms'])} | {ch} | {sp} | {v} |")
    n = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("slower", "faster")}
    lost = sum(1 for r in rows if r.get("lost"))
    same = sum(1 for r in rows if r["verdict"].startswith("same"))
    lines += ["", f"{len(rows)} cells: {n['slower']} slower, {n['faster']} faster, {same} same, {lost} lost their number"
              + ("" if show_all else " (unchanged cells hidden; --all lists them)")]
    return "\n".join(lines) + "\n"


