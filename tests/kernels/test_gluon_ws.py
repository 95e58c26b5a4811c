"""The 16-bit warp-specialised Gluon forward (kernels/flash_attn/fp8_gluon.py ``fwd_gluon_ws``), which
``flash_attn_func`` routes its bf16 / fp16 hd 128 and MLA training-form (q / k 192, v 128) forwards to on an sm90
GPU (configs.FWD_GLUON_WS), and hd 64's cell by cell (configs.FWD_GLUON_WS_CELLS, session 33).

Gluon has no interpreter: on the CPU the kernel is compiled for sm_90a (benchmarks/fp8_gluon_ptxas.py) and the
routing rule is checked on its own; on an sm90 GPU (marked ``gpu``) the routed calls, forward and backward, run
against the FP64 oracle, and the route is shown to be the Gluon kernel's launch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from sm90_compiles import sm90_reports

from kernels.flash_attn import configs, fp8_gluon

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


#: the three-consumer kernel's (BLOCK_N, stages, in-block overlap) at hd 64 that compile without spill (session 33;
#: 128-key tiles with the overlap spill 464-600 B at 160 registers a consumer, and at 168 serialise their wgmmas;
#: without it they fit)
THREE_CONSUMERS = ((64, 4, True), (64, 3, True), (128, 2, False), (128, 3, False))
#: fp8_gluon_ptxas.py's specs of every routed config, causal or not (bf16; hd 256, which runs one program a tile
#: with host-made descriptors, is left to SOFTCAPPED: its causal launch capped and not; each spec here costs the CPU
#: suite seconds)
ROUTED = [f"ws16:{d if d == dv else f'{d}/{dv}'},{bn},{st},{c}"
          for (d, dv), (bn, st) in configs.FWD_GLUON_WS.items() for c in (0, 1)
          if configs.FWD_GLUON_WS_MIN_SEQLEN[d, dv][bool(c)] < float("inf") and d != 256]


def _cell_spec(dims, causal, kw) -> str:
    """fp8_gluon_ptxas.py's spec of a routed FWD_GLUON_WS_CELLS config."""
    kind = "ws16p" if kw.get("persistent") else "ws16" + ("w3" if kw.get("consumers") == 3 else "") + (
        "" if kw.get("overlap", True) else "n")
    return f"{kind}:{dims[0]},{kw['block_n']},{kw['num_stages']},{int(causal)}"


#: the windowed kernel (configs.FWD_GLUON_WS_WINDOW) at hd 128's and hd 64's causal configs (never persistent; MLA's
#: 192 / 128 with a window is left to the GPU test: each spec here costs the CPU suite ~3 s a worker)
WINDOWED = [f"ws16:128,{configs.FWD_GLUON_WS[128, 128][0]},{configs.FWD_GLUON_WS[128, 128][1]},1@w1",
            "ws16w3n:64,128,3,1@w1"]
#: host-made descriptors (configs.FWD_GLUON_HOST_DESC) at hd 64's non-causal cell and hd 128 causal past the
#: persistent kernel's longest (one program a tile), and their spill bound (the session-50 compile's: the causal
#: cell and a window with them compile as their device-made twins did, 0 B and 12 B, not rechecked here)
HOST_MADE = {"ws16w3n:64,128,4,0@hd": 0, "ws16:128,128,3,1@hd": 4}
#: the softcapped kernels beside their uncapped twins: hd 256's routed config, causal with host-made descriptors (the
#: Gemma-2 row's launch, configs.FWD_GLUON_WS_SOFTCAP), and hd 128's persistent kernel, causal (routed in session 56)
CAPPED_TWINS = [f"ws16:256,{configs.FWD_GLUON_WS[256, 256][0]},{configs.FWD_GLUON_WS[256, 256][1]},1@hd",
                "ws16ps:128,128,3,1"]
SOFTCAPPED = CAPPED_TWINS + [f"{spec}@sc" for spec in CAPPED_TWINS]
#: kernels compiled with one of 4 or one of 2 of the softmax's exponentials by the cubic (@e4 / @e2, the kernel's
#: EXP2_EVERY; session 55; lost in session 56, not routed) beside their twins, at the shares their prediction
#: names: hd 64's routed cell (three consumers, host-made descriptors) at both, hd 128 capped one program a tile and
#: persistent at 2 (Gemma-2-27B's launches)
EXP2_TWINS = {"ws16w3n:64,128,4,0@hd": (4, 2), "ws16:128,128,3,1@hd@sc": (2, ), "ws16ps:128,128,3,1@sc": (2, )}
#: kernels compiled with the lazy rescale (@lz, the kernel's LAZY; built in session 60, not routed) beside their
#: twins, with the spills their compile showed (sm_90a, session 60: 4 -> 12 B and 8 -> 48 B): hd 128 causal one
#: program a tile (host-made descriptors) and persistent (kv heads outer snaking: Llama-3's causal rows)
LAZY_TWINS = {"ws16:128,128,3,1@hd": 12, "ws16ps:128,128,3,1": 48}
#: every routed cell's config, causal or not
CELLS = sorted({_cell_spec(dims, c, kw) for dims, cells in configs.FWD_GLUON_WS_CELLS.items()
                for (_, causal), (_, _, kw) in cells.items() for c in (False, True)})


@pytest.fixture(scope="module")
def compiled():
    if sys.platform != "linux":
        pytest.skip("Triton's bundled ptxas is a Linux binary")
    specs = ROUTED + [ROUTED[0] + ",1"]
    persistent = [f"ws16{p}:128,128,3,{c}" for p in ("p", "pk", "ps") for c in (0, 1)]
    persistent += [f"ws16{p}:192/128,64,4,{c}" for p in ("pk", "ps") for c in (0, 1)]
    three = [f"ws16w3{'' if ov else 'n'}:64,{bn},{st},{c}" for bn, st, ov in THREE_CONSUMERS for c in (0, 1)]
    cubic = [*EXP2_TWINS, *(f"{spec}@e{n}" for spec, shares in EXP2_TWINS.items() for n in shares)]
    lazy = [*LAZY_TWINS, *(f"{spec}@lz" for spec in LAZY_TWINS)]
    return sm90_reports(list(dict.fromkeys([*specs, *persistent, *three, *CELLS, *WINDOWED, *HOST_MADE, *SOFTCAPPED,
                                            *cubic, *lazy])))


def test_the_routed_configs_compile_with_their_registers_and_shared_memory(compiled):
    """Every routed head dim's config, causal or not, bf16 (and hd 128's in fp16): a loader warp at 24 registers
    and the consumers at 240 or more (setmaxnreg), no spill, no serialised wgmma, 16-bit wgmmas, each consumer's
    ping-pong wait retiring S_{j+1} while P_j V_j runs, and the shared memory (three stages of 128-key K and V
    tiles at hd 128, out through Q's tiles) within the H100's 227 KiB."""
    routed = {spec: r for spec, r in compiled.items() if spec.startswith("ws16:") and "@" not in spec}
    assert len(routed) == len(ROUTED) + 1 >= 5  # (hd 128 and MLA, both masks, and hd 128 in fp16)
    for spec, r in routed.items():
        assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 240, spec
        assert r["spill"] == 0 and not r["serialized"] and r["wgmma"] > 0, spec
        assert r["wait_one_pending"] >= 2, spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec


def test_a_softcap_adds_one_tanh_a_score_and_nothing_else(compiled):
    """The softcapped forward (``SOFTCAP``; routed at hd 256 in session 53) beside its uncapped twin
    (:data:`CAPPED_TWINS`: hd 256, and hd 128's persistent kernel): the same consumer and loader registers, wgmmas
    and ping-pong waits, shared memory within 64 B, spills within 4 B of the twin's (hd 256: none; hd 128 persistent
    8 -> 12 B, session 52); the capped kernel's consumers take the cap by one hardware tanh a score element of each
    softmax they inline (64 query rows x BLOCK_N keys over a warpgroup's 128 threads), no more exp2 than the twin
    and one division a program, for tanh's scale (session 52's form, 2 / (1 + 2^x) - 1, took one more exp2 and one
    division an element: three MUFU operations an element with the softmax's exp2)."""
    for spec in CAPPED_TWINS:
        plain, capped = compiled[spec], compiled[f"{spec}@sc"]
        for key in ("setmaxnreg", "wgmma", "wait_one_pending", "serialized", "ex2"):
            assert plain[key] == capped[key], (spec, key)
        assert capped["fdiv"] - plain["fdiv"] in (0, 1), spec  # (the program's one sm_scale / softcap)
        assert not plain["serialized"] and max(plain["setmaxnreg"]) >= 240, spec
        assert plain["spill"] <= capped["spill"] <= plain["spill"] + 4, (spec, plain["spill"], capped["spill"])
        assert abs(plain["smem"] - capped["smem"]) <= 64 and capped["smem"] <= configs.H100_SMEM_BYTES, spec
        per_softmax = 64 * int(spec.split(",")[1]) // 128
        assert plain["tanh"] == 0 and capped["tanh"] > 0 and capped["tanh"] % per_softmax == 0, (spec, capped["tanh"])
    assert compiled[CAPPED_TWINS[0] + "@sc"]["spill"] == 0  # (Gemma-2's launch)


