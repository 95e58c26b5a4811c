"""Decode (attention over a KV cache) through the harness: cases and inputs, the verification runner on every decode backend (correct ones
pass, each wrong one fails for its reason), the vendor peers through stand-in packages, the FLOP
and byte model, and timing."""

import math
import sys
import types

import pytest
import torch
import wrong_impls as w

from harness.adapters import registry
from harness.adapters.decode import FlashAttnCuteDecode, FlashAttnKVCache, _probe
from harness.adapters.user import make_callable_adapter
from harness.cases import DecodeCase, case_from_id, make_decode_inputs
from harness.check.verify import verify
from harness.oracle.decode import decode_attention
from harness.perf import flops
from harness.presets import preset

PAGED = DecodeCase(5, 8, 2, 1, 100, 32, page_size=16)
CONTIG = DecodeCase(4, 4, 1, 4, 70, 16, d_v=32)
NO_APPEND = DecodeCase(3, 4, 4, 1, 64, 32, page_size=32, append=False)


# --------------------------------------------------------------------------------------------
# Cases and inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", preset("small-decode") + preset("decode"), ids=str)
def test_case_ids_read_back(case):
    assert case_from_id(case.id) == case


def test_ragged_lengths_cover_full_empty_and_one_page():
    lens = PAGED.cache_seqlens
    assert lens[:3] == (100, 0, 16) and all(0 <= n <= 100 for n in lens)
    # the same shape paged otherwise or contiguous holds the same lengths (timings compare)
    assert DecodeCase(5, 8, 2, 1, 100, 32, page_size=64).cache_seqlens[3:] == lens[3:]
    assert DecodeCase(5, 8, 2, 1, 100, 32, ragged=False).cache_seqlens == (100,) * 5


@pytest.mark.parametrize("bad, words", [
    (dict(heads_q=6, heads_k=4), "multiple of heads_k"),
    (dict(page_size=-1), "page_size"),
    (dict(cache_len=-1), "positive"),
    (dict(dtype="int8"), "dtype"),
])
def test_bad_case_is_a_valueerror(bad, words):
    kw = dict(batch=2, heads_q=4, heads_k=2, seqlen_q=1, cache_len=10, d=16) | bad
    with pytest.raises(ValueError, match=words):
        DecodeCase(**kw)


def test_paged_inputs_use_a_shuffled_pool_with_every_slot_finite():
    x = make_decode_inputs(PAGED, seed=3)
    table = x.block_table
    assert table.dtype == torch.int32 and table.shape == (5, PAGED.pages_per_seq)
    assert len(set(table.flatten().tolist())) == table.numel()  # no page shared
    assert not torch.equal(table.flatten().sort().values, table.flatten())  # not in pool order
    assert int(table.max()) < x.k_cache.shape[0]
    assert torch.isfinite(x.k_cache).all() and x.k_cache.abs().sum() > 0  # unused slots too: never zeros
    again = make_decode_inputs(PAGED, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(x.tensors().values(), again.tensors().values()))


# --------------------------------------------------------------------------------------------
# The verification runner
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["decode_eager", "decode_sdpa", "triton_decode"])
@pytest.mark.parametrize("case", [PAGED, CONTIG, NO_APPEND, PAGED.with_dtype("fp16")], ids=str)
def test_correct_decode_backends_pass(backend, case):
    r = verify(backend, case)
    assert r.status == "pass", r.message()
    assert r.property("cache_write").status == "pass"
    assert r.property("inputs_unchanged").status == "pass"  # q, cache_seqlens, block_table, k, v


def _user_decode(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                 window_size=(-1, -1), softmax_scale=None, softcap=0.0):
    from kernels.decode import decode_attention as kernel

    return kernel(q, k_cache, v_cache, k, v, cache_seqlens=cache_seqlens, block_table=block_table, causal=causal,
                  window_size=window_size, softmax_scale=softmax_scale, softcap=softcap, return_lse=True)


def test_user_decode_callable_passes_and_declares_what_it_lacks():
    adapter = make_callable_adapter(_user_decode, family="decode", name="my_decode")
    assert adapter.family == "decode" and not adapter.differentiable
    for case in (PAGED, CONTIG):
        r = verify(adapter, case)
        assert r.status == "pass", r.message()

    def contiguous_only(*a, **kw):
        return _user_decode(*a, **kw)

    contiguous_only.attn_capabilities = {"paged": False, "append": False}
    limited = make_callable_adapter(contiguous_only, family="decode")
    assert limited.supports(PAGED, "cpu") == "declares no paged-cache support"
    assert limited.supports(DecodeCase(2, 4, 2, 1, 10, 16, append=True), "cpu") == "declares no cache-append support"
    assert limited.supports(DecodeCase(2, 4, 2, 1, 10, 16, append=False), "cpu") is None


