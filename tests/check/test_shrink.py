"""The shrinker: a bug that needs two features is shrunk to a case with exactly those two, each
other feature reported as dropped; the standalone script it writes needs no part of this project,
fails on the wrong kernel and passes on a correct one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.cases import case_from_id

IMPLS = Path(__file__).resolve().parents[1] / "accept" / "impls"
START = "B2-H8/2-S40x37-D32-causal-win16x0-cap5-scale0.3-transposed-fp32"


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory):
    out = tmp_path_factory.mktemp("shrink")
    import os

    cwd = os.getcwd()
    os.chdir(IMPLS)
    try:
        code = cli.main(["shrink", "--impl", "wrong_combo:attn", "--case", START, "--seed", "3", "--device", "cpu",
                         "--out", str(out)])
    finally:
        os.chdir(cwd)
    return code, out, json.loads((out / "shrink.json").read_text())


def test_finds_both_features_and_drops_the_rest(shrunk):
    code, _, rep = shrunk
    assert code == 0
    minimal = case_from_id(rep["minimal"])
    assert minimal.causal and minimal.softcap  # the two that make the bug
    assert not minimal.has_window and minimal.scale is None and minimal.layout == "contiguous"
    assert minimal.heads_q == minimal.heads_k and minimal.batch == 1
    assert minimal.seqlen_q <= 4 and minimal.d == 16
    outcome = {f["feature"]: f["outcome"] for f in rep["features"]}
    assert outcome["softcap off"].startswith("needed") and outcome["causal off"].startswith("needed")
    for f in ("GQA -> MHA", "window off", "passed scale off (default)", "transposed layout -> contiguous"):
        assert outcome[f].startswith("dropped"), (f, outcome[f])
    assert rep["signature"] == {"status": "fail", "check": "out"}


def _repro(run, script: Path, *args) -> subprocess.CompletedProcess:
    # harness made unimportable: the script must stand alone (torch and the callable only); ``run`` is the
    # forked_python fixture (a fresh `python -c` that starts with torch imported: tests/forked_python.py)
    boot = ("import runpy, sys; sys.modules['harness'] = None; sys.argv = [sys.argv[1], *sys.argv[2:]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    return run([sys.executable, "-c", boot, str(script), *args], cwd=IMPLS, timeout=120)


def _repro_from(run, script: Path, *paths, **kw) -> subprocess.CompletedProcess:
    """:func:`_repro`'s standalone run of ``script`` (no arguments) with ``paths`` first on sys.path (stand-in
    modules, the project root); ``kw``: forked_python's (timeout 120 unless given)."""
    boot = ("import runpy, sys; sys.modules['harness'] = None; sys.path[:0] = sys.argv[2:]; "
            "sys.argv = sys.argv[1:2]; runpy.run_path(sys.argv[0], run_name='__main__')")
    return run([sys.executable, "-c", boot, str(script), *map(str, paths)], **{"timeout": 120, **kw})


def test_the_repro_script_stands_alone_fails_on_the_bug_and_passes_when_fixed(shrunk, forked_python):
    _, out, rep = shrunk
    script = Path(rep["repro"])
    assert script.exists() and "import harness" not in script.read_text()
    bad = _repro(forked_python, script)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "defect reproduced: out" in bad.stdout
    good = _repro(forked_python, script, "--impl", "correct_softmax:flash_attn_func")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "no defect" in good.stdout


