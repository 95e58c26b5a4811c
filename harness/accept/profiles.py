"""Acceptance profiles: what a team uses, as a case matrix per family plus what is required.

A profile names, per family, the cases to check against the FP64 oracle, which *features* the
team relies on (``required``), whether gradients are checked (``backward``), how many fresh seeds
each case gets, and the benchmark cases of the speed section (GPU only).

A case is *required* when every feature it exercises is required by the profile: a kernel that
declares such a case unsupported is rejected. Other cases are optional: unsupported there is
reported, not failed. ``training-gqa`` requires causal + GQA + backward, so a window case in it is
optional; ``full`` requires everything.

Each GPU profile has a CPU-sized variant (``<name>-cpu``) that ``--device cpu`` selects
automatically (the report says so): the same features on sequences of tens of tokens, so CI and
the harness's own tests run them in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.cases import Case, DecodeCase, LinearCase, SoftmaxCase

#: Feature name -> words for the report. Linear-attention cases exercise only ``layout``: FLA's
#: signature has no optional parts the harness varies (gates and states are always passed).
#: The scale is not a feature: every kernel must honour an explicit scale and, when the keyword is
#: omitted (most cases), default to d ** -0.5; each profile has cases of both.
FEATURES: dict[str, str] = {
    "causal": "causal mask (bottom-right aligned)",
    "gqa": "GQA/MQA (fewer kv heads than query heads)",
    "window": "sliding-window (local) attention",
    "softcap": "logit softcapping",
    "varlen": "packed variable-length batches (zero-length sequences included)",
    "dv": "value head dim different from the query's (MLA-shaped)",
    "layout": "inputs as strided views: transposed, at a storage offset, or views of one packed qkv tensor",
    "paged": "decode over a paged KV cache (a block table into a shuffled page pool)",
    "backward": "gradients through autograd (dq, dk, dv; linear: dg, dh0)",
}

# Seeds per case. Every seed is a full forward + backward against the oracle on fresh inputs, so
# the cost is linear in it. One seed can hide a data-dependent bug (a mask error only shows when
# a large score lands on the wrong key) and lets a kernel be tuned to a known input; seeds are
# drawn fresh every run (recorded in the report for replay).
GPU_SEEDS = 3
# The CPU variants serve CI and the harness's own tests: two seeds already catch a fixed or
# cached output (the caching detector adds two more inputs of its own).
CPU_SEEDS = 2


def case_features(case: Case) -> frozenset[str]:
    """The optional features ``case`` exercises (empty for a dense non-causal MHA case)."""
    if isinstance(case, DecodeCase):
        words = {"causal": case.causal, "gqa": case.heads_q != case.heads_k, "window": case.has_window,
                 "softcap": bool(case.softcap), "dv": case.d_v != case.d, "paged": case.paged}
        return frozenset(k for k, on in words.items() if on)
    if not isinstance(case, SoftmaxCase):
        return frozenset({"layout"}) if case.layout != "contiguous" else frozenset()
    f = set()
    if case.causal:
        f.add("causal")
    if case.heads_q != case.heads_k:
        f.add("gqa")
    if case.has_window:
        f.add("window")
    if case.softcap:
        f.add("softcap")
    if case.is_varlen:
        f.add("varlen")
    if case.d_v != case.d:
        f.add("dv")
    if case.layout != "contiguous":
        f.add("layout")
    return frozenset(f)


@dataclass(frozen=True)
class Profile:
    """One named profile. ``softmax`` / ``linear`` / ``decode``: the correctness cases (with their
    dtypes); ``bench_*``: the speed section's cases (on a CPU only with ``--speed``)."""

    name: str
    description: str
    required: frozenset[str]
    backward: bool
    seeds: int
    softmax: tuple[Case, ...]
    linear: tuple[Case, ...]
    bench_softmax: tuple[Case, ...] = ()
    bench_linear: tuple[Case, ...] = ()
    decode: tuple[Case, ...] = ()
    bench_decode: tuple[Case, ...] = ()
    cpu_variant: str | None = None  # the profile --device cpu switches to
    sized_for: str = "cuda"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def cases(self, family: str, dtypes: list[str] | None = None) -> list[Case]:
        """The family's cases; ``dtypes`` replaces each case's dtype (one copy per dtype)."""
        base = list({"softmax": self.softmax, "linear": self.linear, "decode": self.decode}[family])
        if dtypes:
            base = [c.with_dtype(dt) for c in base for dt in dtypes]
        seen, out = set(), []
        for c in base:
            if c.id not in seen:
                seen.add(c.id)
                out.append(c)
        return out

    def bench_cases(self, family: str, dtypes: list[str] | None = None) -> list[Case]:
        base = list({"softmax": self.bench_softmax, "linear": self.bench_linear, "decode": self.bench_decode}[family])
        if dtypes:
            base = [c.with_dtype(dt) for c in base for dt in dtypes if dt in ("fp16", "bf16")] or base
        return base

    def is_required(self, case: Case) -> bool:
        return case_features(case) <= self.required

    def optional_features(self, case: Case) -> list[str]:
        """Features of ``case`` the profile does not require (why the case is optional)."""
        return sorted(case_features(case) - self.required)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "required_features": sorted(self.required),
            "backward": self.backward,
            "seeds_per_case": self.seeds,
            "sized_for": self.sized_for,
            "notes": list(self.notes),
        }


