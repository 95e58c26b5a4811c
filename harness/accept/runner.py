"""The candidate's process: it runs the calls the judge asks for and returns raw tensors, nothing else.

This module is the child side of :mod:`harness.accept`. It is started by
:class:`harness.accept.isolation.Isolator` with a *hello* (the callable's ``MODULE:CALLABLE``, the
family, the device, the log file) and one end of a pipe. It imports the callable, answers with what
the callable declares (capabilities, versions, file hash), then serves requests until told to stop.
Every request names its inputs by a safetensors file the parent wrote and its digest; every answer
names the file of raw output tensors it wrote. The child decides nothing: it holds no oracle, no
tolerance and no verdict. Whatever runs here (the candidate included) may be patched by the
candidate, so the parent trusts only the tensors (judged against its own oracle) and its own clock.

Requests (``op``):

* ``call``: forward (and gradients through autograd with the parent's ``grad_out``) on the inputs,
  with NaN-poisoned memory; returns the outputs, the gradients and the inputs as the candidate left
  them.
* ``burst``: that many back-to-back calls (a timing loop in miniature); returns nothing.
* ``side_stream`` (CUDA): outputs copied on the calling stream right after the call returned, and
  again after a full device sync (the parent compares them).
* ``time``: the timer of :mod:`harness.perf.timing` on seeded inputs, for the candidate or (in a child
  started without a candidate) for named baseline adapters. Its numbers are claims: the parent
  checks the candidate's against its own clock (``loop_setup`` / ``loop_run``).
* ``loop_setup``, ``loop_run``: a prepared workload, then ``n`` back-to-back repetitions ending with
  a device synchronisation, which the parent times from outside.
* ``bye``: exit.

The child's stdout and stderr go to the case's log file; faulthandler dumps every thread's stack
there shortly before the parent's deadline, so a hang's report says where it hung.
"""

from __future__ import annotations

import faulthandler
import os
import platform
import signal
import sys
import time
import traceback
from pathlib import Path

import torch

from harness.accept import exchange
from harness.accept.exchange import case_from_dict, file_sha256
from harness.cases import DecodeInputs, LinearCase, LinearInputs, SoftmaxCase, SoftmaxInputs, apply_layout

#: Loaded input files kept on the device (a case's requests reuse a handful of inputs).
INPUT_CACHE = 4


class UsageError(Exception):
    """The callable does not import or is not a callable: exit 2 in the parent."""


def _file_sha256(path: str | None) -> str | None:
    return file_sha256(Path(path)) if path and os.path.isfile(path) else None


def versions() -> dict:
    import importlib.metadata as md

    def v(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": v("triton"),
        "safetensors": v("safetensors"),
        "numpy": v("numpy"),
        "flash_attn": v("flash-attn") or v("flash_attn"),
        "flash_attn_cute": v("flash-attn-cute") or v("flash_attn_4") or v("flash-attn-4"),
        "platform": platform.platform(),
        "cuda": torch.version.cuda,
        "cudnn": (torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None),
        "triton_interpret": os.environ.get("TRITON_INTERPRET"),
    }


def device_info(device: str) -> dict:
    dev = torch.device(device)
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        return {
            "type": "cuda", "name": p.name, "capability": f"sm{p.major}{p.minor}",
            "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
        }
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}


def _short(e: BaseException) -> str:
    line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {line}"


