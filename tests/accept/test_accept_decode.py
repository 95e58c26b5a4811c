"""The acceptance command on decode callables (``--family decode``, flash-attn's
``flash_attn_with_kvcache``): a correct one is accepted under ``inference`` with the cache it wrote
checked slot by slot; one that writes the wrong slot, one that ignores the page table and one that
cannot take a paged cache are rejected, each for its reason. CPU-sized variant, plain-torch callables
(tests/accept/impls/decode_impls.py)."""

from __future__ import annotations

import pytest
from test_accept import accept, by_case, failed

PAGED = "B5-H8/2-Q1-L100r-P16-new-D32-fp32"  # GQA, ragged (full, empty, one page, random), 1 new token
SPEC = "B4-H4/1-Q4-L70r-P32-new-D32-fp32"  # MQA, 4 new tokens
CONTIG = "B3-H4-Q1-L64r-contig-D32-fp32"  # contiguous MHA, nothing appended
WINDOW = "B4-H8/2-Q2-L90r-P16-new-D16-win20x0-cap5-fp32"  # optional under inference (window, softcap)


def _accept(tmp_path, monkeypatch, fn, *cases, extra=()):
    args = ["--impl", f"decode_impls:{fn}", "--family", "decode", "--profile", "inference"]
    for c in cases:
        args += ["--case", c]
    return accept(tmp_path, monkeypatch, *args, *extra)


def test_correct_decode_is_accepted_with_the_cache_checked(tmp_path, monkeypatch, capsys):
    code, rep, out = _accept(tmp_path, monkeypatch, "attn", PAGED, SPEC, CONTIG, WINDOW, extra=("--speed",))
    assert code == 0, capsys.readouterr().out
    assert rep["verdict"] == "ACCEPTED" and rep["profile"]["name"] == "inference-cpu"
    assert "paged" in rep["profile"]["required_features"]
    for c in rep["cases"]:
        assert c["status"] == "pass"
        props = {p["name"]: p["status"] for s in c["seeds"] for p in s["properties"]}
        assert props["cache_write"] == "pass"
        assert {t["name"] for s in c["seeds"] for t in s["tensors"]} >= {"out", "lse"}
    md = (out / "report.md").read_text()
    assert "fwd GB/s" in md and "decode_sdpa" in md  # the speed section: bandwidth, the gather+SDPA baseline


@pytest.mark.parametrize("fn, check, cases", [
    ("writes_wrong_slot", "cache_write", (PAGED, SPEC)),  # its output is right: only the cache shows it
    ("ignores_block_table", "out", (PAGED,)),
])
def test_wrong_decode_is_rejected_for_its_reason(tmp_path, monkeypatch, fn, check, cases):
    code, rep, _ = _accept(tmp_path, monkeypatch, fn, *cases)
    assert code == 1 and rep["verdict"] == "REJECTED"
    for case_id in cases:
        assert check in failed(by_case(rep)[case_id]), by_case(rep)[case_id]["failed_checks"]


def test_decode_without_a_paged_cache_is_rejected_under_inference(tmp_path, monkeypatch):
    code, rep, _ = _accept(tmp_path, monkeypatch, "contiguous_only", PAGED, CONTIG)
    assert code == 1
    cases = by_case(rep)
    assert "unsupported_required" in failed(cases[PAGED])
    assert cases[CONTIG]["status"] == "pass"  # what it does do is still checked
