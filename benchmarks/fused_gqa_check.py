"""Session 34 ad-hoc: why the fused backward loses on GQA (Llama-3-8B 32/8 8k causal). Times the whole backward
(FLASH_ATTN_BWD=fused vs the default route) at group splits 1, 2, 4, and MHA with the same query heads."""
import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from harness.perf.timing import time_callable  # noqa: E402
from kernels.flash_attn import bwd  # noqa: E402
from kernels.flash_attn.fwd import flash_attn_fwd  # noqa: E402

os.environ["FLASH_ATTN_AUTOTUNE"] = "1"
for label, b, s, hq, hk in (("Llama-3-8B", 1, 8192, 32, 8), ("MHA 32/32", 1, 8192, 32, 32),
                            ("Llama-3-70B", 1, 4096, 64, 8)):
    g = torch.Generator(device="cpu").manual_seed(0)
    q, do = (torch.randn(b, s, hq, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(b, s, hk, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
    out, lse = flash_attn_fwd(q, k, v, softmax_scale=128 ** -0.5, causal=True, window_left=-1, window_right=0)
    for mode in ("", "fused"):
        for split in (1, 2, 4):
            if hq == hk and split > 1:
                continue
            os.environ["FLASH_ATTN_BWD"] = mode
            fn = functools.partial(bwd.flash_attn_bwd, do, q, k, v, out, lse, softmax_scale=128 ** -0.5, causal=True,
                                   window_left=-1, window_right=0, split=split, launches={})
            fn()
            torch.cuda.synchronize()
            ms = time_callable(fn, "cuda").median_ms
            print(f"| {label} B{b} S{s} H{hq}/{hk} causal | {mode or 'routed'} | split {split} | {ms:.4f} |", flush=True)
