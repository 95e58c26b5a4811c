"""Random cases skewed to the edges, each checked against the oracle: the fuzzer's library.

:func:`draw` makes one case from a :class:`random.Random`: lengths 0, 1, a block size +- 1 or a
prime as often as a plain random length; Sq > Sk and Sq < Sk; windows that leave rows with no key;
GQA ratios 1..16; the head dims kernels are built for; varlen batches with empty sequences; the
scale omitted or passed; non-contiguous layouts; positional and out-only (return_lse off) calls; extreme softcaps; linear attention with strong and
extreme decay; decode steps over contiguous and paged caches (pages of 16..64, one that is not a
power of two), ragged lengths, 1-8 new tokens appended or none. :class:`Fuzzer` keeps a case only where the backend's ``supports()`` accepts it (the
backend's declared support), verifies it (:class:`harness.accept.remote.RemoteVerifier`: the
candidate in a child, the judge here) and records every result. A run is a function of its seed:
the same seed draws the same cases in the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from harness.cases import LAYOUTS, Case, DecodeCase, LinearCase, SoftmaxCase

#: Lengths that sit on kernels' edges: empty, one, tile sizes and their neighbours, primes.
EDGE_LENGTHS = (0, 1, 2, 3, 7, 13, 15, 16, 17, 31, 32, 33, 61, 63, 64, 65, 97, 127, 128, 129)
#: Head dims kernels are written for (a backend that does not take one says so in supports()).
HEAD_DIMS = (8, 16, 32, 48, 64, 80, 96, 128, 192, 256)
GQA_RATIOS = (1, 1, 2, 3, 4, 8, 16)
SOFTCAPS = (0.5, 5.0, 30.0, 50.0)
SCALES = (1.0, 0.0625, 0.3)
#: Decode: page sizes (0: a contiguous cache) and new tokens per step (speculative decoding: 2-8).
PAGE_SIZES = (0, 16, 16, 32, 48, 64)
NEW_TOKENS = (1, 1, 1, 2, 4, 8)
#: Log-decay strengths of linear cases: n = 0.05 is extreme (exp of large cumulative sums).
GATE_N = (0.05, 0.1, 1.0, 10.0)


@dataclass(frozen=True)
class Limits:
    """Size limits of the drawn cases (CPU runs keep them small: the oracle and the interpreter)."""

    max_seqlen: int = 160
    max_heads: int = 16
    max_batch: int = 3
    max_head_dim: int = 64


CPU_LIMITS = Limits()
GPU_LIMITS = Limits(max_seqlen=2048, max_heads=32, max_batch=4, max_head_dim=256)


def _length(rng: random.Random, limits: Limits) -> int:
    if rng.random() < 0.5:
        return rng.choice([x for x in EDGE_LENGTHS if x <= limits.max_seqlen])
    return rng.randint(1, limits.max_seqlen)


def draw(rng: random.Random, family: str, dtypes: list[str], limits: Limits = CPU_LIMITS) -> Case:
    """One random case of ``family`` (see the module docstring)."""
    dtype = rng.choice(dtypes)
    layout = rng.choice(LAYOUTS[1:]) if rng.random() < 0.15 else "contiguous"
    scale = rng.choice(SCALES) if rng.random() < 0.25 else None
    if family == "linear":
        d_k = rng.choice([d for d in (16, 32, 64, 128) if d <= limits.max_head_dim])
        d_v = d_k if rng.random() < 0.7 else rng.choice([d for d in (16, 32, 64, 128) if d <= limits.max_head_dim])
        return LinearCase(
            rng.randint(1, limits.max_batch), rng.randint(1, min(4, limits.max_heads)), max(1, _length(rng, limits)),
            d_k, d_v, gate=rng.choice(("none", "g", "g_gamma")), gate_n=rng.choice(GATE_N),
            initial_state=rng.random() < 0.5, grad_final_state=rng.random() < 0.5, dtype=dtype, scale=scale,
            layout="contiguous" if layout == "qkvpacked" else layout,
        )
    if family == "decode":
        return _draw_decode(rng, dtype, scale, limits)
    ratio = rng.choice(GQA_RATIOS)
    hk = rng.randint(1, max(1, min(4, limits.max_heads // ratio)))
    hq = hk * ratio
    d = rng.choice([x for x in HEAD_DIMS if x <= limits.max_head_dim])
    d_v = d if rng.random() < 0.8 else rng.choice([x for x in HEAD_DIMS if x <= limits.max_head_dim])
    causal = rng.random() < 0.5
    window = (-1, -1)
    if rng.random() < 0.25:
        left = rng.choice((-1, 0, 1, 3, 8, rng.randint(0, limits.max_seqlen)))
        right = 0 if causal else rng.choice((-1, 0, 1, 3, 8))
        window = (left, right) if (left, right) != (-1, -1) else (0, 0)
    softcap = rng.choice(SOFTCAPS) if rng.random() < 0.15 else 0.0
    if rng.random() < 0.15:  # varlen: 1..5 sequences, empty ones included
        lens = tuple((_length(rng, limits), _length(rng, limits)) for _ in range(rng.randint(1, 5)))
        return SoftmaxCase(len(lens), hq, hk, 0, 0, d, d_v=d_v, causal=causal, window=window, softcap=softcap,
                           dtype=dtype, varlen=lens, scale=scale,
                           layout="contiguous" if layout == "qkvpacked" else layout)
    batch = rng.randint(1, limits.max_batch)
    sq = _length(rng, limits)
    sk = sq if rng.random() < 0.4 else _length(rng, limits)
    if layout == "qkvpacked" and (hq != hk or d != d_v or sq != sk):
        layout = "transposed"
    call = "positional" if rng.random() < 0.1 else "keyword"  # the call forms: by position, out alone
    return_lse = rng.random() >= 0.1
    return SoftmaxCase(batch, hq, hk, sq, sk, d, d_v=d_v, causal=causal, window=window, softcap=softcap, dtype=dtype,
                       scale=scale, layout=layout, call=call, return_lse=return_lse)


def _draw_decode(rng: random.Random, dtype: str, scale, limits: Limits) -> DecodeCase:
    ratio = rng.choice(GQA_RATIOS)
    hk = rng.randint(1, max(1, min(4, limits.max_heads // ratio)))
    d = rng.choice([x for x in HEAD_DIMS if x <= limits.max_head_dim])
    d_v = d if rng.random() < 0.8 else rng.choice([x for x in HEAD_DIMS if x <= limits.max_head_dim])
    causal = rng.random() < 0.85  # decoding is causal; not causal: the new tokens see each other
    window = (-1, -1)
    if rng.random() < 0.2:
        window = (rng.choice((0, 1, 3, 8, rng.randint(0, limits.max_seqlen))), 0 if causal else rng.choice((-1, 0, 2)))
    return DecodeCase(
        rng.randint(1, limits.max_batch + 2), hk * ratio, hk, rng.choice(NEW_TOKENS), _length(rng, limits), d,
        d_v=d_v, page_size=rng.choice(PAGE_SIZES), ragged=rng.random() < 0.7, append=rng.random() < 0.8,
        causal=causal, window=window, softcap=rng.choice(SOFTCAPS) if rng.random() < 0.15 else 0.0,
        dtype=dtype, scale=scale,
    )


@dataclass
class Drawn:
    """One fuzz case: its index, the case, the input seed, and (after verification) the result."""

    index: int
    case: Case
    seed: int


def cases_for(adapter, *, family: str, dtypes: list[str], device, seed: int, limits: Limits,
              max_tries: int = 200):
    """Endless stream of (index, case, input seed, rejected draws) inside ``adapter.supports``; a
    function of ``seed`` alone."""
    rng = random.Random(seed)
    index = 0
    while True:
        rejected = 0
        for _ in range(max_tries):
            case = draw(rng, family, dtypes, limits)
            if not adapter.supports(case, device):
                break
            rejected += 1
        else:
            raise ValueError(f"{adapter.name}: no drawn {family} case in {max_tries} is supported "
                             f"(dtypes {', '.join(dtypes)}); is it a {family} backend for this device?")
        yield Drawn(index, case, seed * 1_000_003 + index), rejected
        index += 1
