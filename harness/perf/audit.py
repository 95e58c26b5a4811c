"""Auditing published benchmark claims: consistency, physics, and (on the GPU named) measurement.

Each claim (:mod:`harness.perf.claims`) gets findings from three kinds of rule; its verdict is the
worst of them (order of :data:`SEVERITY`):

1. **Consistency** (no GPU needed): the claims of one configuration against the exact FLOP model
   (:mod:`harness.perf.flops`) and each other: ms against TFLOP/s, iter/s and tokens/s; fwd+bwd
   against fwd + bwd; a speedup against the ratio of the times shown; a backward faster than half
   its own forward (implausible: it does 2x (linear) to 2.5x (softmax) the forward's work); memory
   below the size of the tensors that memory must hold (impossible). Every comparison allows the
   tolerance (default 10%) plus the rounding of the printed numbers (half a unit of their last digit).
2. **Physics**: against the named GPU's datasheet (:mod:`harness.perf.gpus`): a rate above the
   chip's fastest tensor mode for the dtype, traffic above its memory bandwidth, memory above its
   capacity, or an out-of-memory claimed for a fused kernel whose tensors fit, is impossible; a rate
   above 85% of the fp32-accumulate peak (what a correct attention kernel can use), or traffic above
   85% of the bandwidth, is implausible. A configuration without the head count gives lower bounds
   (one head), which can only prove impossibility.
3. **Measurement** (``measure=``, on a GPU): where the claim's GPU is the one present (same table
   entry, or ``as_gpu``), each configuration the harness can run is measured with the backends the
   published names map to (:data:`BACKENDS`, one place) through :class:`harness.perf.bench.Bench`
   (correctness first, then device time): reproduced (within the tolerance), faster here,
   contradicted (slower by more than the tolerance), or not runnable (with the reason). On another
   GPU the claims get ordering and scaling checks instead (informational): does the published order
   of backends hold here, and does each backend's time grow from one seqlen to the next (at a fixed
   batch, or at fixed batch x seqlen) as published.

:func:`audit` returns the report as a dict (the JSON); :func:`markdown` renders it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from harness.perf import flops as flop_model
from harness.perf import gpus
from harness.perf.claims import Claim

#: Verdicts, worst first. A claim's verdict is the worst of its findings.
SEVERITY = ("impossible", "contradicted", "inconsistent", "implausible", "faster here", "reproduced", "consistent",
            "not runnable", "not checkable")
#: Verdicts that make the audit fail (exit 1).
FAILING = ("impossible", "contradicted")
#: Findings that only inform (they never decide a verdict).
INFO = ("ordering holds", "ordering differs", "scaling holds", "scaling differs", "plausible")
DEFAULT_TOLERANCE = 0.10
#: Bytes in one "MB" of a claim, read generously: a floor check reads the claim as MiB (the larger).
MB_BYTES_MAX = 2**20


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-.()]+", "", name.lower())


#: Published backend names -> (adapters that implement it here, in order of preference, and
#: whether it is fused (O(N) memory: an OOM can only be its tensors) or materialises the scores).
#: The one place a table's wording meets the registry; an unknown name is "not runnable".
BACKENDS: dict[str, tuple[tuple[str, ...], str]] = {
    "standardattention": (("eager",), "materialised"),
    "eager": (("eager",), "materialised"),
    "naive": (("eager",), "materialised"),
    "flashattention2": (("flash_attn", "sdpa_flash"), "fused"),
    "flashattn2": (("flash_attn", "sdpa_flash"), "fused"),
    "fa2": (("flash_attn", "sdpa_flash"), "fused"),
    "cudnn": (("sdpa_cudnn",), "fused"),
    "flashattention3": (("flash_attn3", "flash_attn_cute"), "fused"),
    "fa3": (("flash_attn3", "flash_attn_cute"), "fused"),
    "flashattention4": (("flash_attn_cute",), "fused"),
    "pytorchsdpa": (("sdpa",), "fused"),
    "sdpa": (("sdpa",), "fused"),
    "pytorchmath": (("sdpa_math",), "materialised"),
    "fla": (("fla_chunk", "fla_fused_chunk"), "fused"),
    "flachunk": (("fla_chunk",), "fused"),
    "tritonfa2": ((), "fused"),  # a report's own Triton kernel: not this project's
    "la3original": ((), "fused"),
    "la3chunked": ((), "fused"),
}


def backend_info(name: str) -> tuple[tuple[str, ...], str]:
    """(adapter names, "fused" | "materialised" | "unknown") of a published backend name."""
    return BACKENDS.get(_norm(name), ((), "unknown"))


@dataclass
class Finding:
    kind: str  # a SEVERITY verdict or an INFO word
    rule: str
    text: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "rule": self.rule, "text": self.text}


# --------------------------------------------------------------------------------------------
# The model of a claim's problem
# --------------------------------------------------------------------------------------------


def case_of(c: Claim, *, heads: int | None = None):
    """The harness case of a claim (fp8: modelled as fp16 for FLOPs; bytes are halved separately).
    ``heads`` overrides an unpublished head count (1 gives lower bounds)."""
    from harness.cases import LinearCase, SoftmaxCase

    hq = c.heads_q if c.heads_q is not None else (heads or 1)
    hk = c.heads_k if c.heads_k is not None else hq
    dtype = "fp16" if c.dtype == "fp8" else c.dtype
    if c.family == "linear":
        return LinearCase(c.batch, hq, c.seqlen_q, c.head_dim, c.head_dim_v, gate="none", initial_state=False,
                          grad_final_state=False, dtype=dtype)
    return SoftmaxCase(c.batch, hq, hk, c.seqlen_q, c.seqlen_k, c.head_dim, d_v=c.head_dim_v, causal=c.causal,
                       dtype=dtype)


def _flops(c: Claim, mode: str | None = None) -> float:
    return flop_model.flops(case_of(c), mode or c.mode)


def _bytes(c: Claim, mode: str | None = None) -> float:
    b = flop_model.min_bytes(case_of(c), mode or c.mode)
    return b / 2 if c.dtype == "fp8" else b


def _itemsize(c: Claim) -> int:
    return {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4}[c.dtype]


def tensor_bytes(c: Claim) -> dict[str, float]:
    """Bytes of the call's tensors: inputs (q, k, v), output, its gradient (dout) and the
    input gradients, for the head count published (or one head)."""
    e = _itemsize(c)
    hq = c.heads_q or 1
    hk = c.heads_k or hq
    q = c.batch * c.seqlen_q * hq * c.head_dim * e
    k = c.batch * c.seqlen_k * hk * c.head_dim * e
    v = c.batch * c.seqlen_k * hk * c.head_dim_v * e
    o = c.batch * c.seqlen_q * hq * c.head_dim_v * e
    return {"inputs": q + k + v, "out": o, "dout": o, "grads": q + k + v}


def _seconds(c: Claim, value: float | None = None) -> float | None:
    """The time of one call in seconds that a claim states or implies (ms, iter/s, tokens/s)."""
    v = c.value if value is None else value
    if v is None or v <= 0:
        return None
    if c.metric == "ms":
        return v * 1e-3
    if c.metric == "iter/s":
        return 1.0 / v
    if c.metric == "tokens/s":
        return c.batch * c.seqlen_q / v
    return None


def _within(claimed: float, expected: float, tol: float, rel_rounding: float) -> bool:
    if expected == 0:
        return claimed == 0
    return abs(claimed / expected - 1.0) <= tol + rel_rounding


def _rel(c: Claim) -> float:
    return c.resolution / c.value if c.value else 0.0


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def consistency(claims: list[Claim], tol: float) -> dict[int, list[Finding]]:
    """Findings per claim index from the consistency rules (see the module docstring)."""
    out: dict[int, list[Finding]] = defaultdict(list)
    by_key: dict[tuple, dict[tuple, int]] = defaultdict(dict)
    for i, c in enumerate(claims):
        by_key[c.key][(c.mode, c.metric, c.memory, c.baseline)] = i
    ms_of = {(c.key, c.mode): i for i, c in enumerate(claims) if c.metric == "ms" and not c.oom}

    for rows in by_key.values():
        for (mode, metric, _mem, _base), i in rows.items():
            c = claims[i]
            if c.oom or c.value is None:
                continue
            j = rows.get((mode, "ms", "", ""))
            if metric in ("TFLOP/s", "iter/s", "tokens/s") and j is not None:
                t = claims[j]
                if metric == "TFLOP/s":
                    if c.heads_q is None:
                        out[i].append(Finding("not checkable", "ms vs TFLOP/s", "the head count is not published"))
                        continue
                    expected = _flops(c) / (t.value * 1e-3) / 1e12
                else:
                    expected = 1.0 / _seconds(t) if metric == "iter/s" else c.batch * c.seqlen_q / _seconds(t)
                ok = _within(c.value, expected, tol, _rel(c) + _rel(t))
                text = f"{metric} {c.value:g} against {expected:.4g} from {t.value:g} ms ({t.where})"
                for k in (i, j):
                    out[k].append(Finding("consistent" if ok else "inconsistent", f"ms vs {metric}", text))
        # fwd + bwd against fwd+bwd, in ms
        f, b, fb = (rows.get((m, "ms", "", "")) for m in ("fwd", "bwd", "fwd+bwd"))
        if None not in (f, b, fb):
            tf, tb, tt = claims[f], claims[b], claims[fb]
            if not (tf.oom or tb.oom or tt.oom):
                total = tf.value + tb.value
                slack = (tf.resolution + tb.resolution + tt.resolution) / tt.value if tt.value else 0.0
                ok = _within(tt.value, total, tol, slack)
                text = (f"fwd+bwd {tt.value:g} ms against fwd {tf.value:g} + bwd {tb.value:g} = {total:.4g} ms "
                        f"({(tt.value / total - 1) * 100:+.0f}%)")
                for k in (f, b, fb):
                    out[k].append(Finding("consistent" if ok else "inconsistent", "fwd+bwd vs fwd + bwd", text))
        # a backward faster than half its forward
        if f is not None and b is not None and not (claims[f].oom or claims[b].oom):
            tf, tb = claims[f], claims[b]
            if tb.value < 0.5 * tf.value:
                text = (f"backward {tb.value:g} ms is faster than half its forward ({tf.value:g} ms): it does "
                        f"{'2.5' if tf.family == 'softmax' else '2'}x the forward's matrix work")
                out[b].append(Finding("implausible", "backward vs forward", text))
    # a speedup against the ratio of the times shown
    for i, c in enumerate(claims):
        if c.metric != "speedup" or c.value is None:
            continue
        mine = ms_of.get((c.key, c.mode))
        base_key = (*c.config, c.baseline)
        base = ms_of.get((base_key, c.mode))
        if mine is None or base is None:
            out[i].append(Finding("not checkable", "speedup vs times",
                                  f"no {c.mode} ms of {c.backend} and of {c.baseline} in this configuration"))
            continue
        expected = claims[base].value / claims[mine].value
        slack = _rel(c) + _rel(claims[base]) + _rel(claims[mine])
        ok = _within(c.value, expected, tol, slack)
        text = (f"speedup {c.value:g}x against {claims[base].value:g} / {claims[mine].value:g} ms = {expected:.3g}x "
                f"({claims[base].where}, {claims[mine].where})")
        out[i].append(Finding("consistent" if ok else "inconsistent", "speedup vs times", text))
    # memory below the tensors it must hold
    for i, c in enumerate(claims):
        if c.metric != "MB" or c.value is None:
            continue
        t = tensor_bytes(c)
        training = c.mode != "fwd"
        floors = {
            "peak": (t["inputs"] + t["out"] + ((t["dout"] + t["grads"]) if training else 0.0),
                     "q, k, v and out" + (", dout, dq, dk and dv" if training else "")),
            "fwd": (t["out"], "the output"),
            "bwd": (t["grads"], "the input gradients dq, dk, dv"),
            "activation": (0.0, ""),
        }
        floor, what = floors[c.memory]
        if not floor:
            continue
        claimed_max = (c.value + c.resolution) * MB_BYTES_MAX
        heads = "" if c.heads_q else " (one head: the head count is not published)"
        if claimed_max < floor:
            out[i].append(Finding("impossible", "memory vs tensors",
                                  f"{c.memory} memory {c.value:g} MB is less than {what} alone: "
                                  f"{floor / 1e6:.1f} MB{heads}"))
        else:
            out[i].append(Finding("consistent", "memory vs tensors",
                                  f"{c.memory} memory {c.value:g} MB holds {what} ({floor / 1e6:.1f} MB{heads})"))
    return out


def physics(claims: list[Claim]) -> dict[int, list[Finding]]:
    """Findings per claim index from the datasheet of the named GPU (see the module docstring)."""
    out: dict[int, list[Finding]] = defaultdict(list)
    for i, c in enumerate(claims):
        gpu = gpus.lookup(c.gpu)
        if gpu is None:
            out[i].append(Finding("not checkable", "physics", f"GPU {c.gpu!r} is not in harness/perf/gpus.py"))
            continue
        bound = c.heads_q is None
        lower = " at least (one head: the head count is not published)" if bound else ""
        if c.oom:
            out[i] += _oom(c, gpu)
            continue
        if c.metric == "MB":
            if c.value * 1e6 > gpu.memory_gb * 1e9:
                out[i].append(Finding("impossible", "memory vs capacity",
                                      f"{c.value:g} MB is more than the {gpu.name}'s {gpu.memory_gb:g} GB"))
            continue
        if c.metric == "speedup":
            continue
        seconds = _seconds(c)
        rate = c.value if c.metric == "TFLOP/s" else (_flops(c) / seconds / 1e12 if seconds else None)
        peak = gpu.peak(c.dtype)
        if rate is not None and peak is not None:
            fp32acc, top = peak
            text = (f"{rate:.4g} TFLOP/s{lower} against the {gpu.name}'s {c.dtype} peak of {fp32acc:g} "
                    f"(fp32 accumulate)" + (f", {top:g} at most" if top != fp32acc else ""))
            if rate > top:
                out[i].append(Finding("impossible", "rate vs peak", text))
            elif rate > gpus.IMPLAUSIBLE_FRACTION * fp32acc:
                out[i].append(Finding("implausible", "rate vs peak",
                                      text + f": above {gpus.IMPLAUSIBLE_FRACTION:.0%} of what a correct kernel can use"))
            else:
                out[i].append(Finding("plausible", "rate vs peak", text))
        elif peak is None:
            out[i].append(Finding("not checkable", "rate vs peak", f"the {gpu.name} has no {c.dtype} tensor mode"))
        if seconds:
            gbps = _bytes(c) / seconds / 1e9
            text = f"moves at least {gbps:.4g} GB/s{lower} against the {gpu.name}'s {gpu.bandwidth_gbps:g} GB/s"
            if gbps > gpu.bandwidth_gbps:
                out[i].append(Finding("impossible", "traffic vs bandwidth", text))
            elif gbps > gpus.IMPLAUSIBLE_FRACTION * gpu.bandwidth_gbps:
                out[i].append(Finding("implausible", "traffic vs bandwidth", text))
    return out


def _oom(c: Claim, gpu: gpus.GPU) -> list[Finding]:
    t = tensor_bytes(c)
    floor = t["inputs"] + t["out"] + ((t["dout"] + t["grads"]) if c.mode != "fwd" else 0.0)
    cap = gpu.memory_gb * 1e9
    _, kind = backend_info(c.backend)
    heads = "" if c.heads_q else " (one head: the head count is not published)"
    if kind == "fused":
        if floor < cap:
            return [Finding("impossible", "OOM vs capacity",
                            f"out of memory claimed for a fused kernel whose tensors take {floor / 1e9:.3g} GB{heads} "
                            f"of the {gpu.name}'s {gpu.memory_gb:g} GB (an on-chip resource limit is not an OOM)")]
        return [Finding("consistent", "OOM vs capacity", f"its tensors alone take {floor / 1e9:.3g} GB")]
    if kind == "materialised":
        scores = c.batch * (c.heads_q or 1) * c.seqlen_q * c.seqlen_k * _itemsize(c) * (2 if c.mode != "fwd" else 1)
        if floor + scores > cap:
            return [Finding("consistent", "OOM vs capacity",
                            f"the score matrices it materialises take {scores / 1e9:.3g} GB{heads}, more than the "
                            f"{gpu.memory_gb:g} GB with its tensors")]
        return [Finding("not checkable", "OOM vs capacity",
                        f"one score matrix per call needs {scores / 1e9:.3g} GB{heads}: whether it runs out depends on "
                        f"how many copies the implementation keeps")]
    return [Finding("not checkable", "OOM vs capacity", f"how {c.backend!r} holds memory is not known (harness/perf/audit.py BACKENDS)")]


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """One backend on one configuration, measured here: per mode the median ms, or why not."""

    adapter: str | None
    ms: dict[str, float]
    why: dict[str, str]  # mode -> reason it has no number (oom, not runnable, ...)
    oom: set


def present_gpu(device) -> str:
    import torch

    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def _same_gpu(claimed: str, here: str) -> bool:
    a, b = gpus.lookup(claimed), gpus.lookup(here)
    if a is not None or b is not None:
        return a is b
    return _norm(claimed) == _norm(here)


def measure(claims: list[Claim], tol: float, *, device, as_gpu: str | None = None, bench=None,
            log=None) -> dict[int, list[Finding]]:
    """Findings per claim index from measuring the claims' configurations here (see the module docstring)."""
    from harness.adapters import registry
    from harness.perf.bench import Bench

    here = as_gpu or present_gpu(device)
    bench = bench or Bench(device)
    out: dict[int, list[Finding]] = defaultdict(list)
    cache: dict[tuple, Measured] = {}

    def run(c: Claim) -> Measured:
        if c.key in cache:
            return cache[c.key]
        names, _ = backend_info(c.backend)
        modes = sorted({x.mode for x in claims if x.key == c.key}, key=("fwd", "bwd", "fwd+bwd").index)
        if c.heads_q is None:
            m = Measured(None, {}, dict.fromkeys(modes, "the head count is not published"), set())
        elif not names:
            m = Measured(None, {}, dict.fromkeys(modes, f"no adapter implements {c.backend!r} here "
                                                         "(harness/perf/audit.py BACKENDS)"), set())
        else:
            case = case_of(c)
            if c.dtype == "fp8":
                m = Measured(None, {}, dict.fromkeys(modes, "fp8 cases are not measured yet"), set())
            else:
                m = _measure_one(bench, registry, names, case, modes)
        if log:
            log(f"audit: measured {c.backend} {case_of(c).id}: "
                + ", ".join(f"{k} {v:.4g} ms" for k, v in m.ms.items()) + "".join(f"; {k}: {v}" for k, v in m.why.items()))
        cache[c.key] = m
        return m

    same = [i for i, c in enumerate(claims) if _same_gpu(c.gpu, here)]
    for i in same:
        c = claims[i]
        if c.metric == "MB":
            out[i].append(Finding("not checkable", "measured", "memory claims: consistency and physics only"))
            continue
        m = run(c)
        out[i].append(_compare(c, m, tol, claims, run))
    other = [i for i in range(len(claims)) if i not in set(same)]
    if other:
        for rule in (_ordering(claims, other, run), _scaling(claims, other, run, tol)):
            for i, f in rule.items():
                out[i] += f
    return out


