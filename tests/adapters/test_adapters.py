"""Adapters: the registry, supports() reasons on a CPU machine, and the CPU-runnable adapters
against the FP64 oracle (values and autograd gradients), including the conventions that are easy
to get wrong: bottom-right causal with Sq != Sk, windows, GQA, softcap, varlen, dead rows."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import sys
import textwrap
import uuid
import warnings
from pathlib import Path

import pytest
import torch

from harness.adapters import Unsupported, all_adapters, from_spec, get, names, registry
from harness.adapters.eager import eager_attention, eager_attention_varlen, eager_linear_attention
from harness.cases import LinearCase, SoftmaxCase, make_inputs
from harness.oracle import linear_attention, softmax_attention, softmax_attention_varlen
from harness.presets import preset

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]
# fp32 adapters vs the fp64 oracle on these small shapes land near 3e-7; 1e-5 leaves room for
# reduction order while still failing any convention error (those are O(1)).
FP32_RTOL = 1e-5

REQUIRED = {
    "softmax": [
        "eager",
        "sdpa_math",
        "sdpa_flash",
        "sdpa_efficient",
        "sdpa_cudnn",
        "sdpa",
        "flex",
        "flash_attn",
        "flash_attn3",
        "flash_attn_cute",
        "triton_fa",
    ],
    "linear": ["eager_linear", "fla_chunk", "fla_fused_chunk", "fla_recurrent", "triton_la_chunk"],
}

SMALL = preset("small")
SMALL_LINEAR = preset("small-linear")
VARLEN = next(c for c in SMALL if c.is_varlen)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def lse_close(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> bool:
    """Same -inf pattern, finite entries within atol."""
    dead = torch.isneginf(want)
    if not torch.equal(torch.isneginf(got), dead):
        return False
    return bool(((got.double() - want)[~dead].abs() <= atol).all())


def run_softmax(adapter, case, inputs):
    """Run with autograd; returns (output, dq, dk, dv)."""
    q, k, v = (t.clone().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
    extra = {}
    if case.is_varlen:
        extra = dict(cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k)
    res = adapter.run(case, q=q, k=k, v=v, **extra)
    res.out.backward(inputs.grad_out)
    return res, q.grad, k.grad, v.grad


def oracle_softmax(case, inputs):
    if case.is_varlen:
        return softmax_attention_varlen(
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.cu_seqlens_q,
            inputs.cu_seqlens_k,
            inputs.grad_out,
            **case.oracle_kwargs,
        )
    return softmax_attention(inputs.q, inputs.k, inputs.v, inputs.grad_out, **case.oracle_kwargs)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(REQUIRED))
def test_registry_has_every_required_adapter_with_its_family(family):
    registered = names(family)
    missing = [n for n in REQUIRED[family] if n not in registered]
    assert not missing, f"missing {family} adapters: {missing}"
    for n in REQUIRED[family]:
        assert get(n).family == family


def test_every_adapter_refuses_the_other_family_with_words():
    for adapter in all_adapters():
        case = SMALL_LINEAR[0] if adapter.family == "softmax" else SMALL[0]
        reason = adapter.supports(case, CPU)
        assert isinstance(reason, str) and "case" in reason, (adapter.name, reason)


def test_every_cpu_reason_is_plain_words():
    for adapter in all_adapters():
        for case in SMALL + SMALL_LINEAR:
            if case.family != adapter.family:
                continue
            reason = adapter.supports(case, CPU)
            assert reason is None or (isinstance(reason, str) and len(reason) > 8 and "\n" not in reason)


def test_importing_the_adapters_imports_no_optional_package(forked_python):
    code = (
        "import sys; from harness.adapters import all_adapters; all_adapters(); "
        "print([m for m in ('flash_attn', 'flash_attn_interface', 'fla', 'kernels') if m in sys.modules])"
    )
    # a fresh `python -c` forked from a process that imported torch alone (tests/forked_python.py)
    out = forked_python([sys.executable, "-c", code], cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize(
    "name, words",
    [
        ("sdpa_cudnn", "needs CUDA"),
        ("sdpa_efficient", "needs CUDA"),
        ("flex", "needs CUDA"),
        ("flash_attn", "not installed"),
        ("flash_attn3", "not installed"),
        ("flash_attn_cute", "not installed"),
    ],
)
def test_cpu_reasons_name_the_missing_piece(name, words):
    assert words in get(name).supports(SMALL[1], CPU)


@pytest.mark.parametrize("name", ["fla_chunk", "fla_fused_chunk", "fla_recurrent"])
def test_fla_on_cpu_says_not_installed_or_needs_cuda(name):
    reason = get(name).supports(SMALL_LINEAR[1], CPU)
    assert "fla not installed" in reason or "needs a CUDA device" in reason


@pytest.mark.parametrize("name, case", [("triton_fa", SMALL[1]), ("triton_la_chunk", SMALL_LINEAR[1])])
def test_inrepo_without_cuda_or_interpreter_says_how_to_run(monkeypatch, name, case):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = get(name).supports(case, CPU)
    assert reason is not None and ("TRITON_INTERPRET=1" in reason or "not importable" in reason)


@pytest.mark.parametrize("name, case", [("triton_fa", SMALL[1]), ("triton_la_chunk", SMALL_LINEAR[1])])
def test_inrepo_kernel_that_does_not_import_is_a_clean_reason(name, case):
    adapter = type(get(name))()
    adapter.module = f"kernels.no_such_kernel_{uuid.uuid4().hex[:8]}"
    reason = adapter.supports(case, CPU)
    assert reason.startswith("in-repo kernel not importable") and adapter.module in reason
    with pytest.raises(Unsupported, match="not importable"):
        inp = make_inputs(case)
        adapter.run(case, q=inp.q, k=inp.k, v=inp.v)


def _flash_recording(seen, default):
    """A stand-in flash_attn_func that records the ``deterministic`` it was called with (``default`` when none)."""
    def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), return_lse=False,
                        deterministic=default):
        seen.append(deterministic)
        return q
    return flash_attn_func


def _flash_without_deterministic(seen):
    """A stand-in flash_attn_func of an older kernel: no ``deterministic`` parameter (records "absent")."""
    def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), return_lse=False):
        seen.append("absent")
        return q
    return flash_attn_func


def _adapter_on(monkeypatch, backend, fn):
    """A fresh ``backend`` adapter whose kernel module is a stand-in with ``flash_attn_func = fn``."""
    import types

    name = f"fake_kernels_{uuid.uuid4().hex[:8]}"
    monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(flash_attn_func=fn))
    adapter = type(get(backend))()
    adapter.module = name
    return adapter


def test_triton_fa_asks_for_the_fast_backward_and_declares_it_nondeterministic(monkeypatch):
    """triton_fa calls flash_attn_func(..., deterministic=False) where the function takes the keyword (flash-attn's
    default: the fused backward adds dQ in arrival order), not where it does not (an older kernel), and declares
    a nondeterministic backward so the determinism property reports the spread instead of failing."""
    from harness.adapters import inrepo

    seen = []
    case = SMALL[0]
    inp = make_inputs(case)
    for fn, want in ((_flash_recording(seen, True), False), (_flash_without_deterministic(seen), "absent")):
        _adapter_on(monkeypatch, "triton_fa", fn).run(case, q=inp.q, k=inp.k, v=inp.v)
        assert seen[-1] == want
    # declared per case (deterministic_backward_for): off an sm90 GPU every backward is the split route's
    assert inrepo.TritonFA().deterministic_backward_for(case, CPU) is True


def test_triton_fa_det_calls_the_kernels_default_and_declares_it_deterministic(monkeypatch):
    """triton_fa_det calls flash_attn_func(..., deterministic=True) (the kernel's own default: the backward in a
    fixed order) and holds it to the determinism check everywhere, the fused cells triton_fa declares
    nondeterministic included (sm90 faked); a kernel without the keyword is refused with the reason (it would time
    triton_fa's call again), and so is a device other than an sm90 GPU (the call there is triton_fa's: the fused
    backward runs on sm90 only); FLASH_ATTN_BWD=atomic (dQ by atomics whatever the call) is declared as such."""
    seen = []
    case = SMALL[0]
    inp = make_inputs(case)
    adapter = _adapter_on(monkeypatch, "triton_fa_det", _flash_recording(seen, False))
    assert "run triton_fa here" in adapter.supports(case, CPU)  # (the same call as triton_fa's off sm90)
    adapter.run(case, q=inp.q, k=inp.k, v=inp.v)
    assert seen == [True]
    older = _adapter_on(monkeypatch, "triton_fa_det", _flash_without_deterministic(seen))
    assert "no deterministic parameter" in older.supports(case, CPU)
    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    from kernels.flash_attn import configs

    least = configs.BWD_GLUON_FUSED[128][False, False][0]
    fused = SoftmaxCase(1, 4, 4, least, least, 128, dtype="bf16")
    gpu = torch.device("cuda")
    assert get("triton_fa").deterministic_backward_for(fused, gpu) is False
    assert get("triton_fa_det").deterministic_backward_for(fused, gpu) is True
    monkeypatch.setenv("FLASH_ATTN_BWD", "atomic")
    assert get("triton_fa_det").deterministic_backward_for(fused, gpu) is False


def test_triton_fa_declares_nondeterministic_only_the_fused_backward_cells(monkeypatch):
    """On an sm90 GPU (capability faked here) triton_fa declares a nondeterministic backward exactly where the
    kernel's fused backward runs (configs.fused_bwd_cell: MHA hd 128 from 1k (sessions 44 / 46), hd 64 non-causal
    from 2k (session 59), causal from 1k (session 46); GQA / MQA from their cells' lengths (session 59: hd 128 causal
    from 8k); bf16 / fp16, causal or no mask, dense) and under FLASH_ATTN_BWD=atomic; short, fp32, windowed, softcap
    and varlen cells, and GQA below its cell's length, stay declared deterministic (a difference between two runs
    fails there)."""
    from harness.adapters import inrepo
    from kernels.flash_attn import configs

    monkeypatch.delenv("FLASH_ATTN_BWD", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    adapter, gpu = inrepo.TritonFA(), torch.device("cuda")
    least = configs.BWD_GLUON_FUSED[128][False, False][0]
    mha = SoftmaxCase(1, 4, 4, least, least, 128, dtype="bf16")
    assert adapter.deterministic_backward_for(mha, gpu) is False
    least_c = configs.BWD_GLUON_FUSED[128][False, True][0]  # (causal from its own length: 1k since session 46)
    causal = dataclasses.replace(mha, causal=True, dtype="fp16", seqlen_q=least_c, seqlen_k=least_c)
    assert adapter.deterministic_backward_for(causal, gpu) is False
    shorter_c = dataclasses.replace(causal, seqlen_q=least_c - 1, seqlen_k=least_c - 1)
    assert adapter.deterministic_backward_for(shorter_c, gpu) is True  # (below its own length: the split route)
    gqa_c = configs.BWD_GLUON_FUSED[128][True, True][0]  # (GQA causal hd 128: from 8k since session 59)
    gqa = dataclasses.replace(causal, heads_k=2, seqlen_q=gqa_c, seqlen_k=gqa_c)
    assert adapter.deterministic_backward_for(gqa, gpu) is False
    shorter_gqa = dataclasses.replace(gqa, seqlen_q=gqa_c - 1, seqlen_k=gqa_c - 1)
    for other in (shorter_gqa, dataclasses.replace(mha, seqlen_q=least - 1),
                  dataclasses.replace(mha, dtype="fp32"), dataclasses.replace(mha, window=(64, 64)),
                  dataclasses.replace(mha, softcap=30.0)):
        assert adapter.deterministic_backward_for(other, gpu) is True, other
    nc64 = configs.BWD_GLUON_FUSED[64][False, False][0]  # hd 64 non-causal: from its own length (session 59: 2k)
    hd64nc = dataclasses.replace(mha, d=64, d_v=64, seqlen_q=nc64, seqlen_k=nc64)
    assert adapter.deterministic_backward_for(hd64nc, gpu) is False
    assert adapter.deterministic_backward_for(dataclasses.replace(hd64nc, seqlen_q=nc64 - 1), gpu) is True
    least64 = configs.BWD_GLUON_FUSED[64][False, True][0]  # hd 64 causal: from its own length (session 46: 1k)
    hd64 = dataclasses.replace(mha, d=64, d_v=64, causal=True, seqlen_q=least64, seqlen_k=least64)
    assert adapter.deterministic_backward_for(hd64, gpu) is False
    shorter = dataclasses.replace(hd64, seqlen_q=least64 - 1, seqlen_k=least64 - 1)
    assert adapter.deterministic_backward_for(shorter, gpu) is True
    assert adapter.deterministic_backward_for(mha, CPU) is True
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert adapter.deterministic_backward_for(mha, gpu) is True
    monkeypatch.setenv("FLASH_ATTN_BWD", "atomic")
    assert adapter.deterministic_backward_for(dataclasses.replace(mha, heads_k=2), gpu) is False


def test_inrepo_interpreter_reasons(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from harness.adapters import inrepo

    assert inrepo._device_reason(SMALL[0].with_dtype("bf16"), CPU).startswith(
        "the Triton interpreter multiplies bf16"
    )
    assert inrepo._device_reason(SMALL[0], CPU) is None
    assert inrepo._device_reason(SMALL[0], torch.device("meta")) == inrepo.NEEDS_CUDA
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert inrepo._device_reason(SMALL[0], CPU) == inrepo.NEEDS_CUDA


def test_inrepo_kernel_unsupported_value_error_becomes_unsupported():
    from harness.adapters.inrepo import _as_unsupported

    assert str(_as_unsupported(ValueError("q: unsupported: head dim 20"))) == "unsupported: head dim 20"
    assert str(_as_unsupported(ValueError("unsupported: dtype x"))) == "unsupported: dtype x"
    assert _as_unsupported(ValueError("q: expected rank 4")) is None  # a bad argument stays an error


# ---------------------------------------------------------------------------------------------
# Eager (the reference in the candidate's dtype)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SMALL, ids=str)
def test_eager_matches_oracle_values_lse_and_grads(case):
    adapter = get("eager")
    assert adapter.supports(case, CPU) is None
    inp = make_inputs(case)
    res, dq, dk, dv = run_softmax(adapter, case, inp)
    ref = oracle_softmax(case, inp)
    assert res.out.dtype == inp.q.dtype and res.out.shape == ref.out.shape
    assert rel(res.out, ref.out) < FP32_RTOL
    assert res.lse is not None and res.lse.shape == ref.lse.shape and lse_close(res.lse, ref.lse)
    for got, want in ((dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        assert torch.isfinite(got).all()
        assert rel(got, want) < FP32_RTOL


def test_eager_dead_rows_give_zero_out_neg_inf_lse_and_finite_grads():
    # Sq > Sk causal (bottom-right): the first Sq - Sk rows see no key; a window adds more.
    case = SoftmaxCase(1, 2, 2, 12, 5, 8, causal=True, window=(1, 0))
    inp = make_inputs(case)
    q, k, v = (t.clone().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out, lse = eager_attention(q, k, v, **case.oracle_kwargs)
    (out * inp.grad_out).sum().backward()
    assert torch.all(out[:, :7] == 0) and torch.isneginf(lse[..., :7]).all()
    assert torch.isfinite(lse[..., 7:]).all()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert torch.all(q.grad[:, :7] == 0)


def test_eager_varlen_with_an_empty_key_sequence():
    case = SoftmaxCase(1, 2, 1, 0, 0, 8, varlen=((3, 0), (4, 6)))
    inp = make_inputs(case)
    q, k, v = (t.clone().requires_grad_() for t in (inp.q, inp.k, inp.v))
    out, lse = eager_attention_varlen(q, k, v, inp.cu_seqlens_q, inp.cu_seqlens_k)
    ref = softmax_attention_varlen(inp.q, inp.k, inp.v, inp.cu_seqlens_q, inp.cu_seqlens_k, inp.grad_out)
    out.backward(inp.grad_out)
    assert rel(out, ref.out) < FP32_RTOL and lse_close(lse, ref.lse)
    assert rel(q.grad, ref.dq) < FP32_RTOL and rel(k.grad, ref.dk) < FP32_RTOL


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_eager_keeps_the_input_dtype_and_lands_near_the_oracle(dtype):
    case = SoftmaxCase(1, 4, 2, 40, 56, 32, causal=True, dtype=dtype)
    inp = make_inputs(case)
    out, lse = eager_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs)
    ref = softmax_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs)
    assert out.dtype == case.torch_dtype and lse.dtype == torch.float32
    eps = torch.finfo(case.torch_dtype).eps
    assert eps / 10 < rel(out, ref.out) < 10 * eps  # rounded like the dtype, no worse


@pytest.mark.parametrize("case", SMALL_LINEAR, ids=str)
def test_eager_linear_matches_oracle_values_state_and_grads(case):
    adapter = get("eager_linear")
    assert adapter.supports(case, CPU) is None
    inp = make_inputs(case)
    leaves = {
        n: t.clone().requires_grad_()
        for n, t in inp.tensors().items()
        if n not in ("grad_out", "grad_final_state")
    }
    res = adapter.run(
        case,
        q=leaves["q"],
        k=leaves["k"],
        v=leaves["v"],
        g=leaves.get("g"),
        g_gamma=leaves.get("g_gamma"),
        initial_state=leaves.get("initial_state"),
    )
    loss = (res.out * inp.grad_out).sum()
    if inp.grad_final_state is not None:
        loss = loss + (res.final_state * inp.grad_final_state).sum()
    loss.backward()
    ref = linear_attention(
        inp.q,
        inp.k,
        inp.v,
        inp.grad_out,
        g=inp.g,
        g_gamma=inp.g_gamma,
        initial_state=inp.initial_state,
        grad_final_state=inp.grad_final_state,
        **case.oracle_kwargs,
    )
    assert res.out.dtype == inp.q.dtype and res.final_state.dtype == torch.float32
    assert rel(res.out, ref.out) < FP32_RTOL
    assert rel(res.final_state, ref.final_state) < FP32_RTOL
    pairs = [
        ("q", ref.dq),
        ("k", ref.dk),
        ("v", ref.dv),
        ("g", ref.dg),
        ("g_gamma", ref.dg),
        ("initial_state", ref.dh0),
    ]
    for name, want in pairs:
        if name in leaves:
            # dg is a reverse cumulative sum of differences: allow a little more
            tol = 2e-5 if name.startswith("g") else FP32_RTOL
            assert rel(leaves[name].grad, want) < tol, name


def test_eager_linear_long_sequence_strong_decay_stays_finite():
    # 40 chunks of strong decay: a whole-sequence cumulative log-decay would underflow exp.
    case = LinearCase(1, 1, 2560, 32, gate="g", gate_n=0.1)
    inp = make_inputs(case)
    o, s = eager_linear_attention(inp.q, inp.k, inp.v, g=inp.g, initial_state=inp.initial_state)
    ref = linear_attention(inp.q, inp.k, inp.v, g=inp.g, initial_state=inp.initial_state)
    assert torch.isfinite(o).all() and rel(o, ref.out) < FP32_RTOL and rel(s, ref.final_state) < FP32_RTOL


# ---------------------------------------------------------------------------------------------
# torch SDPA
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["sdpa_math", "sdpa", "sdpa_flash"])
@pytest.mark.parametrize("case", [c for c in SMALL if not c.softcap and not c.is_varlen], ids=str)
def test_sdpa_matches_oracle_values_and_grads(name, case):
    adapter = get(name)
    if name == "sdpa_flash" and case.d_v != case.d:
        pytest.skip("torch's flash kernel needs d_v == d (tested as unsupported below)")
    assert adapter.supports(case, CPU) is None
    inp = make_inputs(case)
    res, dq, dk, dv = run_softmax(adapter, case, inp)
    ref = oracle_softmax(case, inp)
    assert res.out.shape == ref.out.shape
    assert rel(res.out, ref.out) < FP32_RTOL
    for got, want in ((dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        assert rel(got, want) < FP32_RTOL


@pytest.mark.parametrize("sq, sk", [(24, 40), (40, 24)])
def test_sdpa_math_causal_is_bottom_right_not_torchs_top_left(sq, sk):
    case = SoftmaxCase(1, 2, 2, sq, sk, 16, causal=True)
    inp = make_inputs(case)
    res = get("sdpa_math").run(case, q=inp.q, k=inp.k, v=inp.v)
    ref = softmax_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs)
    assert rel(res.out, ref.out) < FP32_RTOL
    # The check bites: torch's own is_causal (top-left) lands far from the oracle here.
    top_left = torch.nn.functional.scaled_dot_product_attention(
        inp.q.transpose(1, 2), inp.k.transpose(1, 2), inp.v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    assert rel(top_left, ref.out) > 0.1


def test_forced_sdpa_backend_that_cannot_run_reports_torchs_reason():
    case = SoftmaxCase(1, 2, 2, 16, 16, 32, d_v=16)  # torch's flash kernel needs equal head dims
    inp = make_inputs(case)
    with pytest.raises(Unsupported) as err:
        get("sdpa_flash").run(case, q=inp.q, k=inp.k, v=inp.v)
    msg = str(err.value)
    assert (
        msg.startswith("unsupported: ") and "same last dimension" in msg and "Triggered internally" not in msg
    )


def test_forced_sdpa_backend_without_native_gqa_gets_repeated_kv_on_the_same_backend(monkeypatch):
    real = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def no_gqa(q, k, v, **kw):  # a backend that, like some torch builds' cuDNN, refuses enable_gqa
        calls.append((k.shape[1], kw.get("enable_gqa", False), torch.backends.cuda.math_sdp_enabled()))
        if kw.get("enable_gqa"):
            warnings.warn("Both fused kernels require query, key and value to have the same num_heads.")
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", no_gqa)
    case = SoftmaxCase(1, 4, 2, 24, 40, 16, causal=True)
    inp = make_inputs(case)
    res = get("sdpa_flash").run(case, q=inp.q, k=inp.k, v=inp.v)
    assert rel(res.out, softmax_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs).out) < FP32_RTOL
    # Both calls under the forced flash backend (math disabled), the second with repeated kv heads.
    assert calls == [(2, True, False), (4, False, False)]


def test_forced_sdpa_backend_leaves_torchs_backend_state_as_it_was():
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    case = SoftmaxCase(1, 2, 2, 16, 16, 32, d_v=16)
    inp = make_inputs(case)
    with pytest.raises(Unsupported):
        get("sdpa_flash").run(case, q=inp.q, k=inp.k, v=inp.v)
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


@pytest.mark.parametrize("name", ["sdpa_math", "sdpa", "sdpa_flash"])
def test_sdpa_refuses_softcap_and_varlen_in_words(name):
    assert (
        get(name).supports(SoftmaxCase(1, 2, 2, 8, 8, 16, softcap=5.0), CPU)
        == "softcap is not supported by torch SDPA"
    )
    assert "variable-length" in get(name).supports(VARLEN, CPU)


# ---------------------------------------------------------------------------------------------
# FlexAttention: the conventions (masks, softcap, GQA, lse base) checked through uncompiled
# flex_attention on the CPU; the compiled adapter itself is CUDA-only.
# ---------------------------------------------------------------------------------------------


# Bottom-right causal with Sq < Sk and GQA, causal Sq > Sk (dead rows), window, softcap.
FLEX_CASES = [SMALL[2], SMALL[3], SMALL[4], SMALL[5]]


@pytest.mark.parametrize("case", FLEX_CASES, ids=str)
def test_flex_masks_softcap_gqa_and_natural_log_lse_match_oracle(case):
    from torch.nn.attention.flex_attention import flex_attention

    from harness.adapters.flex import flex_call

    inp = make_inputs(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile"
        out, lse = flex_call(flex_attention, case, inp.q, inp.k, inp.v)
    ref = softmax_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs)
    assert rel(out, ref.out) < FP32_RTOL
    assert lse_close(lse, ref.lse)


def test_compiled_call_that_hits_the_recompile_limit_is_reported_not_run():
    from harness.adapters.flex import call_without_fallback

    # backend="eager": dynamo's guards and limits without inductor's C++ compile time.
    fn = torch.compile(lambda x: x.sin() + 1, backend="eager", dynamic=False, fullgraph=True)
    with torch._dynamo.config.patch(**{_limit_name(): 2}):
        assert torch.equal(
            call_without_fallback(fn, torch.ones(1), recompile_limit=2), torch.ones(1).sin() + 1
        )
        call_without_fallback(fn, torch.ones(2), recompile_limit=2)
        with pytest.raises(Unsupported, match="flex fell back to eager: .*(recompile|cache_size)"):
            call_without_fallback(fn, torch.ones(3), recompile_limit=2)


def test_compiled_call_with_a_graph_break_is_reported_not_run():
    from harness.adapters.flex import call_without_fallback

    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    fn = torch.compile(breaks, backend="eager", fullgraph=True)
    with pytest.raises(Unsupported, match="flex fell back to eager"):
        call_without_fallback(fn, torch.ones(4))


def test_compile_with_no_valid_kernel_choice_is_unsupported():
    from harness.adapters.flex import call_without_fallback

    class NoValidChoicesError(RuntimeError):  # the shape of inductor's error (its class is private)
        pass

    def refuses(x):
        raise RuntimeError("LoweringException: NoValidChoicesError: No choices to select") from NoValidChoicesError()

    with pytest.raises(Unsupported, match="FlexAttention cannot compile this case"):
        call_without_fallback(refuses, torch.ones(1))


def _limit_name():
    from harness.adapters.flex import _limit_name

    return _limit_name()


# ---------------------------------------------------------------------------------------------
# flash-attn packages: the convention fix-ups that can be checked without the packages
# ---------------------------------------------------------------------------------------------


def test_flash_adapters_declare_their_lse_on_empty_rows_and_the_checker_maps_it():
    """flash-attn writes +inf lse on rows that see no key: the adapters declare it (nothing in their
    timed call maps it) and the checker maps it to -inf on those rows only, dense and varlen layouts."""
    from harness.adapters import decode, flash_attn
    from harness.check.verify import _map_empty_rows

    assert flash_attn._FlashAdapter.lse_empty_rows == math.inf
    assert decode._VendorDecode.lse_empty_rows == math.inf

    class Run:
        def __init__(self, lse):
            self.tensors = {"lse": lse}

    dead = torch.zeros(2, 6, 3, dtype=torch.bool)  # (B, Sq, Hq): rows 0, 1 see no key
    dead[:, :2] = True
    run = Run(torch.full((2, 3, 6), math.inf))
    _map_empty_rows(flash_attn.FlashAttnCute(), run, dead)
    assert torch.isneginf(run.tensors["lse"][..., :2]).all()
    assert torch.isposinf(run.tensors["lse"][..., 2:]).all()  # a +inf on a live row stays, for the check to fail
    varlen_dead = torch.tensor([[True, True], [True, True], [False, False], [False, False], [False, False]])
    run = Run(torch.full((2, 5), math.inf))  # varlen lse (Hq, total_q)
    _map_empty_rows(flash_attn.FlashAttnCute(), run, varlen_dead)
    assert torch.isneginf(run.tensors["lse"][:, :2]).all() and torch.isposinf(run.tensors["lse"][:, 2:]).all()
    run = Run(torch.full((2, 3, 6), math.inf))
    _map_empty_rows(object(), run, dead)  # no declaration: nothing mapped
    assert torch.isposinf(run.tensors["lse"]).all()


def test_flash_attn_cute_refuses_gqa_with_a_value_head_dim_of_its_own(monkeypatch):
    """flash-attn-4's GQA backward asserts d == d_v (the H100 fuzzer hit the assertion 3 times in 6
    cases): a stated limit, so the case is unsupported with that reason instead of an error."""
    from harness.adapters.flash_attn import FlashAttnCute

    def fa4(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0):
        raise AssertionError("not called")

    monkeypatch.setattr(FlashAttnCute, "_probe", lambda self: (fa4, None, None))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    a, cuda = FlashAttnCute(), torch.device("cuda")
    why = a.supports(SoftmaxCase(3, 32, 2, 32, 64, 64, d_v=96, dtype="bf16"), cuda)
    assert why and "GQA backward requires head_dim == head_dim_v" in why
    assert a.supports(SoftmaxCase(3, 32, 32, 32, 64, 64, d_v=96, dtype="bf16"), cuda) is None  # MHA: runs
    assert a.supports(SoftmaxCase(3, 32, 2, 32, 64, 64, dtype="bf16"), cuda) is None  # GQA, d == d_v: runs


def test_flash_attn_cute_gets_none_for_unbounded_window_sides():
    from harness.adapters.flash_attn import FlashAttn2, FlashAttnCute

    case = SoftmaxCase(1, 2, 2, 8, 8, 16, window=(3, -1))
    assert FlashAttnCute()._window(case) == (3, None)
    assert FlashAttn2()._window(case) == (3, -1)


# ---------------------------------------------------------------------------------------------
# User callables: module:function and the entry-point group
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A fresh importable module in tmp_path (unique name); the current directory is tmp_path."""
    name = f"userattn_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import torch
            from harness.adapters.eager import eager_attention, eager_attention_varlen, eager_linear_attention

            CONSTANT = 3
            CALLS = []

            def attn(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), **kw):
                CALLS.append(sorted(kw))
                return eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                       window_size=window_size, **kw)

            def attn_out_only(q, k, v, **kw):
                return eager_attention(q, k, v, **kw)[0]

            def no_window(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
                if window_size != (-1, -1):
                    raise NotImplementedError("no local windows in this kernel")
                return eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale)
            no_window.attn_capabilities = {"window": False, "backward": False, "dtypes": ["fp32"]}

            def refuses(q, k, v, **kw):
                raise NotImplementedError("head dim 32 is not tuned yet")

            def varlen_attn(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                            max_seqlen_k=None, **kw):
                CALLS.append(("varlen", max_seqlen_q, max_seqlen_k))
                return eager_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw)
            varlen_attn.attn_capabilities = {"varlen": True}

            def linear(q, k, v, g=None, g_gamma=None, *, scale=None, initial_state=None,
                       output_final_state=False):
                return eager_linear_attention(q, k, v, g=g, g_gamma=g_gamma, scale=scale,
                                              initial_state=initial_state)

            class Ns:
                @staticmethod
                def attn(q, k, v, **kw):
                    return eager_attention(q, k, v, **kw)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # registrations stay in this test
    yield name
    sys.modules.pop(name, None)


