"""Host overhead per call (harness/perf/overhead.py, benchmarks/host_overhead.py) on the CPU: the
measurement runs, says that a CPU has no budget to meet, and refuses bad arguments."""

import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from harness.adapters import registry
from harness.adapters.base import SoftmaxAdapter
from harness.cases import SoftmaxCase, case_from_id
from harness.perf import overhead

CASE = SoftmaxCase(1, 2, 2, 32, 32, 16, causal=True)


def test_cpu_measurement_has_host_time_and_no_budget_verdict():
    r = overhead.measure(registry.get("eager"), CASE, "bwd", device="cpu", calls=3, windows=2)
    assert r.host_us > 0 and len(r.calls_us) == 6 and r.device_us is None
    assert r.over_budget is None and r.host_bound is None and r.budget_us == overhead.HOST_BUDGET_US["bwd"]
    assert "no budget on a CPU" in overhead.markdown([r])[-1]


def test_host_time_counts_what_the_host_spends():
    """A backend that sleeps 2 ms on the host per call measures at least that."""
    import time

    class Slow(SoftmaxAdapter):
        name = "slow_host"

        def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
            time.sleep(0.002)
            return registry.get("eager").run(case, q=q, k=k, v=v)

    r = overhead.measure(Slow(), CASE, "fwd", device="cpu", calls=3, windows=2)
    assert r.host_us >= 2000


