"""Autograd function and public entry points: `flash_attn_func` and `flash_attn_varlen_func`.

Only the public functions validate inputs; the launchers in fwd.py / bwd.py trust them.
"""

from __future__ import annotations

import itertools
import math
import weakref

import torch

from .. import launcher
from . import configs
from .bwd import flash_attn_bwd
from .fwd import flash_attn_fwd
from .v_layout import tiles_per_head, v_keys_contiguous


def fp8_fwd_gluon_ws(*args, **kwargs):
    """kernels/flash_attn/fp8_gluon.py's warp-specialised FP8 forward, imported on first use (Gluon is
    only needed where it runs: sm90 GPUs)."""
    from .fp8_gluon import fp8_fwd_gluon_ws as run

    return run(*args, **kwargs)


SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def unsupported_reason(head_dim: int, dtype: torch.dtype, *, varlen: bool = False, fp8: bool = False) -> str | None:
    """Why (head_dim, dtype) cannot run, or None when it can. Head dims above 256 run on the wide
    kernels (kernels/flash_attn/wide.py: absorbed MLA's 576 / 512 and wider), dense inputs only
    (``varlen``, ``fp8``: the call's form, refused there with the reason)."""
    if dtype not in SUPPORTED_DTYPES and not fp8:
        return f"unsupported: dtype {dtype} (the kernels take float16, bfloat16, float32)"
    if head_dim > configs.MAX_HEAD_DIM:
        from .wide import wide_reason

        return wide_reason(head_dim, head_dim, dtype if not fp8 else torch.bfloat16, varlen=varlen, fp8=fp8)
    if head_dim < 1:
        return (f"unsupported: head dim {head_dim} (the kernels keep a [block, head_dim] tile per operand in "
                f"shared memory and registers; at most {configs.MAX_HEAD_DIM}, wider on the wide kernels)")
    if head_dim % configs.HEAD_DIM_MULTIPLE:
        return (f"unsupported: head dim {head_dim} is not a multiple of {configs.HEAD_DIM_MULTIPLE} "
                "(rows must be 16-byte aligned for vector loads, as in flash-attn)")
    return None