def test_user_callable_from_spec_matches_oracle_and_gets_softcap_only_when_set(user_module):
    adapter = from_spec(f"{user_module}:attn")
    assert adapter.name == f"{user_module}:attn" and get(f"{user_module}:attn") is adapter
    mod = sys.modules[user_module]
    for case in (SMALL[2], SMALL[5]):  # causal Sq != Sk with GQA, then softcap
        assert adapter.supports(case, CPU) is None
        inp = make_inputs(case)
        res, dq, dk, dv = run_softmax(adapter, case, inp)
        ref = oracle_softmax(case, inp)
        assert rel(res.out, ref.out) < FP32_RTOL and lse_close(res.lse, ref.lse)
        for got, want in ((dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
            assert rel(got, want) < FP32_RTOL
    assert mod.CALLS == [[], ["softcap"]]


def test_user_callable_returning_out_only_and_dotted_path(user_module):
    case = SMALL[1]
    inp = make_inputs(case)
    for spec in (f"{user_module}:attn_out_only", f"{user_module}:Ns.attn"):
        res = from_spec(spec).run(case, q=inp.q, k=inp.k, v=inp.v)
        assert rel(res.out, softmax_attention(inp.q, inp.k, inp.v, **case.oracle_kwargs).out) < FP32_RTOL
    assert from_spec(f"{user_module}:attn_out_only").run(case, q=inp.q, k=inp.k, v=inp.v).lse is None


def test_user_callable_capabilities_and_not_implemented(user_module):
    adapter = from_spec(f"{user_module}:no_window")
    assert adapter.differentiable is False
    assert (
        adapter.supports(SoftmaxCase(1, 2, 2, 8, 8, 16, window=(2, 2)), CPU) == "declares no window support"
    )
    assert "fp16" in adapter.supports(SoftmaxCase(1, 2, 2, 8, 8, 16, dtype="fp16"), CPU)
    assert adapter.supports(SMALL[0], CPU) is None
    assert "varlen" in adapter.supports(VARLEN, CPU)  # varlen needs an explicit declaration
    # A callable that refuses at run time: Unsupported with its message.
    case = SoftmaxCase(1, 2, 2, 8, 8, 32, window=(2, 2))
    inp = make_inputs(case)
    with pytest.raises(Unsupported, match="declared unsupported by the implementation: no local windows"):
        adapter.run(case, q=inp.q, k=inp.k, v=inp.v)
    with pytest.raises(Unsupported, match="declared unsupported by the implementation: head dim 32"):
        from_spec(f"{user_module}:refuses").run(case, q=inp.q, k=inp.k, v=inp.v)
    assert get("eager").differentiable is True  # an instance's capability does not leak to the class


def test_user_callable_may_declare_flash_attns_lse_on_empty_rows():
    """``attn_capabilities["lse_empty_rows"]``: a callable that writes +inf lse on rows that see no key
    (flash-attn's convention, e.g. the accept shims over flash-attn-4) declares it and passes; without
    the declaration masked_rows fails; a non-number is refused when the adapter is made."""
    from harness.adapters.eager import eager_attention
    from harness.adapters.user import make_callable_adapter
    from harness.check.verify import verify

    def flash_style(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0):
        out, lse = eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                                   softcap=softcap)
        return out, torch.where(torch.isneginf(lse), math.inf, lse)

    case = SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True)  # Sq > Sk: 37 rows see no key
    flash_style.attn_capabilities = {"lse_empty_rows": math.inf}
    declared = verify(make_callable_adapter(flash_style, name="flash_style"), case)
    assert declared.status == "pass" and declared.property("masked_rows").status == "pass", declared.message()
    flash_style.attn_capabilities = {}
    undeclared = verify(make_callable_adapter(flash_style, name="flash_style"), case)
    assert undeclared.property("masked_rows").status == "fail", undeclared.message()
    flash_style.attn_capabilities = {"lse_empty_rows": "inf"}
    with pytest.raises(ValueError, match="lse_empty_rows"):
        make_callable_adapter(flash_style, name="flash_style")


