"""``python -c CODE ARGS...`` without paying for torch's import each time: the script runs in a process
forked from a server that has imported torch and nothing else of note (never this project), as the
harness's own fork server does for its children (harness/accept/isolation.py).

A test that runs a script in a fresh interpreter (a repro script that must stand alone, a check of what
an import pulls in, kernels under an interpreter switched on by an environment variable) spends 2-4 s
of a 2-core machine importing torch in it; the script itself often takes a fraction of that. Here the
child starts with torch already imported and otherwise as ``python -c`` would: ``sys.argv`` is
``["-c", *ARGS]``, ``sys.path[0]`` the working directory, a fresh ``__main__``, the given working
directory and environment (read by Triton, say, when the script imports it), stdin from /dev/null,
stdout and stderr captured, the exit status of ``SystemExit`` / an uncaught exception / a signal.

What a forked child cannot honour is refused (a ValueError, so a test is not silently run
differently): another interpreter than this one, anything but ``-c``, another value of a variable
that acts before ``-c`` runs (``PYTHONPATH`` and the other ``PYTHON*`` start-up variables, the thread
counts torch reads on import) than the server started with. A test that needs a process of its own
(its peak memory, its process group, ``python -m harness``) keeps using :mod:`subprocess`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

_SERVER = r"""
import atexit, json, os, sys, traceback, types

import torch  # noqa: F401  what the children would all import; nothing of the project

REQ, RESP = int(sys.argv[1]), int(sys.argv[2])


def _exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def child(req):
    os.close(REQ)
    os.close(RESP)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    import importlib

    importlib.invalidate_caches()  # sys.path[0] is '' (the working directory), which just changed
    sys.argv = ["-c", *req["args"]]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    try:
        exec(compile(req["code"], "<string>", "exec"), main.__dict__)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


requests = os.fdopen(REQ, "r")
replies = os.fdopen(RESP, "w")
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(req)
        finally:
            os._exit(70)
    replies.write(json.dumps({"pid": pid}) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
    replies.flush()
"""

#: Variables read before ``-c`` runs, by Python's start-up or by torch's import (its thread pools): a
#: child cannot be given other values than the server started with.
_STARTUP_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE",
                 "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE", "PYTHONUTF8", "PYTHONIOENCODING",
                 "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONNODEBUGRANGES", "PYTHONINSPECT", "PYTHONUNBUFFERED",
                 "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class ForkedPython:
    """``run(args, cwd=, env=, timeout=, check=)``: ``subprocess.run(args, capture_output=True, text=True)``
    for ``args = [sys.executable, "-c", CODE, *ARGS]``, in a child forked from a torch-importing
    server (started on first use; :meth:`close` ends it)."""

    def __init__(self):
        self._proc = None
        self._env: dict[str, str] = {}
        self._scratch = None

    def _start(self) -> None:
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        self._env = dict(os.environ)
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(req_r), str(resp_w)],
                                      pass_fds=(req_r, resp_w), stdin=subprocess.DEVNULL, env=self._env)
        os.close(req_r)
        os.close(resp_w)
        self._requests = os.fdopen(req_w, "w")
        self._replies, self._pending = resp_r, b""  # read unbuffered: select() must see every reply
        self._scratch = tempfile.TemporaryDirectory(prefix="forked-python-")

    def _reply(self, timeout: float | None) -> dict | None:
        """The server's next line, or None when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._replies], [], [], left)[0]:
                    return None
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise RuntimeError(f"the forked-python server died (exit status {self._proc.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, args, *, cwd=None, env=None, timeout: float | None = None,
            check: bool = False) -> subprocess.CompletedProcess:
        args = [str(a) for a in args]
        if args[:2] != [sys.executable, "-c"] or len(args) < 3:
            raise ValueError(f"ForkedPython runs [sys.executable, '-c', CODE, ...] only, not {args[:2]}")
        env = dict(os.environ if env is None else env)
        if self._proc is None:
            self._start()
        differs = [v for v in _STARTUP_VARS if env.get(v) != self._env.get(v)]
        if differs:
            raise ValueError(f"ForkedPython: {', '.join(differs)} act at start-up; run it with subprocess")
        out, err = (os.path.join(self._scratch.name, f"{n}.txt") for n in ("stdout", "stderr"))
        req = {"code": args[2], "args": args[3:], "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
               "stdout": out, "stderr": err}
        self._requests.write(json.dumps(req) + "\n")
        self._requests.flush()
        pid = self._reply(None)["pid"]
        reply = self._reply(timeout)
        timed_out = reply is None
        if timed_out:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended as the time ran out
                pass
            reply = self._reply(None)
        stdout, stderr = (open(p, encoding="utf-8", errors="replace").read() for p in (out, err))
        if timed_out:
            raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
        done = subprocess.CompletedProcess(args, reply["returncode"], stdout, stderr)
        if check:
            done.check_returncode()
        return done

    def close(self) -> None:
        if self._proc is None:
            return
        self._requests.close()  # the server's loop ends
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._replies)
        self._scratch.cleanup()
        self._proc = None
