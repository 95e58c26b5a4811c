"""Roofline sanity: the device's measured ceilings, and the rules that flag a result as implausible.

Ceilings are *measured* once per device (name) and cached as JSON in the harness cache directory
(``$ATTN_HARNESS_CACHE/roofline/``): the dense matmul rate per dtype (``torch.matmul`` of two
square matrices) and the copy bandwidth (a large device-to-device copy, bytes read + written),
each from the *fastest* timed repetition: a ceiling must bound every later result, and on a busy
host the median understates it. Datasheet numbers are leads, not ceilings.

A timed result is flagged ``implausible: check the measurement`` when

1. its FLOP rate exceeds :data:`PEAK_MARGIN` x the dense matmul rate of its dtype (an attention
   kernel is made of matmuls plus softmax work: it cannot beat a plain matmul), or
2. its minimum traffic (``harness.perf.flops.min_bytes``) over its time exceeds :data:`PEAK_MARGIN` x
   the copy bandwidth, or
3. its backward is faster than :data:`BWD_MIN_FRACTION` x its forward (the backward does 2.5x the
   forward's FLOPs for softmax, 2x for linear attention); on the device's clock only: what it catches
   is a host clock around an asynchronous backward (the launch timed, not the work), which cannot
   happen where every call is synchronous, and on a CPU the host clock of a small case is mostly
   per-operation host work that FLOPs do not bound (an honest eager backward measured at 0.48x to
   0.96x of its forward on a 2-core machine), or
4. its fwd+bwd is faster than :data:`E2E_MIN_FRACTION` x its forward alone.

A flagged result is never printed as a plain number (the reports print :data:`IMPLAUSIBLE` and the
rule that fired).
"""

from __future__ import annotations

import json
import platform
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from harness import fp8
from harness.cases import DTYPES, Case
from harness.files import atomic_write
from harness.perf import flops as flop_model
from harness.perf.timing import CLOCK_DEVICE, CLOCK_HOST, TimerOptions, clock_of, time_callable

IMPLAUSIBLE = "implausible: check the measurement"

#: A result may exceed a measured ceiling by this much before it is flagged: the ceiling is a
#: median measured at another moment (boost clocks, temperature, run-to-run spread of a few %).
PEAK_MARGIN = 1.10
#: A backward faster than this fraction of its forward is flagged (it does 2-2.5x the FLOPs;
#: even a memory-bound backward reads more than its forward).
BWD_MIN_FRACTION = 0.5
#: fwd+bwd contains the forward; faster than this fraction of the forward alone is flagged
#: (0.9 leaves room for run-to-run spread between the two measurements).
E2E_MIN_FRACTION = 0.9

#: Calibration sizes: square matmul side, bytes copied. Large enough to fill an H100 (a 8192^3
#: bf16 matmul is ~1.4 ms, the 1 GiB copy ~0.7 ms); small on a CPU so the tests stay fast.
MATMUL_N = {"cuda": 8192, "cpu": 512}
COPY_BYTES = {"cuda": 1 << 30, "cpu": 32 << 20}

SCHEMA_VERSION = 1


@dataclass
class Peaks:
    """Measured ceilings of one device: ``matmul_tflops[dtype]``, ``copy_gbps`` (GB/s = 1e9 B/s)."""

    device: str
    clock: str
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    copy_gbps: float | None = None
    measured_at: str = ""
    method: str = (
        "matmul: torch.matmul of two NxN matrices (fp32 with TF32 allowed: the fastest an fp32 kernel "
        "may go), fastest timed repetition; copy: Tensor.copy_ of a large buffer, bytes read + written"
    )

    def to_dict(self) -> dict:
        return asdict(self)


