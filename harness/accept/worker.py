"""The child side of the acceptance check: one task per process.

:func:`child_main` receives a JSON request, sends the process's stdout / stderr to the request's
log file (so a crash's last words land there), disables core dumps, arms faulthandler (a crash
prints the Python stack; shortly before the parent's timeout the stack is dumped, so a hang says
where it hangs), runs the task and writes a JSON result file. Nothing but JSON crosses back.

Tasks:

* ``probe``: import MODULE:CALLABLE, build its adapter, report capabilities, versions and device.
* ``case``: :func:`harness.verify.verify` for each seed, then the anti-cheat checks.
* ``bench``: the speed section's timing of one benchmark case (:mod:`harness.accept.speed`).

Runnable as ``python -m harness.accept.worker REQUEST.json`` too (debugging one case by hand).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import hashlib
import json
import os
import platform
import sys
import time
import traceback

import torch

from harness import verify as V
from harness.accept import anticheat
from harness.cases import LinearCase, SoftmaxCase

#: Offset of the anti-cheat checks' seeds from the case's first seed: inputs the verification
#: seeds never used, yet reproducible from the one seed the report records.
ANTICHEAT_SEED_OFFSET = 1_000_003


# --------------------------------------------------------------------------------------------
# Cases as JSON
# --------------------------------------------------------------------------------------------


def case_to_dict(case) -> dict:
    d = {f.name: getattr(case, f.name) for f in dataclasses.fields(case) if f.init}
    d["family"] = case.family
    return json.loads(json.dumps(d))  # tuples -> lists


def case_from_dict(d: dict):
    d = dict(d)
    family = d.pop("family")
    if family == "softmax":
        if d.get("varlen") is not None:
            d["varlen"] = tuple(tuple(p) for p in d["varlen"])
        d["window"] = tuple(d.get("window", (-1, -1)))
        return SoftmaxCase(**d)
    if family == "linear":
        return LinearCase(**d)
    raise ValueError(f"case: unknown family {family!r}")


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


class UsageError(Exception):
    """The request cannot run (the callable does not import); exit 2 in the parent."""


def _adapter(req):
    from harness.adapters.registry import from_spec

    return from_spec(req["impl"], req["family"])


def _file_sha256(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def task_probe(req: dict) -> dict:
    from harness.adapters.user import capabilities, load_callable

    try:
        fn = load_callable(req["impl"])
        caps = capabilities(fn)
        adapter = _adapter(req)
    except ValueError as e:
        raise UsageError(str(e)) from None
    mod = sys.modules.get(req["impl"].split(":")[0].strip())
    mod_file = getattr(mod, "__file__", None)
    info = {
        "adapter": adapter.name,
        "differentiable": bool(getattr(adapter, "differentiable", True)),
        "capabilities": caps,
        "declared_capabilities": sorted(getattr(fn, "attn_capabilities", None) or {}),
        "module_file": mod_file,
        "module_sha256": _file_sha256(mod_file),
        "module_version": str(getattr(mod, "__version__", "")) or None,
        "doc": (fn.__doc__ or "").strip().splitlines()[0] if (fn.__doc__ or "").strip() else "",
        "versions": versions(),
        "device": device_info(req["device"]),
    }
    return info


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


def use_scratch_cache(req: dict) -> None:
    """Send the oracle cache of this child to its scratch folder (see isolation.Isolator.run)."""
    if req.get("scratch"):
        os.environ["ATTN_HARNESS_CACHE"] = req["scratch"]


def task_case(req: dict) -> dict:
    """verify() per seed, then the anti-cheat checks. Returns the case's raw results."""
    use_scratch_cache(req)
    case = case_from_dict(req["case"])
    dev = torch.device(req["device"])
    backward = bool(req["backward"])
    adapter = _adapter(req)
    out: dict = {"case": case.id, "seeds": [], "anticheat": [], "unsupported_feature": None}
    if backward and not getattr(adapter, "differentiable", True):
        out["unsupported_feature"] = "backward"
        out["unsupported_reason"] = "declares no backward (attn_capabilities backward=False): gradients cannot be checked"
        backward = False  # the forward is still checked and reported
    for seed in req["seeds"]:
        r = V.verify(adapter, case, seed=seed, device=dev, check_backward=backward)
        out["seeds"].append(r.to_dict())
        if r.status in ("unsupported", "error"):
            break  # the same answer for every seed: do not repeat it
    if any(s["status"] in ("unsupported", "error") for s in out["seeds"]):
        return out
    s0 = req["seeds"][0] + ANTICHEAT_SEED_OFFSET
    prior = any(s["status"] == "fail" for s in out["seeds"])
    checks = [
        ("caching", lambda: anticheat.check_caching(adapter, case, (s0, s0 + 1), dev, prior_failed=prior)),
        ("recheck_after_timing", lambda: anticheat.recheck_after_calls(
            adapter, case, warm_seed=s0 + 2, check_seed=s0 + 3, device=dev, backward=backward,
            calls=req.get("recheck_calls", anticheat.RECHECK_CALLS), prior_failed=prior,
        )),
        ("side_stream", lambda: anticheat.check_side_stream(adapter, case, s0 + 4, dev, backward=backward)),
    ]
    for name, run in checks:
        try:
            res = run()
        except Exception as e:  # noqa: BLE001 - the candidate raised inside a check: that check errors
            line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            out["anticheat"].append({
                "name": name, "status": "fail", "detail": f"the candidate raised {type(e).__name__}: {line}",
                "traceback": traceback.format_exc(limit=-6),
            })
            continue
        if isinstance(res, tuple):
            prop, result = res
            entry = prop.to_dict()
            if result is not None and result.status != "pass":
                entry["result"] = result.to_dict()
        else:
            entry = res.to_dict()
        entry["seed_base"] = s0
        out["anticheat"].append(entry)
    return out


def task_bench(req: dict) -> dict:
    from harness.accept import speed

    return speed.bench_task(req)


TASKS = {"probe": task_probe, "case": task_case, "bench": task_bench}


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


def child_main(request_json: str) -> None:
    """Entry point of the child process (multiprocessing target)."""
    req = json.loads(request_json)
    if req.get("log_path"):
        _redirect_output(req["log_path"])
    _no_core_dumps()
    if req.get("threads"):
        torch.set_num_threads(int(req["threads"]))
    faulthandler.enable(all_threads=True)
    timeout = req.get("timeout")
    if timeout:
        # Dump every thread's stack into the log just before the parent kills us: a hang's report
        # then says where it hung.
        faulthandler.dump_traceback_later(max(float(timeout) - 2.0, 0.5), exit=False)
    t0 = time.perf_counter()
    try:
        payload = {"ok": True, "result": TASKS[req["task"]](req)}
    except UsageError as e:
        payload = {"ok": False, "usage_error": str(e)}
    except BaseException as e:  # noqa: BLE001 - anything the candidate throws is reported
        line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        payload = {"ok": False, "error": f"{type(e).__name__}: {line}", "traceback": traceback.format_exc()}
    payload["seconds"] = round(time.perf_counter() - t0, 3)
    faulthandler.cancel_dump_traceback_later()
    path = req["result_path"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        child_main(fh.read())
