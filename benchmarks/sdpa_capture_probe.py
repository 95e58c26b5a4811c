"""The torch SDPA call an adapter makes, captured and replayed with one thing changed at a time
(issue 17: decode_sdpa's forward differs between identical calls in 8-12 of 19 on the H100 with
cuDNN, while a torch-only script of the "same" call saw 0 of 19: something about the real call's
tensors matters).

    python benchmarks/sdpa_capture_probe.py [--backend decode_sdpa] [--case ID] [--seed N]
        [--calls 20] [--save DIR]

Runs the adapter once on the case's inputs with ``scaled_dot_product_attention`` wrapped to record
its arguments, then calls SDPA ``--calls`` times per variant and prints how many calls differ
bitwise from the variant's first: the captured tensors as they are; cloned (new addresses);
made contiguous; each of q, k, v replaced by fresh randn of the same shape and strides; the mask
dropped, or replaced by all-True; q, k, v's statistics printed. ``--save DIR`` writes the captured
tensors (``torch.save``) for a standalone repro.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from repeat_probe import _fixed_inputs  # noqa: E402  (the candidate's inputs as the check lays them out)
from replay_case import _SDPA, _sdpa_context  # noqa: E402  (one SDPA backend switch for the probes)

from harness.adapters import registry  # noqa: E402
from harness.cases import case_from_id  # noqa: E402
from harness.check import verify as V  # noqa: E402

CASE = "B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16"


def capture(adapter, case, inputs) -> dict:
    """The keyword form of the one SDPA call ``adapter.run`` makes on ``inputs``."""
    seen = []
    real = F.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, **kw):
        seen.append(dict(query=query, key=key, value=value, attn_mask=attn_mask, **kw))
        return real(query, key, value, attn_mask=attn_mask, **kw)

    F.scaled_dot_product_attention = recording
    try:
        passed = _fixed_inputs(case, inputs)
        with torch.no_grad():
            adapter.run(case, **passed)
    finally:
        F.scaled_dot_product_attention = real
    if len(seen) != 1:
        raise SystemExit(f"expected one SDPA call, saw {len(seen)}")
    return seen[0]


def like(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fresh randn values with ``t``'s shape, dtype, device and strides."""
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    return out


def spread(args: dict, calls: int) -> str:
    outs = [F.scaled_dot_product_attention(**args) for _ in range(calls)]
    torch.cuda.synchronize()
    diffs = [float((o.double() - outs[0].double()).abs().max()) for o in outs[1:]]
    differ = sum(not torch.equal(o, outs[0]) for o in outs[1:])
    return f"{differ}/{len(diffs)} differ, max |diff| {max(diffs, default=0):.3g}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="decode_sdpa")
    p.add_argument("--case", default=CASE)
    p.add_argument("--seed", type=int, default=202000607)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--sdpa", default="cudnn", choices=sorted(_SDPA), help="SDPA backends allowed (default: all)")
    p.add_argument("--save", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("sdpa_capture_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    case = case_from_id(args.case)
    inputs = V.prepare(case, seed=args.seed, device="cuda").inputs
    got = capture(registry.get(args.backend), case, inputs)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    for n in ("query", "key", "value", "attn_mask"):
        t = got[n]
        if t is None:
            continue
        stats = "" if t.dtype == torch.bool else (f", |x| max {float(t.abs().max()):.3g}, "
                                                  f"mean {float(t.float().mean()):.3g}")
        print(f"  {n}: {tuple(t.shape)} strides {t.stride()} {t.dtype} offset {t.storage_offset()} "
              f"ptr%1024 {t.data_ptr() % 1024}{stats}" + (f", all True: {bool(t.all())}" if t.dtype == torch.bool else ""))
    print(f"  other arguments: { {k: v for k, v in got.items() if k not in ('query', 'key', 'value', 'attn_mask')} }")
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        torch.save({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in got.items()},
                   Path(args.save) / "sdpa_args.pt")
    ctx = _sdpa_context(args.sdpa)
    gen = torch.Generator().manual_seed(0)
    variants = {
        "captured": got,
        "cloned": {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in got.items()},
        "contiguous": {k: (v.contiguous().clone() if isinstance(v, torch.Tensor) else v) for k, v in got.items()},
        "q randn": dict(got, query=like(got["query"], gen)),
        "k randn": dict(got, key=like(got["key"], gen)),
        "v randn": dict(got, value=like(got["value"], gen)),
        "q, k, v randn": dict(got, query=like(got["query"], gen), key=like(got["key"], gen),
                              value=like(got["value"], gen)),
        "no mask": dict(got, attn_mask=None),
        "mask all True": dict(got, attn_mask=torch.ones_like(got["attn_mask"])) if got["attn_mask"] is not None
        else None,
    }
    with ctx:
        for name, a in variants.items():
            if a is None:
                continue
            try:
                print(f"{args.sdpa:7} {name:16}: {spread(a, args.calls)}", flush=True)
            except RuntimeError as e:
                print(f"{args.sdpa:7} {name:16}: refused: {str(e).splitlines()[0][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
