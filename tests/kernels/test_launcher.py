"""Replayed launches (kernels/launcher.py): a call with the signature of an earlier one skips the
argument checks, the autotuner and Triton's binding, and launches the compiled kernels directly.

On the CPU nothing is compiled, so a stand-in for the compiled kernel (kernels/standins.py) records
what it is given: a replay must pass exactly the arguments a fresh launch computes for the same
tensors, a call with another signature must be launched afresh, and the cache must keep no tensor
alive. On a GPU the
replayed kernels run and their results are checked.
"""

import gc
import os
import weakref

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels import launcher  # noqa: E402
from kernels.flash_attn import bwd, configs, flash_attn_func, flash_attn_varlen_func, interface  # noqa: E402
from kernels.flash_attn.reference import attention_ref  # noqa: E402
from kernels.standins import StandInKernel, cpu_replays  # noqa: E402

CUDA = torch.cuda.is_available()


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [first, last + 1) a tensor's elements cover in its storage's address space."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _no_alias_of_a_reset_argument(tuned, kwargs):
    """The autotuner zeroes its reset_to_zero arguments before every trial: such an argument must overlap
    no other one's bytes (a stand-in buffer that aliased delta zeroed it between the dQ kernel writing it and
    the dK/dV kernel reading it: dK wrong on every first call of a tuning key). Disjoint views of one buffer
    (the backward's workspace: delta, the split's partials, dQ's fp32 buffer) are fine: zero_() writes the view."""
    for name in getattr(tuned, "reset_to_zero", []):
        lo, hi = _byte_span(kwargs[name])
        shared = [n for n, v in kwargs.items() if n != name and isinstance(v, torch.Tensor)
                  and (span := _byte_span(v))[0] < hi and lo < span[1]]
        assert not shared, f"{name} (zeroed by the autotuner) overlaps {shared}"


@pytest.fixture
def recorded():
    """Launches go to stand-ins: ("fresh" | "replay", kernel name, arguments in kernel order, grid)."""
    with cpu_replays([], check=_no_alias_of_a_reset_argument) as log:
        yield log


def test_the_stand_ins_are_gone_after_an_error_inside():
    """kernels.standins.cpu_replays restores the launchers, the device checks and the signature caches however
    its block ends."""
    from kernels.decode import interface as decode

    real = (configs.launch, launcher.launch, configs.interpreting, decode.interpreting, launcher.current_device,
            launcher.current_stream)
    with pytest.raises(RuntimeError, match="inside"), cpu_replays():
        assert configs.launch is not real[0] and configs.interpreting()
        raise RuntimeError("inside")
    assert (configs.launch, launcher.launch, configs.interpreting, decode.interpreting, launcher.current_device,
            launcher.current_stream) == real
    assert len(interface._SIGNATURES) == 0 and len(decode._SIGNATURES) == 0


def _inputs(b, sq, sk, hq, hk, d, dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=dtype).requires_grad_(True)
    return mk(b, sq, hq, d), mk(b, sk, hk, d), mk(b, sk, hk, dv or d), torch.randn(b, sq, hq, dv or d, generator=g,
                                                                                   dtype=dtype)


def _same(replayed, fresh, inputs) -> bool:
    """A replayed argument against a fresh launch's: a pointer (int) where the fresh launch had a
    tensor, the same pointer where that tensor is one of the caller's ``inputs`` or a view of the kept
    workspace (a replay's scratch pointers must land where the fresh launch's views of it do); else equal."""
    if isinstance(fresh, torch.Tensor):
        mine = {t.data_ptr() for t in inputs}
        kept = {b.data_ptr() for b in launcher._WORKSPACE.__dict__.values()}
        pinned = fresh.data_ptr() in mine or fresh.untyped_storage().data_ptr() in kept
        return type(replayed) is int and (replayed == fresh.data_ptr() or not pinned)
    return type(replayed) is type(fresh) and replayed == fresh


def _assert_same_launches(replays, fresh, inputs):
    """Each replay is the fresh launch of the same kernel on the same grid with the same arguments."""
    assert len(replays) == len(fresh)
    for r, f in zip(replays, fresh):
        assert r[1] == f[1] and r[3] == f[3]
        bad = [i for i, (a, b) in enumerate(zip(r[2], f[2])) if not _same(a, b, inputs)]
        assert not bad, f"{r[1]}: arguments {bad} differ between the replay and a fresh launch"


def _launches(log, kind):
    return [e for e in log if e[0] == kind]


