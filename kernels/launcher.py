"""Replayable kernel launches: the host cost of a Triton launch paid once per call signature.

``kernel[grid](**kwargs)`` binds and specialises every argument, builds the autotuner's key and
looks the compiled kernel up, on every call: tens of microseconds of Python per launch, more than
the device needs for a small attention call (issue 16: a small MQA backward spent 0.5-1.3 ms of
host time per call on the H100, its kernels less). A :class:`Launch` is taken from one such launch:
the compiled kernel that ran, its grid, and its argument list in the kernel's order with the tensor
arguments as named slots. Replaying it for another call of the same *signature* fills the slots
with that call's tensors and calls the compiled kernel's launcher directly.

What a signature is, is the caller's to say: it must key its Launches on everything the kernel's
non-tensor arguments and configuration are computed from (shapes, strides, dtypes, flags, the
environment knobs that choose a config) and on the 16-byte alignment of every tensor it did not
allocate itself (Triton specialises pointers on it; fresh tensors from torch's caching allocator are
512-byte aligned). The CPU tests check that a replay passes exactly what a fresh launch would.
"""

from __future__ import annotations

import inspect
import math
import os
import threading

import torch
import torch.autograd.forward_ad as _forward_ad
import triton
from triton import knobs
from triton.backends.nvidia import driver as _nvidia_driver
from triton.runtime import _allocation
from triton.runtime.driver import driver

#: What inspect gives a parameter without a default.
_EMPTY = inspect.Parameter.empty


class Launch:
    """One launch of a compiled kernel, replayable with other tensors of the same signature."""

    __slots__ = ("compiled", "grid", "template", "slots", "descriptors", "device", "_run", "_launch", "_function",
                 "_packed", "_flags", "_scratch_bytes", "_scratch_align", "_encoded")

    def __init__(self, jit_fn, compiled, grid, kwargs: dict, device: int, descriptors: dict | None = None):
        """``jit_fn``: the @triton.jit function; ``compiled``: the CompiledKernel that ran with
        ``kwargs`` (every kernel argument by name, the config's meta-parameters included) on ``grid``
        on CUDA device ``device``. ``descriptors``: the host-made TMA descriptor arguments' names -> the name of
        the tensor argument each describes (its ``base``): a replay describes that slot's tensor of the call
        with the first launch's shape, strides and box (Triton's launcher encodes a descriptor on every launch).
        A descriptor argument not named there cannot be replayed (it would point at the first call's tensor):
        ValueError."""
        if hasattr(compiled, "result"):  # an asynchronous compile's future
            compiled = compiled.result()
        self.compiled = compiled
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.template = []
        slots, descs = [], []
        for i, (name, value) in enumerate(arguments(jit_fn, kwargs)):
            if isinstance(value, torch.Tensor):  # a slot: this call's tensor is not kept alive
                slots.append((i, name))
                value = None
            elif _is_host_descriptor(value):
                of = (descriptors or {}).get(name)
                if of is None or kwargs.get(of) is not value.base:
                    raise ValueError(f"argument {name} of {jit_fn.fn.__name__}: a host-made TMA descriptor whose "
                                     f"tensor argument is not named (descriptors={descriptors!r}): a replay would "
                                     "read the first call's tensor")
                descs.append((i, of, tuple(value.shape), tuple(value.strides), value.padding))
                value = None
            self.template.append(value)
        self.slots = tuple(slots)
        self.descriptors = tuple(descs)
        self.device = device
        self._run = run = compiled.run  # the compiled kernel's launcher (loaded by the launch that ran)
        self._function = compiled.function
        self._packed = compiled.packed_metadata
        # The launcher's C entry point, called directly: Triton's Python wrapper around it allocates
        # the kernel's global scratch (device-side TMA descriptors) from the allocator on every
        # launch; a replay takes it from a buffer kept per stream (see _scratch). Kernels with
        # profiling scratch (instrumented builds) keep the wrapper.
        direct = getattr(run, "launch", None) is not None and not getattr(run, "profile_scratch_size", 0)
        self._launch = run.launch if direct else None
        self._flags = (run.launch_cooperative_grid, run.launch_pdl) if direct else None
        per_program = getattr(run, "global_scratch_size", 0) if direct else 0
        self._scratch_bytes = self.grid[0] * self.grid[1] * self.grid[2] * getattr(run, "num_ctas", 1) * per_program
        self._scratch_align = getattr(run, "global_scratch_align", 1) if direct else 1
        # Host-made descriptors: Triton's launcher encodes each one on every launch (session 49, H200: ~+26 us
        # a backward call for four); a replay encodes a descriptor once per device pointer (_Encoded)
        self._encoded = _Encoded.of(self._launch, self.descriptors) if direct and descs else None

    def __call__(self, tensors: dict) -> bool:
        """Launch on the current stream with ``tensors`` (name -> tensor, or a device pointer as an int: it must
        keep the first launch's 16-byte alignment) in the slots. False, and
        nothing launched, when the current device is not the one this launch was made on."""
        dev = current_device()
        if dev != self.device:
            return False
        args = self.template.copy()
        stream = current_stream(dev)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        # Triton's own path where a profiler's hooks are set (they see tensors and launch metadata);
        # Triton 3.6's knobs hold an empty HookChain by default.
        hooked = self._launch is None or (enter is not None and getattr(enter, "calls", True)) or (
            leave is not None and getattr(leave, "calls", True))
        if hooked or self._encoded is None:  # (else _Encoded.launch reads the descriptors' pointers itself)
            for i, name, shape, strides, padding in self.descriptors:  # (this call's tensors)
                t = tensors[name]
                args[i] = Described(t if t.__class__ is int else t.data_ptr(), shape, strides, padding)
        if hooked:
            for i, name in self.slots:
                args[i] = tensors[name]
            if self._scratch_bytes:
                ensure_allocator()
            meta = self.compiled.launch_metadata(self.grid, stream, *args)
            self._run(*self.grid, stream, self._function, self._packed, meta, enter, leave, *args)
            return True
        # Pointers as ints: Triton's launcher then skips a Python call and a driver query per tensor. A slot
        # may hold an int already: a pointer into a buffer the caller cut up (the backward's workspace)
        for i, name in self.slots:
            t = tensors[name]
            args[i] = t if t.__class__ is int else t.data_ptr()
        scratch = _scratch(dev, stream, self._scratch_bytes, self._scratch_align) if self._scratch_bytes else None
        if self._encoded is not None:
            self._encoded.launch(tensors, args, (*self.grid, stream, self._function, *self._flags, scratch, None,
                                                 self._packed, None, None, None))
            return True
        self._launch(*self.grid, stream, self._function, *self._flags, scratch, None, self._packed, None, None, None,
                     *args)
        return True