def _dt(cases, dtypes) -> tuple[Case, ...]:
    return tuple(c.with_dtype(dt) for c in cases for dt in dtypes)


# --------------------------------------------------------------------------------------------
# GPU-sized matrices. bf16 is what training and serving run; fp16 is the other dtype kernels
# ship. Lengths: a few thousand tokens reach every tile loop and the causal diagonal many times
# while the FP64 oracle and the materialised reference stay at seconds per case; odd lengths
# (1000, 300) leave partial tiles at every block size.
# --------------------------------------------------------------------------------------------

GPU_DTYPES = ("bf16", "fp16")

_SM_BASE = (
    SoftmaxCase(2, 16, 16, 1024, 1024, 128),  # dense MHA: every kernel must do this
    SoftmaxCase(2, 16, 16, 1024, 1024, 64, causal=True),  # causal MHA, head dim 64
)
_SM_GQA = (
    SoftmaxCase(2, 32, 8, 2048, 2048, 128, causal=True),  # GQA 4:1 (Llama-3 style)
    SoftmaxCase(1, 16, 1, 1000, 1000, 128, causal=True),  # MQA, length not a multiple of any tile
    SoftmaxCase(2, 16, 4, 512, 1536, 128, causal=True),  # Sq < Sk: bottom-right causal (chunked prefill)
    SoftmaxCase(1, 8, 2, 300, 200, 64, causal=True),  # Sq > Sk: 100 rows see no key (out 0, no grad)
)
# The scale keyword: every other case omits it (the callee's default must be 1/sqrt(d)); these pass
# one: T5-style 1.0 (no scaling), and Gemma-2's query_pre_attn_scalar 256 on d 128 (1/16).
_SM_SCALE = (
    SoftmaxCase(2, 16, 16, 1024, 1024, 64, scale=1.0),
    SoftmaxCase(2, 16, 4, 1024, 1024, 128, causal=True, scale=0.0625),
)
# Memory layouts of the same values: views of one packed qkv tensor (flash-attn's qkvpacked layout
# passed to the plain entry point), transposed views, a storage offset off every 16-byte boundary.
_SM_LAYOUT = (
    SoftmaxCase(2, 16, 16, 1024, 1024, 128, causal=True, layout="qkvpacked"),
    SoftmaxCase(1, 16, 4, 1000, 1000, 128, causal=True, layout="transposed"),
    SoftmaxCase(1, 8, 2, 300, 300, 64, causal=True, layout="offset"),
)
_SM_DECODE = (
    SoftmaxCase(4, 32, 8, 1, 4096, 128, causal=True),  # decode: one query sees all 4096 keys
    SoftmaxCase(2, 32, 8, 128, 4096, 128, causal=True),  # chunked prefill against a long cache
)
_SM_WINDOW = (SoftmaxCase(2, 16, 4, 1024, 1024, 128, causal=True, window=(256, 0)),)  # local causal
_SM_EXTRA = (
    SoftmaxCase(2, 16, 16, 1024, 1024, 128, window=(128, 128)),  # two-sided sliding window
    SoftmaxCase(2, 16, 16, 1024, 1024, 128, causal=True, softcap=30.0),  # Gemma-2's attention softcap
    SoftmaxCase(1, 16, 16, 1024, 1024, 192, d_v=128, causal=True),  # MLA-shaped (d 192, d_v 128)
    SoftmaxCase(1, 16, 4, 0, 0, 128, causal=True, varlen=((1000, 1000), (0, 17), (513, 513), (77, 1024))),
)
_LIN = (
    LinearCase(2, 16, 1024, 64, gate="g", gate_n=1.0),
    LinearCase(1, 8, 2048, 64, gate="g", gate_n=0.1),  # strong decay: exp of large cumulative sums
    LinearCase(2, 16, 1000, 128, gate="g_gamma"),  # partial last chunk
    LinearCase(2, 16, 1024, 64, gate="none", initial_state=False, grad_final_state=False),
)
_LIN_EXTRA = (
    LinearCase(2, 16, 1024, 64, gate="g", scale=1.0),  # scale passed (the others omit it)
    LinearCase(1, 8, 1000, 64, gate="g_gamma", scale=0.0625, layout="transposed"),
    LinearCase(1, 8, 512, 64, gate="g", layout="offset"),
)
_LIN_DTYPES = ("fp16", "bf16")
# Decode over a KV cache (flash-attn's flash_attn_with_kvcache): ragged batches (a full, an empty,
# a one-page and random sequences), shuffled page pools, the new tokens appended and checked slot
# by slot in the cache.
_DEC = (
    DecodeCase(8, 32, 8, 1, 4096, 128, page_size=64),  # GQA 32/8, pages of 64
    DecodeCase(4, 32, 8, 4, 2000, 128, page_size=16),  # speculative decoding (4 new tokens), vLLM's pages
    DecodeCase(4, 16, 1, 1, 3000, 128, page_size=256, append=False),  # MQA, flash-attn 2's pages, no append
    DecodeCase(4, 16, 16, 1, 1000, 64),  # MHA over a contiguous cache
    DecodeCase(4, 32, 8, 1, 2048, 128, page_size=64, scale=0.0625),  # the scale passed
)
_DEC_OPTIONAL = (
    DecodeCase(4, 32, 8, 1, 4096, 128, page_size=64, window=(1023, 0)),  # sliding-window decode
    DecodeCase(4, 128, 1, 1, 1000, 576, d_v=512, page_size=64),  # absorbed MLA (one latent head)
)