def _check_window(window_size) -> tuple[int, int]:
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair of ints (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each bound must be >= 0 or -1 (unbounded), got {window_size!r}")
    return left, right


def _check_common(q, k, v, rank, layout, softmax_scale, window_size):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            # ValueError, not TypeError: the project's contract is one exception type for bad input.
            raise ValueError(  # noqa: TRY004
                f"{name}: expected a torch.Tensor of shape {layout}, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {tuple(t.shape)}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q: expected dtype float16, bfloat16 or float32, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} does not match q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: device {t.device} does not match q's {q.device}")
    if not q.is_cuda and not configs.interpreting():
        raise ValueError(f"q: expected a CUDA tensor, got device {q.device} "
                         "(CPU runs only under TRITON_INTERPRET=1)")
    d = q.shape[-1]
    if k.shape[-1] != d:
        raise ValueError(f"k: head dim must equal q's {d}, got {k.shape[-1]}")
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ValueError(f"v: expected the shape of k but the last dim {tuple(k.shape[:-1])} + (d_v,), got {tuple(v.shape)}")
    hq, hk = q.shape[-2], k.shape[-2]
    if hk == 0 or hq % hk:
        raise ValueError(f"k: heads_k ({hk}) must divide heads_q ({hq}) (GQA/MQA)")
    reason = unsupported_reason(d, q.dtype, varlen=rank == 3)
    if reason:
        raise ValueError(f"q: {reason}")
    reason = unsupported_reason(v.shape[-1], q.dtype, varlen=rank == 3)
    if reason:
        raise ValueError(f"v: {reason.replace('head dim', 'value head dim')}")
    return _check_scale_and_window(softmax_scale, window_size, d)


def _check_scale_and_window(softmax_scale, window_size, d) -> tuple[float, int, int]:
    """(scale, left, right): the scale defaults to 1 / sqrt(d) and must be finite and positive."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    softmax_scale = float(softmax_scale)
    if not (softmax_scale > 0 and math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale: expected a finite positive float, got {softmax_scale}")
    left, right = _check_window(window_size)
    return softmax_scale, left, right


def _check_softcap(softcap) -> float:
    try:
        cap = float(softcap or 0.0)
    except (TypeError, ValueError):
        raise ValueError(f"softcap: expected a float >= 0 (0 is off), got {softcap!r}") from None
    if not (cap >= 0 and math.isfinite(cap)):
        raise ValueError(f"softcap: expected a finite float >= 0 (0 is off), got {softcap!r}")
    return cap


def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


class _Signature:
    """What the first call of a signature leaves for the next ones: its checked arguments, and the
    kernel launches to replay (forward; backward per dO layout). See :mod:`kernels.launcher`."""

    __slots__ = ("kw", "fwd", "bwd", "deterministic")

    def __init__(self, scale, left, right, softcap, causal, allow_tf32, max_q=None, max_k=None, deterministic=True):
        #: the launchers' keywords (the offsets tensors, which change per call, added by the call)
        self.kw = {"softmax_scale": scale, "causal": bool(causal), "window_left": left, "window_right": right,
                   "softcap": softcap, "allow_tf32": bool(allow_tf32), "max_seqlen_q": max_q, "max_seqlen_k": max_k}
        self.fwd: dict = {}
        self.bwd: dict = {}
        #: False: the backward may take a nondeterministic route (the fused Gluon kernel's dQ by TMA reduce)
        self.deterministic = bool(deterministic)

    def bwd_launches(self, dout) -> dict:
        return self.bwd.setdefault((dout.shape, dout.stride(), dout.data_ptr() % 16 == 0), {})


#: call signature -> _Signature. A signature is everything the kernels' arguments and configs are
#: computed from: the inputs' shapes, strides, dtypes, devices and 16-byte alignment, every keyword,
#: the environment knobs (configs.env_key).
_SIGNATURES = launcher.Signatures()


def _qkv_key(q, k, v) -> tuple:
    return (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() % 16 == 0, k.shape, k.stride(), k.dtype, k.device,
            k.data_ptr() % 16 == 0, v.shape, v.stride(), v.dtype, v.device, v.data_ptr() % 16 == 0)


class FlashAttnFunc(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sig, cu_q, cu_k):
        if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
            q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        out, lse = flash_attn_fwd(q, k, v, **sig.kw, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, launches=sig.fwd)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.sig = sig
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        sig = ctx.sig
        dout = _last_dim_contiguous(dout)
        dq, dk, dv = flash_attn_bwd(dout, q, k, v, out, lse, **sig.kw, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    launches=sig.bwd_launches(dout), deterministic=sig.deterministic)
        return dq, dk, dv, None, None, None


def _attend(q, k, v, sig: _Signature, cu_q, cu_k):
    """(out, lse): through :class:`FlashAttnFunc` where autograd may need a node (grad mode on and an input
    requiring grad, or a forward-mode AD level open), else the forward alone: no node, nothing saved (host time a
    call: 16.5 -> 9.5 us on a development CPU, ``benchmarks/host_python.py``; inference and forward-only timing)."""
    if launcher.autograd_needed(q, k, v):
        return FlashAttnFunc.apply(q, k, v, sig, cu_q, cu_k)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    return flash_attn_fwd(q, k, v, **sig.kw, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, launches=sig.fwd)


def flash_attn_func(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    return_lse=False, allow_tf32=False, deterministic=True):
    """Softmax attention, flash-attn's layout and conventions, differentiable (dq, dk, dv).

    q: [B, Sq, Hq, D]; k, v: [B, Sk, Hk, D] with Hk dividing Hq (GQA/MQA: query head h reads kv
    head h // (Hq // Hk)); dtype float16, bfloat16 or float32, all on one CUDA device (or CPU
    under TRITON_INTERPRET=1). D and Dv multiples of 8, up to 256 on the flash kernels; wider (absorbed
    MLA's 576 / 512 and up) on the wide kernels (kernels/flash_attn/wide.py).
    A call with the signature of an earlier one (shapes, strides, dtypes, devices, 16-byte alignment,
    keywords) skips the checks and replays its kernel launches (kernels/launcher.py).
    causal: bottom-right aligned (query i sees keys j <= i + Sk - Sq), i.e. window right = 0.
    softmax_scale: default 1 / sqrt(D).
    window_size: (left, right), query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right;
        -1 is unbounded.
    softcap: > 0 caps the scaled scores at softcap * tanh(score / softcap) (Gemma-2's 50); 0 is off.
    return_lse: also return lse [B, Hq, Sq] float32 (natural log; -inf for rows that see no key).
    allow_tf32: float32 inputs only: use tf32 tensor-core dots (about 1e-3 relative error) instead
        of the default full-precision ones.
    deterministic: True (default): the backward's gradients are bitwise the same on every run. False
        (flash-attn's default): the backward may add dQ's partials in whatever order they arrive, where
        that is faster (the fused Gluon backward, configs.BWD_GLUON_FUSED, on an H100 / H200: hd 128 MHA from
        1k, GQA / MQA non-causal from 1k and causal from 8k; hd 64 MHA causal from 1k, non-causal from 2k,
        GQA / MQA from 2k); dQ then varies by fp32 rounding between runs. True
        runs the same fused kernel with its dQ adds in a fixed order where that is faster than the split
        kernels (configs.BWD_GLUON_FUSED_ORDERED: MHA hd 128 non-causal from 8k).
    Returns out [B, Sq, Hq, D] in q's dtype (rows that see no key are 0), or (out, lse).
    Raises ValueError naming the argument for bad input, "unsupported: <reason>" before any launch.
    """
    try:  # a call like an earlier one reuses its checks and launches
        key = (*_qkv_key(q, k, v), causal, softmax_scale, window_size, softcap, allow_tf32, deterministic,
               configs.env_key())
    except (AttributeError, TypeError):  # not tensors: the checks below say what is wrong
        key = None
    sig = _SIGNATURES.get(key)
    if sig is None:
        scale, left, right = _check_common(q, k, v, 4, "[B, S, H, D]", softmax_scale, window_size)
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"k: batch {k.shape[0]} does not match q's {q.shape[0]} (expected [B, Sk, Hk, D])")
        sig = _SIGNATURES.put(key, _Signature(scale, left, right, _check_softcap(softcap), causal, allow_tf32,
                                              deterministic=deterministic))
    out, lse = _attend(q, k, v, sig, None, None)
    return (out, lse) if return_lse else out


#: id(offsets tensor) -> (a weak reference to it, its version counter then, the total it was checked
#: against, its longest sequence). Keyed by id: a tensor's == is elementwise, so no weak-key dict.
_VALIDATED_OFFSETS: dict[int, tuple] = {}


def _validated_offsets(name: str, cu: torch.Tensor, total: int) -> int:
    """Check ``cu`` (non-decreasing from 0 to ``total``) and return its longest sequence; a tensor
    already checked, unchanged since, is not read again (no host copy)."""
    try:
        version = cu._version
    except RuntimeError:  # an inference-mode tensor has no version counter: checked on every call
        version = None
    seen = _VALIDATED_OFFSETS.get(id(cu))
    if version is not None and seen is not None and seen[0]() is cu and seen[1:3] == (version, total):
        return seen[3]
    vals = cu.tolist()  # the one device-to-host copy
    if vals[0] != 0 or vals[-1] != total or any(a > b for a, b in itertools.pairwise(vals)):
        raise ValueError(f"{name}: expected non-decreasing offsets from 0 to {total}, got {vals}")
    longest = max((b - a for a, b in itertools.pairwise(vals)), default=0)
    if version is None:
        return longest
    key = id(cu)
    ref = weakref.ref(cu, lambda _, key=key: _VALIDATED_OFFSETS.pop(key, None))  # gone with the tensor
    _VALIDATED_OFFSETS[key] = (ref, version, total, longest)
    return longest


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                           softmax_scale=None, window_size=(-1, -1), softcap=0.0, return_lse=False, allow_tf32=False,
                           validate=True):
    """Variable-length (packed) attention, flash-attn's varlen convention, differentiable.

    q: [Tq, Hq, D]; k, v: [Tk, Hk, D]; cu_seqlens_q / cu_seqlens_k: [B + 1] int32 on q's device,
    non-decreasing from 0 to Tq / Tk; sequence b is q[cu_q[b]:cu_q[b+1]] against
    k/v[cu_k[b]:cu_k[b+1]]. max_seqlen_q / max_seqlen_k: ints >= the longest sequence (they size the
    grid). Masks are per sequence, as in flash_attn_func. Returns out [Tq, Hq, D] or
    (out, lse [Hq, Tq] float32).

    ``validate``: check the offsets' values (monotonic from 0 to the total, no sequence above
    max_seqlen). That reads them on the host, a device synchronisation, so it is done once per
    offsets tensor: later calls with the same tensor object, not modified in place since (torch's
    version counter), reuse the result, and a model's layers sharing one ``cu_seqlens`` pay one copy
    per batch, not one per call. (A tensor rewritten by a kernel outside torch's in-place ops keeps
    its version: pass a new tensor.) ``validate=False`` skips the checks altogether.
    """
    try:
        key = (*_qkv_key(q, k, v), cu_seqlens_q.shape, cu_seqlens_q.dtype, cu_seqlens_q.device,
               cu_seqlens_q.data_ptr() % 16 == 0, cu_seqlens_k.shape, cu_seqlens_k.dtype, cu_seqlens_k.device,
               cu_seqlens_k.data_ptr() % 16 == 0, max_seqlen_q, max_seqlen_k, causal, softmax_scale, window_size,
               softcap, allow_tf32, configs.env_key())
    except (AttributeError, TypeError):
        key = None
    sig = _SIGNATURES.get(key)
    if sig is None:
        scale, left, right = _check_common(q, k, v, 3, "[T, H, D]", softmax_scale, window_size)
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 1:
                raise ValueError(f"{name}: expected a 1-D int32 tensor [B + 1]")
            if cu.dtype != torch.int32:
                raise ValueError(f"{name}: expected dtype int32, got {cu.dtype}")
            if cu.device != q.device:
                raise ValueError(f"{name}: device {cu.device} does not match q's {q.device}")
        if cu_seqlens_k.numel() != cu_seqlens_q.numel():
            raise ValueError(f"cu_seqlens_k: expected {cu_seqlens_q.numel()} entries like cu_seqlens_q, "
                             f"got {cu_seqlens_k.numel()}")
        cap = _check_softcap(softcap)
    if validate:  # the offsets' values: read once per offsets tensor (see _validated_offsets)
        for name, cu, total, longest in (("q", cu_seqlens_q, q.shape[0], max_seqlen_q),
                                         ("k", cu_seqlens_k, k.shape[0], max_seqlen_k)):
            seen = _validated_offsets(f"cu_seqlens_{name}", cu, total)
            if seen > int(longest):
                kind = "query" if name == "q" else "key"
                raise ValueError(f"max_seqlen_{name}: {longest} is less than the longest {kind} sequence {seen}")
    if sig is None:
        sig = _SIGNATURES.put(key, _Signature(scale, left, right, cap, causal, allow_tf32, int(max_seqlen_q),
                                              int(max_seqlen_k)))
    out, lse = _attend(q, k, v, sig, cu_seqlens_q, cu_seqlens_k)
    return (out, lse) if return_lse else out


FP8_DTYPE = torch.float8_e4m3fn
#: The FP8 forward's output dtypes: bf16 / fp16 (real values), or e4m3 in V's units (out x v_descale is
#: the real value: the output scale is 1 / v_descale, as cuDNN's FP8-output graphs are given it here).
FP8_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


class _Fp8Signature:
    """What the first FP8 call of a signature leaves for the next ones: the launcher's checked
    keywords and the launches to replay (the V copy's, the forward's)."""

    __slots__ = ("kw", "v_transposed", "copy", "fwd", "gluon")

    def __init__(self, kw: dict, gluon: tuple[int, int] | None = None):
        self.kw = kw
        self.v_transposed = kw["v_transposed"]
        self.copy: dict = {}
        self.fwd: dict = {}
        self.gluon = gluon  # (BLOCK_N, stages) where the warp-specialised Gluon kernel runs the call


def _fp8_signature(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale, window_size, softcap,
                   out_dtype, v_transposed, max_num_imprecise_acc) -> _Fp8Signature:
    """Check a call of :func:`flash_attn_fp8_func` (ValueError naming the argument) and work out its
    launcher keywords."""
    settings = max_num_imprecise_acc if isinstance(max_num_imprecise_acc, tuple) else (max_num_imprecise_acc,)
    if len(settings) not in (1, 2) or any(
            x is not None and (not isinstance(x, int) or isinstance(x, bool) or x < 0) for x in settings):
        raise ValueError("max_num_imprecise_acc: None, a non-negative int, or a (Q K^T, P V) pair of them, "
                         f"got {max_num_imprecise_acc!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-dim [B, S, H, D] tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype != FP8_DTYPE:
            raise ValueError(f"{name}: expected dtype {FP8_DTYPE} (e4m3), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: device {t.device} does not match q's {q.device}")
    if not q.is_cuda and not configs.interpreting():
        raise ValueError(f"q: expected a CUDA tensor, got device {q.device} (CPU runs only under TRITON_INTERPRET=1)")
    if out_dtype not in FP8_OUT_DTYPES:
        raise ValueError(f"out_dtype: bfloat16, float16 or float8_e4m3fn, got {out_dtype}")
    B, _, hq, d = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[-1] != d or tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise ValueError(f"k, v: expected [B={B}, Sk, Hk, D={d}] and [B, Sk, Hk, Dv], got {tuple(k.shape)} and {tuple(v.shape)}")
    hk = k.shape[2]
    if hk == 0 or hq % hk:
        raise ValueError(f"k: heads_k ({hk}) must divide heads_q ({hq}) (GQA/MQA)")
    for name, dim in (("q", d), ("v", v.shape[-1])):
        reason = unsupported_reason(dim, torch.bfloat16, fp8=True)
        if reason:
            raise ValueError(f"{name}: {reason}")
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, hk) or t.dtype != torch.float32:
            raise ValueError(f"{name}: expected a float32 [B={B}, Hk={hk}] tensor, got "
                             f"{getattr(t, 'shape', type(t).__name__)} {getattr(t, 'dtype', '')}")
        if t.device != q.device:
            raise ValueError(f"{name}: device {t.device} does not match q's {q.device}")
    softmax_scale, left, right = _check_scale_and_window(softmax_scale, window_size, d)
    if v_transposed is None:
        v_transposed = q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9
    softcap = _check_softcap(softcap)
    gluon = configs.FP8_GLUON_WS.get(d)
    if gluon and not (q.is_cuda and not configs.interpreting() and torch.cuda.get_device_capability(q.device)[0] == 9
                      and v_transposed and v.shape[-1] == d and left < 0 and (right < 0 or causal) and not softcap
                      and out_dtype in (torch.bfloat16, torch.float8_e4m3fn) and max_num_imprecise_acc is None
                      and all(t.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in t.stride()[:-1]) for t in (q, k))):
        gluon = None  # what the Gluon kernel does not do (windows, softcap, fp16 out, promotion, TMA alignment)
    return _Fp8Signature({"softmax_scale": softmax_scale, "causal": bool(causal), "window_left": left,
                          "window_right": right, "softcap": softcap, "out_dtype": out_dtype,
                          "v_transposed": bool(v_transposed), "max_num_imprecise_acc": max_num_imprecise_acc}, gluon)


def flash_attn_fp8_func(q, k, v, q_descale, k_descale, v_descale, *, causal=False, softmax_scale=None,
                        window_size=(-1, -1), softcap=0.0, out_dtype=torch.bfloat16, return_lse=False,
                        v_transposed=None, max_num_imprecise_acc=None):
    """FP8 forward (flash-attn 3's FP8 convention): q [B, Sq, Hq, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv]
    in float8_e4m3fn; q_descale, k_descale, v_descale [B, Hk] float32 (real value = fp8 value x its
    descale; q's factor is per kv head's group), positive and finite: not checked, since reading them
    would copy them to the host on every call (the kernel takes each row's max before the scale and
    raises a scale below the smallest normal float to it, so a negative q or k descale gives wrong
    rows; a zero one gives uniform rows, as the dequantised zeros do). Q K^T of the FP8 values with
    fp32 accumulation times the descales and the scale, the online softmax in fp32, P cast to e4m3 for
    P V (fp32 accumulation), v_descale / l at the end. Forward only (no autograd). Masks, scale and softcap as
    in :func:`flash_attn_func`. Returns out [B, Sq, Hq, Dv] in ``out_dtype`` (bf16 or fp16), or
    (out, lse [B, Hq, Sq] float32). ``out_dtype=torch.float8_e4m3fn`` writes the output in e4m3 with
    the scale 1 / v_descale: its real value is out x v_descale (per (batch, kv head), shared by the
    group's query heads); |out| <= max|V| keeps it in the format's range. ``v_transposed``: copy V to [B, Hk, Dv, Sk] first so that the
    P V dot reads it K-major, as Hopper's FP8 MMA wants (default: on sm90 and newer; the copy is part
    of the call's time), its keys in the order P's MMA registers hold them (v_layout's MMA order: no
    shuffle of P before P V). ``max_num_imprecise_acc``: how many products Hopper's FP8 tensor cores may
    add in their own reduced-precision accumulator (about 14 bits) before the sum is promoted to the
    fp32 one (Triton's ``tl.dot`` knob, at most the dot's depth); an int for both dots or a pair
    ``(qk, pv)``. None (default) never promotes, as cuDNN's FP8 attention does not: Q K^T starts
    from zero every key block, so its error stays at the accumulator's ~2^-14 (lse 3-5e-6 rel-RMS
    on the H100, the tolerance rule's FP8 lse floor is 2^-14), and P V's error is buried under P's
    e4m3 rounding (out error unchanged at 16k keys). 0 promotes after every MMA: lse as an fp32
    accumulation (4.5e-8) at 0.5-0.6x the speed (docs/perf/flash_attn.md, session 11).
    A call with the signature of an earlier one (shapes, strides, dtypes, devices and 16-byte alignment
    of the inputs and descales, keywords) skips the checks and replays its launches, the V copy's
    and the forward's (kernels/launcher.py). Head dims listed in ``configs.FP8_GLUON_WS`` (hd 256:
    measured 1.04-1.15x the Triton kernel, session 17) run the warp-specialised Gluon kernel on sm90
    instead (kernels/flash_attn/fp8_gluon.py) where it applies: no window or softcap, bf16 or e4m3 out, the
    default accumulation.
    """
    overlap = configs.FP8_V_OVERLAP
    try:  # a call like an earlier one reuses its checks and launches (the V copy's and the forward's)
        key = ("fp8", *_qkv_key(q, k, v), *_qkv_key(q_descale, k_descale, v_descale), causal, softmax_scale,
               window_size, softcap, out_dtype, v_transposed, max_num_imprecise_acc, configs.env_key(), overlap)
    except (AttributeError, TypeError):  # not tensors: the checks below say what is wrong
        key = None
    sig = _SIGNATURES.get(key)
    if sig is None:
        sig = _SIGNATURES.put(key, _fp8_signature(q, k, v, q_descale, k_descale, v_descale, causal, softmax_scale,
                                                  window_size, softcap, out_dtype, v_transposed,
                                                  max_num_imprecise_acc))
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    descales = (q_descale.contiguous(), k_descale.contiguous(), v_descale.contiguous())
    v_ready, after = None, False
    mode = overlap if sig.v_transposed and not sig.gluon else ""  # the overlap is the Triton kernel's
    if mode == "counters":  # each head read as soon as it is copied
        v_ready = (torch.zeros(v.shape[0] * v.shape[2], dtype=torch.int32, device=v.device),
                   tiles_per_head(v.shape[1], v.shape[3]))
        v = v_keys_contiguous(v, launches=sig.copy, mma_order=True, ready=v_ready[0])
    elif mode == "pdl":  # the forward starts as the copy ends
        after = q.is_cuda
        v = v_keys_contiguous(v, launches=sig.copy, mma_order=True, launch_dependents=after)
    elif sig.v_transposed:  # the Triton kernel reads V's keys in the MMA order (v_layout), the Gluon kernel in order
        v = v_keys_contiguous(v, launches=sig.copy, mma_order=not sig.gluon)
    if sig.gluon:  # a head dim configs.FP8_GLUON_WS routes to the warp-specialised Gluon kernel (hd 256)
        out, lse = fp8_fwd_gluon_ws(q, k, v, descales, softmax_scale=sig.kw["softmax_scale"], causal=sig.kw["causal"],
                                    block_n=sig.gluon[0], num_stages=sig.gluon[1], out_dtype=sig.kw["out_dtype"])
    else:
        out, lse = flash_attn_fwd(q, k, v, **sig.kw, v_mma_order=sig.v_transposed, descales=descales,
                                  launches=sig.fwd, v_ready=v_ready, v_after_copy=after)
    return (out, lse) if return_lse else out


#: The FP8 backward's gradient formats (dO's, and dQ / dK / dV written in it when asked for).
FP8_GRAD_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
#: The FP8 backward's output dtypes besides dO's FP8 format: real values.
FP8_BWD_REAL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class _Fp8BwdSignature:
    """What the first FP8 backward call of a signature leaves for the next ones: the launcher's checked
    keywords and the launches to replay (the three sequence-contiguous copies', the backward's)."""

    __slots__ = ("kw", "copies", "bwd")

    def __init__(self, kw: dict):
        self.kw = kw
        self.copies: dict = {"q": {}, "k": {}, "do": {}}
        self.bwd: dict = {}


def fp8_bwd_unsupported_reason(head_dim: int, head_dim_v: int) -> str | None:
    """Why the FP8 backward cannot take these head dims ("<q or v>: unsupported: ..."), or None."""
    for name, dim in (("q", head_dim), ("v", head_dim_v)):
        if dim < 32 or dim > configs.MAX_HEAD_DIM or dim % 16:
            return (f"{name}: unsupported: head dim {dim} in the FP8 backward (multiples of 16 from 32 to "
                    f"{configs.MAX_HEAD_DIM}: its dots reduce over the head dims, 32 deep for FP8)")
    if configs.block_db(head_dim, 1):
        return (f"q: unsupported: head dim {head_dim} in the FP8 backward (the forward splits it in two "
                "power-of-two parts; the FP8 backward takes power-of-two or padded head dims)")
    return None


def _meta(t) -> tuple | None:
    """What a signature keys a small tensor argument on (a descale): shape, strides, dtype, device and 16-byte
    alignment (Triton specialises pointers on it); None for None."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def _fp8_bwd_signature(do, q, k, v, out, lse, descales: dict, causal, softmax_scale, window_size,
                       grad_dtype) -> _Fp8BwdSignature:
    """Check a call of :func:`flash_attn_fp8_bwd_func` (ValueError naming the argument) and work out its
    launcher keywords. The forward's checks first (q, k, v, their descales, scale, window)."""
    fwd = _fp8_signature(q, k, v, descales["q_descale"], descales["k_descale"], descales["v_descale"], causal,
                         softmax_scale, window_size, 0.0, torch.bfloat16, None, None)
    B, sq, hq, d = q.shape
    hk, dv = k.shape[2], v.shape[-1]
    if not isinstance(do, torch.Tensor) or do.dtype not in FP8_GRAD_DTYPES or tuple(do.shape) != (B, sq, hq, dv):
        raise ValueError(f"do: expected a [B={B}, Sq={sq}, Hq={hq}, Dv={dv}] float8_e4m3fn or float8_e5m2 tensor, got "
                         f"{getattr(do, 'shape', type(do).__name__)} {getattr(do, 'dtype', '')}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, sq, hq, dv) or out.dtype not in FP8_OUT_DTYPES + (
            torch.float32,):
        raise ValueError(f"out: expected the forward's [B={B}, Sq={sq}, Hq={hq}, Dv={dv}] output (bf16, fp16, fp32 or "
                         f"e4m3), got {getattr(out, 'shape', type(out).__name__)} {getattr(out, 'dtype', '')}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, hq, sq) or lse.dtype != torch.float32:
        raise ValueError(f"lse: expected the forward's float32 [B={B}, Hq={hq}, Sq={sq}] log-sum-exp, got "
                         f"{getattr(lse, 'shape', type(lse).__name__)} {getattr(lse, 'dtype', '')}")
    if grad_dtype not in FP8_BWD_REAL_DTYPES + (do.dtype,):
        raise ValueError(f"grad_dtype: bfloat16, float16, float32 or dO's format {do.dtype}, got {grad_dtype}")
    needed = ["do_descale", "ds_descale", "out_descale"]
    if grad_dtype.itemsize == 1:
        needed += ["dq_descale", "dk_descale", "dv_descale"]
    for name in needed:
        t = descales[name]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, hk) or t.dtype != torch.float32:
            raise ValueError(f"{name}: expected a float32 [B={B}, Hk={hk}] tensor, got "
                             f"{getattr(t, 'shape', type(t).__name__)} {getattr(t, 'dtype', '')}"
                             + (" (FP8 gradients are written over their descales)" if name[1] in "qkv" else ""))
    for name, t in (("do", do), ("out", out), ("lse", lse), *((n, descales[n]) for n in needed)):
        if t.device != q.device:
            raise ValueError(f"{name}: device {t.device} does not match q's {q.device}")
    reason = fp8_bwd_unsupported_reason(d, dv)
    if reason:
        raise ValueError(reason)
    kw = {n: fwd.kw[n] for n in ("softmax_scale", "causal", "window_left", "window_right")}
    return _Fp8BwdSignature(dict(kw, grad_dtype=grad_dtype, mma_order=configs.FP8_BWD_MMA_ORDER))


def flash_attn_fp8_bwd_func(do, q, k, v, out, lse, q_descale, k_descale, v_descale, do_descale, ds_descale, *,
                            causal=False, softmax_scale=None, window_size=(-1, -1), out_descale=None,
                            grad_dtype=torch.bfloat16, dq_descale=None, dk_descale=None, dv_descale=None):
    """FP8 backward (cuDNN's ``sdpa_fp8_backward`` convention, the harness's ``fp8_grad`` contract): the
    gradients of :func:`flash_attn_fp8_func`'s attention, computed on the FP8 tensor cores.

    q, k, v: the forward's e4m3 inputs with their [B, Hk] float32 descales; ``out`` the forward's output
    (bf16 / fp16 / fp32 real values, or e4m3 whose real value is out x ``out_descale``, by default
    ``v_descale`` as flash_attn_fp8_func writes it) and its lse [B, Hq, Sq] (``return_lse=True``); ``do``
    dO in e4m3 or e5m2 (real value dO x ``do_descale``). Per key block: S = Q K^T from the FP8 values,
    P = exp(S x descales x scale - lse); dV += P^T dO with P in e4m3 at 448 (as the forward's P); dP = dO V^T;
    dS = scale x P o (dP - rowsum(dO o O)), the gradient of the unscaled scores, quantised to dO's format
    over ``ds_descale`` for dQ = dS K and dK += dS^T Q (GQA: summed over a group's query heads); every dot
    accumulates in fp32. The dots that reduce over the sequence read Q, K and dO from copies with the
    sequence contiguous (v_layout.v_keys_contiguous: Hopper's FP8 MMA reads both operands K-major); the
    copies are part of the call. Returns (dq, dk, dv) shaped like q, k, v: real values in ``grad_dtype``
    (bf16, fp16, fp32), or written in dO's format over ``dq_descale``, ``dk_descale``, ``dv_descale``
    (``grad_dtype=do.dtype``; real value = gradient x its descale). Masks and scale as in
    :func:`flash_attn_func`; no softcap, dense inputs, head dims 32-256 (multiples of 16, no split).
    Deterministic (the dK / dV kernel sums a group's heads in order, the group split's partials too).
    A call with the signature of an earlier one skips the checks and replays its launches.
    Raises ValueError naming the argument for bad input."""
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "do_descale": do_descale,
                "ds_descale": ds_descale, "out_descale": v_descale if out_descale is None else out_descale,
                "dq_descale": dq_descale, "dk_descale": dk_descale, "dv_descale": dv_descale}
    try:  # a call like an earlier one reuses its checks and launches
        key = ("fp8-bwd", *_qkv_key(q, k, v), *_qkv_key(do, out, lse), *map(_meta, descales.values()), causal,
               softmax_scale, window_size, grad_dtype, configs.env_key(), configs.FP8_BWD_MMA_ORDER)
    except (AttributeError, TypeError):  # not tensors: the checks below say what is wrong
        key = None
    sig = _SIGNATURES.get(key)
    if sig is None:
        sig = _SIGNATURES.put(key, _fp8_bwd_signature(do, q, k, v, out, lse, descales, causal, softmax_scale,
                                                      window_size, grad_dtype))
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or do.stride(-1) != 1:
        q, k, v, do = (_last_dim_contiguous(t) for t in (q, k, v, do))
    mma = sig.kw["mma_order"]
    fp8 = {"QT": v_keys_contiguous(q, launches=sig.copies["q"], mma_order=mma),
           "KT": v_keys_contiguous(k, launches=sig.copies["k"], mma_order=mma),
           "DOT": v_keys_contiguous(do, launches=sig.copies["do"], mma_order=mma)}
    unused = descales["do_descale"]  # where the gradients are real values, their descales are never read
    for kernel_name, name in (("QDescale", "q_descale"), ("KDescale", "k_descale"), ("VDescale", "v_descale"),
                              ("DODescale", "do_descale"), ("DSDescale", "ds_descale"), ("ODescale", "out_descale"),
                              ("DQDescale", "dq_descale"), ("DKDescale", "dk_descale"), ("DVDescale", "dv_descale")):
        t = descales[name]
        fp8[kernel_name] = unused if t is None else t.contiguous()
    kw = sig.kw
    return flash_attn_bwd(do, q, k, v, out, lse, softmax_scale=kw["softmax_scale"], causal=kw["causal"],
                          window_left=kw["window_left"], window_right=kw["window_right"], fp8=fp8,
                          grad_dtype=kw["grad_dtype"], fp8_mma_order=mma, launches=sig.bwd)
