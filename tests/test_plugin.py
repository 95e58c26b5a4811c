"""The pytest plugin, driven through pytester: options, ids, header, markers, a failing backend's message."""

import importlib.metadata
import json

import pytest
import torch

from harness.adapters import registry

# Import the built-in adapters now, before pytester snapshots sys.modules: a module it drops and
# an inner run re-imports would register its adapters a second time. The same for torch._inductor,
# which the checks' poisoned memory imports (torch.use_deterministic_algorithms): it pulls in
# torch._dynamo and torch._inductor.test_operators, whose TORCH_LIBRARY cannot register twice (every
# later check in the process errored: tests/commands/test_bench.py run after this file).
registry.all_adapters()
import torch._inductor  # noqa: E402,F401


def _plugin_args() -> list[str]:
    """``-p harness.plugin`` unless the entry point already loads it (loading both is an error)."""
    installed = any(ep.value == "harness.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "harness.plugin"]


@pytest.fixture
def run(pytester, monkeypatch):
    # --attn-impl registers callables: keep them out of this session's registry.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    pytester.syspathinsert()

    def _run(*args):
        return pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider", *args)

    return _run


CASE_TEST = """
def test_case(attn_case, attn_inputs, attn_oracle):
    assert attn_case.dtype in ("fp32", "fp16")
    assert attn_inputs.q.dtype == attn_case.torch_dtype
    assert attn_oracle.out.dtype.is_floating_point
"""


def test_case_ids_are_test_ids(pytester, run):
    pytester.makepyfile(test_case=CASE_TEST)
    res = run("--attn-preset", "small", "--attn-dtypes", "fp32", "--collect-only", "-q")
    out = res.stdout.str()
    assert "test_case.py::test_case[B2-H4-S37x37-D32-fp32]" in out
    assert "test_case.py::test_case[B4-H4/2-varlen[17x17,0x5,40x40,9x30]-D32-causal-fp32]" in out
    assert "15 tests collected" in out


def test_backend_case_pairs_match_family_and_seeds_parametrise(pytester, run):
    pytester.makepyfile(test_pair="def test_pair(attn_backend, attn_case, attn_seed):\n    pass\n")
    res = run(
        "--attn-backends",
        "eager,eager_linear",
        "--attn-preset",
        "small,small-linear",
        "--attn-dtypes",
        "fp16",
        "--attn-seed",
        "0,3",
        "--collect-only",
        "-q",
    )
    out = res.stdout.str()
    assert "test_pair[eager-B2-H4-S37x37-D32-fp16-seed3]" in out
    assert "test_pair[eager_linear-B1-H2-T65-K32V32-nogate-h0-dhT-fp16-seed0]" in out
    assert "eager-B1-H2-T65" not in out and "eager_linear-B2-H4" not in out  # no family mismatch
    assert f"{(15 + 8) * 2} tests collected" in out


def test_header_prints_seeds_versions_device(pytester, run):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    res = run("--attn-seed", "7")
    out = res.stdout.str()
    assert f"torch {torch.__version__}" in out
    assert "seeds 7 (replay: --attn-seed 7)" in out
    assert ("device cuda" if torch.cuda.is_available() else "device cpu") in out
    res.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "option,value,message",
    [
        ("--attn-dtypes", "fp8", "--attn-dtypes: unknown dtype 'fp8'"),
        ("--attn-preset", "tiny", "--attn-preset: unknown preset 'tiny'"),
        ("--attn-seed", "x", "--attn-seed: expected non-negative integers"),
        ("--attn-backends", "nope", "--attn-backends: unknown backend 'nope'"),
        ("--attn-impl", "no_such_module:fn", "--attn-impl: cannot load 'no_such_module:fn'"),
    ],
)
def test_bad_option_is_a_usage_error_naming_it(pytester, run, option, value, message):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    res = run(option, value)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert message in res.stderr.str()


def test_markers_registered_and_gpu_skips_with_reason(pytester, run):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.gpu
        def test_on_gpu():
            pass

        @pytest.mark.slow
        def test_slow():
            pass
    """)
    res = run("--strict-markers", "-rs")
    if torch.cuda.is_available():
        res.assert_outcomes(passed=2)
    else:
        res.assert_outcomes(passed=1, skipped=1)
        res.stdout.fnmatch_lines(
            ["*needs a CUDA device; none is visible (torch.cuda.is_available() is False)*"]
        )


WRONG_MODULE = """
import torch

