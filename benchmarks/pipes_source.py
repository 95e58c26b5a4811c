"""Where a kernel's warps stall, by SASS instruction: one table from the source-page CSVs `device_show.sh pipes`
writes with PIPES_SOURCE=1 (`ncu --section SourceCounters --page source --print-source sass --csv`, one profiled
launch a file, NAME.source.csv): for each file, the stall samples by instruction family (named barriers, mbarrier
waits, wgmma waits, MUFU, ...) and the instructions with the most samples.

    python benchmarks/pipes_source.py DIR [--top N]      (every *.source.csv in DIR, by name)

Session 57's pipe totals put the consumers' barrier stalls first in every Gluon forward; this says which barrier:
the consumers' turn handover (BAR.SYNC / BAR.ARV on a named barrier), the K / V ring's mbarrier waits
(SYNCS.PHASECHK, the try-wait loop), or a wgmma's retirement (WARPGROUP.DEPBAR / WARPGROUP.ARRIVE).

The column names differ between ncu versions: the samples are read from the first column named like "Warp Stall
Sampling (All Samples)" or "Sampling Data (All)", the instruction from "Source"; the file is refused if it has
neither."""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from pathlib import Path

SAMPLES = re.compile(r"sampling.*\(all", re.IGNORECASE)
#: SASS opcode prefix -> the family the table names (first match wins; anything else: its opcode's first part)
FAMILIES = (("BAR.", "named barrier (BAR)"), ("SYNCS.", "mbarrier (SYNCS)"), ("WARPGROUP.", "wgmma wait / arrive"),
            ("HGMMA", "wgmma issue (HGMMA)"), ("MUFU", "MUFU"), ("WARPSYNC", "warp sync"), ("NANOSLEEP", "sleep"),
            ("UTMALDG", "TMA load"), ("UTMASTG", "TMA store"), ("LDG", "global load"), ("STG", "global store"),
            ("LDS", "shared load"), ("STS", "shared store"), ("SHFL", "shuffle"), ("FMNMX", "max"), ("F2FP", "convert"))


def read(path: Path) -> list[tuple[str, float]]:
    """(SASS instruction, stall samples) of each row of an ncu source-page CSV; refuses a file without both
    columns."""
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((i for i, row in enumerate(rows) if _columns(row) is not None), None)
    if header is None:
        raise ValueError(f"{path}: no source table (a header naming Source and a stall-sampling column)")
    source, samples = _columns(rows[header])
    out = []
    for row in rows[header + 1:]:
        if len(row) <= max(source, samples):
            continue
        try:
            out.append((row[source].strip(), float(row[samples].replace(",", ""))))
        except ValueError:  # (a units row, a repeated header)
            continue
    return out


def _columns(row: list[str]) -> tuple[int, int] | None:
    """(the Source column, the stall-sampling column) of a header row, or None."""
    source = next((j for j, name in enumerate(row) if name.strip() == "Source"), None)
    samples = next((j for j, name in enumerate(row) if SAMPLES.search(name)), None)
    return None if source is None or samples is None else (source, samples)


def opcode(instruction: str) -> str:
    """The SASS opcode of an instruction, its predicate dropped: "@!P0 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100" ->
    "BAR.SYNC.DEFER_BLOCKING"."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else ""


def family(op: str) -> str:
    return next((name for prefix, name in FAMILIES if op.startswith(prefix)), op.split(".")[0] or "?")


def summarise(rows: list[tuple[str, float]], top: int = 8) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(the families' shares of all samples, largest first; the ``top`` instructions' shares), shares in %."""
    total = sum(s for _, s in rows) or 1.0
    by_family = Counter()
    for instruction, samples in rows:
        by_family[family(opcode(instruction))] += samples
    families = [(name, 100 * s / total) for name, s in by_family.most_common() if s > 0]
    heaviest = sorted(rows, key=lambda r: -r[1])[:top]
    return families, [(instruction, 100 * s / total) for instruction, s in heaviest if s > 0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--top", type=int, default=8, help="instructions listed a variant (default 8)")
    args = ap.parse_args(argv)
    files = sorted(args.dir.glob("*.source.csv")) if args.dir.is_dir() else []
    if not files:
        print(f"pipes_source: no *.source.csv in {args.dir}", file=sys.stderr)
        return 2
    status = 0
    for path in files:
        name = path.name[:-len(".source.csv")]
        try:
            families, heaviest = summarise(read(path), args.top)
        except ValueError as e:
            print(f"### {name}\n\nunreadable: {e}\n")
            status = 1
            continue
        print(f"### {name}\n\n| stalls by family | % of samples |\n|---|---|")
        print("\n".join(f"| {n} | {p:.1f} |" for n, p in families))
        print("\n| heaviest instructions | % of samples |\n|---|---|")
        print("\n".join(f"| `{i.replace('|', '¦')}` | {p:.1f} |" for i, p in heaviest) + "\n")  # (|R| in a cell)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