def test_the_cubic_takes_a_share_of_the_exponentials_and_nothing_else(compiled):
    """``EXP2_EVERY`` (fp8_gluon._exp2_mixed; session 55; lost in session 56, not routed) beside its twins
    (:data:`EXP2_TWINS`): the same partitions' registers, wgmmas, waits, spills and shared memory; each cubic replaces
    one ex2 of the unmasked blocks' softmax, one in 4 or one in 2 of them (twice as many at 2 as at 4), tanh
    untouched, and no rounding or float-to-integer conversion added (those run on the XU pipe with ex2: session 56's
    cvt.rmi / cvt.rzi floor raised that pipe's work, ncu in session 57)."""
    assert set(n for shares in EXP2_TWINS.values() for n in shares) == set(fp8_gluon.EXP2_EVERY_CHOICES)
    for spec, shares in EXP2_TWINS.items():
        plain = compiled[spec]
        moved = {}
        for n in shares:
            cubic = compiled[f"{spec}@e{n}"]
            for key in ("setmaxnreg", "wgmma", "wait_one_pending", "serialized", "spill", "smem", "tanh", "fdiv",
                        "xu_cvt"):
                assert plain[key] == cubic[key], (spec, n, key)
            assert plain["exp2_cubic"] == 0 < cubic["exp2_cubic"] == plain["ex2"] - cubic["ex2"], (spec, n)
            moved[n] = cubic["exp2_cubic"]
        assert len(moved) == 1 or moved[2] == 2 * moved[4], (spec, moved)


def test_the_lazy_rescale_adds_one_cross_warp_max_a_softmax_and_nothing_else(compiled):
    """``LAZY`` (fp8_gluon._softmax_step_lazy; built in session 60, not routed) beside its twins (:data:`LAZY_TWINS`):
    the same partitions' registers, wgmmas, ping-pong waits, exponentials and shared memory; two more named barriers
    of a warpgroup for each of the three unmasked softmaxes a consumer inlines (the cross-warp max behind its one
    bool), twelve for the two consumers; spills within the bound its compile showed."""
    for spec, spill_at_most in LAZY_TWINS.items():
        plain, lazy = compiled[spec], compiled[f"{spec}@lz"]
        for key in ("setmaxnreg", "wgmma", "wait_one_pending", "serialized", "ex2", "smem", "tanh"):
            assert plain[key] == lazy[key], (spec, key)
        assert lazy["bar_sync_128"] - plain["bar_sync_128"] == 12, (spec, plain["bar_sync_128"], lazy["bar_sync_128"])
        assert plain["spill"] <= lazy["spill"] <= spill_at_most, (spec, plain["spill"], lazy["spill"])


def test_the_cubic_is_2_to_the_x_within_its_stated_error():
    """fp8_gluon.EXP2_CUBIC evaluated as the kernel's PTX does (x clamped at -126; t = 1.5 * 2^23 + x rounded down,
    its floor 1.5 * 2^23 + n; f = x - n; Horner in fp32 fmas; t's bits shifted left by 23 added to p's: 2^n in the
    exponent): relative error at most 1.2e-4 against exact 2^x over x in [-126, 0] (bf16's P rounds at
    2^-9), 1 at x = 0 and exact powers of two at the integers; and the refusals of other shares."""
    import numpy as np

    c3, c2, c1 = (np.array([int(c[2:], 16)], dtype=np.uint32).view(np.float32)[0] for c in fp8_gluon.EXP2_CUBIC)
    x = np.concatenate([-np.random.default_rng(0).uniform(0, 126, 200_000), -np.arange(0, 127)]).astype(np.float32)
    xc = np.maximum(x, np.float32(-126))
    magic = np.array([int(fp8_gluon.EXP2_ROUND_MAGIC[2:], 16)], dtype=np.uint32).view(np.float32)[0]
    assert magic == 1.5 * 2**23
    t = (np.float64(magic) + np.floor(xc.astype(np.float64))).astype(np.float32)  # (add.rm: exact at 1.5 * 2^23)
    fl = (t - magic).astype(np.float32)
    f = (xc - fl).astype(np.float32)
    assert np.array_equal(fl, np.floor(xc)) and f.min() >= 0 and f.max() < 1

    def fma(a, b, c):
        return (a.astype(np.float64) * np.float64(b) + np.float64(c)).astype(np.float32)

    p = fma(fma(fma(f, c3, c2), f, c1), f, 1.0)
    got = (p.view(np.uint32) + (t.view(np.uint32) << np.uint32(23))).view(np.float32).astype(np.float64)
    assert np.abs(got / np.exp2(x.astype(np.float64)) - 1).max() < 1.2e-4
    assert np.array_equal(got[-127:], np.exp2(x[-127:].astype(np.float64)))  # (the integers: p(0) = 1 exactly)
    for bad in (1, 3, 8):
        assert "exp2_every" in fp8_gluon.ws16_refused(False, False, 2, True, -1, False, 128, 128, 0.0, bad)
    assert fp8_gluon.ws16_refused(False, True, 2, True, -1, False, 128, 128, 50.0, 2) is None


def _qkv(d=128, dtype=torch.bfloat16, hq=4, hk=2, sq=1024, sk=1024):
    return (torch.empty(1, sq, hq, d, dtype=dtype), torch.empty(1, sk, hk, d, dtype=dtype),
            torch.empty(1, sk, hk, d, dtype=dtype))


def _route(q, k, v, **over):
    kw = dict(causal=False, window_left=-1, window_right=-1, softcap=0.0, varlen=False, fp8=False, sm_major=9)
    kw.update(over)
    return configs.gluon_ws_fwd(q, k, v, **kw)


def test_the_route_takes_what_the_kernel_does_and_nothing_else(monkeypatch):
    """hd 128 and q / k 192 with v 128, bf16 / fp16 dense calls of 512 tokens and more (causal: 1k), GQA, on sm90 go
    to the Gluon kernel; shorter sequences, windows, softcap (each behind its switch), varlen, FP8, other head dims,
    dtypes or GPUs, misaligned rows and the environment knob set to 0 stay on the Triton forward."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    q, k, v = _qkv()
    bn, st = configs.FWD_GLUON_WS[128, 128]
    causal = dict(causal=True, window_right=0)
    gqa = dict(block_n=bn, num_stages=st, persistent=True, tile_order="query")  # q's 4 heads over k's 2
    assert _route(q, k, v) == gqa and _route(q, k, v, **causal) == dict(gqa, tile_order="kv-snake")
    assert _route(*_qkv(hk=4)) == dict(gqa, tile_order="kv")  # MHA: kv heads outer
    assert _route(*_qkv(hk=4), **causal) == dict(gqa, tile_order="kv-snake")
    longest = configs.FWD_GLUON_WS_PERSISTENT_MAX_SEQLEN[128, 128][False, True]  # MHA causal past it: a tile a program
    assert _route(*_qkv(hk=4, sq=longest, sk=longest), **causal)["persistent"]
    assert _route(*_qkv(hk=4, sq=longest + 1, sk=longest + 1), **causal) == dict(gqa, persistent=False,
                                                                                   host_desc=True)
    assert _route(*_qkv(sq=4 * longest, sk=4 * longest), **causal) == dict(gqa, tile_order="kv-snake")  # GQA: no bound
    bn, st = configs.FWD_GLUON_WS[192, 128]
    mla = _qkv(d=192)[:2] + (torch.empty(1, 1024, 2, 128, dtype=q.dtype),)  # MLA is MHA: GQA's form not measured
    assert _route(*mla) == dict(block_n=bn, num_stages=st, persistent=False, tile_order="query")
    assert _route(*mla, **causal) == _route(*mla)
    mla_mha = _qkv(d=192, hk=4)[:2] + (torch.empty(1, 1024, 4, 128, dtype=q.dtype),)
    assert _route(*mla_mha) == _route(*mla_mha, **causal) == dict(block_n=bn, num_stages=st, persistent=True,
                                                                   tile_order="kv-snake")
    assert _route(*_qkv(d=192)) is None  # v 192: not a pair the kernel runs
    assert _route(*_qkv(dtype=torch.float16)) is not None
    assert _route(q, k, v, window_left=100) is None
    assert _route(q, k, v, window_right=5) is None
    assert _route(*mla, softcap=30.0) is None  # (192 / 128: not in FWD_GLUON_WS_SOFTCAP)
    assert _route(q, k, v, varlen=True) is None
    assert _route(q, k, v, fp8=True) is None
    assert _route(q, k, v, sm_major=10) is None and _route(q, k, v, sm_major=8) is None
    assert _route(*_qkv(d=64)) is None
    least = configs.FWD_GLUON_WS_MIN_SEQLEN[128, 128]
    assert _route(*_qkv(sq=least[False] - 1)) is None and _route(*_qkv(sk=least[False] - 1)) is None
    assert _route(*_qkv(sq=least[False], sk=least[False])) is not None
    assert _route(*_qkv(sq=least[True] - 1), causal=True, window_right=0) is None
    assert _route(*_qkv(sq=least[True], sk=least[True]), causal=True, window_right=0) is not None
    assert _route(*_qkv(sq=1024, sk=4096)) is not None
    assert _route(*_qkv(dtype=torch.float32)) is None
    assert _route(q, k, torch.empty(1, 1024, 2, 64, dtype=q.dtype)) is None  # d_v != d
    padded = torch.empty(1, 1024, 4, 132, dtype=q.dtype)[..., :128]  # rows 264 bytes apart: TMA cannot read them
    assert _route(padded, k, v) is None
    assert _route(q, k, v, sm_major=None) is None  # CPU tensors: no sm90 device
    monkeypatch.setenv(configs.FWD_GLUON_WS_ENV, "0")
    assert _route(q, k, v) is None


def test_the_cubic_share_routes_by_head_dims_and_cap_when_listed(monkeypatch):
    """configs.FWD_GLUON_EXP2_EVERY (session 55; empty: session 56 measured the cubic lose, 0.86-0.89x at capped
    hd 128, 0.90x at hd 64's non-causal cell): a listed (head dims, capped) cell's launch takes
    ``exp2_every`` (persistent or one program a tile, hd 64's cells too); other cells, and every cell while the table
    is empty, take none; the kernel's arguments carry it as EXP2_EVERY (absent at 0)."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    assert configs.FWD_GLUON_EXP2_EVERY == {}
    q, k, v = _qkv(hk=4, sq=4096, sk=4096)
    causal = dict(causal=True, window_right=0)
    plain, hd64 = _route(q, k, v, **causal), _route(*_qkv(d=64, hk=4, sq=4096, sk=4096))
    assert "exp2_every" not in plain and "exp2_every" not in hd64
    monkeypatch.setattr(configs, "FWD_GLUON_WS_SOFTCAP", frozenset({(128, 128), (256, 256)}))
    monkeypatch.setattr(configs, "FWD_GLUON_EXP2_EVERY", {(128, 128, True): 2, (64, 64, False): 4})
    assert _route(q, k, v, **causal) == plain  # (hd 128 uncapped: not listed)
    assert _route(q, k, v, softcap=50.0, **causal) == dict(plain, softcap=50.0, exp2_every=2)
    assert _route(*_qkv(d=64, hk=4, sq=4096, sk=4096)) == dict(hd64, exp2_every=4)
    out, lse = torch.empty_like(q), torch.empty(1, 4, 4096)
    assert fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, exp2_every=4)["EXP2_EVERY"] == 4
    assert "EXP2_EVERY" not in fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None)
    assert fp8_gluon.ws16_persistent_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None,
                                               exp2_every=2)["EXP2_EVERY"] == 2
    with pytest.raises(ValueError, match="exp2_every"):
        fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, exp2_every=3)


