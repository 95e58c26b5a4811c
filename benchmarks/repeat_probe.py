"""What makes a backend's forward differ between two identical calls inside the harness and not
outside it (issue 17: decode_sdpa on B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16 differed in 10 of
20 determinism checks on the H100, while torch-only repros of the same call saw 0 of 19).

    python benchmarks/repeat_probe.py --backend decode_sdpa --seed 202000607 \\
        --case 'B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16' [--calls 20] [--sdpa default,cudnn]

The harness's determinism check runs the candidate twice, each time on fresh copies of the inputs
(new addresses), in deterministic mode with uninitialised memory filled with NaN and the caching
allocator's free memory poisoned. This probe takes those apart, ``--calls`` forwards per setting,
and prints for each how many differ bitwise from the setting's first and by how much:

- ``harness``: the check's own path (fresh copies, poisoned), as ``verify`` runs it;
- ``fresh copies``: fresh copies each call, no poisoning, no deterministic mode;
- ``same inputs``: one set of copies called every time (the torch-only repros' form);
- ``same inputs, poisoned``: one set of copies, every call inside the harness's poisoned context.

A setting that differs where its neighbour does not names the cause.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from replay_case import _SDPA, _sdpa_context  # noqa: E402  (one SDPA backend switch for the probes)

from harness.adapters import registry  # noqa: E402
from harness.cases import DecodeCase, case_from_id  # noqa: E402
from harness.check import verify as V  # noqa: E402


def _fixed_inputs(case, inputs) -> dict:
    """One set of the candidate's inputs, laid out as _run_once lays them out."""
    originals = V._run_inputs(case, inputs)
    passed = V.apply_layout(case, {n: t.detach().clone() for n, t in originals.items()})
    if isinstance(case, DecodeCase):
        passed.update({n: originals[n].clone() for n in ("k_cache", "v_cache")})
    return passed


def _outs(adapter, case, inputs, setting: str, calls: int) -> list[torch.Tensor]:
    outs = []
    if setting in ("harness", "fresh copies"):
        for _ in range(calls):
            run = V._run_once(adapter, case, inputs, want_grad=False, poison=setting == "harness")
            outs.append(run.tensors["out"].clone())
        return outs
    fixed = _fixed_inputs(case, inputs)
    caches = {n: fixed[n].clone() for n in ("k_cache", "v_cache") if n in fixed}
    for _ in range(calls):
        for n, t in caches.items():  # a decode call writes its new tokens into the cache: the same start each call
            fixed[n].copy_(t)
        ctx = V.poisoned_memory(inputs.q.device) if setting.endswith("poisoned") else contextlib.nullcontext()
        with ctx, torch.no_grad():
            out = adapter.run(case, **fixed)
        outs.append(V._output_tensors(case, out)["out"].clone())
    return outs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--sdpa", default="default,cudnn", help=f"comma-separated subset of {sorted(_SDPA)}")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    case = case_from_id(args.case)
    adapter = registry.get(args.backend)
    baseline = V.prepare(case, seed=args.seed, device=args.device)
    print(f"{args.backend} on {case.id}, seed {args.seed}, {args.calls} calls per setting; torch {torch.__version__}"
          + (f", cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}" if torch.cuda.is_available()
             else ""))
    for s in args.sdpa.split(","):
        for setting in ("harness", "fresh copies", "same inputs", "same inputs, poisoned"):
            try:
                with _sdpa_context(s):
                    outs = _outs(adapter, case, baseline.inputs, setting, args.calls)
            except RuntimeError as e:
                print(f"{s:9} {setting:22}: refused: {str(e).splitlines()[0][:100]}")
                break
            diffs = [float((o.double() - outs[0].double()).abs().max()) for o in outs[1:]]
            differ = sum(d != 0 or not torch.equal(o, outs[0]) for d, o in zip(diffs, outs[1:]))
            print(f"{s:9} {setting:22}: {differ}/{len(diffs)} calls differ from the first, "
                  f"max |diff| {max(diffs, default=0):.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
