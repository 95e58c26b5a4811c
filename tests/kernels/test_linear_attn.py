"""In-repo Triton chunked linear attention (kernels.linear_attn) against the FP64 oracle.

Every tensor (out, final state, dq, dk, dv, dg, dh0) goes through the harness's tolerance engine:
error vs the oracle <= factor x the error of the eager chunked reference in the same dtype + floor.
On a machine without CUDA the kernels run under Triton's interpreter (tiny shapes, fp32 / fp16);
bf16 runs only on the GPU, because the interpreter's bf16 tl.dot multiplies raw bit patterns.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F

from harness.adapters.eager import eager_linear_attention
from harness.check.tolerance import compare_tensor
from harness.oracle import linear_attention
from kernels.linear_attn import chunk_linear_attn
from kernels.linear_attn.naive import naive_chunk_linear_attn, naive_recurrent_linear_attn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = DEVICE == "cuda"
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (bf16 tl.dot is wrong under the interpreter)")

# Decay strengths: per-step gate log-sigmoid(x) / n; n = 0.1 is strong decay (about -7 a step).
GATE_STRENGTHS = (0.1, 1.0, 10.0)



def make_inputs(B, T, H, K, V, dtype, gate, *, h0=True, seed=0, device=DEVICE):
    """Fresh random inputs (never zeros). gate: None, ("g", n) or "gamma"."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    x = dict(q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, H, V).to(dtype), g=None,
             g_gamma=None, initial_state=rnd(B, H, K, V) if h0 else None)
    if isinstance(gate, tuple):
        x["g"] = F.logsigmoid(rnd(B, T, H)) / gate[1]
    elif gate == "gamma":
        x["g_gamma"] = torch.log(1 - 2.0 ** (-3.0 - torch.arange(H, dtype=torch.float32))).to(device)
    x["do"] = rnd(B, T, H, V).to(dtype)
    x["dht"] = rnd(B, H, K, V)
    return x


def _grads(fn, x, with_state):
    """Run fn(q, k, v, g, g_gamma, scale=..., initial_state=..., output_final_state=...) and its backward;
    returns {tensor name: value} with the harness's names."""
    # g_gamma is a constant, as in FLA: not differentiated
    leaves = {n: x[n].detach().clone().requires_grad_(n != "g_gamma")
              for n in ("q", "k", "v", "g", "g_gamma", "initial_state") if x[n] is not None}
    o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves.get("g"), leaves.get("g_gamma"),
               initial_state=leaves.get("initial_state"), output_final_state=True)
    outs, grads = [o], [x["do"]]
    if with_state:
        outs.append(ht)
        grads.append(x["dht"].to(ht.dtype))
    torch.autograd.backward(outs, grads)
    def grad(n):  # an input the function ignored has gradient zero
        return leaves[n].grad if leaves[n].grad is not None else torch.zeros_like(leaves[n])

    res = {"out": o.detach(), "final_state": ht.detach(), "dq": grad("q"), "dk": grad("k"), "dv": grad("v")}
    if "g" in leaves:
        res["dg"] = grad("g")
    if "initial_state" in leaves:
        res["dh0"] = grad("initial_state")
    return res


def _ours(q, k, v, g, g_gamma, **kw):
    return chunk_linear_attn(q, k, v, g, g_gamma, **kw)


def _eager(q, k, v, g, g_gamma, *, initial_state=None, output_final_state=True):
    return eager_linear_attention(q, k, v, g=g, g_gamma=g_gamma, initial_state=initial_state)


def judge(x, fn=_ours, *, with_state=True):
    """Tolerance reports of fn against the oracle, the eager reference in the same dtype setting the bar."""
    dtype = x["q"].dtype
    cand = _grads(fn, x, with_state)
    ref = _grads(_eager, x, with_state)
    orc = linear_attention(x["q"], x["k"], x["v"], x["do"], g=x["g"], g_gamma=x["g_gamma"],
                           initial_state=x["initial_state"], grad_final_state=x["dht"] if with_state else None)
    expected = orc.tensors()
    reports = []
    for name, c in cand.items():
        e = expected[name]
        if name == "dg" and x["g"] is None:
            continue
        ref_err = float((ref[name].double() - e).norm() / e.norm().clamp_min(1e-300))
        # the state and the gate are fp32 in every dtype
        tdtype = torch.float32 if name in ("final_state", "dh0", "dg") else dtype
        reports.append(compare_tensor(name, c, e, reference_error=ref_err, dtype=tdtype, case_dtype=dtype))
    return reports