def _run(call, seed):
    q, k, v, do = call(seed)
    out = call.fn(q, k, v)
    out.backward(do)
    return (q, k, v, do)


CALLS = {
    "mha-causal": (lambda s: _inputs(1, 40, 40, 2, 2, 32, seed=s), dict(causal=True)),
    "gqa-window-softcap-scale": (lambda s: _inputs(2, 33, 70, 4, 2, 16, seed=s),
                                 dict(window_size=(8, 4), softcap=5.0, softmax_scale=0.3)),
    "mqa-dv": (lambda s: _inputs(1, 24, 24, 4, 1, 48, dv=32, seed=s), dict(causal=True)),
}


@pytest.mark.parametrize("mode", ["split", "atomic"])
@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("split", [1, 2], ids=["no-split", "group-split"])
def test_a_replay_passes_what_a_fresh_launch_computes(recorded, monkeypatch, name, split, mode):
    """The second call of a signature replays every launch (forward, dQ or the atomic mode's delta, dK/dV, the
    split's sum, the atomic mode's dQ cast: in the sum's launch under a group split) with its own tensors; the
    arguments are those a fresh launch computes for the same tensors."""
    monkeypatch.setattr(bwd, "group_split", lambda *a: split)
    monkeypatch.setenv("FLASH_ATTN_BWD", mode)
    make, kw = CALLS[name]
    q, k, v, do = make(0)
    flash_attn_func(q, k, v, **kw).backward(do)
    first = _launches(recorded, "fresh")
    summed = ["_sum_partials"] if split > 1 and q.shape[2] > k.shape[2] else []
    if mode == "split":
        assert [e[1] for e in first] == ["_fwd_kernel", "_bwd_dq_kernel", "_bwd_dkdv_kernel"] + summed
    else:
        cast = summed or ["_cast_dq"]  # (the sum's launch casts dQ too)
        assert [e[1] for e in first] == ["_fwd_kernel", "_bwd_preprocess", "_bwd_dkdv_kernel"] + cast
    recorded.clear()
    q, k, v, do = make(1)
    flash_attn_func(q, k, v, **kw).backward(do)
    replays = list(recorded)
    assert [e[0] for e in replays] == ["replay"] * len(first), "the second call was not replayed in full"
    recorded.clear()
    interface._SIGNATURES.clear()  # the same tensors, launched afresh
    flash_attn_func(q, k, v, **kw).backward(do)
    fresh = _launches(recorded, "fresh")
    _assert_same_launches(replays, fresh, (q, k, v, do))


@pytest.mark.parametrize("split", [1, 2], ids=["no-split", "group-split"])
def test_a_replayed_call_allocates_what_a_first_call_does(recorded, monkeypatch, split):
    """A replay allocates its outputs its own way (lse like a kept one-element template, the gradients by
    empty_like): the same shapes, strides, dtypes and devices as the first call's, which its launch's
    arguments were computed from."""
    monkeypatch.setattr(bwd, "group_split", lambda *a: split)
    layouts = []
    for seed in (0, 1):
        q, k, v, do = _inputs(2, 24, 24, 4, 1, 16, seed=seed)
        out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
        layouts.append([(t.shape, t.stride(), t.dtype, t.device) for t in (out, lse, dq, dk, dv)])
    assert [e[0] for e in recorded][-3 - (split > 1):] == ["replay"] * (3 + (split > 1))
    assert layouts[0] == layouts[1]


def _fp8_inputs(b, s, hq, hk, d, seed):
    g = torch.Generator().manual_seed(seed)
    e4m3 = lambda *shape: torch.randn(*shape, generator=g).to(torch.float8_e4m3fn)
    return (e4m3(b, s, hq, d), e4m3(b, s, hk, d), e4m3(b, s, hk, d),
            *(torch.rand(b, hk, generator=g) + 0.5 for _ in range(3)))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_an_fp8_call_replays_the_v_copy_and_the_forward(recorded, causal):
    """flash_attn_fp8_func keeps its checks and launches per signature as flash_attn_func does: the
    second call replays the K-major copy of V and the forward with its own tensors, passing what a
    fresh launch computes for them."""
    from kernels.flash_attn import flash_attn_fp8_func

    flash_attn_fp8_func(*_fp8_inputs(1, 40, 4, 2, 32, 0), causal=causal, v_transposed=True)
    first = _launches(recorded, "fresh")
    assert [e[1] for e in first] == ["_transpose_kernel", "_fwd_kernel"]
    recorded.clear()
    inputs = _fp8_inputs(1, 40, 4, 2, 32, 1)
    flash_attn_fp8_func(*inputs, causal=causal, v_transposed=True)
    replays = list(recorded)
    assert [e[0] for e in replays] == ["replay"] * 2, "the second call was not replayed in full"
    recorded.clear()
    interface._SIGNATURES.clear()
    flash_attn_fp8_func(*inputs, causal=causal, v_transposed=True)
    _assert_same_launches(replays, _launches(recorded, "fresh"), inputs)


