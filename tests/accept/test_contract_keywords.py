"""Every keyword of the calling contracts, and the test that catches a kernel that ignores it.

``KEYWORDS`` lists, per family, each keyword the harness passes (or leaves out) and each property
of the inputs a kernel must honour; for each, a case of the ``small`` / ``small-linear`` / ``small-decode`` / ``small-fp8`` presets
that exercises it (the adapter matrix and ``harness run`` use those presets; the acceptance
profiles hold the same kinds of case) and a callable that ignores exactly that keyword
(tests/accept/impls/). ``test_ignoring_a_keyword_is_caught`` verifies each such callable on its
case against the oracle and asserts it fails for its own reason.

docs/contract-keywords.md is this table, generated: ``python tests/accept/test_contract_keywords.py``
writes it, and ``test_the_keyword_table_in_docs_is_generated_from_this_file`` fails when the two
differ. A new keyword of the contract gets a row here (and a wrong callable), not a line by hand.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

IMPLS = Path(__file__).resolve().parent / "impls"
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "contract-keywords.md"
TEST = "tests/accept/test_contract_keywords.py::test_ignoring_a_keyword_is_caught"


class Row(NamedTuple):
    family: str
    keyword: str
    what: str  # what the harness passes
    case: str  # the case (small / small-linear preset id) that exercises it
    impl: str  # MODULE:CALLABLE in tests/accept/impls that ignores it
    fails: str  # the check that must fail there
    passes: str | None  # a case where ignoring the keyword is harmless: the callable must pass there


SM_PLAIN = "B2-H4/2-S40x40-D32-causal-scale1-fp32"  # causal, scale passed, contiguous
LIN_PLAIN = "B1-H2-T48-K32V32-g(n=1)-h0-dhT-scale1-fp32"  # g, h0, scale passed, contiguous
DEC_PAGED = "B5-H8/2-Q1-L100r-P16-new-D32-fp32"  # paged GQA, ragged, one new token, scale omitted
DEC_CONTIG = "B4-H4/1-Q4-L70r-contig-new-D16v32-fp32"  # contiguous cache, 4 new tokens (causal matters)
DEC_NO_APPEND = "B3-H4-Q1-L64r-P32-D32-fp32"  # nothing appended
DEC_SCALE = "B3-H4/2-Q3-L33r-P16-new-D16-nocausal-scale0.0625-fp32"
DEC_WINDOW = "B4-H8/2-Q2-L90r-P16-new-D16-win20x0-cap5-fp32"
FP8 = "B2-H4/2-S45x70-D32-causal-e4m3-bf16"  # e4m3 q, k, v with per-tensor descales, bf16 out
NOLSE = "B1-H4/2-S40x40-D32-causal-nolse-fp32"  # out alone asked for (return_lse=False)
POSITIONAL = "B1-H2-S24x24-D16-causal-scale0.5-positional-fp32"  # scale and causal passed by position

KEYWORDS: tuple[Row, ...] = (
    Row("softmax", "causal", "`causal=True` on causal cases", "B2-H4-S64x64-D64-causal-fp32",
        "ignores:ignores_causal", "out", "B2-H4-S37x37-D32-fp32"),
    Row("softmax", "softmax_scale (passed)", "`softmax_scale=1.0`, `1/16` on the scale cases",
        "B2-H4/2-S40x40-D32-causal-scale1-fp32", "scale_fixed_default:flash_attn_func", "out", "B2-H4-S37x37-D32-fp32"),
    Row("softmax", "softmax_scale (omitted)", "nothing: the default must be 1/sqrt(d)", "B2-H4-S37x37-D32-fp32",
        "wrong_default_scale:flash_attn_func", "out", SM_PLAIN),
    Row("softmax", "window_size", "`window_size=(left, right)` (-1 unbounded)", "B2-H2-S48x48-D32-win8x4-fp32",
        "ignores:ignores_window", "out", SM_PLAIN),
    Row("softmax", "softcap", "`softcap=` on softcap cases only", "B1-H2-S40x40-D32-cap5-fp32",
        "ignores:ignores_softcap", "out", SM_PLAIN),
    Row("softmax", "cu_seqlens_q, cu_seqlens_k", "packed (total, H, D) inputs and int32 offsets (varlen)",
        "B4-H4/2-varlen[17x17,0x5,40x40,9x30]-D32-causal-fp32", "ignores:ignores_cu_seqlens", "out", SM_PLAIN),
    Row("softmax", "strides (transposed views)", "q, k, v as transposed views of (B, H, S, D) buffers",
        "B1-H4/2-S40x70-D32-causal-transposed-fp32", "contiguous_only:flash_attn_func", "out", SM_PLAIN),
    Row("softmax", "storage offset", "q, k, v one element into their buffers (16-byte misaligned)",
        "B1-H4/2-S26x26-D32-causal-offset-fp32", "contiguous_only:flash_attn_func", "out", SM_PLAIN),
    Row("softmax", "strides (packed qkv)", "q, k, v as views `packed[:, :, i]` of one (B, S, 3, H, D) tensor",
        "B2-H4-S33x33-D32-causal-qkvpacked-fp32", "contiguous_only:flash_attn_func", "out", SM_PLAIN),
    Row("softmax", "positional form", "after q, k, v the same values by position, in the signature's (or the "
        "declared `positional`) order: flash-attn 2's `(q, k, v, dropout_p, softmax_scale, causal, ...)`",
        POSITIONAL, "ignores:positional_misread", "out", SM_PLAIN),
    Row("softmax", "return_lse", "`return_lse=False` on the out-only case (where the signature has it): out alone",
        NOLSE, "ignores:wrong_without_lse", "out", SM_PLAIN),
    Row("softmax", "q_descale", "(B, Hk) fp32 factors of the e4m3 q (FP8 cases)", FP8,
        "fp8_impls:ignores_q_descale", "out", None),
    Row("softmax", "k_descale", "(B, Hk) fp32 factors of the e4m3 k (FP8 cases)", FP8,
        "fp8_impls:ignores_k_descale", "out", None),
    Row("softmax", "v_descale", "(B, Hk) fp32 factors of the e4m3 v (FP8 cases)", FP8,
        "fp8_impls:ignores_v_descale", "out", None),
    Row("linear", "g", "per-step log-decay (B, T, H)", "B2-H2-T127-K32V32-g(n=1)-h0-dhT-fp32",
        "ignores:linear_ignores_g", "out", "B1-H2-T70-K32V32-g_gamma(n=1)-fp32"),
    Row("linear", "g_gamma", "per-head constant log-decay (H,)", "B1-H2-T70-K32V32-g_gamma(n=1)-fp32",
        "ignores:linear_ignores_g_gamma", "out", LIN_PLAIN),
    Row("linear", "scale (passed)", "`scale=1.0`, `1/16` on the scale cases", LIN_PLAIN,
        "ignores:linear_ignores_scale", "out", "B2-H2-T127-K32V32-g(n=1)-h0-dhT-fp32"),
    Row("linear", "scale (omitted)", "nothing: the default must be 1/sqrt(K)", "B2-H2-T127-K32V32-g(n=1)-h0-dhT-fp32",
        "ignores:linear_wrong_default_scale", "out", LIN_PLAIN),
    Row("linear", "initial_state", "(B, H, K, V) fp32 on h0 cases", "B1-H2-T65-K32V32-nogate-h0-dhT-fp32",
        "ignores:linear_ignores_initial_state", "out", "B1-H2-T70-K32V32-g_gamma(n=1)-fp32"),
    Row("linear", "output_final_state", "`output_final_state=True`: the state must come back",
        "B1-H2-T70-K32V32-g_gamma(n=1)-fp32", "ignores:linear_ignores_output_final_state", "contract", None),
    Row("linear", "strides, storage offset", "q, k, v, g, h0 as transposed views, or one element in",
        "B1-H2-T33-K32V32-nogate-h0-dhT-offset-fp32", "ignores:linear_contiguous_only", "out", LIN_PLAIN),

    Row("decode", "block_table", "int32 (B, pages) into a shuffled page pool", DEC_PAGED,
        "decode_impls:ignores_block_table", "out", DEC_CONTIG),
    Row("decode", "cache_seqlens", "int32 (B,): each sequence's cache length (0 and one exact page included)",
        DEC_PAGED, "decode_impls:reads_whole_pages", "out", None),
    Row("decode", "k, v (appended)", "new tokens to write into the cache at cache_seqlens, in place",
        DEC_PAGED, "decode_impls:writes_wrong_slot", "cache_write", DEC_NO_APPEND),
    Row("decode", "causal", "`causal=True`: new tokens see the cache and the new tokens before them", DEC_CONTIG,
        "decode_impls:ignores_causal", "out", DEC_PAGED),
    Row("decode", "softmax_scale (passed)", "`softmax_scale=1/16` on the scale case", DEC_SCALE,
        "decode_impls:ignores_scale", "out", DEC_PAGED),
    Row("decode", "softmax_scale (omitted)", "nothing: the default must be 1/sqrt(d)", DEC_PAGED,
        "decode_impls:wrong_default_scale", "out", DEC_SCALE),
    Row("decode", "window_size", "`window_size=(left, right)` (-1 unbounded)", DEC_WINDOW,
        "decode_impls:ignores_window", "out", DEC_PAGED),
    Row("decode", "softcap", "`softcap=` on softcap cases only", DEC_WINDOW,
        "decode_impls:ignores_softcap", "out", DEC_PAGED),
)


def _case(case_id: str):
    from harness.presets import preset

    by_id = {c.id: c for c in preset("small") + preset("small-linear") + preset("small-decode") + preset("small-fp8")}
    return by_id[case_id]


@pytest.fixture(scope="module", autouse=True)
def _impls_importable():
    """The impls directory on sys.path while this module runs; its modules gone afterwards (other
    tests assert that the acceptance judge never imports them)."""
    before = set(sys.modules)
    sys.path.insert(0, str(IMPLS))
    yield
    sys.path.remove(str(IMPLS))
    for name in set(sys.modules) - before:
        if getattr(sys.modules[name], "__file__", "") and str(IMPLS) in str(sys.modules[name].__file__):
            del sys.modules[name]


def _callable(spec: str):
    mod, fn = spec.split(":")
    return getattr(importlib.import_module(mod), fn)


@pytest.mark.parametrize("row", KEYWORDS, ids=[f"{r.family}-{r.keyword}" for r in KEYWORDS])
def test_ignoring_a_keyword_is_caught(row):
    from harness.adapters.user import make_callable_adapter
    from harness.check.verify import verify

    case = _case(row.case)
    adapter = make_callable_adapter(_callable(row.impl), family=row.family, name=row.impl)
    res = verify(adapter, case, seed=0, device="cpu")
    assert res.status == "fail" and row.fails in res.failures, res.message()
    if row.passes is not None:  # ... and it is right where the keyword does not matter: it ignores only that
        ok = verify(adapter, _case(row.passes), seed=0, device="cpu")
        assert ok.status == "pass", ok.message()


def table() -> str:
    """docs/contract-keywords.md."""
    lines = [
        "# The calling contracts, keyword by keyword",
        "",
        "Generated by `python tests/accept/test_contract_keywords.py` from its `KEYWORDS` table; do not edit by",
        "hand (`test_the_keyword_table_in_docs_is_generated_from_this_file` fails when the two differ).",
        "",
        "For each keyword the harness passes (or leaves out), and each property of the inputs a kernel",
        "must honour: the case that exercises it (presets `small` / `small-linear` / `small-decode` / `small-fp8`; the acceptance",
        "profiles hold cases of the same kinds), a callable that ignores exactly that keyword",
        "(`tests/accept/impls/`), what fails when it does, and the test that asserts so",
        f"(`{TEST}[<family>-<keyword>]`).",
        "",
        "| family | keyword | what the harness passes | case | ignored by | fails |",
        "|---|---|---|---|---|---|",
    ]
    for r in KEYWORDS:
        lines.append(f"| {r.family} | `{r.keyword}` | {r.what} | `{r.case}` | `{r.impl}` | {r.fails} |")
    lines += ["", "flash-attn's `max_seqlen_q` / `max_seqlen_k` are hints passed with the true maxima: a kernel",
              "that ignores them is right, so they have no row.", ""]
    return "\n".join(lines)


def test_the_keyword_table_in_docs_is_generated_from_this_file():
    assert DOC.read_text() == table(), f"regenerate: python {Path(__file__).relative_to(ROOT)} > {DOC.relative_to(ROOT)}"


if __name__ == "__main__":
    sys.stdout.write(table())