def _measure_one(bench, registry, names, case, modes) -> Measured:
    reasons = []
    for name in names:
        try:
            adapter = registry.get(name)
        except KeyError:
            reasons.append(f"{name}: not registered")
            continue
        why = adapter.supports(case, bench.device)
        if why:
            reasons.append(f"{name}: {why}")
            continue
        rec = bench.run(adapter, case, list(modes))
        ms, miss, oom = {}, {}, set()
        for mode in modes:
            cell = (rec.get("modes") or {}).get(mode) or {}
            if cell.get("status") == "ok" and cell.get("median_ms"):
                ms[mode] = float(cell["median_ms"])
                continue
            status = cell.get("status") or rec.get("status")
            if status == "oom":
                oom.add(mode)
            miss[mode] = f"{name}: {status}: {cell.get('reason') or rec.get('reason', '')}".rstrip(": ")
        return Measured(name, ms, miss, oom)
    return Measured(None, {}, dict.fromkeys(modes, "; ".join(reasons) or "no adapter"), set())


def _speed(c: Claim, value: float) -> float | None:
    """A claim's value as calls per second (bigger is faster), or None (speedup, MB)."""
    if c.metric == "TFLOP/s":
        if c.heads_q is None or value <= 0:
            return None
        return value * 1e12 / _flops(c)
    s = _seconds(c, value)
    return 1.0 / s if s else None


