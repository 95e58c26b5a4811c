"""``python -m harness bench``: end to end on the CPU (host time, labelled), and the result cells
for every way a backend can end: timed, unsupported, not timed (fails correctness), OOM, error."""

import json

import pytest
import torch
from wrong_impls import OffByOneCausal

from harness import cli
from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput, Unsupported, default_scale
from harness.adapters.eager import eager_attention
from harness.cases import SoftmaxCase
from harness.perf.bench import Bench, oom_reason, verification_case
from harness.perf.timing import TimerOptions

CASE = SoftmaxCase(1, 2, 2, 16, 16, 8, causal=True)
QUICK = TimerOptions(warmup_ms=0.0, reps=3)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/perf/test_timing.py: tiny host-timed ops on a shared machine
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("ATTN_HARNESS_CACHE", str(tmp_path_factory.mktemp("cache")))  # measured ceilings go here
        rc = cli.main(["bench", "--preset", "small", "--device", "cpu", "--backends", "eager,sdpa_math",
                       "--cases", "S37x37|cap5|S33x70", "--reps", "3", "--warmup-ms", "0", "--out", str(out),
                       "--quiet"])
    finally:
        torch.set_num_threads(n)
        mp.undo()
    return rc, out


def test_cli_writes_json_markdown_and_plots(cli_run):
    rc, out = cli_run
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == "attn-harness-bench" and data["schema_version"] == 1
    assert data["settings"]["clock"] == "host" and data["versions"]["torch"] == torch.__version__
    assert {r["backend"] for r in data["results"]} == {"eager", "sdpa_math"}
    timed = [r for r in data["results"] if r["status"] == "ok"]
    assert timed and all(set(r["modes"]) == {"fwd", "bwd", "fwd+bwd"} for r in timed)
    cell = timed[0]["modes"]["fwd"]
    assert len(cell["times_ms"]) == 3 and cell["clock"] == "host" and cell["tflops"] > 0
    assert cell["first_call_ms"] > 0  # the first call's cost (compile, JIT), apart from the repetitions
    assert not (out / "results.partial.json").exists()
    md = (out / "report.md").read_text()
    assert "HOST TIME" in md and "ms (host time)" in md
    assert "unsupported: softcap is not supported by torch SDPA" in md
    assert "speedup vs sdpa_math" in md and "first call (fwd, ms)" in md
    assert (out / "tflops_vs_seqlen.png").stat().st_size > 1000 and (out / "bars_fwd_bwd.png").exists()


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    assert cli.main(["bench", "--device", "cpu", "--modes", "sideways", "--out", str(tmp_path)]) == 2
    assert cli.main(["bench", "--device", "cpu", "--backends", "nope", "--out", str(tmp_path)]) == 2
    assert cli.main(["bench", "--device", "cpu", "--cases", "no-such-case", "--out", str(tmp_path)]) == 2
    assert "--backends" in capsys.readouterr().err


class Eager(SoftmaxAdapter):
    name = "eager_copy"

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        out, lse = eager_attention(q, k, v, causal=case.causal, softmax_scale=default_scale(case))
        return SoftmaxOutput(out, lse)


class RaisesAfter(Eager):
    """Correct while the correctness check runs (2 calls), then raises ``exc`` (as in timing)."""

    def __init__(self, name, exc, after=2):
        self.name, self.exc, self.after, self.calls = name, exc, after, 0

    def run(self, case, **kw):
        self.calls += 1
        if self.calls > self.after:
            raise self.exc
        return super().run(case, **kw)


def runner():
    return Bench("cpu", options=QUICK)


@pytest.mark.timing  # repetition counts from host-clock timings: run alone
def test_correct_backend_is_timed():
    # seven repetitions, not QUICK's three: on the host clock this tiny case's backward is 0.6-0.8x its forward,
    # near the roofline's 0.5x consistency rule; with a median of three the test failed once in a CI run of
    # session 22 (the cells were not printed then: likely that rule after one slow moment; now they are)
    rec = Bench("cpu", options=TimerOptions(warmup_ms=0.0, reps=7)).run(Eager(), CASE)
    assert rec["status"] == "ok" and rec["verify"]["status"] == "pass"
    assert all(c["status"] == "ok" and c["reps"] == 7 for c in rec["modes"].values()), rec["modes"]


def test_failing_backend_is_not_timed_and_says_why():
    a = OffByOneCausal()
    rec = runner().run(a, CASE)
    assert rec["status"] == "not-timed" and rec["modes"] == {}
    assert rec["reason"].startswith("failed correctness:") and "out" in rec["reason"]