def _is_host_descriptor(value) -> bool:
    """Whether a launch argument is a host-made TMA descriptor (Triton's or Gluon's ``TensorDescriptor``)."""
    return hasattr(value, "block_shape") and hasattr(value, "base") and hasattr(value, "strides")


class Described:
    """A replayed launch's host-made TMA descriptor argument: what Triton's launcher reads from a
    ``TensorDescriptor`` to encode one (``base.data_ptr()``, ``shape``, ``strides``, ``padding``; the box and
    swizzle are the compiled kernel's), here over a device pointer. Its own ``base``."""

    __slots__ = ("ptr", "shape", "strides", "padding")

    def __init__(self, ptr: int, shape: tuple, strides: tuple, padding: str):
        self.ptr, self.shape, self.strides, self.padding = ptr, shape, strides, padding

    @property
    def base(self):
        return self

    def data_ptr(self) -> int:
        return self.ptr


class _Encoded:
    """A replayed launch's host-made descriptors encoded once per device pointer, and the launch made with them.

    Triton's launcher for a kernel with descriptor arguments is a Python wrapper (``wrap_handle_tensordesc``) that
    encodes every descriptor (``make_tensordesc_arg``: a CUtensorMap from the driver) on every launch, then calls
    the C launch with each descriptor expanded into its map, shape and strides. A Launch's descriptors differ from
    call to call in their pointer alone (the first launch's shape, strides and box), so the expansion is kept per
    pointer and the C launch called directly. Triton's own function encodes: the same bytes as its wrapper's."""

    __slots__ = ("raw", "slots", "maps")

    #: encoded pointers kept a descriptor slot (a training loop's tensors come back to a few addresses); more:
    #: the slot's cache is emptied, then fills again
    KEEP = 64

    def __init__(self, raw, slots: list):
        self.raw = raw  # Triton's C launch under the wrapper
        self.slots = slots  # (argument index, tensor slot, Described's fields but the pointer, descriptor metadata)
        self.maps = [{} for _ in slots]  # per slot: device pointer -> the expanded arguments

    @classmethod
    def of(cls, launch, descriptors: tuple):
        """The cache for a Launch whose C entry point is ``launch`` (Triton's wrapper) and whose host-made
        descriptors are ``descriptors`` (Launch.descriptors); None where ``launch`` is not the wrapper this knows
        (another Triton, or a stand-in: the Launch then hands the wrapper Described arguments, as before), or
        where a descriptor has no metadata (Triton's decomposed form)."""
        code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
        if code is None or not cells or code.co_name != "inner":
            return None
        free = dict(zip(code.co_freevars, (cell.cell_contents for cell in cells)))
        raw, metas = free.get("launcher"), free.get("tensordesc_meta")
        if raw is None or metas is None or len(metas) != len(descriptors) or any(m is None for m in metas):
            return None
        return cls(raw, [(i, name, shape, strides, padding, meta)
                         for (i, name, shape, strides, padding), meta in zip(descriptors, metas)])

    def launch(self, tensors: dict, args: list, base: tuple) -> None:
        """The C launch with ``base`` (grid, stream, function, flags, scratch, metadata) and ``args`` (the kernel's
        arguments in order, the descriptors' places aside), the descriptors over ``tensors``' (Launch.__call__'s)."""
        final, start = list(base), 0
        for (i, name, shape, strides, padding, meta), maps in zip(self.slots, self.maps):
            t = tensors[name]
            ptr = t if t.__class__ is int else t.data_ptr()
            expanded = maps.get(ptr)
            if expanded is None:
                if len(maps) >= self.KEEP:
                    maps.clear()
                expanded = maps[ptr] = _nvidia_driver.make_tensordesc_arg(Described(ptr, shape, strides, padding),
                                                                          meta)
            final += args[start:i]
            final += expanded
            start = i + 1
        final += args[start:]
        self.raw(*final)


