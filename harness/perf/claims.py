"""Claims files: published benchmark numbers, one row per number, for ``python -m harness audit``.

A claims file is CSV with a header row. Columns (order free; unknown columns are an error):

| column | required | meaning |
|---|---|---|
| source | yes | where the number was published: title, URL or citation |
| gpu | yes | the GPU as published ("H100 80GB SXM5", "RTX 4060 Laptop") |
| backend | yes | the implementation as published ("FlashAttention-2", "cuDNN") |
| family | no | softmax (default) or linear |
| batch, seqlen_q, head_dim | yes | the problem (linear: seqlen_q is T, head_dim is K) |
| seqlen_k | no | default seqlen_q |
| heads_q | no | blank: not published (rates are then lower bounds, with one head) |
| heads_k | no | default heads_q |
| head_dim_v | no | default head_dim (linear: V) |
| causal | yes | true / false |
| dtype | yes | fp16, bf16, fp32, fp8 |
| mode | yes | fwd, bwd, fwd+bwd |
| metric | yes | ms, TFLOP/s, iter/s, tokens/s, MB, speedup |
| value | yes | a number, or OOM (out of device memory) |
| baseline | for speedup | the backend the speedup is relative to (same configuration and mode) |
| memory | for MB | which memory: peak, fwd (allocated by the forward), bwd (added by the backward), activation |
| note | no | free text (assumptions of the transcription) |

Several metrics of one configuration are several rows. :func:`load` returns :class:`Claim` rows or
raises :class:`ClaimsError` naming the file, the row (as a line number) and the field.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

METRICS = ("ms", "TFLOP/s", "iter/s", "tokens/s", "MB", "speedup")
MODES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("fp16", "bf16", "fp32", "fp8")
MEMORY_KINDS = ("peak", "fwd", "bwd", "activation")
FAMILIES = ("softmax", "linear")
COLUMNS = ("source", "gpu", "backend", "family", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_k", "head_dim",
           "head_dim_v", "causal", "dtype", "mode", "metric", "value", "baseline", "memory", "note")
REQUIRED = ("source", "gpu", "backend", "batch", "seqlen_q", "head_dim", "causal", "dtype", "mode", "metric", "value")


class ClaimsError(ValueError):
    """A malformed claims file; the message names the file, the line and the field."""


@dataclass(frozen=True)
class Claim:
    """One published number. ``value`` is None for an OOM claim (``oom`` True); ``resolution`` is
    half a unit of the last digit printed (the rounding a consistency check allows);
    ``heads_q`` is None when not published."""

    file: str
    line: int
    source: str
    gpu: str
    backend: str
    family: str
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int | None
    heads_k: int | None
    head_dim: int
    head_dim_v: int
    causal: bool
    dtype: str
    mode: str
    metric: str
    value: float | None
    oom: bool
    resolution: float
    baseline: str = ""
    memory: str = ""
    note: str = ""

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"

    @property
    def config(self) -> tuple:
        """The problem and the setting, without the backend: claims of one configuration."""
        return (self.source, self.gpu, self.family, self.batch, self.seqlen_q, self.seqlen_k, self.heads_q,
                self.heads_k, self.head_dim, self.head_dim_v, self.causal, self.dtype)

    @property
    def key(self) -> tuple:
        """The configuration and the backend: one implementation's numbers on one problem."""
        return (*self.config, self.backend)

    def describe(self) -> str:
        heads = "H?" if self.heads_q is None else (f"H{self.heads_q}" if self.heads_q == self.heads_k
                                                   else f"H{self.heads_q}/{self.heads_k}")
        seq = f"S{self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"S{self.seqlen_q}x{self.seqlen_k}"
        d = f"D{self.head_dim}" if self.head_dim == self.head_dim_v else f"D{self.head_dim}v{self.head_dim_v}"
        parts = [self.backend, f"B{self.batch}", heads, seq, d] + (["causal"] if self.causal else []) + [self.dtype]
        what = self.metric + (f" vs {self.baseline}" if self.baseline else "") + (f" ({self.memory})" if self.memory else "")
        shown = "OOM" if self.oom else f"{self.value:g}"
        return f"{' '.join(parts)} {self.mode} {what} = {shown}"


def _resolution(text: str) -> float:
    """Half a unit of the last digit of a printed number ("0.32" -> 0.005, "474" -> 0.5)."""
    t = text.strip().lower().removesuffix("x")
    if "e" in t:
        return 0.0
    decimals = len(t.split(".", 1)[1]) if "." in t else 0
    return 0.5 * 10.0 ** (-decimals)


def _fail(path, line: int, field: str, why: str):
    raise ClaimsError(f"{path}: line {line}, field '{field}': {why}")


