"""``decode_attention``: flash-attn's ``flash_attn_with_kvcache`` contract, on the split-K kernel.

Validates its arguments (a ValueError naming the argument, before any launch), writes the new
tokens into the cache in place (no device-to-host copy: the slots come from ``cache_seqlens`` and
the page table on the device), picks the number of splits from the batch, the kv heads and the
device's multiprocessors, then launches :mod:`kernels.decode.kernel`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from kernels import launcher
from kernels.decode.kernel import _append_kernel, _combine_kernel, _split_kernel
from kernels.flash_attn.configs import interpreting, patch_interpreter_scalar_index, tensor_sm_count


@dataclass(frozen=True)
class DecodeConfig:
    """Tile and launch choices of the split kernel (``benchmarks/tune_decode.py`` measures them)."""

    block_n: int = 64  # keys per block (a page size's divisor when it is one, else gathered per key)
    block_r_max: int = 64  # query rows (group heads x new tokens) per program at most
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 8  # splits aim at this many programs per multiprocessor (B = 1 must fill the GPU)
    min_chunk: int = 256  # keys per split at least (a shorter split costs more in set-up than it reads)
    #: the splits' partial results (fp32 out, max, sum per row, written then read by the combine)
    #: stay below this share of the keys and values read: MQA and MLA (many query heads per kv head)
    #: get fewer splits
    max_partial_share: float = 0.05
    #: the new tokens written into the cache by the split kernel itself (read from k / v this step), not by an
    #: append launch before it: one launch a step fewer (kernel.py's FUSE_APPEND). On since session 30 (H100: device
    #: time 0.96-1.00x on the GQA / MQA steps, host 0.77-0.80x in launch floors; docs/perf/decode-s30)
    fuse_append: bool = True

    def __post_init__(self):
        for name in ("block_n", "block_r_max"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}: a power of two >= 16, got {v}")
        if (self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.programs_per_sm <= 0
                or self.min_chunk < 1 or not 0 < self.max_partial_share):
            raise ValueError(f"config: num_warps in 1..16 (a power of two), num_stages >= 1, programs_per_sm > 0: {self}")


#: ``KERNELS_DECODE_FUSE_APPEND=0`` (read at import) turns ``fuse_append`` off in :data:`CONFIG` and
#: :data:`INTERPRET_CONFIG` (on otherwise): the append launch back, to measure one against the other in a process
#: each (docs/device-runbook.md). Never on in :data:`WIDE_CONFIG`: fused, absorbed MLA's split kernel holds one
#: program an SM instead of two (docs/perf/decode-s29) and took 1.05x the device time (docs/perf/decode-s30).
FUSE_APPEND_ENV = "KERNELS_DECODE_FUSE_APPEND"
_FUSE_APPEND = os.environ.get(FUSE_APPEND_ENV, "1") != "0"
#: Head dims up to 256 (every model's GQA / MQA / MHA decode).
CONFIG = DecodeConfig(fuse_append=_FUSE_APPEND)
#: Above 256 (absorbed MLA: d_qk 576, d_v 512): a wide q and acc tile per row, so fewer rows and keys
#: per program to stay in registers.
WIDE_CONFIG = DecodeConfig(block_n=32, block_r_max=16, num_warps=8, num_stages=2, fuse_append=False)
#: Pages must hold a multiple of 16 tokens: the sizes serving stacks use (vLLM 16, 32; 64; FA2's 256)
#: and the ones tested. A page a key block divides is read one table entry per block, any other
#: (smaller, or 48) one entry per key (``PAGE_GATHER`` in the kernel).
PAGE_MULTIPLE = 16
#: The interpreter (CPU) runs programs serially: small blocks (pages of 16 then take the per-key
#: page path, pages of 32 and more the per-block one) and a few splits to test the combine.
INTERPRET_CONFIG = DecodeConfig(block_n=32, block_r_max=64, fuse_append=_FUSE_APPEND)
INTERPRET_SPLITS = 3
MAX_HEAD_DIM = 1024


_INDEX = (torch.int32, torch.int64)


def _check(q, k_cache, v_cache, k, v, cache_seqlens, block_table, window_size, validate):
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-dim tensor, got {getattr(t, 'shape', type(t).__name__)}")
    B, Sq, Hq, D = q.shape
    Hk = k_cache.shape[2]
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q: unsupported: dtype {q.dtype} (fp16, bf16 or fp32; the kernel accumulates in fp32)")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"k_cache / v_cache: dtype {k_cache.dtype} / {v_cache.dtype} must be q's {q.dtype}")
    if k_cache.shape[-1] != D:
        raise ValueError(f"k_cache: head dim {k_cache.shape[-1]} does not match q's {D}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's {tuple(k_cache.shape)}")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k_cache: heads_q ({Hq}) must be a multiple of the cache's heads ({Hk})")
    if max(D, v_cache.shape[-1]) > MAX_HEAD_DIM:
        raise ValueError(f"q / v_cache: head dims up to {MAX_HEAD_DIM}, got {D} / {v_cache.shape[-1]}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q, k_cache, v_cache: the last (head) dim must be contiguous")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.shape != (B,) or cache_seqlens.dtype not in _INDEX:
        raise ValueError(f"cache_seqlens: expected an int32 / int64 tensor of shape ({B},), got "
                         f"{getattr(cache_seqlens, 'shape', cache_seqlens)} {getattr(cache_seqlens, 'dtype', '')}")
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new tensors or neither")
    if k is not None and (k.shape != (B, Sq, Hk, D) or v.shape[:3] != (B, Sq, Hk)):
        raise ValueError(f"k / v: expected ({B}, {Sq}, {Hk}, ...) new tokens, got {tuple(k.shape)} / {tuple(v.shape)}")
    if k is not None and (k.stride(-1) != 1 or v.stride(-1) != 1 or k.dtype != q.dtype or v.dtype != q.dtype):
        raise ValueError(f"k / v: new tokens in q's dtype ({q.dtype}) with a contiguous last dim")
    if block_table is not None:
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype not in _INDEX:
            raise ValueError(f"block_table: expected int32 / int64 (batch={B}, pages), got {tuple(block_table.shape)} {block_table.dtype}")
        page = k_cache.shape[1]
        if page % PAGE_MULTIPLE:
            raise ValueError(f"k_cache: page size {page} is not a multiple of {PAGE_MULTIPLE}")
        capacity = block_table.shape[1] * page
    else:
        capacity = k_cache.shape[1]
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache: a contiguous cache has one row per sequence ({B}), got {k_cache.shape[0]}")
    left, right = (int(w) for w in window_size)
    if validate:  # reads device tensors (a synchronisation): off in timed loops
        new = Sq if k is not None else 0
        lens = cache_seqlens.to(torch.int64)
        if bool((lens < 0).any()) or bool((lens + new > capacity).any()):
            top = int((lens + new).max())
            raise ValueError(f"cache_seqlens: a sequence needs {top} slots (with {new} new), above the "
                             f"cache's capacity of {capacity}")
        if block_table is not None:
            lo, hi = int(block_table.min()), int(block_table.max())
            if lo < 0 or hi >= k_cache.shape[0]:
                raise ValueError(f"block_table: entries must be pages 0..{k_cache.shape[0] - 1}, found {lo}..{hi}")
    return B, Sq, Hq, Hk, D, capacity, left, right


def _append_launch(k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Write the new tokens at cache_seqlens (in place), in one launch, without leaving the device.
    Returns the launch's :class:`kernels.launcher.Launch` (None under the interpreter)."""
    B, Sq, Hk = k.shape[0], k.shape[1], k.shape[2]
    paged = block_table is not None
    args = (k, v, k_cache, v_cache, cache_seqlens, block_table if paged else cache_seqlens,
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), block_table.stride(0) if paged else 0)
    return launcher.launch(_append_kernel, (B * Sq,), launcher.by_name(_append_kernel, args, dict(
        SQ=Sq, HK=Hk, PAGE=k_cache.shape[1] if paged else 1, PAGED=paged, D=k.shape[-1], DV=v.shape[-1],
        BLOCK_H=triton.next_power_of_2(Hk), BLOCK_D=triton.next_power_of_2(k.shape[-1]),
        BLOCK_DV=triton.next_power_of_2(v.shape[-1]))))