def _compare(c: Claim, m: Measured, tol: float, claims: list[Claim], run) -> Finding:
    here = m.ms.get(c.mode)
    if c.oom:
        if c.mode in m.oom:
            return Finding("reproduced", "measured", "out of memory here too")
        if here is not None:
            return Finding("contradicted", "measured", f"runs here: {here:.4g} ms ({m.adapter})")
        return Finding("not runnable", "measured", m.why.get(c.mode, "not measured"))
    if here is None:
        return Finding("not runnable", "measured", m.why.get(c.mode, "not measured"))
    if c.metric == "speedup":
        base = next((x for x in claims if x.key == (*c.config, c.baseline)), None)
        if base is None:
            return Finding("not checkable", "measured", f"no claim of the baseline {c.baseline!r} to measure")
        mb = run(base).ms.get(c.mode)
        if mb is None:
            return Finding("not runnable", "measured", f"baseline {c.baseline}: {run(base).why.get(c.mode, '')}")
        got, want = mb / here, c.value
    else:
        want, got = _speed(c, c.value), 1e3 / here
        if want is None:
            return Finding("not checkable", "measured", "the claim's metric gives no time to compare")
    ratio = got / want
    shown = f"{here:.4g} ms here ({m.adapter})"
    if c.metric == "TFLOP/s":
        shown = f"{_flops(c) / (here * 1e-3) / 1e12:.4g} TFLOP/s here ({m.adapter}, {here:.4g} ms)"
    elif c.metric == "speedup":
        shown = f"{got:.3g}x here"
    text = f"{shown} against the claimed {c.value:g} ({ratio:.2f}x the claimed speed)"
    if ratio < 1 - tol:
        return Finding("contradicted", "measured", text)
    if ratio > 1 + tol:
        return Finding("faster here", "measured", text)
    return Finding("reproduced", "measured", text)