def test_oom_in_the_correctness_check_is_an_oom_cell():
    a = RaisesAfter("oom_always", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB"), after=0)
    rec = runner().run(a, CASE)
    assert rec["status"] == "oom" and "out of memory" in rec["reason"]


def test_oom_while_timing_is_a_cell_and_the_run_continues():
    b = runner()
    a = RaisesAfter("oom_later", torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB"))
    rec = b.run(a, CASE)
    assert {c["status"] for c in rec["modes"].values()} == {"oom"}
    assert rec["status"] == "oom" and "OutOfMemoryError" in rec["reason"]
    assert b.run(Eager(), CASE)["status"] == "ok"  # the next backend still runs


def test_triton_out_of_resources_is_an_oom():
    from triton.runtime.errors import OutOfResources

    e = OutOfResources(262144, 232448, "shared memory")
    assert "shared memory" in oom_reason(e)
    assert oom_reason(ValueError("bad shape")) is None


def test_unsupported_raised_by_the_backend_is_never_timed():
    a = RaisesAfter("flex_like", Unsupported("flex fell back to eager: dynamo's recompile_limit was hit"), after=0)
    rec = runner().run(a, CASE)
    assert rec["status"] == "unsupported" and rec["modes"] == {}
    assert "fell back to eager" in rec["reason"]
    a2 = RaisesAfter("flex_like_late", Unsupported("flex fell back to eager: graph break"))
    rec2 = runner().run(a2, CASE)
    assert {c["status"] for c in rec2["modes"].values()} == {"unsupported"}
    assert all("median_ms" not in c for c in rec2["modes"].values())


def test_large_cases_are_verified_on_fewer_heads():
    big = SoftmaxCase(1, 32, 8, 16384, 16384, 128, causal=True, dtype="bf16")
    v = verification_case(big)
    assert (v.batch, v.heads_q, v.heads_k, v.seqlen_q, v.d) == (1, 4, 1, 16384, 128)
    assert verification_case(CASE) is CASE


def test_merge_rebuilds_one_report_from_several_runs(cli_run, tmp_path):
    _, out = cli_run
    data = json.loads((out / "results.json").read_text())
    other = dict(data, results=[dict(r, backend="eager2") for r in data["results"] if r["backend"] == "eager"])
    (tmp_path / "b.json").write_text(json.dumps(other))
    assert cli.main(["bench", "--merge", str(out / "results.json"), str(tmp_path / "b.json"),
                     "--out", str(tmp_path / "m"), "--no-plots"]) == 0
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    assert len(merged["results"]) == len(data["results"]) + len(other["results"])
    assert len(merged["settings"]["parts"]) == 2
    assert "eager2" in (tmp_path / "m" / "report.md").read_text()


def test_time_limit_leaves_the_rest_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    rc = cli.main(["bench", "--preset", "small", "--device", "cpu", "--backends", "eager", "--cases", "S37x37|S24x24-D48",
                   "--reps", "3", "--warmup-ms", "0", "--out", str(tmp_path / "out"), "--quiet", "--no-plots",
                   "--time-limit", "0"])
    assert rc == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["status"] for r in data["results"]] == ["not-timed", "not-timed"]
    assert "not run: --time-limit" in (tmp_path / "out" / "report.md").read_text()


def test_an_interrupted_bench_reports_what_finished(tmp_path, monkeypatch):
    """Ctrl-C or an outer time limit's SIGTERM (KeyboardInterrupt("SIGTERM")) in the middle of a cell: the report
    is still written, with the cells that finished, the rest (the cut cell among them) "not run: the bench was
    interrupted (SIGTERM)", the header saying so; exit 130; no partial JSON left behind."""
    from harness.perf.bench import Bench

    real, calls = Bench.run, []

    def interrupted_second(self, adapter, case, modes):
        calls.append(case.id)
        if len(calls) == 2:
            raise KeyboardInterrupt("SIGTERM")
        return real(self, adapter, case, modes)

    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(Bench, "run", interrupted_second)
    rc = cli.main(["bench", "--preset", "small", "--device", "cpu", "--backends", "eager", "--cases", "S37x37|S24x24-D48",
                   "--reps", "3", "--warmup-ms", "0", "--out", str(tmp_path / "out"), "--quiet", "--no-plots"])
    assert rc == 130
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["status"] for r in data["results"]] == ["ok", "not-timed"]
    assert data["results"][1]["reason"] == "not run: the bench was interrupted (SIGTERM)"
    assert data["settings"]["interrupted"] == "SIGTERM"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "**interrupted** (SIGTERM)" in md and "not run: the bench was interrupted" in md
    assert not (tmp_path / "out" / "results.partial.json").exists()