@pytest.mark.parametrize(
    "impl, case, failing",
    [
        (w.DecodeWritesWrongSlot(), PAGED, "cache_write"),
        (w.DecodeForgetsToWrite(), PAGED, "cache_write"),
        (w.DecodeForgetsToWrite(), CONTIG, "cache_write"),
        (w.DecodeIgnoresBlockTable(), PAGED, "out"),
        (w.DecodeReadsWholePages(), PAGED, "out"),
    ],
    ids=lambda x: getattr(x, "name", None) or getattr(x, "id", x),
)
def test_wrong_decode_fails_for_its_reason(impl, case, failing):
    r = verify(impl, case)
    assert r.status == "fail", r.message()
    assert failing in r.failures, (failing, r.failures)


def test_wrong_slot_is_caught_by_the_cache_check_alone():
    """Its own output is right (it reads back what it wrote): only the cache check can see it."""
    r = verify(w.DecodeWritesWrongSlot(), PAGED)
    assert r.failures == ["cache_write"] or set(r.failures) == {"cache_write"}, r.failures
    assert "slot(s) differ" in r.property("cache_write").detail


# --------------------------------------------------------------------------------------------
# Vendor peers, driven through stand-in packages with their calling conventions
# --------------------------------------------------------------------------------------------


def _fake_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                       softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                       return_softmax_lse=False):
    """flash-attn 2's flash_attn_with_kvcache, computed with the oracle (and FA's +inf lse on
    rows that see no key)."""
    res = decode_attention(q, k_cache, v_cache, cache_seqlens, block_table, k, v, causal=causal,
                           softmax_scale=softmax_scale, window_size=window_size, softcap=softcap)
    k_cache.copy_(res.k_cache)
    v_cache.copy_(res.v_cache)
    lse = torch.where(torch.isneginf(res.lse), math.inf, res.lse).float()
    out = res.out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out


def _fake_fa4_varlen(q, k, v, *, seqused_k=None, page_table=None, softmax_scale=None, causal=False,
                     window_size=(None, None), softcap=0.0, return_lse=False):
    """flash-attn-4's flash_attn_varlen_func over a cache: no append, seqused_k keys per sequence, +inf lse
    on rows that see no key."""
    assert seqused_k.dtype == torch.int32 and (page_table is None or page_table.dtype == torch.int32)
    window = tuple(-1 if w is None else w for w in window_size)
    res = decode_attention(q, k, v, seqused_k, page_table, causal=causal, softmax_scale=softmax_scale,
                           window_size=window, softcap=softcap)
    return res.out.to(q.dtype), torch.where(torch.isneginf(res.lse), math.inf, res.lse).float()  # FA: +inf


@pytest.fixture
def vendor(monkeypatch):
    """Stand-in flash_attn and flash_attn.cute.interface modules; the adapters' CUDA gate off."""
    fa = types.ModuleType("flash_attn")
    fa.flash_attn_with_kvcache = _fake_with_kvcache
    cute = types.ModuleType("flash_attn.cute")
    iface = types.ModuleType("flash_attn.cute.interface")
    iface.flash_attn_varlen_func = _fake_fa4_varlen
    for name, mod in (("flash_attn", fa), ("flash_attn.cute", cute), ("flash_attn.cute.interface", iface)):
        monkeypatch.setitem(sys.modules, name, mod)
    for cls in (FlashAttnKVCache, FlashAttnCuteDecode):
        monkeypatch.setattr(cls, "needs_cuda", False)
        monkeypatch.setattr(cls, "dtypes", ("fp32", "fp16", "bf16"))
    _probe.cache_clear()
    yield
    _probe.cache_clear()


@pytest.mark.parametrize("case", [CONTIG, DecodeCase(4, 8, 2, 2, 300, 16, page_size=256),
                                  DecodeCase(4, 8, 2, 1, 300, 16, page_size=16, append=False)], ids=str)
def test_vendor_decode_adapters_speak_their_packages(vendor, case):
    for name in ("flash_attn_kvcache", "flash_attn_cute_decode"):
        adapter = registry.get(name)
        reason = adapter.supports(case, "cpu")
        if name == "flash_attn_kvcache" and case.paged and case.page_size % 256:
            assert reason == "flash_attn (FA2) needs pages of a multiple of 256 tokens, not 16"
            continue
        assert reason is None
        r = verify(adapter, case)
        assert r.status == "pass", (name, r.message())