def load(path) -> list[Claim]:
    """The claims of one file (see the module docstring); ClaimsError on the first malformed field."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ClaimsError(f"{path}: cannot read ({e.strerror or e})") from None
    rows = list(csv.reader(line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")))
    if not rows:
        raise ClaimsError(f"{path}: empty (expected a header row with {', '.join(REQUIRED)}, ...)")
    header = [h.strip() for h in rows[0]]
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise ClaimsError(f"{path}: header: unknown column(s) {', '.join(map(repr, unknown))}; known: {', '.join(COLUMNS)}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ClaimsError(f"{path}: header: missing required column(s) {', '.join(missing)}")
    # line numbers as the file counts them (comments and blank lines skipped above)
    numbers = [i + 1 for i, line in enumerate(text.splitlines()) if line.strip() and not line.lstrip().startswith("#")]
    claims = []
    for row, line in zip(rows[1:], numbers[1:]):
        if len(row) != len(header):
            _fail(path, line, "(row)", f"{len(row)} fields, the header has {len(header)}")
        rec = {h: v.strip() for h, v in zip(header, row)}
        claims.append(_claim(path, line, rec))
    if not claims:
        raise ClaimsError(f"{path}: no claim rows after the header")
    return claims


def _int(path, line, rec, field, *, default=None, positive=True):
    text = rec.get(field, "")
    if text == "":
        if default is not None or field not in REQUIRED:
            return default
        _fail(path, line, field, "required, empty")
    try:
        v = int(text)
    except ValueError:
        _fail(path, line, field, f"expected an integer, got {text!r}")
    if positive and v <= 0:
        _fail(path, line, field, f"expected a positive integer, got {v}")
    return v


def _claim(path, line: int, rec: dict) -> Claim:
    for f in ("source", "gpu", "backend", "mode", "metric", "value", "dtype", "causal"):
        if not rec.get(f):
            _fail(path, line, f, "required, empty")
    family = rec.get("family") or "softmax"
    if family not in FAMILIES:
        _fail(path, line, "family", f"expected one of {', '.join(FAMILIES)}, got {family!r}")
    causal_text = rec["causal"].lower()
    if causal_text not in ("true", "false", "yes", "no", "1", "0"):
        _fail(path, line, "causal", f"expected true or false, got {rec['causal']!r}")
    causal = causal_text in ("true", "yes", "1")
    if rec["dtype"] not in DTYPES:
        _fail(path, line, "dtype", f"expected one of {', '.join(DTYPES)}, got {rec['dtype']!r}")
    if rec["mode"] not in MODES:
        _fail(path, line, "mode", f"expected one of {', '.join(MODES)}, got {rec['mode']!r}")
    if rec["metric"] not in METRICS:
        _fail(path, line, "metric", f"expected one of {', '.join(METRICS)}, got {rec['metric']!r}")
    batch = _int(path, line, rec, "batch")
    sq = _int(path, line, rec, "seqlen_q")
    sk = _int(path, line, rec, "seqlen_k", default=sq)
    hq = _int(path, line, rec, "heads_q")
    hk = _int(path, line, rec, "heads_k", default=hq) if hq is not None else None
    if hq is not None and hk is not None and hq % hk:
        _fail(path, line, "heads_k", f"heads_q ({hq}) must be a multiple of heads_k ({hk})")
    d = _int(path, line, rec, "head_dim")
    dv = _int(path, line, rec, "head_dim_v", default=d)
    if family == "linear" and (sk != sq or (hk is not None and hk != hq) or not causal):
        _fail(path, line, "family", "linear attention is causal, with seqlen_k = seqlen_q and one head count")
    text = rec["value"]
    oom = text.upper() == "OOM"
    value = None
    if not oom:
        try:
            value = float(text.removesuffix("x"))
        except ValueError:
            _fail(path, line, "value", f"expected a number or OOM, got {text!r}")
        if not value >= 0:
            _fail(path, line, "value", f"expected a non-negative number, got {text!r}")
    baseline = rec.get("baseline", "")
    if rec["metric"] == "speedup" and not baseline:
        _fail(path, line, "baseline", "a speedup needs the backend it is relative to")
    memory = rec.get("memory", "")
    if rec["metric"] == "MB" and memory not in MEMORY_KINDS:
        _fail(path, line, "memory", f"an MB claim needs which memory: one of {', '.join(MEMORY_KINDS)}, got {memory!r}")
    return Claim(
        file=str(path), line=line, source=rec["source"], gpu=rec["gpu"], backend=rec["backend"], family=family,
        batch=batch, seqlen_q=sq, seqlen_k=sk, heads_q=hq, heads_k=hk, head_dim=d, head_dim_v=dv, causal=causal,
        dtype=rec["dtype"], mode=rec["mode"], metric=rec["metric"], value=value, oom=oom,
        resolution=0.0 if oom else _resolution(text), baseline=baseline, memory=memory, note=rec.get("note", ""),
    )