#: (device, stream) -> a byte buffer for kernels' global scratch, reused by every replay on that
#: stream: launches on one stream run one after another, so none overwrites another's descriptors.
_SCRATCH: dict = {}


def _scratch(dev: int, stream: int, nbytes: int, align: int):
    """A device pointer to ``nbytes`` of scratch for a launch on ``stream``. While a CUDA graph is
    captured the allocator gives it (memory the graph owns), as in Triton's own launch."""
    if _capturing():
        ensure_allocator()
        return _allocation._allocator.get()(nbytes, align, stream)
    buf = _SCRATCH.get((dev, stream))
    if buf is None or buf.numel() < nbytes + align:
        size = max(nbytes + align, 2 * buf.numel() if buf is not None else 0)
        _SCRATCH[(dev, stream)] = buf = torch.empty(size, dtype=torch.uint8, device=f"cuda:{dev}")
    ptr = buf.data_ptr()
    return ptr + (-ptr) % align


#: Kernels' scratch (the flash backward's delta and group-split partials, the decode split's partial results) comes
#: from a byte buffer kept per (thread, device, stream) while a call needs at most this much: no allocation per call
#: (each costs the host 2-5 us with its free on the H100 host), and nothing a call can race with: one thread's
#: launches on one stream run in order, and a call's scratch lives from its first kernel to its last (the next call
#: on that stream, of any kernel, runs after). Larger calls allocate theirs (their kernels take milliseconds), as do
#: calls captured into a CUDA graph (the graph owns what it uses).
WORKSPACE_KEEP_BYTES = 64 << 20
#: Alignment of each scratch array in the workspace (Triton specialises pointers on 16 bytes).
SCRATCH_ALIGN = 256
_WORKSPACE = threading.local()