def _ordering(claims: list[Claim], idx: list[int], run) -> dict[int, list[Finding]]:
    """On another GPU: does the published order of backends (per configuration and mode) hold here,
    and does each backend's speed move with seqlen the same way?"""
    out: dict[int, list[Finding]] = defaultdict(list)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i in idx:
        c = claims[i]
        if c.metric in ("TFLOP/s", "ms", "iter/s", "tokens/s") and not c.oom:
            groups[(c.config, c.mode, c.metric)].append(i)
    for (_cfg, mode, _metric), members in groups.items():
        if len(members) < 2:
            continue
        speeds = {}
        for i in members:
            c = claims[i]
            here = run(c).ms.get(mode)
            if here is None:
                continue
            speeds[i] = (_speed(c, c.value), 1e3 / here)
        pairs = [(a, b) for a in speeds for b in speeds if a < b and None not in (speeds[a][0], speeds[b][0])]
        for a, b in pairs:
            claimed = speeds[a][0] > speeds[b][0]
            here = speeds[a][1] > speeds[b][1]
            kind = "ordering holds" if claimed == here else "ordering differs"
            ca = claims[a]
            text = (f"{_setting(ca)} {mode} {ca.metric}: published: {ca.backend} {'faster' if claimed else 'slower'} "
                    f"than {claims[b].backend}; here: {'faster' if here else 'slower'}")
            out[a].append(Finding(kind, "ordering", text))
            out[b].append(Finding(kind, "ordering", text))
    return out


