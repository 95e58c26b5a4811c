"""Where the causal FP8 forward loses (issue 19): kernel time alone (V already keys-contiguous), the
V copy alone, one or two query blocks per program (the forward's TILES, forced by
configs.FWD_TILES_FORCE), and the per-program fixed cost from a fit of time against the number of key
blocks.

    FLASH_ATTN_AUTOTUNE=0 python benchmarks/fp8_causal_probe.py [--head-dims 64] [--seqlens 4096,8192]
        [--tiles 1,2] [--masks no,yes] [--try 64,128,4,3,T ...] [--bf16] [--v-natural] [--mma-order]
        [--narrow off,on] [--maxnreg 0,128] [--fit] [--label NAME]
    python benchmarks/fp8_causal_probe.py --copy [--head-dims 64,128,256]   # the V copy's tiles, CUDA graphs

Shapes: the FA sweep's (16k tokens, hidden 2048; hd 256 with 8 heads; `--heads` overrides the head count). Rows: `| label | hd | causal |
seqlen | dtype | config | tiles | ms | TFLOP/s |` (causal TFLOP/s count half the square). `--fit`
times the non-causal kernel at seqlen_q 4096 against seqlen_k 128-4096 and prints the least-squares
line (ms = a + b * key blocks per program): `a` is what every program costs before its first key
block. Runs on an older tree too (PYTHONPATH=that tree): without FWD_TILES_FORCE it times tiles 1 only.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

if "--here" in sys.argv:  # import this tree, not the one on PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from config_arg import parse_config  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", default="64")
    ap.add_argument("--seqlens", default="4096,8192,16384")
    ap.add_argument("--tiles", default="1,2", help="comma list of query blocks per program forced on each config "
                    "(configs.FWD_TILES_FORCE); 0: the config's own")
    ap.add_argument("--try", dest="extra", nargs="+", default=[], metavar="BM,BN,WARPS,STAGES,T|P")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--masks", default="no,yes", help="comma list of no (full square) and yes (causal)")
    ap.add_argument("--licm", default="0", help="0: the masked loops as configs.fwd_masked_no_licm says; 1: their "
                    "loop-invariant code motion forced on; 2: forced off (configs.FWD_MASKED_NO_LICM)")
    ap.add_argument("--narrow", default="", help="comma list of off, on: the causal diagonal in BLOCK_N-wide key "
                    "blocks or in BLOCK_M-wide ones where BLOCK_M < BLOCK_N (configs.FWD_NARROW_DIAGONAL forced); "
                    "default: as configs.fwd_narrow_diagonal says")
    ap.add_argument("--maxnreg", default="", help="comma list of register caps (0: none) for every variant "
                    "(configs.FWD_MAXNREG; 128 lets the FP8 64x128 tile run four programs an SM, with 2 stages causal)")
    ap.add_argument("--repeat", type=int, default=1, help="time each variant this many times, interleaved")
    ap.add_argument("--bf16", action="store_true", help="the bf16 forward too (its pinned pick)")
    ap.add_argument("--v-natural", action="store_true",
                    help="the FP8 kernel on V as it comes, [B, S, Hk, Dv] (V_T off: Triton transposes each V tile "
                    "on chip), beside the kernel on the copied V (dtype column 'e4m3 V')")
    ap.add_argument("--mma-order", action="store_true",
                    help="the kernel on V in the MMA order too (v_keys_contiguous(mma_order=True), P used as its MMA "
                    "registers hold it; dtype column 'e4m3 mma'), interleaved with the kernel on V in key order")
    ap.add_argument("--copy", action="store_true",
                    help="only the V copy: its tile and warp choices, device time from CUDA-graph replay")
    ap.add_argument("--heads", default=None,
                    help="comma list of head counts instead of the FA sweep's (2048 / hd): the program count "
                    "against the GPU's resident slots (wave quantisation)")
    ap.add_argument("--label", default="new")
    ap.add_argument("--here", action="store_true", help="import this tree (default: PYTHONPATH's)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_causal_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ["FLASH_ATTN_AUTOTUNE"] = "0"
    from harness import fp8
    from harness.perf.timing import time_callable
    from kernels.flash_attn import configs
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    if args.copy:
        return _copy_configs(args.head_dims, args.seqlens, args.label)
    can_tile = hasattr(configs, "FWD_TILES_FORCE")
    tiles = [int(t) for t in args.tiles.split(",") if can_tile or t == "1"]
    real_keep = configs.fwd_keep
    extra = [parse_config(c) for c in args.extra]

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        return time_callable(fn, "cuda").median_ms

    licms = [int(x) for x in args.licm.split(",")] if hasattr(configs, "fwd_masked_no_licm") else [0]

    narrows = [x for x in args.narrow.split(",") if x] if hasattr(configs, "FWD_NARROW_DIAGONAL") else []
    narrows = narrows or [""]
    caps = [int(x) for x in args.maxnreg.split(",") if x] if hasattr(configs, "FWD_MAXNREG") else []
    caps = caps or [0]

    def run(cfg, t, fn, licm=0, narrow="", cap=0):
        configs.fwd_keep = lambda *_a, _c=cfg: [_c]
        if can_tile:
            configs.FWD_TILES_FORCE = t or None  # 0: the config's own
        if licm:
            configs.FWD_MASKED_NO_LICM = licm == 2
        if narrow:
            configs.FWD_NARROW_DIAGONAL = narrow == "on"
        if cap:
            configs.FWD_MAXNREG = cap
        try:
            return timed(fn)
        except Exception as e:  # out of resources, a compile error: say so and go on
            print(f"| {args.label} | {cfg} tiles {t}: {type(e).__name__}: {str(e).splitlines()[0][:80]} |", flush=True)
            return None
        finally:
            configs.fwd_keep = real_keep
            if can_tile:
                configs.FWD_TILES_FORCE = None
            configs.FWD_MASKED_NO_LICM = None
            if narrow:
                configs.FWD_NARROW_DIAGONAL = None
            if cap:
                configs.FWD_MAXNREG = None

    print("| label | hd | causal | seqlen | dtype | config | tiles | ms | TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for d in (int(x) for x in args.head_dims.split(",")):
        for heads, s in [(hh, ss) for hh in ([int(x) for x in args.heads.split(",")] if args.heads else
                                             [8 if d == 256 else 2048 // d])
                         for ss in (int(x) for x in args.seqlens.split(","))]:
            b = max(1, 16384 // s)
            lab = f"{args.label} H{heads}" if args.heads else args.label
            g = torch.Generator(device="cpu").manual_seed(0)
            x = [torch.randn(b, s, heads, d, generator=g).to("cuda") for _ in range(3)]
            (q, qs), (k, ks), (v, vs) = (fp8.quantize(t, "e4m3", heads) for t in x)
            vt = v_keys_contiguous(v)
            ms = graph_ms(functools.partial(v_keys_contiguous, v))
            print(f"| {lab} | {d} | - | {s} | e4m3 | V copy alone (CUDA graph) | - | {ms:.4f} | |", flush=True)
            qb, kb, vb = (t.to(torch.bfloat16) for t in x)
            for causal in [{"no": False, "yes": True}[m] for m in args.masks.split(",")]:
                flops = 4 * b * heads * s * s * d // (2 if causal else 1)
                kw = dict(softmax_scale=d ** -0.5, causal=causal, window_left=-1, window_right=0 if causal else -1)
                fp8_call = functools.partial(flash_attn_fwd, q, k, vt, descales=(qs, ks, vs), out_dtype=torch.bfloat16,
                                             v_transposed=True, max_num_imprecise_acc=None, **kw)
                calls = [("e4m3", c, fp8_call) for c in list(dict.fromkeys(_first_fp8(real_keep, d, causal) + extra))]
                if args.mma_order:
                    vt_mma = v_keys_contiguous(v, mma_order=True)
                    mma_call = functools.partial(flash_attn_fwd, q, k, vt_mma, descales=(qs, ks, vs),
                                                 out_dtype=torch.bfloat16, v_transposed=True, v_mma_order=True,
                                                 max_num_imprecise_acc=None, **kw)
                    a, m = fp8_call()[0].float(), mma_call()[0].float()
                    print(f"| {lab} | {d} | {'yes' if causal else 'no'} | {s} | e4m3 mma | max abs diff to key order "
                          f"{(a - m).abs().max().item():.3e} (max abs out {a.abs().max().item():.3e}) | | | |",
                          flush=True)
                    calls += [("e4m3 mma", c, mma_call) for c in list(dict.fromkeys(_first_fp8(real_keep, d, causal) + extra))]
                if args.v_natural:
                    natural = functools.partial(flash_attn_fwd, q, k, v, descales=(qs, ks, vs),
                                                out_dtype=torch.bfloat16, v_transposed=False,
                                                max_num_imprecise_acc=None, **kw)
                    calls += [("e4m3 V", c, natural) for c in list(dict.fromkeys(_first_fp8(real_keep, d, causal) + extra))]
                if args.bf16:
                    calls.append(("bf16", real_keep(d, 2, 90)[0], functools.partial(flash_attn_fwd, qb, kb, vb, **kw)))
                for _ in range(args.repeat):
                    for dtype, cfg, fn in calls:
                        for t in tiles:
                            for licm in licms:
                                for narrow in narrows:
                                    for cap in caps:
                                        ms = run(cfg, t, fn, licm, narrow, cap)
                                        if ms is not None:
                                            print(f"| {lab} | {d} | {'yes' if causal else 'no'} | {s} | {dtype} "
                                                  f"| {cfg} | {t}{['', ' licm on', ' licm off'][licm]}"
                                                  f"{' narrow ' + narrow if narrow else ''}"
                                                  f"{f' maxnreg {cap}' if cap else ''} | {ms:.4f} "
                                                  f"| {flops / ms / 1e9:.0f} |", flush=True)
            del x, q, k, v, vt, qb, kb, vb
            torch.cuda.empty_cache()
        if args.fit:
            _fit(d, heads, tiles, real_keep(d, 1, 90)[0], run, args.label, fp8)
    return 0


def _first_fp8(keep, d, causal) -> list:
    """The FP8 forward's first config at head dim ``d`` for this mask (the causal list since session 15; an
    older tree's keep list may not take the mask)."""
    try:
        return keep(d, 1, 90, causal)[:1]
    except TypeError:
        return keep(d, 1, 90)[:1]


