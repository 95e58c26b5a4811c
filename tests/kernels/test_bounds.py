"""The in-repo kernels never touch memory outside their tensors, on the shapes where that goes wrong:
ragged tails, K != V, GQA, d_v != d, empty sequences, paged caches. Run under Triton's interpreter
with every enabled address checked (tests/kernels/triton_bounds.py); a kernel that reads one element past a
tensor is caught, which the first test shows.

On a GPU machine these skip: the compiled kernels do not go through the interpreter (the GPU tests
and the fuzzer's crash detection cover them there).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton_bounds import OutOfBounds, bounds_checked  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the bounds check runs the kernels in Triton's interpreter (CPU machines)")


@triton.jit
def _copy(src, dst, n, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(src + offs, mask=offs < n + EXTRA, other=0.0)
    tl.store(dst + offs, x, mask=offs < n)


def test_the_check_catches_one_element_too_many():
    src, dst = torch.randn(10), torch.empty(10)
    with bounds_checked():
        _copy[(1,)](src, dst, 10, EXTRA=0, BLOCK=16)
        # the interpreter re-raises what a kernel raises as InterpreterError(repr(error))
        with pytest.raises(Exception, match=f"{OutOfBounds.__name__}.*load of 1 element"):
            _copy[(1,)](src, dst, 10, EXTRA=1, BLOCK=16)
    assert torch.equal(dst, src)


@pytest.mark.parametrize("K, V, tma", [(32, 128, True), (32, 128, False), (128, 32, True)])
def test_linear_attention_forward_and_backward(K, V, tma, monkeypatch):
    from kernels.linear_attn import configs as cfg
    from kernels.linear_attn.chunk import chunk_linear_attn

    monkeypatch.setattr(cfg, "FWD_TMA", tma)
    monkeypatch.setattr(cfg, "BWD_TMA", tma)
    g = torch.Generator().manual_seed(K + V)
    B, T, H = 1, 65, 1  # one full chunk and one row of the next
    q = torch.randn(B, T, H, K, generator=g).half().requires_grad_()
    k = (torch.randn(B, T, H, K, generator=g) / 4).half().requires_grad_()
    v = torch.randn(B, T, H, V, generator=g).half().requires_grad_()
    gate = (-0.1 * torch.rand(B, T, H, generator=g)).requires_grad_()
    h0 = torch.randn(B, H, K, V, generator=g).requires_grad_()
    with bounds_checked():
        o, ht = chunk_linear_attn(q, k, v, g=gate, initial_state=h0, output_final_state=True)
        (o.float().sum() + ht.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, gate, h0))


def test_flash_attention_gqa_causal_d_v_not_d():
    from kernels.flash_attn import flash_attn_func

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 19, 4, 32, generator=g).half().requires_grad_()  # 19 x 37: ragged tiles of 16
    k = torch.randn(1, 37, 2, 32, generator=g).half().requires_grad_()
    v = torch.randn(1, 37, 2, 48, generator=g).half().requires_grad_()
    with bounds_checked():
        out = flash_attn_func(q, k, v, causal=True)
        out.float().sum().backward()
    assert out.shape == (1, 19, 4, 48) and torch.isfinite(q.grad).all()


def test_flash_attention_varlen_with_an_empty_sequence():
    from kernels.flash_attn import flash_attn_varlen_func

    g = torch.Generator().manual_seed(2)
    lq, lk = [5, 0, 17], [9, 3, 0]
    cu_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lq), 2, 16, generator=g).half().requires_grad_()
    k = torch.randn(sum(lk), 2, 16, generator=g).half().requires_grad_()
    v = torch.randn(sum(lk), 2, 16, generator=g).half().requires_grad_()
    with bounds_checked():
        out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk))
        out.float().sum().backward()
    assert torch.isfinite(out).all()


def test_decode_paged_cache_with_new_tokens():
    from kernels.decode import decode_attention

    g = torch.Generator().manual_seed(3)
    B, Hq, Hk, D, page = 2, 4, 2, 32, 16
    lens = torch.tensor([0, 21], dtype=torch.int32)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)  # 2 pages a sequence, out of order
    k_pool, v_pool = torch.randn(4, page, Hk, D, generator=g).half(), torch.randn(4, page, Hk, D, generator=g).half()
    q = torch.randn(B, 2, Hq, D, generator=g).half()
    k_new, v_new = torch.randn(B, 2, Hk, D, generator=g).half(), torch.randn(B, 2, Hk, D, generator=g).half()
    with bounds_checked():
        out = decode_attention(q, k_pool, v_pool, k_new, v_new, cache_seqlens=lens, block_table=table)
    assert out.shape == (B, 2, Hq, D) and torch.isfinite(out).all()
