"""V with its keys contiguous, for the FP8 forward's P V on Hopper (and Q, K, dO for the FP8 backward).

Hopper's FP8 MMA reads its B operand K-major: for P V that is V with the keys contiguous,
[B, Hk, Dv, Sk], where callers hold V as [B, Sk, Hk, Dv] (flash-attn's layout). The FP8 forward
copies it once per call; the FP8 backward copies Q, K and dO the same way (dK += dS^T Q, dQ += dS K and
dV += P^T dO reduce over the sequence). A copy by torch (``vt[...] = v.permute(0, 2, 3, 1)``) moves one byte per
thread with strided reads: 0.216 ms for 32 MiB of V on the H100 (310 GB/s), a fifth of the FP8
forward's time at 4k tokens (docs/perf/flash_attn.md, session 14). ``_transpose_kernel`` moves
[BLOCK_S, BLOCK_D] tiles instead: rows of BLOCK_D bytes read, rows of BLOCK_S bytes written, the
transpose done on chip.
"""

from __future__ import annotations

import contextlib

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


def v_keys_contiguous(v: torch.Tensor, launches: dict | None = None) -> torch.Tensor:
    """V [B, Sk, Hk, Dv] (its last dim contiguous) copied to [B, Hk, Dv, Sk] with the keys contiguous,
    rows padded to ``KEY_PAD`` keys; returns the view of the real keys. Any [B, S, H, D] tensor of one-byte
    elements the same way (the FP8 backward's Q, K and dO). On a GPU (and under the
    interpreter) one launch of ``_transpose_kernel``, the bytes moved as bytes (any one-byte dtype);
    elsewhere torch's copy. ``launches``: a dict this call may replay its launch from and leave it in
    (kernels/launcher.py; the caller keys it on v's shape, strides and alignment)."""
    b, sk, hk, dv = v.shape
    vt = torch.empty((b, hk, dv, -(-sk // KEY_PAD) * KEY_PAD), device=v.device, dtype=v.dtype)
    if v.numel() == 0:
        return vt[..., :sk]
    if v.element_size() != 1 or not (v.is_cuda or configs.interpreting()):
        vt[..., :sk] = v.permute(0, 2, 3, 1)
        return vt[..., :sk]
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
    return vt[..., :sk]


# --------------------------------------------------------------------------------------------
# The copy beside the FP8 forward: a helper kernel on a side stream (fwd._fwd_kernel's HELPED_VT)
# --------------------------------------------------------------------------------------------
#
# Launched before the forward, the copy costs its whole time (27 us, ~5% of a causal 4k call at hd 64:
# issue 19's 4k must). The forward's programs at hd 64 hold 147-157 registers and ~55-63 KB of shared
# memory, three to an SM, which leaves ~4-7 K registers and ~37-60 KB of each SM unused: room for a
# one-warp copy program beside them. So the copy runs as a small persistent kernel on a high-priority
# side stream while the forward runs, and each forward program waits only for its own kv head's V^T.
#
# Protocol, on an int32 buffer (``sync``: [0] the next work item, [1 + g] the chunks of kv head g done),
# zeroed on the caller's stream before both kernels start (a CUDA graph captures the fill too):
# * work items are (kv head g, chunk c) in the order g * n_chunks + c, each ``CHUNK`` keys of one kv head;
#   a helper program takes items from the counter (atomic add) until none is left: it transposes the
#   chunk, then a release increment of count[g] (after a proxy fence: the forward reads V^T by TMA);
# * a forward program of kv head g acquires count[g] until it reaches n_chunks; while it does not, and
#   the counter has not passed g's last item, it takes items itself and copies them (the helper may not
#   have been scheduled: the forward never waits on a program that is not running, so no deadlock);
#   then a proxy fence before its TMA loads.
# Under the interpreter programs run one after another: the helper copies everything first, or (mode
# "self") each forward program copies the items up to its own kv head's last.

#: Keys of a work item and of a helper program's tile; the forward's own copy moves smaller tiles (it
#: copies only while the helper has not got ahead, and its registers must stay where they are).
CHUNK = 512
#: helper programs per SM, and their warps
HELPERS_PER_SM = 2
HELPER_WARPS = 1
#: How the FP8 forward (interface.flash_attn_fp8_func) gets V^T, per V head dim: "launch" (the copy first,
#: on the caller's stream), "helper" (the helper kernel beside the forward), "self" (the forward's programs
#: alone: the helper's fallback, for tests). ``VT_MODE`` set overrides it for every head dim (probes).
VT_MODES = ("launch", "helper", "self")
VT_MODE: str | None = None
HELPER_HEAD_DIMS = (64, 128)


def key() -> tuple:
    """The settings above that change a call's launches: part of the FP8 forward's call signature."""
    return VT_MODE, CHUNK, HELPERS_PER_SM


def vt_mode(head_dim_v: int) -> str:
    """The V^T mode of an FP8 forward with this V head dim (see ``VT_MODE``)."""
    if VT_MODE is not None:
        if VT_MODE not in VT_MODES:
            raise ValueError(f"v_layout.VT_MODE: one of {VT_MODES}, got {VT_MODE!r}")
        return VT_MODE
    return "helper" if head_dim_v in HELPER_HEAD_DIMS else "launch"


def keys_contiguous_buffer(v: torch.Tensor) -> torch.Tensor:
    """An uninitialised [B, Hk, Dv, Sk] tensor for V [B, Sk, Hk, Dv] with its keys contiguous, rows padded
    to ``KEY_PAD`` keys (every stride a 16-byte multiple): the view of the real keys."""
    b, sk, hk, dv = v.shape
    return torch.empty((b, hk, dv, -(-sk // KEY_PAD) * KEY_PAD), device=v.device, dtype=v.dtype)[..., :sk]


@triton.jit
def _proxy_fence(x, INTERPRETED: tl.constexpr):
    """Order this thread's generic-proxy memory accesses with its async-proxy ones (TMA):
    ``fence.proxy.async.global``; ``x``, returned, is any scalar the fence is tied to. Nothing under the
    interpreter."""
    if not INTERPRETED:
        x = tl.inline_asm_elementwise("fence.proxy.async.global; mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return x


@triton.jit
def copy_item(VN, VT, Sync, item, n_chunks, heads_k, seqlen, stride_nb, stride_ns, stride_nh,
              stride_tb, stride_th, stride_td, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
              CHUNK: tl.constexpr, TILE: tl.constexpr, INTERPRETED: tl.constexpr):
    """Work item ``item`` of the protocol above: keys [c * CHUNK, (c + 1) * CHUNK) of kv head g
    transposed from ``VN`` ([B, Sk, Hk, Dv]) into ``VT`` ([B, Hk, Dv, Sk]) in tiles of TILE keys, then
    count[g] released."""
    g = item // n_chunks
    c = item % n_chunks
    b = (g // heads_k).to(tl.int64)
    hk = (g % heads_k).to(tl.int64)
    src = VN + b * stride_nb + hk * stride_nh
    dst = VT + b * stride_tb + hk * stride_th
    offs_t = tl.arange(0, TILE)
    offs_d = tl.arange(0, BLOCK_DV)
    for s0 in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, seqlen), TILE):
        rows = s0 + offs_t
        mask = (rows[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM_V)
        x = tl.load(src + rows[:, None].to(tl.int64) * stride_ns + offs_d[None, :], mask=mask)
        tl.store(dst + offs_d[:, None].to(tl.int64) * stride_td + rows[None, :], tl.trans(x), mask=tl.trans(mask))
    tl.debug_barrier()  # every thread's stores before the release
    tl.atomic_add(Sync + 1 + g, _proxy_fence(1, INTERPRETED), sem="release", scope="gpu")


@triton.jit
def _helper_kernel(VN, VT, Sync, n_items, n_chunks, heads_k, seqlen, stride_nb, stride_ns, stride_nh,
                   stride_tb, stride_th, stride_td, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                   CHUNK: tl.constexpr, TILE: tl.constexpr, INTERPRETED: tl.constexpr):
    """A helper program: work items from the counter until none is left."""
    item = tl.atomic_add(Sync, 1, sem="relaxed", scope="gpu")
    while item < n_items:
        copy_item(VN, VT, Sync, item, n_chunks, heads_k, seqlen, stride_nb, stride_ns, stride_nh,
                  stride_tb, stride_th, stride_td, HEAD_DIM_V, BLOCK_DV, CHUNK, TILE, INTERPRETED)
        item = tl.atomic_add(Sync, 1, sem="relaxed", scope="gpu")


@triton.jit
def wait_for_head(VN, VT, Sync, g, n_items, n_chunks, heads_k, seqlen, stride_nb, stride_ns, stride_nh,
                  stride_tb, stride_th, stride_td, HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                  CHUNK: tl.constexpr, TILE: tl.constexpr, INTERPRETED: tl.constexpr):
    """A forward program's part of the protocol: returns when kv head g's V^T is complete and visible
    to its TMA loads, having copied items itself while the counter had not passed g's last (an item
    taken is always copied: a later head's readers wait for it)."""
    last = (g + 1) * n_chunks
    seen = tl.atomic_add(Sync + 1 + g, 0, sem="acquire", scope="gpu")
    while seen < n_chunks:
        if tl.atomic_add(Sync, 0, sem="relaxed", scope="gpu") < last:
            item = tl.atomic_add(Sync, 1, sem="relaxed", scope="gpu")
            if item < n_items:
                copy_item(VN, VT, Sync, item, n_chunks, heads_k, seqlen, stride_nb, stride_ns, stride_nh,
                          stride_tb, stride_th, stride_td, HEAD_DIM_V, BLOCK_DV, CHUNK, TILE, INTERPRETED)
        seen = tl.atomic_add(Sync + 1 + g, 0, sem="acquire", scope="gpu")
    return _proxy_fence(seen, INTERPRETED)


_SIDE: dict = {}
_SMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The device's side stream for the helper, at the highest priority CUDA gives (its programs are
    scheduled first where both kernels have programs waiting)."""
    stream = _SIDE.get(device.index)
    if stream is None:
        stream = _SIDE[device.index] = torch.cuda.Stream(device=device,
                                                         priority=torch.cuda.Stream.priority_range()[1])
    return stream


def _helper_programs(device: torch.device, n_items: int) -> int:
    if device.type != "cuda":  # the interpreter: a few programs, one after another
        return min(n_items, 2)
    sms = _SMS.get(device.index)
    if sms is None:
        sms = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(n_items, sms * HELPERS_PER_SM))


def _tile(block_dv: int, nbytes: int) -> int:
    """Keys of a [keys, BLOCK_DV] byte tile of ``nbytes`` (at least 16: a 16-byte row written)."""
    return max(16, nbytes // block_dv)


def begin_helped(v: torch.Tensor, mode: str, launches: dict | None = None):
    """Start filling V^T for an FP8 forward that waits for it (``fwd._fwd_kernel``'s HELPED_VT): returns
    ``(vt, fwd_args, end)``. ``vt`` is the [B, Hk, Dv, Sk] view the forward reads; ``fwd_args`` the
    protocol's forward arguments (tensors VN and Sync among them); ``end()``, called once the forward is
    launched, makes the caller's stream wait for the helper. ``mode``: "helper" (the helper kernel on the
    side stream) or "self" (no helper: the forward's programs copy everything). ``launches``: a dict the
    helper's launch is replayed from and left in (keyed by the caller on v's shape, strides, alignment)."""
    from .configs import block_d

    b, sk, hk, dv = v.shape
    vt = keys_contiguous_buffer(v)
    n_kv, n_chunks = b * hk, triton.cdiv(sk, CHUNK)
    sync = torch.zeros(1 + n_kv, device=v.device, dtype=torch.int32)
    block_dv = block_d(dv)
    interpreted = configs.interpreting()
    common = dict(VN=v, Sync=sync, stride_nb=v.stride(0), stride_ns=v.stride(1), stride_nh=v.stride(2),
                  vt_items=n_kv * n_chunks, vt_chunks=n_chunks, VT_CHUNK=CHUNK)
    fwd_args = dict(common, HELPED_VT=True, VT_TILE=_tile(block_dv, 2048))
    if mode == "self" or v.numel() == 0:
        return vt, fwd_args, _nothing
    if mode != "helper":
        raise ValueError(f"begin_helped: mode 'helper' or 'self', got {mode!r}")
    tensors = {"VN": v.view(torch.uint8), "VT": vt.view(torch.uint8), "Sync": sync}  # bytes moved as bytes
    main = side = None
    if v.is_cuda:
        main, side = torch.cuda.current_stream(v.device), _side_stream(v.device)
        side.wait_stream(main)  # after the counts' fill and whatever made v
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        replay = launches.get("helper") if launches is not None else None
        if replay is None or not replay(tensors):
            args = dict(tensors, n_items=n_kv * n_chunks, n_chunks=n_chunks, heads_k=hk, seqlen=sk,
                        stride_nb=v.stride(0), stride_ns=v.stride(1), stride_nh=v.stride(2),
                        stride_tb=vt.stride(0), stride_th=vt.stride(1), stride_td=vt.stride(2),
                        HEAD_DIM_V=dv, BLOCK_DV=block_dv, CHUNK=CHUNK, TILE=_tile(block_dv, 4096 * HELPER_WARPS),
                        INTERPRETED=interpreted)
            launch = launcher.launch(_helper_kernel, (_helper_programs(v.device, n_kv * n_chunks),), args,
                                     num_warps=HELPER_WARPS)
            if launches is not None and launch is not None:
                launches["helper"] = launch
    if side is None:
        return vt, fwd_args, _nothing
    return vt, fwd_args, lambda: main.wait_stream(side)


def _nothing():
    return None
