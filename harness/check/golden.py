"""Golden store: FP64 oracle outputs and gradients for a small set of cases, with hashes.

``golden/manifest.json`` lists, per entry: case id, family, seed, the sha256 of the seeded inputs,
the oracle version and the sha256 of the safetensors file that holds the float64 results. The
repo keeps only small cases (a few MB); larger references are computed on demand and kept in a
cache directory keyed by the same hashes (``$ATTN_HARNESS_CACHE``, else
``$XDG_CACHE_HOME/attn-harness``, else ``~/.cache/attn-harness``). No pickle anywhere.

``python -m harness golden --check`` verifies every file's hash, that the inputs regenerate
bit-for-bit, and that the oracle reproduces each stored tensor; ``--regenerate`` rewrites them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from harness import fp8
from harness.cases import Case, DecodeCase, LinearCase, SoftmaxCase, make_inputs
from harness.files import atomic_write
from harness.oracle import (
    ORACLE_VERSION,
    decode_attention,
    linear_attention,
    softmax_attention,
    softmax_attention_varlen,
)

MANIFEST = "manifest.json"
# A stored tensor is reproduced when its relative max error against the recomputed one is below
# this: the oracle is float64 throughout, so only BLAS summation order differs between machines.
REPRODUCE_RTOL = 1e-12
# References whose inputs have more elements than this go to the cache directory (not the repo).
CACHE_MIN_ELEMENTS = 1 << 16


def golden_dir() -> Path:
    """The store: ``$ATTN_HARNESS_GOLDEN_DIR``, else ``golden/`` at the project root."""
    env = os.environ.get("ATTN_HARNESS_GOLDEN_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "golden"


def cache_dir() -> Path:
    env = os.environ.get("ATTN_HARNESS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attn-harness"


def golden_cases() -> list[tuple[Case, int]]:
    """The cases kept in the repo, with their seeds: every feature, every dtype, a few KB each."""
    from harness.presets import preset

    cases: list[tuple[Case, int]] = [(c, 0) for c in preset("small") + preset("small-linear") + preset("small-decode")]
    cases += [
        (SoftmaxCase(1, 2, 1, 128, 128, 64, causal=True, dtype="bf16"), 0),
        (SoftmaxCase(1, 2, 2, 96, 160, 32, dtype="fp16"), 1),
        (SoftmaxCase(1, 1, 1, 192, 192, 128, window=(64, 0), dtype="bf16"), 0),
        (LinearCase(1, 2, 200, 32, gate="g", gate_n=1.0, dtype="bf16"), 0),
        (LinearCase(1, 4, 130, 32, gate="g_gamma", gate_n=0.1, dtype="fp16"), 0),
        (DecodeCase(3, 4, 2, 1, 100, 32, page_size=32, dtype="bf16"), 0),
    ]
    return cases


# ------------------------------------------------------------------------------------------
# hashing and the oracle call
# ------------------------------------------------------------------------------------------


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and raw bytes, in name order: equal iff bit-identical."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def compute_oracle(case: Case, inputs):
    """Run the FP64 oracle on ``inputs`` (from :func:`harness.cases.make_inputs`) for ``case``."""
    if isinstance(case, SoftmaxCase):
        if case.is_varlen:
            return softmax_attention_varlen(
                inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, inputs.grad_out,
                **case.oracle_kwargs,
            )
        if case.fp8:  # the oracle sees the dequantised values: input quantisation is not the kernel's error
            q, k, v = (fp8.dequantize(x, d) for x, d in ((inputs.q, inputs.q_descale), (inputs.k, inputs.k_descale),
                                                         (inputs.v, inputs.v_descale)))
            do = inputs.grad_out if inputs.do_descale is None else fp8.dequantize(inputs.grad_out, inputs.do_descale)
            return softmax_attention(q, k, v, do, **case.oracle_kwargs)
        return softmax_attention(inputs.q, inputs.k, inputs.v, inputs.grad_out, **case.oracle_kwargs)
    if isinstance(case, LinearCase):
        return linear_attention(
            inputs.q, inputs.k, inputs.v, inputs.grad_out, g=inputs.g, g_gamma=inputs.g_gamma,
            initial_state=inputs.initial_state, grad_final_state=inputs.grad_final_state, **case.oracle_kwargs,
        )
    if isinstance(case, DecodeCase):
        return decode_attention(inputs.q, inputs.k_cache, inputs.v_cache, inputs.cache_seqlens, inputs.block_table,
                                inputs.k, inputs.v, **case.oracle_kwargs)
    raise TypeError(f"case: expected SoftmaxCase, LinearCase or DecodeCase, got {type(case).__name__}")


def _result_from(case: Case, tensors: dict[str, torch.Tensor]):
    from harness.oracle import DecodeResult, LinearResult, SoftmaxResult

    cls = {SoftmaxCase: SoftmaxResult, LinearCase: LinearResult, DecodeCase: DecodeResult}[type(case)]
    return cls(**tensors)


def _file_name(case: Case, seed: int) -> str:
    safe = case.id.replace("/", "_").replace("[", "(").replace("]", ")").replace(",", "_")
    return f"{case.family}-{safe}-s{seed}.safetensors"


# ------------------------------------------------------------------------------------------
# lookup: golden store, then cache, then compute
# ------------------------------------------------------------------------------------------

_manifest_cache: dict[str, dict] | None = None


def _manifest_entries() -> dict[str, dict]:
    global _manifest_cache
    if _manifest_cache is None:
        path = golden_dir() / MANIFEST
        entries = json.loads(path.read_text())["entries"] if path.exists() else []
        _manifest_cache = {f"{e['case_id']}|{e['seed']}": e for e in entries}
    return _manifest_cache


def oracle_result(case: Case, inputs=None, seed: int = 0):
    """The FP64 reference for ``case`` with seeded inputs ``seed`` (on the inputs' device).

    Looked up in the golden store, then in the cache directory (both only when the inputs' hash
    matches the recorded one), else computed; large results are then written to the cache.
    """
    if inputs is None:
        inputs = make_inputs(case, seed)
    device = inputs.q.device
    in_hash = tensors_sha256(inputs.tensors())
    entry = _manifest_entries().get(f"{case.id}|{seed}")
    if entry and entry["input_sha256"] == in_hash and entry["oracle_version"] == ORACLE_VERSION:
        path = golden_dir() / entry["file"]
        if path.exists():
            return _result_from(case, {k: v.to(device) for k, v in load_file(str(path)).items()})
    n_elements = sum(t.numel() for t in inputs.tensors().values())
    cached = cache_dir() / "oracle" / f"v{ORACLE_VERSION}-{in_hash[:32]}.safetensors"
    if n_elements >= CACHE_MIN_ELEMENTS and cached.exists():
        try:
            return _result_from(case, {k: v.to(device) for k, v in load_file(str(cached)).items()})
        except Exception:  # a torn or corrupt cache file is recomputed, never trusted
            cached.unlink(missing_ok=True)
    result = compute_oracle(case, inputs)
    if n_elements >= CACHE_MIN_ELEMENTS:
        cached.parent.mkdir(parents=True, exist_ok=True)
        plain = {k: v.detach().cpu().contiguous() for k, v in result.tensors().items()}
        atomic_write(cached, lambda tmp: save_file(plain, tmp))
    return result


# ------------------------------------------------------------------------------------------
# check / regenerate
# ------------------------------------------------------------------------------------------


def _unchanged(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bool:
    """Whether ``path`` already holds these tensors (the same names, dtypes and shapes, values within
    :data:`REPRODUCE_RTOL`: what :func:`check` accepts as the oracle's result) and metadata.
    safetensors writes its metadata in a per-process random order (a hash map), and the float64
    oracle's last bits depend on the CPU's BLAS kernels (seen: an AMD EPYC's differ in the last ulp
    from the ones committed), so rewriting the same result changes the file's bytes and its manifest
    hash: a regeneration keeps such files as they are."""
    if not path.exists():
        return False
    try:
        with safe_open(str(path), "pt") as f:
            if f.metadata() != metadata:
                return False
        old = load_file(str(path))
    except Exception:  # unreadable: rewrite it
        return False
    if sorted(old) != sorted(tensors):
        return False
    return all(old[k].dtype == t.dtype and old[k].shape == t.shape and _rel_max_err(old[k], t) <= REPRODUCE_RTOL
               for k, t in tensors.items())


def regenerate(directory: Path | None = None, *, log=print) -> Path:
    """Rewrite every golden file whose content changed (and drop the ones no longer listed), then
    the manifest; returns the manifest path."""
    global _manifest_cache
    directory = Path(directory or golden_dir())
    directory.mkdir(parents=True, exist_ok=True)
    wanted = {_file_name(case, seed) for case, seed in golden_cases()}
    for old in directory.glob("*.safetensors"):
        if old.name not in wanted:
            old.unlink()
    entries = []
    for case, seed in golden_cases():
        inputs = make_inputs(case, seed)
        result = compute_oracle(case, inputs)
        name = _file_name(case, seed)
        tensors = {k: v.contiguous() for k, v in result.tensors().items()}
        metadata = {"case_id": case.id, "seed": str(seed)}
        if _unchanged(directory / name, tensors, metadata):
            log(f"unchanged {name}")
        else:
            save_file(tensors, str(directory / name), metadata=metadata)
            log(f"wrote {name}")
        entries.append(
            dict(
                case_id=case.id,
                family=case.family,
                seed=seed,
                file=name,
                tensors=sorted(tensors),
                input_sha256=tensors_sha256(inputs.tensors()),
                oracle_version=ORACLE_VERSION,
                file_sha256=file_sha256(directory / name),
            )
        )
    manifest = directory / MANIFEST
    manifest.write_text(json.dumps({"oracle_version": ORACLE_VERSION, "entries": entries}, indent=1) + "\n")
    _manifest_cache = None
    return manifest


def check(directory: Path | None = None, *, log=print) -> list[str]:
    """Verify the store; returns the list of problems (empty when everything reproduces)."""
    directory = Path(directory or golden_dir())
    manifest = directory / MANIFEST
    if not manifest.exists():
        return [f"{manifest}: missing (run `python -m harness golden --regenerate`)"]
    try:
        data = json.loads(manifest.read_text())
        entries = data["entries"]
    except (ValueError, KeyError) as e:
        return [f"{manifest}: unreadable manifest: {e}"]
    known = {(c.id, s): c for c, s in golden_cases()}
    problems = []
    listed = set()
    for e in entries:
        path = directory / e["file"]
        listed.add(e["file"])
        case = known.get((e["case_id"], e["seed"]))
        if case is None:
            problems.append(f"{path.name}: case {e['case_id']} (seed {e['seed']}) is not a golden case any more")
            continue
        if not path.exists():
            problems.append(f"{path.name}: missing")
            continue
        if file_sha256(path) != e["file_sha256"]:
            problems.append(f"{path.name}: sha256 mismatch (file corrupted or edited)")
            continue
        if e["oracle_version"] != ORACLE_VERSION:
            problems.append(f"{path.name}: made by oracle version {e['oracle_version']}, current {ORACLE_VERSION}")
            continue
        inputs = make_inputs(case, e["seed"])
        if tensors_sha256(inputs.tensors()) != e["input_sha256"]:
            problems.append(f"{path.name}: the seeded inputs no longer regenerate bit-for-bit")
            continue
        stored = load_file(str(path))
        fresh = compute_oracle(case, inputs).tensors()
        if sorted(stored) != sorted(fresh):
            problems.append(f"{path.name}: holds {sorted(stored)}, the oracle gives {sorted(fresh)}")
            continue
        for name, ref in fresh.items():
            err = _rel_max_err(stored[name], ref)
            if not err <= REPRODUCE_RTOL:
                problems.append(f"{path.name}: {name} differs from the oracle (relative max error {err:.3g})")
        log(f"ok   {path.name}")
    for f in sorted(p.name for p in directory.glob("*.safetensors")):
        if f not in listed:
            problems.append(f"{f}: not in the manifest")
    return problems


def _rel_max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    if not torch.equal(torch.isinf(a), torch.isinf(b)) or torch.isnan(a).any() or torch.isnan(b).any():
        return float("inf")
    diff = torch.where(same_inf, 0.0, a - b).abs().max().item() if a.numel() else 0.0
    scale = torch.where(torch.isinf(b), 0.0, b).abs().max().item() if b.numel() else 0.0
    return diff / scale if scale > 0 else diff