@pytest.mark.parametrize("case", [PAGED, DecodeCase(4, 8, 2, 2, 90, 16, page_size=16, window=(20, 0), softcap=5.0),
                                  DecodeCase(3, 4, 2, 4, 33, 16, page_size=32, causal=False),
                                  DecodeCase(4, 8, 2, 1, 60, 16, page_size=16, append=False)], ids=str)
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile", "ignore:return_lse is deprecated")
def test_flex_decode_reads_the_pool_through_its_page_mask(monkeypatch, case):
    """flex_decode's page-table mask and pool view, run by eager flex_attention on the CPU (the GPU
    runs the same arguments compiled): every check of the runner passes, the written cache too."""
    from harness.adapters.decode import FlexPagedDecode

    monkeypatch.setattr(FlexPagedDecode, "compiled", False)
    monkeypatch.setattr(FlexPagedDecode, "needs_cuda", False)
    adapter = registry.get("flex_decode")
    assert adapter.supports(case, "cpu") is None
    r = verify(adapter, case)
    assert r.status == "pass", r.message()
    assert r.property("cache_write").status == "pass"


def test_flex_decode_refusals():
    adapter = registry.get("flex_decode")
    assert adapter.supports(PAGED, "cpu") == "needs CUDA (FlexAttention's paged decode is a compiled GPU kernel)"


def test_vendor_decode_says_why_when_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # import fails: not installed
    _probe.cache_clear()
    try:
        assert registry.get("flash_attn3_kvcache").supports(PAGED, "cpu") == "flash_attn_interface (FA3) not installed"
    finally:
        _probe.cache_clear()


# --------------------------------------------------------------------------------------------
# FLOPs, bytes, timing
# --------------------------------------------------------------------------------------------


def test_decode_work_model():
    case = DecodeCase(3, 8, 2, 1, 50, 16, d_v=32, page_size=16)
    lens = case.cache_seqlens
    assert flops.decode_flops(case) == 2 * sum(n + 1 for n in lens) * 8 * (16 + 32)
    e = 4
    want = (3 * 8 * 16 * e + sum(lens) * 2 * (16 + 32) * e + 2 * 3 * 2 * (16 + 32) * e
            + 3 * 4 + 3 * case.pages_per_seq * 4 + 3 * 8 * 32 * e + 3 * 8 * 4)
    assert flops.decode_bytes(case) == want
    windowed = DecodeCase(3, 8, 2, 1, 50, 16, d_v=32, page_size=16, window=(9, 0))
    assert flops.decode_bytes(windowed) < want  # keys the window hides need not be read
    with pytest.raises(ValueError, match="forward-only"):
        flops.work(case, "bwd")


def test_decode_timing_repeats_the_same_step():
    """Each timed call appends the same tokens at the same slots: repetitions see identical caches."""
    from harness.perf.timing import TimerOptions, time_adapter

    x = make_decode_inputs(PAGED, seed=0)
    before = x.k_cache.clone()
    t = time_adapter(registry.get("decode_eager"), PAGED, "fwd", inputs=x,
                     options=TimerOptions(reps=3, warmup_ms=0, settle_max_ms=0))
    assert t.reps == 3 and t.median_ms > 0
    written = decode_attention(**make_decode_inputs(PAGED, seed=0).tensors(), **PAGED.oracle_kwargs).k_cache
    assert torch.equal(x.k_cache, written) and not torch.equal(before, written)


def test_flash_attn_cute_decode_shim_for_accept(vendor):
    """``harness.accept.shims:flash_attn_cute_decode`` (what ``accept --family decode`` is given to judge
    flash-attn-4) speaks the decode contract: the cache appended in place; lse as flash-attn-4 writes it,
    +inf on empty rows, declared (``lse_empty_rows``) for the judge to map after the call."""
    from harness.accept.shims import flash_attn_cute_decode

    case = DecodeCase(4, 8, 2, 1, 60, 16, page_size=16)
    x = make_decode_inputs(case, seed=5)
    ref = decode_attention(**x.tensors(), **case.oracle_kwargs)
    out, lse = flash_attn_cute_decode(x.q, x.k_cache, x.v_cache, x.k, x.v, cache_seqlens=x.cache_seqlens,
                                      block_table=x.block_table)
    torch.testing.assert_close(out.double(), ref.out, rtol=1e-6, atol=1e-6)
    assert torch.equal(x.k_cache, ref.k_cache) and torch.equal(x.v_cache, ref.v_cache)
    empty = DecodeCase(3, 4, 2, 1, 40, 16, page_size=16, append=False)  # sequence 1 holds no key
    y = make_decode_inputs(empty, seed=0)
    _, lse = flash_attn_cute_decode(y.q, y.k_cache, y.v_cache, cache_seqlens=y.cache_seqlens,
                                    block_table=y.block_table)
    assert torch.isposinf(lse[1]).all() and torch.isfinite(lse[0]).all()
    assert flash_attn_cute_decode.attn_capabilities["lse_empty_rows"] == math.inf
