"""Tests of the in-repo Triton flash attention (kernels.flash_attn) against the FP64 oracle.

On a machine without CUDA the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set
below before anything imports triton): tiny shapes, fp32 and fp16. bf16 is checked only on the
GPU: the interpreter's bf16 tl.dot multiplies the raw bit patterns (triton issue 11584).

Tolerance rule (tests/kernels/kernel_checks.py): the kernel's error against the FP64 oracle may be at
most ERR_FACTOR x the error of a plain torch reference computed in the same dtype (fp32 softmax),
plus a small per-dtype floor. Errors are relative Frobenius norms.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math

import pytest
import triton
import triton.language as tl
from kernel_checks import LSE_ATOL, assert_matches_oracle, poison_allocations, rel_err, within_tolerance

from harness.oracle import softmax_attention, softmax_attention_varlen
from kernels.flash_attn import flash_attn_func, flash_attn_varlen_func, interface
from kernels.flash_attn.fwd import _round_to_e4m3, _round_to_e4m3_signed, _round_to_e5m2_signed
from kernels.flash_attn.reference import attention_ref

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def nan_poisoned_empty(monkeypatch):
    poison_allocations(monkeypatch)


def make_inputs(b, sq, sk, hq, hk, d, dtype, device=DEVICE, seed=0, dv=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)
    dv = d if dv is None else dv
    return mk(b, sq, hq, d), mk(b, sk, hk, d), mk(b, sk, hk, dv), mk(b, sq, hq, dv)


def check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal=False, window=(-1, -1), device=DEVICE, seed=0,
                         dv=None, softcap=0.0, deterministic=True):
    q, k, v, do = make_inputs(b, sq, sk, hq, hk, d, dtype, device, seed, dv)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_func(qg, kg, vg, causal=causal, window_size=window, softcap=softcap, return_lse=True,
                               deterministic=deterministic)
    out.backward(do)
    orc = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, window_size=window,
                            softcap=softcap)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    if softcap:
        from harness.adapters.eager import eager_attention

        ref_out, _ = eager_attention(qr, kr, vr, causal=causal, window_size=window, softcap=softcap)
    else:
        ref_out, _ = attention_ref(qr, kr, vr, causal=causal, window_size=window, upcast=False)
    ref_out.backward(do)

    assert out.shape == q.shape[:-1] + (v.shape[-1],) and out.dtype == dtype
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    assert_matches_oracle(out, lse, (qg.grad, kg.grad, vg.grad), ref_out, (qr.grad, kr.grad, vr.grad), orc, dtype)
    return out, lse, qg.grad, kg.grad, vg.grad, orc


# (B, Sq, Sk, Hq, Hk, D, causal, window): every shape is off the 16-row interpreter tile and the
# 64/128 GPU tiles except where the point is seqlen 1.
CPU_CASES = {
    "S1x1-D16": (1, 1, 1, 1, 1, 16, False, (-1, -1)),
    "S1x1-D16-causal": (1, 1, 1, 2, 1, 16, True, (-1, -1)),
    "S1x19-D32-causal": (1, 1, 19, 2, 2, 32, True, (-1, -1)),
    "S37x45-D32-GQA4/2": (1, 37, 45, 4, 2, 32, False, (-1, -1)),
    "S45x37-D64-causal-Sq>Sk": (1, 45, 37, 2, 1, 64, True, (-1, -1)),
    "S21x50-D16-causal-Sq<Sk": (2, 21, 50, 2, 2, 16, True, (-1, -1)),
    "S33x50-D32-window5,3-MQA": (1, 33, 50, 4, 1, 32, False, (5, 3)),
    "S40x40-D16-window7,-1": (1, 40, 40, 2, 1, 16, False, (7, -1)),
    "S30x30-D16-window4-causal": (1, 30, 30, 2, 2, 16, True, (4, -1)),
    "S20x36-D40-causal": (1, 20, 36, 2, 1, 40, True, (-1, -1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", list(CPU_CASES), ids=list(CPU_CASES))
def test_forward_backward_match_oracle(case, dtype):
    b, sq, sk, hq, hk, d, causal, window = CPU_CASES[case]
    check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal, window)


@pytest.mark.parametrize("d,dtype", [(96, torch.float32), (128, torch.float16)], ids=["D96-fp32", "D128-fp16"])
def test_large_head_dims_match_oracle(d, dtype):
    check_against_oracle(1, 19, 23, 2, 1, d, dtype, causal=True)


@pytest.mark.parametrize("bwd", ["split", "atomic"])
def test_tma_descriptor_path_and_atomic_dq(monkeypatch, bwd):
    """The tensor-descriptor (TMA) loads/stores and the atomic-dQ backward, run by the interpreter
    (the GPU autotuner chooses between them and the pointer / split-dQ paths per shape)."""
    from kernels.flash_attn import configs

    monkeypatch.setattr(configs, "INTERPRET_USE_TMA", configs.interpreting())
    monkeypatch.setenv("FLASH_ATTN_BWD", bwd)
    check_against_oracle(1, 37, 29, 4, 2, 40, torch.float32, causal=True)
    # 17 x 42 with window (9, 4): 2 query blocks (the last of 1 row) and 3 key blocks (the last of 10) on the
    # interpreter's 16 x 16 tiles, every visited block a masked one (the window is narrower than a tile) and
    # key block 0 seen by no query: the loops that 21 x 50 ran, with one key block fewer
    check_against_oracle(1, 17, 42, 2, 1, 32, torch.float16, window=(9, 4))


def test_the_atomic_backward_takes_dq_buffer_from_the_workspace_when_dense(monkeypatch):
    """The atomic / fused backward's fp32 dQ buffer comes from the backward's workspace on a dense call (one
    allocation fewer a call; the workspace comes 0xFF-filled here, so the preprocess's zeroing is what the oracle
    check sees), its own zeroed allocation on a varlen one (rows past the last sequence stay unwritten), and the
    gradients match the oracle either way, split or not."""
    from kernels.flash_attn import bwd as bwd_mod

    monkeypatch.setenv("FLASH_ATTN_BWD", "atomic")
    made = []
    real = bwd_mod._dq_buffer
    monkeypatch.setattr(bwd_mod, "_dq_buffer", lambda q, varlen: made.append(varlen) or real(q, varlen))
    for split in (1, 3):
        monkeypatch.setattr(bwd_mod, "group_split", lambda *a, s=split: s)
        interface._SIGNATURES.clear()
        check_against_oracle(1, 33, 39, 4, 1, 32, torch.float32, causal=True)
    assert made == []  # (dense: the workspace's)
    check_varlen()
    assert made and all(made)  # (varlen: its own buffer)


@pytest.mark.parametrize("bwd, split", [("split", 2), ("split", 3), ("atomic", 3)])
def test_group_split_backward_matches_oracle(monkeypatch, split, bwd):
    """MQA / GQA with few programs: the dK/dV kernel shares a group's query heads among `split`
    programs (partial fp32 dK / dV, summed on the host); uneven splits (4 heads in 3) included.
    Varlen too (the partial buffers are packed like k)."""
    from kernels.flash_attn import bwd as bwd_mod

    monkeypatch.setattr(bwd_mod, "group_split", lambda *a: split)
    monkeypatch.setenv("FLASH_ATTN_BWD", bwd)
    # 33 x 39 (was 33 x 50): 3 query and 3 key blocks, both last ones partial, masked blocks only, key 0 seen
    # by no query: the loops of 33 x 50 on the interpreter's 16 x 16 tiles, one key block fewer
    check_against_oracle(1, 33, 39, 4, 1, 32, torch.float32, window=(5, 3))
    check_against_oracle(2, 37, 29, 8, 2, 16, torch.float16, causal=True)
    check_varlen()


def test_poisoning_covers_every_allocation_the_kernels_make():
    """The autouse fixture (kernel_checks.poison_allocations): torch.empty, torch.empty_like and Tensor.new_empty
    (the kernels' outputs, gradients and lse) start as NaN, and the backward's scratch comes fresh and 0xFF-filled
    on every call instead of from the kept workspace (stale values from an earlier call would look fine)."""
    from kernels import launcher

    x = torch.zeros(3, device=DEVICE)
    assert torch.empty(4, device=DEVICE).isnan().all() and torch.empty_like(x).isnan().all()
    assert torch.empty_like(x, dtype=torch.bfloat16, memory_format=torch.contiguous_format).isnan().all()
    assert x.new_empty((2, 2)).isnan().all() and x.new_empty(5, dtype=torch.float16).isnan().all()
    first, second = launcher.workspace(x, 64), launcher.workspace(x, 64)
    assert first.data_ptr() != second.data_ptr() and first.eq(255).all() and second.eq(255).all()


def test_the_backward_scratch_comes_from_a_kept_workspace(monkeypatch):
    """delta and the group split's fp32 partials live in a buffer kept per (thread, device, stream)
    (kernels/launcher.py, WORKSPACE_KEEP_BYTES): a second backward reuses it, here filled with NaN in between
    (nothing is read there before the call wrote it); a larger need grows it, another thread gets its own, and
    above the limit every call gets a fresh one and nothing is kept. Gradients against the oracle each time. (On a
    GPU autograd runs backwards on its device thread: the buffers are followed through what workspace hands out.)"""
    import threading

    from kernels import launcher
    from kernels.flash_attn import bwd as bwd_mod

    monkeypatch.setattr(bwd_mod, "group_split", lambda *a: 2)
    monkeypatch.setattr(launcher, "WORKSPACE_KEEP_BYTES", 64 << 20)  # kept (the poisoning fixture keeps none)
    handed = []
    real = launcher.workspace

    def recording(like, nbytes):
        buf = real(like, nbytes)
        handed.append((threading.get_ident(), buf))
        return buf

    monkeypatch.setattr(launcher, "workspace", recording)
    check_against_oracle(1, 33, 39, 4, 1, 32, torch.float32, window=(5, 3))
    (thread, buf), = handed
    buf.fill_(0xFF)  # every fp32 word a NaN
    check_against_oracle(1, 33, 39, 4, 1, 32, torch.float32, window=(5, 3), seed=1)
    assert handed[1][0] == thread and handed[1][1].data_ptr() == buf.data_ptr()
    # the rule itself: one buffer per thread, grown on demand
    on_device = torch.zeros(1, device=DEVICE)  # workspace reads the device (and stream) from a tensor on it
    mine = real(on_device, 1024)
    assert real(on_device, 512).data_ptr() == mine.data_ptr() and real(on_device, 1 << 20).numel() >= 1 << 20
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(real(on_device, 1024)))
    t.start()
    t.join()
    assert theirs[0].data_ptr() != real(on_device, 1024).data_ptr()
    monkeypatch.setattr(launcher, "WORKSPACE_KEEP_BYTES", 4096)  # growth doubles, but never keeps more than that
    launcher._WORKSPACE.__dict__.clear()
    assert real(on_device, 3000).numel() == 3000 and real(on_device, 4000).numel() == 4096
    monkeypatch.setattr(launcher, "WORKSPACE_KEEP_BYTES", 0)
    first, second = real(on_device, 1024), real(on_device, 1024)
    assert first.data_ptr() != second.data_ptr()
    check_against_oracle(1, 33, 39, 4, 1, 32, torch.float32, window=(5, 3), seed=2)
    assert handed[-1][1].data_ptr() != buf.data_ptr()


@pytest.mark.parametrize("d, dv, bwd", [(48, 32, "split"), (48, 32, "atomic"), (32, 48, "split"), (24, 16, "atomic")],
                         ids=["D48v32-split", "D48v32-atomic", "D32v48-split", "D24v16-atomic"])
def test_value_head_dim_other_than_the_query_s(monkeypatch, d, dv, bwd):
    """d_v != d (DeepSeek's 192 / 128 at a small size, and the other way round): forward and every
    gradient against the oracle, causal GQA, a window with MQA and a group split, varlen."""
    from kernels.flash_attn import bwd as bwd_mod

    monkeypatch.setenv("FLASH_ATTN_BWD", bwd)
    check_against_oracle(1, 37, 45, 4, 2, d, torch.float32, causal=True, dv=dv)
    monkeypatch.setattr(bwd_mod, "group_split", lambda *a: 2)
    check_against_oracle(2, 17, 42, 4, 1, d, torch.float16, window=(9, 4), dv=dv)  # see the TMA test


def test_head_dim_split_rule(monkeypatch):
    """Which q / k head dims run as two power-of-two parts (configs.block_db) instead of padded: the
    second part is d - P (P the largest power of two below d) padded to a power of two, at least 16
    (32 for FP8), and only where that is narrower than P. The shared-memory filter costs the q / k
    tiles of a split head dim at their real width and v at its own."""
    from kernels.flash_attn import configs as c

    split = {192: 64, 96: 32, 80: 16, 160: 32, 136: 16, 176: 64, 40: 16, 48: 16, 72: 16, 88: 32}
    assert {d: c.block_db(d) for d in split} == split
    assert not any(c.block_db(d) for d in (8, 16, 24, 32, 56, 64, 104, 120, 128, 200, 224, 248, 256))
    assert (c.block_db(80, 1), c.block_db(40, 1), c.block_db(192, 1)) == (32, 0, 64)  # FP8: 32-deep MMA
    assert c.block_db(192, 4) == 64  # fp32 too
    args = {"Q": torch.empty(0, dtype=torch.bfloat16), "BLOCK_D": 256, "BLOCK_DB": 64, "BLOCK_DV": 128}
    assert c.qk_width(args) == 192 and c.qk_width(dict(args, BLOCK_DB=0)) == 256
    cfg = c._cfg(64, 64, 4, 2, True)
    # q once, k and v per stage, each at its own width: 64 x 192 + 2 x 64 x (192 + 128), 2-byte elements
    assert c.smem_estimate(cfg, c._smem_fwd, args) == 2 * (64 * 192 + 2 * 64 * 320) + c.SMEM_HEADROOM_BYTES
    unsplit = {"Q": args["Q"], "BLOCK_D": 64, "BLOCK_DV": 128}  # not split: every tile at the wider dim, as before
    assert c.smem_estimate(cfg, c._smem_fwd, unsplit) == c._smem_fwd(cfg, 128, 2) + c.SMEM_HEADROOM_BYTES
    # hd 136-192 split have their own tile lists (the hd 256 list's 32-row backward tiles get no wgmma),
    # every tile within the shared memory at 192 / 128
    assert c.fwd_keep(192, 2, 90)[0] == (64, 64, 4, 2, True)
    assert (c.bwd_keep(192, 2, 90, True)[0], c.bwd_keep(192, 2, 90, False)[0]) == ((64, 64, 8, 2, True), (64, 64, 8, 2, True))
    for keep, fn in ((c.fwd_keep(192, 2, 90), c._smem_fwd), (c.bwd_keep(192, 2, 90, True), c._smem_bwd),
                     (c.bwd_keep(192, 2, 90, False), c._smem_bwd)):
        assert all(c.smem_estimate(c._cfg(*k), fn, args) <= c.H100_SMEM_BYTES for k in keep), keep
    monkeypatch.setattr(c, "HEAD_DIM_SPLIT", False)
    assert c.block_db(192) == 0
    assert c.bwd_keep(192, 2, 90, True)[0] == c.bwd_keep(256, 2, 90, True)[0]  # padded: the hd 256 list


@pytest.mark.parametrize("bwd, tma", [("split", False), ("atomic", True)], ids=["split-dQ-pointers", "atomic-dQ-TMA"])
def test_split_head_dim_matches_oracle(monkeypatch, bwd, tma):
    """Head dims split in two parts (configs.block_db): Q K^T as two dots, dQ and dK per part, forward,
    lse and every gradient against the oracle. 40 = 32 + 8 (the second part padded to 16: masked, or
    zero-filled by TMA) with GQA, a window and softcap; 80 = 64 + 16 (no padding at all) causal in fp16
    with MQA; varlen 48 = 32 + 16. Pointer loads with the split dQ kernel, tensor descriptors with the
    atomic dQ (the other two pairings run in the d_v != d and TMA tests at d 48 and 40)."""
    from kernels.flash_attn import configs

    assert (configs.block_db(40), configs.block_db(80), configs.block_db(48)) == (16, 16, 16)
    monkeypatch.setattr(configs, "INTERPRET_USE_TMA", tma and configs.interpreting())
    monkeypatch.setenv("FLASH_ATTN_BWD", bwd)
    check_against_oracle(1, 17, 27, 4, 2, 40, torch.float32, window=(9, 4), dv=32, softcap=2.0)
    check_against_oracle(1, 19, 23, 2, 1, 80, torch.float16, causal=True, dv=16)
    check_varlen(dv=16, d=48)


@pytest.mark.parametrize("bwd", ["split", "atomic"])
def test_softcap_forward_backward_match_oracle(monkeypatch, bwd):
    """softcap (Gemma-2): scores capped at c * tanh(s / c), the backward through 1 - tanh**2. Scores
    are scaled up (q x 4) so the cap bends most of them; GQA causal and MQA with a window."""
    from harness.adapters.eager import eager_attention

    monkeypatch.setenv("FLASH_ATTN_BWD", bwd)
    for b, sq, sk, hq, hk, d, causal, window, cap, dtype in (
        (1, 37, 45, 4, 2, 32, True, (-1, -1), 5.0, torch.float32),
        (2, 17, 42, 4, 1, 16, False, (9, 4), 2.0, torch.float16),  # see the TMA test
    ):
        q, k, v, do = make_inputs(b, sq, sk, hq, hk, d, dtype)
        q = (q.float() * 4).to(dtype)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse = flash_attn_func(qg, kg, vg, causal=causal, window_size=window, softcap=cap, return_lse=True)
        out.backward(do)
        orc = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal, window_size=window,
                                softcap=cap)
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        ref_out, _ = eager_attention(qr, kr, vr, causal=causal, window_size=window, softcap=cap)
        ref_out.backward(do)
        within_tolerance("out", out, ref_out, orc.out, dtype)
        for name, cand, ref, o in (("dq", qg.grad, qr.grad, orc.dq), ("dk", kg.grad, kr.grad, orc.dk),
                                   ("dv", vg.grad, vr.grad, orc.dv)):
            within_tolerance(name, cand, ref, o, dtype)
        live = torch.isfinite(orc.lse)
        assert (lse.double() - orc.lse)[live].abs().max().item() <= LSE_ATOL[dtype]
    with pytest.raises(ValueError, match="softcap: expected a finite float >= 0"):
        flash_attn_func(q, k, v, softcap=-1.0)


def test_group_split_fills_the_gpu_only_when_the_kv_heads_do_not():
    from kernels.flash_attn.bwd import group_split

    assert group_split(2, 16, 1, 2048, 132) == 1  # MHA: nothing to share
    assert group_split(4, 8, 4, 4096, 132) == 1  # 4 x 8 x 32 key blocks = 1024 programs already
    n = group_split(1, 1, 40, 2048, 132)  # MQA H40/1 B1 S2048: 16 programs without a split
    assert 1 < n <= 40 and 16 * n >= 132
    assert group_split(1, 1, 40, 2048, 132) == 14  # 40 heads in 14 programs of 3 (the last holds 1)


def test_head_dim_256_works_or_says_unsupported():
    try:
        check_against_oracle(1, 9, 17, 1, 1, 256, torch.float32, causal=False)
    except ValueError as e:  # the only other allowed outcome: a clear refusal before launch
        assert "unsupported:" in str(e)


def test_fully_masked_rows_are_zero_with_finite_grads():
    # causal with Sq > Sk: the first Sq - Sk query rows see no key at all.
    sq, sk = 29, 11
    out, lse, dq, dk, dv, _ = check_against_oracle(1, sq, sk, 2, 1, 16, torch.float32, causal=True)
    dead = sq - sk
    assert torch.equal(out[:, :dead], torch.zeros_like(out[:, :dead]))
    assert torch.isneginf(lse[:, :, :dead]).all() and torch.isfinite(lse[:, :, dead:]).all()
    assert torch.equal(dq[:, :dead], torch.zeros_like(dq[:, :dead]))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))


def test_window_that_sees_nothing_gives_zero_rows():
    # window (0, 0), Sq = 25, Sk = 9: offset -16, query i sees only key i - 16, so rows 0..15 see none.
    check_against_oracle(1, 25, 9, 1, 1, 16, torch.float16, causal=False, window=(0, 0))


def test_return_lse_false_returns_only_out():
    q, k, v, _ = make_inputs(1, 5, 7, 2, 1, 16, torch.float32)
    out = flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


# torch's first forward-mode AD use scripts its jvp decompositions with the deprecated torch.jit.script
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_call_autograd_does_not_need_skips_the_autograd_node(monkeypatch):
    """No grad mode, or no input requiring grad: the forward alone (no autograd node, nothing saved), the
    same output and lse as the differentiable call, dense and varlen; a forward-mode AD level keeps the node
    (it would carry tangents, and says it cannot)."""
    applied = []
    real = interface.FlashAttnFunc.apply
    monkeypatch.setattr(interface.FlashAttnFunc, "apply", lambda *a: applied.append(1) or real(*a))
    q, k, v, _ = make_inputs(1, 17, 21, 4, 2, 16, torch.float32)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    want_out, want_lse = flash_attn_func(qg, kg, vg, causal=True, return_lse=True)
    assert applied == [1] and want_out.grad_fn is not None
    for context, inputs in ((torch.no_grad, (qg, kg, vg)), (torch.inference_mode, (qg, kg, vg)),
                            (torch.enable_grad, (q, k, v))):
        with context():
            out, lse = flash_attn_func(*inputs, causal=True, return_lse=True)
        assert out.grad_fn is None and not out.requires_grad
        assert torch.equal(out, want_out.detach()) and torch.equal(lse, want_lse)
    assert applied == [1], "a call that needs no autograd node went through the autograd Function"
    cu = torch.tensor([0, 17], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 21], dtype=torch.int32, device=DEVICE)
    with torch.no_grad():
        out = flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, 17, 21, causal=True)
    assert applied == [1] and torch.equal(out, want_out[0].detach())
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level(), pytest.raises(RuntimeError, match="jvp"):
        flash_attn_func(fwad.make_dual(q, torch.ones_like(q)), k, v)
    assert applied == [1, 1]


def test_softmax_scale_and_tf32_option():
    q, k, v, _ = make_inputs(1, 18, 18, 2, 2, 32, torch.float32)
    out = flash_attn_func(q, k, v, softmax_scale=0.3, allow_tf32=True)
    orc = softmax_attention(q.double(), k.double(), v.double(), softmax_scale=0.3)
    # tf32 dots: about 1e-3 relative error on the GPU; the interpreter computes them exactly.
    assert rel_err(out, orc.out) < 5e-3


def test_noncontiguous_inputs():
    q, k, v, _ = make_inputs(1, 17, 17, 2, 2, 32, torch.float32)
    # [B, H, S, D] storage viewed as [B, S, H, D], the usual transpose from a projection.
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out = flash_attn_func(qt, kt, vt, causal=True)
    orc = softmax_attention(q.double(), k.double(), v.double(), causal=True)
    assert rel_err(out, orc.out) < 1e-5


@pytest.mark.parametrize("dv", [32, 16], ids=["D32", "D32v16"])
def test_varlen_matches_oracle(dv):
    check_varlen(dv)


def check_varlen(dv=32, d=32):
    """Packed varlen batch (empty sequences on both sides), causal GQA, every gradient."""
    dtype = torch.float32
    lens_q, lens_k = [5, 0, 19, 3], [7, 4, 17, 0]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sum(lens_q), 4, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(sum(lens_k), 2, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(sum(lens_k), 2, dv, generator=g).to(DEVICE, dtype)
    do = torch.randn(sum(lens_q), 4, dv, generator=g).to(DEVICE, dtype)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                      return_lse=True)
    out.backward(do)
    orc = softmax_attention_varlen(q.double(), k.double(), v.double(), cu_q, cu_k, do.double(), causal=True)
    assert lse.shape == (4, sum(lens_q))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(orc.lse))
    for name, cand, o in (("out", out, orc.out), ("dq", qg.grad, orc.dq), ("dk", kg.grad, orc.dk),
                          ("dv", vg.grad, orc.dv)):
        assert torch.isfinite(cand).all(), name
        assert rel_err(cand, o) < 1e-5, f"{name}: {rel_err(cand, o):.3e}"


def test_varlen_without_validation_copies_nothing_to_the_host(monkeypatch):
    """validate=False: no read of the offsets' values (no .tolist / .item / int(): on a GPU each is a
    synchronisation per call), forward and backward, and the same answer as with validation."""
    lens = [5, 0, 19, 3]
    cu = torch.tensor([0, 5, 5, 24, 27], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(sum(lens), 2, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    want = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    def host_copy(*a, **kw):
        raise AssertionError("a device-to-host copy of a tensor's values")

    monkeypatch.setattr(torch.Tensor, "tolist", host_copy)
    monkeypatch.setattr(torch.Tensor, "item", host_copy)
    monkeypatch.setattr(torch.Tensor, "__int__", host_copy)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, validate=False)
    out.sum().backward()
    monkeypatch.undo()
    assert torch.equal(out, want)


def test_varlen_validates_each_offsets_tensor_once(monkeypatch):
    """validate=True reads the offsets on the host on the first call with a tensor, not on later
    calls with the same unchanged tensor (one synchronisation per batch, not per layer); a tensor
    modified in place is read again, and wrong offsets are still rejected."""
    lens = [5, 0, 19, 3]
    cu = torch.tensor([0, 5, 5, 24, 27], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(sum(lens), 2, 16, generator=g).to(DEVICE) for _ in range(3))
    reads = []
    original = torch.Tensor.tolist

    def counting(self):
        reads.append(self.numel())
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    first = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert len(reads) == 1  # one tensor for q and k: read once
    again = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert len(reads) == 1 and torch.equal(first, again)
    with pytest.raises(ValueError, match="max_seqlen_q: 18 is less than the longest query sequence 19"):
        flash_attn_varlen_func(q, k, v, cu, cu, 18, max(lens))  # the cached longest sequence still checks
    cu[2] = 30  # in place: no longer non-decreasing to the total
    with pytest.raises(ValueError, match="non-decreasing offsets"):
        flash_attn_varlen_func(q, k, v, cu, cu, 30, 30)
    assert len(reads) == 2
    with torch.inference_mode():  # no version counter there: checked on every call
        cu_inf = torch.tensor([0, 5, 5, 24, 27], dtype=torch.int32, device=DEVICE)
        for _ in range(2):
            flash_attn_varlen_func(q, k, v, cu_inf, cu_inf, max(lens), max(lens))
    assert len(reads) == 2 + 2 * 2  # q's and k's offsets, each call


def test_checker_rejects_wrong_answers():
    """The tolerance rule must bite: deliberately wrong attention variants fail it."""
    dtype = torch.float16
    q, k, v, _ = make_inputs(1, 24, 30, 2, 1, 32, dtype)
    orc = softmax_attention(q.double(), k.double(), v.double(), causal=True)
    ref, _ = attention_ref(q, k, v, causal=True, upcast=False)
    within_tolerance("out", ref, ref, orc.out, dtype)  # the reference itself passes
    # Top-left causal (query i sees keys j <= i): flash-attn < 2.1's convention, a classic mix-up.
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float().repeat_interleave(2, 2)) / math.sqrt(32)
    s = s.masked_fill(torch.ones(24, 30, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    top_left = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v.float().repeat_interleave(2, 2)).to(dtype)
    wrong = {
        "scale off by 2%": attention_ref(q, k, v, causal=True, softmax_scale=1.02 / math.sqrt(32), upcast=False)[0],
        "top-left causal": top_left,
        "one row unwritten": ref.clone().index_fill_(1, torch.tensor([5], device=ref.device), 0.0),
        "not causal": attention_ref(q, k, v, causal=False, upcast=False)[0],
    }
    for what, cand in wrong.items():
        with pytest.raises(AssertionError):
            within_tolerance("out", cand, ref, orc.out, dtype)
            pytest.fail(f"checker accepted a wrong kernel: {what}")


def _t(*shape, dtype=torch.float16, device=DEVICE):
    return torch.randn(*shape).to(device=device, dtype=dtype)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (_t(2, 8, 16), _t(2, 8, 2, 16), _t(2, 8, 2, 16)), "q: expected rank 4"),
        (lambda: (_t(2, 8, 2, 16), _t(2, 8, 2, 16, dtype=torch.float32), _t(2, 8, 2, 16)), "k: dtype"),
        (lambda: (_t(2, 8, 3, 16), _t(2, 8, 2, 16), _t(2, 8, 2, 16)), r"heads_k \(2\) must divide heads_q \(3\)"),
        (lambda: (_t(2, 8, 2, 16), _t(2, 8, 2, 32), _t(2, 8, 2, 32)), "head dim must equal"),
        (lambda: (_t(2, 8, 2, 16), _t(2, 8, 2, 16), _t(2, 9, 2, 16)), "v: expected the shape of k"),
        (lambda: (_t(2, 8, 2, 16), _t(3, 8, 2, 16), _t(3, 8, 2, 16)), "k: batch 3"),
        (lambda: (_t(1, 2, 1, 8200), _t(1, 2, 1, 8200), _t(1, 2, 1, 8200)), "unsupported: head dim 8200"),
        (lambda: (_t(1, 8, 2, 20), _t(1, 8, 2, 20), _t(1, 8, 2, 20)), "unsupported: head dim 20"),
        (lambda: tuple(_t(1, 8, 2, 16, dtype=torch.float64) for _ in range(3)), "q: expected dtype"),
        (lambda: (_t(1, 8, 2, 16).int(), _t(1, 8, 2, 16), _t(1, 8, 2, 16)), "q: expected dtype"),
    ],
    ids=["rank", "dtype-mismatch", "heads", "head-dim-mismatch", "v-shape", "batch", "hd8200", "hd20",
         "fp64", "int"],
)
def test_validation_errors(make, match):
    q, k, v = make()
    with pytest.raises(ValueError, match=match):
        flash_attn_func(q, k, v)


def test_validation_of_options():
    q, k, v, _ = make_inputs(1, 4, 4, 1, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="softmax_scale"):
        flash_attn_func(q, k, v, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 3], dtype=torch.int32),
                               torch.tensor([0, 4], dtype=torch.int32), 4, 4)


@needs_gpu
def test_device_mismatch_is_a_value_error():
    q, k, v, _ = make_inputs(1, 4, 4, 1, 1, 16, torch.float16)
    with pytest.raises(ValueError, match="k: device"):
        flash_attn_func(q, k.cpu(), v)


# ---- GPU only: bf16 (the interpreter cannot), real tile sizes, the autotuned configs ----

GPU_CASES = {
    "B2-S1000x1000-H4/2-D64": (2, 1000, 1000, 4, 2, 64, False, (-1, -1)),
    "B2-S1000x1000-H4/1-D64-causal": (2, 1000, 1000, 4, 1, 64, True, (-1, -1)),
    "B1-S777x1500-H4/4-D128-causal": (1, 777, 1500, 4, 4, 128, True, (-1, -1)),
    "B1-S1500x777-H4/2-D128-causal": (1, 1500, 777, 4, 2, 128, True, (-1, -1)),
    "B1-S513x513-H2/2-D96-window100,20": (1, 513, 513, 2, 2, 96, False, (100, 20)),
    "B1-S300x300-H2/1-D32": (1, 300, 300, 2, 1, 32, False, (-1, -1)),
    "B1-S1x300-H2/1-D16-causal": (1, 1, 300, 2, 1, 16, True, (-1, -1)),
    "B1-S400x400-H2/2-D256-causal": (1, 400, 400, 2, 2, 256, True, (-1, -1)),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("case", list(GPU_CASES), ids=list(GPU_CASES))
def test_gpu_matches_oracle(case, dtype):
    b, sq, sk, hq, hk, d, causal, window = GPU_CASES[case]
    check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal, window, device="cuda")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("d, dv", [(192, 128), (96, 96), (80, 64), (160, 160)], ids=["D192v128", "D96", "D80v64", "D160"])
def test_gpu_split_head_dims_match_oracle(d, dv, dtype):
    """Head dims split in two parts (configs.block_db) on the GPU, every dtype, autotuned or pinned
    configs (TMA or pointer loads as the lists pick): DeepSeek's 192 / 128, 96, 80 / 64, 160."""
    check_against_oracle(1, 777, 1500, 4, 2, d, dtype, causal=True, dv=dv, device="cuda")
    check_against_oracle(2, 300, 300, 4, 1, d, dtype, window=(100, 20), dv=dv, device="cuda")


@pytest.mark.gpu
@needs_gpu
def test_gpu_group_split_sum_is_the_same_on_every_run():
    """MQA with one kv head and a small batch: the dK/dV kernel splits the 16-head group over 16
    programs per key block, each writing fp32 partials that are summed in split order. Five
    backwards give bitwise the same gradients and match the oracle."""
    from kernels.flash_attn import bwd as bwd_mod

    b, s, hq, hk, d = 1, 2048, 16, 1, 64
    props = torch.cuda.get_device_properties(0)
    assert bwd_mod.group_split(b, hk, hq // hk, s, props.multi_processor_count) > 1, "no split on this GPU"
    q, k, v, do = make_inputs(b, s, s, hq, hk, d, torch.bfloat16, "cuda", 0, None)
    grads = []
    for _ in range(5):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        flash_attn_func(qg, kg, vg, causal=True).backward(do)
        grads.append((qg.grad, kg.grad, vg.grad))
    for other in grads[1:]:
        for name, x, y in zip(("dq", "dk", "dv"), grads[0], other):
            assert torch.equal(x, y), f"{name} differs between two runs"
    check_against_oracle(b, 1000, 1000, hq, hk, d, torch.bfloat16, causal=True, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(CUDA, reason="bf16 on the CPU interpreter only; on a GPU test_gpu_matches_oracle covers bf16")
def test_bf16_is_gpu_only():
    pytest.skip("bf16 tl.dot is wrong in Triton's CPU interpreter (it multiplies raw bit patterns, "
                "triton issue 11584); bf16 is checked by test_gpu_matches_oracle on a GPU")


def test_autotune_key_separates_a_one_head_check_from_a_full_launch():
    """The tuned tile is cached per key: a one-head correctness run at seqlen 16k must not pick
    the tile of the 16-head, 16k-token benchmark of the same seqlen (it did: the benchmark ran
    the small launch's tile, 0.76x of its own best)."""
    from kernels.flash_attn import configs

    assert set(configs.TUNE_KEY) >= {"SEQ_BUCKET", "FILL_BUCKET"}
    one_head = configs.fill_bucket(1 * 1 * 16384)
    benchmark = configs.fill_bucket(1 * 16 * 16384)
    assert (one_head, benchmark) == (0, 2)
    assert configs.fill_bucket(32 * 16 * 512) == benchmark  # same tokens x heads, other seqlen


# --------------------------------------------------------------------------------------------
# The shapes of the `attention-layers` and `models` presets (issue 16), shrunk to CPU size
# --------------------------------------------------------------------------------------------


def _shrunk(case):
    """The preset case at 40 tokens, one sequence, the GQA group kept (at most 8 query heads per kv
    head, 2 kv heads when there are several), fp32; its mask, softcap, head dims and layout kept."""
    import dataclasses

    group = case.heads_q // case.heads_k
    hk = 1 if case.heads_k == 1 else 2
    return dataclasses.replace(case, batch=1, heads_q=hk * min(group, 8), heads_k=hk, seqlen_q=40, seqlen_k=40,
                               dtype="fp32", window=(15, 0) if case.has_window else case.window)


def _layer_shapes():
    from harness.presets import preset

    seen = {}
    for name in ("attention-layers", "models"):
        for c in preset(name):
            seen.setdefault(_shrunk(c).id, _shrunk(c))
    return list(seen.values())


@pytest.mark.parametrize("case", _layer_shapes(), ids=str)
def test_layer_preset_shapes_pass_or_say_why(case):
    """Every shape class of the two presets: the eager reference passes against the oracle; the
    in-repo kernel supports every one, and runs the MQA D128, fused-QKV and 192 / 128 (MLA training
    form) shapes here against the oracle (the others it runs are covered above; the absorbed MLA
    form's wide kernels in tests/kernels/test_flash_attn_wide.py, at a size the interpreter affords)."""
    from harness.adapters import registry
    from harness.check.verify import verify

    assert verify("eager", case, device=DEVICE, check_determinism=False).status == "pass"
    reason = registry.get("triton_fa").supports(case, DEVICE)
    if case.id in ("B1-H8/1-S40x40-D128-fp32", "B1-H2-S40x40-D128-qkvpacked-fp32", "B1-H2-S40x40-D192v128-causal-fp32"):
        r = verify("triton_fa", case, device=DEVICE)
        assert r.status == "pass", r.message()
    else:
        assert reason is None


# --------------------------------------------------------------------------------------------
# FP8 forward (flash_attn_fp8_func): e4m3 q, k, v with flash-attn 3's (B, Hk) descales
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", ["B2-H4/2-S45x70-D32-causal-e4m3-bf16", "B1-H4/1-S70x33-D64-causal-e4m3-bf16",
                                     "B1-H2-S48x48-D32-win8x4-cap5-e4m3-bf16", "B2-H4/2-S64x64-D64-scale1-e4m3-bf16",
                                     "B1-H2-S40x40-D128-causal-e4m3-fp16", "B2-H4/2-S45x70-D32-causal-e4m3-perhead-bf16",
                                     "B1-H2/1-S33x40-D192v128-causal-e4m3-bf16"])
@pytest.mark.parametrize("v_transposed", [False, True], ids=["V", "Vt"])
def test_fp8_forward_matches_the_fp8_reference(case_id, v_transposed):
    """Against the FP64 oracle on the dequantised inputs, within 2x the error of the eager FP8
    reference (P quantised to e4m3 dominates both), lse within the tolerance rule's FP8 floor (the
    FP8 tensor cores' accumulator; promoted after every MMA it is within fp32 rounding); V as given
    and V transposed to [B, Hk, Dv, Sk] (the layout used on Hopper); 192 / 128 runs the split head dim."""
    from harness.adapters.eager import eager_fp8_attention
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from harness.check.tolerance import hardware_floor
    from kernels.flash_attn import flash_attn_fp8_func

    c = case_from_id(case_id)
    x = harness_inputs(c, seed=2, device=DEVICE)
    orc = compute_oracle(c, x)
    kw = dict(causal=c.causal, softmax_scale=c.scale, window_size=c.window, softcap=c.softcap, out_dtype=c.torch_dtype)
    out, lse = flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, return_lse=True,
                                   v_transposed=v_transposed, **kw)
    ref, _ = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, **kw)
    assert out.dtype == c.torch_dtype and out.shape == (c.batch, c.seqlen_q, c.heads_q, c.d_v)
    assert torch.isfinite(out).all()
    err, ref_err = rel_err(out, orc.out), rel_err(ref, orc.out)
    assert err <= 2 * ref_err, f"out: {err:.3e} against the FP8 reference's {ref_err:.3e}"
    live = torch.isfinite(orc.lse)
    assert rel_err(lse[live], orc.lse[live]) <= hardware_floor("lse", "e4m3")
    if not v_transposed:  # the promotion does not depend on V's layout: checked once per case (CPU time)
        promoted = flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, return_lse=True,
                                       max_num_imprecise_acc=0, **kw)[1]
        assert (promoted.double() - orc.lse)[live].abs().max().item() <= 1e-4


