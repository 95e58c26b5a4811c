"""Named case presets: the seeds' configurations and small CPU-sized sets.

``preset(name, dtypes=...)`` returns a list of cases; ``dtypes`` replaces each case's dtype
(one copy of the case per dtype). ``PRESETS`` maps each name to a one-line description.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from harness.cases import Case, DecodeCase, LinearCase, SoftmaxCase

# The FA papers' sweep keeps batch x seqlen = 16k tokens and hidden = heads x dim = 2048.
FA_SWEEP_TOKENS = 16 * 1024
FA_SWEEP_HIDDEN = 2048
FA_SWEEP_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)


def _fa_sweep() -> list[Case]:
    cases: list[Case] = []
    for d in (64, 128):
        for causal in (False, True):
            for s in FA_SWEEP_SEQLENS:
                h = FA_SWEEP_HIDDEN // d
                cases.append(SoftmaxCase(FA_SWEEP_TOKENS // s, h, h, s, s, d, causal=causal, dtype="bf16"))
    return cases


def _fp8_sweep() -> list[Case]:
    """The FA-paper sweep in bf16 and in FP8 (e4m3 in; bf16 out, and e4m3 out with its scale:
    cuDNN's form on Hopper), plus hd 256 with 8 heads (the FA3 paper's FP8 chart): bf16 kernels run
    the first, FP8 kernels the others, in one bench run."""
    cases: list[Case] = []
    for d, heads in ((64, FA_SWEEP_HIDDEN // 64), (128, FA_SWEEP_HIDDEN // 128), (256, 8)):
        for causal in (False, True):
            for s in FA_SWEEP_SEQLENS:
                c = SoftmaxCase(FA_SWEEP_TOKENS // s, heads, heads, s, s, d, causal=causal, dtype="bf16")
                cases += [c, dataclasses.replace(c, fp8="e4m3"), dataclasses.replace(c, fp8="e4m3", fp8_out=True)]
    return cases


def _fp8_bwd(head_dim: int = 128) -> list[Case]:
    """The FA-paper sweep at ``head_dim`` (128: cuDNN's FP8 backward on sm90 builds there only; 64: the in-repo
    FP8 backward beside the bf16 kernels, no FP8 peer), forward and backward: bf16, and e4m3 in and out with the
    backward in e4m3 and in e5m2 (flash-attn's / cuDNN's FP8 training forms: ``fp8_grad``), in one bench run."""
    cases: list[Case] = []
    for causal in (False, True):
        for s in FA_SWEEP_SEQLENS:
            h = FA_SWEEP_HIDDEN // head_dim
            c = SoftmaxCase(FA_SWEEP_TOKENS // s, h, h, s, s, head_dim, causal=causal, dtype="bf16")
            cases += [c] + [dataclasses.replace(c, fp8="e4m3", fp8_out=True, fp8_grad=g) for g in ("e4m3", "e5m2")]
    return cases


def _small_fp8() -> list[Case]:
    """CPU-sized FP8 cases (e4m3 q, k, v with per-tensor descales, bf16 out): masks, GQA / MQA,
    Sq != Sk, window and softcap, scale 1.0 (large scores: exp(S) unscaled would exceed 448), one
    with a factor per (sequence, kv head), two with the output written in e4m3 (``fp8_out``), four with
    the FP8 backward (``fp8_grad``: dO and dS in e4m3 or e5m2, gradients in the case's dtype or in FP8)."""
    return [
        SoftmaxCase(2, 4, 4, 37, 37, 32, dtype="bf16", fp8="e4m3"),
        SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3"),
        SoftmaxCase(1, 4, 1, 70, 33, 64, causal=True, dtype="bf16", fp8="e4m3"),
        SoftmaxCase(1, 2, 2, 48, 48, 32, window=(8, 4), softcap=5.0, dtype="bf16", fp8="e4m3"),
        SoftmaxCase(2, 4, 2, 64, 64, 64, scale=1.0, dtype="bf16", fp8="e4m3"),
        SoftmaxCase(1, 2, 2, 40, 40, 128, causal=True, dtype="fp16", fp8="e4m3"),
        # one factor per (sequence, kv head), heads at magnitudes 1/4..4
        SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_per_head=True),
        # the output written in e4m3 with its scale (cuDNN's FP8 forward on Hopper), read back
        SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_out=True),
        SoftmaxCase(1, 2, 2, 64, 64, 128, dtype="bf16", fp8="e4m3", fp8_out=True),
        # the FP8 backward: gradients in bf16 or, with fp8_out, written in the gradients' format
        SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
        SoftmaxCase(1, 4, 1, 40, 40, 64, window=(8, 0), dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),
        SoftmaxCase(1, 2, 2, 64, 64, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_out=True, fp8_grad="e4m3"),
        SoftmaxCase(1, 2, 2, 64, 64, 128, dtype="bf16", fp8="e4m3", fp8_out=True, fp8_grad="e5m2"),
    ]