def assert_pass(reports):
    bad = [r.reason for r in reports if not r.passed]
    assert not bad, "; ".join(bad)


# ---------------------------------------------------------------------------------------------
# correctness on the interpreter (and the GPU)
# ---------------------------------------------------------------------------------------------

GATES = [None, *(("g", n) for n in GATE_STRENGTHS), "gamma"]
GATE_IDS = ["nogate", *(f"g-n{n:g}" for n in GATE_STRENGTHS), "gamma"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("T", [1, 63, 65, 127])
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_matches_oracle_every_tensor(dtype, T, gate):
    x = make_inputs(1, T, 2, 32, 32, dtype, gate, seed=T)
    assert_pass(judge(x))


@pytest.mark.parametrize("K,V", [(32, 64), (64, 32), (64, 64)])
@pytest.mark.parametrize("gate", [None, ("g", 1.0), "gamma"], ids=["nogate", "g-n1", "gamma"])
def test_matches_oracle_head_dims(K, V, gate):
    x = make_inputs(2, 65, 2, K, V, torch.float16, gate, seed=K + V)
    assert_pass(judge(x))


def test_matches_oracle_dim_128():
    x = make_inputs(1, 20, 1, 128, 128, torch.float32, ("g", 1.0), seed=5)
    assert_pass(judge(x))


def test_matches_oracle_without_state():
    # no initial state, final state unused (its gradient is then zero)
    x = make_inputs(1, 70, 2, 32, 32, torch.float32, ("g", 1.0), h0=False, seed=11)
    assert_pass(judge(x, with_state=False))


# torch's first forward-mode AD use scripts its jvp decompositions with the deprecated torch.jit.script
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_a_call_autograd_does_not_need_skips_the_autograd_node(monkeypatch):
    """No grad mode, or no input requiring grad: the forward alone (no node, nothing saved), the same output and
    final state as the differentiable call; a forward-mode AD level keeps the node (which says it cannot)."""
    from kernels.linear_attn import chunk

    applied = []
    real = chunk.ChunkLinearAttnFunction.apply
    monkeypatch.setattr(chunk.ChunkLinearAttnFunction, "apply", lambda *a: applied.append(1) or real(*a))
    x = make_inputs(1, 40, 2, 32, 32, torch.float32, ("g", 1.0), seed=5)
    args = [x[n] for n in ("q", "k", "v", "g")]
    grad_args = [t.clone().requires_grad_() for t in args]
    want_o, want_ht = chunk_linear_attn(*grad_args, initial_state=x["initial_state"], output_final_state=True)
    assert applied == [1] and want_o.grad_fn is not None
    for context, inputs in ((torch.no_grad, grad_args), (torch.inference_mode, grad_args), (torch.enable_grad, args)):
        with context():
            o, ht = chunk_linear_attn(*inputs, initial_state=x["initial_state"], output_final_state=True)
        assert o.grad_fn is None and not o.requires_grad
        assert torch.equal(o, want_o.detach()) and torch.equal(ht, want_ht.detach())
    assert applied == [1], "a call that needs no autograd node went through the autograd Function"
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level(), pytest.raises(RuntimeError, match="jvp"):
        chunk_linear_attn(fwad.make_dual(args[0], torch.ones_like(args[0])), *args[1:])
    assert applied == [1, 1]


@pytest.mark.parametrize("chunk_size", [16, 32, 128])
def test_chunk_size_changes_only_rounding(chunk_size):
    x = make_inputs(1, 150, 2, 32, 32, torch.float32, ("g", 1.0), seed=3)
    fn = lambda *a, **kw: chunk_linear_attn(*a[:3], a[3], a[4], chunk_size=chunk_size, **kw)
    assert_pass(judge(x, fn))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("T", [1, 65, 127])
@pytest.mark.parametrize("gate", [None, ("g", 0.1), "gamma"], ids=["nogate", "g-n0.1", "gamma"])
@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_other_tile_io_matches_oracle(dtype, T, gate, split, monkeypatch):
    # the tile path (block pointers or tensor descriptors, configs.FWD_TMA / BWD_TMA) the defaults
    # do not take; with descriptors the copy engine zero-fills and clips the last partial chunk
    # instead of boundary checks, so odd lengths are the point; both backward plans' walks
    from kernels.linear_attn import configs as cfg
    monkeypatch.setattr(cfg, "FWD_TMA", not cfg.FWD_TMA)
    monkeypatch.setattr(cfg, "BWD_TMA", not cfg.BWD_TMA)
    if split:
        monkeypatch.setattr(cfg, "PLAN_OVERRIDE", dict(SPLIT=True, BV=32, BKD=32, BK=32))
    x = make_inputs(1, T, 2, 32, 64, dtype, gate, seed=T + 1)
    assert_pass(judge(x))


@pytest.mark.parametrize("plan", [
    dict(SPLIT=True, BV=32, BKD=32, BK=32),  # dv walks per V block, dk walks per K block
    dict(SPLIT=True, BV=64, BKD=32, BK=64),
    dict(SPLIT=False, BV=64, BKD=64, BK=32),  # one dk+dv walk, dq split over K
], ids=["split-32", "split-mixed", "fused-dq32"])
@pytest.mark.parametrize("gate", [None, ("g", 1.0), "gamma"], ids=["nogate", "g-n1", "gamma"])
def test_backward_plans_match_oracle(plan, gate, monkeypatch):
    from kernels.linear_attn import configs as cfg
    monkeypatch.setattr(cfg, "PLAN_OVERRIDE", plan)
    x = make_inputs(1, 70, 2, 64, 64, torch.float32, gate, seed=21)
    assert_pass(judge(x))


def test_naive_forms_agree_with_oracle():
    x = make_inputs(1, 40, 2, 32, 32, torch.float64, ("g", 1.0), seed=4)
    orc = linear_attention(x["q"], x["k"], x["v"], g=x["g"], initial_state=x["initial_state"])
    for fn in (naive_recurrent_linear_attn, naive_chunk_linear_attn):
        o, ht = fn(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True)
        torch.testing.assert_close(o, orc.out, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(ht, orc.final_state, rtol=1e-10, atol=1e-10)


def test_strong_decay_long_sequence_stays_finite():
    # cumulative log-decay over T steps is ~ -7 * T: only chunk-local cumsums keep exp() finite
    x = make_inputs(1, 300, 1, 32, 32, torch.float32, ("g", 0.1), seed=9)
    o, ht = chunk_linear_attn(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"], output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()


# ---------------------------------------------------------------------------------------------
# the checks bite: deliberately wrong kernels must fail
# ---------------------------------------------------------------------------------------------


def _wrong_gate_shifted(q, k, v, g, g_gamma, **kw):
    # off-by-one in the decay: applies g_{t+1} at step t
    return chunk_linear_attn(q, k, v, torch.roll(g, -1, dims=1), g_gamma, **kw)


def _wrong_no_initial_state(q, k, v, g, g_gamma, initial_state=None, **kw):
    return chunk_linear_attn(q, k, v, g, g_gamma, **kw)


def _wrong_scale(q, k, v, g, g_gamma, **kw):
    return chunk_linear_attn(q, k, v, g, g_gamma, scale=1.02 * q.shape[-1] ** -0.5, **kw)


def _wrong_chunk_local_state(q, k, v, g, g_gamma, **kw):
    # forgets the state carried between chunks for the first chunk's output: the running state
    # of a 2-chunk sequence split in two independent calls
    T = q.shape[1]
    o1, _ = chunk_linear_attn(q[:, :64], k[:, :64], v[:, :64], g[:, :64], g_gamma, **kw)
    o2, h2 = chunk_linear_attn(q[:, 64:], k[:, 64:], v[:, 64:], g[:, 64:], g_gamma,
                               initial_state=None, output_final_state=True)
    assert T > 64
    return torch.cat([o1, o2], 1), h2


@pytest.mark.parametrize("wrong", [_wrong_gate_shifted, _wrong_no_initial_state, _wrong_scale,
                                   _wrong_chunk_local_state], ids=lambda f: f.__name__[1:])
def test_wrong_kernels_are_rejected(wrong):
    x = make_inputs(1, 100, 2, 32, 32, torch.float16, ("g", 10.0), seed=13)
    assert any(not r.passed for r in judge(x, wrong))


# ---------------------------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------------------------


def _valid(**over):
    x = make_inputs(1, 8, 2, 32, 32, torch.float32, None)
    args = dict(q=x["q"], k=x["k"], v=x["v"], g=None, g_gamma=None, initial_state=None, chunk_size=64)
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    (dict(q=torch.randn(8, 2, 32)), "q must have shape"),
    (dict(k=torch.randn(1, 9, 2, 32)), "k must have shape"),
    (dict(v=torch.randn(1, 8, 3, 32)), "v must have shape"),
    (dict(v=torch.randn(8, 2, 32)), "v must have shape"),
    (dict(k=torch.randn(1, 8, 2, 32, dtype=torch.float64)), "k must have q's dtype"),
    (dict(q=torch.randn(1, 8, 2, 48), k=torch.randn(1, 8, 2, 48)), "head dim K"),
    (dict(v=torch.randn(1, 8, 2, 24)), "head dim V"),
    (dict(g=torch.zeros(1, 8, 2) - 1, g_gamma=torch.zeros(2) - 1), "at most one of g"),
    (dict(g=torch.zeros(1, 8, 3) - 1), "g must have shape"),
    (dict(g_gamma=torch.zeros(3) - 1), "g_gamma must have shape"),
    (dict(initial_state=torch.randn(1, 2, 32, 16)), "initial_state must have shape"),
    # empty: randn on "meta" imports sympy (0.5 s) in every worker at collection
    (dict(initial_state=torch.empty(1, 2, 32, 32, device="meta")), "initial_state must be on"),
    (dict(chunk_size=48), "chunk_size must be one of"),
], ids=["q-rank", "k-T", "v-H", "v-rank", "dtype", "K", "V", "both-gates", "g-shape", "gamma-shape",
        "h0-shape", "h0-device", "chunk"])
def test_invalid_inputs_raise_value_error(over, match):
    a = _valid(**over)
    if DEVICE == "cuda":
        a = {n: (t.cuda() if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t) for n, t in a.items()}
    with pytest.raises(ValueError, match=match):
        chunk_linear_attn(a["q"], a["k"], a["v"], a["g"], a["g_gamma"], initial_state=a["initial_state"],
                          chunk_size=a["chunk_size"])


# ---------------------------------------------------------------------------------------------
# GPU only: bf16, realistic shapes, and FLA's error as a second bar
# ---------------------------------------------------------------------------------------------


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_gpu_matches_oracle(dtype, D, gate):
    x = make_inputs(2, 1000, 4, D, D, dtype, gate, seed=D)
    assert_pass(judge(x))


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("gate", [None, ("g", 0.1), "gamma"], ids=["nogate", "g-n0.1", "gamma"])
def test_gpu_other_tile_io_matches_oracle(dtype, D, gate, monkeypatch):
    # the tile path the defaults do not take (block pointers or tensor descriptors)
    from kernels.linear_attn import configs as cfg
    monkeypatch.setattr(cfg, "FWD_TMA", not cfg.FWD_TMA)
    monkeypatch.setattr(cfg, "BWD_TMA", not cfg.BWD_TMA)
    x = make_inputs(2, 1000, 4, D, D, dtype, gate, seed=D + 1)
    assert_pass(judge(x))


@gpu
@needs_gpu
@pytest.mark.parametrize("K, V", [(32, 128), (128, 32), (32, 64), (64, 128), (32, 256)])
def test_gpu_unequal_head_dims_every_backward_config(K, V, monkeypatch):
    # K != V with an initial state and a final-state gradient, through each searched backward config
    # in turn, twice (session 10's fuzzer found 1-stage configs faulting here: illegal memory access)
    from kernels.linear_attn import configs as cfg
    for c in cfg.bwd_configs():
        monkeypatch.setattr(cfg, "CONFIG_OVERRIDE", {"bwd": {"num_warps": c.num_warps, "num_stages": c.num_stages}})
        for seed in (0, 1):
            x = make_inputs(2, 130, 2, K, V, torch.bfloat16, ("g", 0.1), seed=K + V + seed)
            assert_pass(judge(x))


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("gate", GATES, ids=GATE_IDS)
def test_gpu_error_within_1p5x_of_fla(dtype, gate):
    fla = pytest.importorskip("fla.ops.simple_gla", reason="FLA (fla-core) is not installed")
    from harness.adapters.fla import pin_if_requested

    pin_if_requested()  # gpu-tests pins FLA's autotuners (ATTN_HARNESS_FLA_AUTOTUNE=0): 100-150 s a test otherwise
    x = make_inputs(2, 1000, 4, 64, 64, dtype, gate, seed=7)

    def fla_fn(q, k, v, g, g_gamma, **kw):
        return fla.chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, **kw)

    def fla_fused_fn(q, k, v, g, g_gamma, **kw):
        return fla.fused_chunk_simple_gla(q, k, v, g=g, g_gamma=g_gamma, **kw)

    ours = {r.name: r.error for r in judge(x)}
    try:
        theirs = {r.name: r.error for r in judge(x, fla_fn)}
    except RuntimeError:  # fla-core 0.6 refuses the gated chunk backward on Hopper with triton < 3.7.1
        theirs = {r.name: r.error for r in judge(x, fla_fused_fn)}
    worse = {n: (ours[n], theirs[n]) for n in ours if n in theirs and ours[n] > 1.5 * theirs[n] + 1e-7}
    assert not worse, f"error above 1.5x FLA's (ours, FLA): {worse}"