def test_unsupported_reason_is_worded_once():
    # torch's refusal reaches the bench as "unsupported: <why>": the cell keeps <why>, the report
    # and the pytest skip add the word once ("unsupported: unsupported: ..." was seen on an H200)
    from harness.perf.bench import _cell
    from harness.perf.reports.markdown import row_status_text

    cell = _cell("unsupported", "unsupported: Flash attention requires q,k,v to have the same last dimension")
    assert cell["reason"].startswith("Flash attention")
    assert row_status_text(cell).count("unsupported") == 1


def test_decode_bench_reports_bandwidth_and_tokens(tmp_path, monkeypatch):
    """A decode preset through the bench: forward only (the backward cells say why), the decode table
    with GB/s, the share of the copy rate and tokens/s."""
    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    rc = cli.main(["bench", "--preset", "small-decode", "--device", "cpu", "--backends", "decode_eager,decode_sdpa",
                   "--cases", "P16-new-D32|contig", "--reps", "3", "--warmup-ms", "0", "--no-plots", "--no-memory",
                   "--out", str(tmp_path / "out"), "--quiet"])
    assert rc == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    recs = [r for r in data["results"] if r["status"] == "ok"]
    assert {r["family"] for r in data["results"]} == {"decode"} and len(recs) == 4
    for r in recs:
        fwd = r["modes"]["fwd"]
        assert fwd["status"] == "ok" and fwd["gbps"] > 0 and fwd["bytes"] > 0
        assert r["modes"]["bwd"]["reason"] == "inference-only backend (no backward)"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| backend | fwd ms (host time) | GB/s | of copy rate | tokens/s |" in md
    assert "speedup vs decode_sdpa" in md


def test_fp8_cells_show_their_error_beside_the_bf16_twin(tmp_path, monkeypatch):
    """The report's accuracy table: each FP8 cell's out error against the oracle next to the bf16 cell
    of the same shape (what FP8 costs in accuracy, beside what it saves in time)."""
    import dataclasses

    from harness.cases import SoftmaxCase
    from harness.perf import bench as B
    from harness.perf.reports.markdown import accuracy_table

    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    b = B.Bench(torch.device("cpu"))
    bf16 = SoftmaxCase(1, 2, 2, 40, 40, 32, causal=True, dtype="bf16")
    e4m3 = dataclasses.replace(bf16, fp8="e4m3")
    from harness.adapters import registry

    recs = [b.new_record(registry.get("eager"), bf16), b.new_record(registry.get("eager_fp8"), e4m3)]
    assert all("out_error" in r["verify"] for r in recs)
    md = "\n".join(accuracy_table({"results": recs}))
    rows = [ln for ln in md.splitlines() if ln.startswith("| B1-H2-S40x40-D32-causal-bf16 |")]
    assert len(rows) == 2 and "| eager | bf16 |" in rows[0] and "| eager_fp8 | e4m3 |" in rows[1], md
    fp8_err = float(rows[1].split("|")[4])
    assert fp8_err > 3 * float(rows[0].split("|")[4])  # P in e4m3 costs accuracy: 1-2.5% against bf16's ~0.3%
    assert accuracy_table({"results": recs[:1]}) == []  # no FP8 cell, no table
    # an FP8 backward's cell (fp8_grad) sits beside the same twin, its gradients' errors beside bf16's
    grad = b.new_record(registry.get("eager_fp8"), dataclasses.replace(e4m3, fp8_grad="e5m2"))
    md = "\n".join(accuracy_table({"results": recs + [grad]}))
    rows = [ln for ln in md.splitlines() if ln.startswith("| B1-H2-S40x40-D32-causal-bf16 |")]
    assert len(rows) == 3 and "| eager_fp8 | e4m3, e5m2 grads |" in rows[2], md
    bf16_dq, fp8_dq = (float(r.split("|")[6].split("/")[0]) for r in (rows[0], rows[2]))
    assert fp8_dq > 3 * bf16_dq and rows[1].split("|")[6].strip() == "–"  # the forward-only FP8 cell: none
    # what FP8 saves in time: each FP8 cell against the fastest real-dtype cell of its shape, per mode
    ok = lambda ms, **kw: {"status": "ok", "median_ms": ms, **kw}  # noqa: E731
    recs[0]["modes"] = {"fwd": ok(1.30), "bwd": ok(3.0)}
    slower = dict(recs[0], backend="sdpa_math", modes={"fwd": ok(2.0), "bwd": ok(0.1, launch_bound="host")})
    recs[1]["modes"] = {"fwd": ok(1.0)}
    grad["modes"] = {"fwd": ok(1.0), "bwd": ok(2.0)}
    md = "\n".join(accuracy_table({"results": recs + [slower, grad]}))
    assert "speed: x the fastest bf16 cell (fwd / bwd) |" in md
    rows = {ln.split("|")[2].strip() + ln.split("|")[3]: ln for ln in md.splitlines()
            if ln.startswith("| B1-H2-S40x40-D32-causal-bf16 |")}
    assert rows["eager_fp8 e4m3 "].rstrip().endswith("| 1.30x (eager) / – |"), rows  # no bwd timed: a dash
    assert rows["eager_fp8 e4m3, e5m2 grads "].rstrip().endswith("| 1.30x (eager) / 1.50x (eager) |"), rows
    assert rows["eager bf16 "].rstrip().endswith("| – |")  # a bf16 cell: its own row, no ratio


