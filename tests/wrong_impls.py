"""Deliberately wrong attention implementations: each one carries one bug seen in real kernels.

The suite asserts that the verification runner rejects every one of them *for the right reason*
(``EXPECTED`` names the tensor or property that must fail). They are adapters, so they go through
exactly the path a vendor kernel takes. Not registered: tests pass the instances directly.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from harness.adapters.base import LinearAdapter, LinearOutput, SoftmaxAdapter, SoftmaxOutput, default_scale
from harness.adapters.decode import DecodeEagerAdapter, write_new_tokens
from harness.adapters.eager import EagerFP8Adapter, eager_attention, eager_linear_attention


def _attention(q, k, v, *, causal, scale, window=(-1, -1), mask_shift=0, gqa="interleave", acc_dtype=None):
    """Materialised attention, fp32 softmax, with the knobs the bugs below turn.

    mask_shift: the causal diagonal moves right by this many keys (off-by-one);
    gqa: "interleave" (query head h reads kv head h // G, right) or "repeat" (h % Hk, wrong);
    acc_dtype: when set, P V is accumulated one key at a time in this dtype.
    """
    B, Sq, Hq, _ = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    G = Hq // Hk
    if G > 1:
        if gqa == "interleave":
            k, v = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)
        else:
            k, v = k.repeat(1, 1, G, 1), v.repeat(1, 1, G, 1)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k).float() * scale
    i = torch.arange(Sq).unsqueeze(1) + (Sk - Sq)
    j = torch.arange(Sk).unsqueeze(0)
    mask = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        mask &= j <= i + mask_shift
    if window[0] >= 0:
        mask &= j >= i - window[0]
    if window[1] >= 0 and not causal:
        mask &= j <= i + window[1]
    s = s.masked_fill(~mask.to(s.device), -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    if acc_dtype is None:
        return torch.einsum("bhqk,bkhd->bqhd", p.to(q.dtype), v)
    pv = p.to(acc_dtype)
    acc = torch.zeros(B, Hq, Sq, v.shape[-1], dtype=acc_dtype, device=q.device)
    vv = v.to(acc_dtype).transpose(1, 2)  # (B, H, Sk, Dv)
    for jj in range(Sk):
        acc = acc + pv[..., jj : jj + 1] * vv[:, :, jj : jj + 1, :]  # rounded to acc_dtype each step
    return acc.transpose(1, 2).to(q.dtype)


class _Wrong(SoftmaxAdapter):
    description = "deliberately wrong (tests only)"
    knobs: ClassVar[dict] = {}

    def knobs_for(self, case) -> dict:
        return self.knobs

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        kw = dict(causal=case.causal, scale=default_scale(case), window=case.window)
        kw.update(self.knobs_for(case))
        return SoftmaxOutput(_attention(q, k, v, **kw))


class OffByOneCausal(_Wrong):
    """Causal mask one key too wide: query i also sees key i + 1."""

    name = "wrong_causal_off_by_one"
    knobs: ClassVar[dict] = {"mask_shift": 1}


class ScaleIgnored(_Wrong):
    """softmax_scale dropped: scores are q.k, not q.k / sqrt(d)."""

    name = "wrong_scale_ignored"
    knobs: ClassVar[dict] = {"scale": 1.0}


class LowPrecisionAccumulation(_Wrong):
    """P V accumulated in the input dtype (fp16) instead of an fp32 accumulator."""

    name = "wrong_low_precision_accumulation"

    def knobs_for(self, case):
        # fp16 / bf16 cases accumulate in their own dtype; an fp32 case in bf16 (the bug on a
        # kernel that downcasts its accumulator).
        return {"acc_dtype": case.torch_dtype if case.dtype in ("fp16", "bf16") else torch.bfloat16}


class GQAWrongHeads(_Wrong):
    """GQA head mapping wrong: query head h reads kv head h % Hk instead of h // (Hq / Hk)."""

    name = "wrong_gqa_heads"
    knobs: ClassVar[dict] = {"gqa": "repeat"}


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.factor, None


class _Jitter(torch.autograd.Function):
    """Identity forward; backward scales by ``factor`` in float64 and rounds back (~0.5 ulp)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (g.double() * ctx.factor).to(g.dtype), None


class DqScaled(SoftmaxAdapter):
    """Forward right, dq 1% too large (a stray factor in the backward kernel)."""

    name = "wrong_dq_scaled_1.01"

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        out, lse = eager_attention(
            _ScaleGrad.apply(q, 1.01),
            k,
            v,
            causal=case.causal,
            softmax_scale=default_scale(case),
            window_size=case.window,
            softcap=case.softcap,
        )
        return SoftmaxOutput(out, lse)


class LastBlockUnwritten(SoftmaxAdapter):
    """Writes its output in blocks of 16 query rows and forgets the last partial block."""

    name = "wrong_last_block_unwritten"
    BLOCK = 16

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        full, _ = eager_attention(
            q, k, v, causal=case.causal, softmax_scale=default_scale(case), window_size=case.window
        )
        out = torch.empty_like(full)  # poisoned with NaN by the runner
        n_full = (full.shape[1] // self.BLOCK) * self.BLOCK
        out[:, :n_full] = full[:, :n_full]
        return SoftmaxOutput(out)


class InputMutated(SoftmaxAdapter):
    """Pre-scales q in place (an "optimisation"): the output is right, the caller's q is not."""

    name = "wrong_input_mutated"

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        with torch.no_grad():
            q.mul_(default_scale(case))
        out, lse = eager_attention(q, k, v, causal=case.causal, softmax_scale=1.0, window_size=case.window)
        return SoftmaxOutput(out, lse)


class MaskedRowsNaN(SoftmaxAdapter):
    """Rows that see no key come out NaN (a plain softmax over all -inf), undocumented."""

    name = "wrong_masked_rows_nan"

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        out, lse = eager_attention(
            q, k, v, causal=case.causal, softmax_scale=default_scale(case), window_size=case.window
        )
        dead = torch.isneginf(lse).transpose(1, 2).unsqueeze(-1)  # (B, Sq, H, 1)
        return SoftmaxOutput(out.masked_fill(dead, math.nan), lse)


class MaskedRowsNaNDocumented(MaskedRowsNaN):
    """The same behaviour, documented by the backend: reported, not failed."""

    name = "documented_masked_rows_nan"
    masked_rows = "fully-masked rows return NaN (like a plain softmax over -inf)"


class EmptyRowsPlusInfLse(SoftmaxAdapter):
    """flash-attn's convention: lse +inf on rows that see no key, declared (``lse_empty_rows``), so
    the checker maps those rows to -inf: it must pass. ``declared = False``: the same output undeclared
    (fails masked_rows); ``live_too``: +inf on a row that does see keys as well (fails lse, declared or
    not)."""

    name = "flash_style_empty_rows"
    lse_empty_rows = math.inf
    live_too = False

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        out, lse = eager_attention(
            q, k, v, causal=case.causal, softmax_scale=default_scale(case), window_size=case.window
        )
        lse = torch.where(torch.isneginf(lse), math.inf, lse)
        if self.live_too:
            live = torch.isfinite(lse).nonzero()[0]
            lse = lse.clone()
            lse[tuple(live)] = math.inf
        return SoftmaxOutput(out, lse)


class EmptyRowsPlusInfUndeclared(EmptyRowsPlusInfLse):
    name = "wrong_empty_rows_plus_inf_undeclared"
    lse_empty_rows = None


class EmptyRowsPlusInfOnALiveRow(EmptyRowsPlusInfLse):
    name = "wrong_plus_inf_on_a_live_row"
    live_too = True


class NoisyBackward(SoftmaxAdapter):
    """Backward adds a tiny run-to-run jitter to dk, as atomics-based accumulation does."""

    name = "wrong_nondeterministic_backward"
    deterministic_backward = True  # claims determinism: must fail

    def __init__(self):
        self.calls = 0

    def run(self, case, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        # Like a different summation order each call: every other call scales dk by one unit
        # roundoff of the dtype, enough to flip bits, far inside the tolerance (only determinism
        # may fail).
        self.calls += 1
        jitter = 1.0 + torch.finfo(k.dtype).eps / 2 * (self.calls % 2)
        out, lse = eager_attention(
            q,
            _Jitter.apply(k, jitter),
            v,
            causal=case.causal,
            softmax_scale=default_scale(case),
            window_size=case.window,
        )
        return SoftmaxOutput(out, lse)


class NoisyBackwardDocumented(NoisyBackward):
    name = "documented_nondeterministic_backward"
    deterministic_backward = False


class LinearGateIgnored(LinearAdapter):
    """Linear attention that drops the decay (g treated as 0)."""

    name = "wrong_linear_gate_ignored"

    def run(self, case, *, q, k, v, g=None, g_gamma=None, initial_state=None):
        o, s = eager_linear_attention(q, k, v, scale=default_scale(case), initial_state=initial_state)
        return LinearOutput(o, s)


class LinearNoFinalState(LinearAdapter):
    """Returns no final state although the contract asks for it."""

    name = "wrong_linear_no_final_state"

    def run(self, case, *, q, k, v, g=None, g_gamma=None, initial_state=None):
        o, _ = eager_linear_attention(
            q, k, v, g=g, g_gamma=g_gamma, scale=default_scale(case), initial_state=initial_state
        )
        return LinearOutput(o, None)


# --------------------------------------------------------------------------------------------
# Decode: attention over a KV cache. Each one is the reference adapter with one bug.
# --------------------------------------------------------------------------------------------


class _WrongDecode(DecodeEagerAdapter):
    description = "deliberately wrong decode (tests only)"


class DecodeWritesWrongSlot(_WrongDecode):
    """Attends correctly (the new tokens straight from k, v) but writes them into the cache one slot
    too far: this step's output is right, every later step reads a stale slot."""

    name = "wrong_decode_writes_wrong_slot"

    def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        out = super().run(case, q=q, k_cache=k_cache.clone(), v_cache=v_cache.clone(), cache_seqlens=cache_seqlens,
                          block_table=block_table, k=k, v=v)
        if k is not None:
            write_new_tokens(k_cache, v_cache, k, v, cache_seqlens + 1, block_table)
        return out


class DecodeIgnoresBlockTable(_WrongDecode):
    """Reads (and writes) a paged cache as if page b * pages + i belonged to sequence b: right only
    when the pool happens to be in order, which a serving stack's never is."""

    name = "wrong_decode_ignores_block_table"

    def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        if block_table is not None:
            B, pages = block_table.shape
            block_table = torch.arange(B * pages, dtype=block_table.dtype, device=block_table.device).view(B, pages)
        return super().run(case, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                           block_table=block_table, k=k, v=v)


class DecodeForgetsToWrite(_WrongDecode):
    """Attends to the new tokens (from k, v directly) but never writes them into the cache."""

    name = "wrong_decode_forgets_to_write"

    def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        return super().run(case, q=q, k_cache=k_cache.clone(), v_cache=v_cache.clone(),
                           cache_seqlens=cache_seqlens, block_table=block_table, k=k, v=v)


class DecodeReadsWholePages(_WrongDecode):
    """Attends to every slot of a sequence's last page, the unused ones past its length too."""

    name = "wrong_decode_reads_whole_pages"

    def run(self, case, *, q, k_cache, v_cache, cache_seqlens, block_table=None, k=None, v=None):
        new = k.shape[1] if k is not None else 0
        if block_table is not None and k is not None:  # write the new tokens, then attend to whole pages
            super().run(case, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table, k=k, v=v)
        page = k_cache.shape[1] if block_table is not None else 1
        rounded = ((cache_seqlens + new + page - 1) // page) * page
        return super().run(case, q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=rounded.to(cache_seqlens.dtype),
                           block_table=block_table)


# --------------------------------------------------------------------------------------------
# FP8 (harness.fp8): the bugs FP8 kernels ship with
# --------------------------------------------------------------------------------------------


def _fp8_attention(case, q, k, v, qd, kd, vd, *, descales=1, subtract_max=True, qk_acc=torch.float32):
    """An FP8 forward with the knobs the bugs turn. descales: how many times the descale factors
    are applied (1 right, 0 ignored, 2 twice); subtract_max=False: P = exp(S) cast to e4m3 with the
    hardware's saturating conversion (values above 448 clamp), no row maximum taken out first;
    qk_acc: the accumulator of Q K^T over the FP8 values (float16: a wgmma with an f16 accumulator)."""
    B, Sq, Hq, D = q.shape
    Hk = k.shape[2]
    G = Hq // Hk
    low = q.dtype
    qh = q.to(qk_acc).transpose(1, 2)
    kh = k.to(qk_acc).repeat_interleave(G, dim=2).transpose(1, 2)
    vh = v.float().repeat_interleave(G, dim=2).transpose(1, 2)
    f = ((qd * kd).repeat_interleave(G, dim=1) ** descales)[:, :, None, None] * default_scale(case)
    s = torch.matmul(qh, kh.transpose(-1, -2)).float() * f
    mask = torch.ones(Sq, k.shape[1], dtype=torch.bool)
    if case.causal:
        mask &= torch.arange(k.shape[1])[None, :] <= torch.arange(Sq)[:, None] + (k.shape[1] - Sq)
    s = s.masked_fill(~mask, -math.inf)
    m = s.amax(-1, keepdim=True) if subtract_max else torch.zeros_like(s[..., :1])
    p = torch.exp(s - m)
    lsum = p.sum(-1, keepdim=True)
    p8 = p.clamp(max=448.0).to(low) if not subtract_max else p.to(low)
    out = torch.matmul(p8.float(), vh) * (vd.repeat_interleave(G, dim=1) ** descales)[:, :, None, None] / lsum
    lse = (m + torch.log(lsum)).squeeze(-1)
    return SoftmaxOutput(out.transpose(1, 2).to(case.torch_dtype), lse)


class _WrongFP8(SoftmaxAdapter):
    description = "deliberately wrong FP8 forward (tests only)"
    fp8 = True
    differentiable = False
    knobs: ClassVar[dict] = {}

    def run(self, case, *, q, k, v, q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
            cu_seqlens_k=None):
        return _fp8_attention(case, q, k, v, q_descale, k_descale, v_descale, **self.knobs)


class FP8DescaleIgnored(_WrongFP8):
    """The FP8 values used as if they were the real ones: scores and output off by the factors."""

    name = "wrong_fp8_descale_ignored"
    knobs: ClassVar[dict] = {"descales": 0}


class FP8DescaleTwice(_WrongFP8):
    """The descales applied by the caller's dequantisation and again in the kernel."""

    name = "wrong_fp8_descale_twice"
    knobs: ClassVar[dict] = {"descales": 2}


class FP8UnscaledP(_WrongFP8):
    """P = exp(S) cast to e4m3 without the row maximum taken out: saturates at 448 when scores are
    large (and small probabilities flush to zero); the fp32 row sum, and so the lse, stays right."""

    name = "wrong_fp8_unscaled_p"
    knobs: ClassVar[dict] = {"subtract_max": False}


class FP8HalfAccumulation(_WrongFP8):
    """Q K^T of the FP8 values accumulated in fp16: products of values near 448 overflow."""

    name = "wrong_fp8_fp16_accumulation"
    knobs: ClassVar[dict] = {"qk_acc": torch.float16}


class FP8DescaleFirstEntry(_WrongFP8):
    """Reads one descale for the whole tensor (entry [0, 0]): right while quantisation is per tensor,
    wrong as soon as the factors differ per (sequence, kv head)."""

    name = "wrong_fp8_descale_first_entry"

    def run(self, case, *, q, k, v, q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
            cu_seqlens_k=None):
        one = [torch.full_like(d, float(d[0, 0])) for d in (q_descale, k_descale, v_descale)]
        return _fp8_attention(case, q, k, v, *one)


class FP8OutputRounded(_WrongFP8):
    """Writes its output in e4m3 (read back): right for ``fp8_out`` cases. On a bf16-output case the
    output's rounding comes on top of P's: measured 1.65x the reference's error, inside the FP8 rule's
    2x, so it is *not* rejected there (a limit of the rule, tests/check/test_verify.py)."""

    name = "wrong_fp8_output_rounded"

    def run(self, case, *, q, k, v, q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
            cu_seqlens_k=None):
        from harness import fp8

        res = _fp8_attention(case, q, k, v, q_descale, k_descale, v_descale)
        return SoftmaxOutput(fp8.round_output(res.out, v_descale, "e4m3").to(case.torch_dtype), res.lse)


class FP8OutputWritten(_WrongFP8):
    """Not wrong: an ``fp8_out`` kernel that returns its output as written, e4m3 in V's units, with
    ``out_descale`` = v_descale (SoftmaxOutput): the harness reads it back and it must pass."""

    name = "fp8_output_written"
    descale_inverted = False

    def run(self, case, *, q, k, v, q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
            cu_seqlens_k=None):
        res = _fp8_attention(case, q, k, v, q_descale, k_descale, v_descale)
        group = case.heads_q // case.heads_k
        vd = v_descale.float().repeat_interleave(group, dim=1)[:, None, :, None]
        written = (res.out.float() / vd).clamp(-448, 448).to(torch.float8_e4m3fn)
        return SoftmaxOutput(written, res.lse, out_descale=1.0 / v_descale if self.descale_inverted else v_descale)


class FP8OutputDescaleInverted(FP8OutputWritten):
    """Hands back the output's *scale* (1 / v_descale) where its descale belongs: every value off by
    v_descale squared."""

    name = "wrong_fp8_output_descale_inverted"
    descale_inverted = True


class FP8OnlineCorrect(_WrongFP8):
    """Not wrong: a flash-style FP8 forward (keys in blocks of 16 with a running maximum, so P is
    quantised against the maximum so far). It must pass: the tolerance must not reject a correct
    kernel for quantising P differently from the reference."""

    name = "fp8_online_blocks"

    def run(self, case, *, q, k, v, q_descale=None, k_descale=None, v_descale=None, cu_seqlens_q=None,
            cu_seqlens_k=None):
        from harness.adapters.eager import eager_fp8_attention

        out, lse = eager_fp8_attention(q, k, v, q_descale, k_descale, v_descale, causal=case.causal,
                                       softmax_scale=case.scale, window_size=case.window, softcap=case.softcap,
                                       out_dtype=case.torch_dtype, block_n=16)
        return SoftmaxOutput(out, lse)


# FP8 backward (fp8_grad cases): the eager FP8 backward with one defect each (harness.adapters.eager)
class _WrongFP8Backward(EagerFP8Adapter):
    description = "deliberately wrong FP8 backward (tests only)"


class FP8BackwardDoDescaleIgnored(_WrongFP8Backward):
    """dO's FP8 values used as its real ones: every gradient off by dO's factor."""

    name = "wrong_fp8_bwd_do_descale_ignored"
    flaws = ("do_descale_ignored",)


class FP8BackwardDsUnscaled(_WrongFP8Backward):
    """dS cast to FP8 as it is, without ds_descale: training-sized gradients underflow in e4m3."""

    name = "wrong_fp8_bwd_ds_unscaled"
    flaws = ("ds_unscaled",)


class FP8BackwardNoSoftmaxScale(_WrongFP8Backward):
    """dS without the softmax scale: dQ and dK off by 1 / scale."""

    name = "wrong_fp8_bwd_no_softmax_scale"
    flaws = ("no_softmax_scale",)


class FP8BackwardDeltaFromFP8Units(_WrongFP8Backward):
    """D = rowsum(dO o O) from an FP8 output's stored values, its descale forgotten."""

    name = "wrong_fp8_bwd_delta_from_fp8_units"
    flaws = ("delta_from_fp8_units",)


class FP8BackwardRowBlocks(_WrongFP8Backward):
    """Not wrong: the same FP8 backward walking the query rows in blocks of 16 (dK, dV summed over the
    blocks in another order, as a kernel's programs do). It must pass."""

    name = "fp8_bwd_row_blocks"

    def run_fp8_backward(self, case, forward, **inputs):
        from harness.adapters import eager

        old, eager.FP8_BWD_BLOCK = eager.FP8_BWD_BLOCK, 16 * case.batch * case.heads_q * case.seqlen_k
        try:
            return super().run_fp8_backward(case, forward, **inputs)
        finally:
            eager.FP8_BWD_BLOCK = old
