"""The in-repo attention launch paths' own Python per call, on any machine (no GPU needed).

    python benchmarks/host_python.py [--calls 20000] [--repeats 7] [--profile] [--json FILE]

The host time of a call (issue 16's budgets: forward 25 us, backward 50 us; ``host_overhead.py`` measures
it on the GPU) is its Python, its allocations and its launches (Triton's C launcher and the driver).
This script isolates the first of those on the machine it runs on: CPU tensors, the kernels' first
launch made by stand-ins (``kernels/standins.py``), so every later call replays real
``kernels.launcher.Launch`` objects into a C entry point that does nothing. Rows: each launch path
(``flash_attn_fwd`` / ``flash_attn_bwd`` with their replay caches, without and with a group split), the
public ``flash_attn_func`` with and without autograd's node (grad inputs; ``torch.no_grad``), a decode step
(``decode_attention``, ``validate=False`` as in a serving loop: the split kernel appending, and the combine), a
replay alone (``Launch.__call__`` of the forward kernel, ``host_overhead.launches_alone``), a replay with four
host-made TMA descriptors against the same kernel's pointers alone (:func:`descriptor_replays`), and this machine's
floor for one
allocation (``torch.empty_like`` of a CPU tensor: on the GPU host a CUDA allocation with its free cost 2-5 us).
Each row is the fastest of ``--repeats`` loops of ``--calls`` calls (microseconds a call): what the
code costs, not what the machine was doing meanwhile. Prints the table last.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from kernels.decode import decode_attention  # noqa: E402
from kernels.decode.interface import CONFIG as DECODE_CONFIG  # noqa: E402
from kernels.flash_attn import flash_attn_func  # noqa: E402
from kernels.flash_attn.bwd import flash_attn_bwd  # noqa: E402
from kernels.flash_attn.fwd import flash_attn_fwd  # noqa: E402
from kernels.standins import cpu_replays  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import launches_alone  # noqa: E402

#: (name, batch, seqlen, query heads, kv heads, head dim, group split): the host_overhead.py cases' head
#: counts (the Python does not depend on the sizes), small sequences.
CASES = (
    ("MQA H16/1 D64, split 4", 1, 16, 16, 1, 64, 4),
    ("GQA H32/8 D64, no split", 1, 16, 32, 8, 64, 1),
)


def fastest_us(fn, calls: int, repeats: int) -> float:
    """Microseconds a call: the fastest of ``repeats`` loops of ``calls`` calls (after a warm-up loop)."""
    for _ in range(max(calls // 10, 10)):
        fn()
    best = float("inf")
    clock = time.perf_counter
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        best = min(best, (clock() - t0) / calls * 1e6)
    return best


def launch_paths(b, s, hq, hk, d, split, dtype=torch.float32):
    """(forward call, backward call, the forward's replay cache, the backward's, (q, k, v)) with the caches filled."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, s, hq, d, generator=g).to(dtype)
    k, v = torch.randn(b, s, hk, d, generator=g).to(dtype), torch.randn(b, s, hk, d, generator=g).to(dtype)
    do = torch.randn(b, s, hq, d, generator=g).to(dtype)
    kw = dict(softmax_scale=d ** -0.5, causal=False, window_left=-1, window_right=-1, split=split)
    fwd_cache, bwd_cache = {}, {}
    fkw = {n: x for n, x in kw.items() if n != "split"}
    out, lse = flash_attn_fwd(q, k, v, **fkw, launches=fwd_cache)
    flash_attn_bwd(do, q, k, v, out, lse, **kw, launches=bwd_cache)
    if "fwd" not in fwd_cache or "plan" not in bwd_cache:
        raise RuntimeError("the first calls left no launches to replay: the stand-ins were not used")
    return (lambda: flash_attn_fwd(q, k, v, **fkw, launches=fwd_cache),
            lambda: flash_attn_bwd(do, q, k, v, out, lse, **kw, launches=bwd_cache), fwd_cache, bwd_cache, (q, k, v))