def test_user_callable_varlen_convention(user_module):
    adapter = from_spec(f"{user_module}:varlen_attn")
    case = VARLEN
    assert adapter.supports(case, CPU) is None
    inp = make_inputs(case)
    res, dq, dk, dv = run_softmax(adapter, case, inp)
    ref = oracle_softmax(case, inp)
    assert rel(res.out, ref.out) < FP32_RTOL
    for got, want in ((dq, ref.dq), (dk, ref.dk), (dv, ref.dv)):
        assert rel(got, want) < FP32_RTOL
    assert sys.modules[user_module].CALLS == [("varlen", case.seqlen_q, case.seqlen_k)]


def test_user_linear_callable(user_module):
    adapter = from_spec(f"{user_module}:linear", family="linear")
    case = SMALL_LINEAR[2]
    assert adapter.family == "linear" and adapter.supports(case, CPU) is None
    inp = make_inputs(case)
    res = adapter.run(case, q=inp.q, k=inp.k, v=inp.v, g=inp.g, initial_state=inp.initial_state)
    ref = linear_attention(inp.q, inp.k, inp.v, g=inp.g, initial_state=inp.initial_state)
    assert rel(res.out, ref.out) < FP32_RTOL and rel(res.final_state, ref.final_state) < FP32_RTOL


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon_here", "--impl: expected MODULE:CALLABLE"),
        ("a:b:c", "--impl: expected MODULE:CALLABLE"),
        (":fn", "--impl: expected MODULE:CALLABLE"),
        ("no_such_module_zz9:fn", "cannot import module no_such_module_zz9"),
        ("{mod}:missing", "module {mod} has no attribute missing"),
        ("{mod}:CONSTANT", "{mod}:CONSTANT is not callable"),
    ],
)
def test_bad_specs_give_clear_errors(user_module, spec, message):
    from harness.adapters.user import load_callable

    with pytest.raises(ValueError) as err:
        load_callable(spec.format(mod=user_module))
    assert message.format(mod=user_module) in str(err.value)