class Runner:
    """The child's state: the candidate's adapter (None in a baselines-only child), the device and
    the inputs loaded so far."""

    def __init__(self, hello: dict):
        self.family = hello["family"]
        self.device = torch.device(hello["device"])
        self.impl = hello.get("impl")
        self.backend = hello.get("backend")  # a registered adapter instead of a callable (fuzz, shrink)
        self.adapter = None
        self._inputs: dict[str, object] = {}
        self._loop = None

    # -- start -------------------------------------------------------------------------------

    def probe(self) -> dict:
        """Import the callable (when there is one) and say what it declares."""
        info = {"versions": versions(), "device": device_info(str(self.device))}
        if self.backend:
            from harness.adapters import registry

            try:
                self.adapter = registry.get(self.backend)
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
            info["adapter"] = self.adapter.name
            return info
        if not self.impl:
            return info
        from harness.adapters.registry import from_spec
        from harness.adapters.user import capabilities, load_callable

        try:
            fn = load_callable(self.impl)
            caps = capabilities(fn)
            self.adapter = from_spec(self.impl, self.family)
        except ValueError as e:
            raise UsageError(str(e)) from None
        mod = sys.modules.get(self.impl.split(":")[0].strip())
        mod_file = getattr(mod, "__file__", None)
        info.update({
            "adapter": self.adapter.name,
            # a declared function (fp8_backward) travels as True: the parent needs the declaration, not the code
            "capabilities": {k: (list(v) if isinstance(v, (tuple, set, frozenset)) else True if callable(v) else v)
                             for k, v in caps.items()},
            "declared_capabilities": sorted(getattr(fn, "attn_capabilities", None) or {}),
            "module_file": mod_file,
            "module_sha256": _file_sha256(mod_file),
            "module_version": str(getattr(mod, "__version__", "")) or None,
        })
        return info

    # -- inputs ------------------------------------------------------------------------------

    def _load(self, case, ref: dict):
        key = ref["sha256"]
        if key not in self._inputs:
            t = exchange.read_tensors(Path(ref["path"]), key, device=self.device)
            cls = SoftmaxInputs if isinstance(case, SoftmaxCase) else LinearInputs if isinstance(case, LinearCase) \
                else DecodeInputs
            self._inputs[key] = cls(**t)
            while len(self._inputs) > INPUT_CACHE:
                self._inputs.pop(next(iter(self._inputs)))
        return self._inputs[key]

    # -- requests ----------------------------------------------------------------------------

    def _candidate(self):
        if self.adapter is None:
            raise RuntimeError("this child was started without a candidate")
        return self.adapter

    def op_call(self, req: dict) -> dict:
        from harness.adapters.base import Unsupported
        from harness.check import verify as V

        case = case_from_dict(req["case"])
        inputs = self._load(case, req["inputs"])
        try:
            run = V._run_once(self._candidate(), case, inputs, want_grad=bool(req["want_grad"]),
                              poison=bool(req.get("poison", True)))
        except Unsupported as e:
            return {"status": "unsupported", "reason": str(e) or type(e).__name__}
        except V._ContractError as e:
            return {"status": "contract", "reason": str(e)}
        except Exception as e:  # noqa: BLE001 - the candidate raised: reported with its traceback
            return {"status": "error", "reason": f"run raised {_short(e)}", "traceback": traceback.format_exc(limit=-6)}
        tensors = dict(run.tensors)
        if req.get("with_inputs", True):
            tensors.update({f"input.{n}": t for n, t in run.passed_inputs.items()})
        sha = exchange.write_tensors(Path(req["out_path"]), tensors)
        return {
            "status": "ok", "outputs": {"path": req["out_path"], "sha256": sha},
            "devices": {n: t.device.type for n, t in run.tensors.items()},
            "missing_grads": list(run.missing_grads),
        }

    def op_burst(self, req: dict) -> dict:
        from harness.adapters.base import Unsupported
        from harness.check import verify as V

        case = case_from_dict(req["case"])
        inputs = self._load(case, req["inputs"])
        try:
            for _ in range(int(req["calls"])):
                V._run_once(self._candidate(), case, inputs, want_grad=bool(req["want_grad"]), poison=False)
        except Unsupported as e:
            return {"status": "unsupported", "reason": str(e) or type(e).__name__}
        except Exception as e:  # noqa: BLE001
            return {"status": "error", "reason": f"run raised {_short(e)}", "traceback": traceback.format_exc(limit=-6)}
        return {"status": "ok"}

    def op_side_stream(self, req: dict) -> dict:
        from harness.adapters.base import Unsupported

        case = case_from_dict(req["case"])
        inputs = self._load(case, req["inputs"])
        if self.device.type != "cuda":
            raise RuntimeError("side_stream: a CUDA-only probe")
        try:
            early, late = early_and_late(self._candidate(), case, inputs, sleep_cycles=int(req["sleep_cycles"]),
                                         backward=bool(req["want_grad"]))
        except Unsupported as e:
            return {"status": "unsupported", "reason": str(e) or type(e).__name__}
        except Exception as e:  # noqa: BLE001
            return {"status": "error", "reason": f"run raised {_short(e)}", "traceback": traceback.format_exc(limit=-6)}
        tensors = {f"early.{n}": t for n, t in early.items()} | {f"late.{n}": t for n, t in late.items()}
        sha = exchange.write_tensors(Path(req["out_path"]), tensors)
        return {"status": "ok", "outputs": {"path": req["out_path"], "sha256": sha}}

    def op_time(self, req: dict) -> dict:
        """Time the candidate (``backends`` absent) or the named registered adapters."""
        from harness.adapters import registry
        from harness.adapters.base import has_backward
        from harness.perf import timing

        case = case_from_dict(req["case"])
        seed = int(req["seed"])
        if req.get("backends") is None:
            named = [(self._candidate().name, self._candidate(), True)]
        else:
            named = []
            for name in req["backends"]:
                try:
                    named.append((name, registry.get(name), False))
                except KeyError:
                    continue
        rows = []
        for name, adapter, is_cand in named:
            reason = adapter.supports(case, self.device)
            if reason:
                rows.append({"backend": name, "candidate": is_cand, "unsupported": str(reason)})
                continue
            cells = {}
            for mode in req["modes"]:
                if mode != "fwd" and not has_backward(adapter, case):
                    continue
                try:
                    t = timing.time_adapter(adapter, case, mode, seed=seed, device=self.device)
                except Exception as e:  # noqa: BLE001 - a backend that fails is reported, the run goes on
                    cells[mode] = {"error": _short(e)[:300]}
                    continue
                cells[mode] = {
                    "median_ms": t.median_ms, "spread": t.spread, "reps": t.reps, "clock": t.clock,
                    "warmup_calls": t.warmup_calls, "launch_bound": t.launch_bound,
                }
            rows.append({"backend": name, "candidate": is_cand, "modes": cells})
        return {"status": "ok", "rows": rows}

    def op_loop_setup(self, req: dict) -> dict:
        from harness.perf import timing

        case = case_from_dict(req["case"])
        adapter = self._candidate()
        n_sets = timing.rotation_count(case, self.device)
        work = timing.Workload(adapter, case, timing.input_sets(case, int(req["seed"]), self.device, n_sets),
                               req["mode"])
        work.prepare()
        for i in range(max(2, len(work))):  # compiled and cached before the parent's clock starts
            work.call(i % len(work))
        timing.synchronize(self.device)
        if self._loop is not None:
            self._loop.release()
        self._loop = work
        return {"status": "ok"}

    def op_loop_run(self, req: dict) -> dict:
        from harness.perf import timing

        work = self._loop
        if work is None:
            raise RuntimeError("loop_run before loop_setup")
        timing.synchronize(self.device)
        for r in range(int(req["n"])):
            work.call(r % len(work))
        timing.synchronize(self.device)
        return {"status": "ok"}