def _setting(c: Claim) -> str:
    """Batch and seqlen of a claim, as the other-GPU findings name them."""
    return f"B{c.batch} S{c.seqlen_q}" + ("" if c.seqlen_q == c.seqlen_k else f"x{c.seqlen_k}")


def _scaling(claims: list[Claim], idx: list[int], run, tol: float) -> dict[int, list[Finding]]:
    """On another GPU: does each backend's time grow from one seqlen to the next as published?

    A series is one backend's claims of one metric and mode whose configurations differ only in
    seqlen, at a fixed batch (most tables) or at a fixed batch x seqlen (tables such as the FA3
    chart keep the tokens constant, so batch falls as seqlen grows); a table of several batches
    gives a series per batch. For consecutive seqlens the published growth of the time,
    t(S_b) / t(S_a) (from the claimed values; the whole call's time, not per token: each claim is
    measured here with its own batch, so a batch change is on both sides), is compared with the
    growth measured here: "scaling holds" within the tolerance plus both claims' rounding, else
    "scaling differs". Informational: an older or smaller GPU may scale differently (launch-bound
    at short seqlens), so a difference is reported, never a verdict."""
    out: dict[int, list[Finding]] = defaultdict(list)
    series: dict[tuple, dict[tuple, int]] = defaultdict(dict)
    for i in idx:
        c = claims[i]
        if c.metric in ("TFLOP/s", "ms", "iter/s", "tokens/s") and not c.oom and c.heads_q is not None:
            same = (c.source, c.gpu, c.family, c.heads_q, c.heads_k, c.head_dim, c.head_dim_v, c.causal, c.dtype,
                    c.backend, c.mode, c.metric)
            for fixed in (("batch", c.batch), ("tokens", c.batch * c.seqlen_q)):
                series[(*same, fixed)].setdefault((c.seqlen_q, c.seqlen_k), i)
    for by_len in series.values():
        lengths = sorted(by_len)
        for la, lb in zip(lengths, lengths[1:]):
            a, b = by_len[la], by_len[lb]
            ca, cb = claims[a], claims[b]
            ta, tb = run(ca).ms.get(ca.mode), run(cb).ms.get(cb.mode)
            sa, sb = _speed(ca, ca.value), _speed(cb, cb.value)
            if None in (ta, tb, sa, sb) or not sb:
                continue
            published, here = sa / sb, tb / ta  # time ratios: speed is calls per second
            held = _within(here, published, tol, _rel(ca) + _rel(cb))
            text = (f"{ca.backend} {ca.mode} ({ca.metric}) time from {_setting(ca)} to {_setting(cb)}: "
                    f"published {published:.2f}x, here {here:.2f}x")
            kind = "scaling holds" if held else "scaling differs"
            out[a].append(Finding(kind, "scaling", text))
            out[b].append(Finding(kind, "scaling", text))
    return out


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


