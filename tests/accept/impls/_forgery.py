"""What the forging candidates share: an answer that is noise.

Each forging module (``forges_*.py``) returns :func:`noise` and, on import, replaces some of the
harness's judging code in its own process with versions that say "pass". While the judge ran in
the candidate's process (before issue 15) each of them was ACCEPTED; the judge, now in the parent,
must reject each of them for the numbers.

The noise is seeded from the inputs' bytes (deterministic: it passes the determinism check, and
differs between inputs: it passes the caching check), is 0 with lse -inf on the rows that see no
key (the masked-row convention), and is tied to every input's autograd graph with weight 0 (every
gradient exists, and is 0).
"""

from __future__ import annotations

import hashlib
import math

import torch


def noise_like(shape, dtype, device, key: bytes) -> torch.Tensor:
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)


def _key(*tensors) -> bytes:
    return b"".join(t.detach().float().cpu().numpy().tobytes() for t in tensors)


def noise(q, k, v, *, causal=False, **kw):
    """flash-attn's signature -> (out (B, Sq, Hq, Dv), lse (B, Hq, Sq)) of noise."""
    B, Sq, Hq, _ = q.shape
    Sk = k.shape[1]
    out = noise_like((B, Sq, Hq, v.shape[-1]), torch.float32, q.device, _key(q, k, v))
    lse = torch.full((B, Hq, Sq), math.log(max(Sk, 1)), device=q.device)
    dead = max(Sq - Sk, 0) if causal else 0  # bottom-right causal: the first Sq - Sk rows see no key
    out[:, :dead] = 0.0
    lse[:, :, :dead] = -math.inf
    tie = (q.sum() + k.sum() + v.sum()) * 0.0
    return (out + tie).to(q.dtype), lse