def test_the_lazy_rescale_routes_by_head_dims_and_cap_when_listed(monkeypatch):
    """configs.FWD_GLUON_LAZY (built in session 60, empty until measured): a listed (head dims, capped) cell's launch
    takes ``lazy`` (persistent or one program a tile); the kernels' arguments carry it as LAZY (absent at 0); a bound
    other than fp8_gluon.LAZY_CHOICES' is refused by name."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    assert configs.FWD_GLUON_LAZY == {}
    q, k, v = _qkv(hk=4, sq=4096, sk=4096)
    causal = dict(causal=True, window_right=0)
    plain = _route(q, k, v, **causal)
    assert "lazy" not in plain
    monkeypatch.setattr(configs, "FWD_GLUON_LAZY", {(128, 128, False): 8})
    assert _route(q, k, v, **causal) == dict(plain, lazy=8)
    assert "lazy" not in _route(*_qkv(d=64, hk=4, sq=4096, sk=4096))  # (not listed)
    out, lse = torch.empty_like(q), torch.empty(1, 4, 4096)
    assert fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, lazy=8)["LAZY"] == 8
    assert "LAZY" not in fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None)
    assert fp8_gluon.ws16_persistent_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, lazy=8)["LAZY"] == 8
    for bad in (3, -1):
        with pytest.raises(ValueError, match="lazy: one of"):
            fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, lazy=bad)


def test_a_cell_takes_shorter_calls_whose_grid_fills_whole_waves(monkeypatch):
    """configs.FWD_GLUON_WS_WAVE_CELLS (built in session 56, routed in session 57): below hd 64's non-causal MHA
    cell's shortest length (4k), down to the rule's (2k), a call takes the cell's launch when its 192-row tiles fill
    the SMs' waves to the rule's share (configs.wave_fill; 132 SMs for CPU tensors): B2 H12 2k's 264 tiles (two full
    waves) and B4 H12's 528 (four) do, H16's 352 (0.89) does not; nor 1k, causal (a cell the rule does not name) or
    GQA (no cell at hd 64). The cell's own lengths route as before either way; emptied, 2k stays on Triton."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    assert configs.FWD_GLUON_WS_WAVE_CELLS == {(64, 64): {(False, False): (2048, 0.97)}}
    assert configs.wave_fill(264, 132) == 1.0 and configs.wave_fill(352, 132) == pytest.approx(352 / 396)
    assert configs.wave_fill(1, 132) == pytest.approx(1 / 132)
    with pytest.raises(ValueError, match="positive"):
        configs.wave_fill(0, 132)
    def layer(b, h, s, hk=None, **kw):
        return _route(*(torch.empty(b, s, n, 64, dtype=torch.bfloat16) for n in (h, hk or h, hk or h)), **kw)

    cell = configs.FWD_GLUON_WS_CELLS[64, 64][False, False]
    routed = dict({"persistent": False, "tile_order": "query"} | cell[2], host_desc=True)
    monkeypatch.setattr(configs, "FWD_GLUON_WS_WAVE_CELLS", {})
    assert layer(2, 12, 2048) is None and layer(2, 12, cell[0]) == routed  # (off: 2k on the Triton forward)
    monkeypatch.setattr(configs, "FWD_GLUON_WS_WAVE_CELLS", {(64, 64): {(False, False): (2048, 0.97)}})
    assert layer(2, 12, 2048) == routed == layer(4, 12, 2048) == layer(2, 12, cell[0])
    assert layer(2, 16, 2048) is None and layer(2, 12, 1024) is None  # (fill 0.89; shorter than the rule)
    assert layer(2, 12, 2048, causal=True, window_right=0) is None  # (the causal cell: not in the rule)
    monkeypatch.setattr(configs, "FWD_GLUON_WS_WAVE_CELLS", {(64, 64): {(False, False): (2048, 0.97),
                                                                       (True, False): (2048, 0.97)}})
    assert layer(2, 12, 2048, hk=4) is None  # (GQA at hd 64: no cell to take, whatever the rule names)


def test_a_window_routes_only_when_switched_on_causal_and_one_program_a_tile(monkeypatch):
    """configs.FWD_GLUON_WS_WINDOW (built in session 50, on since session 51): off, a window keeps the Triton forward;
    on, a causal call with a window on the left takes the causal route's config, never persistent, the window among
    the keywords; a window without causal (a right bound other than the diagonal) stays on the Triton forward."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    q, k, v = _qkv(hk=4, sq=4096, sk=4096)
    causal = dict(causal=True, window_right=0)
    assert configs.FWD_GLUON_WS_WINDOW is True
    monkeypatch.setattr(configs, "FWD_GLUON_WS_WINDOW", False)
    assert _route(q, k, v, window_left=4095, **causal) is None
    monkeypatch.setattr(configs, "FWD_GLUON_WS_WINDOW", True)
    plain = _route(q, k, v, **causal)
    assert plain["persistent"] and "host_desc" not in plain  # (MHA causal at 4k: the persistent kernel, no window)
    assert _route(q, k, v, window_left=4095, **causal) == dict(plain, persistent=False, tile_order="query",
                                                               window_left=4095, host_desc=True)
    assert _route(*_qkv(hk=1, sq=4096, sk=4096), window_left=0, **causal)["window_left"] == 0
    assert _route(q, k, v, window_left=100) is None and _route(q, k, v, window_left=100, window_right=0) is None
    assert _route(q, k, v, window_left=100, softcap=30.0, **causal) == dict(  # (hd 128 capped: FWD_GLUON_WS_SOFTCAP)
        _route(q, k, v, window_left=100, **causal), softcap=30.0)
    least = configs.FWD_GLUON_WS_MIN_SEQLEN[128, 128][True]
    assert _route(*_qkv(sq=least - 1, sk=least - 1), window_left=100, **causal) is None
    hd64 = _qkv(d=64, hk=4, sq=8192, sk=8192)  # hd 64: its causal cell's config, one program a tile anyway
    assert _route(*hd64, window_left=4095, **causal) == dict(_route(*hd64, **causal), window_left=4095)
    assert _route(*_qkv(d=64, hk=2, sq=8192, sk=8192), window_left=4095, **causal) is None  # (no GQA cell)
    q, k, v = _qkv(sq=300, sk=500)  # the kernel's argument: a window wider than Sq + Sk sees the same keys
    out, lse = torch.empty_like(q), torch.empty(1, 4, 300)
    kw = fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, window_left=10**9)
    assert kw["WINDOW"] is True and kw["window_left"] == 800  # (no int32 overflow in the kernel's sums)
    assert fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, window_left=7)["window_left"] == 7


def test_a_softcap_routes_only_at_the_listed_head_dims_as_its_uncapped_twin(monkeypatch):
    """configs.FWD_GLUON_WS_SOFTCAP (session 53: hd 256 alone; hd 128 since session 56, 1.30-1.36x the Triton
    capped forward without the cubic share, which lost 0.86-0.89x: docs/perf/gluon-s56): a softcapped call
    at a listed head dim takes its uncapped twin's launch wherever that one is routed (persistent or not), the cap
    among the keywords (with a window too); elsewhere it keeps the Triton forward. Gemma-2's hd 256 runs from 1k, one
    program a tile with host-made descriptors, capped or not. Both kernels' arguments carry the cap and refuse one
    that is not positive."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    q, k, v = _qkv(hk=4, sq=4096, sk=4096)
    causal = dict(causal=True, window_right=0)
    assert configs.FWD_GLUON_WS_SOFTCAP == {(128, 128), (256, 256)}  # (the routed default)
    plain = _route(q, k, v, **causal)
    assert plain["persistent"]  # (MHA causal at 4k: the persistent kernel uncapped)
    monkeypatch.setattr(configs, "FWD_GLUON_WS_SOFTCAP", frozenset({(256, 256)}))
    assert _route(q, k, v, softcap=50.0, **causal) is None  # (hd 128 not listed)
    monkeypatch.setattr(configs, "FWD_GLUON_WS_SOFTCAP", frozenset({(128, 128), (256, 256)}))
    assert _route(q, k, v, softcap=50.0, **causal) == dict(plain, softcap=50.0)
    assert _route(q, k, v, softcap=50.0, window_left=1023, **causal) == dict(
        plain, persistent=False, tile_order="query", softcap=50.0, window_left=1023, host_desc=True)
    assert _route(*_qkv(sq=256, sk=256), softcap=50.0) is None  # (shorter than the uncapped route)
    bn, st = configs.FWD_GLUON_WS[256, 256]
    gemma_route = dict(block_n=bn, num_stages=st, persistent=False, tile_order="query", host_desc=True)
    for sq in (1024, 4096):
        gemma = _qkv(d=256, hq=16, hk=8, sq=sq, sk=sq)
        assert _route(*gemma, softcap=50.0, **causal) == dict(gemma_route, softcap=50.0)
        assert _route(*gemma, **causal) == _route(*gemma) == gemma_route
    assert _route(*_qkv(d=256, hq=16, hk=8, sq=1000, sk=4096), softcap=50.0) is None  # (under 1k)
    q, k, v = _qkv(sq=300, sk=500)
    out, lse = torch.empty_like(q), torch.empty(1, 4, 300)
    kw = fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, softcap=50.0)
    assert kw["SOFTCAP"] is True and kw["softcap"] == 50.0
    plain_kw = fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None)
    assert "SOFTCAP" not in plain_kw and plain_kw["softcap"] == 0.0
    persistent = fp8_gluon.ws16_persistent_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, "kv", 50.0)
    assert persistent["SOFTCAP"] is True and persistent["softcap"] == 50.0
    plain_kw = fp8_gluon.ws16_persistent_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, "kv")
    assert "SOFTCAP" not in plain_kw and plain_kw["softcap"] == 0.0
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="softcap"):
            fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, softcap=bad)
        with pytest.raises(ValueError, match="softcap"):
            fp8_gluon.ws16_persistent_arguments(q, k, v, out, lse, 0.125, True, 128, 3, None, "kv", bad)


