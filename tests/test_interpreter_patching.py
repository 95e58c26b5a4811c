"""tests/interpreter_patching.py: the interpreter's repeated work removed, its results unchanged."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="patches Triton's interpreter: runs under TRITON_INTERPRET=1 only")


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _quadruple_kernel(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, _twice(_twice(tl.load(X + offs))))


def _patched():
    from triton.runtime import interpreter as ti

    if not getattr(ti._patch_lang, "once_per_launch", False):
        pytest.skip(f"triton {triton.__version__}: not patched")
    return ti


def test_installed_on_the_checked_triton():
    import interpreter_patching

    if not triton.__version__.startswith(interpreter_patching.CHECKED_VERSIONS):
        pytest.skip(f"triton {triton.__version__}: not patched")
    assert interpreter_patching.install() == ["patch_lang_once_per_launch", "memoize_np_dtype"]


def test_flash_attention_is_bitwise_what_the_unpatched_interpreter_gives(monkeypatch):
    from kernels.flash_attn import flash_attn_func

    ti = _patched()

    def run():
        g = torch.Generator().manual_seed(3)
        q, k, v, do = (torch.randn(1, 17, h, 16, generator=g).half() for h in (2, 1, 1, 2))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        out.backward(do)
        return out, lse, q.grad, k.grad, v.grad

    patched = run()
    monkeypatch.setattr(ti, "_patch_lang", ti._patch_lang.real)
    monkeypatch.setattr(ti.GridExecutor, "__call__", ti.GridExecutor.__call__.real)
    monkeypatch.setattr(ti, "_get_np_dtype", ti._get_np_dtype.real)
    plain = run()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), patched, plain):
        assert torch.equal(a, b), name


def test_a_launch_swaps_the_language_once_and_leaves_it_as_it_was(monkeypatch):
    ti = _patched()
    swaps = []
    real = ti._patch_lang_core
    monkeypatch.setattr(ti, "_patch_lang_core", lambda lang, scope: swaps.append(lang.__name__) or real(lang, scope))
    before = {name: getattr(tl, name) for name in dir(tl)}
    x = torch.arange(16, dtype=torch.float32)
    _quadruple_kernel[(3,)](x, N=16)
    assert torch.equal(x, torch.arange(16, dtype=torch.float32) * 64)  # 3 programs, 4x each
    assert swaps == ["triton.language"]  # the launch's own; the 6 helper calls found nothing to swap
    assert {name: getattr(tl, name) for name in dir(tl)} == before