def _configs() -> list[Case]:
    """MHA / GQA (32/8) / MQA / MLA-shaped (d 192, d_v 128) at 4k tokens per sequence, causal."""
    return [
        SoftmaxCase(2, 32, 32, 4096, 4096, 128, causal=True, dtype="bf16"),
        SoftmaxCase(2, 32, 8, 4096, 4096, 128, causal=True, dtype="bf16"),
        SoftmaxCase(2, 32, 1, 4096, 4096, 128, causal=True, dtype="bf16"),
        SoftmaxCase(2, 16, 16, 4096, 4096, 192, d_v=128, causal=True, dtype="bf16"),
    ]


def _causal_sweep() -> list[Case]:
    """d in {16, 32, 64, 128} x seqlen 128..8192, causal."""
    return [
        SoftmaxCase(4, 16, 16, s, s, d, causal=True, dtype="bf16")
        for d in (16, 32, 64, 128)
        for s in (128, 256, 512, 1024, 2048, 4096, 8192)
    ]


def _linear() -> list[Case]:
    """The seeds' linear-attention configuration: B4 H32 D64 fp16, T 1k..4k."""
    return [LinearCase(4, 32, t, 64, gate="g_gamma", dtype="fp16") for t in (1024, 2048, 4096)]


def _linear_sweep() -> list[Case]:
    """The kernel issue's sweep: B4 H32, K=V in {64, 128}, T 1k..16k, fp16."""
    return [
        LinearCase(4, 32, t, d, gate="g_gamma", dtype="fp16")
        for d in (64, 128)
        for t in (1024, 2048, 4096, 8192, 16384)
    ]


def _small() -> list[Case]:
    """CPU-sized softmax cases covering every feature: masks, GQA/MQA, Sq != Sk, d_v != d, varlen,
    the scale keyword omitted and passed, non-contiguous layouts."""
    return [
        SoftmaxCase(2, 4, 4, 37, 37, 32),
        SoftmaxCase(2, 4, 4, 64, 64, 64, causal=True),
        SoftmaxCase(1, 4, 2, 33, 70, 32, causal=True),
        SoftmaxCase(1, 4, 1, 70, 33, 16, causal=True),
        SoftmaxCase(2, 2, 2, 48, 48, 32, window=(8, 4)),
        SoftmaxCase(1, 2, 2, 40, 40, 32, softcap=5.0),
        SoftmaxCase(1, 2, 2, 24, 24, 48, d_v=32),
        SoftmaxCase(1, 4, 2, 0, 0, 32, causal=True, varlen=((17, 17), (0, 5), (40, 40), (9, 30))),
        # The scale keyword passed (every case above omits it: the callee's default must be
        # 1/sqrt(d)): T5-style 1.0, and 1/16 (Gemma-2's query_pre_attn_scalar 256).
        SoftmaxCase(2, 4, 2, 40, 40, 32, causal=True, scale=1.0),
        SoftmaxCase(1, 4, 1, 33, 70, 32, causal=True, scale=0.0625),
        # out alone asked for (return_lse=False where the callee has the keyword): its out-only path
        SoftmaxCase(1, 4, 2, 40, 40, 32, causal=True, return_lse=False),
        # scale and causal passed by position, as flash-attn 2 allows (q, k, v, dropout_p, softmax_scale, causal)
        SoftmaxCase(1, 2, 2, 24, 24, 16, causal=True, scale=0.5, call="positional"),
        # The same values in other memory layouts: packed qkv views, transposed views, a storage offset.
        SoftmaxCase(2, 4, 4, 33, 33, 32, causal=True, layout="qkvpacked"),
        SoftmaxCase(1, 4, 2, 40, 70, 32, causal=True, layout="transposed"),
        SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset"),
    ]