def test_a_case_that_passes_has_nothing_to_shrink(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(IMPLS)
    code = cli.main(["shrink", "--impl", "correct_softmax:flash_attn_func", "--case", "B1-H2-S8x8-D16-fp32",
                     "--seed", "0", "--device", "cpu", "--out", str(tmp_path / "o")])
    assert code == 1 and "does not fail" in capsys.readouterr().out


def test_bad_case_id_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(IMPLS)
    code = cli.main(["shrink", "--backend", "eager", "--case", "B1-nonsense", "--seed", "0", "--out", str(tmp_path)])
    assert code == 2 and "--case" in capsys.readouterr().err


def test_a_decode_case_shrinks_to_the_feature_it_needs(tmp_path, monkeypatch, capsys, forked_python):
    """A decode kernel that ignores the page table: the paged cache is needed; GQA, the window, the
    softcap, the second new token and the extra sequences go; the standalone script fails on it and
    passes on a correct decode callable."""
    monkeypatch.chdir(IMPLS)
    start = "B4-H8/2-Q2-L90r-P16-new-D16-win20x0-cap5-fp32"
    code = cli.main(["shrink", "--impl", "decode_impls:ignores_block_table", "--case", start, "--seed", "2",
                     "--device", "cpu", "--out", str(tmp_path)])
    rep = json.loads((tmp_path / "shrink.json").read_text())
    assert code == 0, rep
    minimal = case_from_id(rep["minimal"])
    assert minimal.paged and not minimal.has_window and not minimal.softcap
    assert minimal.heads_q == minimal.heads_k and minimal.seqlen_q == 1 and minimal.cache_len < 90
    outcome = {f["feature"]: f["outcome"] for f in rep["features"]}
    assert outcome["paged -> contiguous cache"].startswith("needed")
    assert outcome["window off"].startswith("dropped") and outcome["GQA -> MHA"].startswith("dropped")
    script = Path(rep["repro"])
    assert script.exists() and "import harness" not in script.read_text()
    bad = _repro(forked_python, script)
    assert bad.returncode == 1 and "defect reproduced" in bad.stdout, bad.stdout + bad.stderr
    good = _repro(forked_python, script, "--impl", "decode_impls:attn")
    assert good.returncode == 0 and "no defect" in good.stdout, good.stdout + good.stderr


def test_a_decode_repro_catches_a_wrong_cache_write(tmp_path, forked_python):
    """The caches written in place are compared exactly: a kernel whose output is right but writes
    the new tokens one slot off fails the script on k_cache / v_cache."""
    from harness.adapters.user import make_callable_adapter
    from harness.check import repro
    from harness.check.verify import verify

    case = case_from_id("B5-H8/2-Q1-L100r-P16-new-D32-fp32")
    sys.path.insert(0, str(IMPLS))
    try:
        import decode_impls

        result = verify(make_callable_adapter(decode_impls.writes_wrong_slot, family="decode", name="w"), case,
                        seed=0, device="cpu")
    finally:
        sys.path.remove(str(IMPLS))
    assert result.status == "fail"
    script = repro.write_repro(tmp_path / "repro.py", case=case, seed=0, result=result,
                               impl="decode_impls:writes_wrong_slot")
    bad = _repro(forked_python, script)
    assert bad.returncode == 1 and "k_cache" in bad.stdout.split("defect reproduced:")[-1], bad.stdout + bad.stderr


@pytest.mark.parametrize("impl, case_id", [
    ("ignores:positional_misread", "B1-H2-S24x24-D16-causal-scale0.5-positional-fp32"),
    ("ignores:wrong_without_lse", "B1-H4/2-S40x40-D32-causal-nolse-fp32"),
])
def test_the_repro_script_calls_as_the_case_says(tmp_path, impl, case_id, forked_python):
    """Positional and out-only cases: the script calls the kernel the same way (by position; with
    return_lse=False), so the defect the harness saw reproduces there; called by keyword / with lse
    (the generic case) the same callable is right."""
    from harness.adapters.user import make_callable_adapter
    from harness.check import repro
    from harness.check.verify import verify

    sys.path.insert(0, str(IMPLS))
    try:
        mod, fn = impl.split(":")
        import importlib

        adapter = make_callable_adapter(getattr(importlib.import_module(mod), fn), name=impl)
        result = verify(adapter, case_from_id(case_id), seed=0, device="cpu")
    finally:
        sys.path.remove(str(IMPLS))
    assert result.status == "fail"
    script = repro.write_repro(tmp_path / "repro.py", case=case_from_id(case_id), seed=0, result=result, impl=impl)
    bad = _repro(forked_python, script)
    assert bad.returncode == 1 and "defect reproduced: out" in bad.stdout, bad.stdout + bad.stderr


def test_the_call_forms_are_features_the_shrinker_switches_off():
    from harness.check.shrink import _features

    case = case_from_id("B1-H2-S24x24-D16-causal-scale0.5-positional-fp32")
    feats = dict(_features(case))
    assert feats["positional call -> keywords"].call == "keyword"
    nolse = dict(_features(case_from_id("B1-H4/2-S40x40-D32-causal-nolse-fp32")))
    assert nolse["lse asked for (return_lse on)"].return_lse is True


def test_the_in_repo_decode_kernel_has_a_standalone_script_too(tmp_path, forked_python):
    """triton_decode's script calls kernels.decode like its adapter; on the kernel (correct) it exits 0
    (run from the project root, in Triton's interpreter on a CPU)."""
    import os

    from harness.adapters import registry
    from harness.check import repro
    from harness.check.verify import verify

    case = case_from_id("B3-H4/2-Q3-L33r-P16-new-D16-nocausal-scale0.0625-fp32")
    result = verify(registry.get("triton_decode"), case, seed=0, device="cpu")
    assert result.status == "pass", result.message()
    script = repro.write_repro(tmp_path / "repro_triton_decode.py", case=case, seed=0, result=result,
                               backend="triton_decode")
    root = Path(__file__).resolve().parents[2]
    run = _repro_from(forked_python, script, ".", cwd=root, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0 and "no defect" in run.stdout, run.stdout + run.stderr


def test_a_smaller_case_that_is_another_recorded_defect_is_not_kept():
    # the original fails at head dim 80 (a new finding); every head dim fails the same way here, but
    # head dim 16 is a recorded defect of its own: the shrinker must not land on it
    from harness.check.results import CaseResult
    from harness.check.shrink import shrink

    def check(c):
        return CaseResult(backend="x", case=c.id, family=c.family, dtype=c.dtype, device="cpu", seed=0,
                          status="error", reason="run raised RuntimeError: CUDA error")

    def known(c, r):
        return "head dim 16 defect" if c.d == 16 else None

    out = shrink(case_from_id("B2-H4/1-S40x40-D80-causal-fp16"), check, known=known)
    assert out.minimal.d != 16 and out.minimal.d <= 80
    assert any("another recorded defect (head dim 16 defect)" in s.outcome for s in out.steps)
    free = shrink(case_from_id("B2-H4/1-S40x40-D80-causal-fp16"), check)
    assert free.minimal.d == 16


def test_a_smaller_case_must_fail_about_as_badly():
    # dq is 300x over its bound at 64 query rows and only a little over it below 16: a repro of the
    # gross error, not of a near-miss, is what a maintainer can act on
    from harness.check.results import CaseResult
    from harness.check.shrink import KEEP_SEVERITY, shrink
    from harness.check.tolerance import TensorReport

    def check(c):
        budget = 300.0 if c.seqlen_q >= 16 else 1.3
        t = TensorReport(name="dq", dtype=c.dtype, shape=(1,), error=budget, reference_error=1.0, factor=1.0,
                         floor=0.0, allowed=1.0, ratio=budget, budget=budget, max_abs_error=budget, worst=None,
                         nonfinite=0, passed=False, reason="dq: error")
        return CaseResult(backend="x", case=c.id, family=c.family, dtype=c.dtype, device="cpu", seed=0,
                          status="fail", reason="dq: error", tensors=[t])

    out = shrink(case_from_id("B2-H4-S64x64-D32-fp16"), check)
    assert out.minimal.seqlen_q == 16 and out.result.tensor("dq").budget >= KEEP_SEVERITY
    assert any("fails more mildly" in s.outcome for s in out.steps)


def test_a_smaller_case_that_fails_only_against_an_exact_reference_is_not_kept():
    # session 11, FLA fused_chunk's dg: 13.7x the bf16 reference's error at 8000 steps; at one step the
    # reference is exact, the bound falls to fp32's rounding floor and any bf16 kernel fails it: the
    # shrinker must stop at a length where the reference still has an error, not report T=1
    from harness.check.results import CaseResult
    from harness.check.shrink import shrink
    from harness.check.tolerance import TensorReport

    def check(c):
        ref = 0.0 if c.seqlen <= 8 else 1e-3
        allowed = 10 * ref + 1e-8
        err = 0.03 if c.seqlen <= 8 else 0.0137
        t = TensorReport(name="dg", dtype="fp32", shape=(1,), error=err, reference_error=ref, factor=10.0,
                         floor=1e-8, allowed=allowed, ratio=err / ref if ref else float("inf"),
                         budget=err / allowed, max_abs_error=err, worst=None, nonfinite=0, passed=False,
                         reason="dg: error")
        return CaseResult(backend="x", case=c.id, family=c.family, dtype=c.dtype, device="cpu", seed=0,
                          status="fail", reason="dg: error", tensors=[t])

    out = shrink(case_from_id("B4-H4-T8000-K64V64-g(n=1)-h0-dhT-bf16"), check)
    assert out.minimal.seqlen > 8 and out.result.tensor("dg").reference_error > 0
    assert any("only against the rounding floor" in s.outcome for s in out.steps)


_FAKE_FA4 = '''
import torch


def flash_attn_varlen_func(q, k, v, seqused_k=None, page_table=None, causal=False, window_size=(None, None),
                           softmax_scale=None, softcap=0.0, return_lse=False):
    """flash-attn-4's call over a cache, in torch (a stand-in for the CPU test)."""
    B, Sq, Hq, D = q.shape
    Hk = k.shape[2]
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    left, right = (-1 if w is None else w for w in window_size)
    if causal:
        right = 0
    out = q.new_zeros(B, Sq, Hq, v.shape[-1])
    for b in range(B):
        n = int(seqused_k[b])
        if page_table is None or BROKEN:
            keys, vals = k[b, :n], v[b, :n]
        else:
            keys = k[page_table[b].long()].reshape(-1, Hk, D)[:n]
            vals = v[page_table[b].long()].reshape(-1, Hk, v.shape[-1])[:n]
        keys, vals = keys.repeat_interleave(Hq // Hk, 1).float(), vals.repeat_interleave(Hq // Hk, 1).float()
        s = torch.einsum("qhd,khd->hqk", q[b].float(), keys) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos_q = n - Sq + torch.arange(Sq)[:, None]
        pos_k = torch.arange(n)[None, :]
        ok = torch.ones(Sq, n, dtype=torch.bool)
        if right >= 0:
            ok &= pos_k <= pos_q + right
        if left >= 0:
            ok &= pos_k >= pos_q - left
        p = torch.softmax(s.masked_fill(~ok, float("-inf")), -1).nan_to_num(0.0)
        out[b] = torch.einsum("hqk,khd->qhd", p, vals).to(out.dtype)
    return out, None
'''


@pytest.mark.parametrize("broken", [False, True])
def test_the_flash_attn_4_decode_repro_calls_it_as_the_adapter_does(tmp_path, broken, forked_python):
    """flash_attn_cute_decode's script (flash-attn-4's varlen call over the cache, new tokens written
    first) against a stand-in module: right -> exit 0, ignoring the page table -> exit 1."""
    from harness.check import repro
    from harness.check.results import CaseResult

    pkg = tmp_path / "fake" / "flash_attn" / "cute"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "interface.py").write_text(f"BROKEN = {broken}\n" + _FAKE_FA4)
    case = case_from_id("B3-H4/2-Q2-L37r-P16-new-D16-fp32")
    result = CaseResult(backend="flash_attn_cute_decode", case=case.id, family="decode", dtype="fp32", device="cpu",
                        seed=0, status="error", reason="run raised AcceleratorError: CUDA error: an illegal memory access")
    script = repro.write_repro(tmp_path / "repro.py", case=case, seed=0, result=result,
                               backend="flash_attn_cute_decode")
    p = _repro_from(forked_python, script, tmp_path / "fake")
    assert p.returncode == (1 if broken else 0), p.stdout + p.stderr


@pytest.mark.parametrize("backend, module", [("flash_attn_kvcache", "flash_attn"),
                                             ("flash_attn3_kvcache", "flash_attn_interface")])
@pytest.mark.parametrize("impl, code", [("attn", 0), ("ignores_block_table", 1)])
def test_the_flash_attn_2_and_3_decode_repros_call_as_the_adapters_do(tmp_path, backend, module, impl, code,
                                                                      forked_python):
    """Their scripts call flash_attn_with_kvcache (FA3: the page table as page_table, lse asked for);
    against a stand-in module built on a correct / a page-table-ignoring callable: exit 0 / 1."""
    from harness.check import repro
    from harness.check.results import CaseResult

    fake = tmp_path / "fake"
    fake.mkdir()
    table_kw = "page_table" if module == "flash_attn_interface" else "block_table"
    (fake / f"{module}.py").write_text(
        f"import decode_impls\n\n"
        f"def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, return_softmax_lse=False, "
        f"{table_kw}=None, **kw):\n"
        f"    assert return_softmax_lse\n"
        f"    res = decode_impls.{impl}(q, k_cache, v_cache, k, v, block_table={table_kw}, **kw)\n"
        f"    return res if isinstance(res, tuple) else (res, None)\n")
    case = case_from_id("B3-H4/2-Q2-L37r-P16-new-D16-fp32")
    result = CaseResult(backend=backend, case=case.id, family="decode", dtype="fp32", device="cpu", seed=0,
                        status="fail", reason="out: error")
    script = repro.write_repro(tmp_path / "repro.py", case=case, seed=0, result=result, backend=backend)
    p = _repro_from(forked_python, script, fake, IMPLS)
    assert p.returncode == code, p.stdout + p.stderr


@pytest.mark.parametrize("backend, want", [("triton_fa", False), ("triton_fa_det", True)])
def test_the_in_repo_flash_repros_pass_deterministic_as_their_adapters_do(tmp_path, backend, want, forked_python):
    """triton_fa's script calls flash_attn_func(..., deterministic=False) as its adapter does (the fused backward's
    path on sm90), triton_fa_det's deterministic=True: against a stand-in kernels.flash_attn that computes the right
    attention and asserts the keyword it got, each script exits 0 (a missing or other value: the stand-in raises)."""
    from harness.check import repro
    from harness.check.results import CaseResult

    pkg = tmp_path / "fake" / "kernels" / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(
        "import torch\n\n"
        "def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,\n"
        "                    return_lse=False, deterministic=None):\n"
        f"    assert deterministic is {want}, deterministic\n"
        "    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))\n"
        "    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, scale=softmax_scale)\n"
        "    return out.transpose(1, 2)\n")
    case = case_from_id("B1-H2-S24x24-D16-nolse-fp32")
    result = CaseResult(backend=backend, case=case.id, family="softmax", dtype="fp32", device="cpu", seed=0,
                        status="fail", reason="out: error")
    script = repro.write_repro(tmp_path / "repro.py", case=case, seed=0, result=result, backend=backend)
    p = _repro_from(forked_python, script, tmp_path / "fake")
    assert p.returncode == 0 and "no defect" in p.stdout, p.stdout + p.stderr
