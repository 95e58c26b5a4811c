"""Issue 16's tables from `harness bench` results: the in-repo kernel against FA2, cuDNN and
flash-attn-4 per cell, and the rules the issue sets.

    python benchmarks/layer_table.py RESULTS.json [RESULTS.json ...] [--out TABLE.md]

Per case (rows in the order of the results) and mode: the in-repo kernel's median ms, each peer's,
and the peer's time over ours (> 1: ours is faster). Below the table, the rules:
* no slower than FA2 (sdpa_flash) on every cell both run;
* a GQA / MQA backward within 1.2x of the MHA backward with the same batch, sequence length,
  query heads and head dim (when that MHA case is in the results: presets attention-layers and
  layer-mha-refs together);
* the goal: no slower than cuDNN.
A cell a backend did not run shows its status (unsupported, failed, not run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OURS = "triton_fa"
PEERS = (("FA2", "sdpa_flash"), ("cuDNN", "sdpa_cudnn"), ("FA4", "flash_attn_cute"), ("mem-eff", "sdpa_efficient"))
MODES = ("fwd", "bwd")
#: issue 16: a GQA / MQA backward may take at most this many times the MHA backward's time
GQA_BWD_LIMIT = 1.2


def load(paths) -> tuple[list[str], dict, dict]:
    """(case ids in order, {(case, backend, mode): median ms or a status word}, {case: params})."""
    order, cells, params = [], {}, {}
    for p in paths:
        for r in json.loads(Path(p).read_text())["results"]:
            case = r["case"]
            if case not in params:
                order.append(case)
                params[case] = r.get("params", {})
            for mode in MODES:
                m = (r.get("modes") or {}).get(mode)
                if m is None:
                    cells.setdefault((case, r["backend"], mode), r.get("status") or "not run")
                elif m.get("status") == "ok" and m.get("median_ms") is not None:
                    cells[(case, r["backend"], mode)] = float(m["median_ms"])
                else:
                    cells[(case, r["backend"], mode)] = m.get("status") or "failed"
    return order, cells, params


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)


def _ratio(peer, ours) -> str:
    if isinstance(peer, float) and isinstance(ours, float) and ours > 0:
        r = peer / ours
        return f"**{r:.2f}**" if r >= 1 else f"{r:.2f}"
    return "-"


def mha_twin(case: str, params: dict, all_params: dict) -> str | None:
    """The MHA case with this GQA / MQA case's batch, lengths, query heads and head dims, if present."""
    if not params or params.get("heads_k") == params.get("heads_q"):
        return None
    keys = ("batch", "heads_q", "seqlen_q", "seqlen_k", "d", "d_v", "causal", "window", "softcap")
    for other, p in all_params.items():
        if (other != case and p.get("heads_k") == p.get("heads_q") and all(p.get(k) == params.get(k) for k in keys)
                and "qkvpacked" not in other):
            return other
    return None


def table(order, cells, params) -> list[str]:
    head = ["case"]
    for mode in MODES:
        head += [f"{mode} ours"] + [f"{mode} {n}" for n, _ in PEERS] + [f"{mode} {n}/ours" for n, _ in PEERS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in order:
        row = [case]
        for mode in MODES:
            ours = cells.get((case, OURS, mode), "not run")
            peers = [cells.get((case, b, mode), "not run") for _, b in PEERS]
            row += [_fmt(ours)] + [_fmt(p) for p in peers] + [_ratio(p, ours) for p in peers]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def rules(order, cells, params) -> list[str]:
    out = []
    fa2 = [(c, m, cells[(c, "sdpa_flash", m)] / cells[(c, OURS, m)]) for c in order for m in MODES
           if isinstance(cells.get((c, OURS, m)), float) and isinstance(cells.get((c, "sdpa_flash", m)), float)]
    slow = [f"{c} {m} ({r:.2f}x)" for c, m, r in fa2 if r < 1]
    out.append(f"- No slower than FA2 (sdpa_flash): {len(fa2) - len(slow)} of {len(fa2)} cells both ran"
               + (f"; slower: {', '.join(slow)}" if slow else ""))
    cud = [(c, m, cells[(c, "sdpa_cudnn", m)] / cells[(c, OURS, m)]) for c in order for m in MODES
           if isinstance(cells.get((c, OURS, m)), float) and isinstance(cells.get((c, "sdpa_cudnn", m)), float)]
    out.append(f"- Goal, no slower than cuDNN: {sum(r >= 1 for _, _, r in cud)} of {len(cud)} cells"
               + (f" (lowest {min(r for _, _, r in cud):.2f}x)" if cud else ""))
    for case in order:
        twin = mha_twin(case, params.get(case), params)
        ours, ref = cells.get((case, OURS, "bwd")), cells.get((twin, OURS, "bwd")) if twin else None
        if twin and isinstance(ours, float) and isinstance(ref, float):
            verdict = "within" if ours <= GQA_BWD_LIMIT * ref else "OVER"
            out.append(f"- {case} backward {ours:.3f} ms against MHA {twin} {ref:.3f} ms: {ours / ref:.2f}x "
                       f"({verdict} {GQA_BWD_LIMIT}x)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="results.json files of harness bench")
    ap.add_argument("--out", default=None, help="also write the markdown here")
    args = ap.parse_args(argv)
    try:
        order, cells, params = load(args.results)
    except (OSError, ValueError, KeyError) as e:
        print(f"layer_table: {e}", file=sys.stderr)
        return 2
    md = ["Median ms (device time as the bench measured it); peer/ours > 1: the in-repo kernel is faster.", "",
          *table(order, cells, params), "", *rules(order, cells, params), ""]
    if args.out:
        Path(args.out).write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
