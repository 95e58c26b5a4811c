"""benchmarks/dispatch_model.py: the list-scheduling model of the GPU's dispatch behind units first."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
try:
    import dispatch_model as dm
finally:
    sys.path.pop(0)


def test_program_costs_follow_the_causal_diagonal():
    """dK / dV: key block j of 128 walks the 64-row query tiles from its diagonal on (heavy first); dQ: query block i
    of 128 walks the 64-key blocks up to its diagonal (heavy last); times the heads a program, plus the overhead."""
    assert dm.program_costs("dkdv", 512, 128, 64, 1) == [8, 6, 4, 2]
    assert dm.program_costs("dkdv", 512, 128, 64, 4, overhead=1) == [33, 25, 17, 9]
    assert dm.program_costs("dq", 512, 128, 64, 1) == [2, 4, 6, 8]
    assert dm.program_costs("dq", 300, 128, 64, 1) == [2, 4, 5]  # (the last block: 44 rows, keys up to 300)
    with pytest.raises(ValueError, match="'dkdv' or 'dq'"):
        dm.program_costs("fwd", 512, 128, 64, 1)
    with pytest.raises(ValueError, match="positive"):
        dm.program_costs("dq", 0, 128, 64, 1)


def test_list_scheduling_span_over_mean():
    """Programs go in order to the first free SM: equal programs on as many SMs read 1.0; one long program last on
    two SMs, [1, 1, 2], ends at 3 against a mean of 2 (1.5), and first, [2, 1, 1], at 2 (1.0)."""
    assert dm.span_over_mean([1.0] * 4, 4) == 1.0
    assert dm.span_over_mean([1.0, 1.0, 2.0], 2) == 1.5
    assert dm.span_over_mean([2.0, 1.0, 1.0], 2) == 1.0
    with pytest.raises(ValueError):
        dm.span_over_mean([], 2)


def test_units_first_orders_the_grid_as_the_kernels_do():
    """Blocks first: each unit's blocks in a row; units first: every unit's first block before any second one, and
    the dQ kernel's blocks last first (its UNITS_FIRST walks them so)."""
    assert dm.grid_costs("dkdv", 2, 256, 128, 64, 1, False) == [4, 2, 4, 2]
    assert dm.grid_costs("dkdv", 2, 256, 128, 64, 1, True) == [4, 4, 2, 2]
    assert dm.grid_costs("dq", 2, 256, 128, 64, 1, True) == [4, 4, 2, 2]


def test_the_model_reproduces_session_59s_numbers_and_prints_a_table(capsys):
    """Session 59's figures (configs.BWD_GLUON_UNITS_FIRST's note): Llama-3-70B 64/8 4k causal dK / dV 1.59 blocks
    first, 1.00 units first; B4 32/8 2k 1.30; and the script prints one row a shape."""
    row = dict(kernel="dkdv", seqlen=4096, block=128, tile=64, heads=8)
    assert dm.span_over_mean(dm.grid_costs(units=8, units_first=False, **row), 132) == pytest.approx(1.59, abs=0.01)
    assert dm.span_over_mean(dm.grid_costs(units=8, units_first=True, **row), 132) == pytest.approx(1.0, abs=0.01)
    b4 = dm.grid_costs("dkdv", 32, 2048, 128, 64, 4, False)
    assert dm.span_over_mean(b4, 132) == pytest.approx(1.30, abs=0.01)
    assert dm.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(dm.SHAPES)
    assert lines[2].startswith("| Llama-3-70B 64/8 4k, dK / dV | 256 | 1.59 | 1.00")