def test_calls_that_wait_do_not_move_the_median(monkeypatch):
    """A call that finds the launch queue full waits for the device: its host time is not the
    host's cost. On a fake host clock, a call costs 10 us and every fifth one waits 20 ms more: the
    median call is a cheap one, the loop mean carries the waits, and the table prints both. (A fake
    clock: on a loaded CI machine the real one made ordinary calls take 24 ms.)"""
    now = [0.0]
    monkeypatch.setattr(overhead, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    class Waits(SoftmaxAdapter):
        name = "waits"
        n = 0

        def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
            Waits.n += 1
            now[0] += 10e-6 + (20e-3 if Waits.n % 5 == 0 else 0.0)
            return registry.get("eager").run(case, q=q, k=k, v=v)

    r = overhead.measure(Waits(), CASE, "fwd", device="cpu", calls=10, windows=2)
    assert len(r.calls_us) == 20 and sum(t > 20000 for t in r.calls_us) == 4
    assert r.host_us == pytest.approx(10.0) and r.mean_us == pytest.approx(10.0 + 4 * 20000 / 20)
    assert f"| {r.host_us:.1f} | {r.mean_us:.1f} |" in overhead.markdown([r])[-1]


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        overhead.measure(registry.get("eager"), CASE, "sideways", device="cpu")
    with pytest.raises(ValueError, match="positive"):
        overhead.measure(registry.get("eager"), CASE, "fwd", device="cpu", calls=0)


def test_script_writes_its_table(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    rc = host_overhead.main(["--backends", "eager,flash_attn", "--cases", CASE.id, "--modes", "fwd", "--calls", "2",
                             "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "overhead.json").read_text())
    assert [r["backend"] for r in data["rows"]] == ["autograd floor", "eager"]
    assert any(s.startswith("flash_attn on") for s in data["skipped"])  # said why, not silently dropped
    assert "| eager | " in (tmp_path / "overhead.md").read_text()
    assert host_overhead.main(["--cases", "not-a-case", "--device", "cpu", "--out", str(tmp_path)]) == 2


def test_the_autograd_floor_launches_no_kernel_and_measures_both_modes():
    """The floor row: autograd's node and the allocations alone, forward and backward; below any
    real backend's host time on the same case."""
    floor = overhead.measure(overhead.AutogradFloor(), CASE, "bwd", device="cpu", calls=5, windows=3)
    fwd = overhead.measure(overhead.AutogradFloor(), CASE, "fwd", device="cpu", calls=5, windows=3)
    eager = overhead.measure(registry.get("eager"), CASE, "bwd", device="cpu", calls=5, windows=3)
    assert 0 < floor.host_us < eager.host_us and fwd.host_us > 0


def test_script_adds_the_in_repo_kernels_launch_path(tmp_path):
    """The in-repo kernel's row is followed by its launch path alone (launchers called directly)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the in-repo kernels run on the CPU only under TRITON_INTERPRET=1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    rc = host_overhead.main(["--backends", "triton_fa", "--cases", "B1-H2-S16x16-D16-fp32", "--modes", "fwd",
                             "--calls", "1", "--device", "cpu", "--no-floor", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "overhead.json").read_text())["rows"]
    assert [r["backend"] for r in rows] == ["triton_fa", "triton_fa (launch path)"]
    # with floors (a GPU's): the path's windows interleaved with theirs, the floors' medians kept beside it
    calls = []
    floors = {host_overhead.FLOOR_LAUNCH: lambda: calls.append(1)}
    t = host_overhead.launch_path("triton_fa", case_from_id("B1-H2-S16x16-D16-fp32"), "fwd", torch.device("cpu"), 1,
                                  floors)
    assert len(t.path) == overhead.WINDOWS and len(calls) == 3 + overhead.WINDOWS
    assert set(t.beside) == {host_overhead.FLOOR_LAUNCH} and t.in_launch_floors() > 0


def test_host_ab_puts_runs_side_by_side(tmp_path, capsys):
    """benchmarks/host_ab.py: each run's median call per row, in run order, and new / old of the means."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_ab
    finally:
        sys.path.pop(0)
    for name, us in (("new-1", 20.0), ("old-1", 30.0), ("new-2", 22.0), ("old-2", 28.0)):
        (tmp_path / name).mkdir()
        rows = [{"backend": "triton_fa (launch path)", "case": CASE.id, "mode": "fwd", "host_us": us}]
        if name.startswith("old"):
            rows.append({"backend": "triton_fa (launch path)", "case": CASE.id, "mode": "bwd", "host_us": 2 * us})
        floors = {"one torch.empty (1 MiB)": us / 10} if name != "old-2" else {}  # (runs before session 27: none)
        paths = [{"backend": "triton_fa", "case": CASE.id, "mode": "fwd", "in_launch_floors": us / 8}] \
            if name != "old-2" else []  # (runs before session 28: none)
        (tmp_path / name / "overhead.json").write_text(json.dumps({"rows": rows, "host_floors_us": floors,
                                                                    "launch_paths": paths}))
    assert host_ab.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| backend | case | mode | new-1 | old-1 | new-2 | old-2 | new / old |"  # run order
    assert out[2] == "| host floor | one torch.empty (1 MiB) | - | 2.0 | 3.0 | 2.2 | - | 0.70 |"
    assert out[3] == f"| triton_fa (launch path) | {CASE.id} | fwd | 20.0 | 30.0 | 22.0 | 28.0 | 0.72 |"
    assert out[4] == f"| triton_fa {host_ab.IN_FLOORS} | {CASE.id} | fwd | 2.50 | 3.75 | 2.75 | - | 0.70 |"
    assert out[5] == f"| triton_fa (launch path) | {CASE.id} | bwd | - | 60.0 | - | 56.0 | - |"
    assert host_ab.main([str(tmp_path / "missing")]) == 2


def test_launches_alone_replays_what_the_path_launched_with_its_tensors():
    """benchmarks/host_overhead.py's "launches alone" row: every Launch of a path's cache (the forward's
    value, the backward's plan) replayed in order with the tensors of the call before, nothing else run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    from kernels.launcher import Launch

    class FakeLaunch(Launch):
        def __init__(self, name, log):
            self.compiled = name  # (a slot of Launch's)
            self.template = log

        def __call__(self, tensors):
            self.template.append((self.compiled, tensors["X"]))
            return True

    log, cache, made = [], {}, []

    def path():  # a launch path: allocates, then replays its cache (fills it on the first call)
        x = len(made)
        made.append(x)
        if not cache:
            cache["fwd"] = FakeLaunch("fwd", log)
            cache["plan"] = (False, 2, (FakeLaunch("dq", log), FakeLaunch("dkdv", log)))
            return
        for launch in (cache["fwd"], *cache["plan"][2]):
            launch({"X": x})

    alone = host_overhead.launches_alone((path, cache))
    assert made == [0, 1] and log == [("fwd", 1), ("dq", 1), ("dkdv", 1)] and alone.launches == 3
    alone()
    alone()
    assert made == [0, 1]  # no allocation: the path itself is not called again
    assert log[3:] == [("fwd", 1), ("dq", 1), ("dkdv", 1)] * 2
    assert host_overhead.launches_alone((lambda: None, {})) is None  # nothing to replay (the interpreter)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused-append", "append-launch"])
def test_the_decode_step_has_a_launch_path_replaying_its_plans_launches(fuse, monkeypatch):
    """host_overhead.py's decode launch path: ``decode_attention`` as a serving loop calls it (validate=False),
    its cache the launches (split and combine, the append before them where the split kernel does not append
    itself) of the one plan its first call leaves in the emptied signature cache; replayed alone they are the
    kernels a step launches, in its order (stand-ins on the CPU, kernels/standins.py)."""
    import dataclasses

    from kernels.decode import interface as dec

    monkeypatch.setattr(dec, "INTERPRET_CONFIG", dataclasses.replace(dec.INTERPRET_CONFIG, fuse_append=fuse))
    names = ["split", "combine"] if fuse else ["append", "split", "combine"]
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    from kernels.standins import cpu_replays

    case = case_from_id("B2-H4/2-Q1-L64r-P16-new-D16-fp32")
    assert host_overhead.launch_path_call("triton_decode", case, "bwd", torch.device("cpu")) is None  # forward only
    log = []
    with cpu_replays(log):
        call, cache = host_overhead.launch_path_call("triton_decode", case, "fwd", torch.device("cpu"))
        assert sorted(cache) == sorted(names)
        out, lse = call()
        assert out.shape == (2, 1, 4, 16) and lse.shape == (2, 4, 1)
        del log[:]
        alone = host_overhead.launches_alone((call, cache))
        assert alone.launches == len(names)
        del log[:]
        alone()
    assert [(kind, name) for kind, name, *_ in log] == [("replay", f"_{n}_kernel") for n in names]


def test_launch_paths_are_priced_at_the_hosts_floors():
    """host_overhead.py's decomposition: launches x the one-pointer launch floor + allocations x the torch.empty
    floor, and the rest as the path's own; a dash where a count or a floor is missing (a CPU run)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    floors = {host_overhead.FLOOR_LAUNCH: 7.0, host_overhead.FLOOR_EMPTY: 3.0}
    t = host_overhead.PathTimes(path=[40.0, 50.0, 45.0], alone=[21.0], launches=3, allocations=4.0)
    assert t.floor_model_us(floors) == 33.0 and t.floor_model_us({}) is None
    table = host_overhead.decomposition([("triton_fa", CASE.id, "bwd", t),
                                         ("triton_fa", CASE.id, "fwd", host_overhead.PathTimes([9.0], None, None, None))],
                                        floors)
    assert table[2] == f"| triton_fa | {CASE.id} | bwd | 45.0 | 3 | 4 | 3.0 / 7.0 (run's) | 33.0 | 12.0 | - |"
    assert table[3] == f"| triton_fa | {CASE.id} | fwd | 9.0 | - | - | 3.0 / 7.0 (run's) | - | - | - |"
    # floors measured beside the path (interleaved windows) price it instead of the run's, and give its ratio
    beside = host_overhead.PathTimes([40.0, 50.0, 45.0], [21.0], 3, 4.0,
                                     beside={host_overhead.FLOOR_LAUNCH: 9.0, host_overhead.FLOOR_EMPTY: 2.0})
    assert beside.floor_model_us(floors) == 35.0 and beside.in_launch_floors() == 5.0 and t.in_launch_floors() is None
    row = host_overhead.decomposition([("triton_fa", CASE.id, "bwd", beside)], floors)[2]
    assert row == f"| triton_fa | {CASE.id} | bwd | 45.0 | 3 | 4 | 2.0 / 9.0 | 35.0 | 10.0 | 5.00 |"


def test_interleaved_windows_take_turns_and_rotate():
    """overhead.host_times_interleaved: every callable gets every window, in turns whose order rotates, so a host
    slowing down mid-run slows each alike."""
    order = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abc"}
    times = overhead.host_times_interleaved(fns, torch.device("cpu"), calls=2, windows=3)
    assert {n: len(t) for n, t in times.items()} == {"a": 6, "b": 6, "c": 6}
    timed = order[9:]  # after three warm-up calls each
    assert timed == list("aabbcc") + list("bbccaa") + list("ccaabb")


def test_host_python_times_replays_into_stand_ins_and_restores_the_launchers(tmp_path, capsys):
    """benchmarks/host_python.py: the launch paths' own Python with no GPU; the backward's replay cache holds the
    split's three launches, the unsplit two, the atomic-dQ mode's three (delta with dQ's buffer zeroed, the kernel,
    dQ's cast) and three again under a group split (the split's sum launch casts dQ too); the mode's environment
    setting restored; the stand-ins are gone afterwards."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import host_python

    from kernels import launcher
    from kernels.flash_attn import configs

    real = (configs.launch, launcher.launch, configs.interpreting, launcher.current_device)
    mode = os.environ.get("FLASH_ATTN_BWD")
    assert host_python.main(["--calls", "20", "--repeats", "2", "--json", str(tmp_path / "p.json")]) == 0
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    by_path = {r["path"]: r for r in rows}
    assert all(r["us_per_call"] > 0 for r in rows)
    assert [r["launches"] for r in rows if r["path"].startswith("flash_attn_bwd")] == [3, 2, 3, 3]
    assert any("atomic dQ" in p for p in by_path) and os.environ.get("FLASH_ATTN_BWD") == mode
    assert "| a replay alone" in capsys.readouterr().out
    assert (configs.launch, launcher.launch, configs.interpreting, launcher.current_device) == real
    assert any(p.startswith("floor: torch.empty_like") for p in by_path)
    # the host-made descriptors' rows: the replay keeping its encodings, Triton's wrapper, the pointers alone
    assert sum(p.startswith("a replay, ") and "4 " in p for p in by_path) == 3