# Benchmark cases: the shapes the claims are about (16k-token batches as in the FA papers / the
# configs preset), bf16.
_BENCH_TRAIN = (
    SoftmaxCase(2, 32, 8, 4096, 4096, 128, causal=True, dtype="bf16"),  # GQA 32/8, the configs preset
    SoftmaxCase(2, 16, 16, 8192, 8192, 128, causal=True, dtype="bf16"),  # FA sweep point, hd128
    SoftmaxCase(4, 32, 32, 4096, 4096, 64, causal=True, dtype="bf16"),  # FA sweep point, hd64
)
_BENCH_INFER = (
    SoftmaxCase(2, 32, 8, 4096, 4096, 128, causal=True, dtype="bf16"),  # prefill
    SoftmaxCase(32, 32, 8, 1, 8192, 128, causal=True, dtype="bf16"),  # decode: memory bound
)
_BENCH_LIN = (LinearCase(4, 32, 4096, 64, gate="g_gamma", dtype="fp16"),)  # the linear preset
_BENCH_DEC = (
    DecodeCase(32, 32, 8, 1, 8192, 128, page_size=64, dtype="bf16"),  # a serving batch
    DecodeCase(1, 32, 8, 1, 32768, 128, page_size=64, ragged=False, dtype="bf16"),  # one long sequence
)


