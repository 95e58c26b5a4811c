"""Tests of the wide-head-dim kernels (kernels/flash_attn/wide.py: d_qk / d_v above 256, absorbed MLA)
against the FP64 oracle.

On a machine without CUDA they run under Triton's interpreter (TRITON_INTERPRET=1) with small tiles
(16 rows / keys, head-dim chunks and output slices of wide.INTERPRET_BLOCK_K / _W = 64), so head dims
like 80, 96 and 288 already take several chunks, a masked tail chunk and a partial last slice: the
same code paths as 576 / 512 on the GPU's 64-wide chunks. One true 576 / 512 case runs at a tiny
seqlen. fp32 and fp16 (the interpreter's bf16 tl.dot is wrong, triton issue 11584).

Tolerance rule as tests/kernels/test_flash_attn.py (one rule for both: tests/kernels/kernel_checks.py):
the error against the oracle may be at most ERR_FACTOR x that of a plain torch reference in the same
dtype (fp32 softmax), plus a per-dtype floor.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from kernel_checks import assert_matches_oracle, poison_allocations, rel_err

from harness.adapters.eager import eager_attention
from harness.oracle import softmax_attention
from kernels.flash_attn import wide
from kernels.flash_attn.wide import (
    block_k,
    chunk_rows,
    keys_split,
    slice_width,
    wide_bwd,
    wide_fwd,
    wide_reason,
)

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True)
def nan_poisoned_empty(monkeypatch):
    poison_allocations(monkeypatch)  # the workspace included: a read of an unwritten element fails


def check_wide(b, sq, sk, hq, hk, d, dv, dtype, causal=False, window=(-1, -1), softcap=0.0, seed=0, **launch):
    """wide_fwd + wide_bwd on fresh N(0, 1) inputs against the FP64 oracle: out, lse, dq, dk, dv."""
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device=DEVICE, dtype=dtype)  # noqa: E731
    q, k, v, do = mk(b, sq, hq, d), mk(b, sk, hk, d), mk(b, sk, hk, dv), mk(b, sq, hq, dv)
    scale = d ** -0.5
    kw = dict(softmax_scale=scale, causal=causal, window_left=window[0], window_right=window[1], softcap=softcap)
    out, lse = wide_fwd(q, k, v, **kw, workspace_bytes=launch.get("workspace_bytes"))
    dq, dk, dv_ = wide_bwd(do, q, k, v, out, lse, **kw, **launch)
    orc = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, window_size=window,
                            softcap=softcap)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref_out, _ = eager_attention(qr, kr, vr, causal=causal, softmax_scale=scale, window_size=window, softcap=softcap)
    ref_out.backward(do)

    assert out.shape == (b, sq, hq, dv) and out.dtype == dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    assert_matches_oracle(out, lse, (dq, dk, dv_), ref_out, (qr.grad, kr.grad, vr.grad), orc, dtype)
    return out, lse, dq, dk, dv_


# (B, Sq, Sk, Hq, Hk, d_qk, d_v, dtype, causal): every shape off the interpreter's 16-row / 16-key
# tiles and its 64-wide head-dim chunks (80 = 64 + 16, 96 = 64 + 32, 288 = 4 x 64 + 32).
CASES = {
    "MQA-causal-Sq<Sk-96v80": (1, 21, 30, 4, 1, 96, 80, torch.float32, True),
    "GQA4/2-80v96": (1, 19, 23, 4, 2, 80, 96, torch.float32, False),
    "MHA-causal-Sq>Sk-288v256": (1, 20, 13, 2, 2, 288, 256, torch.float32, True),  # 7 rows see no key
    "MQA-causal-96v64-fp16": (2, 17, 17, 4, 1, 96, 64, torch.float16, True),
    "S5x7-shorter-than-a-block-80v64": (1, 5, 7, 2, 1, 80, 64, torch.float32, False),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_wide_forward_backward_match_oracle(case):
    b, sq, sk, hq, hk, d, dv, dtype, causal = CASES[case]
    out, lse, dq, *_ = check_wide(b, sq, sk, hq, hk, d, dv, dtype, causal=causal)
    if causal and sq > sk:  # bottom-right causal: the first Sq - Sk queries see nothing
        dead = sq - sk
        assert torch.equal(out[:, :dead], torch.zeros_like(out[:, :dead]))
        assert torch.isneginf(lse[:, :, :dead]).all()
        assert torch.equal(dq[:, :dead], torch.zeros_like(dq[:, :dead]))


def test_absorbed_mla_576_512_at_a_tiny_seqlen():
    """The attention-layers preset's absorbed form, 576 / 512 MQA, at 6 queries x 9 keys, causal:
    9 head-dim chunks for Q K^T and 8 value slices on the interpreter's 64-wide tiles."""
    check_wide(1, 6, 9, 2, 1, 576, 512, torch.float32, causal=True)