def descriptor_replays():
    """(name, replay) pairs: one launch of a kernel taking Q, K, V, dO and a host-made TMA descriptor of each (the
    backward's Gluon kernels with ``host_desc``) replayed with the encodings kept per pointer
    (``launcher._Encoded``), the same through Triton's own descriptor wrapper (which encodes every descriptor on every
    launch: its encoder a no-op here, the driver's encoding not counted), and the kernel with the four pointers alone
    (what device-made descriptors pass)."""
    import triton
    from triton.backends.nvidia import driver as nvidia
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels import launcher
    from kernels.standins import StandInKernel

    @triton.jit
    def described(Q, K, V, DO, QD, KD, VD, DOD, n, BLOCK: triton.language.constexpr):
        pass

    @triton.jit
    def pointers(Q, K, V, DO, n, BLOCK: triton.language.constexpr):
        pass

    layout = gl.NVMMASharedLayout.get_default_for([1, 64, 1, 64], gl.bfloat16)
    names = ("Q", "K", "V", "DO")
    tensors = {name: torch.randn(1, 128, 2, 64).to(torch.bfloat16) for name in names}
    descs = {name + "D": TensorDescriptor(t, list(t.shape), [*t.stride()[:3], 1], [1, 64, 1, 64], layout)
             for name, t in tensors.items()}
    signature = {**{n: "*bf16" for n in names}, **{n: "tensordesc<bf16[1, 64, 1, 64]>" for n in descs},
                 "n": "i32", "BLOCK": "constexpr"}
    stand_in = StandInKernel("described", None)

    def encode(arg, meta):  # (the driver's encoding left out: what the wrapper does around it)
        return [object(), *arg.shape, *arg.strides]

    with mock.patch.object(nvidia, "make_tensordesc_arg", encode):
        stand_in.run.launch = nvidia.wrap_handle_tensordesc(lambda *a: None, signature, [{}] * len(descs))
        cached = launcher.launched(described, stand_in, (4, 2), dict(tensors, **descs, n=7, BLOCK=64),
                                   descriptors={name + "D": name for name in names})
        wrapped = launcher.launched(described, stand_in, (4, 2), dict(tensors, **descs, n=7, BLOCK=64),
                                    descriptors={name + "D": name for name in names})
        cached(tensors)  # (its encodings made: the replays below find them)
    if cached._encoded is None:
        raise RuntimeError("the replay did not recognise Triton's descriptor wrapper")
    wrapped._encoded = None
    plain = launcher.launched(pointers, StandInKernel("pointers", None), (4, 2), dict(tensors, n=7, BLOCK=64))

    def through_wrapper():  # (Triton's wrapper looks its encoder up at each call)
        with mock.patch.object(nvidia, "make_tensordesc_arg", encode):
            for _ in range(100):
                wrapped(tensors)

    return [("a replay, 4 host-made descriptors kept encoded per pointer", lambda: cached(tensors), 1),
            ("a replay, 4 host-made descriptors, Triton's wrapper (encoder a no-op), per launch", through_wrapper, 100),
            ("a replay, the same kernel's 4 pointers alone (device-made descriptors)", lambda: plain(tensors), 1)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions per backward")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats: positive counts")
    rows = []
    with cpu_replays():
        for name, *shape in CASES:
            fwd_call, bwd_call, fwd_cache, bwd_cache, (q, k, v) = launch_paths(*shape)
            launches = len(bwd_cache["plan"][3])
            rows.append((f"flash_attn_fwd, {name}", fastest_us(fwd_call, args.calls, args.repeats), 1))
            rows.append((f"flash_attn_bwd, {name}", fastest_us(bwd_call, args.calls, args.repeats), launches))
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.calls):
                    bwd_call()
                prof.disable()
                print(f"## flash_attn_bwd, {name}: cProfile, by own time")
                pstats.Stats(prof).sort_stats("tottime").print_stats(12)
        # the atomic-dQ backward (FLASH_ATTN_BWD=atomic): the fused Gluon route's host path on a GPU (delta's
        # preprocess zeroing dQ's fp32 buffer, the kernel, dQ's cast to bf16; under a group split the split's sum
        # casts dQ in the same launch), the Triton kernel in its place here
        for name, *shape in (CASES[1], CASES[0]):
            with mock.patch.dict(os.environ, FLASH_ATTN_BWD="atomic"):  # (read by the first call; the plan keeps it)
                _, bwd_call, _, bwd_cache, _ = launch_paths(*shape, dtype=torch.bfloat16)
            rows.append((f"flash_attn_bwd, atomic dQ, bf16, {name}", fastest_us(bwd_call, args.calls, args.repeats),
                         len(bwd_cache["plan"][3])))
        # the public function around the forward's launch path: its signature lookup, and autograd's node where a
        # call needs one (an input requiring grad) or the forward alone (no grad mode)
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        flash_attn_func(qg, kg, vg)
        rows.append(("flash_attn_func, inputs requiring grad (autograd node)",
                     fastest_us(lambda: flash_attn_func(qg, kg, vg), args.calls, args.repeats), 1))
        with torch.no_grad():
            rows.append(("flash_attn_func under torch.no_grad()",
                         fastest_us(lambda: flash_attn_func(qg, kg, vg), args.calls, args.repeats), 1))
        # a decode step (Llama-3-8B's heads, batch 32, a 512-token cache, four splits): split (appending the new
        # tokens itself, CONFIG.fuse_append) and combine, or append, split and combine
        g = torch.Generator().manual_seed(1)
        dq, dk, dv = (torch.randn(32, 1, h, 128, generator=g) for h in (32, 8, 8))
        kc, vc = torch.randn(32, 512, 8, 128, generator=g), torch.randn(32, 512, 8, 128, generator=g)
        lens = torch.full((32,), 100, dtype=torch.int32)

        def step():
            return decode_attention(dq, kc, vc, dk, dv, cache_seqlens=lens, validate=False, num_splits=4)

        step()
        rows.append(("decode_attention (B32 H32/8 D128, 4 splits)", fastest_us(step, args.calls, args.repeats),
                     2 if DECODE_CONFIG.fuse_append else 3))
        # the forward's launch replayed with an earlier call's tensors (host_overhead.py's "launches alone")
        alone = launches_alone((fwd_call, fwd_cache))
        rows.append(("a replay alone (Launch.__call__, forward kernel)", fastest_us(alone, args.calls, args.repeats),
                     alone.launches))
        for name, replay, per in descriptor_replays():
            rows.append((name, fastest_us(replay, max(args.calls // per, 1), args.repeats) / per, 1))
    x = torch.empty(1 << 20, dtype=torch.uint8)
    rows.append(("floor: torch.empty_like (CPU, 1 MiB)", fastest_us(lambda: torch.empty_like(x), args.calls,
                                                                    args.repeats), 0))
    if args.json:
        args.json.write_text(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "rows": [
            {"path": r[0], "us_per_call": round(r[1], 3), "launches": r[2]} for r in rows]}, indent=1) + "\n")
    print(f"\nHost Python per call on this machine's CPU (python {sys.version.split()[0]}, torch {torch.__version__}; "
          f"fastest of {args.repeats} loops of {args.calls} calls; launches into a no-op stand-in)\n")
    print("| path | us / call | launches |\n|---|---|---|")
    for name, us, n in rows:
        print(f"| {name} | {us:.2f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
