"""The benchmark runner behind ``python -m harness bench`` (:mod:`harness.commands.bench`):
correctness first, then honest timings, memory and reports.

For every (case, backend), case-major (:class:`Bench`):

1. ``adapter.supports`` -> an "unsupported: <reason>" cell when it says no;
2. ``harness.check.verify.verify`` against the FP64 oracle (on a reduced copy of the case when the
   full one would not fit the eager reference's score matrices, see :func:`verification_case`):
   a backend that fails is *not timed* and the cell says why; one that raises ``Unsupported``
   (e.g. FlexAttention hitting dynamo's recompile limit) is an "unsupported" cell, never timed;
3. each mode (fwd, bwd, fwd+bwd) timed by :mod:`harness.perf.timing` (CUDA events; host clock on a CPU,
   labelled so), an out-of-memory / Triton out-of-resources becoming an "OOM: <reason>" cell;
4. memory from the allocator's statistics (:mod:`harness.perf.memory`);
5. roofline sanity (:mod:`harness.perf.roofline`): flagged cells read "implausible: check the
   measurement";
6. speedup against the baseline backend, then JSON, markdown and PNG reports in ``--out``.

"""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import platform
import re
import statistics
import subprocess
import traceback
from datetime import UTC, datetime
from pathlib import Path

import torch

from harness.adapters.base import fp8_backward_reason
from harness.cases import Case, SoftmaxCase, make_inputs
from harness.perf import flops as flop_model
from harness.perf import roofline
from harness.perf.reports.schema import SCHEMA, SCHEMA_VERSION
from harness.perf.timing import (
    MODES,
    TimerOptions,
    Timing,
    clock_of,
    time_adapter,
)
from harness.provenance import source_digest

#: Backends a plain ``bench`` runs, per device type (those that cannot run here say why in the report).
DEFAULT_BACKENDS = {
    "cuda": ("eager", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex", "flash_attn_cute", "triton_fa", "triton_fa_fp8",
             "eager_linear", "fla_chunk", "fla_fused_chunk", "triton_la_chunk",
             "decode_sdpa", "flash_attn_cute_decode", "flex_decode", "triton_decode"),
    "cpu": ("eager", "sdpa_math", "eager_linear", "decode_sdpa"),
}
#: Speedups are against the first of these that belongs to the case's family.
DEFAULT_BASELINE = {"cuda": "sdpa_flash,fla_chunk,flash_attn_cute_decode",
                    "cpu": "sdpa_math,eager_linear,decode_sdpa"}
#: Verify on a reduced copy of a softmax case when one (batch, head) score matrix times
#: batch x heads exceeds this: the eager reference in the case's dtype materialises fp32 scores,
#: probabilities and their gradients (~6 such matrices), and the oracle's work grows with them.
VERIFY_MAX_SCORE_BYTES = 1 << 30
#: Reasons are cut to this many characters in table cells (the JSON keeps them whole).
CELL_REASON_CHARS = 160

