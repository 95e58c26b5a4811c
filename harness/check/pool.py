"""Worker processes for the main job: each fed one task at a time, each replaced on its own.

A GPU worker can become unusable in two ways: its CUDA context is lost (a sticky error such as a
misaligned address: every later CUDA call in that process fails), or it dies (a segfault, an abort).
:func:`run_tasks` keeps ``jobs`` worker processes busy, sends each its next task over its own pipe,
and replaces only the process that became unusable: the others keep their warm caches (compiled
kernels, JIT-ed modules, the case's oracle), so one crash costs one process start, not a new pool.
Because the parent knows which task each process holds, a process that dies fails exactly its own
task, and one that reports a lost context after a task keeps that task's result.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait

#: What a fork server of the harness imports once, for every child it forks: torch, torch._inductor
#: (what torch.use_deterministic_algorithms imports on first use: ~1 s a child), the verifier and the
#: acceptance child's runner. One list: Python keeps one fork server per process, started with the
#: preload set first, and both the main job's CPU workers and ``accept``'s children fork from it.
FORKSERVER_PRELOAD = ["torch", "torch._inductor", "harness.check.verify", "harness.accept.runner"]


def _never() -> str | None:
    return None


def _serve(conn, work: Callable, unusable: Callable[[], str | None], warm: Callable | None, warm_arg,
           env: dict[str, str] | None = None) -> None:
    """A worker process: ``warm(warm_arg)`` first (imports, a CUDA context: while the parent is still
    preparing), then run each task the parent sends until it sends None; after each task send
    ``(index, ("ok", value) or ("raised", text), why unusable or None)``, and exit when unusable.
    ``env``: the parent's environment, put in place first (a forked child has its fork server's)."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        if warm is not None:
            try:
                warm(warm_arg)
            except Exception:  # a broken set-up shows in the tasks, with their own errors
                pass
        while True:
            msg = conn.recv()
            if msg is None:
                return
            i, task = msg
            try:
                out = ("ok", work(task))
            except Exception as e:  # the task's own failure: reported for this task only
                out = ("raised", f"{type(e).__name__}: {e}")
            why = unusable()
            conn.send((i, out, why))
            if why:
                return
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # the parent stopped: leave quietly
        return


class _Slot:
    def __init__(self, ctx, args):
        self.conn, child = ctx.Pipe()
        env = dict(os.environ) if ctx.get_start_method() == "forkserver" else None
        self.proc = ctx.Process(target=_serve, args=(child, *args, env), daemon=True)
        self.proc.start()
        child.close()
        self.task: int | None = None

    def give(self, i: int, task) -> None:
        self.task = i
        self.conn.send((i, task))

    def release(self) -> None:
        """Ask the process to exit once idle (it reads None)."""
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass

    def stop(self, *, force: bool = False) -> None:
        if force:
            self.proc.terminate()
        self.proc.join(timeout=1 if force else 10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


class Pool:
    """``jobs`` processes that run ``work(task)``, started at once: each runs ``warm(warm_arg)``
    first, so a pool made early warms up while its owner prepares. ``unusable()`` runs in a worker
    after each task: a reason (a lost CUDA context) retires that process once its result is sent.
    ``work``, ``unusable`` and ``warm`` must be importable module-level functions. Use as a context
    manager, or call :meth:`close`.

    ``start_method``: "spawn" (the default: a fresh interpreter each, the only safe one where CUDA
    may be used, since a CUDA context cannot be forked) or "forkserver": each process forked from one
    server per parent process that imported :data:`FORKSERVER_PRELOAD` once (a CPU run's workers then
    start in a fraction of a second instead of repeating torch's imports); harness/accept/isolation.py
    forks from the same server. Its children are given the parent's environment as it is at their start; what the
    server's own start-up and imports read (PYTHON*, OMP_NUM_THREADS, TRITON_INTERPRET for
    triton.language) stays as it was when the server started."""

    def __init__(self, jobs: int, work: Callable, *, unusable: Callable[[], str | None] = _never,
                 warm: Callable | None = None, warm_arg=None, start_method: str = "spawn"):
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self._args = (work, unusable, warm, warm_arg)
        self.slots: list[_Slot] = []
        try:
            for _ in range(max(1, jobs)):
                self.slots.append(_Slot(self._ctx, self._args))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process (an interrupt, an error, or after :meth:`run`)."""
        for slot in self.slots:
            slot.stop(force=True)
        self.slots.clear()

    def run(self, tasks: list, *, done: Callable[[int, object], None], failed: Callable[[int, str], None],
            replaced: Callable[[str], None] | None = None) -> None:
        """Every task once: ``done(i, value)`` gets each result, ``failed(i, why)`` each task whose
        ``work`` raised or whose process died running it; ``replaced(why)`` is told each time a
        process is replaced. The processes exit as the tasks run out (a pool runs once)."""
        queue = deque(range(len(tasks)))
        slots = self.slots

        def feed(slot: _Slot) -> None:
            if queue:
                i = queue.popleft()
                slot.give(i, tasks[i])
            else:  # nothing left: let it exit now (its CUDA context tears down while the others finish)
                slot.task = None
                slot.release()

        def replace(slot: _Slot, why: str) -> None:
            slots.remove(slot)
            slot.stop(force=True)
            if replaced:
                replaced(why)
            # A new process costs its start-up (imports, a CUDA context: seconds); near the end the
            # processes still running take the last tasks sooner than a new one could.
            if queue and (not slots or len(queue) > len(slots)):
                fresh = _Slot(self._ctx, self._args)
                slots.append(fresh)
                feed(fresh)

        for slot in list(slots):
            feed(slot)
        while any(s.task is not None for s in slots):
            busy = [s for s in slots if s.task is not None]
            ready = set(wait([s.conn for s in busy] + [s.proc.sentinel for s in busy]))
            for slot in busy:
                if slot.conn not in ready and slot.proc.sentinel not in ready:
                    continue
                try:
                    msg = slot.conn.recv() if slot.conn.poll() else None
                except (EOFError, OSError):
                    msg = None
                if msg is None:  # the process died holding its task
                    slot.proc.join(timeout=5)
                    why = f"the worker process died running it (exit code {slot.proc.exitcode})"
                    failed(slot.task, why)
                    replace(slot, why)
                    continue
                i, (kind, value), lost = msg
                if kind == "ok":
                    done(i, value)
                else:
                    failed(i, f"worker process failed: {value}")
                if lost:
                    replace(slot, lost)
                else:
                    feed(slot)
        for slot in slots:  # each was released when the queue ran dry: wait for their exits
            slot.stop()
        slots.clear()


def run_tasks(tasks: list, jobs: int, work: Callable, *, done: Callable[[int, object], None],
              failed: Callable[[int, str], None], unusable: Callable[[], str | None] = _never,
              replaced: Callable[[str], None] | None = None, start_method: str = "spawn") -> None:
    """:class:`Pool` of ``min(jobs, len(tasks))`` processes, :meth:`Pool.run` on ``tasks``, closed.
    On KeyboardInterrupt the processes are stopped and the interrupt propagates."""
    if not tasks:
        return
    with Pool(min(jobs, len(tasks)), work, unusable=unusable, start_method=start_method) as pool:
        pool.run(tasks, done=done, failed=failed, replaced=replaced)