def early_and_late(adapter, case, inputs, *, sleep_cycles: int, backward: bool):
    """Outputs (and gradients) copied on the calling stream right after the call returned, and the
    same tensors after a full device sync (the side-stream check's two views; the parent compares)."""
    from harness import fp8
    from harness.check import verify as V
    from harness.check.properties import WRITTEN_INPUTS

    dev = inputs.q.device
    originals = V._run_inputs(case, inputs)
    fp8_backward = backward and bool(getattr(case, "fp8", ""))  # FP8: the explicit backward, not autograd
    autograd = backward and not fp8_backward
    leaves = {n: t.detach().clone().requires_grad_(autograd and n in V.GRAD_NAMES) for n, t in originals.items()}
    # a decode call writes its cache: it gets copies, so the inputs this child keeps stay as sent
    passed = apply_layout(case, {n: (t.clone() if t.requires_grad or n in WRITTEN_INPUTS else t)
                                 for n, t in leaves.items()})
    torch.cuda.synchronize(dev)
    with V.poisoned_memory(dev):  # free memory holds NaN: an unfinished output reads as NaN
        stream = torch.cuda.current_stream(dev)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        with torch.set_grad_enabled(autograd):
            output = adapter.run(case, **passed)
        if fp8_backward:  # the FP8 backward's answer as written (its read-back is not the candidate's work)
            extra = {n: getattr(inputs, n).clone() for n in ("grad_out",) + fp8.GRAD_DESCALE_NAMES}
            raw = adapter.run_fp8_backward(case, output, **passed, **extra)
        tensors = V._output_tensors(case, output)
        # Enqueued on the calling stream the moment the call returns: what the caller (or the end
        # event of a timer on this stream) sees.
        early = {n: t.detach().clone() for n, t in tensors.items()}
        if fp8_backward:
            early.update({n: g.detach().clone() for n, g in zip(("dq", "dk", "dv"), raw)})
            tensors.update(zip(("dq", "dk", "dv"), raw))
        elif backward:
            grads = V._gradients(case, inputs, output, leaves)
            early.update({n: g.detach().clone() for n, g in grads.items()})
            tensors.update(grads)
        stream.synchronize()
        early = {n: t.cpu() for n, t in early.items()}
        torch.cuda.synchronize(dev)
        late = {n: t.detach().cpu() for n, t in tensors.items()}
    return early, late


