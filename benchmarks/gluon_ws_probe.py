"""The 16-bit warp-specialised Gluon forward (kernels/flash_attn/fp8_gluon.py ``fwd_gluon_ws``) against the
in-repo Triton forward (fwd.py) and torch's cuDNN and FA2 kernels, H100.

    python benchmarks/gluon_ws_probe.py [--check-only] [--head-dims 64,128,192/128] [--seqlens 1024,4096,16384]
        [--masks no,yes] [--ws 128,2 64,3 ...] [--repeat 3] [--models] [--dtype bf16] [--autotune] [--softcap 50]
        [--device-desc] [--shapes B,S,HQ,HK ...]

1. Correctness first, on fresh random inputs (odd lengths, GQA, seqlen_q != seqlen_k causal, rows that see
   no key): out and lse against the FP64 oracle, beside the Triton forward's error on the same inputs; out and
   lse poisoned (NaN) before each run. A Gluon row above 2x the Triton error (plus 2e-3 on out, 1e-3 on lse),
   or with a fully masked row not 0 / -inf, or whose replayed launch (kernels/launcher.py) gives other bits, reads FAIL and the script exits 1 before timing.
2. Kernel time, CUDA events through the harness's timer (warm-up, L2 flushed, median), every kernel of a cell
   in one process and interleaved ``--repeat`` times: the FA sweep's shapes (16k tokens, hidden 2048) and with
   ``--models`` real models' (Llama-3-8B GQA 32/8, Llama-3-70B 64/8, an MQA 32/1, causal), with ``--layers`` the
   attention-layer report's GQA / MQA rows, with ``--shapes`` a user's calls at each mask (e.g. the models
   preset's Llama-3-8B 2k: 4,2048,32,8). The Triton forward at its pinned first pick (FLASH_ATTN_AUTOTUNE=0;
   ``--autotune``: at the config its autotuner picks, as a user's call gets it, tuned before the timing;
   FLASH_ATTN_GLUON_WS=0: not the route to the Gluon kernel), the Gluon one at each ``--ws``
   [p:|pk:|ps:]BLOCK_N,STAGES[,REGS] (p: the persistent kernel, query blocks outer; pk: kv heads outer; ps: kv heads
   outer, snaking),
   sdpa's cuDNN and FA2 backends (torch's own kernels; [B, H, S, D] views of the same tensors). Rows:
   ``| hd | causal | shape | kernel | config | ms | TFLOP/s | / triton | / cuDNN |``; last, each cell's fastest
   repeat per Gluon config against the others and the first ``--ws`` config (``| summary | ... |``).
3. Descriptors: a config that is not persistent takes host-made TMA descriptors where the route gives them
   (kernels/flash_attn/configs.py ``FWD_GLUON_HOST_DESC``, q / k = v head dims), so it is timed as a user's call
   runs it; ``--device-desc``: every program makes its own, as the probe did before session 54. Session 54's
   probe read hd 256's capped 1k causal launch at 0.243 ms where the harness times the routed one at 0.213, and
   the persistent kernel (which makes its descriptors once a program) 1.13x ahead of it: through the harness the
   persistent kernel lost, 0.96-0.99x.
4. ``--softcap CAP``: every call's scores capped, CAP * tanh(s / CAP) (Gemma-2's 50; the oracle's and the Triton
   forward's too; the persistent kernel's since session 52); torch's cuDNN and FA2 kernels take no cap and are
   left out (their columns read nan).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import parse_shape  # noqa: E402

DEFAULT_WS = {"64": ["128,3"], "128": ["128,3"], "256": ["64,2", "32,4"], "192/128": ["64,4", "64,3"]}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: (name, batch, seqlen, query heads, kv heads, head dim), causal: real models' training / prefill calls
MODELS = (("Llama-3-8B", 1, 8192, 32, 8, 128), ("Llama-3-70B", 1, 4096, 64, 8, 128), ("MQA 32/1", 2, 4096, 32, 1, 128),
          ("GQA 32/8 d64", 2, 2048, 32, 8, 64), ("Falcon-7B MQA 71/1", 2, 2048, 71, 1, 64),
          ("Gemma-2-9B", 2, 4096, 16, 8, 256))
#: (batch, seqlen, heads) of the attention-layer report's MLA configurations, run in the training form (q / k 192,
#: v 128: ``--head-dims 192/128``), causal and not
MLA_LAYERS = ((2, 2048, 32), (1, 4096, 64), (1, 2048, 128))
#: (name, batch, seqlen, query heads, kv heads, head dim) of the attention-layer report's GQA / MQA rows (hd 128; hd 64
#: since session 33)
#: (``--layers``), causal and not: where the persistent kernel's tile order (one query block of many heads at a
#: time) meets K / V shared by several query heads
LAYERS = (("GQA layer", 1, 4096, 32, 8, 128), ("GQA layer", 1, 2048, 40, 8, 128), ("MQA layer", 1, 4096, 32, 1, 128),
          ("MQA layer", 1, 2048, 40, 1, 128), ("GQA layer", 2, 2048, 32, 8, 64), ("MQA layer", 2, 2048, 16, 1, 64))


def _dims(key: str) -> tuple[int, int]:
    """"128" -> (128, 128); "192/128" -> (192, 128): the q / k and v head dims."""
    d, _, dv = key.partition("/")
    return int(d), int(dv or d)


#: --ws prefixes: the persistent kernel in each tile order (fp8_gluon.TILE_ORDERS)
PERSISTENT = {"p:": "query", "pk:": "kv", "ps:": "kv-snake"}
#: --ws prefixes of the (not persistent) kernel's consumer variants: three warpgroups, no in-block overlap, both
RING = {"w3:": {"consumers": 3}, "n:": {"overlap": False}, "w3n:": {"consumers": 3, "overlap": False}}


def _spec(spec: str) -> dict:
    """BLOCK_N,STAGES[,REGS] -> fwd_gluon_ws's keywords; a "p:" prefix: its persistent kernel, query blocks outer;
    "pk:": the persistent kernel, kv heads outer; "ps:": kv heads outer, snaking (fp8_gluon.TILE_ORDERS); "w3:":
    three consumer warpgroups, 192-row tiles (not persistent); "n:" / "w3n:": two / three consumers without the
    in-block overlap (fp8_gluon._WsShape.OVERLAP)."""
    prefix, _, rest = spec.rpartition(":")
    if prefix and prefix + ":" not in PERSISTENT and prefix + ":" not in RING:
        raise SystemExit(f"--ws {spec}: prefixes {sorted(PERSISTENT) + sorted(RING)}")
    parts = [int(x) for x in rest.split(",")]
    if len(parts) not in (2, 3):
        raise SystemExit(f"--ws {spec}: want [p:|pk:|ps:|w3:|n:|w3n:]BLOCK_N,STAGES[,REGS]")
    kw = dict(zip(("block_n", "num_stages", "consumer_regs"), parts))
    if prefix + ":" in RING:
        return kw | RING[prefix + ":"]
    return kw | {"persistent": bool(prefix)} | ({"tile_order": PERSISTENT[prefix + ":"]} if prefix else {})


def _keywords(spec: str, key: str, device_desc: bool = False) -> dict:
    """fwd_gluon_ws's keywords for ``spec`` at head dims ``key``: :func:`_spec`'s, with host-made descriptors where
    the route gives them to a launch that is not persistent (configs.FWD_GLUON_HOST_DESC, q / k = v head dims),
    unless ``device_desc``."""
    from kernels.flash_attn import configs

    kw = _spec(spec)
    d, dv = _dims(key)
    if configs.FWD_GLUON_HOST_DESC and not device_desc and not kw.get("persistent") and d == dv:
        kw["host_desc"] = True
    return kw


def _inputs(b, sq, sk, hq, hk, d, dtype, seed, dv=None):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to("cuda", dtype)
    k = torch.randn(b, sk, hk, d, generator=g).to("cuda", dtype)
    v = torch.randn(b, sk, hk, dv or d, generator=g).to("cuda", dtype)
    return q, k, v


def _triton(q, k, v, causal, launches=None, softcap=0.0):
    """The in-repo Triton forward: main() sets FLASH_ATTN_GLUON_WS=0, else flash_attn_fwd would route hd 128 (and
    MLA) calls to the Gluon kernel and the baseline would time the kernel it is compared against."""
    from kernels.flash_attn.fwd import flash_attn_fwd

    return flash_attn_fwd(q, k, v, softmax_scale=q.shape[-1] ** -0.5, causal=causal, window_left=-1,
                          window_right=0 if causal else -1, softcap=softcap, launches=launches)


def check(dims, specs, dtype, softcap=0.0, device_desc=False) -> bool:
    from harness.oracle.softmax import softmax_attention
    from kernels.flash_attn.fp8_gluon import fwd_gluon_ws

    ok = True
    print("| check | hd | causal | B Sq Sk Hq/Hk | config | max err out | max err lse | triton's out / lse | |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    cases = [(2, 1000, 1000, 4, 2), (1, 300, 1000, 4, 4), (1, 1000, 300, 2, 1), (1, 64, 64, 2, 2), (1, 257, 129, 6, 3)]
    for key in dims:
        d, dv = _dims(key)
        for causal in (False, True):
            for n, (b, sq, sk, hq, hk) in enumerate(cases):
                q, k, v = _inputs(b, sq, sk, hq, hk, d, dtype, seed=200 + n, dv=dv)
                ref = softmax_attention(q.double(), k.double(), v.double(), causal=causal, softmax_scale=d ** -0.5,
                                        softcap=softcap)
                o_t, l_t = _triton(q, k, v, causal, softcap=softcap)
                seen = ref.lse > float("-inf")
                e_t = (o_t.double() - ref.out).abs().max().item()
                le_t = (l_t.double() - ref.lse)[seen].abs().max().item() if seen.any() else 0.0
                for spec in specs[key]:
                    try:
                        o_g, l_g = fwd_gluon_ws(q, k, v, softmax_scale=d ** -0.5, causal=causal, poison=True,
                                                softcap=softcap, **_keywords(spec, key, device_desc))
                        torch.cuda.synchronize()
                    except Exception as e:  # a config that does not compile or fit: say so and go on
                        print(f"| check | {key} | {causal} | {b} {sq} {sk} {hq}/{hk} | {spec} | {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:80]} | | | FAIL |", flush=True)
                        ok = False
                        continue
                    cache = {}  # the first call leaves its launch, the second replays it: the same bits
                    first = fwd_gluon_ws(q, k, v, softmax_scale=d ** -0.5, causal=causal, launches=cache,
                                         softcap=softcap, **_keywords(spec, key, device_desc))
                    again = fwd_gluon_ws(q, k, v, softmax_scale=d ** -0.5, causal=causal, launches=cache,
                                         poison=True, softcap=softcap, **_keywords(spec, key, device_desc))
                    replay_ok = "ws16" in cache and all(torch.equal(x, y) for x, y in zip(first, again)) and \
                        torch.equal(first[0], o_g)
                    e_g = (o_g.double() - ref.out).abs().max().item()
                    empty_ok = bool((l_g[~seen] == float("-inf")).all()) and bool((o_g.double()[
                        ~seen.transpose(1, 2).unsqueeze(-1).expand_as(o_g)] == 0).all())
                    le_g = (l_g.double() - ref.lse)[seen].abs().max().item() if seen.any() else 0.0
                    good = e_g == e_g and e_g <= 2 * e_t + 2e-3 and le_g <= 2 * le_t + 1e-3 and empty_ok and replay_ok
                    ok &= good
                    print(f"| check | {key} | {causal} | {b} {sq} {sk} {hq}/{hk} | {spec} | {e_g:.4g} | {le_g:.3g} | "
                          f"{e_t:.4g} / {le_t:.3g} | {'ok' if good else 'FAIL'}{'' if replay_ok else ' (replay differs)'} |", flush=True)
    return ok


def _cells(dims, seqlens, masks, models, layers=False, shapes=()):
    """(label, batch, seqlen, query heads, kv heads, head dims key, causal) of every timed cell: the FA sweep's
    (16k tokens, hidden 2048) for equal head dims and each of ``shapes`` ((batch, seqlen, query heads, kv heads): a
    user's call, e.g. the models preset's Llama-3-8B 2k) at each mask, the attention layers' MLA configurations for
    192/128 (and its sweep cells below 2k, 16 heads, where the route's length minimum is decided)."""
    for key in dims:
        d, dv = _dims(key)
        if d != dv:
            for s in (s for s in seqlens if s < 2048):
                for causal in masks:
                    yield f"sweep S{s}", max(1, 16384 // s), s, 16, 16, key, causal
            for b, s, h in MLA_LAYERS:
                for causal in masks:
                    yield f"MLA layer B{b} S{s}", b, s, h, h, key, causal
            continue
        for s in seqlens:
            for causal in masks:
                heads = 8 if d == 256 else 2048 // d  # the FA sweep's hd 256 keeps 8 heads (as fp8_gluon_probe.py)
                yield f"sweep S{s}", max(1, 16384 // s), s, heads, heads, key, causal
        for b, s, hq, hk in shapes:
            for causal in masks:
                yield f"B{b} S{s}", b, s, hq, hk, key, causal
    if models:
        for name, b, s, hq, hk, d in MODELS:
            if str(d) in dims:
                yield f"{name} B{b} S{s}", b, s, hq, hk, str(d), True
    if layers:
        for name, b, s, hq, hk, d in LAYERS:
            if str(d) in dims:
                for causal in masks:
                    yield f"{name} B{b} S{s}", b, s, hq, hk, str(d), causal


def timing(dims, specs, seqlens, masks, repeat, models, dtype, layers=False, softcap=0.0, device_desc=False,
           shapes=()):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness.perf.timing import time_callable
    from kernels.flash_attn.fp8_gluon import fwd_gluon_ws

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    def sdpa(backend, q, k, v, causal):
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        gqa = q.shape[2] != k.shape[2]

        def call():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                        enable_gqa=gqa)
        return call

    print("| hd | causal | shape | kernel | config | ms | TFLOP/s | / triton | / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    best = {}  # (hd, causal, shape) -> {(kernel, config): the fastest repeat's ms}
    for label, b, s, hq, hk, key, causal in _cells(dims, seqlens, masks, models, layers, shapes):
        d, dv = _dims(key)
        q, k, v = _inputs(b, s, s, hq, hk, d, dtype, seed=0, dv=dv)
        flops = 2 * b * hq * s * s * (d + dv) // (2 if causal else 1)
        tri_cache, ws_caches = {}, {spec: {} for spec in specs[key]}
        tuned = "autotuned" if os.environ.get("FLASH_ATTN_AUTOTUNE") == "1" else "pinned"
        calls = [("triton", tuned, functools.partial(_triton, q, k, v, causal, tri_cache, softcap))]
        if not softcap:  # (torch's kernels take no cap)
            calls += [("cuDNN", "sdpa", sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)),
                      ("FA2", "sdpa", sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal))]
        for spec in specs[key]:
            calls.append(("gluon-ws", spec, functools.partial(fwd_gluon_ws, q, k, v, softmax_scale=d ** -0.5, causal=causal,
                                                              launches=ws_caches[spec], softcap=softcap,
                                                              **_keywords(spec, key, device_desc))))
        for _ in range(repeat):
            ms_of = {}
            for name, cfg, fn in calls:
                try:
                    ms = timed(fn)
                except Exception as e:
                    print(f"| {key} | {causal} | {label} | {name} | {cfg} | {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:60]} | | | |", flush=True)
                    continue
                ms_of[name] = ms_of.get(name, ms)
                cell = best.setdefault((key, "yes" if causal else "no", f"{label} H{hq}/{hk}"), {})
                cell[name, cfg] = min(ms, cell.get((name, cfg), ms))
                tri, cud = ms_of.get("triton"), ms_of.get("cuDNN")
                print(f"| {key} | {'yes' if causal else 'no'} | {label} H{hq}/{hk} | {name} | {cfg} | {ms:.4f} | "
                      f"{flops / ms / 1e9:.0f} | {tri / ms if tri else float('nan'):.3f} | "
                      f"{cud / ms if cud else float('nan'):.3f} |", flush=True)
        del q, k, v, calls
        torch.cuda.empty_cache()
    summary(best, specs)


def summary(best: dict, specs: dict) -> None:
    """Each cell's fastest repeat per kernel and config, against the Triton forward, cuDNN, FA2 and the first
    ``--ws`` config of its head dims (the one a change is judged against): ``| summary | ... |`` rows."""
    print("\n| summary | hd | causal | shape | config | best ms | / triton | / cuDNN | / FA2 | / first config |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for (key, causal, shape), cell in best.items():
        ref = {name: ms for (name, cfg), ms in cell.items() if name != "gluon-ws"}
        first = cell.get(("gluon-ws", specs[key][0]))
        for (name, cfg), ms in cell.items():
            if name != "gluon-ws":
                continue
            ratio = [f"{ref[n] / ms:.3f}" if n in ref else "-" for n in ("triton", "cuDNN", "FA2")]
            print(f"| summary | {key} | {causal} | {shape} | {cfg} | {ms:.4f} | {' | '.join(ratio)} | "
                  f"{first / ms if first else float('nan'):.3f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64,128", help="comma-separated: D, or QK/V such as 192/128 (MLA)")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--masks", default="no,yes")
    ap.add_argument("--ws", nargs="+", default=None, metavar="[p:|pk:|ps:]BLOCK_N,STAGES[,REGS]",
                    help="configs of the warp-specialised kernel for every head dim (default: one per head dim); "
                    "p: its persistent kernel (one program an SM, query blocks outer), pk: kv heads outer, ps: snaking")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--models", action="store_true", help="also real models' causal calls (GQA, MQA)")
    ap.add_argument("--layers", action="store_true",
                    help="also the attention-layer report's hd 128 GQA / MQA rows, each mask of --masks")
    ap.add_argument("--shapes", nargs="*", default=[], metavar="B,S,HQ,HK",
                    help="also these calls (batch, sequence, query heads, kv heads) at each equal head dim and mask")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--autotune", action="store_true",
                    help="the Triton forward at its autotuned config (default: the pinned first pick)")
    ap.add_argument("--device-desc", action="store_true",
                    help="configs that are not persistent make their TMA descriptors in every program (default: "
                    "host-made where the route makes them)")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="cap every call's scores at CAP * tanh(s / CAP) (Gemma-2: 50)")
    a = ap.parse_args(argv)
    if a.softcap < 0 or a.softcap != a.softcap:
        ap.error(f"--softcap: a cap > 0 (0: none), got {a.softcap}")
    shapes = [parse_shape(x) for x in a.shapes]
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
        print("gluon_ws_probe: needs an sm90 GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "1" if a.autotune else "0"
    os.environ["FLASH_ATTN_GLUON_WS"] = "0"  # the Triton baseline stays the Triton kernel (fwd_gluon_ws ignores it)
    dims = a.head_dims.split(",")
    specs = {key: a.ws or DEFAULT_WS[key] for key in dims}
    dtype = DTYPES[a.dtype]
    if not check(dims, specs, dtype, a.softcap, a.device_desc):
        print("gluon_ws_probe: the Gluon kernel failed the check; no timing", file=sys.stderr)
        return 1
    if not a.check_only:
        timing(dims, specs, [int(x) for x in a.seqlens.split(",")],
               [{"no": False, "yes": True}[m] for m in a.masks.split(",")], a.repeat, a.models, dtype, a.layers,
               a.softcap, a.device_desc, shapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
