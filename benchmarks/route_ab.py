"""Device time of two trees' kernels side by side, from `python -m harness bench` runs made on one host in one call
(`benchmarks/device_show.sh route-ab`: this tree's harness timing the in-repo kernels of this tree and of `.old`,
alternating new, old, new, old), so a route change is judged by a same-host A/B, never across sessions.

    python benchmarks/route_ab.py DIR      (DIR holds new-1/, old-1/, new-2/, old-2/, ... each with results.json)

Prints one row per (backend, case, mode): each run's median milliseconds in run order, then each pair's speed-up
(old ms / new ms: above 1 the new tree is faster) and the geometric mean of the pairs. A cell a run did not time
(status not ok) reads "-" there and leaves its pair out.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from host_ab import run_dirs


def load(root: Path) -> dict[str, dict[tuple, float]]:
    """run name -> {(backend, case, mode): median ms}, in run order (host_ab.run_dirs': new-1, old-1, new-2, ...)."""
    runs = {}
    for d in run_dirs(root, "results.json"):
        data = json.loads((d / "results.json").read_text())
        runs[d.name] = {(r["backend"], r["case"], mode): m["median_ms"]
                        for r in data["results"] for mode, m in r.get("modes", {}).items()
                        if m.get("status") == "ok" and m.get("median_ms")}
    return runs


def pairs(names: list[str]) -> list[tuple[str, str]]:
    """(new run, old run) with the same number: new-1 with old-1, new-2 with old-2, ..."""
    by_number = {}
    for name in names:
        side, _, number = name.rpartition("-")
        by_number.setdefault(number, {})[side] = name
    return [(p["new"], p["old"]) for _, p in sorted(by_number.items()) if {"new", "old"} <= set(p)]


def table(runs: dict[str, dict[tuple, float]]) -> list[str]:
    names = list(runs)
    matched = pairs(names)
    head = ["backend", "case", "mode", *names, *(f"{o} / {n}" for n, o in matched), "geomean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = list(dict.fromkeys(k for run in runs.values() for k in run))
    for key in keys:
        ms = [runs[n].get(key) for n in names]
        ups = [runs[o][key] / runs[n][key] if key in runs[n] and key in runs[o] else None for n, o in matched]
        got = [u for u in ups if u is not None]
        mean = math.exp(sum(map(math.log, got)) / len(got)) if got else None
        cells = [*key, *("-" if x is None else f"{x:.3f}" for x in ms),
                 *("-" if u is None else f"{u:.3f}" for u in ups), "-" if mean is None else f"{mean:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = load(Path(argv[0]))
    if not runs:
        print(f"no run folders with results.json in {argv[0]}", file=sys.stderr)
        return 2
    print("\n".join(table(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
