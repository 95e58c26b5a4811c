"""The program `device_show.sh pipes` profiles under Nsight Compute: one shape's in-repo forward, run a few times, so
ncu can read one launch of the Gluon forward kernel's pipe counters (which of MUFU / FMA / ALU / tensor pipes and
issue slots bind the softmax). Session 56 measured the cubic exp2 share lose 0.86-0.90x where a MUFU count had
predicted a gain; this probe's counters, with and without ``--exp2-every``, say which unit the share moved the
bottleneck to.

    python benchmarks/pipes_probe.py --shape 4,4096,32,32 --head-dim 64 [--causal] [--softcap 50] [--exp2-every 4]
                                     [--backward]

``--backward`` (session 58): one forward, then ``--calls`` backwards of it (the dQ and dK / dV kernels: ncu picks its
launch by `device_show.sh pipes`' kernel regex, NAME=REGEX in PIPES).

``--check`` prints the output's largest error against the FP64 oracle (harness.oracle) before the profiled calls;
``--calls`` (default 3) forwards in all, the first of which compiles. Without a GPU it exits 2 with the reason."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from config_arg import parse_shape  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", type=parse_shape, required=True, help="B,S,HQ,HK")
    p.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--softcap", type=float, default=0.0)
    p.add_argument("--exp2-every", type=int, default=0, help="one of N exponentials by the cubic (0: none)")
    p.add_argument("--backward", action="store_true", help="profile the backward: one forward, then --calls backwards")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--check", action="store_true", help="compare the output with the FP64 oracle first")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error("--calls must be at least 1")
    if args.softcap < 0:
        p.error("--softcap must be 0 (none) or positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("pipes_probe: no CUDA device (the profiled kernel is the sm90 Gluon forward)", file=sys.stderr)
        return 2
    from kernels.flash_attn import configs, flash_attn_func

    b, s, hq, hk = args.shape
    d = args.head_dim
    dims = (d, d, bool(args.softcap))
    if args.exp2_every:  # the route gives this cell's launch exp2_every (configs.FWD_GLUON_EXP2_EVERY)
        configs.FWD_GLUON_EXP2_EVERY = {**configs.FWD_GLUON_EXP2_EVERY, dims: args.exp2_every}
    else:
        configs.FWD_GLUON_EXP2_EVERY = {k: v for k, v in configs.FWD_GLUON_EXP2_EVERY.items() if k != dims}
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (hq, hk, hk))
    kw = dict(causal=args.causal, softcap=args.softcap)
    route = configs.gluon_ws_fwd(q, k, v, causal=args.causal, window_left=-1, window_right=0 if args.causal else -1,
                                 softcap=args.softcap, varlen=False, fp8=False)
    print(f"route: {route if route is not None else 'the Triton forward (no Gluon launch to profile)'}")
    if args.check:
        from harness.oracle import softmax_attention

        ref = softmax_attention(q[:1], k[:1], v[:1], causal=args.causal, softcap=args.softcap).out  # (batch 1)
        err = (flash_attn_func(q, k, v, **kw)[:1].double() - ref).abs().max().item()
        print(f"max |out - oracle| over batch 0: {err:.3e} (the GPU tests hold the tolerance rule)")
    if args.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = flash_attn_func(q, k, v, **kw)
        grad = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=gen)
        for _ in range(args.calls):
            out.backward(grad, retain_graph=True)
    else:
        for _ in range(args.calls):
            flash_attn_func(q, k, v, **kw)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
