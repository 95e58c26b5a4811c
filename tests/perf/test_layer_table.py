"""benchmarks/layer_table.py (issue 16's tables) on a made-up results file: ratios per cell, the FA2
rule, the GQA/MQA-vs-MHA backward rule, cells a backend did not run."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import layer_table  # noqa: E402

sys.path.pop(0)


def _result(case, backend, hq, hk, fwd, bwd, status="ok"):
    params = {"batch": 2, "heads_q": hq, "heads_k": hk, "seqlen_q": 2048, "seqlen_k": 2048, "d": 64, "d_v": 64,
              "causal": False, "window": [-1, -1], "softcap": 0.0}
    modes = {} if status != "ok" else {m: {"status": "ok", "median_ms": t} for m, t in (("fwd", fwd), ("bwd", bwd))}
    return {"case": case, "backend": backend, "params": params, "status": status, "modes": modes}


def test_table_and_rules(tmp_path):
    mha, mqa = "B2-H16-S2048x2048-D64-bf16", "B2-H16/1-S2048x2048-D64-bf16"
    results = [
        _result(mha, "triton_fa", 16, 16, 0.10, 0.30), _result(mha, "sdpa_flash", 16, 16, 0.12, 0.33),
        _result(mha, "sdpa_cudnn", 16, 16, 0.08, 0.25), _result(mha, "flash_attn_cute", 16, 16, 0, 0, "unsupported"),
        _result(mqa, "triton_fa", 16, 1, 0.11, 0.40), _result(mqa, "sdpa_flash", 16, 1, 0.10, 0.45),
    ]
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"results": results}))
    out = tmp_path / "t.md"
    assert layer_table.main([str(p), "--out", str(out)]) == 0
    md = out.read_text()
    row = next(line for line in md.splitlines() if line.startswith(f"| {mha} "))
    assert "| 0.100 | 0.120 | 0.080 | unsupported | not run | **1.20** | 0.80 | - | - |" in row
    assert "No slower than FA2 (sdpa_flash): 3 of 4 cells both ran; slower: B2-H16/1-S2048x2048-D64-bf16 fwd (0.91x)" in md
    assert f"- {mqa} backward 0.400 ms against MHA {mha} 0.300 ms: 1.33x (OVER 1.2x)" in md
    assert layer_table.main([str(tmp_path / "missing.json")]) == 2