# ---------------------------------------------------------------------------------------------
# the benchmark script runs end to end (tiny, on the interpreter)
# ---------------------------------------------------------------------------------------------


@pytest.mark.skipif(ON_GPU, reason="smoke run of the benchmark is for the CPU; on the GPU run it for real")
def test_benchmark_script_smoke(tmp_path, monkeypatch, capsys):
    import importlib.util
    import json
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_linear_attn.py"
    spec = importlib.util.spec_from_file_location("bench_linear_attn", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", ["bench", "--dims", "32", "--T", "70", "--dtypes", "fp32", "--B", "1",
                                      "--H", "2", "--check-T", "40", "--gates", "1", "gamma", "--backends", "ours",
                                      "--out", str(tmp_path)])
    bench.main()
    res = json.loads((tmp_path / "bench_linear_attn.json").read_text())
    assert res["timing"][0]["ours_fwdbwd_ms"] > 0
    assert all(r["ours_over_eager"] < 3 for r in res["check"])
    assert "| 32 | fp32 | 70 |" in capsys.readouterr().out


def test_launch_lists_keep_what_ptxas_allows():
    # the pruning rules encode ptxas measurements (benchmarks/ptxas_report.py, docs/perf/linear_attn.md)
    from kernels.linear_attn import configs as cfg

    q = torch.empty(1, dtype=torch.float16)

    def fwd(KD, VD, BT=64):
        kept = cfg.prune_by_resources(cfg.fwd_configs(), {"q": q, "KD": KD, "VD": VD, "BT": BT})
        return {(c.kwargs["BV"], c.num_warps, c.num_stages) for c in kept}

    d64 = fwd(64, 64)
    assert {(32, 4, 3), (64, 4, 3), (64, 8, 2)} <= d64 and all(bv <= 64 for bv, _, _ in d64)
    d128 = fwd(128, 128)
    assert (64, 4, 2) in d128 and all(bv <= 64 for bv, _, _ in d128)  # 128 x 64 at 4 warps: spill-free
    d256 = fwd(256, 256, BT=32)
    assert d256 and all(bv == 32 for bv, _, _ in d256)  # 256 x 64 spills at 4 and 8 warps

    def bwd(K, V):
        plan = cfg.bwd_plan(K, V)
        return {(c.num_warps, c.num_stages) for c in cfg.prune_bwd(cfg.bwd_configs(), {"K": K, "V": V, **plan})}

    assert (4, 2) in bwd(64, 64)  # 25% faster than 8 warps at T=16k on the H100, despite 16 B of spill
    assert all(w in (4, 8) for w, _ in bwd(128, 128))  # 16 warps spill in every plan