def test_the_windowed_kernel_compiles_with_the_same_partitions(compiled):
    """The window (WINDOW: the tile's key blocks from its first row's window edge, the blocks left of the last row's
    edge masked) at hd 128's and hd 64's causal configs (:data:`WINDOWED`): the same register split, ping-pong waits
    as the windowless config's, 16-bit wgmmas not serialised, shared memory within 227 KiB; at most one spilled
    register (hd 128: 4 B, stored before consumer 1's key loop and loaded after it, session 50's SASS)."""
    assert len(WINDOWED) == 2
    for spec in WINDOWED:
        r, plain = compiled[spec], compiled[spec.split("@")[0]] if spec.split("@")[0] in compiled else None
        assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 160, spec
        assert r["spill"] <= 4 and not r["serialized"] and r["wgmma"] > 0, spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec
        if plain is not None:
            assert r["setmaxnreg"] == plain["setmaxnreg"] and r["wait_one_pending"] == plain["wait_one_pending"], spec


def test_host_made_descriptors_compile_with_the_same_partitions(compiled):
    """HOST_DESC (the four descriptors made on the host, rank-4 tiles in shared memory) at each one-program-a-tile
    config the route would give it: the register split and ping-pong waits of the device-made kernel, 16-bit wgmmas
    not serialised, shared memory within 227 KiB, spills within the session-50 compile's (hd 64 none; hd 128 causal
    4 B)."""
    for spec, spill in HOST_MADE.items():
        r, plain = compiled[spec], compiled[spec.replace("@hd", "")]
        assert r["setmaxnreg"] == plain["setmaxnreg"] and r["wait_one_pending"] == plain["wait_one_pending"], spec
        assert r["spill"] <= spill and not r["serialized"] and r["wgmma"] == plain["wgmma"], spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec


def test_host_made_descriptors_route_and_describe_the_tensors(monkeypatch):
    """configs.FWD_GLUON_HOST_DESC (built in session 50, on since session 51) puts ``host_desc`` on the launches that
    are not persistent (hd 64's cells, hd 128 MHA causal past the persistent kernel's longest, windows), never on
    persistent ones or MLA's two head-dim parts; ws16_arguments then passes rank-4 descriptors over q, k, v and out
    with the kernel's boxes and layouts."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    causal = dict(causal=True, window_right=0)
    hd64 = _qkv(d=64, hk=4, sq=4096, sk=4096)
    assert configs.FWD_GLUON_HOST_DESC is True
    monkeypatch.setattr(configs, "FWD_GLUON_HOST_DESC", False)
    assert "host_desc" not in _route(*hd64)
    monkeypatch.setattr(configs, "FWD_GLUON_HOST_DESC", True)
    assert _route(*hd64)["host_desc"] is True
    longest = configs.FWD_GLUON_WS_PERSISTENT_MAX_SEQLEN[128, 128][False, True]
    assert _route(*_qkv(hk=4, sq=2 * longest, sk=2 * longest), **causal)["host_desc"] is True
    assert "host_desc" not in _route(*_qkv(hk=4, sq=longest, sk=longest), **causal)  # (persistent)
    assert "host_desc" not in _route(*_qkv())  # (GQA: persistent)
    mla = _qkv(d=192)[:2] + (torch.empty(1, 1024, 2, 128, dtype=torch.bfloat16),)
    assert _route(*mla)["persistent"] is False and "host_desc" not in _route(*mla)
    q, k, v = _qkv(d=64, hq=4, hk=2, sq=300, sk=500)
    out, lse = torch.empty_like(q), torch.empty(1, 4, 300)
    kw = fp8_gluon.ws16_arguments(q, k, v, out, lse, 0.125, False, 128, 4, None, 3, False, host_desc=True)
    assert kw["HOST_DESC"] is True
    for name, t, rows in (("QD", q, 64), ("KD", k, 128), ("VD", v, 128), ("OD", out, 64)):
        desc = kw[name]
        assert isinstance(desc, TensorDescriptor) and desc.base is t and list(desc.shape) == list(t.shape), name
        assert list(desc.block_shape) == [1, rows, 1, 64] and list(desc.strides) == [*t.stride()[:3], 1], name
    nvmma = fp8_gluon.gl.NVMMASharedLayout.get_default_for  # (rank-4 tiles: the boxes' layouts)
    assert kw["Q_SL"] == kw["O_SL"] == nvmma([1, 64, 1, 64], fp8_gluon.gl.bfloat16)
    assert kw["K_SL"] == kw["V_SL"] == nvmma([1, 128, 1, 64], fp8_gluon.gl.bfloat16)
    assert set(fp8_gluon.HOST_DESCRIPTOR_OF) == {"QD", "KD", "VD", "OD"}


def test_a_window_is_refused_where_the_kernel_has_none():
    """A window on the left needs causal (the diagonal is its right bound) and one program a tile: anything else is
    named before a launch."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window"):
        fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=0.1, causal=False, window_left=100)
    with pytest.raises(ValueError, match="window"):
        fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=0.1, causal=True, window_left=100, persistent=True)
    with pytest.raises(ValueError, match="window"):
        fp8_gluon.ws16_arguments(q, k, v, q, torch.empty(1, 4, 1024), 0.1, False, 128, 3, None, window_left=8)
    with pytest.raises(ValueError, match="window"):
        fp8_gluon.ws16_launch(q, k, v, q, torch.empty(1, 4, 1024), 0.1, True, 128, 3, persistent=True,
                              window_left=8)
    with pytest.raises(ValueError, match="host_desc"):  # (host-made descriptors: one program a tile, one part)
        fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=0.1, causal=False, host_desc=True, persistent=True)
    with pytest.raises(ValueError, match="host_desc"):
        fp8_gluon.fwd_gluon_ws(*_qkv(d=192)[:2], torch.empty(1, 1024, 2, 128, dtype=q.dtype), softmax_scale=0.1,
                               causal=False, host_desc=True)
    with pytest.raises(ValueError, match="host_desc"):
        fp8_gluon.ws16_launch(q, k, v, q, torch.empty(1, 4, 1024), 0.1, False, 128, 3, persistent=True,
                              host_desc=True)


def test_unsupported_inputs_are_named():
    q, k, v = _qkv()
    assert fp8_gluon.ws16_unsupported(q, k, v) is None
    mla_q, mla_k = _qkv(d=192)[:2]
    assert fp8_gluon.ws16_unsupported(mla_q, mla_k, torch.empty(1, 1024, 2, 128, dtype=q.dtype)) is None
    assert "head dims" in fp8_gluon.ws16_unsupported(mla_q, mla_k, torch.empty(1, 1024, 2, 192, dtype=q.dtype))
    assert "bf16 or fp16" in fp8_gluon.ws16_unsupported(q.float(), k.float(), v.float())
    assert "head dims" in fp8_gluon.ws16_unsupported(*_qkv(d=96))
    assert "kv heads" in fp8_gluon.ws16_unsupported(*_qkv(hq=3, hk=2))
    padded = torch.empty(1, 1024, 4, 132, dtype=q.dtype)[..., :128]  # rows 264 bytes apart: not a multiple of 16
    assert "16-byte" in fp8_gluon.ws16_unsupported(padded, k, v)
    assert "16-byte" in fp8_gluon.ws16_unsupported(q, k, torch.empty(1, 1024, 2, 256, dtype=q.dtype)[..., ::2])
    with pytest.raises(ValueError, match="fwd_gluon_ws"):
        fp8_gluon.fwd_gluon_ws(q.float(), k.float(), v.float(), softmax_scale=0.1, causal=False)
    with pytest.raises(ValueError, match="tile_order"):
        fp8_gluon.ws16_persistent_arguments(q, k, v, q, torch.empty(1, 4, 1024), 0.1, False, 128, 3, 240, "heads")