def test_fp8_tensor_descriptors_with_v_transposed(monkeypatch):
    """The TMA (tensor-descriptor) loads of the FP8 path, V as given and transposed (its rows padded to
    16 keys so the descriptor's stride is 16-byte aligned at any sequence length: 70 here)."""
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn import configs, flash_attn_fp8_func

    monkeypatch.setattr(configs, "INTERPRET_USE_TMA", configs.interpreting())
    c = case_from_id("B2-H4/2-S45x70-D32-causal-e4m3-bf16")
    x = harness_inputs(c, seed=2, device=DEVICE)
    orc = compute_oracle(c, x)
    outs = [flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, causal=True, v_transposed=t)
            for t in (False, True)]
    # same tiles, same products: only the layout of V and the order of each 16 keys in the MMA differ (the
    # GPU's FP8 accumulator may round the sums differently: a bf16 ulp or so)
    assert (outs[0].float() - outs[1].float()).abs().max().item() <= 2 ** -6 * outs[0].float().abs().max().item()
    for out in outs:
        assert rel_err(out, orc.out) < 0.03


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_zero_q_descale_gives_uniform_rows(causal):
    """A zero descale (an all-zero tensor's quantisation may carry one) makes every score 0: each row
    is the mean of the values it sees. The masked blocks scale after the mask's select (one FMA per
    score), where -inf x 0 would be NaN; the kernel raises a zero scale to the smallest normal float."""
    from harness import fp8
    from kernels.flash_attn import flash_attn_fp8_func

    g = torch.Generator(device="cpu").manual_seed(7)
    b, s, h, d = 1, 70, 2, 32
    (q, _), (k, kd), (v, vd) = (fp8.quantize(torch.randn(b, s, h, d, generator=g).to(DEVICE), "e4m3", h)
                                for _ in range(3))
    out = flash_attn_fp8_func(q, k, v, torch.zeros_like(kd), kd, vd, causal=causal, out_dtype=torch.float16)
    vv = fp8.dequantize(v, vd, dtype=torch.float64)  # (b, s, h, d)
    seen = torch.arange(1, s + 1, dtype=torch.float64) if causal else torch.full((s,), float(s), dtype=torch.float64)
    want = (vv.cumsum(1) if causal else vv.sum(1, keepdim=True).expand_as(vv)) / seen[None, :, None, None].to(vv.device)
    assert torch.isfinite(out).all()
    assert (out.double() - want).abs().max().item() < 2e-3  # fp16 rounding of O(1) means