# --------------------------------------------------------------------------------------------
# CPU-sized matrices: tens of tokens, fp32 plus one fp16 case (where a low-precision accumulator
# shows), every feature of the GPU matrix.
# --------------------------------------------------------------------------------------------

_CPU_BASE = (
    SoftmaxCase(2, 4, 4, 37, 37, 32),  # dense MHA, 37 rows: a partial last tile
    SoftmaxCase(2, 4, 2, 40, 40, 32, causal=True),  # causal GQA 2:1
    SoftmaxCase(1, 4, 1, 33, 70, 16, causal=True),  # MQA, Sq < Sk (bottom-right)
    SoftmaxCase(1, 4, 2, 70, 33, 32, causal=True),  # Sq > Sk: 37 rows see no key
    SoftmaxCase(1, 4, 2, 32, 256, 32, causal=True, dtype="fp16"),  # ~240 keys per row in fp16: where an fp16 accumulator drifts
)
_CPU_SCALE = (  # the scale passed: T5-style 1.0, and 1/16 (Gemma's query_pre_attn_scalar 256)
    SoftmaxCase(2, 4, 2, 40, 40, 32, causal=True, scale=1.0),
    SoftmaxCase(1, 4, 1, 33, 70, 32, causal=True, scale=0.0625),
)
_CPU_LAYOUT = (  # the same values in other memory layouts
    SoftmaxCase(2, 4, 4, 33, 33, 32, causal=True, layout="qkvpacked"),
    SoftmaxCase(1, 4, 2, 40, 70, 32, causal=True, layout="transposed"),
    SoftmaxCase(1, 4, 2, 26, 26, 32, causal=True, layout="offset"),
)
_CPU_DECODE = (SoftmaxCase(2, 4, 2, 1, 50, 32, causal=True),)  # one query, all keys
_CPU_WINDOW = (SoftmaxCase(2, 2, 2, 48, 48, 32, causal=True, window=(8, 0)),)
_CPU_EXTRA = (
    SoftmaxCase(2, 2, 2, 48, 48, 32, window=(8, 4)),
    SoftmaxCase(1, 2, 2, 40, 40, 32, softcap=5.0),
    SoftmaxCase(1, 2, 2, 24, 24, 48, d_v=32),
    SoftmaxCase(1, 4, 2, 0, 0, 32, causal=True, varlen=((17, 17), (0, 5), (40, 40), (9, 30))),
)
# The speed section on a CPU (``--speed``: host time, a dry run and the harness's own tests): one
# case per family, big enough that a call is well above the host's timer resolution.
_CPU_BENCH = (SoftmaxCase(1, 4, 2, 128, 128, 32, causal=True),)
_CPU_BENCH_LIN = (LinearCase(1, 2, 128, 32, gate="g_gamma"),)
_CPU_BENCH_DEC = (DecodeCase(8, 8, 2, 1, 256, 32, page_size=16),)
_CPU_DEC = (
    DecodeCase(5, 8, 2, 1, 100, 32, page_size=16),  # paged GQA, ragged (full, empty, one page, random)
    DecodeCase(4, 4, 1, 4, 70, 32, page_size=32),  # MQA, 4 new tokens
    DecodeCase(3, 4, 4, 1, 64, 32, append=False),  # contiguous MHA, no append
    DecodeCase(4, 8, 2, 1, 90, 32, page_size=16, scale=0.0625),  # the scale passed
    DecodeCase(4, 8, 2, 2, 90, 16, page_size=16, dtype="fp16"),  # fp16
)
_CPU_DEC_OPTIONAL = (
    DecodeCase(4, 8, 2, 2, 90, 16, page_size=16, window=(20, 0), softcap=5.0),  # window + softcap
    DecodeCase(3, 16, 1, 1, 40, 48, d_v=32, page_size=16),  # MLA-like: one kv head, d_v != d
)
_CPU_LIN = (
    LinearCase(1, 2, 65, 32, gate="none"),
    LinearCase(1, 2, 63, 32, gate="g", gate_n=0.1),
    LinearCase(2, 2, 40, 32, gate="g_gamma", initial_state=False, grad_final_state=False),
    LinearCase(1, 2, 33, 32, gate="g", gate_n=1.0, dtype="fp16"),
    LinearCase(1, 2, 48, 32, gate="g", scale=1.0),
    LinearCase(1, 2, 40, 32, gate="g_gamma", scale=0.0625, layout="transposed"),
    LinearCase(1, 2, 33, 32, gate="none", layout="offset"),
)