# ---- sm90 GPU: the routed forward and its backward against the oracle ----

WS_KERNELS = ("_fwd_ws_kernel", "_fwd_ws_persistent_kernel")


def _routed_kernel(hq, hk, causal, sq, d=128, dv=128):
    """The Gluon kernel the route launches for these heads, mask, query length and head dims
    (configs.persistent_order)."""
    if (d, dv) in configs.FWD_GLUON_WS_CELLS:  # hd 64: cell by cell
        return WS_KERNELS[bool(configs.FWD_GLUON_WS_CELLS[d, dv][hq > hk, causal][2].get("persistent"))]
    return WS_KERNELS[configs.persistent_order((d, dv), hq > hk, causal, sq) is not None]


def _route_from_one_token(monkeypatch):
    """Every head dim of configs.FWD_GLUON_WS and every cell of FWD_GLUON_WS_CELLS routed from one token on (hd 256's
    too): the GPU tests' short sequences take the route they test."""
    monkeypatch.setattr(configs, "FWD_GLUON_WS_MIN_SEQLEN",
                        {dims: {False: 1, True: 1} for dims in configs.FWD_GLUON_WS})
    monkeypatch.setattr(configs, "FWD_GLUON_WS_CELLS", {dims: {key: (1, None, kw) for key, (_, _, kw) in cells.items()}
                                                        for dims, cells in configs.FWD_GLUON_WS_CELLS.items()})


def _launched(interface):
    return [s.fwd["fwd"].compiled.name for s in interface._SIGNATURES._d.values() if getattr(s, "fwd", None)]

needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an sm90 (Hopper) GPU: Gluon's wgmma and TMA, no interpreter")


def _assert_like_oracle(out, lse, ref, base_out):
    """out within ``base_out``'s error of the FP64 oracle ``ref`` (plus bf16 rounding), lse within 1e-4, rows that see
    no key out 0 and lse -inf."""
    seen = ref.lse > float("-inf")
    err = lambda o: (o.double() - ref.out).abs().max().item()  # noqa: E731
    assert err(out) <= err(base_out) + 4e-3, (err(out), err(base_out))
    assert (lse.double() - ref.lse)[seen].abs().max().item() <= 1e-4
    assert bool((lse[~seen] == float("-inf")).all())
    assert bool((out.double()[~seen.transpose(1, 2).unsqueeze(-1).expand_as(out)] == 0).all())


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (2, 1000, 1000, 8, 2, False), (1, 777, 1500, 4, 4, True), (1, 1500, 777, 4, 1, True), (1, 130, 130, 2, 2, False)],
    ids=["GQA4-S1000", "causal-Sq<Sk", "causal-MQA-Sq>Sk", "S130"])
def test_gpu_gluon_forward_and_backward_match_oracle(b, sq, sk, hq, hk, causal, dtype, monkeypatch):
    """The Gluon kernel (its persistent form where configs.FWD_GLUON_WS_PERSISTENT says) on sequences shorter than
    the route's minimum too (partial and single tiles, Sq != Sk, rows that see no key): routed for the test by
    setting the minimum to 1, out, lse and every gradient within the tolerance rule of the FP64 oracle, and a
    second call replays the launch to the same bits."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "FWD_GLUON_WS_MIN_SEQLEN", {dims: {False: 1, True: 1} for dims in configs.FWD_GLUON_WS})
    interface._SIGNATURES.clear()
    out, lse, *_ = check_against_oracle(b, sq, sk, hq, hk, 128, dtype, causal, device="cuda")
    names = _launched(interface)
    assert names and set(names) == {_routed_kernel(hq, hk, causal, sq)}, names
    out2, lse2, *_ = check_against_oracle(b, sq, sk, hq, hk, 128, dtype, causal, device="cuda")
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, d, dv", [
    (1, 1100, 2100, 8, 2, True, 128, 128), (1, 1024, 1024, 4, 4, False, 128, 128), (1, 600, 600, 4, 4, False, 128, 128),
    (1, 1100, 1300, 4, 4, True, 192, 128), (2, 700, 700, 4, 2, False, 192, 128), (1, 4200, 4300, 2, 2, False, 64, 64),
    (1, 8200, 8200, 2, 2, True, 64, 64)],
    ids=["causal-GQA-S1100x2100", "S1024", "S600", "mla-causal-S1100x1300", "mla-GQA-S700", "hd64-S4200x4300",
         "hd64-causal-S8200"])
def test_gpu_routed_forward_and_backward_match_oracle(b, sq, sk, hq, hk, causal, d, dv, dtype):
    """flash_attn_func on sm90 at a routed head-dim pair (hd 128; MLA's q / k 192, v 128; hd 64's routed cells), from
    the mask's minimum length: its forward is the Gluon kernel's launch (the persistent one where
    configs.FWD_GLUON_WS_PERSISTENT or FWD_GLUON_WS_CELLS says;
    the replay cache holds it), out, lse and every gradient within the tolerance rule of the FP64 oracle (the
    backward reads the Gluon forward's out and lse)."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    interface._SIGNATURES.clear()
    check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal, device="cuda", dv=dv)
    names = _launched(interface)
    assert names and set(names) == {_routed_kernel(hq, hk, causal, sq, d, dv)}, names
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, d, dtype", [
    (1, 1100, 1100, 4, 2, True, -1, 50.0, 256, torch.bfloat16),
    (1, 777, 1500, 4, 4, False, -1, 30.0, 256, torch.bfloat16),
    (2, 1500, 777, 4, 1, True, 300, 50.0, 256, torch.float16),
    (1, 1000, 1000, 4, 4, False, -1, 0.0, 256, torch.bfloat16),
    (1, 2000, 2000, 8, 2, True, -1, 20.0, 128, torch.bfloat16),
    (1, 1100, 1300, 4, 4, True, -1, 50.0, 192, torch.bfloat16),
    (1, 4200, 4300, 2, 2, False, -1, 50.0, 64, torch.bfloat16),
    (1, 1000, 1000, 2, 2, True, -1, 1.0, 128, torch.bfloat16),
    (1, 1500, 1500, 4, 2, True, 200, 50.0, 128, torch.bfloat16)],
    ids=["hd256-causal-GQA-cap50", "hd256-Sq<Sk-cap30", "hd256-MQA-Sq>Sk-W300-cap50-fp16", "hd256-uncapped",
         "hd128-causal-GQA-cap20", "mla-causal-cap50", "hd64-cap50", "hd128-causal-cap1", "hd128-GQA-W200-cap50"])
def test_gpu_softcapped_forward_and_backward_match_oracle(b, sq, sk, hq, hk, causal, window, softcap, d, dtype,
                                                          monkeypatch):
    """Every head dim in configs.FWD_GLUON_WS_SOFTCAP (routed: hd 256; the route's minimum lengths set to 1): a
    softcapped call runs its uncapped twin's Gluon launch (persistent or one program a tile; its launch the only
    forward), out, lse and every gradient within the tolerance rule of the FP64 oracle (the Triton backward reads its
    out and lse): Gemma-2's hd 256 with and without a cap, with a window, rows that see no key (Sq > Sk), fp16; hd
    128 persistent and with a window, MLA's two head-dim parts, hd 64's three consumers; a cap of 1 (every score near
    the cap); a second call replays the launch to the same bits."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "FWD_GLUON_WS_SOFTCAP", frozenset([*configs.FWD_GLUON_WS,
                                                                   *configs.FWD_GLUON_WS_CELLS]))
    _route_from_one_token(monkeypatch)
    dv = 128 if d == 192 else d
    interface._SIGNATURES.clear()
    kw = dict(window=(window, 0 if causal else -1), device="cuda", dv=dv, softcap=softcap)
    first = check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal, **kw)
    names = _launched(interface)
    want = "_fwd_ws_kernel" if window >= 0 else _routed_kernel(hq, hk, causal, sq, d, dv)
    assert names and set(names) == {want}, names
    again = check_against_oracle(b, sq, sk, hq, hk, d, dtype, causal, **kw)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("every", fp8_gluon.EXP2_EVERY_CHOICES)
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal, window, softcap, d", [
    (1, 4200, 4300, 4, 4, False, -1, 0.0, 64), (1, 2000, 2000, 8, 2, True, -1, 50.0, 128),
    (2, 1500, 777, 4, 1, True, -1, 0.0, 128), (1, 1500, 1500, 4, 2, True, 200, 50.0, 128),
    (1, 1100, 1100, 4, 2, True, -1, 50.0, 256), (1, 1100, 1300, 4, 4, False, -1, 0.0, 192)],
    ids=["hd64-cells", "hd128-causal-GQA-cap50", "hd128-MQA-Sq>Sk", "hd128-GQA-W200-cap50", "hd256-causal-cap50",
         "mla"])
def test_gpu_the_cubic_share_matches_oracle(b, sq, sk, hq, hk, causal, window, softcap, d, every, monkeypatch):
    """The forward with one of ``every`` exponentials by the cubic (configs.FWD_GLUON_EXP2_EVERY listing the head dims,
    the route's minimum lengths set to 1; persistent or one program a tile as routed, hd 64's three consumers): out,
    lse and every gradient within the tolerance rule of the FP64 oracle, capped and not, rows that see no key (Sq >
    Sk), a window (Gemma-2's local layers), MLA's two head-dim parts; the launched kernel has the cubic; a second call
    replays it to the same bits."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    dv = 128 if d == 192 else d
    monkeypatch.setattr(configs, "FWD_GLUON_WS_SOFTCAP", frozenset([*configs.FWD_GLUON_WS,
                                                                   *configs.FWD_GLUON_WS_CELLS]))
    monkeypatch.setattr(configs, "FWD_GLUON_EXP2_EVERY", {(d, dv, bool(softcap)): every})
    _route_from_one_token(monkeypatch)
    interface._SIGNATURES.clear()
    kw = dict(window=(window, 0 if causal else -1), device="cuda", dv=dv, softcap=softcap)
    first = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, **kw)
    launches = [s.fwd["fwd"].compiled for s in interface._SIGNATURES._d.values() if getattr(s, "fwd", None)]
    assert launches and all(fp8_gluon.EXP2_CUBIC[0] in x.asm["ptx"] for x in launches)  # (the cubic compiled in)
    again = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, causal, **kw)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("persistent", [False, "kv-snake"], ids=["a-program-a-tile", "persistent"])
