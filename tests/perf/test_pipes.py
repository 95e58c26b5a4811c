"""benchmarks/pipes_table.py (ncu's raw CSVs as one table of pipes, issue slots and stalls), benchmarks/pipes_source.py
(ncu's source page: stalls by SASS instruction) and benchmarks/pipes_probe.py's arguments: the `device_show.sh pipes`
step's scripts, on the CPU."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
try:
    import pipes_probe
    import pipes_source
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
    assert not args.backward and pipes_probe.parse_args(["--shape", "1,128,2,2", "--backward"]).backward
    for bad in (["--shape", "4,4096,32,7"], ["--shape", "1,1,1,1", "--calls", "0"],
                ["--shape", "1,1,1,1", "--softcap", "-1"], ["--shape", "1,1,1,1", "--head-dim", "96"]):
        with pytest.raises(SystemExit):
            pipes_probe.parse_args(bad)
    capsys.readouterr()
    if not __import__("torch").cuda.is_available():
        assert pipes_probe.main(["--shape", "1,128,2,2"]) == 2
        assert "no CUDA device" in capsys.readouterr().err


#: a source page as ncu writes it (session 57's guess at its columns: the two sampling names of ncu versions, one each
#: file), SASS rows with their stall samples
SOURCE_ROWS = [("/*0100*/", "@!P0 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100 ;", "300"),
               ("/*0110*/", "BAR.ARV 0x2, 0x100 ;", "20"),
               ("/*0120*/", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R3 ;", "150"),
               ("/*0130*/", "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", "100"),
               ("/*0140*/", "MUFU.EX2 R4, R5 ;", "1,000"),
               ("/*0150*/", "IADD3 R1, R2, |R3|, RZ ;", "0"),
               ("/*0160*/", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;", "30")]


def _source_csv(path: Path, samples_name: str, reasons: bool = False) -> Path:
    """A source page of :data:`SOURCE_ROWS`; ``reasons``: with the H200's per-reason columns (session 58), each
    row's samples split between two of them, and a "(Not Issued)" twin the reader leaves out."""
    lines = ["==PROF== Connected to process 123", "route: {'block_n': 128}"]
    extra = ("stall_barrier", "stall_wait", "stall_wait (Not Issued)") if reasons else ()
    lines.append(",".join(f'"{x}"' for x in ("Address", "Source", samples_name, "Instructions Executed", *extra)))
    for a, src, n in SOURCE_ROWS:
        total = float(n.replace(",", ""))
        split = (f"{total * 0.75:g}", f"{total * 0.25:g}", "7") if reasons else ()
        lines.append(",".join(f'"{x}"' for x in (a, src, n, "64", *split)))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("samples_name", ["Warp Stall Sampling (All Samples)", "Sampling Data (All)"])
def test_the_source_page_reads_stalls_by_instruction_family(tmp_path, samples_name):
    rows = pipes_source.read(_source_csv(tmp_path / "v.source.csv", samples_name))
    assert len(rows) == len(SOURCE_ROWS) and rows[4] == ("MUFU.EX2 R4, R5 ;", 1000.0, {})
    assert pipes_source.opcode(rows[0][0]) == "BAR.SYNC.DEFER_BLOCKING" and pipes_source.opcode("") == ""
    summary = pipes_source.summarise(rows, top=3)
    total = 1600
    assert summary.families[:4] == [("MUFU", 100 * 1000 / total), ("named barrier (BAR)", 100 * 320 / total),
                                    ("mbarrier (SYNCS)", 100 * 150 / total), ("wgmma wait / arrive", 100 * 100 / total)]
    assert ("IADD3", 0.0) not in summary.families and summary.reasons == []  # (no reason columns on this page)
    assert [h[0] for h in summary.heaviest] == [SOURCE_ROWS[4][1], SOURCE_ROWS[0][1], SOURCE_ROWS[2][1]]


def test_the_source_page_reads_each_instructions_reasons_and_what_it_waits_behind(tmp_path):
    """The H200's page (session 58): per-reason columns; a sample sits on the instruction a warp waits to issue, so
    each heavy row names its largest reason and the instruction before it."""
    rows = pipes_source.read(_source_csv(tmp_path / "v.source.csv", "Warp Stall Sampling (All Samples)", True))
    assert rows[4].reasons == {"barrier": 750.0, "wait": 250.0} and rows[5].reasons == {}  # (zeros dropped)
    summary = pipes_source.summarise(rows, top=2)
    assert summary.reasons == [("barrier", 75.0), ("wait", 25.0)]  # (of all 1600 samples; "Not Issued" left out)
    assert summary.heaviest == [(SOURCE_ROWS[4][1], 62.5, "barrier", SOURCE_ROWS[3][1]),
                                (SOURCE_ROWS[0][1], 18.75, "barrier", "")]  # (the first row has nothing before it)


def test_the_source_table_prints_a_section_a_file_and_flags_an_unreadable_one(tmp_path, capsys):
    _source_csv(tmp_path / "a.source.csv", "Warp Stall Sampling (All Samples)")
    (tmp_path / "b.source.csv").write_text('"Address","Source"\n"/*0*/","NOP ;"\n')  # (no sampling column)
    _csv(tmp_path / "a.csv")  # (the raw page beside it: not this script's)
    assert pipes_source.main([str(tmp_path), "--top", "2"]) == 1
    out = capsys.readouterr().out
    assert "### a\n" in out and "| MUFU | 62.5 |" in out and "| `MUFU.EX2 R4, R5 ;` | 62.5 |  | `WARPGROUP" in out
    assert "| stall reason |" not in out  # (a page without reason columns)
    assert "### b\n\nunreadable" in out
    assert pipes_table.main([str(tmp_path)]) == 0  # (the raw table skips the source pages)
    capsys.readouterr()
    assert pipes_source.main([str(tmp_path / "missing")]) == 2