def test_window_and_softcap():
    """A window (5, 3) with softcap 2 on MQA (scores scaled up so the cap bends them)."""
    check_wide(1, 25, 30, 4, 1, 48, 40, torch.float32, window=(5, 3), softcap=2.0, seed=3)


def test_row_chunks_and_row_split():
    """A workspace too small for all rows (forward 2 chunks of the 116 rows, backward 3: P~, P and dS in pieces, dK / dV added up
    across chunks) and the dK / dV rows shared by 3 programs (fp32 partials summed on the host)."""
    check_wide(1, 29, 34, 4, 1, 48, 40, torch.float32, causal=True, workspace_bytes=20480, split=3)


def test_consumer_tiles_inside_larger_producer_tiles(monkeypatch):
    """The P V, dQ and dK / dV kernels read the workspace without masks, relying on each of their
    tiles lying inside a tile the scores / dS kernel wrote whole (the GPU configs pair 128-key
    producers with 64-key consumers). Here the producers take 32 x 32 tiles and the consumers
    16-row / 16-key ones; a read of an unwritten workspace element would show as NaN (the
    fixture poisons torch.empty). A consumer tile that does not divide its producer's is refused.
    The configs are replaced where every path reads them (wide_configs), on the CPU and the GPU."""
    small = wide._interpret_configs()
    big = {k: dict(v, BLOCK_M=32, BLOCK_N=32) for k, v in small.items() if k in ("scores", "ds")}
    monkeypatch.setattr(wide, "wide_configs", lambda *args, **kwargs: {**small, **big})
    check_wide(1, 37, 45, 4, 1, 80, 64, torch.float32, causal=True)
    check_wide(1, 29, 50, 2, 1, 48, 40, torch.float32, window=(7, 2))
    refused = {**small, **big, "pv": dict(small["pv"], BLOCK_N=64)}
    monkeypatch.setattr(wide, "wide_configs", lambda *args, **kwargs: refused)
    with pytest.raises(ValueError, match="pv BLOCK_N=64 must divide scores's 32"):
        check_wide(1, 5, 7, 2, 1, 80, 64, torch.float32)


def test_very_negative_scores_in_a_window(monkeypatch):
    """A row that sees nothing in the first key block its tile visits (window (2, 0): the tile's 32
    queries span more than its 16-key blocks) and only scores near -160 in base-2 units later: its
    block maximum must be kept as -inf, not 0, or the P V kernel's scale exp2(m_j - m) overflows
    to inf and 0 * inf poisons the row with NaN."""
    small = wide._interpret_configs()
    tiles = {**small, "scores": dict(small["scores"], BLOCK_M=32)}
    monkeypatch.setattr(wide, "wide_configs", lambda *args, **kwargs: tiles)  # on the GPU too
    b, s, h, d = 1, 70, 1, 48
    u = torch.randn(d, generator=torch.Generator().manual_seed(5))
    q = (-4 * u).expand(b, s, h, d).contiguous().to(DEVICE) + 0.01 * torch.randn(b, s, h, d).to(DEVICE)
    k = (4 * u).expand(b, s, h, d).contiguous().to(DEVICE) + 0.01 * torch.randn(b, s, h, d).to(DEVICE)
    v = torch.randn(b, s, h, 40).to(DEVICE)
    out, lse = wide_fwd(q, k, v, softmax_scale=d ** -0.5, causal=False, window_left=2, window_right=0)
    orc = softmax_attention(q.double(), k.double(), v.double(), window_size=(2, 0))
    assert orc.lse.max() * 1.4427 < -128  # every score is below -128 in base 2
    assert torch.isfinite(out).all() and rel_err(out, orc.out) < 1e-4
    assert (lse.double() - orc.lse).abs().max() < 1e-3