@pytest.mark.parametrize("scores", ["random", "creeping", "jumps"])
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [(1, 1500, 1500, 4, 2, True), (2, 1000, 1300, 4, 4, False),
                                                      (1, 1300, 700, 4, 1, True)],
                         ids=["causal-GQA", "Sq<Sk", "causal-MQA-Sq>Sk"])
def test_gpu_the_lazy_rescale_matches_oracle(b, sq, sk, hq, hk, causal, scores, persistent):
    """The 16-bit forward with the lazy rescale (``lazy`` 8; built in session 60): out within twice the eager
    kernel's error against the FP64 oracle and lse within 1e-3 of it, on random scores, on scores that creep up
    along the keys (each block's max a little above the last: the running max stays behind, P grows towards 2^8 until
    a block rescales) and on scores with jumps of more than 8 base-2 units (every such block rescales), causal or
    not, rows that see no key (Sq > Sk); run twice, the same bits."""
    from harness.oracle.softmax import softmax_attention

    g = torch.Generator(device="cpu").manual_seed(11)
    q = torch.randn(b, sq, hq, 128, generator=g)
    k = torch.randn(b, sk, hk, 128, generator=g)
    v = torch.randn(b, sk, hk, 128, generator=g)
    if scores != "random":  # a shared direction in q and k whose weight grows along the keys
        q[..., 0] = 4.0
        keys = torch.arange(sk, dtype=torch.float32)
        k[..., 0] = (keys / sk * 24.0)[None, :, None] if scores == "creeping" else \
            torch.where(keys % 300 < 150, 0.0, 30.0)[None, :, None] + (keys / sk * 4.0)[None, :, None]
    q, k, v = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    scale = 128 ** -0.5
    ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=scale)
    kw = dict(softmax_scale=scale, causal=causal, num_stages=configs.FWD_GLUON_WS[128, 128][1], poison=True,
              persistent=bool(persistent), tile_order=persistent or "query")
    eager, _ = fp8_gluon.fwd_gluon_ws(q, k, v, **kw)
    out, lse = fp8_gluon.fwd_gluon_ws(q, k, v, lazy=8, **kw)
    again = fp8_gluon.fwd_gluon_ws(q, k, v, lazy=8, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])
    err, err_eager = ((x.double() - ref.out).abs().max().item() for x in (out, eager))
    assert err <= 2 * err_eager + 1e-3, (err, err_eager)
    seen = torch.isfinite(ref.lse)
    assert torch.equal(torch.isfinite(lse), seen)
    assert (lse[seen].double() - ref.lse[seen]).abs().max().item() <= 1e-3


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, window, d, dv", [
    (1, 2000, 2000, 8, 2, 300, 128, 128), (1, 777, 1500, 4, 4, 130, 128, 128), (2, 1500, 777, 4, 1, 64, 128, 128),
    (1, 1000, 1000, 4, 4, 0, 128, 128), (1, 1100, 1300, 4, 4, 257, 192, 128), (1, 1000, 1000, 2, 2, 5000, 128, 128),
    (1, 2100, 2100, 2, 2, 500, 64, 64)],
    ids=["GQA-W300", "Sq<Sk-W130", "MQA-Sq>Sk-W64", "diagonal-only", "mla-W257", "window-past-start", "hd64-W500"])
def test_gpu_windowed_forward_and_backward_match_oracle(b, sq, sk, hq, hk, window, d, dv, monkeypatch):
    """configs.FWD_GLUON_WS_WINDOW on (session 50's build; the route's minimum lengths set to 1): a causal call
    with a window on the left runs the Gluon kernel one program a tile (its launch the only forward), out, lse and
    every gradient within the tolerance rule of the FP64 oracle (the Triton backward reads its out and lse):
    windows narrower and wider than a tile, 0 (the diagonal only), wider than the sequence, rows that see no key
    (Sq > Sk), MLA's two head-dim parts, hd 64's three consumers; a second call replays the launch to the same
    bits."""
    from test_flash_attn import check_against_oracle

    from kernels.flash_attn import interface

    monkeypatch.setattr(configs, "FWD_GLUON_WS_WINDOW", True)
    _route_from_one_token(monkeypatch)
    interface._SIGNATURES.clear()
    first = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, True, window=(window, 0), device="cuda",
                                 dv=dv)
    names = _launched(interface)
    assert names and set(names) == {"_fwd_ws_kernel"}, names
    again = check_against_oracle(b, sq, sk, hq, hk, d, torch.bfloat16, True, window=(window, 0), device="cuda",
                                 dv=dv)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    interface._SIGNATURES.clear()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("d, causal, consumers, bn, stages, overlap, window", [
    (64, False, 3, 128, 4, False, -1), (64, True, 3, 128, 3, False, -1), (128, True, 2, 128, 3, True, -1),
    (128, True, 2, 128, 3, True, 300)], ids=["hd64-cell", "hd64-causal-cell", "hd128-causal", "hd128-window"])
