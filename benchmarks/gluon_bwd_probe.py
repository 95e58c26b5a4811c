"""The warp-specialised Gluon backward kernels (kernels/flash_attn/bwd_gluon.py: dQ with delta, and dK / dV) against
the Triton backward's (bwd.py ``_bwd_dq_kernel`` and ``_bwd_dkdv_kernel``, each launch replayed alone) and whole
backwards, H100.

    python benchmarks/gluon_bwd_probe.py [--head-dims 64,128,192/128] [--seqlens 1024,4096,16384] [--masks no,yes]
        [--dkdv 64,2 32,3] [--dq 64,3 128,2] [--fused 64,2 128,2,h0 64,2,m1 64,2,m1,w1 64,3,u1,a1] [--ordered] [--adder]
        [--whole] [--timeline] [--models] [--shapes B,S,HQ,HK ...] [--repeat 2] [--autotune] [--check-only]
    python benchmarks/gluon_bwd_probe.py --from-log LOG [LOG ...]

1. Correctness first, on fresh random inputs (odd lengths, GQA / MQA, Sq != Sk causal, rows that see no key): dQ,
   dK and dV of every config against the FP64 oracle beside the Triton backward's error on the same inputs (outputs
   poisoned first); above 2x the Triton error plus a bf16 floor reads FAIL and the script exits 1 before timing.
2. Kernel time (CUDA events through the harness's timer: warm-up, L2 flushed, median), every kernel of a cell in
   one process, interleaved ``--repeat`` times: the FA sweep's shapes (16k tokens, hidden 2048) and with
   ``--models`` Llama-3-8B (GQA 32/8, 8k), Llama-3-70B (64/8, 4k) and, with 192/128 in ``--head-dims``,
   DeepSeek-V3's MLA (H128, 4k), causal. The Triton backward in its split mode (FLASH_ATTN_BWD=split: dK / dV
   without dQ's atomics, as the Gluon kernel) at its pinned first picks
   (FLASH_ATTN_AUTOTUNE=0; ``--autotune``: the configs its autotuner picks, as a user's call gets them) and without a
   group split, each of its two launches replayed alone with the same tensors; the Gluon kernels at each ``--dq`` /
   ``--dkdv`` config; the fused backward's kernel (dK / dV with dQ added by TMA reduce, its zeroed fp32 dQ buffer
   included) at each ``--fused`` config (hd 64 / 128), against the whole Triton backward; the whole backward four
   ways: Triton's, both Gluon kernels (FLASH_ATTN_BWD=gluon: configs.BWD_GLUON_TRY's configs), fused
   (FLASH_ATTN_BWD=fused: delta, the fused kernel, dQ's cast; a cell configs.BWD_GLUON_FUSED routes at its routed
   config, at any length) and as routed by default ("routed":
   configs.BWD_GLUON by length). ``--ordered``: the fused kernel's ordered (deterministic) variant too at each
   ``--fused`` config ("gluon ordered", its key blocks launched last first as by default; checked twice, both
   launch orders: its dK, dV and dQ must be bitwise the same). ``--adder``: the unordered fused kernel with its adds
   in an adder warp ("gluon fused adder": the ordered kernel's structure without its turns; checked against the
   oracle as the others). ``--whole``: the whole fused backward at each ``--fused`` config too ("fused whole": delta's
   preprocess, the kernel at that config, dQ's cast, as the route would run it there; its dQ, dK and dV checked
   against the oracle first): a kernel's gain alone has reached the whole backward at a fraction (sessions 39-43).
   Rows
   ``| hd | causal | shape | kernel | config | ms | / its Triton twin |``, then each cell's fastest repeat
   (``| summary | ... |``), then the decisions' table (``| speed-up | ... |``): per cell, each config of a kernel
   against that kernel's first config, and the fused route's whole backward against the default route's, repeat
   by repeat (a route's bar, e.g. "3% faster in every repeat", reads off it).
3. ``--timeline`` (after the timing; ``--repeat 0``: instead of it): each ``--dkdv`` / ``--fused`` config's kernel
   launched once more with its programs' timeline stamps (bwd_gluon.timeline_buffer: SM cycle counter at each
   consumer's start, K / V landed, loop end and end; its SM): ``| timeline |`` rows of where the SMs' time went
   (:func:`timeline_summary`: the loop, each program's prologue and epilogue, gaps between programs on an SM split
   into the CTA's turnover and its set-up by each program's entry stamp, idle head and tail; a ``,p1`` config's
   records are its tiles).
4. hd 256 (``--head-dims 256``: Gemma-2's, uncapped here; with ``--models`` Gemma-2-9B's B2 H16/8 4k causal): the
   dK / dV kernel is bwd_gluon_hd256's (the head dim split between its consumers: ``--dkdv 64,2``, its one config
   shape) and the dQ kernel's 32-key tiles (``--dq 32,3``; 64-key tiles over 3 stages do not fit); no timeline.
5. ``--from-log LOG [LOG ...]`` (any machine): the speed-up table of earlier runs' logs (their per-repeat rows),
   a cell's repeats of every log pooled, each compared only with what its own run timed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import parse_shape  # noqa: E402

#: (name, batch, seqlen, query heads, kv heads, q / k head dim, v head dim): real models' causal training calls
MODELS = (("Llama-3-8B", 1, 8192, 32, 8, 128, 128), ("Llama-3-70B", 1, 4096, 64, 8, 128, 128),
          ("DeepSeek-V3 MLA", 1, 4096, 128, 128, 192, 128), ("Gemma-2-9B uncapped", 2, 4096, 16, 8, 256, 256))
DEFAULT_DKDV = ("64,2", "32,3")
DEFAULT_DQ = ("64,3", "128,2")
DEFAULT_FUSED = ("64,2", )


#: a dK / dV config's options after BLOCK,STAGES -> dkdv_gluon's keywords
DKDV_OPTIONS = {"h0": dict(halves=False), "h1": dict(halves=True), "m1": dict(mask_every_tile=True),
                "w1": dict(walk=1), "u1": dict(dq_unscaled=True), "a1": dict(adder=True),
                "d1": dict(ds_smem=True), "t0": dict(turns=False), "o1": dict(ordered=True),
                "p1": dict(persistent=True), "p2": dict(persistent="heavy")}


def _config(spec: str, first: str) -> dict:
    """BLOCK,STAGES -> dkdv_gluon's (``first`` "block_m") or dq_gluon's ("block_n") keywords (a dQ config may go on
    with ,p1: one program an SM over the tiles, its ``persistent``, or ,p2: the same in the heavy-first tile order,
    its ``persistent="heavy"``); a dK / dV config may
    go on with ,h1 / ,h0 (128-row tiles' S^T and dP^T in two 64-query halves or not: dkdv_gluon's ``halves``) and
    ,m1 (the causal mask on every tile: its ``mask_every_tile``), ,w1 (a program's (head, tile) steps in one flat
    loop, as the route walks GQA / MQA at hd 128: its ``walk=1``; default the nested loops), ,u1 (fused: dQ's
    partials without the softmax scale, its ``dq_unscaled``; the check scales the returned dQ) and ,a1 (fused: dQ's
    adds in an adder warp, its ``adder``: --adder's variant for this config alone, as the route runs hd 128
    non-causal), ,d1 (fused: dK's dS^T read from shared memory, its ``ds_smem``), ,t0 (either kernel: its
    consumers issue without taking turns, its ``turns=False``) and ,o1 (fused: its adds in a fixed order, the
    deterministic kernel: its ``ordered``; with --whole the ordered route, configs.BWD_GLUON_FUSED_ORDERED's) and
    ,p1 (either kernel, not with ,o1: one program an SM over the tiles, its ``persistent``; with --whole the fused
    route's launch persistent) or ,p2 (the same, tiles heaviest first: ``persistent="heavy"``)."""
    parts, options = spec.split(",")[:2], spec.split(",")[2:]
    allowed = DKDV_OPTIONS if first == "block_m" else {p: DKDV_OPTIONS[p] for p in ("p1", "p2")}
    if len(parts) != 2 or not all(x.isdigit() for x in parts) or any(o not in allowed for o in options):
        want = "[,h0|h1][,m1][,w1][,u1][,a1][,d1][,t0][,o1][,p1|p2]" if first == "block_m" else "[,p1|p2]"
        raise SystemExit(f"config {spec}: want BLOCK,STAGES{want}")
    out = dict(zip((first, "num_stages"), map(int, parts)))
    for o in options:
        out.update(DKDV_OPTIONS[o])
    return out


def _dkdv(d: int, spec: str):
    """The dK / dV kernel a ``--dkdv`` config runs at q / k head dim ``d``, its config's keywords bound:
    bwd_gluon.dkdv_gluon, or at hd 256 bwd_gluon_hd256.dkdv256_gluon (64 keys a program over 64-row tiles, the head
    dim split between its consumers: BLOCK_M 64, no options, its STAGES)."""
    kw = _config(spec, "block_m")
    if d != 256:
        from kernels.flash_attn.bwd_gluon import dkdv_gluon

        return functools.partial(dkdv_gluon, **kw)
    from kernels.flash_attn.bwd_gluon_hd256 import BLOCK_M, dkdv256_gluon

    if kw.pop("block_m") != BLOCK_M or set(kw) != {"num_stages"}:
        raise SystemExit(f"--dkdv {spec}: hd 256's dK / dV kernel runs {BLOCK_M}-row tiles without options "
                         f"({BLOCK_M},STAGES)")
    return functools.partial(dkdv256_gluon, **kw)


def _inputs(b, sq, sk, hq, hk, d, seed, dtype=torch.bfloat16, dv=None):
    """q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] and dO [B, Sq, Hq, Dv] (Dv: ``dv`` or D), fresh normal
    values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dv = dv or d
    q = torch.randn(b, sq, hq, d, generator=g).to("cuda", dtype)
    do = torch.randn(b, sq, hq, dv, generator=g).to("cuda", dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to("cuda", dtype)
    v = torch.randn(b, sk, hk, dv, generator=g).to("cuda", dtype)
    return q, k, v, do


def _dims(spec: str) -> tuple[int, int]:
    """A ``--head-dims`` entry, D or D/DV (MLA's 192/128), as (q / k head dim, v head dim)."""
    d, _, dv = spec.partition("/")
    return int(d), int(dv or d)


def _hd(d: int, dv: int) -> str:
    return str(d) if d == dv else f"{d}/{dv}"


def _mask(causal):
    return dict(causal=causal, window_left=-1, window_right=0 if causal else -1)


def _forward(q, k, v, do, causal):
    """The in-repo forward's out and lse, and delta = rowsum(dO * O) ([B, Hq, Sq] fp32, as the backward makes it)."""
    from kernels.flash_attn.fwd import flash_attn_fwd

    out, lse = flash_attn_fwd(q, k, v, softmax_scale=q.shape[-1] ** -0.5, **_mask(causal))
    delta = (do.float() * out.float()).sum(-1).transpose(1, 2).contiguous()
    return out, lse, delta


def _whole(q, k, v, do, out, lse, causal, mode):
    """The whole backward as a callable, its launches left by a first call under FLASH_ATTN_BWD=``mode`` (read by
    a signature's first call only: the replays keep them), and its replay cache."""
    from kernels.flash_attn import bwd

    cache, before = {}, os.environ.get("FLASH_ATTN_BWD")
    whole = functools.partial(bwd.flash_attn_bwd, do, q, k, v, out, lse, softmax_scale=q.shape[-1] ** -0.5,
                              split=1, launches=cache, **_mask(causal))
    os.environ["FLASH_ATTN_BWD"] = mode
    try:
        whole()
    finally:
        os.environ["FLASH_ATTN_BWD"] = before or ""
    return whole, cache


#: a --fused config's dkdv_gluon keywords -> the fused route's (configs.gluon_fused_bwd's answer); the rest pass as
#: named
ROUTE_KEYS = {"adder": "dq_adder"}


@contextlib.contextmanager
def fused_route(spec: str):
    """configs.gluon_fused_bwd answering with this --fused config's keywords (dkdv_gluon's defaults where the config
    names none, as its kernel-alone row runs) wherever it would answer at all: the whole fused backward (delta's
    preprocess with dQ's buffer zeroed, the kernel, dQ's cast) at that config, for a first call that leaves its
    launches (a replay keeps them after the context ends)."""
    from kernels.flash_attn import configs

    kw = _config(spec, "block_m")
    route = dict(block_m=kw.pop("block_m"), num_stages=kw.pop("num_stages"), dq_adder=False, walk=0,
                 mask_every_tile=False, dq_unscaled=False, ds_smem=False, turns=True)
    route.update({ROUTE_KEYS.get(name, name): value for name, value in kw.items()})
    original = configs.gluon_fused_bwd

    def answer(*args, **kwargs):
        return None if original(*args, **kwargs) is None else dict(route)

    configs.gluon_fused_bwd = answer
    try:
        yield route
    finally:
        configs.gluon_fused_bwd = original


def _whole_at(q, k, v, do, out, lse, causal, spec):
    """:func:`_whole` under ``FLASH_ATTN_BWD=fused`` at this --fused config (:func:`fused_route`): the callable."""
    with fused_route(spec):
        whole, cache = _whole(q, k, v, do, out, lse, causal, "fused")
    if "plan" not in cache:  # (a later call would ask the route again, outside the config's context)
        raise SystemExit(f"--whole: the backward at {spec} left no replayable launches")
    return whole


def _triton_parts(q, k, v, do, out, lse, delta, causal) -> dict:
    """The Triton backward's dQ and dK / dV launches (split mode, no group split), each replayable alone with this
    call's tensors: name -> callable."""
    from kernels.flash_attn import bwd

    _, cache = _whole(q, k, v, do, out, lse, causal, "split")
    tensors = {"Q": q, "K": k, "V": v, "DO": do, "Out": out, "Lse": lse, "Delta": delta, "DQ": torch.empty_like(q),
               "DK": torch.empty_like(k), "DV": torch.empty_like(v), "DQacc": bwd._unused_buffer(q.device),
               "CuSeqQ": None, "CuSeqK": None}
    names = {"_bwd_dq_kernel": "dq", "_bwd_dkdv_kernel": "dkdv"}
    return {names[x.compiled.name]: functools.partial(x, tensors) for x in cache["plan"][3] if x.compiled.name in names}


def check(dims, dkdv_specs, dq_specs, fused_specs=(), ordered=False, adder=False, whole=False) -> bool:
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.bwd import flash_attn_bwd
    from kernels.flash_attn.bwd_gluon import FUSED_HEAD_DIMS, dkdv_gluon, dq_gluon

    ok = True
    print("| check | hd | causal | B Sq Sk Hq/Hk | kernel | config | max err | triton's | |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    cases = [(2, 1000, 1000, 4, 2), (1, 300, 1000, 4, 4), (1, 1000, 300, 2, 1), (1, 64, 64, 2, 2)]
    for d, dv in dims:
        for causal in (False, True):
            for b, sq, sk, hq, hk in cases:
                q, k, v, do = _inputs(b, sq, sk, hq, hk, d, seed=sq + sk + d, dv=dv)
                out, lse, delta = _forward(q, k, v, do, causal)
                ref = softmax_attention(q.double(), k.double(), v.double(), do.double(), causal=causal,
                                        softmax_scale=d ** -0.5)
                triton_ = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=d ** -0.5, **_mask(causal))
                runs = [("dkdv", spec, _dkdv(d, spec)(q, k, v, do, lse, delta, softmax_scale=d ** -0.5, causal=causal,
                                                      poison=True)) for spec in dkdv_specs]
                runs += [("dq", spec, dq_gluon(q, k, v, do, out, lse, softmax_scale=d ** -0.5, causal=causal,
                                               poison=True, **_config(spec, "block_n"))[:1]) for spec in dq_specs]
                runs += [(name, spec, dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=d ** -0.5, causal=causal,
                                                 poison=True, fused=True,
                                                 **dict(dict(adder=name == "fused adder"), **_config(spec, "block_m"))))
                         for spec in fused_specs if d == dv and d in FUSED_HEAD_DIMS
                         for name in ("fused", "fused adder")[:1 + adder]]
                for spec in fused_specs if whole and d == dv and d in FUSED_HEAD_DIMS else ():
                    with fused_route(spec):  # (dQ, dK, dV of the whole backward: the softmax scale applied)
                        os.environ["FLASH_ATTN_BWD"] = "fused"
                        try:
                            dq_, dk_, dv_ = flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=d ** -0.5,
                                                           split=1, **_mask(causal))
                        finally:
                            os.environ["FLASH_ATTN_BWD"] = "split"
                    runs.append(("fused whole", spec, (dk_, dv_, dq_)))
                for spec, last in itertools.product(
                        fused_specs if ordered and d == dv and d in FUSED_HEAD_DIMS else (), (False, True)):
                    two = [dkdv_gluon(q, k, v, do, lse, delta, softmax_scale=d ** -0.5, causal=causal, poison=True,
                                      fused=True, ordered=True, last_first=last, **_config(spec, "block_m"))
                           for _ in range(2)]
                    same = all(torch.equal(x, y) for x, y in zip(*two))
                    ok &= same
                    name = "ordered" if last else "ordered first-first"
                    print(f"| check | {_hd(d, dv)} | {causal} | {b} {sq} {sk} {hq}/{hk} | {name} | {spec} | "
                          f"twice | bitwise | {'ok' if same else 'FAIL'} |", flush=True)
                    runs.append((name, spec, two[0]))
                for kernel, spec, got in runs:
                    if kernel != "fused whole" and "u1" in spec.split(","):  # (dQ without the softmax scale: the
                        # caller's to apply; the whole backward's cast applies it)
                        got = (*got[:2], got[2] * d ** -0.5)
                    wants = {"dkdv": (ref.dk, ref.dv), "dq": (ref.dq, )}.get(kernel, (ref.dk, ref.dv, ref.dq))
                    twins = {"dkdv": triton_[1:], "dq": triton_[:1]}.get(kernel, triton_[1:] + triton_[:1])
                    for x, t, r in zip(got, twins, wants):
                        e, e_t = ((y.double() - r).abs().max().item() for y in (x, t))
                        good = e == e and e <= 2 * e_t + 2e-3 * r.abs().max().item()
                        ok &= good
                        print(f"| check | {_hd(d, dv)} | {causal} | {b} {sq} {sk} {hq}/{hk} | {kernel} | {spec} | {e:.4g} | "
                              f"{e_t:.4g} | {'ok' if good else 'FAIL'} |", flush=True)
    return ok


def _cells(dims, seqlens, masks, models, shapes=()):
    """(label, batch, seqlen, query heads, kv heads, q / k head dim, v head dim, causal) per cell: the FA sweep's
    (16k tokens, hidden 2048 over v's head dim), each of ``shapes`` ((batch, seqlen, query heads, kv heads): a
    user's call, e.g. the attention-layers preset's) at every head dim and mask asked, then with ``models`` the
    MODELS rows whose head dims are asked."""
    for d, dv in dims:
        for s in seqlens:
            for causal in masks:
                yield f"sweep S{s}", max(1, 16384 // s), s, 2048 // dv, 2048 // dv, d, dv, causal
        for b, s, hq, hk in shapes:
            for causal in masks:
                yield f"B{b} S{s}", b, s, hq, hk, d, dv, causal
    if models:
        for name, b, s, hq, hk, d, dv in MODELS:
            if (d, dv) in dims:
                yield f"{name} B{b} S{s}", b, s, hq, hk, d, dv, True


def timing(dims, dkdv_specs, dq_specs, seqlens, masks, repeat, models, fused_specs=(), ordered=False, adder=False,
           shapes=(), whole=False):
    from harness.perf.timing import time_callable
    from kernels.flash_attn.bwd_gluon import FUSED_HEAD_DIMS, dkdv_gluon, dq_gluon

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    print("| hd | causal | shape | kernel | config | ms | / its Triton twin |")
    print("|---|---|---|---|---|---|---|", flush=True)
    best, runs = {}, {}  # each cell's fastest repeat (with its Triton twin) and every repeat's ms
    for label, b, s, hq, hk, d, dv, causal in _cells(dims, seqlens, masks, models, shapes):
        q, k, v, do = _inputs(b, s, s, hq, hk, d, seed=0, dv=dv)
        out, lse, delta = _forward(q, k, v, do, causal)
        parts = _triton_parts(q, k, v, do, out, lse, delta, causal)
        scale = d ** -0.5
        # (kernel, config, callable, its Triton twin's kernel)
        tuned = "autotuned" if os.environ.get("FLASH_ATTN_AUTOTUNE") == "1" else "pinned"
        calls = [("triton dq", tuned, parts["dq"], None), ("triton dkdv", tuned, parts["dkdv"], None),
                 ("triton bwd", "whole", _whole(q, k, v, do, out, lse, causal, "split")[0], None),
                 ("gluon bwd", "whole", _whole(q, k, v, do, out, lse, causal, "gluon")[0], "triton bwd"),
                 ("routed bwd", "whole", _whole(q, k, v, do, out, lse, causal, "")[0], "triton bwd")]
        fusable = d == dv and d in FUSED_HEAD_DIMS
        if fusable and fused_specs:
            calls.append(("fused bwd", "whole", _whole(q, k, v, do, out, lse, causal, "fused")[0], "triton bwd"))
        # the unordered fused kernel, with an adder warp (--adder), its ordered variant (--ordered; key blocks last
        # first, as by default)
        variants = [("fused", {})] + [("fused adder", dict(adder=True))] * adder + [("ordered", dict(ordered=True))] * ordered
        calls += [(f"gluon {name}", spec, functools.partial(
            dkdv_gluon, q, k, v, do, lse, delta, softmax_scale=scale, causal=causal, launches={}, fused=True,
            **dict(kw, **_config(spec, "block_m"))), "triton bwd")
            for spec in (fused_specs if fusable else ()) for name, kw in variants]
        calls += [("fused whole", spec, _whole_at(q, k, v, do, out, lse, causal, spec), "triton bwd")
                  for spec in (fused_specs if fusable and whole else ())]
        calls += [("gluon dq", spec, functools.partial(dq_gluon, q, k, v, do, out, lse, softmax_scale=scale,
                                                       causal=causal, launches={}, **_config(spec, "block_n")),
                   "triton dq") for spec in dq_specs]
        calls += [("gluon dkdv", spec, functools.partial(_dkdv(d, spec), q, k, v, do, lse, delta, softmax_scale=scale,
                                                         causal=causal, launches={}), "triton dkdv")
                  for spec in dkdv_specs]
        key = (_hd(d, dv), "yes" if causal else "no", f"{label} H{hq}/{hk}")
        cell, cell_runs = best.setdefault(key, {}), runs.setdefault(key, {})
        for _ in range(repeat):
            this = {}
            for name, cfg, fn, twin in calls:
                ms = timed(fn)
                this[name] = this.get(name, ms)
                reps = cell_runs.setdefault((name, cfg), {})
                reps[0, len(reps)] = ms  # (run 0, its k-th repeat)
                cell[name, cfg] = (min(ms, cell.get((name, cfg), (ms, twin))[0]), twin)
                ratio = f"{this[twin] / ms:.3f}" if twin else "-"
                print(f"| {_hd(d, dv)} | {'yes' if causal else 'no'} | {label} H{hq}/{hk} | {name} | {cfg} | {ms:.4f} | "
                      f"{ratio} |", flush=True)
        del q, k, v, do, out, lse, delta, calls, parts
        torch.cuda.empty_cache()
    summary(best)
    print_speedups(runs)


def timeline_summary(rec: dict) -> dict:
    """One launch's timeline (bwd_gluon.timeline_record: per program and consumer, SM cycle stamps at its start,
    K / V landed, loop end and end, the GPU's ns timer at start and end, its SM, its query tiles) -> where the SMs'
    time went: ``programs``, ``sms`` (seen), ``span_us`` (first start to last end), per program medians
    (``program_us``; ``prologue_us``: start to K / V landed, ``epilogue_us``: the last tile done to dK / dV stored,
    the later consumer's), ``gap_us`` (median time an SM sat between one program's end and the next one's start:
    the CTA's launch and set-up before its consumers run; split into ``launch_us``, the previous program's end to
    this one's entry, and ``setup_us``, its entry to its consumers' start: its descriptors and barriers, of which
    ``desc_us`` is its entry to its Q / dO / K / V descriptors made (on the device: four tensormaps written and
    fenced); a persistent program has an entry in its first tile only), and shares of the seen SMs' time over the span
    (``loop``, ``prologue``, ``epilogue``, ``gaps``, ``idle``: before an SM's first program and after its last;
    ``overlaps``: programs that started on an SM before the previous one there ended: a persistent kernel's tiles,
    one consumer on the next tile while the other stores the last one's dK / dV; such a record's start is taken as
    the previous one's end, so no time is counted twice). Cycles become time at the
    ratio of the ns timer to the cycle counter over each SM's span (median over SMs: the ns timer is coarse, the
    spans long)."""
    c0, ckv, cend_loop, cend = (rec[f].tolist() for f in ("clock_start", "clock_kv", "clock_loop_end", "clock_end"))
    entry = [row[0] for row in rec["clock_entry"].tolist()] if "clock_entry" in rec else [-1] * len(c0)
    desc = [row[0] for row in rec["clock_desc"].tolist()] if "clock_desc" in rec else [-1] * len(c0)
    g0, g1, sm, tiles = (rec[f].tolist() for f in ("global_start", "global_end", "sm", "tiles"))
    n = len(c0)
    if any(a != b for a, b in sm):
        raise ValueError("timeline: a program's two consumers report different SMs")
    per_sm: dict[int, list[int]] = {}
    for p in range(n):
        per_sm.setdefault(sm[p][0], []).append(p)
    start = [min(c0[p]) for p in range(n)]
    end = [max(cend[p]) for p in range(n)]
    ratios = []
    for progs in per_sm.values():
        cycles = max(end[p] for p in progs) - min(start[p] for p in progs)
        nanos = max(max(g1[p]) for p in progs) - min(min(g0[p]) for p in progs)
        if cycles > 0 and nanos > 0:
            ratios.append(nanos / cycles)
    if not ratios:
        raise ValueError("timeline: no SM with a measurable span")
    ns = sorted(ratios)[len(ratios) // 2]
    setup = [start[p] - entry[p] for p in range(n) if entry[p] >= 0]
    made = [desc[p] - entry[p] for p in range(n) if entry[p] >= 0 and desc[p] >= 0]
    gaps, launch, overlaps = [], [], 0
    for progs in per_sm.values():
        order = sorted(progs, key=lambda p: start[p])
        for prev, nxt in zip(order, order[1:]):
            if entry[nxt] >= 0:
                launch.append(entry[nxt] - end[prev])
            if start[nxt] < end[prev]:
                overlaps += 1
                start[nxt] = min(end[prev], end[nxt])  # (the overlap counted once, in the earlier record)
            else:
                gaps.append(start[nxt] - end[prev])
    span_ns = max(max(x) for x in g1) - min(min(x) for x in g0)
    total = span_ns * len(per_sm)
    prologue = [max(0, max(ckv[p]) - start[p]) for p in range(n)]
    epilogue = [end[p] - max(max(cend_loop[p]), start[p]) for p in range(n)]
    program = [end[p] - start[p] for p in range(n)]
    loop = [max(0, program[p] - prologue[p] - epilogue[p]) for p in range(n)]

    def median(xs):
        return sorted(xs)[len(xs) // 2] if xs else 0

    share = {name: sum(xs) * ns / total for name, xs in (("loop", loop), ("prologue", prologue),
                                                         ("epilogue", epilogue), ("gaps", gaps))}
    share["idle"] = max(0.0, 1 - sum(share.values()))
    return dict(programs=n, sms=len(per_sm), span_us=span_ns / 1e3, program_us=median(program) * ns / 1e3,
                prologue_us=median(prologue) * ns / 1e3, epilogue_us=median(epilogue) * ns / 1e3,
                gap_us=median(gaps) * ns / 1e3, launch_us=median(launch) * ns / 1e3, setup_us=median(setup) * ns / 1e3,
                desc_us=median(made) * ns / 1e3,
                tiles=median([t for pair in tiles for t in pair]), overlaps=overlaps,
                **share)


def timeline(dims, dkdv_specs, seqlens, masks, models, fused_specs=(), shapes=()) -> None:
    """``--timeline``: each cell's dK / dV kernel at each ``--dkdv`` config and fused kernel at each ``--fused``
    config launched once more with its programs' timeline stamps (after a launch that compiles it):
    :func:`timeline_summary` as ``| timeline |`` rows."""
    from kernels.flash_attn.bwd_gluon import FUSED_HEAD_DIMS, dkdv_gluon, timeline_buffer, timeline_record

    print("\n| timeline | hd | causal | shape | kernel | config | programs | SMs | span us | program us | prologue us "
          "| epilogue us | gap us | tiles | loop | prologue | epilogue | gaps | idle | overlaps | launch us | setup us "
          "| desc us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for label, b, s, hq, hk, d, dv, causal in _cells(dims, seqlens, masks, models, shapes):
        q, k, v, do = _inputs(b, s, s, hq, hk, d, seed=0, dv=dv)
        out, lse, delta = _forward(q, k, v, do, causal)
        kernels = [("gluon dkdv", spec, {}) for spec in (dkdv_specs if d != 256 else ())]  # (hd 256's: no stamps)
        kernels += [("gluon fused", spec, dict(fused=True))
                    for spec in (fused_specs if d == dv and d in FUSED_HEAD_DIMS else ())]
        for name, spec, extra in kernels:
            run = functools.partial(dkdv_gluon, q, k, v, do, lse, delta, softmax_scale=d ** -0.5, causal=causal,
                                    **extra, **_config(spec, "block_m"))
            run()  # (compiles the timeline variant's twin too: the stamps' launch below compiles its own)
            times = timeline_buffer(k)
            run(times=times)
            torch.cuda.synchronize()
            t = timeline_summary(timeline_record(times))
            print(f"| timeline | {_hd(d, dv)} | {'yes' if causal else 'no'} | {label} H{hq}/{hk} | {name} | {spec} | "
                  f"{t['programs']} | {t['sms']} | {t['span_us']:.1f} | {t['program_us']:.2f} | "
                  f"{t['prologue_us']:.2f} | {t['epilogue_us']:.2f} | {t['gap_us']:.2f} | {t['tiles']} | "
                  f"{t['loop']:.3f} | {t['prologue']:.3f} | {t['epilogue']:.3f} | {t['gaps']:.3f} | {t['idle']:.3f} | "
                  f"{t['overlaps']} | {t['launch_us']:.2f} | {t['setup_us']:.2f} | {t['desc_us']:.2f} |", flush=True)
        del q, k, v, do, out, lse, delta
        torch.cuda.empty_cache()


def summary(best: dict) -> None:
    """Each cell's fastest repeat per kernel and config against its Triton twin's fastest: ``| summary |`` rows."""
    print("\n| summary | hd | causal | shape | kernel | config | best ms | / its Triton twin |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for (d, causal, shape), cell in best.items():
        fastest = {name: ms for (name, _), (ms, _) in cell.items() if name.startswith("triton")}
        for (name, cfg), (ms, twin) in cell.items():
            ratio = f"{fastest[twin] / ms:.3f}" if twin else "-"
            print(f"| summary | {d} | {causal} | {shape} | {name} | {cfg} | {ms:.4f} | {ratio} |", flush=True)


#: the whole backwards compared in the speed-up table: (kernel, config) over (kernel, config)
WHOLE_PAIRS = ((("fused bwd", "whole"), ("routed bwd", "whole")), )


def speedups(runs: dict) -> list[tuple]:
    """The decisions' rows from every repeat's ms (``runs``: {(hd, causal, shape): {(kernel, config): {(run, k): ms}}},
    the k-th repeat of a run): per cell, each later config of a kernel over that kernel's first config (the config
    seen first is the base), and :data:`WHOLE_PAIRS`; each row (hd, causal, shape, kernel, "config / base", speed-ups
    repeat by repeat (base ms / this ms, only within one repeat of one run: what was timed side by side), geomean,
    repeats faster). A pair with no repeat in common (configs of different runs) has no row."""
    rows = []
    for (d, causal, shape), cell in runs.items():
        pairs, firsts = [], {}
        for name, cfg in cell:
            if name in firsts:
                pairs.append(((name, cfg), (name, firsts[name])))
            else:
                firsts[name] = cfg
        pairs += [p for p in WHOLE_PAIRS if p[0] in cell and p[1] in cell]
        for this, base in pairs:
            got = [cell[base][tag] / ms for tag, ms in cell[this].items() if tag in cell[base] and ms > 0]
            if not got:
                continue
            geo = math.exp(sum(math.log(x) for x in got) / len(got))
            label = f"{this[1]} / {base[1]}" if this[0] == base[0] else f"{this[0]} / {base[0]}"
            rows.append((d, causal, shape, this[0], label, got, geo, sum(x > 1 for x in got)))
    return rows


def print_speedups(runs: dict) -> None:
    """:func:`speedups` as ``| speed-up |`` rows."""
    print("\n| speed-up | hd | causal | shape | kernel | config / base | repeat by repeat | geomean | faster in |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for d, causal, shape, name, label, got, geo, faster in speedups(runs):
        each = ", ".join(f"{x:.3f}" for x in got)
        print(f"| speed-up | {d} | {causal} | {shape} | {name} | {label} | {each} | {geo:.3f} | "
              f"{faster} / {len(got)} |", flush=True)


def runs_from_logs(paths) -> dict:
    """Every repeat's ms from earlier runs' logs (their ``| hd | causal | shape | kernel | config | ms | ... |`` rows;
    summary and speed-up rows skipped), as :func:`speedups` takes them: each log one run, its rows of a (kernel,
    config) its repeats in order."""
    runs = {}
    for run, path in enumerate(paths):
        for line in Path(path).read_text().splitlines():
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cols) != 7 or cols[0] in ("hd", "summary", "speed-up") or cols[0].startswith("---"):
                continue
            try:
                ms = float(cols[5])
            except ValueError:
                continue
            reps = runs.setdefault(tuple(cols[:3]), {}).setdefault((cols[3], cols[4]), {})
            reps[run, sum(1 for r, _ in reps if r == run)] = ms
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128", help="D or D/DV (MLA: 192/128)")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--dkdv", nargs="+", default=list(DEFAULT_DKDV), metavar="BLOCK_M,STAGES")
    ap.add_argument("--dq", nargs="+", default=list(DEFAULT_DQ), metavar="BLOCK_N,STAGES[,p1]")
    ap.add_argument("--fused", nargs="*", default=list(DEFAULT_FUSED), metavar="BLOCK_M,STAGES",
                    help="the fused backward's kernel configs (none: not run)")
    ap.add_argument("--ordered", action="store_true",
                    help="the fused kernel's ordered (deterministic) variant too, at each --fused config")
    ap.add_argument("--adder", action="store_true",
                    help="the fused kernel with its dQ adds in an adder warp too, at each --fused config")
    ap.add_argument("--whole", action="store_true",
                    help="also the whole fused backward (delta's preprocess, the kernel, dQ's cast) at each --fused "
                         "config, checked against the oracle and timed beside the kernel alone ('fused whole' rows; "
                         "a kernel's gain alone has reached the whole backward at a fraction: sessions 39-43)")
    ap.add_argument("--timeline", action="store_true",
                    help="also each --dkdv / --fused config's kernel once with its programs' timeline stamps: where "
                         "the SMs' time goes (the loop, each program's prologue and epilogue, the gaps between "
                         "programs on an SM, idle head and tail): '| timeline |' rows after the timing")
    ap.add_argument("--models", action="store_true", help="also Llama-3-8B / 70B's causal calls (GQA)")
    ap.add_argument("--shapes", nargs="*", default=[], metavar="B,S,HQ,HK",
                    help="also these calls (batch, sequence, query heads, kv heads) at each head dim and mask")
    ap.add_argument("--repeat", type=int, default=2, help="timing passes (0: none, e.g. --timeline alone)")
    ap.add_argument("--autotune", action="store_true",
                    help="the Triton kernels at their autotuned configs (default: the pinned first picks)")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--from-log", nargs="+", metavar="LOG",
                    help="no GPU work: the speed-up table of earlier runs' logs (their per-repeat rows)")
    a = ap.parse_args(argv)
    if a.from_log:
        missing = [p for p in a.from_log if not Path(p).is_file()]
        if missing:
            raise SystemExit(f"--from-log: no such file: {', '.join(missing)}")
        runs = runs_from_logs(a.from_log)
        if not runs:
            raise SystemExit("--from-log: no per-repeat rows (| hd | causal | shape | kernel | config | ms | ... |) "
                             "in " + ", ".join(a.from_log))
        print_speedups(runs)
        return 0
    for spec in a.dkdv + a.fused:  # (the configs read before any GPU work)
        _config(spec, "block_m")
    if any({"u1", "a1", "d1", "o1"} & set(spec.split(",")) for spec in a.dkdv):
        raise SystemExit("--dkdv: ,u1 (dQ without the softmax scale), ,a1 (dQ's adder warp), ,d1 (dS^T from "
                         "shared memory) and ,o1 (ordered adds) are the fused kernel's: give them to --fused")
    for spec in a.dq:
        _config(spec, "block_n")
    for spec in a.dkdv if "256" in a.head_dims.split(",") else ():
        _dkdv(256, spec)
    if any({"p1", "p2"} & set(spec.split(",")) and ("o1" in spec.split(",") or a.ordered) for spec in a.fused):
        raise SystemExit("--fused: ,p1 / ,p2 (persistent) run the unordered adds only: not with ,o1 or --ordered")
    shapes = [parse_shape(x) for x in a.shapes]
    if a.whole and not a.fused:
        raise SystemExit("--whole: the whole fused backward at each --fused config: give --fused configs")
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("gluon_bwd_probe: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "1" if a.autotune else "0"
    os.environ["FLASH_ATTN_BWD"] = "split"  # dK / dV without the atomic dQ: the same work as the Gluon kernels
    dims = [_dims(x) for x in a.head_dims.split(",")]
    if not check(dims, a.dkdv, a.dq, a.fused, a.ordered, a.adder, a.whole):
        print("gluon_bwd_probe: a Gluon kernel failed the check; no timing", file=sys.stderr)
        return 1
    if not a.check_only and a.repeat > 0:
        timing(dims, a.dkdv, a.dq, [int(x) for x in a.seqlens.split(",") if x],
               [{"no": False, "yes": True}[m] for m in a.masks.split(",")], a.repeat, a.models, a.fused, a.ordered,
               a.adder, shapes, a.whole)
    if a.timeline and not a.check_only:
        timeline(dims, a.dkdv, [int(x) for x in a.seqlens.split(",") if x],
                 [{"no": False, "yes": True}[m] for m in a.masks.split(",")], a.models, a.fused, shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