def test_strided_inputs():
    """Views: [B, H, S, D] storage read as [B, S, H, D] (the projection's transpose) and a head dim
    with stride 2 (copied: the kernels step through the head dim with stride 1)."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 11, n, generator=g).to(DEVICE).transpose(1, 2) for n in (80, 80, 64))
    k = k[:, :, :1]  # MQA, a view of one head
    v2 = torch.randn(1, 11, 1, 128, generator=g).to(DEVICE)[..., ::2]
    out, lse = wide_fwd(q, k, v2, softmax_scale=0.1, causal=True)
    orc = softmax_attention(q.double(), k.double(), v2.double(), softmax_scale=0.1, causal=True)
    assert rel_err(out, orc.out) < 1e-5


def test_dispatch_reasons():
    """wide_reason: what the wide path takes (None) and readable refusals for what it does not."""
    assert wide_reason(576, 512, torch.bfloat16) is None
    assert wide_reason(2112, 2048, torch.float16, causal=True, window_size=(128, 0), softcap=30.0) is None
    assert wide_reason(192, 128, torch.float32) is None
    assert wide_reason(576, 512, torch.bfloat16, varlen=False, softcap=0.0, window_size=(-1, -1)) is None
    refusals = {
        "dtype": (wide_reason(576, 512, torch.float64), "dtype torch.float64"),
        "not a multiple of 8": (wide_reason(580, 512, torch.bfloat16), "head dim 580 is not a multiple of 8"),
        "d_v not a multiple of 8": (wide_reason(576, 500, torch.bfloat16), "value head dim 500"),
        "too wide": (wide_reason(16384, 512, torch.bfloat16), "head dim 16384"),
        "varlen": (wide_reason(576, 512, torch.bfloat16, varlen=True), "varlen"),
        "cu_seqlens": (wide_reason(576, 512, torch.bfloat16, cu_seqlens_q=torch.zeros(2)), "varlen"),
        "fp8": (wide_reason(576, 512, torch.bfloat16, fp8=True), "FP8"),
        "unknown": (wide_reason(576, 512, torch.bfloat16, paged_kv=True), "paged_kv"),
    }
    for what, (reason, needle) in refusals.items():
        assert reason is not None and reason.startswith("unsupported: ") and needle in reason, (what, reason)
    q = torch.zeros(1, 4, 2, 576)
    with pytest.raises(ValueError, match="unsupported: varlen"):
        wide_fwd(q[0], q[0], q[0], softmax_scale=1.0, causal=False, cu_seqlens_q=torch.zeros(2, dtype=torch.int32))


def test_chunk_and_slice_choices():
    """Head-dim chunks divide the head dims where they can (no masked tail: the scores loop nest
    flattens); 256-wide output slices only where 128's padding costs more than 15% of the useful
    FLOPs per byte."""
    assert block_k(576) == 64 and block_k(576, 512) == 64 and block_k(608) == 32 and block_k(600) == 64
    assert block_k(80, preferred=32) == 16 and block_k(104) == 64  # 104 = 8 x 13: a masked tail chunk
    assert [slice_width(w) for w in (512, 1024, 2048)] == [256, 256, 256]
    assert [slice_width(w) for w in (576, 1088, 2112)] == [128, 256, 256]
    assert slice_width(320) == 128


def test_chunk_and_split_sizing():
    """Host sizing on the GPU configs: the attention-layers 576 / 512 forward fits one chunk of the
    default workspace; a chunk is a multiple of the widest row tile; the dK / dV row split fills 132
    SMs in waves at least 90% full when the key blocks x slices do not."""
    assert chunk_rows(65536, 2 * 2048 * 2 + 2 * 16 * 4, wide.WORKSPACE_BYTES, 128) == 65536
    assert chunk_rows(1000, 10**9, 10, 128) == 128  # at least one tile
    assert chunk_rows(300, 1, 10**9, 128) == 384  # at most all rows (rounded up to a tile)
    # B1 S4096 H64/1 1088 / 1024 forward: 262144 rows, 129024 fit: three equal chunks, not 2 + a 4096-row tail
    assert chunk_rows(262144, 4096 * 2 + 32 * 4, wide.WORKSPACE_BYTES, 128) == 87424
    assert keys_split(1000, 100, 132) == 1
    tiles = 2 * 16 * (5 + 4)  # B2 x 2048 keys / 128 x (576 / 128 -> 5 + 512 / 128 slices)
    s = keys_split(tiles, 512, 132)
    assert s > 1 and (tiles * s / 132) / -(-tiles * s // 132) >= 0.9
    assert keys_split(4, 1, 132) == 1  # one row tile: nothing to split


# ---- GPU only: bf16 (the interpreter cannot), the sm90 tiles, chunks and splits at real sizes ----

needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")

GPU_CASES = {
    "B1-S300-H8/1-576v512-causal": (1, 300, 300, 8, 1, 576, 512, True),
    "B2-S257x513-H4/1-576v512": (2, 257, 513, 4, 1, 576, 512, False),
    "B1-S200-H4/2-1088v1024-causal": (1, 200, 200, 4, 2, 1088, 1024, True),
    "B1-S130-H2/1-2112v2048": (1, 130, 130, 2, 1, 2112, 2048, False),
    "B1-S190-H2/2-288v256-causal": (1, 190, 190, 2, 2, 288, 256, True),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", list(GPU_CASES), ids=list(GPU_CASES))
def test_gpu_wide_matches_oracle(case, dtype):
    b, sq, sk, hq, hk, d, dv, causal = GPU_CASES[case]
    check_wide(b, sq, sk, hq, hk, d, dv, dtype, causal=causal)


@pytest.mark.gpu
@needs_gpu
def test_gpu_wide_chunks_and_split():
    """Several row chunks (a 4 MiB workspace) and a 3-way dK / dV row split at the sm90 tiles, bf16."""
    check_wide(1, 300, 300, 8, 1, 576, 512, torch.bfloat16, causal=True, workspace_bytes=4 << 20, split=3)


def test_the_public_entry_points_dispatch_wide_head_dims():
    """flash_attn_func with a head dim above 256 runs the wide kernels (forward and backward through
    autograd, against the FP64 oracle); the varlen and FP8 entry points refuse it with the reason."""
    from kernels.flash_attn import (
        flash_attn_fp8_func,
        flash_attn_func,
        flash_attn_varlen_func,
        unsupported_reason,
    )

    g = torch.Generator().manual_seed(3)
    mk = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    q, k, v, do = mk(1, 9, 2, 264), mk(1, 9, 1, 264), mk(1, 9, 1, 48), mk(1, 9, 2, 48)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out = flash_attn_func(qr, kr, vr, causal=True)
    out.backward(do)
    orc = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=True)
    for name, cand, ref in (("out", out, orc.out), ("dq", qr.grad, orc.dq), ("dk", kr.grad, orc.dk),
                            ("dv", vr.grad, orc.dv)):
        assert rel_err(cand, ref) < 1e-5, name
    assert unsupported_reason(576, torch.bfloat16) is None
    assert "varlen" in unsupported_reason(576, torch.bfloat16, varlen=True)
    cu = torch.tensor([0, 9], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="varlen"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 9, 9)
    e4m3 = torch.float8_e4m3fn
    ones = torch.ones(1, 1, device=DEVICE)
    with pytest.raises(ValueError, match="FP8"):
        flash_attn_fp8_func(q.to(e4m3), k.to(e4m3), v.to(e4m3), ones, ones, ones)