def workspace(like: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A uint8 buffer of at least ``nbytes`` on ``like``'s device for one call's scratch: this thread's kept buffer
    for the current stream, or a fresh one (above :data:`WORKSPACE_KEEP_BYTES`, or while a CUDA graph is captured).
    Keyed by the tensor's device index and the stream (``like.get_device()``: no torch.device made per call)."""
    if nbytes > WORKSPACE_KEEP_BYTES or like.is_cuda and _capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=like.device)
    key = _stream_key(like)
    kept = _WORKSPACE.__dict__
    buf = kept.get(key)
    if buf is None or buf.numel() < nbytes:
        grown = min(2 * buf.numel(), WORKSPACE_KEEP_BYTES) if buf is not None else 0  # doubling, within the limit
        buf = kept[key] = torch.empty(max(nbytes, grown), dtype=torch.uint8, device=like.device)
    return buf


def _stream_key(like: torch.Tensor) -> tuple:
    """The kept buffers' key: ``like``'s device index (-1 on the CPU; ``get_device()``: no torch.device made per
    call) and, on a GPU, its current stream."""
    index = like.get_device()
    return index, current_stream(index) if like.is_cuda else None


_COUNTERS = threading.local()


def counters(like: torch.Tensor, n: int) -> torch.Tensor:
    """At least ``n`` int32 counters on ``like``'s device, zero at rest: a kernel that counts in them sets each one it
    used back to 0 before it ends (the flash backward's dK / dV kernel summing its group split), so the next call on
    the stream finds them zero without a memset launch. Kept as :func:`workspace` is (per thread, device and stream;
    a larger ``n`` takes a new zeroed buffer); while a CUDA graph is captured, fresh zeros (the graph's own)."""
    if like.is_cuda and _capturing():
        return torch.zeros(n, dtype=torch.int32, device=like.device)
    key = _stream_key(like)
    kept = _COUNTERS.__dict__
    buf = kept.get(key)
    if buf is None or buf.numel() < n:
        buf = kept[key] = torch.zeros(max(n, 2 * buf.numel() if buf is not None else 0), dtype=torch.int32,
                                      device=like.device)
    return buf


