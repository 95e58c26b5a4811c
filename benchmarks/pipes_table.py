"""One table from the CSVs `device_show.sh pipes` writes (`ncu --csv --page raw`, one profiled kernel launch a
file): for each file, the kernel's duration, the issue slots' busy share, the XU pipe's work, every pipe's
utilisation (instructions executed and cycles active, % of the sustained peak, largest first) and the largest
warp-stall reasons.

    python benchmarks/pipes_table.py DIR          (every *.csv in DIR, by name)

A pipe near 100% (or the issue slots) is the bound; a change that moves work off one pipe helps only if another
does not then bind (session 56: the cubic share meant to move exponentials from MUFU, ncu's "xu", to "fma"; session
57 read its XU work up a quarter: its floor's two conversions ran on XU too)."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

PIPE = re.compile(r"^sm__(?:inst_executed_pipe_(\w+?)|pipe_(\w+?)_cycles_active)\.avg\.pct_of_peak_sustained_active$")
#: warp-stall reasons, in the forms ncu versions write (session 57's H200: warps stalled per issue slot, ".ratio");
#: "selected" is the warp that issued, not a stall
STALL = re.compile(r"^smsp__average_warp_latency_issue_stalled_(\w+)\.ratio$|"
                   r"^smsp__warp_issue_stalled_(\w+)_per_warp_active\.pct$|"
                   r"^smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
#: the issue slots' busy share, first present (session 57's H200 wrote only the "elapsed" forms)
ISSUE = ("sm__inst_issued.avg.pct_of_peak_sustained_active", "sm__issue_active.avg.pct_of_peak_sustained_active",
         "sm__inst_issued.avg.pct_of_peak_sustained_elapsed")
XU = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
DURATION = "gpu__time_duration.sum"
#: a duration unit -> microseconds
_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read(path: Path) -> dict[str, tuple[float, str]]:
    """The first kernel row of an ncu raw CSV: metric name -> (value, unit). Refuses a file with no kernel row."""
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r or "ID" in r[:1]), None)
    if header is None or len(rows) < header + 3:
        raise ValueError(f"{path}: no ncu raw table (a header, a units row and a kernel row)")
    names, units, values = rows[header], rows[header + 1], rows[header + 2]
    out = {}
    for name, unit, value in zip(names, units, values):
        number = _number(value)
        if number is not None:
            out[name] = (number, unit)
    return out


def summarise(metrics: dict[str, tuple[float, str]], pipes: int = 6, stalls: int = 4) -> dict[str, str]:
    """A table row: duration, issue slots busy, the XU pipe's work (its share of the peak times the duration, in
    microseconds: comparable across variants of one shape where the shares alone are not, as the durations differ),
    the top ``pipes`` pipe readings and top ``stalls`` stall reasons."""
    pipe = sorted(((v, f"inst {m.group(1)}" if m.group(1) else f"cycles {m.group(2)}")
                   for name, (v, _) in metrics.items() if (m := PIPE.match(name))), reverse=True)
    stall = sorted(((v, reason) for name, (v, _) in metrics.items()
                    if (m := STALL.match(name)) and (reason := next(g for g in m.groups() if g)) != "selected"),
                   reverse=True)
    duration = metrics.get(DURATION)
    issue = next((metrics[k][0] for k in ISSUE if k in metrics), None)
    us = duration[0] * _US[duration[1]] if duration and duration[1] in _US else None
    return {
        "duration": f"{duration[0]:g} {duration[1]}" if duration else "-",
        "issue busy %": f"{issue:.1f}" if issue is not None else "-",
        "xu work us": f"{metrics[XU][0] / 100 * us:.1f}" if XU in metrics and us is not None else "-",
        "pipes (% of peak)": ", ".join(f"{name} {v:.1f}" for v, name in pipe[:pipes]) or "-",
        "stalls": ", ".join(f"{name} {v:.2f}" for v, name in stall[:stalls]) or "-",
    }


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: pipes_table.py DIR (a folder of ncu raw CSVs)", file=sys.stderr)
        return 2
    files = sorted(p for p in Path(argv[0]).glob("*.csv") if not p.name.endswith(".source.csv"))  # (pipes_source's)
    if not files:
        print(f"pipes_table: no .csv in {argv[0]}", file=sys.stderr)
        return 2
    cols = ["duration", "issue busy %", "xu work us", "pipes (% of peak)", "stalls"]
    print("| variant | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    status = 0
    for path in files:
        try:
            row = summarise(read(path))
        except ValueError as e:
            print(f"| {path.stem} | unreadable: {e} |" + " |" * (len(cols) - 1))
            status = 1
            continue
        print(f"| {path.stem} | " + " | ".join(row[c] for c in cols) + " |")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