def test_gpu_host_made_descriptors_give_the_same_bits(d, causal, consumers, bn, stages, overlap, window):
    """fwd_gluon_ws with its descriptors made on the host (``host_desc``): out and lse bitwise the device-made
    kernel's (the same tiles, the same order) over partial tiles, GQA and Sq != Sk, and within the oracle's bound;
    a replay (``launches``) with another call's tensors encodes their descriptors (kernels/launcher.py) and gives
    that call's device-made bits too."""
    from harness.oracle.softmax import softmax_attention

    def inputs(seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        q = torch.randn(2, 1000, 8, d, generator=g).to("cuda", torch.bfloat16)
        k, v = (torch.randn(2, 1300, 2, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
        return q, k, v

    kw = dict(softmax_scale=d ** -0.5, causal=causal, block_n=bn, num_stages=stages, consumers=consumers,
              overlap=overlap, window_left=window, poison=True)
    launches = {}
    for seed in (3, 4):  # (the second call replays the first's launch)
        q, k, v = inputs(seed)
        o_d, l_d = fp8_gluon.fwd_gluon_ws(q, k, v, **kw)
        o_h, l_h = fp8_gluon.fwd_gluon_ws(q, k, v, host_desc=True, launches=launches, **kw)
        torch.cuda.synchronize()
        assert torch.equal(o_h, o_d) and torch.equal(l_h, l_d), seed
    ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=d ** -0.5,
                            window_size=(window, 0) if window >= 0 else (-1, -1))
    _assert_like_oracle(o_h, l_h, ref, o_d)
    assert launches["ws16"].descriptors


@pytest.mark.gpu
@needs_sm90
def test_gpu_the_environment_knob_keeps_the_triton_forward(monkeypatch):
    from kernels.flash_attn import flash_attn_func, interface

    monkeypatch.setenv(configs.FWD_GLUON_WS_ENV, "0")
    interface._SIGNATURES.clear()
    q = torch.randn(1, 2048, 4, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2048, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flash_attn_func(q, k, v)  # GQA: the persistent kernel's route
    flash_attn_func(q, q, q, causal=True)  # MHA causal: the persistent kernel's too (kv heads outer, snaking)
    names = _launched(interface)
    assert names and not set(names) & set(WS_KERNELS), names
    interface._SIGNATURES.clear()


def test_the_persistent_kernel_compiles_with_the_same_partitions(compiled):
    """The persistent variant (one program an SM over the tiles, rank-4 descriptors made once a program; routed
    for GQA / MQA and MHA non-causal at hd 128) in every tile order at hd 128's routed tile: the same register
    split, ping-pong waits and 16-bit wgmmas, shared memory within 227 KiB, and at most two spilled registers (its
    consumers carry the tile loop's counters: 4 bytes non-causal, 8 causal in the kv-head orders)."""
    for spec in (f"ws16{p}:128,128,3,{c}" for p in ("p", "pk", "ps") for c in (0, 1)):
        r = compiled[spec]
        assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 240, spec
        assert r["spill"] <= 8 and not r["serialized"] and r["wgmma"] > 0, spec
        assert r["wait_one_pending"] >= 2, spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (4, 1000, 1000, 16, 4, False), (2, 777, 1500, 16, 16, True), (2, 1500, 777, 16, 1, True), (1, 64, 64, 2, 2, False)],
    ids=["GQA-many-tiles", "causal-Sq<Sk", "causal-MQA-Sq>Sk", "one-tile"])
@pytest.mark.parametrize("order", fp8_gluon.TILE_ORDERS)
def test_gpu_persistent_kernel_matches_oracle(b, sq, sk, hq, hk, causal, order):
    """The persistent kernel in each tile order: out and lse against the FP64 oracle within the one-program-a-tile
    kernel's error (plus bf16 rounding), rows that see no key 0 / -inf, over grids with more tiles than
    multiprocessors (each program loops) and with one tile."""
    from harness.oracle.softmax import softmax_attention

    g = torch.Generator(device="cpu").manual_seed(7)
    q = torch.randn(b, sq, hq, 128, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(b, sk, hk, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=128 ** -0.5)
    kw = dict(softmax_scale=128 ** -0.5, causal=causal, block_n=128, num_stages=3, poison=True)
    o_p, l_p = fp8_gluon.fwd_gluon_ws(q, k, v, persistent=True, tile_order=order, **kw)
    o_r, _ = fp8_gluon.fwd_gluon_ws(q, k, v, **kw)
    torch.cuda.synchronize()
    _assert_like_oracle(o_p, l_p, ref, o_r)


def test_the_mla_training_form_compiles_in_two_head_dim_parts(compiled):
    """q / k 192 = 128 + 64 with v 128 (DeepSeek's training-form MLA, routed since session 31), one program a tile
    and persistent (MHA routed to the snaking order since session 32): the scores as two chained 16-bit wgmmas (more
    wgmmas than hd 128's kernel at the same tile), no spill at 64-key tiles over four stages, the ping-pong waits,
    shared memory within 227 KiB."""
    for spec in (f"ws16{p}:192/128,64,4,{c}" for p in ("", "pk", "ps") for c in (0, 1)):
        r = compiled[spec]
        assert 24 in r["setmaxnreg"] and max(r["setmaxnreg"]) >= 240, spec
        assert r["spill"] == 0 and not r["serialized"] and r["wgmma"] > 0, spec
        assert r["wait_one_pending"] >= 2 and r["smem"] <= configs.H100_SMEM_BYTES, spec


def test_the_routed_cells_compile(compiled):
    """Every config FWD_GLUON_WS_CELLS routes (hd 64: three consumers without the in-block overlap, the persistent
    kernel), causal or not: a loader warp at 24 registers, no spill, 16-bit wgmmas not serialised, within 227 KiB."""
    assert CELLS
    for spec in CELLS:
        r = compiled[spec]
        assert 24 in r["setmaxnreg"] and r["spill"] == 0 and not r["serialized"] and r["wgmma"] > 0, spec
        assert r["smem"] <= configs.H100_SMEM_BYTES, spec


def test_hd64_is_routed_cell_by_cell(monkeypatch):
    """hd 64: MHA non-causal from 4k over 4 stages, causal from 8k over 3, on three consumers without the in-block
    overlap, their descriptors made on the host (configs.FWD_GLUON_HOST_DESC); shorter (2k: 0.96x at H16 / H32 in
    session 51), GQA / MQA, windows, softcap, varlen and the knob stay on the Triton forward."""
    monkeypatch.delenv(configs.FWD_GLUON_WS_ENV, raising=False)
    cells = configs.FWD_GLUON_WS_CELLS[64, 64]
    ring = dict(block_n=128, persistent=False, tile_order="query", consumers=3, overlap=False, host_desc=True)
    causal = dict(causal=True, window_right=0)
    mha = lambda n, **kw: _route(*_qkv(d=64, hk=4, sq=n, sk=n), **kw)  # noqa: E731
    gqa = lambda n, hk=2, **kw: _route(*_qkv(d=64, hk=hk, sq=n, sk=n), **kw)  # noqa: E731
    least = cells[False, False][0]
    assert least == 4096 and mha(least) == dict(ring, num_stages=4) == mha(4 * least)
    assert mha(least - 1) is None and mha(2048) is None
    least = cells[False, True][0]
    assert least == 8192 and mha(least, **causal) == dict(ring, num_stages=3) and mha(least - 1, **causal) is None
    for hk in (1, 2):  # GQA / MQA: not listed
        assert gqa(8192, hk=hk) is None and gqa(8192, hk=hk, **causal) is None and gqa(2048, hk=hk, **causal) is None
        assert gqa(2048, hk=hk) is None
    assert mha(4096, window_left=100) is None and mha(4096, softcap=30.0) is None and mha(4096, varlen=True) is None
    monkeypatch.setenv(configs.FWD_GLUON_WS_ENV, "0")
    assert mha(4096) is None


def test_three_consumer_warpgroups_compile_at_hd64(compiled):
    """The 16-bit kernel with three consumer warpgroups (192-row tiles, turns in a ring; session 33) at hd 64: a
    loader warp at 24 registers, the consumers at fp8_gluon.WS16_CONSUMER_REGS[3] or more, 16-bit wgmmas not
    serialised, no spill, the in-block overlap's wait where it is on (none where off), shared memory within
    227 KiB."""
    for bn, st, ov in THREE_CONSUMERS:
        for c in (0, 1):
            r = compiled[f"ws16w3{'' if ov else 'n'}:64,{bn},{st},{c}"]
            assert 24 in r["setmaxnreg"] and fp8_gluon.WS16_CONSUMER_REGS[3] in r["setmaxnreg"], (bn, st, c)
            assert r["spill"] == 0 and not r["serialized"] and r["wgmma"] > 0, (bn, st, c)
            assert (r["wait_one_pending"] >= 3) == ov and r["smem"] <= configs.H100_SMEM_BYTES, (bn, st, c)


def test_the_three_consumer_kernel_refuses_what_it_does_not_run():
    """consumers 2 or 3, and the persistent kernel only with 2 and its in-block overlap: anything else is named
    before a launch."""
    q, k, v = _qkv(d=64)
    for bad in (dict(consumers=4), dict(consumers=1), dict(consumers=3, persistent=True)):
        with pytest.raises(ValueError, match="consumers"):
            fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=0.125, causal=False, **bad)
    with pytest.raises(ValueError, match="overlap"):
        fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=0.125, causal=False, persistent=True, overlap=False)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("bn, stages, overlap", THREE_CONSUMERS)
@pytest.mark.parametrize("b, sq, sk, hq, hk, causal", [
    (2, 1000, 1000, 8, 2, False), (1, 777, 1500, 4, 4, True), (1, 1500, 777, 4, 1, True), (1, 64, 64, 2, 2, False),
    (1, 200, 200, 2, 2, True)], ids=["GQA4-S1000", "causal-Sq<Sk", "causal-MQA-Sq>Sk", "one-short-tile", "S200"])