def scale_ignored(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
    # deliberately wrong: softmax_scale ignored (scores are q.k)
    from harness.adapters.eager import eager_attention
    return eager_attention(q, k, v, causal=causal, softmax_scale=1.0, window_size=window_size)
"""


def test_failing_vendor_impl_gives_a_readable_message(pytester, run):
    pytester.makepyfile(vendor=WRONG_MODULE)
    pytester.makepyfile(
        test_vendor="""
        def test_backend(attn_check, attn_backend, attn_case):
            attn_check(attn_backend, attn_case)
    """
    )
    case = "B2-H4-S37x37-D32-fp32"
    res = run(
        "--attn-impl",
        "vendor:scale_ignored",
        "--attn-backends",
        "eager",
        "--attn-preset",
        "small",
        "--attn-dtypes",
        "fp32",
        "-k",
        case,
        "-rfs",
    )
    res.assert_outcomes(passed=1, failed=1)
    out = res.stdout.str()
    assert f"FAILED test_vendor.py::test_backend[vendor:scale_ignored-{case}]" in out
    # tensor, error, ratio, worst element, all on readable lines
    res.stdout.fnmatch_lines(
        [
            f"*vendor:scale_ignored on {case} (seed 0, *): FAIL - out: error * the reference's *",
            "*[[]FAIL[]] out: rel-RMS error * = *x the reference's * (allowed 5x + floor *); "
            "max abs error * at [[]*[]]: got *, expected *",
        ]
    )
    assert "Traceback" not in out  # pytrace=False: the message, not the plugin's internals


def test_unsupported_pair_is_skipped_with_the_adapter_reason(pytester, run):
    pytester.makepyfile("""
        def test_backend(attn_check, attn_backend, attn_case):
            attn_check(attn_backend, attn_case)
    """)
    res = run(
        "--attn-backends",
        "sdpa_math",
        "--attn-preset",
        "small",
        "--attn-dtypes",
        "fp32",
        "-k",
        "varlen",
        "-rs",
    )
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines(["*sdpa_math: variable-length*"])


def test_result_log_streams_every_outcome_with_failure_text(pytester, run):
    # what a killed or hung run leaves behind: one line per test, written as it finishes
    pytester.makepyfile(test_mixed="""
        import pytest

        def test_ok():
            pass

        def test_bad():
            assert 1 == 2, "the failure text"

        def test_skipped():
            pytest.skip("no GPU here")

        @pytest.mark.xfail(reason="known defect", strict=True)
        def test_known():
            assert False
    """)
    log = pytester.path / "results.jsonl"
    res = run("--attn-result-log", str(log))
    res.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[-1] == {**lines[-1], "event": "finish", "exitstatus": 1}
    by_name = {r["id"].split("::")[-1]: r for r in lines[1:-1]}
    assert set(by_name) == {"test_ok", "test_bad", "test_skipped", "test_known"}
    assert by_name["test_ok"]["outcome"] == "passed" and "text" not in by_name["test_ok"]
    assert by_name["test_bad"]["outcome"] == "failed" and "the failure text" in by_name["test_bad"]["text"]
    assert by_name["test_skipped"]["outcome"] == "skipped" and "no GPU here" in by_name["test_skipped"]["text"]
    assert by_name["test_known"]["xfail"] == "known defect"
    from harness.result_log import load, summarize

    text = summarize(load(log))
    assert "1 failed" in text and "1 passed" in text and "1 xfailed" in text and "run finished" in text
    assert "FAILED (call)" in text and "the failure text" in text
    # a run cut before its end says so
    log.write_text("\n".join(log.read_text().splitlines()[:-1]))
    assert "did NOT finish" in summarize(load(log))


def test_result_log_compare_says_whether_two_runs_agree(tmp_path):
    # the several-GPUs check: the same suite on one GPU and on all gives every test the same outcome
    from harness.result_log import main

    def write(name, outcomes, finish=True):
        recs = [{"event": "start", "time": 0, "argv": []}]
        recs += [{"id": t, "when": "call", "outcome": o, "seconds": 1.0, "elapsed": 1.0} for t, o in outcomes.items()]
        if finish:
            recs.append({"event": "finish", "exitstatus": 0, "elapsed": 12.0})
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in recs))
        return str(tmp_path / name)

    one = write("one.jsonl", {"t::a": "passed", "t::b": "skipped"})
    same = write("same.jsonl", {"t::b": "skipped", "t::a": "passed"})
    other = write("other.jsonl", {"t::a": "failed", "t::c": "passed"}, finish=False)
    assert main(["--compare", one, same]) == 0
    assert main(["--compare", one, other]) == 1
    with pytest.raises(SystemExit):
        main(["--compare", one])


def test_case_ids_of_your_own_join_or_replace_the_presets(pytester, run):
    """``--attn-case``: shapes given by their ids, alone (no preset) in the id's dtype, beside --attn-preset's cases
    with it, in --attn-dtypes' dtypes when given; each once; a bad id is a usage error naming the option."""
    pytester.makepyfile(test_one="def test_one(attn_case):\n    pass\n")
    own = "B1-H2/1-S40x24-D16-causal-bf16,B1-H2-S8x8-D8-fp32"
    out = run("--attn-case", own + ",B1-H2-S8x8-D8-fp32", "--collect-only", "-q").stdout.str()
    assert "test_one[B1-H2/1-S40x24-D16-causal-bf16]" in out and "test_one[B1-H2-S8x8-D8-fp32]" in out
    assert "2 tests collected" in out
    res = run("--attn-case", own, "--attn-preset", "small", "--attn-dtypes", "fp16", "--collect-only", "-q")
    out = res.stdout.str()
    assert "test_one[B1-H2/1-S40x24-D16-causal-fp16]" in out and "test_one[B2-H4-S37x37-D32-fp16]" in out
    assert "17 tests collected" in out  # (the small preset's 15, then the two ids in fp16)
    out = run("--attn-case", own, "--collect-only").stdout.str()  # (the header: not under -q)
    assert "presets none, cases B1-H2/1-S40x24-D16-causal-bf16,B1-H2-S8x8-D8-fp32, dtypes bf16,fp32" in out
    res = run("--attn-case", "B1-H2-S8x8-D8-sideways")
    assert res.ret == pytest.ExitCode.USAGE_ERROR and "--attn-case: case id" in res.stderr.str()