@triton.jit
def _round_kernel(X, Y, N: tl.constexpr, SIGNED: tl.constexpr = False):
    r = tl.arange(0, N)
    x = tl.load(X + r)
    tl.store(Y + r, _round_to_e4m3_signed(x) if SIGNED else _round_to_e4m3(x))


@pytest.mark.parametrize("mma_order", [False, True], ids=["keys", "mma-order"])
@pytest.mark.parametrize("b, sk, hk, dv, packed", [(1, 300, 2, 64, False), (2, 17, 3, 48, True), (1, 513, 1, 96, False)],
                         ids=["S300-D64", "S17-D48-packed", "S513-D96"])
def test_fp8_v_copy_puts_the_keys_contiguous(b, sk, hk, dv, packed, mma_order):
    """The FP8 forward's copy of V to [B, Hk, Dv, Sk] (v_layout._transpose_kernel, one byte per
    element): every byte where torch's permute puts it, over tiles cut by the sequence and the head
    dim (300 and 513 keys, 48 and 96 dims against 64 x 64 tiles), from a strided V (a slice of a
    packed kv tensor), rows padded to 16 keys. In the MMA order (the forward's V) key n sits at
    mma_order_position(n), a permutation of each group of 16 (checked here against its definition,
    bit by bit), and the padding holds zeros: the last group's real keys land in it (17, 300, 513 keys)."""
    from kernels.flash_attn.v_layout import KEY_PAD, MMA_GROUP, mma_order_position, v_keys_contiguous

    g = torch.Generator(device="cpu").manual_seed(0)
    raw = torch.randint(1, 255, (b, sk, hk, 2 * dv if packed else dv), generator=g, dtype=torch.uint8)
    v = (raw[..., dv:] if packed else raw).view(torch.float8_e4m3fn).to(DEVICE)
    vt = v_keys_contiguous(v, mma_order=mma_order)
    padded = -(-sk // KEY_PAD) * KEY_PAD
    assert vt.shape == (b, hk, dv, sk) and vt.stride(2) == padded
    want = v.permute(0, 2, 3, 1).view(torch.uint8).cpu()
    if not mma_order:
        assert torch.equal(vt.view(torch.uint8).cpu(), want)
        return
    n = torch.arange(padded)
    pos = mma_order_position(n)
    b_, c_, r_ = (n >> 3) & 1, (n >> 1) & 3, n & 1  # key 8b + 2c + r of its group -> 4c + 2b + r
    assert torch.equal(pos, (n // MMA_GROUP) * MMA_GROUP + 4 * c_ + 2 * b_ + r_)
    assert torch.equal(pos.sort().values, n) and KEY_PAD % MMA_GROUP == 0  # a permutation of whole groups
    whole = torch.as_strided(vt, (b, hk, dv, padded), vt.stride()).view(torch.uint8).cpu()
    assert torch.equal(whole[..., pos[:sk]], want)
    assert not whole[..., pos[sk:]].any()  # the padding's zeros (every real byte is nonzero here)


@pytest.mark.parametrize("b, s, hq, hk, d, causal", [(1, 140, 4, 2, 64, True), (1, 70, 2, 1, 32, False)],
                         ids=["B1-S140-H4/2-D64-causal", "B1-S70-H2/1-D32"])
def test_fp8_forward_overlapped_with_its_v_copy_is_the_same_forward(monkeypatch, b, s, hq, hk, d, causal):
    """configs.FP8_V_OVERLAP "counters": the V copy signals each (batch, kv head) done
    (v_layout._transpose_signal_kernel, counters reaching tiles_per_head) and the forward waits per program for its
    own head (fwd._wait_ready; on a GPU it starts while the copy runs, programmatic dependent launch); "pdl": the
    plain copy, and the forward launched to start as it ends, waiting for all of it (griddepcontrol.wait; on the
    CPU the plain call). The copied bytes are the plain copy's, and the output is bitwise the forward's without
    the overlap, on two V's called alternately: on a GPU a program that read its head before the copy was done
    would read the other V's bytes left in the reused buffer."""
    from kernels.flash_attn import configs, flash_attn_fp8_func, v_layout
    from kernels.flash_attn.v_layout import tiles_per_head, v_keys_contiguous

    monkeypatch.setattr(v_layout, "SIGNAL_BLOCK_S", 64)  # several tiles a head, so counting them is checked
    g = torch.Generator(device="cpu").manual_seed(3)
    q, k, v, v2 = (torch.randn(b, s, h, d, generator=g).to(torch.float8_e4m3fn).to(DEVICE) for h in (hq, hk, hk, hk))
    ds = (torch.rand(b, hk, generator=g) + 0.5).to(DEVICE)
    ready = torch.zeros(b * hk, dtype=torch.int32, device=DEVICE)
    signalled = v_keys_contiguous(v, mma_order=True, ready=ready)
    assert torch.equal(signalled.view(torch.uint8), v_keys_contiguous(v, mma_order=True).view(torch.uint8))
    assert ready.tolist() == [tiles_per_head(s, d)] * (b * hk)

    def call(overlap, vv):
        monkeypatch.setattr(configs, "FP8_V_OVERLAP", overlap)
        return flash_attn_fp8_func(q, k, vv, ds, ds, ds, causal=causal, v_transposed=True)

    want = [call("", vv).view(torch.uint16) for vv in (v, v2)]
    for mode in ("counters", "pdl") if CUDA else ("counters",):
        for i in range(6 if CUDA else 2):
            assert torch.equal(call(mode, (v, v2)[i % 2]).view(torch.uint16), want[i % 2]), (mode, i)


def test_fp8_p_rounding_under_the_interpreter_matches_torch():
    """The interpreter's own fp32 -> e4m3 cast drops the carry into the exponent (0.496 -> 0.25);
    the kernel rounds P itself there (_round_to_e4m3). That rounding must be torch's."""
    if CUDA:
        pytest.skip("the interpreter's rounding path only runs without a GPU (the GPU casts in hardware)")
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(2048, generator=g), torch.rand(2048, generator=g) * 0.02])  # normals and subnormals
    y = torch.empty_like(x)
    _round_kernel[(1,)](x, y, N=x.numel())
    assert torch.equal(y, x.to(torch.float8_e4m3fn).float())
    # the FP8 output's rounding: either sign, up to e4m3's largest value (448)
    x = torch.cat([x[:1024], -x[:1024], torch.rand(2048, generator=g) * -900 + 450]).clamp(-448, 448)
    _round_kernel[(1,)](x, y, N=x.numel(), SIGNED=True)
    assert torch.equal(y, x.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("case_id", ["B2-H4/2-S45x70-D32-causal-e4m3-o8-bf16", "B1-H2-S64x64-D128-e4m3-o8-bf16"])
def test_fp8_output_in_e4m3_reads_back_as_the_fp8_reference(case_id):
    """out_dtype=float8_e4m3fn: the output written in e4m3 in V's units (real value = out x v_descale,
    the scale 1 / v_descale), as the reference's FP8-output path rounds it (harness.fp8.round_output);
    read back, within 2x the reference's error against the FP64 oracle, and lse as with bf16 out."""
    from harness import fp8
    from harness.adapters.eager import eager_fp8_attention
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn import flash_attn_fp8_func

    c = case_from_id(case_id)
    x = harness_inputs(c, seed=4, device=DEVICE)
    orc = compute_oracle(c, x)
    kw = dict(causal=c.causal, softmax_scale=c.scale, window_size=c.window)
    out, lse = flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, return_lse=True,
                                   out_dtype=torch.float8_e4m3fn, **kw)
    bf16, lse16 = flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, return_lse=True, **kw)
    assert out.dtype == torch.float8_e4m3fn and out.shape == (c.batch, c.seqlen_q, c.heads_q, c.d_v)
    assert torch.equal(lse, lse16)
    read = fp8.read_back(out, x.v_descale, torch.float32)
    ref, _ = eager_fp8_attention(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, out_dtype=torch.float32,
                                 out_fp8="e4m3", **kw)
    err, ref_err = rel_err(read, orc.out), rel_err(ref, orc.out)
    assert err <= 2 * ref_err, f"out: {err:.3e} against the FP8-output reference's {ref_err:.3e}"
    # the same kernel's bf16 output, scaled to V's units and rounded to e4m3: the FP8 output's values,
    # but for ties the two fp32 paths round apart (the bf16 one is rounded twice)
    vd = x.v_descale.float().repeat_interleave(c.heads_q // c.heads_k, dim=1)[:, None, :, None]
    same = (bf16.float() / vd).to(torch.float8_e4m3fn).float() == out.float()
    assert same.float().mean() >= 0.9


def test_fp8_entry_point_validates_its_arguments():
    from kernels.flash_attn import flash_attn_fp8_func

    f8 = lambda *s: torch.randn(*s).to(torch.float8_e4m3fn).to(DEVICE)  # noqa: E731
    q, k, v = f8(1, 8, 2, 32), f8(1, 8, 1, 32), f8(1, 8, 1, 32)
    ds = torch.ones(1, 1, device=DEVICE)
    with pytest.raises(ValueError, match="q: expected dtype torch.float8_e4m3fn"):
        flash_attn_fp8_func(q.float(), k, v, ds, ds, ds)
    with pytest.raises(ValueError, match=r"k_descale: expected a float32 \[B=1, Hk=1\]"):
        flash_attn_fp8_func(q, k, v, ds, torch.ones(1, 2, device=DEVICE), ds)
    with pytest.raises(ValueError, match="out_dtype: bfloat16, float16 or float8_e4m3fn"):
        flash_attn_fp8_func(q, k, v, ds, ds, ds, out_dtype=torch.float32)


def test_fp8_forward_takes_its_measured_list_first():
    """FP8 (1-byte tiles): the measured FP8 list first (its fastest is the untuned pick), the bf16
    pick kept as a fallback, each within the shared memory; at hd 64 the four-programs-an-SM tile (a register
    cap of 128) second, as a challenger (first where causal: test_causal_forward_lists_...)."""
    from kernels.flash_attn import configs as c

    for d in (64, 128, 256):
        keep = c.fwd_keep(d, 1, 90)
        uncapped = [k for k in keep if len(k) < 7]
        assert uncapped[: len(c._FP8_FWD[d])] == c._FP8_FWD[d] and len(keep) == len(set(keep)) > 2
        assert [k for k in keep if len(k) == 7] == ([(64, 128, 4, 2, True, 1, 128)] if d == 64 else [])
        assert c.fwd_keep(d, 2, 90)[0] in keep
        for k in keep:
            cfg = c._cfg(*k[:5])
            assert c._smem_fwd(cfg, c.block_d(d), 1) + c.SMEM_HEADROOM_BYTES <= c.H100_SMEM_BYTES, (d, cfg)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_backward_takes_its_measured_tiles_first(monkeypatch, d):
    """The FP8 backward (one-byte q / k) prunes to its own measured tiles at hd 64 (session 22: dK/dV
    128x128 on 8 warps first, dQ 64x64 on 4 warps) and to the bf16 list at hd 128 and 256, where bf16 and
    FP8 both take dK/dV 64x64 on 8 warps with dQ 64x64 on 4 warps, 2 stages (wgmma tiles; measured for FP8
    in session 22, for bf16 in session 23), each pick within the shared memory the filter counts for it
    (FP8 operands at two bytes)."""
    from kernels.flash_attn import configs as c

    monkeypatch.setattr(c, "interpreting", lambda: False)
    want = {64: ((128, 128, 8, 2), (64, 64, 4, 2)), 256: ((64, 64, 8, 2), (64, 64, 4, 2))}
    for elt, dtype in ((1, torch.float8_e4m3fn), (2, torch.bfloat16)):
        q = torch.zeros(2, 64, 8, d, dtype=dtype)
        for resident_n in (True, False):
            args = dict(Q=q, K=q, V=q, HEAD_DIM=d, BLOCK_D=d, BLOCK_DV=d, ARCH=90, RESIDENT_N=resident_n,
                        stride_qb=q.stride(0), stride_qs=q.stride(1), stride_qh=q.stride(2), IS_FP8=elt == 1)
            first = c.prune_bwd(c.BWD_SPACE, {}, **args)[0]
            got = (first.kwargs["BLOCK_M"], first.kwargs["BLOCK_N"], first.num_warps, first.num_stages)
            if (elt == 1 and d in want) or d == 256:
                assert got == want[d][0 if resident_n else 1] and first.kwargs["USE_TMA"], (d, elt, resident_n, got)
            else:  # the bf16 list's first pick that fits, as before
                listed = [k[:4] for k in c.bwd_keep(d, 2, 90, resident_n)]
                assert got in listed, (d, elt, resident_n, got)
            assert c.smem_estimate(first, c._smem_bwd, args) <= c.H100_SMEM_BYTES


def test_causal_forward_lists_two_query_blocks_per_program_where_measured(monkeypatch):
    """Causal at hd <= 64 (no left window): the first tile with TILES = 2 first for FP8 (measured
    faster at 4k-16k), second for bf16 / fp16 (a challenger); never at hd 128 (one program per SM)
    or fp32, nor without a causal mask. The pruned configs carry TILES and the launch's grid halves."""
    from kernels.flash_attn import configs as c

    assert c.fwd_keep(64, 1, 90, True)[1] == c.fwd_keep(64, 1, 90)[0][:5] + (2,)
    assert c.fwd_keep(64, 2, 90, True)[1] == c.fwd_keep(64, 2, 90)[0][:5] + (2,)
    for d, elt, causal in ((128, 1, True), (128, 2, True), (64, 4, True), (64, 1, False), (64, 2, False)):
        assert all(len(k) == 5 or k[5] == 1 for k in c.fwd_keep(d, elt, 90, causal)), (d, elt, causal)
    monkeypatch.setattr(c, "interpreting", lambda: False)
    q = torch.zeros(2, 64, 8, 64, dtype=torch.float8_e4m3fn)
    args = dict(Q=q, K=q, V=q, HEAD_DIM=64, BLOCK_D=64, BLOCK_DV=64, ARCH=90, stride_qb=q.stride(0),
                stride_qs=q.stride(1), stride_qh=q.stride(2), IS_CAUSAL=True, HAS_LEFT=False)
    picked = c.prune_fwd(c.FWD_SPACE, {}, **args)
    assert [k.kwargs["TILES"] for k in picked[:3]] == [2, 2, 1]
    assert c._grid_meta(picked[0].kwargs) == (64, 128, 2)
    assert all(k.kwargs["TILES"] == 1 for k in c.prune_fwd(c.FWD_SPACE, {}, **dict(args, HAS_LEFT=True)))
    monkeypatch.setattr(c, "FWD_TILES_FORCE", 1)
    assert all(k.kwargs["TILES"] == 1 for k in c.prune_fwd(c.FWD_SPACE, {}, **args))
    # the filter's shared-memory bound of a two-block config (estimate + headroom) covers what the sm_90a
    # compiles took (session 15; one block's estimate did not: 122880 and 81920 B)
    for d, elt, bm, bn, w, compiled in ((64, 1, 64, 128, 4, 62464), (128, 1, 64, 128, 4, 123904),
                                        (64, 2, 128, 64, 8, 82944)):
        assert c._smem_fwd(c._cfg(bm, bn, w, 3, True, 2), d, elt) + c.SMEM_HEADROOM_BYTES >= compiled, (d, elt)
    # a listed register cap (the four-programs tile, first) survives FWD_TILES_FORCE; the experiments' cap
    # (FWD_MAXNREG) reaches every pruned config, and only while set
    plain = c.prune_fwd(c.FWD_SPACE, {}, **args)
    assert [k.maxnreg for k in plain] == [128] + [None] * (len(plain) - 1)
    assert (plain[0].num_stages, plain[0].kwargs["TILES"]) == (2, 1)
    monkeypatch.setattr(c, "FWD_MAXNREG", 128)
    capped = c.prune_fwd(c.FWD_SPACE, {}, **args)
    assert capped and all(k.maxnreg == 128 for k in capped)
    assert [(k.kwargs, k.num_warps, k.num_stages) for k in capped] == [(k.kwargs, k.num_warps, k.num_stages)
                                                                      for k in plain]
    # the masked loops' loop-invariant code motion is turned off where it was measured to cost occupancy only
    assert c.fwd_masked_no_licm(64, 1) and c.fwd_masked_no_licm(32, 1)
    assert not any(c.fwd_masked_no_licm(d, elt) for d, elt in ((128, 1), (256, 1), (64, 2), (128, 2), (64, 4)))


def test_fp8_descale_stride_does_not_cost_the_tensor_descriptors(monkeypatch):
    """Session 11: the FP8 descales' batch stride is heads_k (8 at hd 256 x 8 heads, and in Llama-style
    GQA); the TMA check read it as a descriptor stride, refused TMA, and with every FP8 tile being a TMA
    one the kernel fell to its 32x32 last resort (0.2-0.3x the bf16 forward). The descales are scalar
    loads: their stride is not checked; and a tile whose TMA is refused keeps its size with pointer loads."""
    from kernels.flash_attn import configs as c

    monkeypatch.setattr(c, "interpreting", lambda: False)
    q = torch.zeros(2, 64, 8, 256, dtype=torch.float8_e4m3fn)
    args = dict(Q=q, K=q, V=q, HEAD_DIM=256, BLOCK_D=256, BLOCK_DV=256, ARCH=90, stride_qb=q.stride(0),
                stride_qs=q.stride(1), stride_qh=q.stride(2), stride_dsb=8, stride_lb=64 * 8, stride_lh=64)
    assert c._tma_ok(args)
    picked = c.prune_fwd(c.FWD_SPACE, {}, **args)
    assert [(k.kwargs["BLOCK_M"], k.kwargs["BLOCK_N"], k.kwargs["USE_TMA"]) for k in picked][:1] == [(64, 64, True)]
    odd = dict(args, stride_qs=8 * 256 + 8)  # a view whose rows are not 16-byte apart: no TMA
    assert not c._tma_ok(odd)
    tiles = [(k.kwargs["BLOCK_M"], k.kwargs["BLOCK_N"], k.kwargs["USE_TMA"], k.num_warps) for k in c.prune_fwd(c.FWD_SPACE, {}, **odd)]
    assert tiles and all(not t for _, _, t, _ in tiles) and (32, 32, False, 4) not in tiles, tiles


def test_fp8_accept_callable_passes_the_checks_of_an_fp8_case():
    """benchmarks/fp8_accept_impl.py (the in-repo FP8 forward as a user's callable, what
    `harness accept --profile fp8` judged on the H100) through the harness's own check: the
    descales reach the kernel by keyword, and the case passes against the FP64 oracle."""
    from benchmarks.fp8_accept_impl import attn
    from harness.adapters.user import CallableSoftmaxAdapter
    from harness.cases import case_from_id
    from harness.check.verify import verify

    case = case_from_id("B1-H4/2-S45x70-D32-causal-e4m3-bf16")
    r = verify(CallableSoftmaxAdapter(attn, name="fp8_accept_impl"), case, seed=3, device=DEVICE)
    assert r.status == "pass", r.message()


@pytest.mark.parametrize("name", ["B2-H4/2-S45x70-D32-causal-e4m3-grad_e5m2-bf16", "B1-H2-S64x64-D128-e4m3-o8-grad_e4m3-bf16"])
def test_the_in_repo_fp8_backward_passes_the_harness_checks(name):
    """triton_fa_fp8 declares the FP8 backward: its fp8_grad cases' gradients (bf16, or FP8 over their descales)
    pass the harness's check against the FP64 oracle; head dims under 32 are refused for the backward, in the
    kernel's words, while their forward-only cases still run. The accept callable with the FP8 backward
    (benchmarks/fp8_accept_impl.py:train) passes the same check."""
    from benchmarks.fp8_accept_impl import train
    from harness.adapters import registry
    from harness.adapters.user import CallableSoftmaxAdapter
    from harness.cases import case_from_id
    from harness.check.verify import verify

    case = case_from_id(name)
    r = verify("triton_fa_fp8", case, seed=1, device=DEVICE)
    assert r.status == "pass", r.message()
    adapter = registry.get("triton_fa_fp8")
    assert "head dim 16 in the FP8 backward" in adapter.supports(case_from_id("B1-H2-S40x40-D16-e4m3-grad_e4m3-bf16"), DEVICE)
    assert adapter.supports(case_from_id("B1-H2-S40x40-D16-e4m3-bf16"), DEVICE) is None
    if not case.fp8_out:  # the callable contract is bf16 output
        r = verify(CallableSoftmaxAdapter(train, name="fp8_accept_impl.train"), case, seed=1, device=DEVICE)
        assert r.status == "pass", r.message()


def _forward_launches(case, fp8_out, mma_order=False):
    """The forward launcher called directly on CPU_CASES[case] (fp32 inputs), dense, varlen (two
    sequences) and, at d >= 32, FP8 (the inputs cast to e4m3, descales 0.5 / 0.25 / 2, V transposed as on
    Hopper: its keys in the MMA order with ``mma_order``, out in ``fp8_out``): ({name: call}, (q8, k8, v8)).
    Called directly: the public functions replay a signature's first launch, which would hide the config
    knobs the tests force on a GPU."""
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    b, sq, sk, hq, hk, d, causal, window = CPU_CASES[case]
    q, k, v, _ = make_inputs(b, sq, sk, hq, hk, d, torch.float32)
    kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=window[0], window_right=window[1])
    cu_q = torch.tensor([0, sq // 3, sq], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, sk // 2, sk], dtype=torch.int32, device=DEVICE)
    varlen = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=sq - sq // 3, max_seqlen_k=sk - sk // 2)
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    runs = {"dense": lambda: flash_attn_fwd(q, k, v, **kw),
            "varlen": lambda: flash_attn_fwd(q[0], k[0], v[0], **varlen, **kw)}
    if d >= 32:  # FP8 dots are at least 32 deep on the GPU (the FP8 entry point refuses smaller head dims)
        ds = [torch.full((b, hk), s, device=DEVICE) for s in (0.5, 0.25, 2.0)]
        vt = v_keys_contiguous(v8, mma_order=mma_order)
        runs["fp8"] = lambda: flash_attn_fwd(q8, k8, vt, descales=ds, out_dtype=fp8_out, v_transposed=True,
                                             v_mma_order=mma_order, **kw)
    return runs, (q8, k8, v8)


@pytest.mark.parametrize("case", ["S45x37-D64-causal-Sq>Sk", "S21x50-D16-causal-Sq<Sk", "S33x50-D32-window5,3-MQA",
                                  "S37x45-D32-GQA4/2", "S1x1-D16-causal", "S30x30-D16-window4-causal"])
def test_two_query_blocks_per_program_compute_what_one_does(monkeypatch, case):
    """The forward's TILES = 2 (configs.fwd_tiles: a program runs query blocks n_m - 1 - p and p under
    a causal mask, 2p and 2p + 1 otherwise; odd block counts leave one program a single block):
    out and lse bitwise those of one block per program (each block's sums run in the same order),
    dense, varlen and FP8 (V transposed, as on Hopper; _forward_launches)."""
    from kernels.flash_attn import configs

    runs, _ = _forward_launches(case, torch.bfloat16)
    for name, run in runs.items():
        monkeypatch.setattr(configs, "FWD_TILES_FORCE", 1)
        one = run()
        monkeypatch.setattr(configs, "FWD_TILES_FORCE", 2)
        two = run()
        for what, x1, x2 in zip(("out", "lse"), one, two):
            assert torch.equal(x1, x2), f"{name} {what}"
        assert torch.isfinite(one[0]).all(), name
    monkeypatch.setattr(configs, "FWD_TILES_FORCE", 2)
    check_against_oracle(*CPU_CASES[case][:6], torch.float32, *CPU_CASES[case][6:])  # and the backward after it


@pytest.mark.parametrize("case", ["S45x37-D64-causal-Sq>Sk", "S21x50-D16-causal-Sq<Sk", "S30x30-D16-window4-causal",
                                  "S37x45-D32-GQA4/2"])
def test_narrow_diagonal_computes_what_wide_blocks_do(monkeypatch, case):
    """configs.fwd_narrow_diagonal: where BLOCK_M < BLOCK_N (the FP8 64 x 128 tile; 16 x 32 here under the
    interpreter) the keys right of a tile's unmasked part go in BLOCK_M-wide blocks. Out and lse as with
    BLOCK_N-wide blocks (the online softmax's blocks differ, so to rounding), dense, varlen and FP8 with V in
    the MMA order, one and two query blocks per program; non-causal cases take the wide path either way."""
    from kernels.flash_attn import configs

    monkeypatch.setattr(configs, "INTERPRET_BLOCK_N", 32)
    _, _, _, _, _, d, causal, window = CPU_CASES[case]
    runs, (q8, k8, v8) = _forward_launches(case, torch.float32, mma_order=True)
    for tiles in (1, 2):
        monkeypatch.setattr(configs, "FWD_TILES_FORCE", tiles)
        for name, run in runs.items():
            monkeypatch.setattr(configs, "FWD_NARROW_DIAGONAL", False)
            wide = run()
            monkeypatch.setattr(configs, "FWD_NARROW_DIAGONAL", True)
            narrow = run()
            for what, x1, x2 in zip(("out", "lse"), wide, narrow):
                assert torch.equal(x1.isinf(), x2.isinf()) and not x2.isnan().any(), f"{name} {what}"
                live = x1.isfinite()
                if name == "fp8" and what == "out":  # P's e4m3 rounding follows each block's running max
                    ref = attention_ref(q8.double() * 0.5, k8.double() * 0.25, v8.double() * 2.0, upcast=False,
                                        causal=causal, softmax_scale=d ** -0.5, window_size=window)[0]
                    assert rel_err(x2, ref) <= max(1.25 * rel_err(x1, ref), 1e-3), f"fp8 out tiles {tiles}"
                    continue
                assert (x1[live] - x2[live]).abs().max().item() <= 1e-5 * max(1.0, x1[live].abs().max().item()), \
                    f"{name} {what} tiles {tiles}"


# --------------------------------------------------------------------------------------------
# FP8 backward (flash_attn_fp8_bwd_func): e4m3 q, k, v, dO in e4m3 / e5m2, cuDNN's convention
# --------------------------------------------------------------------------------------------


def _fp8_backward(c, x, out, lse, **kw):
    """The in-repo FP8 backward of harness case ``c`` on its inputs ``x`` and the forward's ``out``, ``lse``:
    gradients in fp32, or (fp8_out) in dO's format over the case's descales."""
    from kernels.flash_attn import flash_attn_fp8_bwd_func

    grads = (dict(grad_dtype=x.grad_out.dtype, dq_descale=x.dq_descale, dk_descale=x.dk_descale,
                  dv_descale=x.dv_descale) if c.fp8_out else dict(grad_dtype=torch.float32))
    return flash_attn_fp8_bwd_func(x.grad_out, x.q, x.k, x.v, out, lse, x.q_descale, x.k_descale, x.v_descale,
                                   x.do_descale, x.ds_descale, causal=c.causal, softmax_scale=c.scale,
                                   window_size=c.window, **grads, **kw)


def _fp8_forward_and_reference(c, x):
    """(out, lse) of the in-repo FP8 forward (FP8 output for fp8_out cases), and the eager FP8 backward's
    gradients (harness.adapters.eager) on that output, real values in float32."""
    from harness import fp8
    from harness.adapters.eager import eager_fp8_attention_backward
    from kernels.flash_attn import flash_attn_fp8_func

    kw = dict(causal=c.causal, softmax_scale=c.scale, window_size=c.window)
    out, lse = flash_attn_fp8_func(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, return_lse=True,
                                   out_dtype=torch.float8_e4m3fn if c.fp8_out else c.torch_dtype, **kw)
    real = fp8.read_back(out, x.v_descale, torch.float32) if c.fp8_out else out.float()
    fp8_grads = (x.dq_descale, x.dk_descale, x.dv_descale) if c.fp8_out else (None, None, None)
    ref = eager_fp8_attention_backward(x.q, x.k, x.v, x.q_descale, x.k_descale, x.v_descale, real, lse, x.grad_out,
                                       x.do_descale, x.ds_descale, *fp8_grads, grad_fmt=c.fp8_grad, **kw)[:3]
    return out, lse, ref


def _real_grads(c, x, grads):
    from harness import fp8

    if not c.fp8_out:
        return [g.float() for g in grads]
    return [fp8.dequantize(g, d, dtype=torch.float32) for g, d in zip(grads, (x.dq_descale, x.dk_descale, x.dv_descale))]


FP8_BWD_CASES = ["B2-H4/2-S45x70-D32-causal-e4m3-grad_e5m2-bf16", "B1-H4/1-S40x40-D64-win8x0-e4m3-grad_e4m3-bf16",
                 "B1-H2-S64x64-D128-causal-e4m3-o8-grad_e4m3-bf16", "B1-H2-S64x64-D128-e4m3-o8-grad_e5m2-bf16",
                 "B1-H2-S33x50-D32-causal-e4m3-grad_e4m3-fp16", "B2-H4/2-S64x64-D64-scale1-e4m3-grad_e5m2-bf16",
                 "B1-H2/1-S40x72-D256-causal-e4m3-grad_e4m3-bf16"]


@pytest.mark.parametrize("mma_order", [False, True], ids=["keys", "mma-order"])
@pytest.mark.parametrize("case_id", FP8_BWD_CASES)
def test_fp8_backward_matches_the_fp8_reference(monkeypatch, case_id, mma_order):
    """dQ, dK, dV of the FP8 backward against the FP64 oracle on the dequantised inputs and dO, within 1.5x
    the error of the eager FP8 backward (dS's quantisation dominates both; the harness's rule allows 2x); on
    the CPU the interpreter computes what the reference does (same operands, same roundings), so within
    1e-4 of it. GQA / MQA, causal and windowed, e4m3 and e5m2 gradients, real and FP8 (fp8_out) ones; the
    copies of Q, K and dO in sequence order and in the MMA order (configs.FP8_BWD_MMA_ORDER: dS, dS^T and P^T
    relabelled to match; sequences of 33-72 put real positions in the last group's padding)."""
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from harness.check.golden import compute_oracle
    from kernels.flash_attn import configs

    monkeypatch.setattr(configs, "FP8_BWD_MMA_ORDER", mma_order)
    c = case_from_id(case_id)
    x = harness_inputs(c, seed=5, device=DEVICE)
    orc = compute_oracle(c, x)
    out, lse, ref = _fp8_forward_and_reference(c, x)
    grads = _fp8_backward(c, x, out, lse)
    fmt = x.grad_out.dtype if c.fp8_out else torch.float32
    for name, g, want, r, like in zip(("dq", "dk", "dv"), _real_grads(c, x, grads), (orc.dq, orc.dk, orc.dv), ref,
                                      (x.q, x.k, x.v)):
        assert g.shape == like.shape and torch.isfinite(g).all(), name
        err, ref_err = rel_err(g, want), rel_err(r, want)
        assert err <= 1.5 * ref_err, f"{name}: {err:.3e} against the FP8 reference's {ref_err:.3e}"
        if not CUDA:
            assert rel_err(g, r) <= 1e-4, f"{name}: {rel_err(g, r):.2e} from the reference under the interpreter"
    assert all(g.dtype == fmt for g in grads)


@pytest.mark.parametrize("case_id", ["B1-H8/1-S40x40-D32-causal-e4m3-o8-grad_e5m2-bf16",
                                     "B2-H4/2-S45x70-D32-causal-e4m3-grad_e4m3-bf16"])
def test_fp8_backward_group_split_sums_the_partials(monkeypatch, case_id):
    """MQA / GQA with few kv heads splits a group's query heads over programs (bwd.group_split; forced
    here, the interpreter has one SM): their fp32 partials summed in order, and FP8 gradients written
    over their (batch, kv head) descales by the sum (SCALED), as the unsplit kernel writes them."""
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from kernels.flash_attn import bwd

    c = case_from_id(case_id)
    x = harness_inputs(c, seed=6, device=DEVICE)
    out, lse, ref = _fp8_forward_and_reference(c, x)
    whole = _real_grads(c, x, _fp8_backward(c, x, out, lse))
    monkeypatch.setattr(bwd, "group_split", lambda batch, hk, group, sk, sms: 2)
    launched = []
    real_launch = bwd.launcher.launch
    monkeypatch.setattr(bwd.launcher, "launch", lambda fn, *a, **k: launched.append(fn.fn.__name__) or real_launch(fn, *a, **k))
    interface._SIGNATURES.clear()
    split = _real_grads(c, x, _fp8_backward(c, x, out, lse))
    assert "_sum_partials" in launched
    assert torch.equal(split[0], whole[0])  # dQ does not depend on the split
    for name, s, w, r in zip(("dk", "dv"), split[1:], whole[1:], ref[1:]):
        # the partials' sum rounds in another order: an FP8 value may fall on the other side of a tie
        assert rel_err(s, w) <= (0.02 if c.fp8_out else 1e-5), name
        assert rel_err(s, r) <= 1.5 * rel_err(w, r) + (0.02 if c.fp8_out else 1e-5), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_atomic_backwards_dq_cast_writes_every_element_rounded_once(dtype):
    """bwd._cast_dq (the atomic / fused backward's last launch): dQ's fp32 buffer into the gradient's dtype,
    element for element as torch rounds it (on a GPU; Triton's interpreter emulates bf16 by truncation, so there
    bf16 may land one unit in the last place toward zero), every element of a size that is no multiple of the block
    (the last program's tail masked) written and nothing past it; with SCALE, times the softmax scale first (2.0
    passed while SCALE is off: not applied)."""
    from kernels.flash_attn import bwd

    n = 3 * bwd.SUM_BLOCK + 77
    acc = torch.randn(n, generator=torch.Generator().manual_seed(3), dtype=torch.float32).to(DEVICE) * 1e3
    out = torch.full((n + 5, ), float("nan"), dtype=dtype, device=DEVICE)
    for scale in (None, 0.125, 0.0883883):  # SCALE off; on (the fused kernel's partials left unscaled)
        out.fill_(float("nan"))
        bwd._cast_dq[(triton.cdiv(n, bwd.SUM_BLOCK), )](acc, out, n, scale or 2.0, BLOCK=bwd.SUM_BLOCK,
                                                        SCALE=scale is not None)
        want = acc * scale if scale is not None else acc  # (fp32 multiply, then one rounding)
        assert out[n:].isnan().all()
        if dtype == torch.bfloat16 and not CUDA:  # truncated: |out| <= |want|, within one bf16 step of it
            got = out[:n].float()
            assert (got.abs() <= want.abs()).all() and ((want - got).abs() <= want.abs() * 2.0 ** -7).all()
        else:
            assert torch.equal(out[:n], want.to(dtype)), scale


@pytest.mark.parametrize("scale", [None, 0.125], ids=["scaled-partials", "unscaled-partials"])
def test_the_split_sum_launch_casts_dq_as_the_cast_launch_does(scale):
    """bwd._sum_partials with CAST_DQ (the atomic / fused backward under a group split: its last two launches in
    one): the dK / dV sums exactly as without it, and dQ's cast exactly as bwd._cast_dq writes it (SCALE_DQ: times
    the scale first), every element of sizes that are no multiple of the block, nothing past them."""
    from kernels.flash_attn import bwd

    gen = torch.Generator().manual_seed(5)
    split, nk, nv, nq, blk = 3, 2 * bwd.SUM_BLOCK + 13, bwd.SUM_BLOCK + 7, 2 * bwd.SUM_BLOCK + 77, bwd.SUM_BLOCK
    pk = torch.randn(split, nk, generator=gen).to(DEVICE)
    pv = torch.randn(split, nv, generator=gen).to(DEVICE)
    acc = (torch.randn(nq, generator=gen) * 1e3).to(DEVICE)
    unused = torch.zeros(1, device=DEVICE)

    def run(cast):
        dk, dv, dq = (torch.full((n + 5,), float("nan"), dtype=torch.float16, device=DEVICE) for n in (nk, nv, nq))
        blocks = triton.cdiv(nk, blk) + triton.cdiv(nv, blk) + (triton.cdiv(nq, blk) if cast else 0)
        bwd._sum_partials[(blocks,)](pk, pv, dk, dv, unused, unused, nk, nv, split, nk, nv, 16, 16, 1, 0, acc, dq,
                                     nq if cast else 0, scale or 2.0, BLOCK=blk, CAST_DQ=cast,
                                     SCALE_DQ=cast and scale is not None)
        return dk, dv, dq

    (dk, dv, dq), (dk0, dv0, dq0) = run(True), run(False)
    assert torch.equal(dk[:nk], dk0[:nk]) and torch.equal(dv[:nv], dv0[:nv]) and dq0.isnan().all()
    want = torch.full_like(dq, float("nan"))
    bwd._cast_dq[(triton.cdiv(nq, blk),)](acc, want, nq, scale or 2.0, BLOCK=blk, SCALE=scale is not None)
    assert torch.equal(dq[:nq], want[:nq]) and dq[nq:].isnan().all() and dk[nk:].isnan().all()
    assert dv[nv:].isnan().all() and not dq[:nq].isnan().any()
    assert torch.allclose(dk[:nk].float(), pk.sum(0), rtol=1e-3, atol=1e-3)


def test_fp8_backward_tensor_descriptors_read_what_pointers_do(monkeypatch):
    """The TMA (tensor-descriptor) loads of the FP8 backward, the sequence-contiguous copies' tiles among
    them (rows padded to 16 positions; 45 and 70 here), compute what the pointer loads do, bitwise."""
    from harness.cases import case_from_id
    from harness.cases import make_inputs as harness_inputs
    from kernels.flash_attn import configs

    c = case_from_id("B2-H4/2-S45x70-D32-causal-e4m3-o8-grad_e5m2-bf16")
    x = harness_inputs(c, seed=2, device=DEVICE)
    out, lse, _ = _fp8_forward_and_reference(c, x)
    runs = []
    for tma in (False, True):
        monkeypatch.setattr(configs, "INTERPRET_USE_TMA", tma and configs.interpreting())
        interface._SIGNATURES.clear()
        runs.append(_fp8_backward(c, x, out, lse))
    for a, b in zip(*runs):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_fp8_backward_validates_its_arguments():
    from kernels.flash_attn import flash_attn_fp8_bwd_func

    g = torch.Generator().manual_seed(0)
    f8 = lambda *s, dt=torch.float8_e4m3fn: torch.randn(*s, generator=g).to(dt).to(DEVICE)  # noqa: E731
    q, k, v, do = f8(1, 8, 2, 32), f8(1, 8, 1, 32), f8(1, 8, 1, 32), f8(1, 8, 2, 32, dt=torch.float8_e5m2)
    out, lse, ds = torch.zeros(1, 8, 2, 32, device=DEVICE), torch.zeros(1, 2, 8, device=DEVICE), torch.ones(1, 1, device=DEVICE)
    args = (q, k, v, out, lse, ds, ds, ds, ds, ds)
    with pytest.raises(ValueError, match="do: expected a .* float8_e4m3fn or float8_e5m2"):
        flash_attn_fp8_bwd_func(do.float(), *args)
    with pytest.raises(ValueError, match=r"lse: expected the forward's float32 \[B=1, Hq=2, Sq=8\]"):
        flash_attn_fp8_bwd_func(do, q, k, v, out, lse[..., :4], ds, ds, ds, ds, ds)
    with pytest.raises(ValueError, match="grad_dtype: bfloat16, float16, float32 or dO's format"):
        flash_attn_fp8_bwd_func(do, *args, grad_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="dq_descale: expected a float32 .* written over their descales"):
        flash_attn_fp8_bwd_func(do, *args, grad_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match="k_descale: expected a float32"):
        flash_attn_fp8_bwd_func(do, q, k, v, out, lse, ds, torch.ones(2, device=DEVICE), ds, ds, ds)
    with pytest.raises(ValueError, match="q: unsupported: head dim 16 in the FP8 backward"):
        flash_attn_fp8_bwd_func(do[..., :16], q[..., :16], k[..., :16], v[..., :16], out[..., :16], lse, ds, ds, ds, ds, ds)


def test_e5m2_rounding_under_the_interpreter_matches_torch():
    """The FP8 backward rounds dS and FP8 gradients to e5m2 itself under the interpreter (its own cast
    drops carries, 7.5 -> 4): that rounding, saturated at 57344, must be torch's."""
    if CUDA:
        pytest.skip("the interpreter's rounding path only runs without a GPU (the GPU casts in hardware)")
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randn(2048, generator=g) * 4, torch.rand(1024, generator=g) * 2e-4,  # normals, subnormals
                   torch.randn(1024, generator=g) * 3e4]).clamp(-57344, 57344)
    y = torch.empty_like(x)
    _round_e5m2_kernel[(1,)](x, y, N=x.numel())
    assert torch.equal(y, x.to(torch.float8_e5m2).float())


@triton.jit
def _round_e5m2_kernel(X, Y, N: tl.constexpr):
    r = tl.arange(0, N)
    tl.store(Y + r, _round_to_e5m2_signed(tl.load(X + r)))


def test_deterministic_reaches_the_backward_and_keys_the_signature(monkeypatch):
    """flash_attn_func(deterministic=...) is part of a call's signature (no replay across the two) and reaches the
    backward (where False may take the fused Gluon backward on sm90: configs.gluon_fused_bwd); both give the
    oracle's gradients."""
    seen = []
    real = interface.flash_attn_bwd

    def spy(*args, **kw):
        seen.append(kw["deterministic"])
        return real(*args, **kw)

    monkeypatch.setattr(interface, "flash_attn_bwd", spy)
    interface._SIGNATURES.clear()
    for det in (False, True):
        check_against_oracle(1, 33, 40, 2, 1, 32, torch.float32, causal=True, deterministic=det)
    assert seen == [False, True] and len(interface._SIGNATURES._d) == 2
    interface._SIGNATURES.clear()