def split_count(B, Hq, Hk, Sq, D, Dv, rblocks, span, itemsize, config: DecodeConfig, sms: int) -> int:
    """Splits of the key range: about ``config.programs_per_sm`` programs per multiprocessor, each
    at least ``config.min_chunk`` keys, and few enough that the partial results stay below
    ``config.max_partial_share`` of the keys and values read."""
    want = math.ceil(config.programs_per_sm * sms / (B * Hk * rblocks))
    by_chunk = math.ceil(span / config.min_chunk)
    kv_bytes = span * Hk * (D + Dv) * itemsize
    partial_bytes = 2 * Hq * Sq * (Dv + 2) * 4  # one split's out, max and sum per row, written and read
    by_traffic = int(config.max_partial_share * kv_bytes / partial_bytes)
    return max(1, min(want, by_chunk, by_traffic))


_CONTIGUOUS = torch.contiguous_format


def _tensor_key(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


#: call signature -> _Plan: the tensors' shapes, strides, dtypes, devices and 16-byte alignment and
#: every keyword. Only calls with validate=False are replayed (a validating call reads the device).
_SIGNATURES = launcher.Signatures()


def decode_attention(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table=None, causal=True,
                     softmax_scale=None, window_size=(-1, -1), softcap=0.0, num_splits=None, return_lse=False,
                     validate=True, config: DecodeConfig | None = None):
    """Attention of ``q`` (B, Sq, Hq, D) over a KV cache, after appending ``k``, ``v`` (B, Sq, Hk, D).

    k_cache / v_cache: contiguous (B, capacity, Hk, D / Dv), or paged (num_blocks, page_size, Hk, D /
    Dv) with ``block_table`` (B, pages) int32; ``cache_seqlens`` (B,) int32: each sequence's length
    before the step. Masks bottom-right aligned (the new tokens see the whole cache). Returns out
    (B, Sq, Hq, Dv), and lse (B, Hq, Sq) float32 with ``return_lse``. The cache is written in place.
    ``validate=False`` skips the checks that read device tensors (for timed loops and serving
    loops); such a call with the signature of an earlier one (shapes, strides, dtypes, alignment,
    keywords) replays its launches (kernels/launcher.py). ``config``: tile and launch choices
    (default: :data:`CONFIG`, :data:`WIDE_CONFIG` above head dim 256); ``num_splits``: the split
    count (default: from ``config.programs_per_sm`` and the GPU).
    """
    try:
        key = None if validate else (
            _tensor_key(q), _tensor_key(k_cache), _tensor_key(v_cache), _tensor_key(k), _tensor_key(v),
            _tensor_key(cache_seqlens), _tensor_key(block_table), causal, softmax_scale, window_size, softcap,
            num_splits, config)
    except (AttributeError, TypeError):  # not tensors: the checks say what is wrong
        key = None
    plan = _SIGNATURES.get(key)
    if plan is None:
        plan = _SIGNATURES.put(key, _Plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal,
                                          softmax_scale, window_size, softcap, num_splits, validate, config))
    out, lse = plan(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    return (out, lse) if return_lse else out


class _Plan:
    """One signature's checked arguments, split count and allocation shapes, and its launches
    (taken from the first call, replayed by the next ones)."""

    def __init__(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, softmax_scale, window_size,
                 softcap, num_splits, validate, config):
        B, Sq, Hq, Hk, D, capacity, left, right = _check(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                                                         window_size, validate)
        if causal:
            right = 0
        Dv = v_cache.shape[-1]
        if config is None:
            config = INTERPRET_CONFIG if interpreting() else (CONFIG if max(D, Dv) <= 256 else WIDE_CONFIG)
        self.config = config
        rows = Hq // Hk * Sq
        self.block_r = min(max(16, triton.next_power_of_2(rows)), config.block_r_max)
        rblocks = triton.cdiv(rows, self.block_r)
        # the keys the splits share: the whole capacity, or a window's span (its first block aligned down)
        span = capacity if left < 0 else min(capacity, left + Sq + 2 * config.block_n)
        if num_splits is None:
            if interpreting() or q.device.type != "cuda":
                num_splits = INTERPRET_SPLITS
            else:
                num_splits = split_count(B, Hq, Hk, Sq, D, Dv, rblocks, span, q.element_size(), config,
                                         tensor_sm_count(q))
        self.chunk = triton.cdiv(triton.cdiv(span, num_splits), config.block_n) * config.block_n
        self.num_splits = max(1, triton.cdiv(span, self.chunk))
        self.direct = self.num_splits == 1  # the split kernel writes the output itself
        self.shapes = (B, Sq, Hq, Hk, D, Dv, rblocks, left, right)
        self.scale = D**-0.5 if softmax_scale is None else float(softmax_scale)
        self.softcap = float(softcap or 0.0)
        self.device, self.dtype = q.device, q.dtype
        # the split's partial results (fp32 [B, Hq, Sq, S, Dv] and two [B, Hq, Sq, S]) in the kernels' workspace
        # (launcher.workspace): no allocation per step
        self.mid_shapes = ((B, Hq, Sq, self.num_splits, Dv), (B, Hq, Sq, self.num_splits),
                           (B, Hq, Sq, self.num_splits))
        self.mid_offsets, self.mid_bytes = launcher.scratch_layout(math.prod(x) for x in self.mid_shapes)
        self.out_like_q = Dv == D  # then out is allocated like q (empty_like: cheaper than torch.empty's keywords)
        self.fuse = config.fuse_append and k is not None  # the split kernel appends the new tokens itself
        # after the first call of a replayed signature: lse's shape as a one-element template, allocated like it
        self.lse_like, self.replayed = None, not validate
        self.launches: dict = {}

    def __call__(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table):
        # the kernels index both with unit strides (a copy only when a caller passes a strided view)
        cache_seqlens = cache_seqlens if cache_seqlens.stride(0) == 1 else cache_seqlens.contiguous()
        if block_table is not None and block_table.stride(1) != 1:
            block_table = block_table.contiguous()
        out = torch.empty_like(q, memory_format=_CONTIGUOUS) if self.out_like_q else \
            torch.empty(*self.shapes[:3], self.shapes[5], device=self.device, dtype=self.dtype)
        if self.lse_like is not None:
            lse = torch.empty_like(self.lse_like, memory_format=_CONTIGUOUS)
        else:
            B, Sq, Hq = self.shapes[:3]
            lse = torch.empty(B, Hq, Sq, device=self.device, dtype=torch.float32)
            if self.replayed:  # for the next calls (launcher.shape_template)
                self.lse_like = launcher.shape_template(lse)
        launches = self.launches
        ws = views = None
        if self.direct:
            mid = (lse, lse, lse)  # placeholders, not touched
        else:  # pointers for a replay; views (their strides) for a launch made afresh, below
            ws = launcher.workspace(q, self.mid_bytes)
            if launches:
                base = ws.data_ptr()
                mid = tuple(base + off for off in self.mid_offsets)
            else:
                mid = views = self._mid_views(ws)
        table = block_table if block_table is not None else cache_seqlens  # a placeholder pointer when contiguous
        # each kernel's tensors by its parameter names (the append kernel's K / V are the new tokens,
        # the split kernel's the caches)
        tensors = {"split": {"Q": q, "K": k_cache, "V": v_cache, "Seqlens": cache_seqlens, "Table": table,
                             "MidO": mid[0], "MidM": mid[1], "MidL": mid[2], "Out": out, "Lse": lse}}
        appended = k is not None and not self.fuse  # by the append kernel, before the split kernel reads the cache
        if appended:
            tensors["append"] = {"K": k, "V": v, "KC": k_cache, "VC": v_cache, "Seqlens": cache_seqlens,
                                 "Table": table}
        elif self.fuse:
            tensors["split"].update(KNew=k, VNew=v)
        if not self.direct:
            tensors["combine"] = {"MidO": mid[0], "MidM": mid[1], "MidL": mid[2], "Out": out, "Lse": lse}
        for name in ("append",) * appended + ("split",) + ("combine",) * (not self.direct):
            replay = launches.get(name)
            if replay is None or not replay(tensors[name]):
                if views is None:  # a launch made afresh needs tensors, not pointers
                    views = (lse, lse, lse) if self.direct else self._mid_views(ws)
                made = getattr(self, "_" + name)(q, k_cache, v_cache, k, v, cache_seqlens, block_table, table,
                                                 *views, out, lse)
                if made is not None:
                    launches[name] = made
        return out, lse

    def _mid_views(self, ws):
        return tuple(launcher.scratch_view(ws, off, shape) for off, shape in zip(self.mid_offsets, self.mid_shapes))

    def _append(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, *_):
        return _append_launch(k_cache, v_cache, k, v, cache_seqlens, block_table)

    def _split(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, table, mid_o, mid_m, mid_l, out, lse):
        B, Sq, Hq, Hk, D, Dv, rblocks, left, right = self.shapes
        config, direct, paged = self.config, self.direct, block_table is not None
        page = k_cache.shape[1] if paged else 0
        # pages smaller than a block, or not a multiple of it: one page-table entry per key
        gather = paged and page % config.block_n != 0
        # the head dim as a power-of-two part and a tail (576 = 512 + 64), not padded to 1024
        block_d = max(16, 1 << (D.bit_length() - 1))
        block_dt = 0 if D <= block_d else max(16, triton.next_power_of_2(D - block_d))
        om = (0, 0, 0, 0) if direct else (mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_o.stride(3))
        mm = (0, 0, 0) if direct else (mid_m.stride(0), mid_m.stride(1), mid_m.stride(2))
        if interpreting():
            patch_interpreter_scalar_index()
        new = (k, v) if self.fuse else (None, None)  # FUSE_APPEND's new tokens (else constexpr None: no slot)
        args = (q, k_cache, v_cache, cache_seqlens, table, mid_o, mid_m, mid_l, out, lse, *new,
                q.stride(0), q.stride(1), q.stride(2),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
                table.stride(0) if paged else 0,
                *om, *mm,
                out.stride(0), out.stride(1), out.stride(2),
                lse.stride(0), lse.stride(1),
                *((k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2)) if self.fuse
                  else (0,) * 6),
                self.scale, self.softcap, self.chunk)
        return launcher.launch(_split_kernel, (B * Hk * rblocks, self.num_splits), launcher.by_name(_split_kernel, args, dict(
            HK=Hk, RBLOCKS=rblocks, G=Hq // Hk, SQ=Sq, NEW=Sq if k is not None else 0,
            PAGE=page if paged else 1, PAGED=paged, PAGE_GATHER=gather, DIRECT=direct,
            LEFT=left, RIGHT=right, HAS_SOFTCAP=bool(self.softcap),
            D=D, DV=Dv, BLOCK_R=self.block_r, BLOCK_N=config.block_n, BLOCK_D=block_d, BLOCK_DT=block_dt,
            BLOCK_DV=max(16, triton.next_power_of_2(Dv)),
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: full-precision dots, not TF32
            FUSE_APPEND=self.fuse, BLOCK_NEW=max(16, triton.next_power_of_2(Sq)))),
            num_warps=config.num_warps, num_stages=config.num_stages)

    def _combine(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, table, mid_o, mid_m, mid_l, out, lse):
        B, Sq, Hq, Hk, D, Dv, rblocks, left, right = self.shapes
        args = (mid_o, mid_m, mid_l, out, lse,
                mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_o.stride(3),
                mid_m.stride(0), mid_m.stride(1), mid_m.stride(2),
                out.stride(0), out.stride(1), out.stride(2),
                lse.stride(0), lse.stride(1),
                self.num_splits)
        return launcher.launch(_combine_kernel, (B * Hq * Sq,), launcher.by_name(_combine_kernel, args, dict(
            HQ=Hq, SQ=Sq, DV=Dv, BLOCK_S=max(2, triton.next_power_of_2(self.num_splits)),
            BLOCK_DV=max(16, triton.next_power_of_2(Dv)))))