@pytest.mark.parametrize("grads", ["bf16", "e5m2"])
def test_an_fp8_backward_call_replays_its_copies_and_kernels(recorded, grads):
    """flash_attn_fp8_bwd_func keeps its checks and launches per signature: the second call replays the three
    sequence-contiguous copies (Q, K, dO) and both backward kernels with its own tensors, passing what a fresh
    launch computes for them; FP8 gradients (over their descales) as well as bf16 ones."""
    from kernels.flash_attn import flash_attn_fp8_bwd_func

    def inputs_of(seed):
        q, k, v, *descales = _fp8_inputs(1, 40, 4, 2, 32, seed)
        g = torch.Generator().manual_seed(seed + 100)
        do = torch.randn(1, 40, 4, 32, generator=g).to(torch.float8_e5m2)
        out, lse = torch.randn(1, 40, 4, 32, generator=g).to(torch.bfloat16), torch.randn(1, 4, 40, generator=g)
        more = [torch.rand(1, 2, generator=g) + 0.5 for _ in range(5)]  # dO, dS, dQ, dK, dV descales
        return (do, q, k, v, out, lse, *descales, *more)

    def call(x):
        grad = dict(grad_dtype=torch.float8_e5m2, dq_descale=x[11], dk_descale=x[12], dv_descale=x[13]) \
            if grads == "e5m2" else {}
        flash_attn_fp8_bwd_func(*x[:11], causal=True, **grad)

    call(inputs_of(0))
    first = _launches(recorded, "fresh")
    assert [e[1] for e in first] == ["_transpose_kernel"] * 3 + ["_bwd_dq_kernel", "_bwd_dkdv_kernel"]
    recorded.clear()
    inputs = inputs_of(1)
    call(inputs)
    replays = list(recorded)
    assert [e[0] for e in replays] == ["replay"] * 5, "the second call was not replayed in full"
    recorded.clear()
    interface._SIGNATURES.clear()
    call(inputs)
    _assert_same_launches(replays, _launches(recorded, "fresh"), inputs)


def test_a_profilers_launch_hook_sees_replayed_launches(recorded):
    """With a launch hook installed (a profiler such as proton), replays go through Triton's own
    launcher with the tensors and the launch metadata, so the hook is called for each launch."""
    from triton import knobs

    q, k, v, do = _inputs(1, 24, 24, 2, 2, 16)
    flash_attn_func(q, k, v)
    seen = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        flash_attn_func(q, k, v)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert [e[0] for e in recorded] == ["fresh", "replay-hooked"] and len(seen) == 1
    assert any(a is q for a in recorded[1][2])  # tensors, not pointers, on this path