def test_gpu_three_consumers_match_oracle(b, sq, sk, hq, hk, causal, bn, stages, overlap):
    """Three consumer warpgroups, 192-row tiles (hd 64): out and lse against the FP64 oracle within the two-consumer
    kernel's error (plus bf16 rounding), rows that see no key 0 / -inf, NaN-poisoned first; partial 192-row tiles
    (1000, 1500, 64, 200 rows) and the ring's turns over 1 to 24 key blocks; with and without the in-block
    overlap."""
    from harness.oracle.softmax import softmax_attention

    g = torch.Generator(device="cpu").manual_seed(13)
    q = torch.randn(b, sq, hq, 64, generator=g).to("cuda", torch.bfloat16)
    k, v = (torch.randn(b, sk, hk, 64, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=0.125)
    kw = dict(softmax_scale=0.125, causal=causal, block_n=bn, num_stages=stages, poison=True)
    o_3, l_3 = fp8_gluon.fwd_gluon_ws(q, k, v, consumers=3, overlap=overlap, **kw)
    o_2, _ = fp8_gluon.fwd_gluon_ws(q, k, v, **kw)
    torch.cuda.synchronize()
    _assert_like_oracle(o_3, l_3, ref, o_2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk", [(1000, 1000), (300, 700), (700, 300)], ids=["S1000", "Sq<Sk", "Sq>Sk"])
@pytest.mark.parametrize("order", [None, *fp8_gluon.TILE_ORDERS])
def test_gpu_mla_training_form_matches_oracle(sq, sk, causal, order, monkeypatch):
    """The 16-bit kernel at q / k 192 (two parts), v 128, one program a tile or persistent in each tile order
    (session 32 routes MHA to the snaking one): out and lse within the Triton forward's error of the FP64 oracle
    (plus bf16 rounding; the Triton forward held off the route by the knob), rows that see no key 0 / -inf."""
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.fwd import flash_attn_fwd

    monkeypatch.setenv(configs.FWD_GLUON_WS_ENV, "0")

    g = torch.Generator(device="cpu").manual_seed(11)
    q = torch.randn(2, sq, 8, 192, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(2, sk, 8, 192, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(2, sk, 8, 128, generator=g).to("cuda", torch.bfloat16)
    scale = 192 ** -0.5
    ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=scale)
    o_g, l_g = fp8_gluon.fwd_gluon_ws(q, k, v, softmax_scale=scale, causal=causal, block_n=64, num_stages=4,
                                      poison=True, persistent=order is not None, tile_order=order or "query")
    o_t, _ = flash_attn_fwd(q, k, v, softmax_scale=scale, causal=causal, window_left=-1,
                            window_right=0 if causal else -1)
    torch.cuda.synchronize()
    assert o_g.shape == (2, sq, 8, 128)
    _assert_like_oracle(o_g, l_g, ref, o_t)



# ---- the probe's and the balance model's CPU parts (benchmarks/gluon_ws_probe.py, persistent_balance.py) ----

def _benchmark(name):
    import importlib

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_the_probe_reads_each_persistent_prefix_as_a_tile_order():
    probe = _benchmark("gluon_ws_probe")
    assert probe._spec("128,3") == dict(block_n=128, num_stages=3, persistent=False)
    assert probe._spec("w3:64,4") == dict(block_n=64, num_stages=4, consumers=3)
    assert probe._spec("w3n:128,2") == dict(block_n=128, num_stages=2, consumers=3, overlap=False)
    assert probe._spec("n:128,3,232") == dict(block_n=128, num_stages=3, consumer_regs=232, overlap=False)
    for prefix, order in probe.PERSISTENT.items():
        assert probe._spec(prefix + "64,4,232") == dict(block_n=64, num_stages=4, consumer_regs=232, persistent=True,
                                                        tile_order=order)
    assert set(probe.PERSISTENT.values()) == set(fp8_gluon.TILE_ORDERS)
    for bad in ("q:128,3", "128", "p:128,3,1,1"):
        with pytest.raises(SystemExit):
            probe._spec(bad)


def test_the_probe_times_a_launch_with_the_descriptors_its_route_gives_it(monkeypatch):
    """A config that is not persistent takes host-made descriptors where the route gives them (configs.
    FWD_GLUON_HOST_DESC, q / k = v head dims), so the probe times the launch a user's call runs; the persistent
    kernel and MLA's 192 / 128 make their own; --device-desc (or the switch off) times the device-made form."""
    probe = _benchmark("gluon_ws_probe")
    monkeypatch.setattr(configs, "FWD_GLUON_HOST_DESC", True)
    assert probe._keywords("32,4", "256") == dict(block_n=32, num_stages=4, persistent=False, host_desc=True)
    assert probe._keywords("w3n:128,3", "64")["host_desc"] is True
    assert "host_desc" not in probe._keywords("ps:32,4", "256")
    assert "host_desc" not in probe._keywords("64,4", "192/128")
    assert "host_desc" not in probe._keywords("32,4", "256", device_desc=True)
    monkeypatch.setattr(configs, "FWD_GLUON_HOST_DESC", False)
    assert "host_desc" not in probe._keywords("32,4", "256")


def test_the_probe_times_the_cells_asked_for_and_sums_up_each_one(capsys):
    probe = _benchmark("gluon_ws_probe")
    cells = list(probe._cells(["128", "192/128"], [512, 4096], [False, True], models=True, layers=True))
    labels = {(c[0], c[5], c[6]) for c in cells}
    assert ("sweep S512", "128", False) in labels and ("sweep S4096", "128", True) in labels
    assert ("sweep S512", "192/128", True) in labels and ("sweep S4096", "192/128", True) not in labels  # short only
    assert sum(c[0].startswith("MLA layer") for c in cells) == 2 * len(probe.MLA_LAYERS)
    hd128_layers = [row for row in probe.LAYERS if row[-1] == 128]  # the layers of the head dims asked for only
    assert sum(c[0].startswith(("GQA layer", "MQA layer")) for c in cells) == 2 * len(hd128_layers) > 0
    hd64 = list(probe._cells(["64"], [4096], [False], models=True, layers=True))
    assert {c[0] for c in hd64} >= {"GQA layer B2 S2048", "MQA layer B2 S2048", "Falcon-7B MQA 71/1 B2 S2048"}
    assert all(c[6] for c in cells if c[0].startswith(("Llama", "MQA 32/1")))  # models: causal calls
    shaped = list(probe._cells(["128"], [], [False, True], models=False, shapes=[(4, 2048, 32, 8)]))
    assert shaped == [("B4 S2048", 4, 2048, 32, 8, "128", False), ("B4 S2048", 4, 2048, 32, 8, "128", True)]
    gemma = [c for c in probe._cells(["256"], [4096], [False], models=True) if c[0].startswith("Gemma")]
    assert gemma == [("Gemma-2-9B B2 S4096", 2, 4096, 16, 8, "256", True)]  # (with --softcap 50: its real call)
    with pytest.raises(SystemExit) as stop:  # (refused before it looks for a GPU)
        probe.main(["--head-dims", "256", "--softcap", "-1"])
    assert stop.value.code == 2 and "softcap" in capsys.readouterr().err
    with mock.patch.object(torch.cuda, "is_available", return_value=False):  # (the persistent kernel takes a cap)
        assert probe.main(["--head-dims", "256", "--softcap", "50", "--ws", "64,2", "pk:64,2"]) == 2
    assert "needs an sm90 GPU" in capsys.readouterr().err
    best = {("128", "no", "sweep S512 H16/16"): {("triton", "pinned"): 0.3, ("cuDNN", "sdpa"): 0.15,
                                                  ("gluon-ws", "128,3"): 0.25, ("gluon-ws", "pk:128,3"): 0.2}}
    probe.summary(best, {"128": ["128,3", "pk:128,3"]})
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| summary | 128")]
    assert rows == ["| summary | 128 | no | sweep S512 H16/16 | 128,3 | 0.2500 | 1.200 | 0.600 | - | 1.000 |",
                    "| summary | 128 | no | sweep S512 H16/16 | pk:128,3 | 0.2000 | 1.500 | 0.750 | - | 1.250 |"]


def test_the_balance_model_sees_every_tile_once_and_the_snake_evens_the_causal_load(capsys):
    """fp8_gluon.persistent_balance (and benchmarks/persistent_balance.py, which prints it): every (batch, head)'s
    query blocks once in each order; session 31's measured loss of the kv order at MHA causal 16k; the snake's own
    loss at Llama-3-8B's B4 2k (its period of 128 tiles against 132 programs); keys past the queries (Sk > Sq) add
    the same blocks to every tile."""
    for order in fp8_gluon.TILE_ORDERS:
        blocks = fp8_gluon.tile_query_blocks(order, 2, 8, 2, 5)
        assert sorted(blocks) == sorted(list(range(5)) * 16), order  # each (batch, head)'s 5 query blocks once
        assert blocks[0] == 4  # (causal: the heaviest first)
    kv, snake, query = (fp8_gluon.persistent_balance(o, 1, 16, 16, 16384, 16384, 132) for o in ("kv", "kv-snake",
                                                                                                 "query"))
    assert kv < 0.7 < 0.9 < min(snake, query)
    snake, query = (fp8_gluon.persistent_balance(o, 4, 32, 8, 2048, 2048, 132) for o in ("kv-snake", "query"))
    assert snake < 0.75 < 0.95 < query
    assert fp8_gluon.persistent_balance("query", 1, 8, 8, 128, 128, 132) == 1.0  # (8 tiles, 8 programs)
    longer = fp8_gluon.persistent_balance("kv-snake", 4, 32, 8, 2048, 4096, 132)  # (16 more blocks a tile)
    assert snake < longer < 1.0
    model = _benchmark("persistent_balance")
    assert model.main([]) == 0
    out = capsys.readouterr().out
    assert "| Llama-3-8B B4 S2k causal | 0.97 | 0.97 | 0.73 |" in out, out


def test_a_causal_persistent_launch_takes_the_best_balanced_order_when_switched_on(monkeypatch):
    """configs.FWD_PERSISTENT_BALANCE_MARGIN (session 55; 0.05 since session 56 measured it: Llama-3-8B B4 2k causal
    1.21x, B2 H32/16 4k 1.17x, 8k unchanged): off, a causal persistent launch keeps its routed order
    (GQA: kv heads outer, snaking); set, the balance model's pick where it reads more than the margin better
    (Llama-3-8B B4 2k: the query order), the routed one elsewhere (8k; non-causal calls are not asked)."""
    def order(b, s, causal=True):
        q = torch.empty(b, s, 32, 128, dtype=torch.bfloat16)
        k = torch.empty(b, s, 8, 128, dtype=torch.bfloat16)
        route = _route(q, k, k, causal=causal, window_right=0 if causal else -1)
        return route["tile_order"] if route["persistent"] else None

    routed = configs.FWD_GLUON_WS_PERSISTENT[128, 128]
    assert configs.FWD_PERSISTENT_BALANCE_MARGIN == 0.05  # (the routed default)
    monkeypatch.setattr(configs, "FWD_PERSISTENT_BALANCE_MARGIN", None)
    assert order(4, 2048) == routed[True, True] == "kv-snake" and order(1, 8192) == "kv-snake"
    monkeypatch.setattr(configs, "FWD_PERSISTENT_BALANCE_MARGIN", 0.05)
    assert order(4, 2048) == "query" and order(2, 2048) == "query"
    assert order(1, 8192) == "kv-snake" and order(4, 2048, causal=False) == routed[True, False]
    assert configs.balanced_order("kv-snake", 8192, 1, 32, 8, 8192, 132) == "kv-snake"
    monkeypatch.setattr(configs, "FWD_PERSISTENT_BALANCE_MARGIN", 0.5)  # (a margin no order clears)
    assert order(4, 2048) == "kv-snake"