def test_entry_point_adapter_is_picked_up(user_module, tmp_path, monkeypatch):
    vendor = f"vendor_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{vendor}.py").write_text(
        textwrap.dedent(
            """
            from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput
            from harness.adapters.eager import eager_attention

            class VendorAttention(SoftmaxAdapter):
                name = "vendor_attn"

                def supports(self, case, device):
                    return super().supports(case, device) or ("needs CUDA" if device.type != "cuda" else None)

                def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
                    return SoftmaxOutput(*eager_attention(q, k, v, causal=case.causal))

            def broken():
                raise RuntimeError("vendor library missing")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = [
        importlib.metadata.EntryPoint("vendor", f"{vendor}:VendorAttention", registry.ENTRY_POINT_GROUP),
        importlib.metadata.EntryPoint("broken", f"{vendor}:broken", registry.ENTRY_POINT_GROUP),
    ]
    real = importlib.metadata.entry_points

    def fake_entry_points(**kw):
        if kw.get("group") == registry.ENTRY_POINT_GROUP:
            return eps
        return real(**kw)

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", fake_entry_points)
    monkeypatch.setattr(registry, "_loaded", False)
    with pytest.warns(UserWarning, match="vendor library missing"):
        adapter = get("vendor_attn")
    assert adapter.family == "softmax" and adapter.supports(SMALL[0], CPU) == "needs CUDA"
    assert "eager" in names()  # the built-ins are still there
    sys.modules.pop(vendor, None)


# ---------------------------------------------------------------------------------------------
# In-repo Triton kernels under the CPU interpreter (a subprocess: TRITON_INTERPRET is read when
# the kernels are defined, so it must be set before they are imported).
# ---------------------------------------------------------------------------------------------

_INTERP_SCRIPT = """
import json, torch
from harness.adapters import get, Unsupported
from harness.cases import SoftmaxCase, LinearCase, make_inputs
from harness.oracle import softmax_attention, linear_attention

def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()

report = {}
c = SoftmaxCase(1, 4, 2, 20, 33, 16, causal=True)
a = get("triton_fa")
report["fa_reason"] = a.supports(c, torch.device("cpu"))
if report["fa_reason"] is None:
    i = make_inputs(c)
    r = a.run(c, q=i.q, k=i.k, v=i.v)  # forward only: the kernels' own tests cover their backward
    o = softmax_attention(i.q, i.k, i.v, **c.oracle_kwargs)
    report["fa"] = [rel(r.out, o.out)]
    report["fa_lse"] = (r.lse.double() - o.lse).abs().max().item()
    report["fa_bf16"] = a.supports(c.with_dtype("bf16"), torch.device("cpu"))
lc = LinearCase(1, 2, 40, 32, gate="g")
b = get("triton_la_chunk")
report["la_reason"] = b.supports(lc, torch.device("cpu"))
if report["la_reason"] is None:
    i = make_inputs(lc)
    r = b.run(lc, q=i.q, k=i.k, v=i.v, g=i.g, initial_state=i.initial_state)
    o = linear_attention(i.q, i.k, i.v, g=i.g, initial_state=i.initial_state)
    report["la"] = [rel(r.out, o.out), rel(r.final_state, o.final_state)]
print(json.dumps(report))
"""


def test_inrepo_adapters_under_the_triton_interpreter_match_oracle(forked_python):
    env = dict(os.environ, TRITON_INTERPRET="1")
    # a fresh `python -c` (forked from a process that imported torch alone, not triton: tests/forked_python.py)
    proc = forked_python([sys.executable, "-c", _INTERP_SCRIPT], cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    not_importable = [
        report[k] for k in ("fa_reason", "la_reason") if report[k] and "not importable" in report[k]
    ]
    if len(not_importable) == 2:
        pytest.skip(f"in-repo kernels not importable yet: {not_importable}")
    if report["fa_reason"] is None:
        assert max(report["fa"]) < FP32_RTOL and report["fa_lse"] < 1e-5
        assert report["fa_bf16"].startswith("the Triton interpreter multiplies bf16")
    if report["la_reason"] is None:
        assert max(report["la"]) < FP32_RTOL


# ---------------------------------------------------------------------------------------------
# GPU smoke (skipped without CUDA): every adapter that says it supports a case on this GPU must
# land within a few times the error of eager attention in the same dtype. A coarse bound: the
# tolerance engine owns the real pass rule; this catches layout and convention mistakes (O(1)).
# ---------------------------------------------------------------------------------------------

GPU_SOFTMAX_CASES = [
    SoftmaxCase(2, 8, 2, 200, 328, 64, causal=True, dtype="bf16"),  # bottom-right causal, GQA
    SoftmaxCase(2, 8, 8, 256, 256, 128, causal=True, dtype="fp16"),  # square causal
    SoftmaxCase(1, 4, 4, 300, 300, 64, window=(64, 16), dtype="bf16"),  # local window
    SoftmaxCase(1, 4, 4, 256, 256, 128, softcap=30.0, dtype="bf16"),  # softcap
    SoftmaxCase(1, 8, 4, 0, 0, 64, causal=True, dtype="bf16", varlen=((100, 100), (37, 200), (256, 256))),
    SoftmaxCase(1, 4, 4, 128, 128, 64, causal=True, dtype="fp32"),
]
GPU_LINEAR_CASES = [
    LinearCase(2, 4, 300, 64, gate="g", dtype="bf16"),
    LinearCase(2, 4, 512, 128, gate="g_gamma", dtype="fp16"),
]
# How many times eager's error (same dtype, same inputs) an adapter may be off, plus a floor.
GPU_ERROR_FACTOR = 4.0
GPU_ERROR_FLOOR = 1e-5


def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


def _leaf_inputs(case, inp):
    skip = ("grad_out", "grad_final_state", "cu_seqlens_q", "cu_seqlens_k")
    return {n: t.clone().requires_grad_() for n, t in inp.tensors().items() if n not in skip}


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("name", REQUIRED["softmax"])
def test_gpu_softmax_adapter_within_a_few_times_eager_error(name, case):
    device = _gpu()
    adapter = get(name)
    reason = adapter.supports(case, device)
    if reason:
        pytest.skip(f"{name}: {reason}")
    inp = make_inputs(case).to(device)
    ref = oracle_softmax(case, inp)
    extra = {}
    if case.is_varlen:
        extra = dict(cu_seqlens_q=inp.cu_seqlens_q, cu_seqlens_k=inp.cu_seqlens_k)
    results = {}
    for who in ("eager", name):
        leaves = _leaf_inputs(case, inp)
        try:
            res = get(who).run(case, **leaves, **extra)
        except Unsupported as e:
            pytest.skip(f"{who}: {e}")
        grads = torch.autograd.grad(res.out, [leaves["q"], leaves["k"], leaves["v"]], inp.grad_out)
        results[who] = (res, grads)
    (e_res, e_grads), (a_res, a_grads) = results["eager"], results[name]
    assert a_res.out.shape == ref.out.shape and a_res.out.dtype == case.torch_dtype
    bound = GPU_ERROR_FACTOR * rel(e_res.out, ref.out) + GPU_ERROR_FLOOR
    assert rel(a_res.out, ref.out) < bound, f"out: {rel(a_res.out, ref.out):.3g} vs bound {bound:.3g}"
    for label, got, eager_got, want in zip("qkv", a_grads, e_grads, (ref.dq, ref.dk, ref.dv)):
        bound = GPU_ERROR_FACTOR * rel(eager_got, want) + GPU_ERROR_FLOOR
        assert rel(got, want) < bound, f"d{label}: {rel(got, want):.3g} vs bound {bound:.3g}"
    if a_res.lse is not None:
        assert a_res.lse.shape == ref.lse.shape
        assert lse_close(a_res.lse.float(), ref.lse, atol=2e-2 if case.dtype != "fp32" else 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_LINEAR_CASES, ids=str)
@pytest.mark.parametrize("name", REQUIRED["linear"])
def test_gpu_linear_adapter_within_a_few_times_eager_error(name, case):
    device = _gpu()
    adapter = get(name)
    reason = adapter.supports(case, device)
    if reason:
        pytest.skip(f"{name}: {reason}")
    inp = make_inputs(case).to(device)
    ref = linear_attention(
        inp.q,
        inp.k,
        inp.v,
        inp.grad_out,
        g=inp.g,
        g_gamma=inp.g_gamma,
        initial_state=inp.initial_state,
        grad_final_state=inp.grad_final_state,
    )
    results = {}
    for who in ("eager_linear", name):
        leaves = _leaf_inputs(case, inp)
        res = get(who).run(case, **leaves)
        outs, grads_in = [res.out], [inp.grad_out]
        if inp.grad_final_state is not None:
            outs.append(res.final_state)
            grads_in.append(inp.grad_final_state)
        grads = torch.autograd.grad(outs, [leaves["q"], leaves["k"], leaves["v"]], grads_in)
        results[who] = (res, grads)
    (e_res, e_grads), (a_res, a_grads) = results["eager_linear"], results[name]
    for label, got, eager_got, want in [
        ("out", a_res.out, e_res.out, ref.out),
        ("final_state", a_res.final_state, e_res.final_state, ref.final_state),
        *zip(("dq", "dk", "dv"), a_grads, e_grads, (ref.dq, ref.dk, ref.dv)),
    ]:
        bound = GPU_ERROR_FACTOR * rel(eager_got, want) + GPU_ERROR_FLOOR
        assert rel(got, want) < bound, f"{label}: {rel(got, want):.3g} vs bound {bound:.3g}"


def _tuner(module: str):
    import triton
    import triton.language as tl

    def kernel(X, N: tl.constexpr):
        pass

    kernel.__module__ = module
    configs = [triton.Config({}, num_warps=w) for w in (2, 4, 8)]
    return triton.autotune(configs=configs, key=[])(triton.jit(kernel))


def test_fla_correctness_mode_pins_fla_autotuners_to_their_first_config():
    """ATTN_HARNESS_FLA_AUTOTUNE=0 (gpu-tests): FLA's tuners compile one config, others untouched."""
    from harness.adapters import fla

    fla.pin_first_configs()
    theirs, ours = _tuner("fla.ops.simple_gla.fake"), _tuner("kernels.fake")
    theirs.nargs = ours.nargs = {}
    assert [c.num_warps for c in theirs.prune_configs({})] == [2]
    assert [c.num_warps for c in ours.prune_configs({})] == [2, 4, 8]


def test_fla_gated_chunk_backward_refusal_is_unsupported_not_an_error(monkeypatch):
    from harness.adapters import fla

    case = LinearCase(1, 2, 64, 32, gate="g", dtype="bf16")
    monkeypatch.setattr(fla, "_probe", lambda attr: (lambda *a, **k: None, None))
    monkeypatch.setattr(fla, "gated_chunk_backward_refusal", lambda: "fla refuses the per-step-gate (g) chunk backward")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    reason = get("fla_chunk").supports(case, torch.device("cuda"))
    assert reason and "fla refuses" in reason
    assert get("fla_fused_chunk").supports(case, torch.device("cuda")) is None


def test_sdpa_refusal_names_what_the_forced_backend_lacks():
    """torch explains every skipped backend; the ones the harness disabled itself are noise (the
    H100 report once read "Memory efficient kernel not used because: ... runtime disabled" first)."""
    from harness.adapters.torch_sdpa import _torch_reasons

    msgs = ["Memory efficient kernel not used because: (Triggered internally at a.cpp:1.)",
            "Memory Efficient attention has been runtime disabled.",
            "Flash attention kernel not used because:", "Flash Attention does not support non-null attn_mask.",
            "cuDNN attention kernel not used because:", "cuDNN attention has been runtime disabled."]
    caught = [warnings.WarningMessage(m, UserWarning, "x.py", 1) for m in msgs]
    assert _torch_reasons(caught, RuntimeError("No available kernel")) == (
        "Flash attention kernel not used because: Flash Attention does not support non-null attn_mask.")


def test_return_lse_is_passed_where_the_signature_has_it_and_out_alone_must_come_back():
    """The out-only cases (``return_lse=False``): a flash-attn-4-style callable gets the keyword and
    must return the output tensor alone; one without the keyword is judged on out (lse not compared)."""
    from harness.adapters.user import make_callable_adapter
    from harness.check.verify import verify

    seen = []

    def fa4_style(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), return_lse=False):
        seen.append(return_lse)
        out, lse = eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)
        return (out, lse) if return_lse else out

    def always_a_tuple(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), return_lse=False):
        return eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)

    def no_keyword(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
        return eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)

    nolse = SoftmaxCase(1, 4, 2, 40, 40, 32, causal=True, return_lse=False)
    res = verify(make_callable_adapter(fa4_style, name="fa4_style"), nolse, seed=0, device="cpu")
    assert res.status == "pass" and False in seen and True not in seen
    assert "lse" not in {t.name for t in res.tensors}
    with_lse = verify(make_callable_adapter(fa4_style, name="fa4_style"), SoftmaxCase(1, 4, 2, 40, 40, 32, causal=True),
                      seed=0, device="cpu")
    assert with_lse.status == "pass" and "lse" in {t.name for t in with_lse.tensors}
    bad = verify(make_callable_adapter(always_a_tuple, name="always_a_tuple"), nolse, seed=0, device="cpu")
    assert bad.status == "error" and "return_lse=False: expected the output tensor alone" in bad.reason
    assert verify(make_callable_adapter(no_keyword, name="no_keyword"), nolse, seed=0, device="cpu").status == "pass"


