"""An interrupted acceptance run (an outer time limit's SIGTERM, a CI cancel, Ctrl-C) still writes its
report: the finished cases as they are, every other case "not run", verdict INCOMPLETE, exit 1, and
no child process left behind.

The implementation (impls/hangs_unless_mha.py) passes the first case (MHA) and hangs on the next
(GQA): the signal is sent once the first case's line is printed, while the second one's child hangs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import cli

IMPLS = Path(__file__).resolve().parent / "impls"
ROOT = Path(__file__).resolve().parents[2]

MHA = "B2-H4-S37x37-D32-fp32"  # passes
GQA = "B2-H4/2-S40x40-D32-causal-fp32"  # hangs: running when the signal comes
MQA = "B1-H4/1-S33x70-D16-causal-fp32"  # hangs: never started
ARGS = ["accept", "--device", "cpu", "--jobs", "1", "--impl", "hangs_unless_mha:flash_attn_func",
        "--case", MHA, "--case", GQA, "--case", MQA]
#: Seconds to wait for the first case (a cold start imports torch twice: parent and fork server).
START_S = 90
#: Seconds the interrupted command may take to write its report and exit.
EXIT_S = 15

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc") or sys.platform != "linux", reason="reads /proc (Linux)")


def _live_in_group(pgid: int) -> list[str]:
    """Processes of process group ``pgid`` that are not zombies: "pid state cmdline" each."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            found.append(f"{d} {state} {cmd[:200]}")
    return found


def _lines(stream) -> queue.Queue:
    q: queue.Queue = queue.Queue()

    def pump():
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _wait_for(q: queue.Queue, prefix: str, timeout: float, seen: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = q.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line starting {prefix!r} within {timeout} s:\n{''.join(seen)}") from None
        if line is None:
            raise AssertionError(f"the command ended before a line starting {prefix!r}:\n{''.join(seen)}")
        seen.append(line)
        if line.startswith(prefix):
            return


def _drain(q: queue.Queue) -> str:
    """What is left in ``q`` once the command has ended (a process of its group that still holds the pipe: what
    came within 10 s)."""
    text = []
    try:
        while (line := q.get(timeout=10)) is not None:
            text.append(line)
    except queue.Empty:
        text.append("(the output pipe is still open)\n")
    return "".join(text)


#: ``python -m harness`` with SIGINT's default disposition: a process started with SIGINT ignored (a pytest-xdist
#: worker's children: an ignored signal is inherited across exec) would keep it ignored, as the command respects
HARNESS = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
           "os.execv(sys.executable, [sys.executable, '-m', 'harness', *sys.argv[1:]])"]


