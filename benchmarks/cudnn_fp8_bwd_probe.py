"""cuDNN's FP8 backward (``sdpa_fp8_backward``) on the GPU, through the harness: each case checked against
the FP64 oracle (read-back FP8 gradients against the eager FP8 backward's error), and cuDNN's own amax of
dS (``amax_dP``) beside the harness's (``ds_descale`` x the format's top): equal when cuDNN's dS is the
harness's (the gradient of Q K^T, softmax scale folded in; harness.fp8).

    python benchmarks/cudnn_fp8_bwd_probe.py [--cases ID ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from harness import fp8  # noqa: E402
from harness.adapters.cudnn_fp8 import CudnnFP8  # noqa: E402
from harness.cases import case_from_id  # noqa: E402
from harness.check.verify import prepare, verify  # noqa: E402

CASES = [
    "B1-H2-S128x128-D128-e4m3-o8-grad_e4m3-bf16",
    "B1-H2-S128x128-D128-causal-e4m3-o8-grad_e4m3-bf16",
    "B1-H2-S128x128-D128-e4m3-o8-grad_e5m2-bf16",
    "B2-H8/2-S512x512-D128-causal-e4m3-o8-grad_e5m2-bf16",
    "B1-H4-S1000x1000-D128-win128x0-e4m3-o8-grad_e4m3-bf16",
    "B1-H2-S100x300-D128-causal-e4m3-o8-grad_e4m3-bf16",
    "B2-H16-S2048x2048-D128-causal-e4m3-o8-grad_e4m3-bf16",
    "B1-H2-S128x128-D64-e4m3-o8-grad_e4m3-bf16",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=CASES)
    args = ap.parse_args(argv)
    import cudnn

    print(f"cudnn frontend {cudnn.__version__}, backend {cudnn.backend_version()}", flush=True)
    rows = []
    for cid in args.cases:
        case = case_from_id(cid)
        adapter = CudnnFP8()
        base = prepare(case, device="cuda")
        r = verify(adapter, case, baseline=base)
        ratios = " ".join(f"{t.name} {t.ratio:.2f}{'' if t.passed else '!'}" for t in r.tensors)
        amax = getattr(adapter, "last_amaxes", None)  # set by the backward only
        ds = base.inputs.ds_descale
        ours = float(ds[0, 0]) * fp8.fmt(case.fp8_grad)[1] if ds is not None else float("nan")
        cud = float(amax[3]) if amax is not None and r.status != "unsupported" else float("nan")
        det = next((p.status for p in r.properties if p.name == "determinism"), "-")
        rows.append(f"| {cid} | {r.status} | {ratios} | {cud:.4g} | {ours:.4g} | {cud / ours:.3f} | {det} |")
        print(rows[-1], "" if r.status == "pass" else r.reason[:300], flush=True)
    print("\n| case | status | error / reference (! failed) | cuDNN amax_dP | harness dS amax | ratio | determinism |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
