"""FLOP and byte models of one attention call: what a TFLOP/s or GB/s figure divides by.

Conventions (one multiply-add = 2 FLOPs; only matrix products are counted, as in the FA papers):

Softmax attention, per query head and per *visible* (query, key) pair (``case.visible_pairs()``
counts causal masks, local windows, seqlen_q != seqlen_k and varlen exactly):

* forward: S = Q K^T (2 d) and O = P V (2 d_v): ``2 (d + d_v)`` per pair;
* backward: recompute S (2 d), dV = P^T dO (2 d_v), dP = dO V^T (2 d_v), dQ = dS K (2 d),
  dK = dS^T Q (2 d): ``2 (3 d + 2 d_v)`` per pair, i.e. exactly :data:`SOFTMAX_BWD_FACTOR` (2.5)
  times the forward when d_v == d (the FA papers' "backward = 2.5x forward");
* GQA / MQA: FLOPs are per *query* head (sharing K/V saves bytes, not arithmetic).

The FA papers (and ``GPU.md``) write causal as half of ``4 B H N^2 D``; the exact count is
``N (N + 1) / 2`` pairs per head, 0.1% more at N = 512 and 0.003% at 16k.

Decode (attention over a KV cache): the forward's ``2 (d + d_v)`` per visible pair, each sequence's
keys being its cache plus the appended tokens (``DecodeCase.visible_pairs``); decode is bound by
memory, so its figure of merit is GB/s against :func:`decode_bytes`.

Linear attention (FLA's chunked simple_gla, chunk :data:`LINEAR_CHUNK`): see
:func:`linear_flops`; the model counts the chunk algorithm's matrix products as executed.

Bytes are the fewest a kernel must move through device memory: every input read once and every
output written once (the floor of the roofline), never what a particular kernel moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.adapters.eager import LINEAR_CHUNK
from harness.cases import Case, DecodeCase, LinearCase, SoftmaxCase, visible_range

MODES = ("fwd", "bwd", "fwd+bwd")

#: Backward / forward FLOPs of softmax attention when d_v == d: 5 matrix products of the
#: backward (S recomputed, dV, dP, dQ, dK) against the forward's 2. Kept for reference and the
#: tests; :func:`softmax_flops` counts the products one by one, so d_v != d is exact too.
SOFTMAX_BWD_FACTOR = 2.5

# LINEAR_CHUNK (imported above): chunk length of the linear-attention model. FLA's chunk kernels
# use 64; the one number lives with the eager chunked reference, which rounds like them.

#: Backward / forward FLOPs of chunked linear attention. Forward per chunk: A = Q K^T, A V,
#: Q S, K^T V. Backward: dA = dO V^T, dV_intra = A^T dO, dQ_intra = dA K, dK_intra = dA^T Q
#: (2x the forward's C x C products) and dQ_inter = dO S^T, dS = Q^T dO, dK_inter = V dS^T,
#: dV_inter = K dS (2x the forward's state products). Recomputing A and the chunk states in the
#: backward (FLA does) is not counted: the rate is a lower bound of the arithmetic executed.
LINEAR_BWD_FACTOR = 2.0

#: Bytes of the softmax log-sum-exp (float32) and of linear-attention gates / states (float32).
FP32_BYTES = 4


@dataclass(frozen=True)
class Work:
    """FLOPs and minimum bytes of one call in one mode."""

    flops: float
    bytes: float


def _itemsize(case: Case) -> int:
    return case.torch_dtype.itemsize


def softmax_flops(case: SoftmaxCase, mode: str = "fwd") -> float:
    """Matrix-product FLOPs of softmax attention on ``case`` in ``mode`` (see module docstring)."""
    pairs = case.visible_pairs() * case.heads_q
    fwd = 2.0 * pairs * (case.d + case.d_v)
    bwd = 2.0 * pairs * (3 * case.d + 2 * case.d_v)
    return _by_mode(fwd, bwd, mode)


def linear_flops(case: LinearCase, mode: str = "fwd") -> float:
    """Matrix-product FLOPs of chunked linear attention (chunk C = :data:`LINEAR_CHUNK`).

    Forward, per head and per token: intra-chunk ``Q K^T`` and ``A V`` over full C x C tiles
    (the chunk kernels compute the masked upper half too): ``2 C (K + V)``; inter-chunk ``Q S``
    and the state update ``K^T V``: ``4 K V``. Gates, decays and the softmax-free elementwise work
    are not counted. Backward = :data:`LINEAR_BWD_FACTOR` x forward.
    """
    c = LINEAR_CHUNK
    tokens = case.batch * case.heads * case.seqlen
    fwd = tokens * (2.0 * c * (case.d_k + case.d_v) + 4.0 * case.d_k * case.d_v)
    return _by_mode(fwd, LINEAR_BWD_FACTOR * fwd, mode)


def decode_flops(case: DecodeCase, mode: str = "fwd") -> float:
    """Matrix-product FLOPs of one decode step (forward only: a ValueError for a backward mode)."""
    if mode != "fwd":
        raise ValueError(f"mode: decode is forward-only, got {mode!r}")
    return 2.0 * case.visible_pairs() * case.heads_q * (case.d + case.d_v)


def _by_mode(fwd: float, bwd: float, mode: str) -> float:
    if mode == "fwd":
        return fwd
    if mode == "bwd":
        return bwd
    if mode == "fwd+bwd":
        return fwd + bwd
    raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")


def softmax_bytes(case: SoftmaxCase, mode: str = "fwd") -> float:
    """Fewest bytes moved: forward reads q, k, v and writes out and lse; backward reads q, k, v,
    out, dout, lse and writes dq, dk, dv; fwd+bwd is their sum (out and lse go through memory)."""
    e = _itemsize(case)
    ein = 1 if getattr(case, "fp8", "") else e  # FP8 inputs: one byte an element, out in the case's dtype
    if case.is_varlen:
        tq = sum(a for a, _ in case.varlen)
        tk = sum(b for _, b in case.varlen)
    else:
        tq, tk = case.batch * case.seqlen_q, case.batch * case.seqlen_k
    q = tq * case.heads_q * case.d * ein
    k = tk * case.heads_k * case.d * ein
    v = tk * case.heads_k * case.d_v * ein
    o = tq * case.heads_q * case.d_v * e
    lse = tq * case.heads_q * FP32_BYTES
    fwd = q + k + v + o + lse
    bwd = (q + k + v + o + o + lse) + (q + k + v)
    return _by_mode(fwd, bwd, mode)


def linear_bytes(case: LinearCase, mode: str = "fwd") -> float:
    """Fewest bytes moved: forward reads q, k, v, gates and h0 and writes o and the final state;
    backward reads q, k, v, gates, h0, do, dhT and writes dq, dk, dv, dg and dh0."""
    e = _itemsize(case)
    B, T, H, K, V = case.batch, case.seqlen, case.heads, case.d_k, case.d_v
    qk = 2 * B * T * H * K * e
    v = B * T * H * V * e
    o = B * T * H * V * e
    gate = {"none": 0, "g": B * T * H * FP32_BYTES, "g_gamma": H * FP32_BYTES}[case.gate]
    state = B * H * K * V * FP32_BYTES
    h0 = state if case.initial_state else 0
    dht = state if case.grad_final_state else 0
    fwd = qk + v + gate + h0 + o + state
    bwd = (qk + v + gate + h0 + o + dht) + (qk + v + gate + h0)
    return _by_mode(fwd, bwd, mode)


def decode_bytes(case: DecodeCase, mode: str = "fwd") -> float:
    """Fewest bytes moved by one decode step: read q, every cached key and value some query of its
    sequence sees (not the unused slots of a page, nor keys a window hides), the new k, v (read,
    then written into the cache), cache_seqlens and the page table (int32); write out and lse."""
    if mode != "fwd":
        raise ValueError(f"mode: decode is forward-only, got {mode!r}")
    e = _itemsize(case)
    B, Sq, Hq, Hk, D, Dv = case.batch, case.seqlen_q, case.heads_q, case.heads_k, case.d, case.d_v
    cached = 0
    for n, total in zip(case.cache_seqlens, case.kv_lengths):
        ranges = [visible_range(i, Sq, total, causal=case.causal, window=case.window) for i in range(Sq)]
        lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
        cached += max(0, min(hi, n) - lo)  # the cached part of the keys the step sees
    q = B * Sq * Hq * D * e
    cache = cached * Hk * (D + Dv) * e
    new = 2 * B * Sq * Hk * (D + Dv) * e if case.append else 0
    tables = B * 4 + (B * case.pages_per_seq * 4 if case.paged else 0)
    out = B * Sq * Hq * Dv * e + B * Hq * Sq * FP32_BYTES
    return float(q + cache + new + tables + out)


def _models(case: Case):
    """(FLOP model, byte model) of the case's family."""
    models = {SoftmaxCase: (softmax_flops, softmax_bytes), LinearCase: (linear_flops, linear_bytes),
              DecodeCase: (decode_flops, decode_bytes)}
    if type(case) not in models:
        raise TypeError(f"case: expected SoftmaxCase, LinearCase or DecodeCase, got {type(case).__name__}")
    return models[type(case)]


def flops(case: Case, mode: str = "fwd") -> float:
    """FLOPs of ``case`` in ``mode`` ("fwd", "bwd", "fwd+bwd"; decode: "fwd") for any family."""
    return _models(case)[0](case, mode)


def min_bytes(case: Case, mode: str = "fwd") -> float:
    """Fewest bytes through device memory of ``case`` in ``mode`` for any family."""
    return _models(case)[1](case, mode)


def work(case: Case, mode: str = "fwd") -> Work:
    return Work(flops(case, mode), min_bytes(case, mode))


def working_set_bytes(case: Case) -> int:
    """Bytes one forward call reads and writes (inputs and outputs): decides whether the working set
    fits in L2 (then the timer flushes L2 between repetitions and rotates input sets)."""
    return int(min_bytes(case, "fwd"))