def _env(*paths) -> dict:
    """The command's environment: this checkout (and ``paths``) importable; PYTHONFAULTHANDLER, so a command that
    does not exit and is sent SIGABRT prints every thread's stack."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, paths), os.environ.get("PYTHONPATH", "")]),
                PYTHONFAULTHANDLER="1")


@contextlib.contextmanager
def _own_group(cmd: list[str], env: dict):
    """``cmd`` started in its own process group (its working directory: the implementations), output piped; on
    leaving, it and whatever its group left are killed."""
    proc = subprocess.Popen(cmd, cwd=IMPLS, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed run left
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(timeout=30)
        proc.stdout.close()


def _exit_code(proc, lines: queue.Queue, seen: list[str], what: str) -> int:
    """The command's exit status within EXIT_S; else its stacks (SIGABRT) and output in the failure."""
    try:
        return proc.wait(timeout=EXIT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler: where each thread waits
        proc.wait(timeout=30)
        raise AssertionError(f"no exit {EXIT_S} s after {what}; its output and stacks:\n"
                             + "".join(seen) + _drain(lines)) from None


def _no_process_left(pgid: int) -> None:
    """Nothing of the group outlives the command (the fork server leaves once its parent is gone)."""
    deadline = time.monotonic() + 10
    while (left := _live_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def _wait_until_hanging(log: Path, timeout: float = START_S) -> None:
    """Until the hanging case's child has printed that it hangs (into its log)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "hanging now" in log.read_text(errors="replace"):
            return
        time.sleep(0.02)
    raise AssertionError(f"{log} never said the call hangs")


def _hang_log(out: Path) -> Path:
    return out / "logs" / f"001-{GQA.replace('/', '_')}.log"  # (the GQA case's child's, Isolator's naming)


def _check_report(out: Path, reason: str) -> dict:
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"] == "INCOMPLETE" and rep["interrupted"] == reason
    status = {c["case"]: c["status"] for c in rep["cases"]}
    assert status == {MHA: "pass", GQA: "not run", MQA: "not run"}, [c["reason"] for c in rep["cases"]]
    cases = {c["case"]: c for c in rep["cases"]}
    assert cases[MHA]["seeds"] and cases[MHA]["reason"] == ""  # finished: kept as it is
    for c in (GQA, MQA):
        assert cases[c]["reason"].startswith(f"not run: {reason}") and cases[c]["replay"]
    assert rep["counts"] == {"pass": 1, "not run": 2}
    assert rep["reasons"][0].startswith(f"{reason}: 1 of 3 case(s) finished, 2 not run")
    assert rep["speed"]["status"] == "not measured"
    md = (out / "report.md").read_text()
    assert md.startswith("# Acceptance check: INCOMPLETE") and "## Not run" in md
    assert f"| `{GQA}` | not run: {reason}" in md and f"| `{MQA}` | not run: {reason}" in md
    return rep


@needs_proc
@pytest.mark.parametrize("how", ["sigterm-process", "sigterm-group", "ctrl-c-group"])
def test_interrupted_command_writes_an_incomplete_report_and_leaves_no_child(how, tmp_path):
    """sigterm-process: `kill PID` (the command must kill its running child itself);
    sigterm-group: GNU timeout (the process, then at once its whole group, children included);
    ctrl-c-group: a terminal's Ctrl-C (SIGINT to the whole group)."""
    out = tmp_path / "out"
    seen: list[str] = []
    with _own_group([*HARNESS, *ARGS, "--out", str(out)], _env()) as proc:
        pgid = proc.pid
        lines = _lines(proc.stdout)
        _wait_for(lines, f"[1/3] {MHA}: PASS", START_S, seen)
        _wait_until_hanging(_hang_log(out))  # the GQA case's child is in the call, hanging
        t0 = time.monotonic()
        if how == "ctrl-c-group":
            os.killpg(pgid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
            if how == "sigterm-group":
                os.killpg(pgid, signal.SIGTERM)
        code = _exit_code(proc, lines, seen, "the signal")
        took = time.monotonic() - t0
        _wait_for(lines, "INCOMPLETE", 5, seen)
        assert code == 1, "".join(seen)
        assert took < 10, took
        _check_report(out, "interrupted (Ctrl-C)" if how == "ctrl-c-group" else "interrupted (SIGTERM)")
        _no_process_left(pgid)


def test_in_process_run_interrupted_by_sigterm_restores_the_previous_handler(tmp_path, monkeypatch, capsys):
    """``cli.main`` in-process (the main thread, as tests call it): SIGTERM once the GQA case's child
    runs; the report is written, exit 1, and the caller's SIGTERM handler is back afterwards."""
    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    caught = []

    def caller_handler(signum, frame):
        caught.append(signum)

    def send_sigterm():
        _wait_until_hanging(_hang_log(out))
        os.kill(os.getpid(), signal.SIGTERM)

    sigint_before = signal.getsignal(signal.SIGINT)
    original = signal.signal(signal.SIGTERM, caller_handler)
    try:
        sender = threading.Thread(target=send_sigterm, daemon=True)
        sender.start()
        code = cli.main([*ARGS, "--out", str(out), "--timeout", "60"])
        sender.join(5)
        assert signal.getsignal(signal.SIGTERM) is caller_handler
        assert signal.getsignal(signal.SIGINT) is sigint_before  # both handlers put back
        assert caught == []  # the command's handler took it, not the caller's
    finally:
        signal.signal(signal.SIGTERM, original)
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "interrupted (SIGTERM): stopping" in printed
    rep = _check_report(out, "interrupted (SIGTERM)")
    assert "stopped after" in {c["case"]: c for c in rep["cases"]}[GQA]["reason"]  # killed while it ran


def test_child_killed_by_the_group_signal_before_the_interrupt_is_not_a_crash(tmp_path, monkeypatch):
    """GNU timeout signals the command and its whole group at once: a child may die of SIGTERM before
    the command has handled its own. Such a child waits for the interrupt (INTERRUPT_GRACE_S): it
    is "interrupted" when the interrupt comes in that time, a crash when none comes."""
    from harness.accept import isolation
    from harness.accept import judge as J
    from harness.cases import SoftmaxCase

    monkeypatch.chdir(IMPLS)
    monkeypatch.setattr(isolation, "INTERRUPT_GRACE_S", 1.0)
    iso = isolation.Isolator(tmp_path)
    case = SoftmaxCase(batch=1, heads_q=2, heads_k=2, seqlen_q=8, seqlen_k=8, d=16)
    hello = {"impl": "sigterm_self:flash_attn_func", "family": "softmax", "device": "cpu", "threads": 1}

    def one_case(name):
        """The case as the command runs it: a session, the judge's calls; the outcome."""
        try:
            with iso.open(hello, timeout=60, name=name) as session:
                declared = J.declared_adapter(session.probe["adapter"], "softmax", session.probe["capabilities"])
                J.run_case(J.Judge(session, declared, "cpu"), case, [0], backward=False)
        except isolation.ChildFailed as e:
            return e.outcome
        raise AssertionError("the child answered although it killed itself")

    alone = one_case("alone")  # no interrupt: a crash, as before
    assert alone.kind == "crash" and "SIGTERM" in alone.reason

    def interrupt_once_reaped():  # after the child is gone and its outcome being decided
        seen = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if iso._live:
                seen = True
            elif seen:
                break
            time.sleep(0.005)
        iso.interrupt("interrupted (SIGTERM)")

    t = threading.Thread(target=interrupt_once_reaped, daemon=True)
    t.start()
    outcome = one_case("raced")
    t.join(5)
    assert outcome.kind == "interrupted", outcome.reason
    assert outcome.reason.startswith("not run: interrupted (SIGTERM); the running case was stopped after")
    after = one_case("after")  # nothing starts once interrupted
    assert after.kind == "interrupted" and after.seconds == 0.0 and not os.path.exists(tmp_path / "logs" / "after.log")
    iso.cleanup()


def test_polled_interrupt_raises_only_where_the_main_thread_checks():
    """The handler records the signal and raises nothing (a KeyboardInterrupt raised at an arbitrary
    point of the main thread, inside concurrent.futures.wait, can leave a lock held); check() raises it
    once, later signals are ignored, and restore() puts both previous handlers back."""
    from harness.interrupts import PolledInterrupt

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = PolledInterrupt()
    stop.install()
    try:
        stop.check()  # nothing received: nothing raised
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while stop.received is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler runs here; it must not raise
        assert stop.received == "SIGTERM"
        os.kill(os.getpid(), signal.SIGINT)  # a second signal: ignored
        time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            stop.check()
        stop.check()  # once only
    finally:
        stop.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_judge_error_while_a_child_hangs_kills_the_child_and_returns(tmp_path, monkeypatch):
    """An error of the judge itself in the main thread while a case's child hangs: the error reaches the
    caller within seconds and the child is killed (it used to wait for the worker thread, and so for
    the hanging child, until the case's time limit)."""
    import multiprocessing as mp

    import harness.accept as A

    monkeypatch.chdir(IMPLS)
    out = tmp_path / "out"
    real_wait = A.wait
    failed_at = []

    def failing_wait(*a, **kw):
        log = _hang_log(out)
        if log.exists() and "hanging now" in log.read_text(errors="replace"):
            failed_at.append(time.monotonic())
            raise RuntimeError("injected: the judge failed")
        return real_wait(*a, **kw)

    monkeypatch.setattr(A, "wait", failing_wait)
    with pytest.raises(RuntimeError, match="injected"):
        cli.main([*ARGS, "--out", str(out), "--timeout", "120"])
    assert time.monotonic() - failed_at[0] < 20  # (the case's limit is 120 s: the old code waited it out)
    assert not [p.name for p in mp.active_children() if p.name.startswith("accept:")]


def _fork_servers_of(pgid: int) -> list[int]:
    return [int(line.split()[0]) for line in _live_in_group(pgid) if "multiprocessing.forkserver" in line]


@needs_proc
def test_sigterm_while_the_fork_server_starts_stops_the_run(tmp_path):
    """SIGTERM to the process while the fork server that starts the first child is still starting (its preload,
    here made to hang): the command kills the fork server, writes its report (every case "not run") and exits;
    the first version of the polled interrupt waited for the start, forever with a hung preload."""
    (tmp_path / "hang_on_import.py").write_text("import time\ntime.sleep(600)\n")
    out = tmp_path / "out"
    script = ("import sys\n"
              "import harness.accept.isolation as isolation\n"
              "isolation.FORKSERVER_PRELOAD = isolation.FORKSERVER_PRELOAD + ['hang_on_import']\n"
              "from harness import cli\n"
              f"sys.exit(cli.main({[*ARGS, '--out', str(out)]!r}))\n")
    with _own_group([sys.executable, "-c", script], _env(tmp_path)) as proc:
        deadline = time.monotonic() + START_S
        while not _fork_servers_of(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _fork_servers_of(proc.pid), "no fork server started"
        time.sleep(1.0)  # (it imports torch, then hangs in the preload)
        os.kill(proc.pid, signal.SIGTERM)
        lines: queue.Queue = _lines(proc.stdout)
        assert _exit_code(proc, lines, [], "SIGTERM") == 1, _drain(lines)
        rep = json.loads((out / "report.json").read_text())
        assert rep["verdict"] == "INCOMPLETE" and rep["interrupted"] == "interrupted (SIGTERM)", _drain(lines)
        assert {c["status"] for c in rep["cases"]} == {"not run"}
        _no_process_left(proc.pid)


@needs_proc
def test_ctrl_c_while_a_child_waits_for_its_next_request_is_not_a_crash(tmp_path):
    """Ctrl-C (SIGINT to the whole group) right after a case finished, while the next case's child waits between
    the judge's requests: the children ignore SIGINT and the parent stops them, so the report has finished cases
    and "not run" ones, never a crash (a child that died of the KeyboardInterrupt used to read as one)."""
    out = tmp_path / "out"
    argv = [a if a != "hangs_unless_mha:flash_attn_func" else "correct_softmax:flash_attn_func" for a in ARGS]
    seen: list[str] = []
    with _own_group([*HARNESS, *argv, "--out", str(out)], _env()) as proc:
        lines = _lines(proc.stdout)
        _wait_for(lines, "[1/3]", START_S, seen)
        time.sleep(0.2)  # (the next case's child answers requests, and waits between them)
        os.killpg(proc.pid, signal.SIGINT)
        code = _exit_code(proc, lines, seen, "Ctrl-C")
        printed = "".join(seen) + _drain(lines)
        rep = json.loads((out / "report.json").read_text())
        statuses = {c["case"]: c["status"] for c in rep["cases"]}
        assert code == 1 and rep["verdict"] == "INCOMPLETE", printed
        assert set(statuses.values()) <= {"pass", "not run"}, (statuses, printed)