def graph_ms(fn, n: int = 20) -> float:
    """Device ms per call of ``fn``: n calls captured in one CUDA graph (on the harness's capture
    stream, warmed up there first), the graph's replay timed by the harness's timer, divided by n."""
    from harness.perf.timing import capture_stream, time_callable

    stream = capture_stream("cuda")
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(n):
            fn()
    return time_callable(graph.replay, "cuda").median_ms / n


def _copy_configs(head_dims, seqlens, label):
    """The V copy's kernel at each (BLOCK_S, BLOCK_D, warps): device time, GB/s (bytes read + written),
    checked equal to torch's permute first."""
    print("| label | hd | seqlen | BLOCK_S | BLOCK_D | warps | ms (graph) | GB/s |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for d in (int(x) for x in head_dims.split(",")):
        for s in (int(x) for x in seqlens.split(",")):
            _copy_shape(label, d, s)
            torch.cuda.empty_cache()
    return 0


COPY_TILES = [(256, 64, 4), (256, 64, 8), (256, 64, 2), (128, 64, 4), (128, 64, 2), (512, 64, 8), (512, 64, 4),
              (1024, 64, 8), (256, 32, 4), (128, 128, 4), (128, 128, 8),
              (64, 64, 4), (256, 128, 8), (512, 32, 4)]


def _copy_shape(label, d, s):
    import triton

    from kernels.flash_attn import v_layout

    heads = 8 if d == 256 else 2048 // d
    b = max(1, 16384 // s)
    v = torch.randint(0, 256, (b, s, heads, d), dtype=torch.uint8, device="cuda")
    # the forward's copy: keys in the MMA order (s is a multiple of 16 here: no padding)
    want = v_layout.v_keys_contiguous(v, mma_order=True).contiguous()
    dst = torch.empty(b, heads, d, s, dtype=torch.uint8, device="cuda")
    ms = graph_ms(functools.partial(v_layout.v_keys_contiguous, v, mma_order=True))
    print(f"| {label} | {d} | {s} | v_keys_contiguous | {v_layout.BLOCK_S} | {v_layout.BLOCK_D} | {ms:.4f} "
          f"| {2 * v.numel() / ms / 1e6:.0f} |", flush=True)
    for bs, bd, w in COPY_TILES:
        if bd > 2 * d:
            continue
        run = functools.partial(v_layout._transpose_kernel[(triton.cdiv(s, bs), triton.cdiv(d, bd), b * heads)],
                                v, dst, s, d, heads, v.stride(0), v.stride(1), v.stride(2), dst.stride(0),
                                dst.stride(1), dst.stride(2), s, BLOCK_S=bs, BLOCK_D=bd, MMA_ORDER=True, num_warps=w)
        dst.zero_()
        run()
        ok = torch.equal(dst, want)
        ms = graph_ms(run)
        print(f"| {label} | {d} | {s} | {bs} | {bd} | {w} | {ms:.4f} | {2 * v.numel() / ms / 1e6:.0f}"
              f"{'' if ok else ' WRONG'} |", flush=True)


def _fit(d, heads, tiles, cfg, run, label, fp8):
    """Non-causal, seqlen_q 4096 (batch 4): time against seqlen_k; least squares ms = a + b * blocks."""
    from kernels.flash_attn.fwd import flash_attn_fwd
    from kernels.flash_attn.v_layout import v_keys_contiguous

    sq, b = 4096, 4
    g = torch.Generator(device="cpu").manual_seed(1)
    q, qs = fp8.quantize(torch.randn(b, sq, heads, d, generator=g).to("cuda"), "e4m3", heads)
    for t in tiles:
        pts = []
        for sk in (128, 256, 512, 1024, 2048, 4096):
            (k, ks), (v, vs) = (fp8.quantize(torch.randn(b, sk, heads, d, generator=g).to("cuda"), "e4m3", heads)
                                for _ in range(2))
            vt = v_keys_contiguous(v)
            fn = functools.partial(flash_attn_fwd, q, k, vt, softmax_scale=d ** -0.5, causal=False, window_left=-1,
                                   window_right=-1, descales=(qs, ks, vs), out_dtype=torch.bfloat16, v_transposed=True,
                                   max_num_imprecise_acc=None)
            ms = run(cfg, t, fn)
            if ms is not None:
                pts.append((sk / cfg[1], ms))
                print(f"| {label} | {d} | fit | {sq}x{sk} | e4m3 | {cfg} | {t} | {ms:.4f} | |", flush=True)
        if len(pts) >= 2:
            n = len(pts)
            mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
            slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
            a = my - slope * mx
            programs = -(-sq // cfg[0]) // t * b * heads
            print(f"| {label} | {d} | fit | ms = {a:.4f} + {slope:.5f} x key blocks | tiles {t} | {programs} programs "
                  f"| a / programs = {a / programs * 1e6:.2f} ns |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
