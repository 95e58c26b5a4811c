"""Stand-ins for compiled Triton kernels, for machines without a GPU: the launcher's CPU tests and
``benchmarks/host_python.py``.

On a CPU nothing is compiled, so :func:`kernels.launcher.launched` is handed a :class:`StandInKernel`
in place of Triton's CompiledKernel: a :class:`kernels.launcher.Launch` made from it replays through the
same code as on a GPU, and the stand-in's C entry point (:meth:`StandInRunner.launch`) records what it
is given in a list (the tests compare it with a fresh launch's arguments) or, with no list, does nothing
(the benchmark times the launch path's own Python).
"""

from __future__ import annotations

import contextlib


class StandInRunner:
    """Stands in for Triton's CudaLauncher (``CompiledKernel.run``)."""

    launch_cooperative_grid, launch_pdl, global_scratch_size, global_scratch_align, num_ctas = False, False, 0, 1, 1
    profile_scratch_size = 0

    def __init__(self, kernel: StandInKernel):
        self.kernel = kernel

    def launch(self, gx, gy, gz, stream, function, coop, pdl, scratch, profile, packed, meta, enter, leave, *args):
        """The C entry point a replay calls directly."""
        k = self.kernel
        if k.log is not None:
            assert function is k.function and packed is k.packed_metadata and scratch is None and profile is None
            k.log.append(("replay", k.name, list(args), (gx, gy, gz)))

    def __call__(self, gx, gy, gz, stream, function, packed, meta, enter, leave, *args):
        """Triton's own launch path (a replay takes it while a profiler's hooks are set)."""
        k = self.kernel
        enter(meta)
        if k.log is not None:
            k.log.append(("replay-hooked", k.name, list(args), (gx, gy, gz)))


class StandInKernel:
    """Stands in for a CompiledKernel named ``name``; its launches go to ``log`` (None: nowhere)."""

    def __init__(self, name: str, log: list | None):
        self.name, self.log = name, log
        self.function = self.packed_metadata = object()
        self.run = StandInRunner(self)

    def launch_metadata(self, grid, stream, *args):
        return None


@contextlib.contextmanager
def cpu_replays(log: list | None = None, check=None):
    """While inside: the flash-attention and decode kernels' launches (``configs.launch``, ``launcher.launch``)
    go to stand-ins and leave replayable Launches, CPU tensors pass the device checks (``interpreting``),
    and the current device and stream are 0. ``log``: receives ("fresh" | "replay" | "replay-hooked",
    kernel name, arguments in kernel order, grid) per launch (None: nothing recorded). ``check(tuned,
    kwargs)``: called on every autotuned launch's arguments before it is made. Restores all on leaving,
    and clears the flash and decode interfaces' signature caches on entry and exit."""
    from kernels import launcher
    from kernels.decode import interface as decode
    from kernels.flash_attn import configs, interface

    def fresh(jit_fn, grid, full):
        if log is not None:
            grid = tuple(grid) + (1,) * (3 - len(grid))
            log.append(("fresh", jit_fn.fn.__name__, [v for _, v in launcher.arguments(jit_fn, full)], grid))

    def tuned_launch(raw, tuned, space, prune, grid_of, kwargs, options=None):  # configs.launch's pinned path
        if check is not None:
            check(tuned, kwargs)
        cfg = prune(space, {}, **kwargs)[0]
        grid = grid_of(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"])
        fresh(raw, grid, dict(kwargs, **cfg.kwargs))
        return launcher.launched(raw, StandInKernel(raw.fn.__name__, log), grid, kwargs, cfg)

    def plain_launch(jit_fn, grid, kwargs, **options):
        fresh(jit_fn, grid, kwargs)
        return launcher.launched(jit_fn, StandInKernel(jit_fn.fn.__name__, log), grid, kwargs)

    patches = [(configs, "launch", tuned_launch), (launcher, "launch", plain_launch),
               (configs, "interpreting", lambda: True), (decode, "interpreting", lambda: True),
               (launcher, "current_device", lambda: 0),
               (launcher, "current_stream", lambda device: 0)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    interface._SIGNATURES.clear()
    decode._SIGNATURES.clear()
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield log
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        interface._SIGNATURES.clear()
        decode._SIGNATURES.clear()