def device_key(device: torch.device) -> str:
    """What the cache is keyed by: the GPU's name, or the CPU model and thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu {model} x{torch.get_num_threads()} threads"


def _cache_file(key: str) -> Path:
    from harness.check.golden import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")
    return cache_dir() / "roofline" / f"{slug}.json"


def measure_matmul_tflops(device: torch.device, dtype: str) -> float:
    device = torch.device(device)
    n = MATMUL_N[device.type]
    gen = torch.Generator(device="cpu").manual_seed(0)
    if dtype in fp8.FORMATS:  # FP8 tensor cores through torch._scaled_mm (CUDA, sm89+), bf16 out
        if device.type != "cuda":
            raise ValueError(f"{dtype} matmul peak: measured on CUDA only")
        low = fp8.fmt(dtype)[0]
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=low)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=low).t()  # column-major, as cuBLASLt wants
        one = torch.ones((), device=device)
        t = time_callable(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                          device, options=TimerOptions(target_ms=200.0))
        return 2.0 * n**3 / (min(t.times_ms) * 1e-3) / 1e12
    dt = DTYPES[dtype]
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)  # never zeros: see METHOD.md
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dt)
    prev = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        t = time_callable(lambda: torch.matmul(a, b), device, options=TimerOptions(target_ms=200.0 if device.type == "cuda" else 50.0))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return 2.0 * n**3 / (min(t.times_ms) * 1e-3) / 1e12


def measure_copy_gbps(device: torch.device) -> float:
    device = torch.device(device)
    n = COPY_BYTES[device.type] // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = time_callable(lambda: dst.copy_(src), device, options=TimerOptions(target_ms=100.0 if device.type == "cuda" else 30.0))
    return 2.0 * n * 4 / (min(t.times_ms) * 1e-3) / 1e9


def device_peaks(device, dtypes=("bf16",), *, remeasure: bool = False, cache: bool = True) -> Peaks:
    """The measured ceilings of ``device`` for ``dtypes``: from the cache when there, else measured
    now (a few seconds on a GPU) and added to the cache."""
    device = torch.device(device)
    key = device_key(device)
    path = _cache_file(key)
    peaks = None
    if cache and not remeasure and path.exists():
        try:
            d = json.loads(path.read_text())
            if d.get("schema_version") == SCHEMA_VERSION:
                d.pop("schema_version")
                peaks = Peaks(**d)
        except (OSError, ValueError, TypeError):
            peaks = None
    clock = clock_of(device)
    if peaks is None:
        peaks = Peaks(device=key, clock=clock)
    changed = False
    for dt in dtypes:
        if dt not in peaks.matmul_tflops:
            try:
                peaks.matmul_tflops[dt] = measure_matmul_tflops(device, dt)
            except Exception:
                if dt not in fp8.FORMATS:
                    raise
                continue  # no FP8 matmul here (CPU, pre-sm89): FP8 rates are then not checked against a peak
            changed = True
    if peaks.copy_gbps is None:
        peaks.copy_gbps = measure_copy_gbps(device)
        changed = True
    if changed:
        peaks.measured_at = datetime.now(UTC).isoformat(timespec="seconds")
        if cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                text = json.dumps({"schema_version": SCHEMA_VERSION, **peaks.to_dict()}, indent=1)
                atomic_write(path, lambda tmp: Path(tmp).write_text(text))
            except OSError:
                pass  # an unwritable cache only costs a re-measurement next time
    return peaks


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def rate_flags(case: Case, mode: str, ms: float, peaks: Peaks | None) -> list[str]:
    """Rules 1 and 2 for one timed mode: the reasons it is implausible (empty: plausible)."""
    if peaks is None or not ms or ms <= 0:
        return [] if ms and ms > 0 else [f"non-positive time {ms!r} ms"]
    out = []
    tflops = flop_model.flops(case, mode) / (ms * 1e-3) / 1e12
    kind = getattr(case, "fp8", "") or case.dtype  # FP8 cases: the FP8 tensor-core peak
    peak = peaks.matmul_tflops.get(kind)
    if peak and tflops > PEAK_MARGIN * peak:
        out.append(
            f"{tflops:.3g} TFLOP/s is above the measured dense {kind} matmul peak of this device "
            f"({peak:.3g} TFLOP/s, margin {PEAK_MARGIN:g}x)"
        )
    gbps = flop_model.min_bytes(case, mode) / (ms * 1e-3) / 1e9
    if peaks.copy_gbps and gbps > PEAK_MARGIN * peaks.copy_gbps:
        out.append(
            f"moves at least {gbps:.3g} GB/s, above the measured copy bandwidth "
            f"({peaks.copy_gbps:.3g} GB/s, margin {PEAK_MARGIN:g}x)"
        )
    return out


def consistency_flags(ms_by_mode: dict[str, float | None], clock: str = CLOCK_DEVICE) -> dict[str, list[str]]:
    """Rules 3 and 4 across the modes of one (case, backend): mode -> reasons. ``clock``: the times'
    clock (:data:`~harness.perf.timing.CLOCK_DEVICE` or :data:`~harness.perf.timing.CLOCK_HOST`; rule 3 on
    the device's only)."""
    out: dict[str, list[str]] = {}
    fwd, bwd, e2e = (ms_by_mode.get(m) for m in ("fwd", "bwd", "fwd+bwd"))
    if clock != CLOCK_HOST and fwd and bwd and bwd < BWD_MIN_FRACTION * fwd:
        out.setdefault("bwd", []).append(
            f"backward {bwd:.4g} ms is faster than {BWD_MIN_FRACTION:g}x its forward ({fwd:.4g} ms), "
            "though it does 2-2.5x the forward's FLOPs: one of the two is mis-measured"
        )
    if fwd and e2e and e2e < E2E_MIN_FRACTION * fwd:
        out.setdefault("fwd+bwd", []).append(
            f"fwd+bwd {e2e:.4g} ms is faster than {E2E_MIN_FRACTION:g}x its forward alone ({fwd:.4g} ms)"
        )
    return out


def check(case: Case, ms_by_mode: dict[str, float | None], peaks: Peaks | None,
          clock: str = CLOCK_DEVICE) -> dict[str, list[str]]:
    """Every rule for one (case, backend): mode -> reasons (only modes with at least one). ``clock``: the
    times' clock (see :func:`consistency_flags`)."""
    flags = consistency_flags(ms_by_mode, clock)
    for mode, ms in ms_by_mode.items():
        if ms is None:
            continue
        reasons = rate_flags(case, mode, ms, peaks)
        if reasons:
            flags.setdefault(mode, [])[:0] = reasons
    return flags