def verdict_of(findings: list[Finding]) -> str:
    kinds = [f.kind for f in findings if f.kind not in INFO]
    for v in SEVERITY:
        if v in kinds:
            return v
    if any(f.kind == "plausible" for f in findings):
        return "consistent"
    return "not checkable"


def audit(claims: list[Claim], *, tolerance: float = DEFAULT_TOLERANCE, measure_on=None, as_gpu: str | None = None,
          log=None) -> dict:
    """The audit report (a JSON-ready dict). ``measure_on``: a device to measure on (None: no measurement)."""
    findings: dict[int, list[Finding]] = defaultdict(list)
    for part in (consistency(claims, tolerance), physics(claims)):
        for i, f in part.items():
            findings[i] += f
    measured_on = None
    if measure_on is not None:
        measured_on = as_gpu or present_gpu(measure_on)
        for i, f in measure(claims, tolerance, device=measure_on, as_gpu=as_gpu, log=log).items():
            findings[i] += f
    rows = []
    for i, c in enumerate(claims):
        fs = findings.get(i, [])
        rows.append({"where": c.where, "source": c.source, "gpu": c.gpu, "claim": c.describe(),
                     "verdict": verdict_of(fs), "findings": [f.to_dict() for f in fs], "note": c.note})
    counts = {v: sum(r["verdict"] == v for r in rows) for v in SEVERITY}
    # the other-GPU checks, once per comparison (each finding is attached to both claims it compares)
    compared = {(f.rule, f.kind, f.text) for fs in findings.values() for f in fs if f.rule in ("ordering", "scaling")}
    checks = {k: sum(kind == k for _, kind, _ in compared) for k in INFO if k != "plausible"}
    used = {g.name: g.to_dict() for g in (gpus.lookup(c.gpu) for c in claims) if g is not None}
    return {
        "summary": {"claims": len(rows), **counts, "fails": sum(counts[v] for v in FAILING)},
        "other_gpu_checks": checks,
        "other_gpu_findings": sorted(compared),
        "tolerance": tolerance, "measured_on": measured_on, "claims": rows, "gpus": used,
        "files": sorted({c.file for c in claims}),
    }