# --------------------------------------------------------------------------------------------
# The chunk-local log-decay at strong decay (fp32 inputs)
# --------------------------------------------------------------------------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.linear_attn import chunk as _chunk  # noqa: E402


@triton.jit
def _segment_kernel(g, g_gamma, out, T, H: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr,
                    EXACT: tl.constexpr):
    # out[i, j] = b_i - b_j and out[BT, j] = b_last - b_j, as the walks form them
    o_t = tl.arange(0, BT)
    b_b, b_bl, b_last, b_lastl = _chunk._chunk_gate(g, g_gamma, 0, 0, 0, T, H, BT, GATE, EXACT)
    seg = _chunk._minus(b_b[:, None], b_bl[:, None], b_b[None, :], b_bl[None, :], EXACT)
    tl.store(out + o_t[:, None] * BT + o_t[None, :], seg)
    tl.store(out + BT * BT + o_t, _chunk._minus(b_last, b_lastl, b_b, b_bl, EXACT))


@pytest.mark.parametrize("gate", ["g", "g_gamma"])
@pytest.mark.parametrize("exact", [True, False], ids=["fp32-inputs", "16-bit-inputs"])
def test_decay_differences_keep_fp32_accuracy_at_strong_decay(gate, exact):
    # At n = 0.1 the cumulative log-decay reaches about -500 in a 64-row chunk, where one fp32 ulp
    # is 3e-5: b_i - b_j of two fp32 sums carried that as a relative error of exp(b_i - b_j), and
    # an H100 run of fp32 inputs failed final_state / dq / dk / dv by 5-12x the reference's error.
    # fp32 inputs (EXACT) must get every difference to fp32 rounding; 16-bit inputs need not (and
    # this shows the error the fp32 path removes is real).
    BT, T = 64, 61
    gen = torch.Generator().manual_seed(3)
    g = F.logsigmoid(torch.randn(T, generator=gen)) / 0.1
    g_gamma = torch.tensor([-7.3])
    if gate == "g_gamma":
        g64 = torch.full((T,), float(g_gamma), dtype=torch.float64)
    else:
        g64 = g.double()
    b = torch.cat([g64.cumsum(0), g64.sum().expand(BT - T)])  # rows past T repeat the last
    want = torch.cat([b[:, None] - b[None, :], (b[T - 1] - b)[None, :]])
    out = torch.full((BT + 1, BT), float("nan"), device=DEVICE)
    _segment_kernel[(1,)](g.to(DEVICE), g_gamma.to(DEVICE), out, T, 1, BT, 1 if gate == "g" else 2, exact)
    got = out.cpu().double()
    near = want.abs() < 80  # the differences whose exp is not 0 or inf in fp32
    rel = ((got - want).abs() / want.abs().clamp_min(1.0))[near].max().item()
    if exact:
        assert rel < 2 ** -22, f"b_i - b_j off by {rel:.2e} relative (fp32 rounding is 1.2e-7)"
    else:
        assert rel > 1e-6, f"the fp32 sum was expected to lose accuracy here (rel {rel:.2e})"


def test_inputs_off_a_16_byte_boundary_take_block_pointers(monkeypatch):
    # tensor descriptors need 16-byte aligned bases; a contiguous view can start anywhere
    from kernels.linear_attn import chunk
    from kernels.linear_attn import configs as cfg

    monkeypatch.setattr(cfg, "FWD_TMA", True)
    monkeypatch.setattr(cfg, "BWD_TMA", True)
    seen = []

    def shift(t):  # the same values, contiguous, one element past an aligned start (differentiable)
        flat = torch.cat([t.new_zeros(1), t.reshape(-1)])
        return flat[1:].view_as(t)

    def ours_shifted(q, k, v, g, g_gamma, **kw):
        q, k, v = shift(q), shift(k), shift(v)
        seen.append((q.is_contiguous(), q.data_ptr() % 16 != 0, chunk._use_tma(True, q, k, v)))
        return chunk_linear_attn(q, k, v, g, g_gamma, **kw)

    x = make_inputs(1, 65, 2, 32, 32, torch.float32, ("g", 1.0), seed=2)
    assert_pass(judge(x, ours_shifted))
    assert seen == [(True, True, False)]