OPS = {
    "call": Runner.op_call, "burst": Runner.op_burst, "side_stream": Runner.op_side_stream,
    "time": Runner.op_time, "loop_setup": Runner.op_loop_setup, "loop_run": Runner.op_loop_run,
}


# --------------------------------------------------------------------------------------------
# Process entry
# --------------------------------------------------------------------------------------------


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _no_core_dumps() -> None:
    # A crashing GPU process would otherwise write a core file of its whole address space.
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass


def _arm_dump(seconds) -> None:
    """Dump every thread's stack into the log shortly before the parent's deadline."""
    faulthandler.cancel_dump_traceback_later()
    if seconds:
        faulthandler.dump_traceback_later(max(float(seconds) - 2.0, 0.5), exit=False)


def _context_lost(device) -> str | None:
    from harness.check.matrix import context_lost

    return context_lost(device)


def child_main(hello_json: str, conn) -> None:
    """Entry point of the child process (multiprocessing target): probe, then serve requests."""
    import json

    hello = json.loads(hello_json)
    # Ctrl-C reaches the whole process group: the parent decides (it kills its children when interrupted). A child
    # that died of it between two requests would otherwise look like a crash before the parent's interrupt.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hello.get("log_path"):
        _redirect_output(hello["log_path"])
    _no_core_dumps()
    if hello.get("threads"):
        torch.set_num_threads(int(hello["threads"]))
    if hello.get("scratch"):
        # Oracle results this process might compute are never looked up again: a scratch cache.
        os.environ["ATTN_HARNESS_CACHE"] = hello["scratch"]
    faulthandler.enable(all_threads=True)
    _arm_dump(hello.get("budget_s"))
    runner = Runner(hello)
    t0 = time.perf_counter()
    try:
        reply = {"ok": True, "result": runner.probe()}
    except UsageError as e:
        reply = {"ok": False, "usage_error": str(e)}
    except BaseException as e:  # noqa: BLE001 - anything the candidate throws on import is reported
        reply = {"ok": False, "error": _short(e), "traceback": traceback.format_exc()}
    reply["seconds"] = round(time.perf_counter() - t0, 3)
    exchange.send(conn, reply)
    if not reply["ok"]:
        return
    while True:
        try:
            req = exchange.receive(conn)
        except EOFError:  # the parent is gone
            return
        op = req.get("op")
        if op == "bye":
            faulthandler.cancel_dump_traceback_later()
            exchange.send(conn, {"ok": True})
            return
        _arm_dump(req.get("budget_s"))
        t0 = time.perf_counter()
        try:
            reply = {"ok": True, "result": OPS[op](runner, req)}
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
            reply = {"ok": False, "error": _short(e), "traceback": traceback.format_exc()}
        reply["seconds"] = round(time.perf_counter() - t0, 3)
        lost = _context_lost(runner.device)
        if lost:  # a sticky CUDA error: every later request here would fail with it; the parent starts a new child
            reply["context_lost"] = lost
        sys.stdout.flush()
        sys.stderr.flush()
        exchange.send(conn, reply)
        if lost or (isinstance(reply.get("error"), str) and reply["error"].startswith("KeyboardInterrupt")):
            return
