"""Which torch SDPA backend gives a forward that differs between two identical calls (issue 17's
fuzz, session 10: decode_sdpa on B4-H8/1-Q1-L726-P64-new-D192-scale0.0625-fp16, max |run1 - run2|
1.5e-5). The decode_sdpa adapter's call: one query row per sequence, right-aligned padded keys, a
boolean mask, GQA expanded with repeat_interleave. Each backend is called 50 times on the same inputs.

    python benchmarks/sdpa_determinism_probe.py
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def main() -> None:
    torch.manual_seed(0)
    B, Hq, Sq, L, D = 4, 8, 1, 727, 192
    dev = "cuda"
    for dtype in (torch.float16, torch.bfloat16):
        q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype)
        k = torch.randn(B, Hq, L, D, device=dev, dtype=dtype)
        v = torch.randn(B, Hq, L, D, device=dev, dtype=dtype)
        mask = torch.ones(B, 1, Sq, L, dtype=torch.bool, device=dev)
        mask[1, :, :, :300] = False  # padded rows of shorter sequences
        for name, be in (("default", None), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH),
                         ("flash (no mask)", SDPBackend.FLASH_ATTENTION)):
            m = None if name.startswith("flash") else mask
            try:
                ctx = sdpa_kernel([be]) if be is not None else torch.enable_grad()
                with ctx:
                    outs = [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.0625)
                            for _ in range(50)]
                torch.cuda.synchronize()
                spread = max(float((o.float() - outs[0].float()).abs().max()) for o in outs)
                print(f"{str(dtype)[6:]:9} {name:16} max |run_i - run_0| over 50 calls: {spread:.3g}")
            except RuntimeError as e:
                print(f"{str(dtype)[6:]:9} {name:16} refused: {str(e).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