def scratch_layout(numels) -> tuple[list[int], int]:
    """Byte offsets of fp32 arrays of ``numels`` elements laid out one after another in a workspace, each at a
    multiple of :data:`SCRATCH_ALIGN`, and the bytes they take."""
    offsets, at = [], 0
    for n in numels:
        offsets.append(at)
        at += -(-n * 4 // SCRATCH_ALIGN) * SCRATCH_ALIGN
    return offsets, at


def scratch_view(ws: torch.Tensor, offset: int, shape) -> torch.Tensor:
    """The contiguous fp32 array of ``shape`` at byte ``offset`` of the workspace ``ws``."""
    return ws[offset:offset + 4 * math.prod(shape)].view(torch.float32).view(shape)


def shape_template(t: torch.Tensor) -> torch.Tensor:
    """A one-element tensor (4 bytes of fp32 kept) expanded to ``t``'s shape, dtype and device: what a replayed call
    allocates its next ``t`` like (``torch.empty_like(template, memory_format=torch.contiguous_format)``: a tensor
    that is not dense is allocated contiguous), cheaper than ``new_empty``'s keyword parsing (the flash forward's
    lse: 1.0-1.2 us against 1.7-2.5 on a development CPU)."""
    return t.new_empty(1).expand(t.shape)


def autograd_needed(*tensors) -> bool:
    """Whether a differentiable call on ``tensors`` (None allowed) needs its autograd node: grad mode on and one of
    them requiring grad, or a forward-mode AD level open (the node then says it cannot carry tangents). Where not,
    the public functions run the forward alone: no node, nothing saved (host time a call)."""
    if torch.is_grad_enabled():
        for t in tensors:  # (a loop: any() over a generator costs more than the check, on every call)
            if t is not None and t.requires_grad:
                return True
    return _forward_ad._current_level >= 0


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def arguments(jit_fn, kwargs: dict) -> list[tuple[str, object]]:
    """(name, value) of every argument of the @triton.jit function ``jit_fn`` in its order, as a
    launch with ``kwargs`` binds them (defaults filled in)."""
    out = []
    for name, p in inspect.signature(jit_fn.fn).parameters.items():
        value = kwargs.get(name, p.default)
        if value is _EMPTY:
            raise ValueError(f"argument {name} of {jit_fn.fn.__name__} has no value")
        out.append((name, value))
    return out


def by_name(jit_fn, args: tuple, kwargs: dict) -> dict:
    """A launch's positional ``args`` and keyword ``kwargs`` as one dict by the kernel's parameter names."""
    return dict(zip(inspect.signature(jit_fn.fn).parameters, args), **kwargs)


def launched(jit_fn, compiled, grid, kwargs: dict, config=None, descriptors: dict | None = None) -> Launch | None:
    """The :class:`Launch` of a launch that just ran (``compiled``: what ``kernel[grid](...)`` returned),
    or None where it cannot be replayed: the interpreter (nothing compiled), a config with a
    pre-launch hook (it must run every time). ``descriptors``: as :class:`Launch`'s."""
    if compiled is None or not hasattr(compiled, "function") and not hasattr(compiled, "result"):
        return None
    if config is not None and config.pre_hook is not None:
        return None
    full = dict(kwargs, **config.kwargs) if config is not None else kwargs
    return Launch(jit_fn, compiled, grid, full, current_device(), descriptors)


#: CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT (cuda.h's CUfunction_attribute)
_CARVEOUT_ATTRIBUTE = 9
_LIBCUDA = []


def prefer_max_shared_memory(launch: Launch | None) -> bool:
    """Ask the driver to run ``launch``'s kernel with the SM's largest shared-memory carveout (100%). A kernel
    that needs little shared memory otherwise gets a small one, and an SM cannot change its carveout while one of
    its programs runs: a kernel launched to run beside it (programmatic dependent launch) and needing more shared
    memory then waits for it to leave the SM. A hint to the driver (cuFuncSetAttribute); False where it could not
    be given (no CUDA driver library, the interpreter)."""
    if launch is None:
        return False
    import ctypes

    try:
        if not _LIBCUDA:
            _LIBCUDA.append(ctypes.CDLL("libcuda.so.1"))
        return _LIBCUDA[0].cuFuncSetAttribute(ctypes.c_void_p(launch.compiled.function), _CARVEOUT_ATTRIBUTE, 100) == 0
    except (OSError, AttributeError):
        return False


def current_device() -> int:
    """The device Triton launches on (the current CUDA device). torch's own query, without
    torch.cuda.current_device's initialisation checks (a replay follows a launch that initialised)."""
    return _get_device()


def current_stream(device: int):
    """The current raw stream of ``device``, the one Triton's own launch takes."""
    return _get_stream(device)


_get_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: driver.active.get_current_device())
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda d: driver.active.get_current_stream(d))


def launch(jit_fn, grid, kwargs: dict, **options) -> Launch | None:
    """``jit_fn[grid](**kwargs, **options)`` (a kernel without autotuning), and its Launch (None
    under the interpreter)."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        ensure_allocator()
    return launched(jit_fn, jit_fn[grid](**kwargs, **options), grid, kwargs)


def _tma_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator():
    """Device-side TMA descriptors need global scratch from triton's allocator. It is a ContextVar,
    and autograd runs backward on its own thread, so check on every launch (cheap) and install one
    only where none is set, leaving anyone else's allocator alone."""
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_tma_scratch)


class Signatures:
    """A bounded map from call signatures to what their first call left behind (Launches, checked
    arguments). Oldest first out when full: a varlen workload makes a new signature per batch."""

    __slots__ = ("_d", "limit")

    def __init__(self, limit: int = 512):
        self._d: dict = {}
        self.limit = limit

    def get(self, key):
        """What ``key``'s first call left, or None: a new signature, no key (None: a call that is not
        to be replayed) or an unhashable one (a list window)."""
        if key is None:
            return None
        try:
            return self._d.get(key)
        except TypeError:
            return None

    def put(self, key, value):
        """Keep ``value`` for ``key`` (not for None or an unhashable key); returns ``value``."""
        if key is None:
            return value
        try:
            hash(key)
        except TypeError:
            return value
        if len(self._d) >= self.limit:
            del self._d[next(iter(self._d))]
        self._d[key] = value
        return value

    def clear(self):
        self._d.clear()

    def __len__(self):
        return len(self._d)