def _small_linear() -> list[Case]:
    """CPU-sized linear cases: every gate kind, strengths n = 0.1 / 1 / 10, odd lengths."""
    return [
        LinearCase(1, 2, 65, 32, gate="none"),
        LinearCase(1, 2, 63, 32, gate="g", gate_n=0.1),
        LinearCase(2, 2, 127, 32, gate="g", gate_n=1.0),
        LinearCase(1, 2, 33, 64, 32, gate="g", gate_n=10.0),
        LinearCase(1, 2, 70, 32, gate="g_gamma", initial_state=False, grad_final_state=False),
        LinearCase(1, 2, 48, 32, gate="g", scale=1.0),  # the scale passed (the others omit it)
        LinearCase(1, 2, 40, 32, gate="g_gamma", scale=0.0625, layout="transposed"),
        LinearCase(1, 2, 33, 32, gate="none", layout="offset"),
    ]


# The seeds' attention-layer report: three sizes per attention type, bf16, not causal, as published
# (its GPU was an A100). Sizes (batch, seqlen, query heads, head dim):
ATTENTION_LAYER_SIZES = ((2, 2048, 12, 64), (1, 4096, 32, 128), (1, 2048, 40, 128))
# Its MLA rows: (batch, seqlen, heads, head dim, latent) per size.
MLA_LAYER_SIZES = ((2, 2048, 32, 128, 512), (1, 4096, 64, 128, 1024), (1, 2048, 128, 128, 2048))
#: Rotary part of an MLA query/key head (DeepSeek-V2/V3: 64), concatenated to the head dim.
MLA_ROPE_DIM = 64


def _attention_layers() -> list[Case]:
    """The attention-layer report's 15 configurations, exactly: per size of ATTENTION_LAYER_SIZES, MHA
    with fused QKV (views of one packed (B, S, 3, H, D) tensor: flash-attn's qkvpacked convention),
    MHA with separate q/k/v, GQA with 8 kv heads, MQA; and MLA per size of MLA_LAYER_SIZES in both
    forms it enters an attention call:

    * training form: every head keeps its own keys; q and k heads are the head dim plus the rotary
      part (128 + 64 = 192), v heads the head dim (128): MHA with d 192, d_v 128;
    * absorbed form (inference): W_UK is folded into the query and W_UV into the output, so all heads
      attend to one shared latent head: MQA with d_qk = latent + 64 and d_v = latent.
    """
    cases: list[Case] = []
    for b, s, h, d in ATTENTION_LAYER_SIZES:
        cases.append(SoftmaxCase(b, h, h, s, s, d, layout="qkvpacked", dtype="bf16"))
        cases.append(SoftmaxCase(b, h, h, s, s, d, dtype="bf16"))
    for b, s, h, d in ATTENTION_LAYER_SIZES:
        # the report's GQA rows: 32 query heads at D64 (its MHA rows there have 12), 32 / 40 at D128
        hq = 32 if d == 64 else h
        cases.append(SoftmaxCase(b, hq, 8, s, s, d, dtype="bf16"))
    for b, s, h, d in ATTENTION_LAYER_SIZES:
        hq = 16 if d == 64 else h  # the report's MQA rows: 16 query heads at D64, 32 / 40 at D128
        cases.append(SoftmaxCase(b, hq, 1, s, s, d, dtype="bf16"))
    for b, s, h, d, latent in MLA_LAYER_SIZES:
        cases.append(SoftmaxCase(b, h, h, s, s, d + MLA_ROPE_DIM, d_v=d, dtype="bf16"))
        cases.append(SoftmaxCase(b, h, 1, s, s, latent + MLA_ROPE_DIM, d_v=latent, dtype="bf16"))
    return cases


def _layer_mha_references() -> list[Case]:
    """MHA with the query heads of each GQA / MQA row of ``attention-layers`` that has no MHA row of
    its own (the report's D64 GQA and MQA rows have 32 and 16 query heads, its MHA row 12): issue
    16's rule that a GQA / MQA backward stay within 1.2x of the MHA backward with the same query
    heads needs them in the same run. (The D128 rows share their query heads with the MHA rows.)"""
    cases: list[Case] = []
    for c in _attention_layers():
        if c.heads_k == c.heads_q or c.d_v != c.d:
            continue
        mha = SoftmaxCase(c.batch, c.heads_q, c.heads_q, c.seqlen_q, c.seqlen_k, c.d, dtype=c.dtype)
        if all(x.id != mha.id for x in _attention_layers() + cases):
            cases.append(mha)
    return cases


