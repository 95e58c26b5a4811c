"""Host time of two trees' kernels side by side, from `host_overhead.py` runs made on one host in one
call (issue 16: host speed differs between machines by up to 2x, so budgets and trims are judged by
an A/B, never across sessions).

    python benchmarks/host_ab.py DIR      (DIR holds new-1/, old-1/, new-2/, ... each with overhead.json)

Prints one row per (backend, case, mode), after the host's floors each run measured (one torch.empty, one
replayed launch: which runs found the host slow): each run's median call in microseconds, in run order (and,
for runs that measured them, each launch path in launch floors measured beside it: a drift-corrected ratio), and
for each earlier tree the ratio of the new runs' mean to that tree's (runs named TREE-N: old-1,
old-a7bd22b-1, ...). `benchmarks/device_show.sh host-ab` makes the runs (this tree and earlier
commits' kernels/ in `.old` and `.old-REV`, measured by this tree's harness).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

#: The rows of a launch path's median call in units of the one-pointer launch floor measured in windows
#: interleaved with it (host_overhead.py): a host's drift moves both alike, so these compare trees best.
IN_FLOORS = "(launch path, in launch floors beside)"


def run_dirs(root: Path, filename: str) -> list[Path]:
    """The run folders under ``root`` holding ``filename``, in run order (new-1, old-1, new-2, ...: by the number
    after the last dash, then the name); route_ab.py reads its runs in the same order."""
    return sorted((p for p in root.iterdir() if (p / filename).is_file()),
                  key=lambda p: (p.name.rsplit("-", 1)[-1], p.name))


def load(root: Path) -> dict[str, dict[tuple, float]]:
    """run name -> {(backend, case, mode): host us per call (median call)}, the host's floors first as
    ("host floor", floor, "-"), in run order (new-1, old-1, new-2, ...: by the number after the last dash, then
    the name)."""
    runs = {}
    for d in run_dirs(root, "overhead.json"):
        data = json.loads((d / "overhead.json").read_text())
        # the host's floors first (host_overhead.py measures them in each run): which runs found a slow host
        runs[d.name] = {("host floor", name, "-"): us for name, us in data.get("host_floors_us", {}).items()}
        runs[d.name].update({(r["backend"], r["case"], r["mode"]): r["host_us"] for r in data["rows"]})
        # each launch path over the launch floor measured beside it (session 28 on): drift-corrected, a ratio
        runs[d.name].update({(f"{p['backend']} {IN_FLOORS}", p["case"], p["mode"]): p["in_launch_floors"]
                             for p in data.get("launch_paths", []) if p.get("in_launch_floors")})
    return runs


def table(runs: dict[str, dict[tuple, float]]) -> list[str]:
    """One row per (backend, case, mode): each run's median call, then for every earlier tree (the
    runs' names less their "-N": old, old-a7bd22b, ...) the ratio of the new runs' mean to its runs'."""
    names = list(runs)
    tree = {n: n.rsplit("-", 1)[0] for n in names}
    others = [t for t in dict.fromkeys(tree.values()) if t != "new"]
    keys = list(dict.fromkeys(k for r in runs.values() for k in r))
    lines = ["| backend | case | mode | " + " | ".join(names) + " | " + " | ".join(f"new / {t}" for t in others)
             + " |", "|---|---|---|" + "---|" * (len(names) + len(others))]
    for k in keys:
        fmt = ".2f" if k[0].endswith(IN_FLOORS) else ".1f"
        cells = [f"{runs[n][k]:{fmt}}" if k in runs[n] else "-" for n in names]
        new = [runs[n][k] for n in names if tree[n] == "new" and k in runs[n]]
        for t in others:
            old = [runs[n][k] for n in names if tree[n] == t and k in runs[n]]
            cells.append(f"{statistics.fmean(new) / statistics.fmean(old):.2f}" if new and old else "-")
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: host_ab.py DIR (with new-1/, old-1/, ... holding overhead.json)", file=sys.stderr)
        return 2
    runs = load(Path(argv[0]))
    if not runs:
        print(f"host_ab: no overhead.json under {argv[0]}", file=sys.stderr)
        return 2
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