def test_positional_forms_follow_the_signature_or_the_declared_order():
    from harness.adapters.optional import FA2_POSITIONAL, call_positionally, positional_order

    def fa2(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0):
        return dropout_p, softmax_scale, causal, window_size, softcap

    def keyword_only(q, k, v, *, causal=False, softmax_scale=None):
        return None

    def wrapper(*args, **kw):
        return args, kw

    assert positional_order(fa2) == (FA2_POSITIONAL, "signature")
    assert positional_order(keyword_only)[0] is None and "keyword-only" in positional_order(keyword_only)[1]
    assert positional_order(wrapper)[0] is None and "*args" in positional_order(wrapper)[1]
    assert positional_order(wrapper, FA2_POSITIONAL) == (FA2_POSITIONAL, "declared")
    # dropout_p, skipped by the harness, is filled in; the keywords after the last passed one stay keywords
    assert call_positionally(fa2, (1, 2, 3), {"causal": True, "softmax_scale": 0.5}, FA2_POSITIONAL) == (
        0.0, 0.5, True, (-1, -1), 0.0)
    args, kw = call_positionally(wrapper, ("q", "k", "v"), {"causal": True, "return_lse": False}, FA2_POSITIONAL)
    assert args == ("q", "k", "v", 0.0, None, True) and kw == {"return_lse": False}

    def fa4(q, k, v, qv=None, gather_kv_indices=None, softmax_scale=None, causal=False, window_size=(None, None)):
        return qv, gather_kv_indices, softmax_scale, causal, window_size

    order, _ = positional_order(fa4)  # flash-attn-4's order: skipped parameters get the callee's defaults
    assert call_positionally(fa4, (1, 2, 3), {"causal": True, "window_size": (4, 0)}, order) == (
        None, None, None, True, (4, 0))


def test_a_positional_case_is_unsupported_where_there_is_no_positional_form():
    from harness.adapters.user import make_callable_adapter

    def keyword_only(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1)):
        return eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, window_size=window_size)

    case = SoftmaxCase(1, 2, 2, 24, 24, 16, causal=True, scale=0.5, call="positional")
    why = make_callable_adapter(keyword_only, name="kw_only").supports(case, torch.device("cpu"))
    assert why == "no positional form: its parameters after q, k, v are keyword-only"
    assert "no positional form" in get("triton_fa").supports(case, torch.device("cpu"))