def _models() -> list[Case]:
    """Attention layers of real models at 2k-8k tokens per sequence, causal, bf16."""
    return [
        SoftmaxCase(4, 32, 8, 2048, 2048, 128, causal=True, dtype="bf16"),  # Llama-3-8B
        SoftmaxCase(1, 32, 8, 8192, 8192, 128, causal=True, dtype="bf16"),  # Llama-3-8B, 8k context
        SoftmaxCase(1, 64, 8, 4096, 4096, 128, causal=True, dtype="bf16"),  # Llama-3-70B
        SoftmaxCase(1, 32, 8, 8192, 8192, 128, causal=True, window=(4095, 0), dtype="bf16"),  # Mistral-7B window
        SoftmaxCase(2, 16, 8, 4096, 4096, 256, causal=True, softcap=50.0, dtype="bf16"),  # Gemma-2-9B
        SoftmaxCase(1, 128, 128, 4096, 4096, 192, d_v=128, causal=True, dtype="bf16"),  # DeepSeek-V3 MLA (training)
        SoftmaxCase(2, 71, 1, 2048, 2048, 64, causal=True, dtype="bf16"),  # Falcon-7B (MQA, 71 heads)
    ]


#: Page size of the decode preset's paged caches (vLLM's default block is 16, flash-attn 2 needs a
#: multiple of 256; 64 is a common middle, one key tile per page). One case per shape family
#: repeats at 16 to show the cost of small pages.
DECODE_PAGE = 64


def _decode() -> list[Case]:
    """Decode steps of real models on an H100 (bf16, one new token appended, ragged batches):
    Llama-3-8B / 70B-per-GPU GQA 32/8 d128 from one long sequence to a full batch, Llama-2-7B MHA 32
    d128 at contexts 512..16k, pages of 16 / 64 / 256 and a contiguous cache, MQA, speculative
    decoding (4 new tokens), DeepSeek-V3's absorbed MLA (128 query heads on one
    576-wide latent head, values 512 wide), and Mistral-style sliding-window decode."""
    gqa = [DecodeCase(b, 32, 8, 1, n, 128, page_size=DECODE_PAGE, ragged=b > 1, dtype="bf16")
           for b, n in ((1, 8192), (1, 131072), (16, 4096), (16, 32768), (64, 4096), (256, 1024))]
    # the seed's inference table in form: a Llama-2-7B attention layer, contexts 512..16k
    mha = [DecodeCase(8, 32, 32, 1, n, 128, page_size=DECODE_PAGE, dtype="bf16")
           for n in (512, 1024, 2048, 4096, 8192, 16384)]
    return gqa + mha + [
        DecodeCase(16, 32, 8, 1, 32768, 128, page_size=16, dtype="bf16"),  # vLLM's pages
        DecodeCase(16, 32, 8, 1, 32768, 128, page_size=256, dtype="bf16"),  # flash-attn 2's pages
        DecodeCase(16, 32, 8, 1, 32768, 128, dtype="bf16"),  # contiguous cache
        DecodeCase(16, 32, 1, 1, 32768, 128, page_size=DECODE_PAGE, dtype="bf16"),  # MQA
        DecodeCase(16, 32, 8, 4, 8192, 128, page_size=DECODE_PAGE, dtype="bf16"),  # speculative
        DecodeCase(32, 128, 1, 1, 4096, 576, d_v=512, page_size=DECODE_PAGE, dtype="bf16"),  # MLA
        DecodeCase(16, 32, 8, 1, 32768, 128, page_size=DECODE_PAGE, window=(4095, 0), dtype="bf16"),
    ]