def markdown(rep: dict) -> str:
    s = rep["summary"]
    L = ["# Audit of published benchmark claims", ""]
    parts = [f"{s[v]} {v}" for v in SEVERITY if s[v]]
    L += [f"**{s['claims']} claims: {', '.join(parts)}.** "
          + ("Nothing impossible or contradicted." if not s["fails"] else
             f"{s['fails']} impossible or contradicted."), ""]
    L += [f"Files: {', '.join(f'`{f}`' for f in rep['files'])}. Tolerance {rep['tolerance']:.0%} plus the rounding "
          "of the printed numbers. " + (f"Measured on {rep['measured_on']}." if rep["measured_on"] else
                                        "Not measured (no `--measure`): consistency and physics only."), ""]
    L += ["Verdicts: impossible (contradicts arithmetic or the datasheet), contradicted (slower here by more than "
          "the tolerance), inconsistent (two numbers of one configuration disagree), implausible (above 85% of the "
          "usable peak, or a backward faster than half its forward), faster here / reproduced (measured), consistent "
          "(every rule that applies passed), not runnable / not checkable (the reason is given).", ""]
    L += ["| verdict | claim | where | why |", "|---|---|---|---|"]
    order = {v: k for k, v in enumerate(SEVERITY)}
    for r in sorted(rep["claims"], key=lambda r: order[r["verdict"]]):
        why = "; ".join(f"{f['rule']}: {f['text']}" for f in r["findings"]
                        if f["kind"] == r["verdict"] or r["verdict"] in ("consistent",) and f["kind"] in ("consistent",))
        why = why or "; ".join(f"{f['rule']}: {f['text']}" for f in r["findings"])
        L.append(f"| {r['verdict']} | {r['claim']} | `{r['where']}` | {why.replace('|', '/')} |")
    other = rep.get("other_gpu_findings") or []
    if other:
        c = rep["other_gpu_checks"]
        L += ["", "## Claims of other GPUs, measured here: ordering and scaling (informational)", "",
              f"Ordering: {c['ordering holds']} pairs hold, {c['ordering differs']} differ; scaling with seqlen: "
              f"{c['scaling holds']} steps hold, {c['scaling differs']} differ (a different GPU may order or scale "
              "differently: these inform, they never decide a verdict).", "",
              "| check | result | what |", "|---|---|---|"]
        L += [f"| {rule} | {kind} | {text.replace('|', '/')} |" for rule, kind, text in other]
    L += ["", "## GPUs", "", "| GPU | dense TFLOP/s (fp32 accumulate / at most) | GB/s | GB | sources |",
          "|---|---|---|---|---|"]
    for name, g in rep["gpus"].items():
        rates = ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in g["tflops"].items() if v)
        L.append(f"| {name} | {rates} | {g['bandwidth_gbps']:g} | {g['memory_gb']:g} | "
                 + "; ".join(g["sources"]) + (f" ({g['note']})" if g["note"] else "") + " |")
    return "\n".join(L) + "\n"


def tolerance_arg(text: str) -> float:
    """"10%" or "0.1" -> 0.1."""
    t = text.strip()
    v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    if not 0 <= v < 1:
        raise ValueError(f"--tolerance: expected a fraction or a percentage below 100%, got {text!r}")
    return v