# FP8 (issue 19): e4m3 q, k, v with descales, bf16 out (flash-attn 3's FP8 call returns bf16; the
# fp8_out form is for backends that write FP8 output and is left out: a callable cannot declare it).
# Scores at scale 1.0 stress P's quantisation (exp(S) unscaled would pass 448); one factor per
# (sequence, kv head) catches a kernel that reads one descale for the tensor.
_FP8_GPU = (
    SoftmaxCase(2, 16, 16, 1000, 1000, 128, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 16, 16, 1000, 1000, 128, causal=True, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 32, 8, 1024, 1024, 128, causal=True, dtype="bf16", fp8="e4m3"),  # GQA 4:1
    SoftmaxCase(1, 16, 1, 300, 1300, 64, causal=True, dtype="bf16", fp8="e4m3"),  # MQA, Sq < Sk
    SoftmaxCase(2, 8, 8, 512, 512, 256, scale=1.0, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 32, 8, 1024, 1024, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_per_head=True),
    SoftmaxCase(2, 16, 4, 1024, 1024, 128, causal=True, window=(256, 0), dtype="bf16", fp8="e4m3"),
)
_FP8_CPU = (
    SoftmaxCase(2, 4, 4, 37, 37, 32, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(1, 4, 1, 70, 33, 64, causal=True, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 4, 2, 64, 64, 64, scale=1.0, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_per_head=True),
    SoftmaxCase(1, 2, 2, 48, 48, 32, causal=True, window=(8, 0), dtype="bf16", fp8="e4m3"),
)

# FP8 training (the FP8 backward, fp8_grad): dO and dS in e4m3 or e5m2 (harness.fp8), gradients back in
# bf16 (a callable's contract; cuDNN's FP8-output form is the bench's, not a callable's).
_FP8_TRAIN_GPU = (
    SoftmaxCase(2, 16, 16, 1000, 1000, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),
    SoftmaxCase(2, 16, 16, 1024, 1024, 128, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
    SoftmaxCase(2, 32, 8, 1024, 1024, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),  # GQA 4:1
    SoftmaxCase(1, 16, 1, 300, 1300, 64, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),  # MQA, Sq < Sk
    SoftmaxCase(2, 32, 8, 1024, 1024, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_per_head=True,
                fp8_grad="e4m3"),
    SoftmaxCase(2, 16, 4, 1024, 1024, 128, causal=True, window=(256, 0), dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
)
_FP8_TRAIN_CPU = (
    SoftmaxCase(2, 4, 2, 45, 70, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),
    SoftmaxCase(1, 4, 1, 40, 40, 64, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
    SoftmaxCase(2, 4, 4, 37, 37, 32, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
    SoftmaxCase(1, 2, 2, 48, 48, 32, causal=True, window=(8, 0), dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),
)
_BENCH_FP8_TRAIN = (
    SoftmaxCase(4, 16, 16, 4096, 4096, 128, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),
    SoftmaxCase(4, 16, 16, 4096, 4096, 128, dtype="bf16", fp8="e4m3", fp8_grad="e5m2"),
)
_CPU_BENCH_FP8_TRAIN = (SoftmaxCase(1, 4, 2, 128, 128, 32, causal=True, dtype="bf16", fp8="e4m3", fp8_grad="e4m3"),)

# The FP8 speed section: the FA-paper sweep's hd 128 cells at 4k (16k tokens), and hd 256 x 8 heads
# (the FA3 paper's FP8 chart), against the FP8 peers present (cuDNN's, the in-repo kernel).
_BENCH_FP8 = (
    SoftmaxCase(4, 16, 16, 4096, 4096, 128, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(4, 16, 16, 4096, 4096, 128, causal=True, dtype="bf16", fp8="e4m3"),
    SoftmaxCase(4, 8, 8, 4096, 4096, 256, dtype="bf16", fp8="e4m3"),
)
_CPU_BENCH_FP8 = (SoftmaxCase(1, 4, 2, 128, 128, 32, causal=True, dtype="bf16", fp8="e4m3"),)

_ALL = frozenset(FEATURES)

PROFILES: dict[str, Profile] = {}


def _add(p: Profile) -> None:
    PROFILES[p.name] = p


_add(Profile(
    "inference", "serving: forward only; causal, GQA/MQA and (decode) a paged KV cache required (prefill, decode, chunked prefill)",
    required=frozenset({"causal", "gqa", "paged"}), backward=False, seeds=GPU_SEEDS,
    softmax=_dt(_SM_BASE + _SM_GQA + _SM_SCALE + _SM_LAYOUT + _SM_DECODE + _SM_WINDOW, GPU_DTYPES),
    linear=_dt(_LIN + _LIN_EXTRA, _LIN_DTYPES), bench_softmax=_BENCH_INFER, bench_linear=_BENCH_LIN, cpu_variant="inference-cpu",
    decode=_dt(_DEC + _DEC_OPTIONAL, GPU_DTYPES), bench_decode=_BENCH_DEC,
))
_add(Profile(
    "training-gqa", "training with GQA: causal, GQA/MQA and backward required; windows optional",
    required=frozenset({"causal", "gqa", "backward"}), backward=True, seeds=GPU_SEEDS,
    softmax=_dt(_SM_BASE + _SM_GQA + _SM_SCALE + _SM_LAYOUT + _SM_WINDOW, GPU_DTYPES),
    linear=_dt(_LIN + _LIN_EXTRA, _LIN_DTYPES), bench_softmax=_BENCH_TRAIN, bench_linear=_BENCH_LIN, cpu_variant="training-gqa-cpu",
))
_add(Profile(
    "full", "everything the harness knows: every feature required, forward and backward",
    required=_ALL, backward=True, seeds=GPU_SEEDS,
    softmax=_dt(_SM_BASE + _SM_GQA + _SM_SCALE + _SM_LAYOUT + _SM_DECODE + _SM_WINDOW + _SM_EXTRA, GPU_DTYPES),
    linear=_dt(_LIN + _LIN_EXTRA, _LIN_DTYPES),
    bench_softmax=_BENCH_TRAIN, bench_linear=_BENCH_LIN, cpu_variant="full-cpu",
    decode=_dt(_DEC + _DEC_OPTIONAL, GPU_DTYPES), bench_decode=_BENCH_DEC,
))
_add(Profile(
    "fp8", "FP8 inference: e4m3 q/k/v with (batch, kv head) descales, bf16 out, forward only; causal "
    "and GQA/MQA required, windows optional",
    required=frozenset({"causal", "gqa"}), backward=False, seeds=GPU_SEEDS,
    softmax=_FP8_GPU, linear=(), cpu_variant="fp8-cpu", bench_softmax=_BENCH_FP8,
    notes=("FP8 cases are judged against the FP64 oracle on the dequantised inputs, with the eager FP8 "
           "reference's error (P quantised to e4m3) as the yardstick (README, FP8 cases)",
           "the speed section times the FP8 peers present (cudnn_fp8, flashinfer_fp8, triton_fa_fp8); the bf16 "
           "kernels on the same shapes: `harness bench --preset fp8-sweep`"),
))
_add(Profile(
    "fp8-training", "FP8 training: e4m3 q/k/v with descales, bf16 out, and the FP8 backward (dO and dS in e4m3 / "
    "e5m2 with descales, gradients in bf16); causal, GQA/MQA and the backward required, windows optional",
    required=frozenset({"causal", "gqa", "backward"}), backward=True, seeds=GPU_SEEDS,
    softmax=_FP8_TRAIN_GPU, linear=(), cpu_variant="fp8-training-cpu", bench_softmax=_BENCH_FP8_TRAIN,
    notes=("the FP8 backward is the callable's attn_capabilities['fp8_backward'] (README, FP8 backward); its "
           "gradients are judged against the FP64 oracle's on the dequantised inputs and dO, with the eager FP8 "
           "backward's error as the yardstick",),
))
_CPU_NOTE = (("CPU-sized variant: the same features on tens of tokens (fp32, one fp16 case); "
             "the speed section only with --speed (host time)"),)
_add(Profile(
    "inference-cpu", "CPU-sized inference: forward only; causal, GQA/MQA and (decode) a paged KV cache required",
    required=frozenset({"causal", "gqa", "paged"}), backward=False, seeds=CPU_SEEDS,
    softmax=_CPU_BASE + _CPU_SCALE + _CPU_LAYOUT + _CPU_DECODE + _CPU_WINDOW, linear=_CPU_LIN, sized_for="cpu", bench_softmax=_CPU_BENCH, bench_linear=_CPU_BENCH_LIN,
    decode=_CPU_DEC + _CPU_DEC_OPTIONAL, bench_decode=_CPU_BENCH_DEC, notes=_CPU_NOTE,
))
_add(Profile(
    "training-gqa-cpu", "CPU-sized training-gqa: causal, GQA/MQA and backward required; windows optional",
    required=frozenset({"causal", "gqa", "backward"}), backward=True, seeds=CPU_SEEDS,
    softmax=_CPU_BASE + _CPU_SCALE + _CPU_LAYOUT + _CPU_WINDOW, linear=_CPU_LIN, sized_for="cpu", bench_softmax=_CPU_BENCH, bench_linear=_CPU_BENCH_LIN,
    notes=_CPU_NOTE,
))
_add(Profile(
    "fp8-cpu", "CPU-sized fp8: e4m3 q/k/v with descales, forward only; causal and GQA/MQA required",
    required=frozenset({"causal", "gqa"}), backward=False, seeds=CPU_SEEDS,
    softmax=_FP8_CPU, linear=(), sized_for="cpu", bench_softmax=_CPU_BENCH_FP8, notes=_CPU_NOTE,
))
_add(Profile(
    "fp8-training-cpu", "CPU-sized fp8-training: e4m3 q/k/v, the FP8 backward in e4m3 / e5m2; causal, GQA/MQA and "
    "the backward required",
    required=frozenset({"causal", "gqa", "backward"}), backward=True, seeds=CPU_SEEDS,
    softmax=_FP8_TRAIN_CPU, linear=(), sized_for="cpu", bench_softmax=_CPU_BENCH_FP8_TRAIN, notes=_CPU_NOTE,
))
_add(Profile(
    "full-cpu", "CPU-sized full: every feature required, forward and backward",
    required=_ALL, backward=True, seeds=CPU_SEEDS,
    softmax=_CPU_BASE + _CPU_SCALE + _CPU_LAYOUT + _CPU_DECODE + _CPU_WINDOW + _CPU_EXTRA, linear=_CPU_LIN, sized_for="cpu", bench_softmax=_CPU_BENCH, bench_linear=_CPU_BENCH_LIN,
    decode=_CPU_DEC + _CPU_DEC_OPTIONAL, bench_decode=_CPU_BENCH_DEC, notes=_CPU_NOTE,
))


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"--profile: unknown profile {name!r}; known: {', '.join(PROFILES)}") from None


def resolve(name: str, device_type: str) -> tuple[Profile, str | None]:
    """The profile to run for ``name`` on ``device_type`` and, when it was switched to the CPU
    variant, a sentence saying so (for the report)."""
    p = get_profile(name)
    if device_type == "cpu" and p.cpu_variant:
        return get_profile(p.cpu_variant), (
            f"--device cpu: the CPU-sized variant {p.cpu_variant!r} of {name!r} was used "
            "(same features, tens of tokens; GPU-sized cases would take hours on a CPU)"
        )
    return p, None
