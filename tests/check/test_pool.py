"""harness/check/pool.py: worker processes fed one task at a time, each replaced on its own."""

import pool_work
import pytest

from harness.check.pool import run_tasks


def _run(tasks, jobs):
    done, failed, replaced = {}, {}, []
    run_tasks(tasks, jobs, pool_work.run, done=done.__setitem__, failed=failed.__setitem__,
              unusable=pool_work.unusable, replaced=replaced.append)
    return done, failed, replaced


def test_every_task_runs_once_and_results_keep_their_index():
    done, failed, replaced = _run([("ok", 0.0)] * 7, 3)
    assert sorted(done) == list(range(7)) and not failed and not replaced
    assert len(set(done.values())) <= 3  # three processes at most


def test_a_retired_process_is_replaced_while_much_is_left_and_keeps_its_result():
    tasks = [("retire", 0.0)] + [("ok", 0.2)] * 6
    done, failed, replaced = _run(tasks, 2)
    assert sorted(done) == list(range(7)) and not failed
    assert replaced == ["retired (simulated lost context)"]
    assert len(set(done.values())) == 3  # the retired one, the other, and its replacement


def test_near_the_end_the_running_processes_take_the_rest_instead_of_a_new_one():
    """A new process costs seconds on a GPU box (imports, a CUDA context): with no more tasks left
    than processes running, the last task waits for a running process instead."""
    tasks = [("retire", 0.0), ("ok", 0.5), ("ok", 0.0)]
    done, failed, replaced = _run(tasks, 2)
    assert sorted(done) == [0, 1, 2] and not failed and len(replaced) == 1
    assert done[2] == done[1]  # the surviving process ran it
    assert len(set(done.values())) == 2


def test_a_process_that_dies_fails_its_own_task_only_and_a_raise_is_that_task_s_failure():
    tasks = [("ok", 0.0), ("die", 0.1), ("raise", 0.0)] + [("ok", 0.1)] * 5
    done, failed, replaced = _run(tasks, 2)
    assert failed[1] == "the worker process died running it (exit code 7)"
    assert failed[2] == "worker process failed: ValueError: bad input"
    assert sorted(done) == [0, 3, 4, 5, 6, 7] and replaced == [failed[1]]


def test_forked_workers_see_the_parent_s_environment_not_their_server_s(monkeypatch):
    """A fork server keeps the environment it started with; its children are given the parent's
    (the main job sets its compile and tuning variables just before it starts its workers)."""
    def seen(name):
        done = {}
        run_tasks([name], 1, pool_work.environ, done=done.__setitem__, failed=lambda i, why: pytest.fail(why),
                  start_method="forkserver")
        return done[0]

    monkeypatch.setenv("ATTN_POOL_GONE", "1")
    monkeypatch.delenv("ATTN_POOL_NEW", raising=False)
    assert seen("ATTN_POOL_GONE") == "1"  # the server runs from here on (started here: with it set)
    monkeypatch.delenv("ATTN_POOL_GONE")
    monkeypatch.setenv("ATTN_POOL_NEW", "2")
    assert (seen("ATTN_POOL_GONE"), seen("ATTN_POOL_NEW")) == (None, "2")
