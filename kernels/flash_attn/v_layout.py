"""V with its keys contiguous, for the FP8 forward's P V on Hopper.

Hopper's FP8 MMA reads its B operand K-major: for P V that is V with the keys contiguous,
[B, Hk, Dv, Sk], where callers hold V as [B, Sk, Hk, Dv] (flash-attn's layout). The FP8 forward
copies it once per call. A copy by torch (``vt[...] = v.permute(0, 2, 3, 1)``) moves one byte per
thread with strided reads: 0.216 ms for 32 MiB of V on the H100 (310 GB/s), a fifth of the FP8
forward's time at 4k tokens (docs/perf/flash_attn.md, session 14). ``_transpose_kernel`` moves
[BLOCK_S, BLOCK_D] tiles instead: rows of BLOCK_D bytes read, rows of BLOCK_S bytes written, the
transpose done on chip.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import launcher
from . import configs

#: Keys and value dims per program: 256-byte rows written, 64-byte rows read (one byte per element).
BLOCK_S = 256
BLOCK_D = 64
#: The copy's rows are padded to this many keys: every stride a 16-byte multiple (tensor descriptors).
KEY_PAD = 16


@triton.jit
def _transpose_kernel(V, VT, seqlen, head_dim, num_heads, stride_vb, stride_vs, stride_vh,
                      stride_tb, stride_th, stride_td,
                      BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """VT[b, h, d, s] = V[b, s, h, d] for one [BLOCK_S keys, BLOCK_D dims] tile."""
    pid_s = tl.program_id(0)
    pid_d = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = (offs_s[:, None] < seqlen) & (offs_d[None, :] < head_dim)
    x = tl.load(V + b * stride_vb + h * stride_vh + offs_s[:, None].to(tl.int64) * stride_vs + offs_d[None, :],
                mask=mask)
    tl.store(VT + b * stride_tb + h * stride_th + offs_d[:, None].to(tl.int64) * stride_td + offs_s[None, :],
             tl.trans(x), mask=tl.trans(mask))


def keys_contiguous_buffer(v: torch.Tensor) -> torch.Tensor:
    """An uninitialised [B, Hk, Dv, Sk] tensor for V [B, Sk, Hk, Dv] with its keys contiguous, rows padded
    to ``KEY_PAD`` keys (every stride a 16-byte multiple): the view of the real keys."""
    b, sk, hk, dv = v.shape
    return torch.empty((b, hk, dv, -(-sk // KEY_PAD) * KEY_PAD), device=v.device, dtype=v.dtype)[..., :sk]


def v_keys_contiguous(v: torch.Tensor, launches: dict | None = None) -> torch.Tensor:
    """V [B, Sk, Hk, Dv] (its last dim contiguous) copied to [B, Hk, Dv, Sk] with the keys contiguous,
    rows padded to ``KEY_PAD`` keys; returns the view of the real keys. On a GPU (and under the
    interpreter) one launch of ``_transpose_kernel``, the bytes moved as bytes (any one-byte dtype);
    elsewhere torch's copy. ``launches``: a dict this call may replay its launch from and leave it in
    (kernels/launcher.py; the caller keys it on v's shape, strides and alignment)."""
    b, sk, hk, dv = v.shape
    vt = keys_contiguous_buffer(v)
    if v.numel() == 0:
        return vt
    if v.element_size() != 1 or not (v.is_cuda or configs.interpreting()):
        vt[...] = v.permute(0, 2, 3, 1)
        return vt
    tensors = {"V": v.view(torch.uint8), "VT": vt.view(torch.uint8)}
    replay = launches.get("copy") if launches is not None else None
    if replay is None or not replay(tensors):
        src, dst = tensors["V"], tensors["VT"]
        args = dict(tensors, seqlen=sk, head_dim=dv, num_heads=hk, stride_vb=src.stride(0), stride_vs=src.stride(1),
                    stride_vh=src.stride(2), stride_tb=dst.stride(0), stride_th=dst.stride(1),
                    stride_td=dst.stride(2), BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D)
        launch = launcher.launch(_transpose_kernel, (triton.cdiv(sk, BLOCK_S), triton.cdiv(dv, BLOCK_D), b * hk),
                                 args, num_warps=4)
        if launches is not None and launch is not None:
            launches["copy"] = launch
    return vt


# --------------------------------------------------------------------------------------------
# The copy inside the FP8 forward (fwd._fwd_kernel's FUSED_VT): no launch of its own
# --------------------------------------------------------------------------------------------
#
# As a launch of its own the copy is ~5% of a causal 4k FP8 call (27 us: 64 MB moved while the tensor
# cores idle). Inside the forward each kv head's V is transposed by a few of the forward's own programs
# (``SLICES`` of them, a share of the keys each), ``LOOKAHEAD`` kv heads ahead of the programs that read it,
# so that the copy's memory traffic runs beside other programs' matmuls and nobody waits for it.
#
# Protocol, on an int32 buffer (:func:`sync_buffer`: [0] the next work item, then per kv head g a count of
# its slices transposed and a count of its readers past their wait):
# * a program takes its work item from the counter (atomic add), so items start in order whatever the
#   hardware's block scheduling; item order is the launch grid's (query block fastest, then (batch, head));
# * the first ``SLICES`` readers of kv head g each transpose a slice of kv head g + LOOKAHEAD (and, for
#   g < LOOKAHEAD, first a slice of g itself), each slice's stores then a release increment of its count;
# * every reader of g waits (acquire) until g's count reaches its number of slices, then fences the
#   generic proxy's writes before its TMA loads read them; the last reader of g zeroes g's two counts and
#   the program that took the last item zeroes the counter, so the buffer is zero again for the next launch
#   (stream order; a CUDA graph's replays too).
# Deadlock-free: a slice of head g >= LOOKAHEAD is done by items taken before any reader of g, which wait
# for nothing before their slices; for g < LOOKAHEAD the waiting readers that hold an item below g's last
# transposer are at most SLICES - 1, so with more resident programs than that the next program to start
# takes that transposer's item. Under the interpreter (programs run one after another) SLICES is 1: the
# head's first item transposes it whole before any other reader runs.

#: Whether the FP8 forward (interface.flash_attn_fp8_func) makes V^T this way rather than launching
#: :func:`v_keys_contiguous` first (the Gluon kernel's route always launches the copy).
FUSED = True
#: kv heads' slices (transposing programs per kv head) on a GPU; 1 under the interpreter (above).
SLICES = 8
#: Work items (programs) at least between a kv head's transposers and its first reader: about two thirds
#: of the H100's resident programs (396 at 3 an SM), so the slices are done long before they are read.
#: The kernel rounds it up to whole kv heads (LOOKAHEAD = cdiv(LOOKAHEAD_ITEMS, readers of a kv head)).
LOOKAHEAD_ITEMS = 256


_SYNC: dict = {}


def sync_buffer(device: torch.device, numel: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``numel`` for the fused copy's protocol, kept per (device,
    stream): every launch leaves it zero again, and launches on one stream run in order (two streams
    must not share one). While a CUDA graph is being captured, a fresh one (its memset captured too)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(numel, device=device, dtype=torch.int32)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    buf = _SYNC.get(key)
    if buf is None or buf.numel() < numel:
        buf = _SYNC[key] = torch.zeros(max(numel, 1024), device=device, dtype=torch.int32)
    return buf


@triton.jit
def _transpose_keys(VN, VT, row0, step, seqlen, stride_ns, stride_td, HEAD_DIM_V: tl.constexpr,
                    BLOCK_DV: tl.constexpr, BLOCK_T: tl.constexpr):
    """VT[d, s] = VN[s, d] for the BLOCK_T keys from row0, row0 + step, ... below seqlen, of one (batch,
    kv head): ``VN`` that head's first key of V as given ([S, Dv], rows ``stride_ns`` apart), ``VT`` its
    keys-contiguous rows. Each block is one load (16 KB: every byte of it in flight at once)."""
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_DV)
    for s0 in range(row0, seqlen, step):
        rows = s0 + offs_t
        mask = (rows[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM_V)
        x = tl.load(VN + rows[:, None].to(tl.int64) * stride_ns + offs_d[None, :], mask=mask)
        tl.store(VT + offs_d[:, None].to(tl.int64) * stride_td + rows[None, :], tl.trans(x), mask=tl.trans(mask))


@triton.jit
def _proxy_fence(x, INTERPRETED: tl.constexpr):
    """Order this thread's generic-proxy memory accesses before its async-proxy ones (TMA) and after
    (``fence.proxy.async.global``); ``x``, returned, is any scalar the fence is tied to. Nothing under the
    interpreter."""
    if not INTERPRETED:
        x = tl.inline_asm_elementwise("fence.proxy.async.global; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return x


@triton.jit
def fused_copy(VN, VT, Sync, b, hk, pid_m, h, n_pm, num_heads, group, batch, seqlen_k,
               stride_nb, stride_ns, stride_nh, stride_vb, stride_vh, stride_vs,
               HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, SLICES: tl.constexpr, lookahead_items,
               INTERPRETED: tl.constexpr):
    """The calling program's part of the protocol above: its slices, then its wait for its own kv
    head's V^T. Returns when that head's keys-contiguous V is complete and visible to its TMA loads."""
    BLOCK_T: tl.constexpr = 16384 // BLOCK_DV
    heads_k = num_heads // group
    n_kv = batch * heads_k
    g = b * heads_k + hk
    readers = group * n_pm
    LOOKAHEAD = tl.maximum(tl.cdiv(lookahead_items, readers), 1)
    r = (h % group) * n_pm + pid_m
    n_tr = tl.minimum(readers, SLICES)
    step = n_tr * BLOCK_T
    done = Sync + 1
    passed = Sync + 1 + n_kv
    if r < n_tr:
        if g < LOOKAHEAD:  # the first heads have no earlier head to transpose them
            b64 = b.to(tl.int64)
            _transpose_keys(VN + b64 * stride_nb + hk.to(tl.int64) * stride_nh,
                            VT + b64 * stride_vb + hk.to(tl.int64) * stride_vh,
                            r * BLOCK_T, step, seqlen_k, stride_ns, stride_vs, HEAD_DIM_V, BLOCK_DV, BLOCK_T)
            tl.debug_barrier()
            tl.atomic_add(done + g, _proxy_fence(1, INTERPRETED), sem="release", scope="gpu")
        g2 = g + LOOKAHEAD
        if g2 < n_kv:
            b2 = (g2 // heads_k).to(tl.int64)
            hk2 = (g2 % heads_k).to(tl.int64)
            _transpose_keys(VN + b2 * stride_nb + hk2 * stride_nh, VT + b2 * stride_vb + hk2 * stride_vh,
                            r * BLOCK_T, step, seqlen_k, stride_ns, stride_vs, HEAD_DIM_V, BLOCK_DV, BLOCK_T)
            tl.debug_barrier()
            tl.atomic_add(done + g2, _proxy_fence(1, INTERPRETED), sem="release", scope="gpu")
    seen = tl.atomic_add(done + g, 0, sem="acquire", scope="gpu")
    while seen < n_tr:
        seen = tl.atomic_add(done + g, 0, sem="acquire", scope="gpu")
    last = tl.atomic_add(passed + g, _proxy_fence(1, INTERPRETED), sem="relaxed", scope="gpu")
    if last == readers - 1:  # every reader of g is past its wait: g's counts back to zero
        tl.atomic_xchg(done + g, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(passed + g, 0, sem="relaxed", scope="gpu")