_OOM_WORDS = re.compile(r"out of memory|OutOfMemoryError|OutOfResources|out of resource", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def first_line(text: str) -> str:
    for line in str(text).strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def oom_reason(e: BaseException) -> str | None:
    """The reason when ``e`` is a CUDA out-of-memory or a Triton out-of-resources (also when wrapped,
    e.g. by torch.compile's ``BackendCompilerFailed``), else None."""
    if isinstance(e, torch.cuda.OutOfMemoryError) or type(e).__name__ in ("OutOfMemoryError", "OutOfResources"):
        return f"{type(e).__name__}: {first_line(e)}"
    text = str(e)
    if _OOM_WORDS.search(text):
        line = next((ln.strip() for ln in text.splitlines() if _OOM_WORDS.search(ln)), first_line(text))
        return f"{type(e).__name__}: {line}"
    return None


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def verification_case(case: Case) -> Case:
    """The case verify runs on: ``case`` itself, or (softmax cases whose fp32 score matrices would
    exceed :data:`VERIFY_MAX_SCORE_BYTES`) a copy with batch 1 and the fewest heads that keep the
    GQA group (heads_k 1, heads_q = heads_q / heads_k). The kernels run the same code per head."""
    if not isinstance(case, SoftmaxCase) or case.is_varlen:
        return case
    score_bytes = 4 * case.batch * case.heads_q * case.seqlen_q * case.seqlen_k
    if score_bytes <= VERIFY_MAX_SCORE_BYTES:
        return case
    group = case.heads_q // case.heads_k
    return dataclasses.replace(case, batch=1, heads_q=group, heads_k=1)


def case_params(case: Case) -> dict:
    d = {f.name: getattr(case, f.name) for f in dataclasses.fields(case)}
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


def _pkg_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def nvidia_smi_clocks(index: int) -> dict:
    """Current and maximum clocks, power, temperature and the active clock-event (throttle) reasons, nvidia-smi's
    hex mask (read-only nvidia-smi queries; {} without nvidia-smi). Also what benchmarks/clock_drift.py prints."""
    fields = ["clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem", "power.draw", "temperature.gpu"]
    vals = _nvidia_smi(index, fields)
    if vals is None:
        return {}
    names = ["sm_mhz", "mem_mhz", "max_sm_mhz", "max_mem_mhz", "power_w", "temperature_c"]
    out = {"source": "nvidia-smi", **dict(zip(names, vals))}
    # the reasons' field took its newer name in later drivers; a driver that knows neither leaves it out
    reasons = _nvidia_smi(index, ["clocks_event_reasons.active"]) or _nvidia_smi(index, ["clocks_throttle_reasons.active"])
    if reasons:
        out["clock_event_reasons"] = reasons[0]
    return out


def _nvidia_smi(index: int, fields: list[str]) -> list[str] | None:
    """One read-only ``nvidia-smi --query-gpu`` of GPU ``index``: the fields' values, or None where it failed."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return [v.strip() for v in out.split(",")] if out else None


def environment(device: torch.device) -> dict:
    """Device, clocks and versions recorded with every report."""
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _pkg_version("triton"),
        "harness": _pkg_version("attn-harness"),
        "pytest-benchmark": _pkg_version("pytest-benchmark"),
        "flash-attn-4": _pkg_version("flash-attn-4") or _pkg_version("flash_attn_4"),
        "flash-attn": _pkg_version("flash-attn") or _pkg_version("flash_attn"),
        "fla-core": _pkg_version("fla-core"),
    }
    try:
        import harness

        versions["harness"] = versions["harness"] or harness.__version__
    except ImportError:
        pass
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        versions["git"] = commit + ("+dirty" if dirty else "") if commit else None
    except (OSError, subprocess.SubprocessError):
        versions["git"] = None
    # the code itself, for when .git is stale (a copied working tree): python -m harness.provenance --find
    versions["source"] = source_digest()
    dev: dict = {"type": device.type, "host": platform.node(), "platform": platform.platform()}
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        from harness.perf.timing import l2_bytes

        dev.update(
            name=p.name, index=idx, capability=f"sm{p.major}{p.minor}", sm_count=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1), l2_bytes=l2_bytes(torch.device("cuda", idx)),
        )
        clocks = nvidia_smi_clocks(idx)
        if not clocks:
            try:
                clocks = {"source": "torch.cuda.clock_rate", "sm_mhz": torch.cuda.clock_rate(idx)}
            except Exception as e:  # needs pynvml; the report says what is missing
                clocks = {"source": None, "error": f"no nvidia-smi and {type(e).__name__}: {first_line(e)}"}
        dev["clocks"] = clocks
    else:
        dev.update(name=roofline.device_key(device), threads=torch.get_num_threads(), clocks=None)
    return {"device": dev, "versions": versions}


# --------------------------------------------------------------------------------------------
# The runner (also used by the pytest benchmarks in tests/bench/)
# --------------------------------------------------------------------------------------------


def _cell(status: str, reason: str = "", **more) -> dict:
    # adapters word their refusals "unsupported: <why>"; the cell keeps <why> (reports add the word)
    if status == "unsupported":
        reason = reason.removeprefix("unsupported: ")
    return {"status": status, "reason": reason, **more}


class Bench:
    """State of one benchmark run: device, options, measured ceilings, cached oracles and inputs.

    ``check(adapter, case)`` -> the verification record (cached per (backend, case));
    ``time_mode(adapter, case, mode)`` -> (cell dict, Timing or None);
    ``run(adapter, case, modes)`` -> the full result record of one (case, backend).
    """

    def __init__(self, device, *, seed: int = 0, options: TimerOptions | None = None, peaks=None,
                 memory: bool = True):
        self.device = torch.device(device)
        self.seed = seed
        self.options = options or TimerOptions()
        self.peaks = peaks
        self.memory = memory
        self._baselines: dict[str, object] = {}
        self._inputs: dict[str, object] = {}
        self._checks: dict[tuple[str, str], dict] = {}
        self._fwd_ms: dict[tuple[str, str], float] = {}

    # ---- cached per case
    def baseline(self, vcase: Case):
        from harness.check.verify import prepare

        if vcase.id not in self._baselines:
            self._baselines.clear()  # case-major: one case's oracle at a time
            self._baselines[vcase.id] = prepare(vcase, seed=self.seed, device=self.device)
        return self._baselines[vcase.id]

    def inputs(self, case: Case):
        if case.id not in self._inputs:
            self._inputs.clear()
            self._inputs[case.id] = make_inputs(case, self.seed, self.device)
        return self._inputs[case.id]

    # ---- correctness gate
    def check(self, adapter, case: Case) -> dict:
        """{"status": "pass"|"unsupported"|"not-timed"|"oom", "reason", "case", "reduced", ...}."""
        key = (adapter.name, case.id)
        if key in self._checks:
            return self._checks[key]
        rec = self._check(adapter, case)
        self._checks[key] = rec
        return rec

    def _check(self, adapter, case: Case) -> dict:
        from harness.check.verify import verify

        reason = adapter.supports(case, self.device)
        if reason:
            return _cell("unsupported", str(reason), case=case.id, reduced=False)
        vcase = verification_case(case)
        rec = {"case": vcase.id, "reduced": vcase.id != case.id}
        failed = None
        try:
            result = verify(adapter, vcase, baseline=self.baseline(vcase))
        except Exception as e:  # the oracle / reference itself could not run
            why = oom_reason(e)
            failed = _cell("oom", f"during the correctness check: {why}", **rec) if why else _cell(
                "not-timed", f"the correctness check raised {type(e).__name__}: {first_line(e)}", **rec,
                traceback=traceback.format_exc(limit=-6))
        if failed is not None:
            self._baselines.clear()
            _free(self.device)
            return failed
        rec.update(verify_status=result.status, max_budget=result.max_budget, seconds=round(result.seconds, 3))
        out = result.tensor("out")
        if out is not None:  # the report's accuracy table: FP8 cells beside the bf16 ones
            rec.update(out_error=float(out.error), out_ratio=float(out.ratio))
        grads = {t.name: [float(t.error), float(t.ratio)] for t in result.tensors if t.name in ("dq", "dk", "dv")}
        if grads:  # and their gradients, where the check compared them
            rec["grad_errors"] = grads
        if result.status == "pass":
            return _cell("pass", "", **rec)
        if result.status == "unsupported":
            return _cell("unsupported", result.reason, **rec)
        _free(self.device)
        if result.status == "error":
            text = f"{result.reason}\n{result.error_traceback}"
            line = next((ln.strip() for ln in text.splitlines() if _OOM_WORDS.search(ln)), None)
            if line:
                return _cell("oom", f"during the correctness check: {line}", **rec)
        what = "failed correctness" if result.status == "fail" else "errored in the correctness check"
        return _cell("not-timed", f"{what}: {result.reason}", **rec, message=result.message())

    # ---- timing
    def time_mode(self, adapter, case: Case, mode: str) -> tuple[dict, Timing | None]:
        """Time one mode; returns (cell, timing). The cell's status: ok, unsupported, oom, error."""
        from harness.adapters.base import Unsupported

        if mode != "fwd" and not getattr(adapter, "differentiable", True) and not getattr(case, "fp8", ""):
            return _cell("unsupported", "inference-only backend (no backward)"), None
        if mode != "fwd" and getattr(case, "fp8", "") and (why := fp8_backward_reason(adapter, case)):
            return _cell("unsupported", why), None
        failed = None
        try:
            timing = time_adapter(adapter, case, mode, seed=self.seed, device=self.device,
                                  inputs=self.inputs(case), options=self.options)
        except Unsupported as e:
            failed = _cell("unsupported", str(e) or "Unsupported")
        except Exception as e:
            why = oom_reason(e)
            failed = _cell("oom", why) if why else _cell(
                "error", f"{type(e).__name__}: {first_line(e)}", traceback=traceback.format_exc(limit=-6))
        if failed is not None:
            _free(self.device)  # after the except block: the traceback no longer holds the tensors
            return failed, None
        w = flop_model.work(case, mode)
        ms = timing.median_ms
        cell = _cell("ok", **timing.to_dict())
        cell.update(flops=w.flops, bytes=w.bytes, tflops=w.flops / (ms * 1e-3) / 1e12,
                    gbps=w.bytes / (ms * 1e-3) / 1e9, flags=[])
        if mode == "fwd":
            self._fwd_ms[(adapter.name, case.id)] = ms
        return cell, timing

    def fwd_ms(self, adapter, case: Case) -> float | None:
        """The forward median of (adapter, case), timing it now when not yet timed."""
        key = (adapter.name, case.id)
        if key not in self._fwd_ms:
            self.time_mode(adapter, case, "fwd")
        return self._fwd_ms.get(key)

    def flag(self, case: Case, cells: dict[str, dict]) -> None:
        """Apply the roofline rules to the timed cells of one (case, backend), in place."""
        ms = {m: c.get("median_ms") for m, c in cells.items() if c.get("status") == "ok"}
        for mode, reasons in roofline.check(case, ms, self.peaks, clock_of(self.device)).items():
            if mode in cells:
                cells[mode]["flags"] = reasons
                cells[mode]["status"] = "implausible"
                cells[mode]["reason"] = f"{roofline.IMPLAUSIBLE}: " + "; ".join(reasons)

    def new_record(self, adapter, case: Case) -> dict:
        """The JSON record of one (case, backend) before any mode is timed (verification included)."""
        rec = {"case": case.id, "family": case.family, "dtype": case.dtype, "params": case_params(case),
               "backend": adapter.name, "status": "ok", "reason": "", "modes": {}, "memory": None}
        check = self.check(adapter, case)
        rec["verify"] = {k: v for k, v in check.items() if k not in ("traceback", "message")}
        if check["status"] != "pass":
            rec["status"], rec["reason"] = check["status"], check["reason"]
        return rec

    def measure_memory(self, adapter, case: Case) -> dict | None:
        """Allocator statistics of one training step (None on a CPU); an OOM is recorded, not raised."""
        if not self.memory or self.device.type != "cuda":
            return None
        from harness.perf.memory import measure_memory

        try:
            mem = measure_memory(adapter, case, self.inputs(case), self.device)
            return mem.to_dict() if mem else None
        except Exception as e:
            why = oom_reason(e)
            return {"error": f"OOM: {why}" if why else f"{type(e).__name__}: {first_line(e)}"}
        finally:
            _free(self.device)

    @staticmethod
    def settle(rec: dict) -> None:
        """A record whose every timed mode ran out of memory is an OOM row."""
        statuses = {c["status"] for c in rec["modes"].values()}
        if statuses and statuses <= {"oom"}:
            rec["status"], rec["reason"] = "oom", next(iter(rec["modes"].values()))["reason"]

    def add_round(self, rec: dict, adapter, case: Case) -> None:
        """Time every timed mode of ``rec`` (a record :meth:`run` made) once more (``bench --rounds``): the cell
        keeps each round's median in ``round_ms`` (the first its own), a round that fails its reason in
        ``round_errors``; :meth:`close_rounds` then reports the rounds' median. Rounds spread over the whole run
        let each backend see the machine's slow and fast spells alike, where one contiguous window may catch
        only one (docs/perf/fp8-s26/5-clock-drift.md: one kernel's repeats 0.43-0.57 ms at a steady clock)."""
        for mode, cell in rec["modes"].items():
            if cell.get("status") not in ("ok", "implausible") or "median_ms" not in cell:
                continue
            new, _ = self.time_mode(adapter, case, mode)
            rounds = cell.setdefault("round_ms", [cell["median_ms"]])
            if new.get("status") == "ok":
                rounds.append(new["median_ms"])
            else:
                cell.setdefault("round_errors", []).append(new.get("reason") or new.get("status"))

    def close_rounds(self, rec: dict, case: Case) -> None:
        """A cell timed in more than one round reports the median of the rounds' medians (``median_ms``; the
        rates from it), the first round's in ``first_round_ms`` and the rounds' range over their median in
        ``round_spread``; the roofline rules judge the new median."""
        closed = False
        for mode, cell in rec["modes"].items():
            rounds = cell.get("round_ms") or []
            if len(rounds) < 2 or "first_round_ms" in cell:
                continue
            ms = statistics.median(rounds)
            cell.update(first_round_ms=rounds[0], median_ms=ms, round_spread=(max(rounds) - min(rounds)) / ms,
                        tflops=cell["flops"] / (ms * 1e-3) / 1e12, gbps=cell["bytes"] / (ms * 1e-3) / 1e9)
            if cell["status"] == "implausible":  # judged again below, on the rounds' median
                cell.update(status="ok", reason="", flags=[])
            if mode == "fwd":
                self._fwd_ms[(rec["backend"], case.id)] = ms
            closed = True
        if closed:
            self.flag(case, rec["modes"])

    def run(self, adapter, case: Case, modes=MODES) -> dict:
        """Everything about one (case, backend): the JSON record."""
        rec = self.new_record(adapter, case)
        if rec["status"] != "ok":
            return rec
        for mode in modes:
            cell, _ = self.time_mode(adapter, case, mode)
            rec["modes"][mode] = cell
        self.flag(case, rec["modes"])
        rec["memory"] = self.measure_memory(adapter, case)
        self.settle(rec)
        return rec


def add_speedups(results: list[dict], baselines: list[str]) -> None:
    """``speedup`` = baseline median / this median, per case and mode, both timed and plausible;
    None, with ``speedup_launch_bound`` set, when either number is mostly launch latency."""
    by_case: dict[str, dict[str, dict]] = {}
    for r in results:
        by_case.setdefault(r["case"], {})[r["backend"]] = r
    for recs in by_case.values():
        base = next((recs[b] for b in baselines if b in recs), None)
        for r in recs.values():
            r["baseline"] = base["backend"] if base else None
            for mode, cell in r["modes"].items():
                ref = base["modes"].get(mode) if base else None
                ok = cell.get("status") == "ok" and ref is not None and ref.get("status") == "ok"
                bound = ok and bool(cell.get("launch_bound") or ref.get("launch_bound"))
                cell["speedup"] = ref["median_ms"] / cell["median_ms"] if ok and not bound else None
                cell["speedup_launch_bound"] = bound


def report_data(results: list[dict], device: torch.device, settings: dict, peaks, command: str,
                seconds: float) -> dict:
    """The benchmark JSON (outline in :mod:`harness.perf.reports.schema`)."""
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "seconds": round(seconds, 1),
        **environment(device),
        "settings": settings,
        "peaks": peaks.to_dict() if peaks else None,
        "results": results,
    }


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def merge(paths: list[str]) -> dict:
    """One benchmark JSON from several (same device expected): results concatenated (a later file's
    (case, backend) replaces an earlier one), settings and commands kept per part."""
    import json

    from harness.perf.reports.schema import check_schema

    parts = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        check_schema(data, str(path))
        parts.append(data)
    devices = {p.get("device", {}).get("name") for p in parts}
    if len(devices) > 1:
        raise ValueError(f"--merge: the files come from different devices: {sorted(map(str, devices))}")
    merged = dict(parts[0])
    results: dict[tuple[str, str], dict] = {}
    for p in parts:
        for r in p["results"]:
            results[(r["case"], r["backend"])] = r
    settings = dict(parts[0].get("settings", {}))
    settings["presets"] = sorted({x for p in parts for x in (p.get("settings", {}).get("presets") or [])})
    settings["case_ids"] = list(dict.fromkeys(x for p in parts for x in (p.get("settings", {}).get("case_ids") or [])))
    settings["backends"] = list(dict.fromkeys(b for p in parts for b in p.get("settings", {}).get("backends", [])))
    settings["parts"] = [{"command": p.get("command"), "created": p.get("created"), "settings": p.get("settings")}
                         for p in parts]
    settings.pop("partial", None)
    merged.update(
        results=list(results.values()), settings=settings, seconds=round(sum(p.get("seconds", 0) for p in parts), 1),
        command=" && ".join(str(p.get("command")) for p in parts),
    )
    add_speedups(merged["results"], settings.get("baseline") or [])
    return merged


