"""benchmarks/pipes_table.py (ncu's raw CSVs as one table of pipes, issue slots and stalls) and
benchmarks/pipes_probe.py's arguments: the `device_show.sh pipes` step's two scripts, on the CPU."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
try:
    import pipes_probe
    import pipes_table
finally:
    sys.path.pop(0)

METRICS = {  # name -> (unit, value): what `ncu --csv --page raw` writes for one launch, a few of its columns
    "gpu__time_duration.sum": ("usecond", "1,234.5"),
    "sm__inst_issued.avg.pct_of_peak_sustained_active": ("%", "71.25"),
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": ("%", "88.5"),
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": ("%", "40.0"),
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "62.0"),
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": ("%", "n/a"),
    "smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio": ("", "3.5"),
    "smsp__average_warp_latency_issue_stalled_barrier.ratio": ("", "0.25"),
    "dram__bytes.sum": ("byte", "10"),
}


def _csv(path: Path, metrics=METRICS, prof_lines=True) -> Path:
    head = ["ID", "Process ID", "Kernel Name", *metrics]
    units = ["", "", "", *(u for u, _ in metrics.values())]
    row = ["0", "123", "_fwd_ws_kernel", *(v for _, v in metrics.values())]
    lines = ["==PROF== Connected to process 123", "route: {'block_n': 128}"] if prof_lines else []
    lines += [",".join(f'"{x}"' for x in r) for r in (head, units, row)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_table_reads_pipes_issue_slots_and_stalls_largest_first(tmp_path):
    metrics = pipes_table.read(_csv(tmp_path / "hd64-e0.csv"))
    assert metrics["gpu__time_duration.sum"] == (1234.5, "usecond")  # (thousands separators)
    assert "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active" not in metrics  # (n/a: not a number)
    row = pipes_table.summarise(metrics)
    assert row["duration"] == "1234.5 usecond" and row["issue busy %"] == "71.2"
    assert row["pipes (% of peak)"] == "inst xu 88.5, cycles tensor_op_gmma 62.0, inst fma 40.0"
    assert row["stalls"] == "math_pipe_throttle 3.50, barrier 0.25"
    assert pipes_table.summarise({})["pipes (% of peak)"] == "-"


#: the forms session 57's H200 (ncu on a Firecracker machine) wrote: issue slots and stalls per issue slot "elapsed"
H200_METRICS = {
    "gpu__time_duration.sum": ("nsecond", "629,664"),
    "sm__inst_issued.avg.pct_of_peak_sustained_elapsed": ("%", "29.92"),
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": ("%", "51.23"),
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": ("%", "50.23"),
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": ("inst", "2.83"),
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("inst", "2.18"),
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": ("inst", "1.00"),
}


def test_the_table_reads_the_forms_an_h200s_ncu_writes_and_the_xu_pipes_work(tmp_path):
    row = pipes_table.summarise(pipes_table.read(_csv(tmp_path / "hd128cap-e0.csv", H200_METRICS)))
    assert row["issue busy %"] == "29.9" and row["duration"] == "629664 nsecond"
    assert row["xu work us"] == "322.6"  # (51.23% of 629.664 us)
    assert row["stalls"] == "barrier 2.83, wait 2.18"  # ("selected": the warp that issued, not a stall)
    assert pipes_table.summarise(pipes_table.read(_csv(tmp_path / "a.csv")))["xu work us"] == "1092.5"  # (88.5%)


def test_the_table_prints_a_row_a_file_and_flags_an_unreadable_one(tmp_path, capsys):
    _csv(tmp_path / "a-hd64-e0.csv")
    _csv(tmp_path / "b-hd64-e4.csv", prof_lines=False)
    (tmp_path / "c-broken.csv").write_text("==PROF== Error: no kernels were profiled\n")
    assert pipes_table.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| variant | duration |") and len(out) == 5
    assert out[2].startswith("| a-hd64-e0 | 1234.5 usecond | 71.2 | 1092.5 | inst xu 88.5")
    assert out[3].startswith("| b-hd64-e4 |") and "unreadable" in out[4]
    assert pipes_table.main([str(tmp_path / "missing")]) == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pipes_table.main([str(empty)]) == 2


def test_the_probe_refuses_bad_arguments_and_needs_a_gpu(capsys):
    args = pipes_probe.parse_args(["--shape", "4,4096,32,8", "--head-dim", "64", "--exp2-every", "4"])
    assert args.shape == (4, 4096, 32, 8) and args.exp2_every == 4 and args.calls == 3 and not args.causal
    for bad in (["--shape", "4,4096,32,7"], ["--shape", "1,1,1,1", "--calls", "0"],
                ["--shape", "1,1,1,1", "--softcap", "-1"], ["--shape", "1,1,1,1", "--head-dim", "96"]):
        with pytest.raises(SystemExit):
            pipes_probe.parse_args(bad)
    capsys.readouterr()
    if not __import__("torch").cuda.is_available():
        assert pipes_probe.main(["--shape", "1,128,2,2"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
