"""Tests of the in-repo Triton decode kernel (kernels.decode) against the FP64 oracle.

Without CUDA the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set in conftest before
anything imports triton): small caches, fp32 and fp16. Every case checks the output, the lse and
the cache the kernel wrote (bit for bit: appending is a copy) on fresh random inputs, with every
unused cache slot holding a finite random value a kernel that reads past a sequence would pick up.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from kernel_checks import poison_allocations

from harness.cases import DecodeCase, make_decode_inputs
from harness.oracle.decode import decode_attention as oracle_decode
from kernels.decode import decode_attention
from kernels.decode.interface import INTERPRET_CONFIG, DecodeConfig

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# Relative Frobenius error against FP64 at most this (fp16 inputs: the output rounding dominates).
ERR = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 1.6e-2}
LSE_ATOL = {"fp32": 1e-4, "fp16": 2e-3, "bf16": 2e-2}



@pytest.fixture(autouse=True)
def nan_poisoned_empty(monkeypatch):
    """Every float allocation made during a test starts as NaN, and the split's partial results come from a
    fresh 0xFF-filled workspace every call (kernel_checks.poison_allocations): an output element, or a partial
    result, the kernel forgot to write shows up."""
    poison_allocations(monkeypatch)


def _run(case: DecodeCase, seed=0, **kw):
    x = make_decode_inputs(case, seed=seed, device=DEVICE)
    ref = oracle_decode(**x.tensors(), **case.oracle_kwargs)
    k_cache, v_cache = x.k_cache.clone(), x.v_cache.clone()
    out, lse = decode_attention(x.q, k_cache, v_cache, x.k, x.v, cache_seqlens=x.cache_seqlens,
                                block_table=x.block_table, causal=case.causal, window_size=case.window,
                                softcap=case.softcap, softmax_scale=case.scale, return_lse=True, **kw)
    return x, ref, out, lse, k_cache, v_cache


def _check(case, x, ref, out, lse, k_cache, v_cache):
    assert out.shape == ref.out.shape and out.dtype == x.q.dtype
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    err = (out.double() - ref.out).norm() / ref.out.norm().clamp_min(1e-300)
    assert err <= ERR[case.dtype], f"{case.id}: output rel err {err:.2e} > {ERR[case.dtype]:.0e}"
    live = torch.isfinite(ref.lse)
    assert torch.equal(torch.isfinite(lse), live), "lse: -inf exactly on the rows that see no key"
    assert (lse[live].double() - ref.lse[live]).abs().max() <= LSE_ATOL[case.dtype]
    assert torch.equal(k_cache, ref.k_cache.to(k_cache.dtype)), "k_cache: the written cache differs"
    assert torch.equal(v_cache, ref.v_cache.to(v_cache.dtype)), "v_cache: the written cache differs"


CASES = [
    # paged, GQA 4:1, one new token, ragged lengths (0, one page, full, random)
    DecodeCase(5, 8, 2, 1, 100, 32, page_size=16, dtype="fp32"),
    DecodeCase(5, 8, 2, 1, 100, 32, page_size=16, dtype="fp16"),
    # page of 64 (a key block = a page on the GPU), MHA, no append, equal lengths
    DecodeCase(3, 4, 4, 1, 130, 16, page_size=64, append=False, ragged=False, dtype="fp16"),
    # contiguous cache, MQA, speculative decoding (4 new tokens), value dim != key dim
    DecodeCase(4, 4, 1, 4, 70, 16, d_v=32, dtype="fp32"),
    # lengths ending exactly on a page boundary (cache 32 + 0 new = 2 pages of 16)
    DecodeCase(3, 2, 2, 1, 32, 16, page_size=16, append=False, dtype="fp32"),
    # a wide group (MLA-like: many query heads on one latent head): more rows than one tile
    DecodeCase(2, 2 * INTERPRET_CONFIG.block_r_max + 8, 1, 1, 40, 16, d_v=32, page_size=16, dtype="fp32"),
    # sliding window, softcap, explicit scale, two new tokens
    DecodeCase(4, 8, 2, 2, 90, 16, page_size=16, window=(20, 0), softcap=5.0, scale=0.3, dtype="fp32"),
    # head dims that are not powers of two: read as a power-of-two part and a tail (48 = 32 + 16,
    # 40 = 32 + 8 in a tile of 16; DeepSeek's 192 = 128 + 64), value dims padded
    DecodeCase(3, 4, 2, 1, 70, 48, d_v=40, page_size=16, dtype="fp32"),
    DecodeCase(2, 4, 1, 2, 40, 40, d_v=24, dtype="fp16"),
    DecodeCase(2, 2, 1, 1, 40, 192, d_v=128, page_size=32, dtype="fp32"),
    # not causal: the new tokens see each other
    DecodeCase(3, 4, 2, 4, 33, 16, page_size=32, causal=False, dtype="fp32"),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_decode_matches_oracle(case):
    _check(case, *_run(case, seed=1))


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_split_count_does_not_change_the_answer(num_splits):
    """The combine is exact whatever the split count, including splits that own no key."""
    case = DecodeCase(4, 4, 2, 1, 60, 16, page_size=16, dtype="fp32")
    _check(case, *_run(case, seed=2, num_splits=num_splits))


def test_split_partials_come_from_the_kept_workspace(monkeypatch):
    """The split's partial results live in the kernels' workspace kept per (thread, device, stream)
    (kernels/launcher.py): a second step of the same signature reuses it, here filled with NaN in between
    (nothing is read there before the step wrote it), and both steps match the oracle."""
    import threading

    from kernels import launcher

    monkeypatch.setattr(launcher, "WORKSPACE_KEEP_BYTES", 64 << 20)  # kept (the poisoning fixture keeps none)
    handed = []
    real = launcher.workspace
    monkeypatch.setattr(launcher, "workspace", lambda like, n: handed.append((threading.get_ident(), real(like, n)))
                        or handed[-1][1])
    # 200 cached keys: three splits ask for more than one key block on the GPU (64 keys a block) and in the
    # interpreter (32); a shorter cache would fit one block and take no split (no workspace) on the GPU
    case = DecodeCase(4, 4, 2, 1, 200, 16, page_size=16, dtype="fp32")
    _check(case, *_run(case, seed=2, num_splits=3, validate=False))
    assert len(handed) == 1, f"one workspace asked for by a step with splits, got {len(handed)}"
    (thread, buf), = handed
    buf.fill_(0xFF)  # every fp32 word a NaN
    _check(case, *_run(case, seed=3, num_splits=3, validate=False))
    assert handed[1][0] == thread and handed[1][1].data_ptr() == buf.data_ptr()
    _check(case, *_run(case, seed=4, num_splits=1, validate=False))  # one split: no partials, no workspace
    assert len(handed) == 2


def _fused(case: DecodeCase, **over) -> DecodeConfig:
    """The config a call of ``case`` takes by default here (interface._Plan's choice), with the split kernel
    appending the new tokens itself (``fuse_append``)."""
    from kernels.decode.interface import CONFIG, WIDE_CONFIG

    base = INTERPRET_CONFIG if not CUDA else (CONFIG if max(case.d, case.d_v) <= 256 else WIDE_CONFIG)
    return dataclasses.replace(base, fuse_append=True, **over)


@pytest.mark.parametrize("case", [c for c in CASES if c.append], ids=str)
def test_fused_append_matches_oracle(case):
    """``fuse_append``: the split kernel reads the new tokens from k / v and writes them into the cache itself
    (no append launch); the output, lse and the written cache (bit for bit) are the oracle's, twice in a row
    (validate=False: the second call replays on a GPU)."""
    for seed in (1, 11):
        _check(case, *_run(case, seed=seed, config=_fused(case), validate=False))


@pytest.mark.parametrize("num_splits", [1, 3, 8])
def test_fused_append_with_split_boundaries_among_the_new_tokens(num_splits):
    """Four new tokens after 62 cached keys (positions 62-65) in 16-key blocks and splits: a block and a split
    boundary fall among them, so two splits each read and write their own share; paged by 16 (a page table
    entry per key) and by 32 (one per block)."""
    for page in (16, 32):
        case = DecodeCase(3, 4, 2, 4, 62, 16, page_size=page, dtype="fp32")
        _check(case, *_run(case, seed=7, num_splits=num_splits, config=_fused(case, block_n=16)))


def test_fused_append_makes_no_append_launch():
    """With ``fuse_append`` a step launches the split kernel (and the combine), not the append kernel; without
    it, the append kernel first (stand-in launches: kernels/standins.py)."""
    from kernels.standins import cpu_replays

    case = DecodeCase(2, 4, 2, 1, 40, 16, page_size=16, dtype="fp32")
    for fuse, first in ((True, "_split_kernel"), (False, "_append_kernel")):
        log = []
        with cpu_replays(log):
            x = make_decode_inputs(case, seed=1, device="cpu")
            decode_attention(x.q, x.k_cache, x.v_cache, x.k, x.v, cache_seqlens=x.cache_seqlens,
                             block_table=x.block_table, num_splits=3, validate=False,
                             config=dataclasses.replace(INTERPRET_CONFIG, fuse_append=fuse))
        names = [name for _, name, *_ in log]
        assert names[0] == first and ("_append_kernel" in names) is not fuse, names


def test_the_fused_append_is_on_unless_its_environment_knob_turns_it_off():
    """``KERNELS_DECODE_FUSE_APPEND=0`` turns it off in the default configs (read at import; a fresh process
    each); unset or 1, it is on (measured on the H100 in session 30); never in the wide config."""
    from kernels.decode import interface

    code = "from kernels.decode.interface import *; print(CONFIG.fuse_append, INTERPRET_CONFIG.fuse_append, " \
           "WIDE_CONFIG.fuse_append)"
    root = Path(__file__).resolve().parents[2]
    unset = {k: v for k, v in os.environ.items() if k != interface.FUSE_APPEND_ENV}
    for value, want in ((None, "True True False"), ("1", "True True False"), ("0", "False False False")):
        env = unset if value is None else dict(unset, **{interface.FUSE_APPEND_ENV: value})
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120,
                             env=env)
        assert run.returncode == 0 and run.stdout.split() == want.split(), run.stderr[-2000:]


def test_fused_append_compiles_for_sm90_keeping_its_programs_an_sm():
    """The fused split kernel compiled for an H100 (benchmarks/decode_ptxas.py, Triton's bundled ptxas, in its own
    process: this suite runs the interpreter) on the GQA and MQA steps: no spill, as many programs an SM as
    without the fusion (registers and shared memory), and the key loop no longer than 1.1x. (The epilogue's
    new-token block once held a whole 64-key tile in registers: 80 -> 221 registers.) Absorbed MLA's wide
    config is left out: fused, it holds one program an SM instead of two (its config keeps it off)."""
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "decode_ptxas.py"), "--json", "--cases",
                          "Llama|MQA"], capture_output=True, text=True, cwd=root, timeout=300,
                         env=dict(os.environ, TRITON_INTERPRET="0"))
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout)
    steps = {r["step"] for r in rows}
    assert len(steps) == 3 and len(rows) == 6
    for step in steps:
        off, on = (next(r for r in rows if r["step"] == step and r["fuse_append"] is f) for f in (False, True))
        assert on["spill_stores"] == 0 and on["spill_loads"] == 0, (step, on)
        assert on["programs"] >= off["programs"], (step, off, on)
        assert on["loops"][0]["count"] <= 1.1 * off["loops"][0]["count"], (step, off["loops"], on["loops"])


@pytest.mark.parametrize("block_n, page", [(16, 16), (32, 16), (64, 16), (32, 48), (64, 32), (32, 64)])
def test_any_page_size_against_any_key_block(block_n, page):
    """Blocks that divide the page read one table entry per block; pages smaller than a block (or
    not a multiple of it) take each key's page: both give the oracle's answer."""
    case = DecodeCase(3, 8, 2, 1, 150, 16, page_size=page, dtype="fp32")
    _check(case, *_run(case, seed=4, config=DecodeConfig(block_n=block_n)))


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_window_splits_share_the_window_not_the_cache(num_splits):
    """With a sliding window the splits divide the window's keys (from its first block): every
    visible key is still read once, whatever the split count."""
    case = DecodeCase(3, 4, 2, 2, 200, 16, page_size=16, window=(37, 0), dtype="fp32")
    _check(case, *_run(case, seed=5, num_splits=num_splits, config=DecodeConfig(block_n=16)))


def test_split_count_fills_the_gpu_but_caps_short_splits_and_partial_traffic():
    from kernels.decode.interface import CONFIG, split_count

    # GQA 32/8 d128 bf16, B1, a 128k cache: the multiprocessors' want (8 x 132 / 8 heads)
    assert split_count(1, 32, 8, 1, 128, 128, 1, 131072, 2, CONFIG, 132) == 132
    # a short cache: no split below min_chunk keys
    assert split_count(1, 32, 8, 1, 128, 128, 1, 1024, 2, CONFIG, 132) == 1024 // CONFIG.min_chunk
    # MQA 32/1: 32 query heads' partial results per split; capped at 5% of the bytes read
    n = split_count(16, 32, 1, 1, 128, 128, 1, 32768, 2, CONFIG, 132)
    assert n < 66 and 2 * 32 * 130 * 4 * n <= 0.05 * 32768 * 256 * 2
    # a big batch: one split (the split kernel then writes the output itself)
    assert split_count(256, 32, 8, 1, 128, 128, 1, 1024, 2, CONFIG, 132) == 1


def test_a_bad_config_is_a_valueerror():
    with pytest.raises(ValueError, match="block_n: a power of two"):
        DecodeConfig(block_n=48)
    with pytest.raises(ValueError, match="num_warps"):
        DecodeConfig(num_warps=3)


def test_empty_sequence_without_append_gives_zero_and_minus_inf_lse():
    case = DecodeCase(3, 4, 2, 1, 40, 16, page_size=16, append=False, dtype="fp32")
    assert case.cache_seqlens[1] == 0
    x, ref, out, lse, *_ = _run(case)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.isneginf(lse[1]).all() and torch.isfinite(lse[0]).all() and torch.isfinite(lse[2]).all()


def _inputs(case=None):
    case = case or DecodeCase(2, 4, 2, 1, 40, 16, page_size=16, dtype="fp32")
    return make_decode_inputs(case, device=DEVICE)


def _call(x, **over):
    kw = dict(cache_seqlens=x.cache_seqlens, block_table=x.block_table)
    kw.update(over)
    args = [over.pop("q", x.q), over.pop("k_cache", x.k_cache), over.pop("v_cache", x.v_cache),
            over.pop("k", x.k), over.pop("v", x.v)]
    for name in ("q", "k_cache", "v_cache", "k", "v"):
        kw.pop(name, None)
    return decode_attention(*args, **kw)


@pytest.mark.parametrize(
    "over, words",
    [
        (lambda x: {"block_table": x.block_table + 1000}, "block_table: entries must be pages"),
        (lambda x: {"cache_seqlens": x.cache_seqlens + 1000}, "above the cache's capacity"),
        (lambda x: {"cache_seqlens": x.cache_seqlens[:1]}, "cache_seqlens: expected"),
        (lambda x: {"k": x.k[:, :, :1]}, "k / v: expected"),
        (lambda x: {"v": None}, "give both new tensors or neither"),
        (lambda x: {"k_cache": x.k_cache.half()}, "must be q's"),
        (lambda x: {"q": x.q[..., :8].contiguous()}, "head dim 16 does not match q's 8"),
        (lambda x: {"k_cache": x.k_cache[:, :8].contiguous(), "v_cache": x.v_cache[:, :8].contiguous()},
         "page size 8 is not a multiple of 16"),
        (lambda x: {"q": x.q[:, :, :3]}, "must be a multiple of the cache's heads"),
    ],
    ids=["table-out-of-range", "lengths-over-capacity", "lengths-shape", "new-k-heads", "k-without-v",
         "cache-dtype", "head-dim", "page-size", "heads"],
)
def test_bad_input_is_a_valueerror_naming_the_argument(over, words):
    x = _inputs()
    with pytest.raises(ValueError, match=words):
        _call(x, **over(x))


@pytest.mark.gpu
def test_pages_past_two_to_the_31_elements_are_addressed_with_64_bit_offsets():
    """A serving pool is often above 2**31 elements (here 4.3e9: 2**20 + 8 pages of 16 x 1 x 128 in
    fp16, 8 GiB per cache); a page table pointing at its last pages must read and write those, not
    wrap around to the start of the pool."""
    if not CUDA:
        pytest.skip("needs a CUDA device with 17 GiB free (two fp16 caches of 2**31 + elements)")
    case = DecodeCase(2, 4, 1, 1, 40, 128, page_size=16, dtype="fp16")
    x = make_decode_inputs(case, seed=6, device=DEVICE)
    pages = 2**20 + 8
    try:
        k_pool = torch.randn(pages, 16, 1, 128, device=DEVICE, dtype=torch.float16)
        v_pool = torch.randn_like(k_pool)
    except torch.OutOfMemoryError:
        pytest.skip("not enough GPU memory for two 8 GiB caches")
    used = x.block_table.long()
    far = used + (pages - 1 - int(used.max()))  # the same layout, moved to the pool's end
    k_pool[far.flatten()] = x.k_cache[used.flatten()]
    v_pool[far.flatten()] = x.v_cache[used.flatten()]
    table = far.to(torch.int32)
    ref = oracle_decode(x.q, x.k_cache, x.v_cache, x.cache_seqlens, x.block_table, x.k, x.v, **case.oracle_kwargs)
    out = decode_attention(x.q, k_pool, v_pool, x.k, x.v, cache_seqlens=x.cache_seqlens, block_table=table,
                           causal=case.causal)
    err = (out.double() - ref.out).norm() / ref.out.norm()
    assert err <= ERR["fp16"], f"rel err {err:.2e}: the far pages were not the ones read"
    assert torch.equal(k_pool[far.flatten()], ref.k_cache[used.flatten()].to(k_pool.dtype)), "new keys not written to the far pages"