def test_varlen_calls_replay_and_still_check_their_offsets(recorded):
    q, k, v, _ = _inputs(1, 20, 20, 2, 1, 16)
    q, k, v = (t.detach()[0] for t in (q, k, v))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    flash_attn_varlen_func(q, k, v, cu, cu, 13, 13)
    flash_attn_varlen_func(q, k, v, cu, cu.clone(), 13, 13)
    assert [e[0] for e in recorded] == ["fresh", "replay"]
    with pytest.raises(ValueError, match="max_seqlen_q: 12 is less than the longest query sequence 13"):
        flash_attn_varlen_func(q, k, v, cu, cu, 12, 13)
    bad = torch.tensor([0, 21, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected non-decreasing offsets"):
        flash_attn_varlen_func(q, k, v, bad, cu, 13, 13)


def _variants():
    """Calls that differ from the base call in one thing a launch depends on."""
    base = _inputs(1, 40, 40, 2, 2, 32)[:3]
    flat = torch.randn(base[0].numel() + 1)
    shifted = flat[1:].view(base[0].shape)  # 4 bytes off a 16-byte boundary
    transposed = base[0].detach().transpose(1, 2).contiguous().transpose(1, 2)
    return {
        "causal": (base, dict(causal=True)),
        "scale": (base, dict(softmax_scale=0.5)),
        "window": (base, dict(window_size=(4, 0))),
        "softcap": (base, dict(softcap=3.0)),
        "fp16": (tuple(t.detach().half() for t in base), {}),
        "shape": ((base[0][:, :39], base[1], base[2]), {}),
        "strides": ((transposed, base[1], base[2]), {}),
        "misaligned": ((shifted, base[1], base[2]), {}),
    }


@pytest.mark.parametrize("what", list(_variants()))
def test_a_call_with_another_signature_is_launched_afresh(recorded, what):
    base = _inputs(1, 40, 40, 2, 2, 32)[:3]
    flash_attn_func(*base)
    (q, k, v), kw = _variants()[what]
    flash_attn_func(q, k, v, **kw)
    assert [e[0] for e in recorded] == ["fresh", "fresh"]


def test_an_environment_knob_changes_the_signature(recorded, monkeypatch):
    q, k, v, do = _inputs(1, 24, 24, 2, 2, 16)
    flash_attn_func(q, k, v).backward(do)
    monkeypatch.setenv("FLASH_ATTN_AUTOTUNE", "1" if os.environ.get("FLASH_ATTN_AUTOTUNE") == "0" else "0")
    flash_attn_func(q, k, v).backward(do)
    assert [e[0] for e in recorded] == ["fresh"] * 6


def test_the_cache_keeps_no_tensor_alive(recorded):
    q, k, v, do = _inputs(1, 24, 24, 2, 2, 16)
    out = flash_attn_func(q, k, v)
    out.backward(do)
    refs = [weakref.ref(t) for t in (q, k, v, do, out)]
    del q, k, v, do, out
    recorded.clear()  # the stand-ins' own record of the arguments
    gc.collect()
    assert len(interface._SIGNATURES) == 1
    assert all(r() is None for r in refs), "a replay cache keeps a call's tensors alive"


def test_signatures_are_bounded():
    sigs = launcher.Signatures(limit=3)
    for i in range(5):
        sigs.put(i, i)
    assert len(sigs) == 3 and sigs.get(0) is None and sigs.get(4) == 4
    assert sigs.get(([1],)) is None and sigs.put(([1],), "x") == "x" and len(sigs) == 3  # unhashable: not kept
    assert sigs.put(None, "y") == "y" and sigs.get(None) is None and len(sigs) == 3  # no key: not kept


@pytest.mark.skipif(not CUDA, reason="replayed launches run compiled kernels: needs a CUDA device")
@pytest.mark.parametrize("hk", [4, 1], ids=["mha", "mqa"])
def test_replayed_launches_compute_what_fresh_ones_do_on_the_gpu(monkeypatch, hk):
    """Call 1 launches afresh; call 2 (fresh random inputs, same signature) is replayed and checked
    against a float64 reference; call 3 launches call 2's inputs afresh: bitwise the same results
    (the same kernels on the same inputs, and the backward is deterministic)."""
    fresh = []
    real = configs.launch
    monkeypatch.setattr(configs, "launch", lambda *a, **k: fresh.append(a[0].fn.__name__) or real(*a, **k))
    interface._SIGNATURES.clear()

    def call(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        mk = lambda *s: torch.randn(*s, generator=g).to("cuda", torch.bfloat16).requires_grad_(True)
        q, k, v = mk(2, 300, 4, 64), mk(2, 300, hk, 64), mk(2, 300, hk, 64)
        do = torch.randn(2, 300, 4, 64, generator=g).to("cuda", torch.bfloat16)
        out = flash_attn_func(q, k, v, causal=True)
        out.backward(do)
        return (q, k, v), (out.detach(), q.grad, k.grad, v.grad)

    call(0)
    n_fresh = len(fresh)
    (q, k, v), replayed = call(1)
    assert len(fresh) == n_fresh, "the second call of a signature was launched afresh"
    ref, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
    assert (replayed[0].double() - ref).abs().max().item() < 5e-2
    interface._SIGNATURES.clear()
    _, again = call(1)
    assert len(fresh) > n_fresh
    for name, a, b in zip(("out", "dq", "dk", "dv"), replayed, again):
        assert torch.equal(a, b), f"{name}: a replayed launch differs from a fresh one on the same inputs"


@pytest.mark.skipif(not CUDA, reason="replayed launches run compiled kernels: needs a CUDA device")
def test_atomic_dq_backward_replays_its_launches_on_the_gpu(monkeypatch):
    """FLASH_ATTN_BWD=atomic: the delta pass and the dK/dV kernel (dQ by atomics) are replayed for a
    call of a known signature, not relaunched through the autotuner; the replayed gradients match the
    float64 reference (dQ's atomics add in no fixed order, so no bitwise comparison)."""
    monkeypatch.setenv("FLASH_ATTN_BWD", "atomic")
    fresh = []
    real_launch, real_plain = configs.launch, launcher.launch
    monkeypatch.setattr(configs, "launch", lambda *a, **k: fresh.append(a[0].fn.__name__) or real_launch(*a, **k))
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: fresh.append(a[0].fn.__name__) or real_plain(*a, **k))
    interface._SIGNATURES.clear()

    def call(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        mk = lambda *s: torch.randn(*s, generator=g).to("cuda", torch.bfloat16).requires_grad_(True)
        q, k, v = mk(2, 300, 4, 64), mk(2, 300, 2, 64), mk(2, 300, 2, 64)
        do = torch.randn(2, 300, 4, 64, generator=g).to("cuda", torch.bfloat16)
        flash_attn_func(q, k, v, causal=True).backward(do)
        return (q, k, v, do), (q.grad, k.grad, v.grad)

    call(0)
    assert {"_bwd_preprocess", "_bwd_dkdv_kernel", "_cast_dq"} <= set(fresh) and "_bwd_dq_kernel" not in fresh
    n_fresh = len(fresh)
    (q, k, v, do), grads = call(1)
    assert len(fresh) == n_fresh, "the second atomic backward of a signature was launched afresh"
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref, _ = attention_ref(qd, kd, vd, causal=True)
    ref_grads = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    for name, a, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        err = (a.double() - r).abs().max().item() / r.abs().max().item()
        assert err < 2e-2, f"{name}: {err:.2e} from the float64 reference"


@pytest.mark.skipif(not CUDA, reason="replayed launches run compiled kernels: needs a CUDA device")
def test_replayed_fp8_launches_compute_what_fresh_ones_do_on_the_gpu():
    """The FP8 forward's replays (the V copy and the forward) on the GPU: a replayed call gives
    bitwise what a fresh launch of the same inputs gives, and what the eager FP8 reference does."""
    from harness.adapters.eager import eager_fp8_attention
    from kernels.flash_attn import flash_attn_fp8_func

    interface._SIGNATURES.clear()
    inputs = [tuple(t.to("cuda") for t in _fp8_inputs(2, 300, 4, 2, 64, seed)) for seed in (0, 1)]
    flash_attn_fp8_func(*inputs[0], causal=True)
    replayed = flash_attn_fp8_func(*inputs[1], causal=True)
    interface._SIGNATURES.clear()
    fresh = flash_attn_fp8_func(*inputs[1], causal=True)
    assert torch.equal(replayed, fresh), "a replayed FP8 call differs from a fresh one on the same inputs"
    ref, _ = eager_fp8_attention(*inputs[1], causal=True)
    assert (replayed.double() - ref.double()).abs().max().item() < 0.1


# --------------------------------------------------------------------------------------------
# The linear-attention kernel (kernels/linear_attn/chunk.py) replays the same way
# --------------------------------------------------------------------------------------------


@pytest.fixture
def linear_recorded(monkeypatch):
    from kernels.linear_attn import chunk

    log = []

    def fake_run(kernel, tuned, grid_of, kwargs, override, default):  # chunk._run's default-config path
        grid = tuple(grid_of(default)) + (1,) * 2
        meta = {n: x for n, x in default.items() if n not in ("num_warps", "num_stages")}
        full = dict(kwargs, **meta)
        log.append(("fresh", kernel.fn.__name__, [v for _, v in launcher.arguments(kernel, full)], grid[:3]))
        return launcher.launched(kernel, StandInKernel(kernel.fn.__name__, log), grid[:3], full)

    monkeypatch.setattr(chunk, "_run", fake_run)
    monkeypatch.setattr(chunk.cfg, "INTERPRET", True)  # CPU tensors pass the checks on a GPU box too
    monkeypatch.setattr(launcher, "current_device", lambda: 0)
    monkeypatch.setattr(launcher, "current_stream", lambda device: 0)
    chunk._SIGNATURES.clear()
    yield log
    chunk._SIGNATURES.clear()


@pytest.mark.parametrize("gate", ["g", "g_gamma", None])
def test_a_linear_replay_passes_what_a_fresh_launch_computes(linear_recorded, gate):
    from kernels.linear_attn import chunk_linear_attn

    def inputs(seed):
        g_ = torch.Generator().manual_seed(seed)
        mk = lambda *s: torch.randn(*s, generator=g_).requires_grad_(True)
        gates = {"g": -torch.rand(1, 40, 2, generator=g_).requires_grad_(True), "g_gamma": -torch.rand(2, generator=g_)}
        return mk(1, 40, 2, 32), mk(1, 40, 2, 32), mk(1, 40, 2, 64), gates.get(gate), mk(1, 2, 32, 64)

    def call(q, k, v, gt, h0):
        o, ht = chunk_linear_attn(q, k, v, **({gate: gt} if gate else {}), initial_state=h0, output_final_state=True)
        (o.sum() + ht.sum()).backward()

    call(*inputs(0))
    assert [e[:2] for e in linear_recorded] == [("fresh", "_fwd_kernel"), ("fresh", "_bwd_kernel")]
    linear_recorded.clear()
    x = inputs(1)
    call(*x)
    replays = list(linear_recorded)
    assert [e[0] for e in replays] == ["replay", "replay"], "the second call was not replayed"
    linear_recorded.clear()
    from kernels.linear_attn import chunk

    chunk._SIGNATURES.clear()
    call(*x)
    mine = [t for t in x if t is not None]
    _assert_same_launches(replays, linear_recorded, mine)


def test_linear_calls_under_a_forced_plan_are_checked_every_time(monkeypatch):
    """A benchmark's forced plan turns replays off; each call then works its arguments out afresh
    (a call must not take another's checked scale: head dims 32 and 64 here)."""
    from harness.oracle import linear_attention
    from kernels.linear_attn import chunk, chunk_linear_attn
    from kernels.linear_attn import configs as cfg

    monkeypatch.setattr(cfg, "PLAN_OVERRIDE", dict(SPLIT=False, BV=32, BKD=32, BK=32))
    chunk._SIGNATURES.clear()
    for d in (32, 64):
        g_ = torch.Generator().manual_seed(d)
        q, k, v = (torch.randn(1, 20, 1, d, generator=g_).to("cuda" if CUDA else "cpu") for _ in range(3))
        o, _ = chunk_linear_attn(q, k, v)
        ref = linear_attention(q.double(), k.double(), v.double()).out
        assert (o.double() - ref).abs().max().item() < 1e-4
    assert len(chunk._SIGNATURES) == 0


# --------------------------------------------------------------------------------------------
# The decode kernel (kernels/decode/interface.py) replays its launches (split and combine; append first unfused)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fuse", [True, False], ids=["fused-append", "append-launch"])
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_a_decode_replay_passes_what_a_fresh_launch_computes(recorded, paged, fuse, monkeypatch):
    """A step's launches (the split kernel appending the new tokens itself and the combine, the default; or the
    append kernel first) replayed for other inputs of the same signature pass what fresh launches would."""
    import dataclasses

    from kernels.decode import interface as dec

    monkeypatch.setattr(dec, "interpreting", lambda: True)  # CPU tensors pass the checks on a GPU box too
    monkeypatch.setattr(dec, "INTERPRET_CONFIG", dataclasses.replace(dec.INTERPRET_CONFIG, fuse_append=fuse))
    kernels = ["_split_kernel", "_combine_kernel"] if fuse else ["_append_kernel", "_split_kernel", "_combine_kernel"]
    dec._SIGNATURES.clear()

    def inputs(seed):
        g_ = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(2, 1, 4, 32, generator=g_) for _ in range(3))
        k = k[:, :, :2].contiguous()
        v = v[:, :, :2].contiguous()
        if paged:
            kc, vc = torch.randn(6, 32, 2, 32, generator=g_), torch.randn(6, 32, 2, 32, generator=g_)
            table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
        else:
            kc, vc, table = torch.randn(2, 96, 2, 32, generator=g_), torch.randn(2, 96, 2, 32, generator=g_), None
        return q, kc, vc, k, v, torch.tensor([40, 70], dtype=torch.int32), table

    def call(q, kc, vc, k, v, lens, table):
        dec.decode_attention(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, validate=False)

    call(*inputs(0))
    first = [e[1] for e in recorded]
    assert first == kernels
    recorded.clear()
    x = inputs(1)
    call(*x)
    replays = list(recorded)
    assert [e[0] for e in replays] == ["replay"] * len(kernels), "the second call was not replayed"
    recorded.clear()
    dec._SIGNATURES.clear()
    call(*x)
    mine = [t for t in x if t is not None]
    _assert_same_launches(replays, recorded, mine)
    recorded.clear()
    dec.decode_attention(*x[:5], cache_seqlens=x[5], block_table=x[6], validate=True)
    assert [e[0] for e in recorded] == ["fresh"] * len(kernels)  # a validating call reads the device: never replayed
    dec._SIGNATURES.clear()


@pytest.mark.skipif(not CUDA, reason="replayed launches run compiled kernels: needs a CUDA device")
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_decode_replays_compute_what_fresh_launches_do_on_the_gpu(paged):
    """The decode kernel on the GPU: call 1 (validate=False) launches afresh, call 2 (other inputs,
    same signature) replays its launches (the split kernel appending, the combine), call 3 launches call 2's inputs
    afresh: the outputs and the written caches bitwise the same, and the replayed step within bf16
    rounding of the FP64 decode oracle (its cache after the step too)."""
    from harness.oracle.decode import decode_attention as oracle_decode
    from kernels.decode import interface as dec

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        mk = lambda *s: torch.randn(*s, generator=g).to("cuda", torch.bfloat16)
        q, k, v = mk(3, 1, 8, 64), mk(3, 1, 2, 64), mk(3, 1, 2, 64)
        if paged:
            kc, vc = mk(12, 64, 2, 64), mk(12, 64, 2, 64)
            table = torch.randperm(12, generator=g)[:9].view(3, 3).to("cuda", torch.int32)
        else:
            kc, vc, table = mk(3, 192, 2, 64), mk(3, 192, 2, 64), None
        return q, kc, vc, k, v, torch.tensor([40, 130, 7], dtype=torch.int32, device="cuda"), table

    def call(q, kc, vc, k, v, lens, table):
        return dec.decode_attention(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, validate=False)

    dec._SIGNATURES.clear()
    call(*inputs(0))
    assert len(dec._SIGNATURES) == 1
    x = inputs(1)
    q, kc, vc, k, v, lens, table = x
    ref = oracle_decode(q, kc, vc, lens, table, k, v)  # before the step writes the caches
    start = (kc.clone(), vc.clone())
    replayed = call(*x)
    assert (replayed.double() - ref.out).abs().max().item() < 2e-2
    assert torch.equal(kc, ref.k_cache) and torch.equal(vc, ref.v_cache)
    cache_after = (kc.clone(), vc.clone())
    kc.copy_(start[0])
    vc.copy_(start[1])
    dec._SIGNATURES.clear()
    again = call(*x)
    assert torch.equal(replayed, again), "a replayed decode launch differs from a fresh one on the same inputs"
    assert torch.equal(kc, cache_after[0]) and torch.equal(vc, cache_after[1])
    dec._SIGNATURES.clear()


def test_a_replay_describes_its_own_calls_tensors_with_host_made_descriptors():
    """A launch whose kernel takes a host-made TMA descriptor (Gluon's TensorDescriptor, as the backward's Gluon
    kernels with ``host_desc``): a replay hands Triton's launcher a descriptor of *its* call's tensor (a device
    pointer: workspace slots pass ints) with the first launch's shape and strides, and keeps no descriptor of the
    first call (it would read that call's tensor). A descriptor whose tensor is not named in ``descriptors`` cannot
    be replayed: ValueError at the first launch."""
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    @triton.jit
    def kernel(Q, QD, n, BLOCK: triton.language.constexpr):
        pass

    layout = gl.NVMMASharedLayout.get_default_for([1, 64, 1, 16], gl.bfloat16)

    def describe(t):
        return TensorDescriptor(t, list(t.shape), [t.stride(0), t.stride(1), t.stride(2), 1], [1, 64, 1, 16], layout)

    first, second = (torch.randn(2, 128, 3, 16).to(torch.bfloat16) for _ in range(2))
    log = []
    with cpu_replays(log):
        made = launcher.launched(kernel, StandInKernel("kernel", log), (4, 6),
                                 dict(Q=first, QD=describe(first), n=7, BLOCK=64), descriptors={"QD": "Q"})
        assert made.template[1] is None  # (nothing of the first call's descriptor kept)
        for t in (second, second.data_ptr()):  # a tensor, or a pointer into a workspace
            made({"Q": t})
            (how, name, args, grid) = log.pop()
            assert (how, name, grid) == ("replay", "kernel", (4, 6, 1))
            assert args[0] == second.data_ptr() and args[2] == 7 and args[3] == 64
            desc = args[1]
            assert desc.base.data_ptr() == second.data_ptr() and desc.padding == "zero"
            assert list(desc.shape) == [2, 128, 3, 16] and list(desc.strides) == [6144, 48, 16, 1]
        with pytest.raises(ValueError, match="QD.*not named"):
            launcher.launched(kernel, StandInKernel("kernel", log), (4, 6),
                              dict(Q=first, QD=describe(first), n=7, BLOCK=64))
        with pytest.raises(ValueError, match="QD"):  # (named, but over another tensor than the one it names)
            launcher.launched(kernel, StandInKernel("kernel", log), (4, 6),
                              dict(Q=first, QD=describe(second), n=7, BLOCK=64), descriptors={"QD": "Q"})


def test_a_replay_encodes_a_host_made_descriptor_once_per_pointer(monkeypatch):
    """Under Triton's own descriptor wrapper (``wrap_handle_tensordesc``, which encodes every descriptor on every
    launch: ~+26 us a backward call on the H200 in session 49), a replay encodes a descriptor once per device
    pointer and calls the C launch under the wrapper with what the wrapper itself would pass: the encoded map, then
    the shape and strides, in the descriptor's place. A new pointer is encoded again; the cache of a slot is
    bounded."""
    import triton
    from triton.backends.nvidia import driver as nvidia
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    @triton.jit
    def kernel(Q, QD, KD, n, BLOCK: triton.language.constexpr):
        pass

    layout = gl.NVMMASharedLayout.get_default_for([1, 64, 1, 16], gl.bfloat16)

    def describe(t):
        return TensorDescriptor(t, list(t.shape), [t.stride(0), t.stride(1), t.stride(2), 1], [1, 64, 1, 16], layout)

    encoded = []

    def encode(arg, meta):  # (the driver's: a CUtensorMap; here what it was made from)
        encoded.append((arg.base.data_ptr(), meta["slot"]))
        return [("map", arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), arg.padding, meta["slot"]),
                *arg.shape, *arg.strides]

    monkeypatch.setattr(nvidia, "make_tensordesc_arg", encode)
    raw_calls = []
    signature = {"Q": "*bf16", "QD": "tensordesc<bf16[1, 64, 1, 16]>", "KD": "tensordesc<bf16[1, 64, 1, 16]>",
                 "n": "i32", "BLOCK": "constexpr"}
    wrapped = nvidia.wrap_handle_tensordesc(lambda *a: raw_calls.append(a), signature, [{"slot": 0}, {"slot": 1}])
    q, q2 = (torch.randn(2, 128, 3, 16).to(torch.bfloat16) for _ in range(2))
    with cpu_replays([]):
        stand_in = StandInKernel("kernel", None)
        stand_in.run.launch = wrapped  # (as Triton's CudaLauncher.launch)
        made = launcher.launched(kernel, stand_in, (4, 6), dict(Q=q, QD=describe(q), KD=describe(q), n=7, BLOCK=64),
                                 descriptors={"QD": "Q", "KD": "Q"})
        assert made._encoded is not None, "the replay does not recognise Triton's descriptor wrapper"
        for t in (q, q, q2.data_ptr(), q2, q):
            made({"Q": t})
        ptr = [q.data_ptr(), q2.data_ptr()]
        assert encoded == [(ptr[0], 0), (ptr[0], 1), (ptr[1], 0), (ptr[1], 1)], "encoded more than once a pointer"
        # what Triton's wrapper passes the C launch for the same call, with every descriptor encoded afresh
        base = (4, 6, 1, 0, stand_in.function, False, False, None, None, stand_in.packed_metadata, None, None, None)
        wrapped(*base, q2.data_ptr(), launcher.Described(q2.data_ptr(), (2, 128, 3, 16), (6144, 48, 16, 1), "zero"),
                launcher.Described(q2.data_ptr(), (2, 128, 3, 16), (6144, 48, 16, 1), "zero"), 7, 64)
        assert raw_calls[3] == raw_calls[-1] and raw_calls[0] == raw_calls[4] != raw_calls[3]
        assert raw_calls[0][13:] == (ptr[0], ("map", ptr[0], (2, 128, 3, 16), (6144, 48, 16, 1), "zero", 0),
                                     2, 128, 3, 16, 6144, 48, 16, 1,
                                     ("map", ptr[0], (2, 128, 3, 16), (6144, 48, 16, 1), "zero", 1),
                                     2, 128, 3, 16, 6144, 48, 16, 1, 7, 64)
        monkeypatch.setattr(launcher._Encoded, "KEEP", 2)
        for p in range(1 << 20, (1 << 20) + 5 * 512, 512):  # (workspace pointers: each new)
            made({"Q": p})
        assert all(len(maps) <= 2 for maps in made._encoded.maps)