def _three_rounds(tmp_path, monkeypatch, backends: str, modes: str):
    """``bench --rounds 3`` on the CPU over the small preset's S37x37 case: (exit status, report folder)."""
    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = cli.main(["bench", "--preset", "small", "--device", "cpu", "--backends", backends, "--cases", "S37x37",
                   "--modes", modes, "--reps", "3", "--warmup-ms", "0", "--out", str(out), "--quiet", "--no-plots",
                   "--no-memory", "--rounds", "3"])
    return rc, out


def test_rounds_time_every_cell_again_and_report_the_median_of_the_rounds(tmp_path, monkeypatch):
    """--rounds 3: every timed cell gets three medians (round_ms), reports their median and the rates from it, keeps
    the first round's; the report's header says how the numbers were made."""
    import statistics

    rc, out = _three_rounds(tmp_path, monkeypatch, "eager,sdpa_math", "fwd,bwd")
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["rounds"] == 3 and data["settings"]["rounds_done"] == 3
    cells = [c for r in data["results"] if r["status"] == "ok" for c in r["modes"].values() if c["status"] == "ok"]
    assert {r["backend"] for r in data["results"] if any(c["status"] == "ok" for c in r["modes"].values())} == {
        "eager", "sdpa_math"}
    for c in cells:
        assert len(c["round_ms"]) == 3 and c["first_round_ms"] == c["round_ms"][0]
        assert c["median_ms"] == pytest.approx(statistics.median(c["round_ms"]))
        assert c["tflops"] == pytest.approx(c["flops"] / (c["median_ms"] * 1e-3) / 1e12)
        assert c["round_spread"] == pytest.approx((max(c["round_ms"]) - min(c["round_ms"])) / c["median_ms"])
    assert "timed in 3 passes over the whole run" in (out / "report.md").read_text()
    assert not (out / "results.partial.json").exists()


