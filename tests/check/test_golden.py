"""The golden store: the committed files verify, tampering is caught and named, and the
oracle lookup serves goldens and the cache."""

import json
import shutil

import pytest
import torch

import harness.check.golden as golden
from harness.cases import SoftmaxCase, make_inputs


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A copy of the committed store that a test may damage."""
    d = tmp_path / "golden"
    shutil.copytree(golden.golden_dir(), d)
    monkeypatch.setenv("ATTN_HARNESS_GOLDEN_DIR", str(d))
    monkeypatch.setattr(golden, "_manifest_cache", None)
    return d


def test_committed_store_reproduces():
    assert golden.check(log=lambda *_: None) == []


def test_store_is_small_and_pickle_free():
    files = list(golden.golden_dir().iterdir())
    assert sum(f.stat().st_size for f in files) < 8 * 2**20
    assert {f.suffix for f in files} <= {".safetensors", ".json"}


def test_corrupted_file_is_named(store):
    victim = sorted(store.glob("*.safetensors"))[3]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF
    victim.write_bytes(bytes(data))
    problems = golden.check(store, log=lambda *_: None)
    assert len(problems) == 1 and problems[0].startswith(victim.name) and "sha256" in problems[0]


def test_wrong_values_with_matching_hash_are_caught(store):
    # Rewrite a file with a perturbed tensor and fix up its hash: only recomputation catches it.
    from safetensors.torch import load_file, save_file

    manifest = json.loads((store / "manifest.json").read_text())
    entry = manifest["entries"][0]
    tensors = load_file(str(store / entry["file"]))
    tensors["out"] = tensors["out"] * (1 + 1e-9)
    save_file(tensors, str(store / entry["file"]))
    entry["file_sha256"] = golden.file_sha256(store / entry["file"])
    (store / "manifest.json").write_text(json.dumps(manifest))
    problems = golden.check(store, log=lambda *_: None)
    assert problems == [p for p in problems if p.startswith(entry["file"])] and "out differs" in problems[0]


def test_missing_and_unlisted_files(store):
    victim = sorted(store.glob("*.safetensors"))[0]
    victim.rename(store / "stray.safetensors")
    problems = golden.check(store, log=lambda *_: None)
    assert any(p.startswith(victim.name) and "missing" in p for p in problems)
    assert any(p.startswith("stray.safetensors") and "not in the manifest" in p for p in problems)


def test_cli_exit_codes(store, capsys):
    from harness.cli import main

    assert main(["golden", "--check", "--dir", str(store)]) == 0
    next(store.glob("*.safetensors")).write_bytes(b"garbage")
    assert main(["golden", "--check", "--dir", str(store)]) == 1
    assert "FAIL" in capsys.readouterr().err


def test_oracle_result_uses_golden_then_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path / "cache"))
    case, seed = golden.golden_cases()[0]
    inputs = make_inputs(case, seed)
    calls = []
    real = golden.compute_oracle
    monkeypatch.setattr(golden, "compute_oracle", lambda *a: calls.append(a) or real(*a))
    r = golden.oracle_result(case, inputs, seed)
    assert calls == []  # served from the store
    assert torch.allclose(r.out, real(case, inputs).out, rtol=golden.REPRODUCE_RTOL, atol=0)
    big = SoftmaxCase(1, 2, 2, 300, 300, 64)
    golden.oracle_result(big, make_inputs(big, 0), 0)
    golden.oracle_result(big, make_inputs(big, 0), 0)
    assert len(calls) == 1 and len(list((tmp_path / "cache" / "oracle").iterdir())) == 1


def test_regenerating_an_unchanged_store_changes_no_byte(store):
    """safetensors writes its metadata in a random order per process: a regeneration keeps the files
    whose tensors and metadata are unchanged, so the manifest's file hashes stay put; a damaged file
    and a file no longer listed are rewritten / removed."""
    before = {f.name: f.read_bytes() for f in store.glob("*")}
    victim = sorted(store.glob("*.safetensors"))[2]
    damaged = bytearray(victim.read_bytes())
    damaged[-3] ^= 0xFF
    victim.write_bytes(bytes(damaged))
    (store / "stale-case-s0.safetensors").write_bytes(b"x")
    golden.regenerate(store, log=lambda *_: None)
    after = {f.name: f.read_bytes() for f in store.glob("*")}
    assert set(after) == set(before)  # the stale file gone
    # every other file kept byte for byte (the manifest too, but for the damaged file's new hash)
    assert all(after[n] == before[n] for n in before if n not in (victim.name, golden.MANIFEST))
    assert golden.check(store, log=lambda *_: None) == []  # the damaged one rewritten and consistent
