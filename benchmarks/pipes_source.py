"""Where a kernel's warps stall, by SASS instruction: one table from the source-page CSVs `device_show.sh pipes`
writes with PIPES_SOURCE=1 (`ncu --section SourceCounters --page source --print-source sass --csv`, one profiled
launch a file, NAME.source.csv): for each file, the stall samples by reason (ncu's per-instruction ``stall_*`` columns,
where the page has them), by instruction family (named barriers, mbarrier waits, wgmma waits, MUFU, ...) and the
instructions with the most samples, each with its largest reason and the instruction before it.

A sample sits on the instruction a warp waits to issue: a warp held at a barrier shows on the instruction after the
BAR.SYNC, a warp waiting for a try-wait's predicate on the branch after SYNCS.PHASECHK (session 58, H200: the two
heaviest rows of the persistent forward were NOPs after ``BAR.SYNC 0x1``, warps of a partition with nothing to do
parked for the kernel's whole run; its consumers' own samples sat on MUFU streaks and the row max's FMNMX chain).

    python benchmarks/pipes_source.py DIR [--top N]      (every *.source.csv in DIR, by name)

Session 57's pipe totals put the consumers' barrier stalls first in every Gluon forward; this says which barrier:
the consumers' turn handover (BAR.SYNC / BAR.ARV on a named barrier), the K / V ring's mbarrier waits
(SYNCS.PHASECHK, the try-wait loop), or a wgmma's retirement (WARPGROUP.DEPBAR / WARPGROUP.ARRIVE).

The column names differ between ncu versions: the samples are read from the first column named like "Warp Stall
Sampling (All Samples)" or "Sampling Data (All)", the instruction from "Source"; the file is refused if it has
neither. The reasons are the columns named ``stall_*`` without "(Not Issued)" (the H200's ncu, session 58); a page
without them gives no reason table."""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

SAMPLES = re.compile(r"sampling.*\(all", re.IGNORECASE)
REASON = re.compile(r"^stall_\w+$")
#: SASS opcode prefix -> the family the table names (first match wins; anything else: its opcode's first part)
FAMILIES = (("BAR.", "named barrier (BAR)"), ("SYNCS.", "mbarrier (SYNCS)"), ("WARPGROUP.", "wgmma wait / arrive"),
            ("HGMMA", "wgmma issue (HGMMA)"), ("MUFU", "MUFU"), ("WARPSYNC", "warp sync"), ("NANOSLEEP", "sleep"),
            ("UTMALDG", "TMA load"), ("UTMASTG", "TMA store"), ("LDG", "global load"), ("STG", "global store"),
            ("LDS", "shared load"), ("STS", "shared store"), ("SHFL", "shuffle"), ("FMNMX", "max"), ("F2FP", "convert"))


class Row(NamedTuple):
    """One SASS instruction of a source page: its text, its stall samples and those by reason (ncu's names less
    "stall_"; empty where the page has no reason columns)."""

    instruction: str
    samples: float
    reasons: dict


def read(path: Path) -> list[Row]:
    """The rows of an ncu source-page CSV, in address order; refuses a file without a Source and a sampling
    column."""
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    header = next((i for i, row in enumerate(rows) if _columns(row) is not None), None)
    if header is None:
        raise ValueError(f"{path}: no source table (a header naming Source and a stall-sampling column)")
    source, samples = _columns(rows[header])
    reasons = [(j, name.strip()[len("stall_"):]) for j, name in enumerate(rows[header]) if REASON.match(name.strip())]
    out = []
    for row in rows[header + 1:]:
        if len(row) <= max(source, samples):
            continue
        try:
            n = _number(row[samples])
        except ValueError:  # (a units row, a repeated header)
            continue
        by_reason = {name: _number(row[j]) for j, name in reasons if j < len(row) and _is_number(row[j])}
        out.append(Row(row[source].strip(), n, {k: v for k, v in by_reason.items() if v}))
    return out


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _is_number(text: str) -> bool:
    try:
        _number(text)
    except ValueError:
        return False
    return True


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


class Summary(NamedTuple):
    """:func:`summarise`'s tables, shares in % of all samples, largest first: reasons (name, share); families (name,
    share); heaviest (instruction, share, its largest reason or "", the instruction before it or "")."""

    reasons: list
    families: list
    heaviest: list


def summarise(rows: list[Row], top: int = 8) -> Summary:
    """The reasons', families' and ``top`` instructions' shares of ``rows``' samples (:class:`Summary`)."""
    total = sum(r.samples for r in rows) or 1.0
    by_family, by_reason = Counter(), Counter()
    for r in rows:
        by_family[family(opcode(r.instruction))] += r.samples
        by_reason.update(r.reasons)
    families = [(name, 100 * s / total) for name, s in by_family.most_common() if s > 0]
    reasons = [(name, 100 * s / total) for name, s in by_reason.most_common() if s > 0]
    order = sorted(range(len(rows)), key=lambda i: -rows[i].samples)[:top]
    heaviest = [(rows[i].instruction, 100 * rows[i].samples / total,
                 max(rows[i].reasons, key=rows[i].reasons.get) if rows[i].reasons else "",
                 rows[i - 1].instruction if i else "") for i in order if rows[i].samples > 0]
    return Summary(reasons, families, heaviest)


def _code(instruction: str) -> str:
    return f"`{instruction.replace('|', '¦')}`" if instruction else ""  # (|R| in a table cell)


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
            summary = summarise(read(path), args.top)
        except ValueError as e:
            print(f"### {name}\n\nunreadable: {e}\n")
            status = 1
            continue
        print(f"### {name}\n")
        if summary.reasons:
            print("| stall reason | % of samples |\n|---|---|")
            print("\n".join(f"| {n} | {p:.1f} |" for n, p in summary.reasons[:args.top]) + "\n")
        print("| stalls by family | % of samples |\n|---|---|")
        print("\n".join(f"| {n} | {p:.1f} |" for n, p in summary.families if p >= 0.1))
        print("\n| heaviest instructions | % of samples | largest reason | after |\n|---|---|---|---|")
        print("\n".join(f"| {_code(i)} | {p:.1f} | {r} | {_code(b)} |" for i, p, r, b in summary.heaviest) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