def _small_decode() -> list[Case]:
    """CPU-sized decode cases: paged (pages of 16 and 32) and contiguous caches, GQA / MQA / MHA,
    1 and 4 new tokens, ragged lengths (an empty cache, one exact page, full), no append, d_v != d,
    a window, softcap, the scale passed, not causal."""
    return [
        DecodeCase(5, 8, 2, 1, 100, 32, page_size=16),
        DecodeCase(4, 4, 1, 4, 70, 16, d_v=32),
        DecodeCase(3, 4, 4, 1, 64, 32, page_size=32, append=False),
        DecodeCase(4, 8, 2, 2, 90, 16, page_size=16, window=(20, 0), softcap=5.0),
        DecodeCase(3, 4, 2, 3, 33, 16, page_size=16, causal=False, scale=0.0625),
    ]


_BUILDERS: dict[str, tuple[Callable[[], list[Case]], str]] = {
    "small": (_small, "CPU-sized softmax cases, every feature, scale omitted and passed, strided layouts (fp32)"),
    "small-linear": (_small_linear, "CPU-sized linear-attention cases, every gate, scale passed, strided layouts (fp32)"),
    "small-decode": (_small_decode, "CPU-sized decode cases: paged and contiguous caches, GQA/MQA, 1-4 new tokens, ragged (fp32)"),
    "small-fp8": (_small_fp8, "CPU-sized FP8 cases: e4m3 q/k/v with per-tensor descales, bf16/fp16 out, masks, GQA/MQA, scale 1.0, FP8 backward in e4m3/e5m2"),
    "fp8-sweep": (_fp8_sweep, "FA-paper sweep (hd 64/128 at hidden 2048, hd 256 x 8 heads) in bf16 and in e4m3 with bf16 out"),
    "fp8-bwd": (_fp8_bwd, "FA-paper sweep at hd 128, forward and backward: bf16, and e4m3 in / out with the backward in e4m3 and in e5m2"),
    "fp8-bwd-hd64": (lambda: _fp8_bwd(64), "the fp8-bwd preset at hd 64 (no cuDNN FP8 backward there on sm90: the in-repo FP8 and bf16 kernels, cuDNN's bf16)"),
    "fa-sweep": (_fa_sweep, "FA-paper sweep: hd 64/128, seqlen 512..16k at 16k tokens, hidden 2048, bf16"),
    "configs": (_configs, "MHA / GQA 32/8 / MQA / MLA-shaped (d192 v128), B2 S4096 causal, bf16"),
    "causal-sweep": (_causal_sweep, "d in {16,32,64,128} x seqlen 128..8192, B4 H16 causal, bf16"),
    "linear": (_linear, "linear attention: B4 H32 D64 fp16, T 1k..4k"),
    "linear-sweep": (_linear_sweep, "linear attention: B4 H32 K=V 64/128, T 1k..16k, fp16"),
    "attention-layers": (_attention_layers, "the seeds' attention-layer report: MHA fused/separate QKV, GQA 8 kv, MQA, MLA (training and absorbed), bf16"),
    "layer-mha-refs": (_layer_mha_references, "MHA at the query heads of attention-layers' D64 GQA / MQA rows (the GQA/MQA-vs-MHA backward rule), bf16"),
    "models": (_models, "real models' attention: Llama-3-8B/70B, Mistral window, Gemma-2 softcap d256, DeepSeek-V3 MLA, Falcon MQA; causal bf16"),
    "decode": (_decode, "decode of real models: GQA 32/8, MQA, MHA d128, B1..256, caches 512..128k, MLA d576/512, pages 16/64/256, bf16"),
}
PRESETS: dict[str, str] = {name: desc for name, (_, desc) in _BUILDERS.items()}


def preset(name: str, dtypes: Iterable[str] | None = None) -> list[Case]:
    """The cases of preset ``name``; with ``dtypes``, one copy of each case per dtype."""
    try:
        build = _BUILDERS[name][0]
    except KeyError:
        raise ValueError(f"preset: unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
    return in_dtypes(build(), dtypes)


def in_dtypes(cases: Iterable[Case], dtypes: Iterable[str] | None) -> list[Case]:
    """One copy of each case per dtype (``dtypes`` None or empty: the cases as they are); an FP8 case's dtype is
    its output's, so it gets fp16 / bf16 only. Presets' and case ids' (harness bench --case, --attn-case) alike."""
    if not dtypes:
        return list(cases)
    return [c.with_dtype(dt) for c in cases for dt in dtypes if not getattr(c, "fp8", "") or dt in ("fp16", "bf16")]