def test_rounds_must_be_positive(tmp_path, capsys):
    assert cli.main(["bench", "--preset", "small", "--device", "cpu", "--backends", "eager", "--rounds", "0",
                     "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "--rounds: expected a positive count, got 0" in capsys.readouterr().err


def test_close_rounds_takes_the_median_and_judges_it_again():
    """Bench.close_rounds on a hand-made record: the rounds' median replaces the first round's, the rates follow it,
    a cell the roofline rules had flagged on its first round is judged again; a second close changes nothing."""
    bench = Bench("cpu", options=QUICK)
    cell = {"status": "ok", "median_ms": 3.0, "flops": 2e9, "bytes": 1e6, "flags": [], "round_ms": [3.0, 1.0, 2.0]}
    one = {"status": "ok", "median_ms": 5.0, "flops": 2e9, "bytes": 1e6, "flags": [], "round_ms": [5.0]}
    rec = {"backend": "eager", "modes": {"fwd": cell, "bwd": one}}
    bench.close_rounds(rec, CASE)
    assert cell["median_ms"] == 2.0 and cell["first_round_ms"] == 3.0 and cell["round_spread"] == 1.0
    assert cell["tflops"] == pytest.approx(2e9 / 2e-3 / 1e12) and cell["gbps"] == pytest.approx(1e6 / 2e-3 / 1e9)
    assert one["median_ms"] == 5.0 and "first_round_ms" not in one  # one round: as timed
    bench.close_rounds(rec, CASE)
    assert cell["median_ms"] == 2.0 and cell["first_round_ms"] == 3.0


def test_an_interrupted_second_round_reports_the_first(tmp_path, monkeypatch):
    """SIGTERM in the second pass: the first pass's numbers are reported as timed, the header says 1 of 3 passes,
    exit 130."""
    def interrupted(self, rec, adapter, case):
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(Bench, "add_round", interrupted)
    rc, out = _three_rounds(tmp_path, monkeypatch, "eager", "fwd")
    assert rc == 130
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["rounds_done"] == 1 and data["settings"]["interrupted"] == "SIGTERM"
    cell = data["results"][0]["modes"]["fwd"]
    assert cell["status"] == "ok" and "round_ms" not in cell and "first_round_ms" not in cell
    assert "timed in 1 of 3 passes" in (out / "report.md").read_text()


def test_nvidia_smi_clocks_reads_the_throttle_reasons_under_either_name(monkeypatch):
    """The reasons' field is clocks_event_reasons.active on newer drivers and clocks_throttle_reasons.active on older
    ones (an unknown field fails the whole query): the first that answers is kept; without nvidia-smi, {}."""
    import subprocess

    from harness.perf import bench as bench_mod

    def fake(known):
        def run(cmd, **kw):
            query = next(a for a in cmd if a.startswith("--query-gpu=")).split("=", 1)[1]
            if query not in known:
                raise subprocess.CalledProcessError(2, cmd)
            return subprocess.CompletedProcess(cmd, 0, stdout=known[query], stderr="")
        return run

    base = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,temperature.gpu"
    old_driver = {base: "1875, 2619, 1980, 2619, 531.40, 53\n", "clocks_throttle_reasons.active": "0x0000000000000004\n"}
    monkeypatch.setattr(bench_mod.subprocess, "run", fake(old_driver))
    got = bench_mod.nvidia_smi_clocks(0)
    assert got["sm_mhz"] == "1875" and got["power_w"] == "531.40"
    assert got["clock_event_reasons"] == "0x0000000000000004"
    monkeypatch.setattr(bench_mod.subprocess, "run", fake({base: "1980, 2619, 1980, 2619, 120.0, 40\n"}))
    assert "clock_event_reasons" not in bench_mod.nvidia_smi_clocks(0)  # a driver with neither field

    def missing(cmd, **kw):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(bench_mod.subprocess, "run", missing)
    assert bench_mod.nvidia_smi_clocks(0) == {}


def test_cli_runs_case_ids_of_your_own(tmp_path, capsys):
    """``--case``: shapes given by the ids the harness prints, alone without --preset (beside its cases with it),
    --dtypes and --cases applied to them as to a preset's, each case once; an id that does not parse is a usage
    error naming it."""
    out = tmp_path / "own"
    rc = cli.main(["bench", "--device", "cpu", "--backends", "eager", "--case",
                   "B1-H2/1-S40x24-D16-causal-fp32,B1-H2-S8x8-D8-fp32,B1-H2-S8x8-D8-fp32", "--dtypes", "fp32",
                   "--reps", "2", "--warmup-ms", "0", "--no-plots", "--no-memory", "--quiet", "--out", str(out)])
    assert rc == 0
    data = json.loads((out / "results.json").read_text())
    assert sorted(r["case"] for r in data["results"]) == ["B1-H2-S8x8-D8-fp32", "B1-H2/1-S40x24-D16-causal-fp32"]
    assert data["settings"]["presets"] == [] and len(data["settings"]["case_ids"]) == 3
    assert all(r["status"] == "ok" for r in data["results"])
    rc = cli.main(["bench", "--device", "cpu", "--backends", "eager", "--preset", "small", "--cases", "S8x8-D8",
                   "--case", "B1-H2-S8x8-D8-fp32", "--reps", "2", "--warmup-ms", "0", "--no-plots", "--no-memory",
                   "--quiet", "--out", str(tmp_path / "both")])
    data = json.loads((tmp_path / "both" / "results.json").read_text())
    assert rc == 0 and [r["case"] for r in data["results"]] == ["B1-H2-S8x8-D8-fp32"]
    capsys.readouterr()
    assert cli.main(["bench", "--device", "cpu", "--case", "B1-H2-S8x8-D8-sideways", "--out", str(tmp_path)]) == 2
    assert "--case" in capsys.readouterr().err
