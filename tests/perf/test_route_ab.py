"""benchmarks/route_ab.py: a same-host A/B of two trees' kernels from `harness bench` runs, side by side."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
try:
    import route_ab
finally:
    sys.path.pop(0)


def _run(root: Path, name: str, cells: dict) -> None:
    """A results.json as `harness bench` writes it, with the fields route_ab reads: case -> {mode: ms or None}."""
    results = [{"case": case, "backend": "triton_fa", "status": "ok",
                "modes": {mode: ({"status": "ok", "median_ms": ms} if ms else {"status": "error", "median_ms": None})
                          for mode, ms in modes.items()}} for case, modes in cells.items()]
    (root / name).mkdir()
    (root / name / "results.json").write_text(json.dumps({"results": results}))


def test_route_ab_puts_runs_in_order_and_pairs_them(tmp_path, capsys):
    """Runs in order new-1, old-1, new-2, old-2 (whatever the folders' listing), each pair's old / new ms (above 1:
    the new tree faster), their geometric mean; a cell one run did not time reads "-" and leaves its pair out."""
    _run(tmp_path, "old-2", {"A": {"bwd": 2.2}, "B": {"bwd": 4.0}})
    _run(tmp_path, "new-1", {"A": {"bwd": 1.0}, "B": {"bwd": 4.0}})
    _run(tmp_path, "new-2", {"A": {"bwd": 2.0}, "B": {"bwd": None}})
    _run(tmp_path, "old-1", {"A": {"bwd": 1.21}, "B": {"bwd": 3.6}})
    (tmp_path / "notes").mkdir()  # (a folder without results.json: not a run)
    assert route_ab.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| backend | case | mode | new-1 | old-1 | new-2 | old-2 | old-1 / new-1 | old-2 / new-2 | geomean |"
    assert out[2] == "| triton_fa | A | bwd | 1.000 | 1.210 | 2.000 | 2.200 | 1.210 | 1.100 | 1.154 |"
    assert out[3] == "| triton_fa | B | bwd | 4.000 | 3.600 | - | 4.000 | 0.900 | - | 0.900 |"


@pytest.mark.parametrize("make", [lambda p: p / "missing", lambda p: p])
def test_route_ab_refuses_a_folder_without_runs(tmp_path, capsys, make):
    """A folder that does not exist, or holds no run with results.json: exit 2 and say so."""
    assert route_ab.main([str(make(tmp_path))]) == 2
    assert capsys.readouterr().err
