"""The verification runner: one adapter on one case, judged against the FP64 oracle.

``verify(adapter, case)`` validates the inputs, runs the candidate with NaN-poisoned memory
(forward, then gradients through ``torch.autograd.grad``), runs it a second time for determinism,
and returns a :class:`CaseResult`: one :class:`~harness.check.tolerance.TensorReport` per output tensor
and one :class:`PropertyResult` per property (contract, inputs not mutated, fully-masked rows,
determinism), a status ("pass", "fail", "unsupported", "error") and a one-line reason.

The result types live in :mod:`harness.check.results`, the property checks in
:mod:`harness.check.properties`; both are re-exported here (``harness.check.verify.CaseResult``).

The oracle and the eager reference in the candidate's dtype depend only on (case, seed, device):
:func:`prepare` builds them once as a :class:`Baseline` that any number of adapters reuse (the
main job, the pytest plugin's session cache, the benchmark's correctness gate).
Results are plain dataclasses; ``to_dict`` gives JSON-ready dicts, ``from_dict`` reads them back
(the acceptance command ships them out of a child process).

Adapter attributes read here besides the contract's (all optional, via ``getattr``):

* ``differentiable`` (False: forward only) and ``deterministic_backward`` (False: a backward
  that differs between two runs is reported with its spread, not failed), or per case the method
  ``deterministic_backward_for(case, device)``;
* ``masked_rows``: a sentence documenting how the backend treats rows that see no key when that
  differs from the oracle's (out 0, lse -inf); those rows are then left out of out / lse and the
  difference is reported as "documented";
* ``nondifferentiable_inputs``: input names the backend treats as constants (FLA's ``g_gamma``);
  their gradients are not compared and the "backward" property says so. Without the declaration
  a gradient that never reaches an input fails, with that reason.
"""

from __future__ import annotations

__all__ = [
    "PROPERTIES",
    "Baseline",
    "CaseResult",
    "PropertyResult",
    "TensorReport",
    "bitwise_equal",
    "check_inputs",
    "default_device",
    "judge_runs",
    "oracle_for",
    "poisoned_memory",
    "prepare",
    "verify",
]

import contextlib
import math
import time
import traceback
import warnings
from dataclasses import dataclass

import torch

from harness import fp8
from harness.adapters.base import (
    Adapter,
    DecodeOutput,
    LinearOutput,
    SoftmaxOutput,
    Unsupported,
    fp8_backward_reason,
    has_backward,
)
from harness.cases import (
    Case,
    DecodeCase,
    LinearCase,
    LinearInputs,
    SoftmaxCase,
    SoftmaxInputs,
    apply_layout,
    make_inputs,
)
from harness.check import tolerance
from harness.check.properties import (
    _check_cache_write,
    _check_contract,
    _check_determinism,
    _check_masked_rows,
    _check_unchanged,
    _compare_dtype,
    _masked_rows,
    bitwise_equal,
)
from harness.check.results import (
    GRAD_NAMES,
    PROPERTIES,
    CaseResult,
    PropertyResult,
    _Run,
    _run_inputs,
)
from harness.check.tolerance import TensorReport

#: Poisoning on CUDA fills at most this many bytes of the caching allocator's free blocks with NaN
#: (filling costs a memset per block; more than this is not worth the time per case).
CUDA_POISON_MAX_BYTES = 16 << 30


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def _expected_input_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, layout words) of every input the case needs."""
    if isinstance(case, DecodeCase):
        B, Sq, Hq, Hk, D, Dv = case.batch, case.seqlen_q, case.heads_q, case.heads_k, case.d, case.d_v
        if case.paged:
            blocks = case.num_blocks
            cache = ((blocks, case.page_size, Hk, D), "(num_blocks, page_size, heads, dim)")
            vcache = ((blocks, case.page_size, Hk, Dv), "(num_blocks, page_size, heads, dim)")
        else:
            cache = ((B, case.capacity, Hk, D), "(batch, capacity, heads, dim)")
            vcache = ((B, case.capacity, Hk, Dv), "(batch, capacity, heads, dim)")
        shapes = {"q": ((B, Sq, Hq, D), "(batch, seqlen_q, heads, dim)"), "k_cache": cache, "v_cache": vcache,
                  "cache_seqlens": ((B,), "(batch,)")}
        if case.paged:
            shapes["block_table"] = ((B, case.pages_per_seq), "(batch, pages)")
        if case.append:
            shapes["k"] = ((B, Sq, Hk, D), "(batch, seqlen_q, heads, dim)")
            shapes["v"] = ((B, Sq, Hk, Dv), "(batch, seqlen_q, heads, dim)")
        return shapes
    if isinstance(case, SoftmaxCase):
        if case.is_varlen:
            tq = sum(a for a, _ in case.varlen)
            tk = sum(b for _, b in case.varlen)
            lay = "(total_tokens, heads, dim)"
            return {
                "q": ((tq, case.heads_q, case.d), lay),
                "k": ((tk, case.heads_k, case.d), lay),
                "v": ((tk, case.heads_k, case.d_v), lay),
                "grad_out": ((tq, case.heads_q, case.d_v), lay),
                "cu_seqlens_q": ((case.batch + 1,), "(batch + 1,)"),
                "cu_seqlens_k": ((case.batch + 1,), "(batch + 1,)"),
            }
        lay = "(batch, seqlen, heads, dim)"
        B = case.batch
        shapes = {
            "q": ((B, case.seqlen_q, case.heads_q, case.d), lay),
            "k": ((B, case.seqlen_k, case.heads_k, case.d), lay),
            "v": ((B, case.seqlen_k, case.heads_k, case.d_v), lay),
            "grad_out": ((B, case.seqlen_q, case.heads_q, case.d_v), lay),
        }
        if case.fp8:
            names = fp8.DESCALE_NAMES + (fp8.GRAD_DESCALE_NAMES if case.fp8_grad else ())
            shapes.update({n: ((B, case.heads_k), "(batch, heads_k)") for n in names})
        return shapes
    B, T, H, K, V = case.batch, case.seqlen, case.heads, case.d_k, case.d_v
    lay = "(batch, seqlen, heads, dim)"
    shapes = {
        "q": ((B, T, H, K), lay),
        "k": ((B, T, H, K), lay),
        "v": ((B, T, H, V), lay),
        "grad_out": ((B, T, H, V), lay),
    }
    if case.gate == "g":
        shapes["g"] = ((B, T, H), "(batch, seqlen, heads)")
    if case.gate == "g_gamma":
        shapes["g_gamma"] = ((H,), "(heads,)")
    if case.initial_state:
        shapes["initial_state"] = ((B, H, K, V), "(batch, heads, d_k, d_v)")
    if case.grad_final_state:
        shapes["grad_final_state"] = ((B, H, K, V), "(batch, heads, d_k, d_v)")
    return shapes


_FP32_INPUTS = ("g", "g_gamma", "initial_state", "grad_final_state")
_INT_INPUTS = ("cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "block_table")


def check_inputs(case: Case, inputs: SoftmaxInputs | LinearInputs | dict) -> None:
    """Raise ``ValueError`` naming the argument when ``inputs`` do not fit ``case``.

    Checks, in order: every needed tensor present and no stray one; rank and layout (a (B, H, S, D)
    tensor is recognised and named); heads_q a multiple of heads_k; shapes against the case;
    dtypes (q, k, v, grad_out in the case's dtype; gates and states float32; cu_seqlens int32);
    one device; every float element finite.
    """
    if not isinstance(case, (SoftmaxCase, LinearCase, DecodeCase)):
        raise ValueError(f"case: expected a SoftmaxCase, LinearCase or DecodeCase, got {type(case).__name__}")
    tensors = inputs if isinstance(inputs, dict) else getattr(inputs, "tensors", lambda: None)()
    if not isinstance(tensors, dict):
        raise ValueError(
            f"inputs: expected SoftmaxInputs / LinearInputs or a dict of tensors, got {type(inputs).__name__}"
        )
    tensors = {k: v for k, v in tensors.items() if v is not None}
    if "q" in tensors:
        tensors = {"q": tensors["q"], **tensors}
    want = _expected_input_shapes(case)
    for name in want:
        if name not in tensors:
            raise ValueError(f"{name}: missing; case {case.id} needs {', '.join(want)}")
    for name in tensors:
        if name not in want:
            raise ValueError(f"{name}: not an input of case {case.id} (expected {', '.join(want)})")
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        shape, layout = want[name]
        if t.dim() != len(shape):
            raise ValueError(f"{name}: expected rank {len(shape)} {layout}, got shape {tuple(t.shape)}")
    for name, t in tensors.items():  # q first (dict order of the inputs' fields)
        shape, layout = want[name]
        got = tuple(t.shape)
        if got != shape:
            hint = ""
            if len(shape) == 4 and got == (shape[0], shape[2], shape[1], shape[3]):
                hint = (
                    " (this looks like (batch, heads, seqlen, dim); "
                    "the harness uses (batch, seqlen, heads, dim))"
                )
            raise ValueError(f"{name}: expected shape {shape} {layout} for case {case.id}, got {got}{hint}")
        if name == "q" and isinstance(case, SoftmaxCase):
            hq, hk = t.shape[-2], tensors["k"].shape[-2]
            if hk == 0 or hq % hk:
                raise ValueError(
                    f"k: heads_q ({hq}) must be a multiple of heads_k ({hk}) (GQA/MQA group size)"
                )
    dt = case.torch_dtype
    low = fp8.fmt(case.fp8)[0] if getattr(case, "fp8", "") else None  # FP8 cases: q, k, v in the format
    grad_low = fp8.fmt(case.fp8_grad)[0] if getattr(case, "fp8_grad", "") else None  # dO of an FP8 backward
    for name, t in tensors.items():
        if low is not None and name in ("q", "k", "v"):
            if t.dtype != low:
                raise ValueError(f"{name}: dtype {t.dtype}, the case's FP8 inputs are {low}")
        elif grad_low is not None and name == "grad_out":
            if t.dtype != grad_low:
                raise ValueError(f"grad_out: dtype {t.dtype}, the case's FP8 backward takes dO in {grad_low}")
        elif name in _INT_INPUTS:
            if t.dtype != torch.int32:
                raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
        elif name in _FP32_INPUTS or name in fp8.DESCALE_NAMES or name in fp8.GRAD_DESCALE_NAMES:
            if t.dtype != torch.float32:
                raise ValueError(
                    f"{name}: expected dtype torch.float32 (log-decays, states and descales are fp32), got {t.dtype}"
                )
        elif t.dtype != dt:
            raise ValueError(f"{name}: dtype {t.dtype} does not match the case's {case.dtype} ({dt})")
    dev = tensors["q"].device
    for name, t in tensors.items():
        if t.device != dev:
            raise ValueError(f"{name}: device {t.device} does not match q's {dev}")
    for name, t in tensors.items():
        if t.is_floating_point():
            bad = ~torch.isfinite(t if t.element_size() > 1 else t.float())  # FP8: no isfinite kernel
            n = int(bad.sum())
            if n:
                first = tolerance._unravel(int(bad.reshape(-1).nonzero()[0]), tuple(t.shape))
                raise ValueError(
                    f"{name}: {n} non-finite element(s) (NaN or Inf), first at {list(first)}; "
                    "inputs must be finite"
                )


def _check_options(seed, device) -> torch.device:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' asked for, but torch.cuda.is_available() is False")
    return dev


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# --------------------------------------------------------------------------------------------
# Oracle and reference (the baseline)
# --------------------------------------------------------------------------------------------


def oracle_for(case: Case, inputs, seed: int = 0):
    """The FP64 oracle result for ``case`` on ``inputs``: from the golden store when it holds
    them (``harness.check.golden.oracle_result``), else computed."""
    try:
        from harness.check.golden import oracle_result
    except ImportError:  # the golden store is optional: compute directly
        return _compute_oracle(case, inputs)
    return oracle_result(case, inputs, seed)


def _compute_oracle(case: Case, inputs):
    """The FP64 oracle computed now (no golden store, no cache)."""
    from harness.check.golden import compute_oracle

    return compute_oracle(case, inputs)


class _ReferenceAdapter:
    """The eager reference in the candidate's dtype, run through the same path as a candidate:
    the registered ``eager`` / ``eager_linear`` adapters (matmuls in the input dtype, softmax and
    state in fp32, or in the input's own precision when wider, so an fp64 reference is fp64
    throughout and an fp32-internal candidate cannot pass as fp64)."""

    name = "reference"
    differentiable = True

    def run(self, case, **inputs):
        from harness.adapters.eager import EagerAdapter, EagerLinearAdapter

        if isinstance(case, DecodeCase):
            from harness.adapters.decode import DecodeEagerAdapter

            return DecodeEagerAdapter().run(case, **inputs)
        if isinstance(case, SoftmaxCase) and case.fp8:
            from harness.adapters.eager import EagerFP8Adapter

            return EagerFP8Adapter().run(case, **inputs)
        adapter = EagerAdapter() if isinstance(case, SoftmaxCase) else EagerLinearAdapter()
        return adapter.run(case, **inputs)

    def run_fp8_backward(self, case, forward, **inputs):
        from harness.adapters.eager import EagerFP8Adapter

        return EagerFP8Adapter().run_fp8_backward(case, forward, **inputs)


@dataclass
class Baseline:
    """Everything about (case, seed, device) that does not depend on the candidate.

    ``oracle``: the FP64 result (``.tensors()``); ``reference_errors``: rel-RMS error of the
    eager reference in the case's dtype, per tensor name (computed on first use).
    """

    case: Case
    seed: int
    device: torch.device
    inputs: SoftmaxInputs | LinearInputs
    oracle: object
    _reference_errors: dict[str, float] | None = None
    _fp8_lse_floor: float | None = None

    def oracle_tensors(self) -> dict[str, torch.Tensor]:
        return self.oracle.tensors()

    @property
    def reference_errors(self) -> dict[str, float]:
        if self._reference_errors is None:
            self._reference_errors = self._compute_reference_errors()
        return self._reference_errors

    def fp8_lse_floor(self) -> float:
        """The lse floor the case's FP8 inputs set (:func:`tolerance.fp8_lse_floor`), 0 for other
        cases; worked out once."""
        if not (isinstance(self.case, SoftmaxCase) and self.case.fp8):
            return 0.0
        if self._fp8_lse_floor is None:
            x, case = self.inputs, self.case
            scale = case.scale if case.scale is not None else case.d ** -0.5
            self._fp8_lse_floor = tolerance.fp8_lse_floor(x.q, x.k, x.q_descale, x.k_descale, scale,
                                                          self.oracle_tensors()["lse"])
        return self._fp8_lse_floor

    def _compute_reference_errors(self) -> dict[str, float]:
        grads = not getattr(self.case, "fp8", "") or bool(self.case.fp8_grad)  # FP8: with fp8_grad only
        run = _run_once(_ReferenceAdapter(), self.case, self.inputs, want_grad=grads, poison=False)
        expected = self.oracle_tensors()
        return {
            name: tolerance.rel_rms_error(t, expected[name])
            for name, t in run.tensors.items()
            if name in expected and tuple(t.shape) == tuple(expected[name].shape)
        }


#: intra-op thread counts whose CPU worker threads have run (:func:`warm_cpu_workers`)
_WARM_THREADS: set[int] = set()


def warm_cpu_workers() -> None:
    """Run the eager ops once on one thread, then one op over every CPU worker, before the first op the harness
    judges; once per intra-op thread count.

    Measured (torch 2.13.0+cpu, 2 threads, session 49; cause inside torch, not found): in about one process in 25 the
    first ``torch.logsumexp`` over a (2, 4, 37, 37) fp32 tensor returned the worker thread's half of the rows (147 of
    296) off by 2-5e-5 (~1e-5 relative, ~100x the eager yardstick's own error); the next call was exact (8 of 200 fresh
    processes; 0 of 200 after a softmax and an exp and sum of that size first). In tests/test_plugin.py an eager
    candidate whose run met it failed its lse and determinism checks (5 of 60 runs of the file; 1-2 of 20 since
    session 48).
    A parallel add first was not enough there (still 5 of 60); these ops on one thread first: 0 of 120."""
    threads = torch.get_num_threads()
    if threads > 1 and threads not in _WARM_THREADS:
        x = torch.linspace(-4.0, 4.0, 64).reshape(8, 8)
        torch.logsumexp(x, -1), torch.softmax(x, -1), x.exp().log1p()  # (one thread: small)
        torch.zeros(1 << 17).add_(1)  # (over at::internal::GRAIN_SIZE: split over the workers)
        _WARM_THREADS.add(threads)


def prepare(case: Case, *, seed: int = 0, device=None, inputs=None, oracle=None) -> Baseline:
    """Validate and build the :class:`Baseline` of (case, seed, device).

    ``inputs`` default to ``make_inputs(case, seed, device)``; ``oracle`` (a SoftmaxResult /
    LinearResult on the same inputs) defaults to :func:`oracle_for`. Raises ``ValueError`` naming
    the argument on bad input.
    """
    if not isinstance(case, (SoftmaxCase, LinearCase, DecodeCase)):
        raise ValueError(f"case: expected a SoftmaxCase, LinearCase or DecodeCase, got {type(case).__name__}")
    dev = _check_options(seed, default_device() if device is None else device)
    warm_cpu_workers()  # (the oracle's and the yardstick's CPU ops too)
    if inputs is None:
        inputs = make_inputs(case, seed, dev)
    check_inputs(case, inputs)
    dev = inputs.q.device
    if oracle is None:
        oracle = oracle_for(case, inputs, seed)
    elif not callable(getattr(oracle, "tensors", None)):
        raise ValueError(f"oracle: expected a SoftmaxResult / LinearResult, got {type(oracle).__name__}")
    return Baseline(case, seed, dev, inputs, oracle)


# --------------------------------------------------------------------------------------------
# Running a candidate
# --------------------------------------------------------------------------------------------


def _poison_cuda_cache(device: torch.device) -> None:
    """Fill the caching allocator's free blocks with NaN: a kernel that reads or returns memory
    it never wrote then sees NaN, not a previous run's (correct-looking) values. Each free block
    is taken by one allocation of exactly its size (the allocator's best fit returns that block)."""
    try:
        sizes = sorted(
            (
                b["size"]
                for seg in torch.cuda.memory_snapshot()
                if seg.get("device", device.index or 0) == (device.index or 0)
                for b in seg["blocks"]
                if b["state"] == "inactive"
            ),
            reverse=True,
        )
    except Exception:  # older torch or allocator without snapshots: nothing to fill
        return
    held, total = [], 0
    try:
        for size in sizes:
            if total + size > CUDA_POISON_MAX_BYTES or size < 4:
                continue
            held.append(torch.full((size // 4,), math.nan, dtype=torch.float32, device=device))
            total += size
    except torch.cuda.OutOfMemoryError:
        pass
    finally:
        del held


@contextlib.contextmanager
def poisoned_memory(device: torch.device):
    """Within: ``torch.empty`` returns NaN-filled memory (deterministic mode with
    ``fill_uninitialized_memory``), and on CUDA the allocator's free blocks hold NaN. Every global
    setting is restored on exit."""
    import torch.utils.deterministic as det

    prev_on = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_fill = det.fill_uninitialized_memory
    try:
        with warnings.catch_warnings():
            # warn_only: an op without a deterministic implementation still runs, it only warns.
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            warnings.filterwarnings("ignore", message=".*CUBLAS_WORKSPACE_CONFIG.*")
            torch.use_deterministic_algorithms(True, warn_only=True)
            det.fill_uninitialized_memory = True
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                _poison_cuda_cache(device)
            yield
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    finally:
        torch.use_deterministic_algorithms(prev_on, warn_only=prev_warn)
        det.fill_uninitialized_memory = prev_fill


def _run_once(adapter, case: Case, inputs, *, want_grad: bool, poison: bool) -> _Run:
    """Forward (and gradients) of ``adapter`` on fresh copies of ``inputs``."""
    warm_cpu_workers()  # (a thread count changed since prepare: its new workers)
    originals = _run_inputs(case, inputs)
    constant = set(getattr(adapter, "nondifferentiable_inputs", ()))
    # FP8 gradients come from the backend's explicit FP8 backward, not autograd (FP8 leaves hold no grads)
    fp8_case = isinstance(case, SoftmaxCase) and bool(case.fp8)
    fp8_backward = want_grad and fp8_case and bool(case.fp8_grad)  # FP8 cases without fp8_grad: forward only
    autograd = want_grad and not fp8_case
    leaves = {
        n: t.detach().clone().requires_grad_(autograd and n in GRAD_NAMES and n not in constant)
        for n, t in originals.items()
    }
    # The candidate gets non-leaf copies: an in-place write then shows up as a mutated input
    # instead of autograd's "leaf variable used in an in-place operation" error. They are laid
    # out in memory as the case says (strides, storage offset, packed qkv): same values.
    passed = apply_layout(case, {n: (t.clone() if t.requires_grad else t) for n, t in leaves.items()})
    if isinstance(case, DecodeCase):  # the candidate writes the new tokens into the cache: its own copy
        want_grad = autograd = False
        passed.update({n: originals[n].clone() for n in ("k_cache", "v_cache")})
    dev = inputs.q.device
    ctx = poisoned_memory(dev) if poison else contextlib.nullcontext()
    with ctx:
        with torch.set_grad_enabled(autograd):
            output = adapter.run(case, **passed)
        tensors = _output_tensors(case, output)
        # A wrong output shape would surface as autograd's shape error: name it as the contract.
        want_out = _out_shape(case, inputs)
        if tuple(tensors["out"].shape) != want_out:
            raise _ContractError(f"out: shape {tuple(tensors['out'].shape)}, the contract says {want_out}")
        missing: list[str] = []
        if autograd:
            tensors.update(_gradients(case, inputs, output, leaves, missing))
        elif fp8_backward:
            extra = {n: getattr(inputs, n).clone() for n in ("grad_out",) + fp8.GRAD_DESCALE_NAMES}
            passed.update(extra)
            grads = adapter.run_fp8_backward(case, output, **passed)
            tensors.update(_fp8_gradients(case, inputs, grads))
    return _Run(output, {n: t.detach() for n, t in tensors.items()}, passed, tuple(missing))


def _out_shape(case: Case, inputs) -> tuple[int, ...]:
    if isinstance(case, DecodeCase):
        return (case.batch, case.seqlen_q, case.heads_q, case.d_v)
    return tuple(inputs.grad_out.shape)


def _output_tensors(case: Case, output) -> dict[str, torch.Tensor]:
    want = {SoftmaxCase: SoftmaxOutput, LinearCase: LinearOutput, DecodeCase: DecodeOutput}[type(case)]
    if not isinstance(output, want):
        raise _ContractError(f"run returned {type(output).__name__}; the contract asks for {want.__name__}")
    if not isinstance(output.out, torch.Tensor):
        raise _ContractError(f"out: expected a torch.Tensor, got {type(output.out).__name__}")
    res = {"out": output.out}
    descale = getattr(output, "out_descale", None)
    if descale is not None:  # an FP8 output with its scale, read back here (outside the timed call)
        if not (isinstance(case, SoftmaxCase) and case.fp8_out):
            raise _ContractError("out_descale: only an fp8_out case's output is written in FP8 with a scale")
        want_dtype = fp8.fmt(case.fp8)[0]
        if not isinstance(descale, torch.Tensor) or output.out.dtype != want_dtype:
            raise _ContractError(f"out_descale: expected a float32 tensor beside an out in {want_dtype}, got "
                                 f"{type(descale).__name__} beside {output.out.dtype}")
        try:
            res["out"] = fp8.read_back(output.out, descale, case.torch_dtype)
        except ValueError as e:
            raise _ContractError(str(e)) from None
    extra = "final_state" if isinstance(case, LinearCase) else "lse"
    value = getattr(output, extra)
    if isinstance(case, SoftmaxCase) and not case.return_lse:
        value = None  # the out-only call: an lse the adapter computed on its own is not the callee's answer
    if value is not None:
        if not isinstance(value, torch.Tensor):
            raise _ContractError(f"{extra}: expected a torch.Tensor or None, got {type(value).__name__}")
        res[extra] = value
    return res


def _fp8_gradients(case: SoftmaxCase, inputs, grads) -> dict[str, torch.Tensor]:
    """{dq, dk, dv} of an FP8 backward's answer, real values: FP8 gradients (``fp8_out`` cases) read
    back with the case's descales, here, outside any timed call."""
    if not (isinstance(grads, (tuple, list)) and len(grads) == 3 and all(isinstance(g, torch.Tensor) for g in grads)):
        raise _ContractError(f"run_fp8_backward returned {type(grads).__name__}; the contract asks for (dq, dk, dv)")
    low = fp8.fmt(case.fp8_grad)[0]
    res = {}
    for name, g in zip(("dq", "dk", "dv"), grads):
        if g.dtype == low:
            if not case.fp8_out:
                raise _ContractError(f"{name}: written in {low}; only an fp8_out case's gradients are FP8")
            g = fp8.dequantize(g, getattr(inputs, f"{name}_descale").to(g.device), dtype=torch.float32)
        elif g.element_size() == 1:
            raise _ContractError(f"{name}: dtype {g.dtype}, the case's FP8 gradients are {low}")
        res[name] = g
    return res


class _ContractError(Exception):
    """The adapter returned something the contract does not allow."""


def _gradients(case: Case, inputs, output, leaves: dict[str, torch.Tensor], missing: list | None = None):
    """{grad name: gradient} via torch.autograd.grad of <out, grad_out> (+ <final_state, dhT>).

    Inputs no gradient reached get zeros; their names are appended to ``missing`` when given.
    (harness.accept uses this helper: keep the signature.)"""
    outs, grads_out = [output.out], [inputs.grad_out]
    if (
        isinstance(case, LinearCase)
        and output.final_state is not None
        and inputs.grad_final_state is not None
    ):
        # loss = <o, dO> + <final_state, dhT>
        outs.append(output.final_state)
        grads_out.append(inputs.grad_final_state.to(output.final_state.dtype))
    if not any(o.requires_grad for o in outs):
        raise _ContractError("out does not require grad although the adapter declares differentiable=True")
    names = [n for n in leaves if n in GRAD_NAMES and leaves[n].requires_grad]
    pairs = [(o, g) for o, g in zip(outs, grads_out) if o.requires_grad]
    grads = torch.autograd.grad(
        [o for o, _ in pairs], [leaves[n] for n in names], [g for _, g in pairs], allow_unused=True
    )
    # An input the candidate's graph does not reach gets a zero gradient, so the comparison
    # shows the damage (and the reason says why).
    if missing is not None:
        missing.extend(n for n, g in zip(names, grads) if g is None)
    return {
        GRAD_NAMES[n]: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, grads)
    }


# --------------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------------


def _resolve_adapter(adapter) -> Adapter:
    if isinstance(adapter, str):
        from harness.adapters import registry

        try:
            return registry.get(adapter)
        except KeyError as e:
            raise ValueError(f"adapter: {e.args[0]}") from None
    if not (callable(getattr(adapter, "run", None)) and hasattr(adapter, "name")):
        raise ValueError(f"adapter: expected an Adapter (or a registered name), got {type(adapter).__name__}")
    return adapter


def verify(
    adapter: Adapter | str,
    case: Case,
    *,
    seed: int = 0,
    device=None,
    oracle=None,
    inputs=None,
    baseline: Baseline | None = None,
    check_backward: bool = True,
    check_determinism: bool = True,
) -> CaseResult:
    """Run ``adapter`` on ``case`` and judge it against the FP64 oracle.

    Args:
        adapter: an :class:`~harness.adapters.base.Adapter` or a registered name.
        case: a SoftmaxCase or LinearCase.
        seed: input seed (``make_inputs(case, seed)``).
        device: where to run; default CUDA when available, else CPU.
        oracle: a precomputed SoftmaxResult / LinearResult on the same inputs (else golden store
            or computed).
        inputs: precomputed inputs (default: seeded).
        baseline: a :func:`prepare` result to reuse (overrides seed / device / oracle / inputs).
        check_backward: compare gradients too (ignored for non-differentiable adapters).
        check_determinism: run twice and compare bitwise.

    Returns:
        :class:`CaseResult`. Bad arguments raise ``ValueError`` naming the argument, before
        anything runs; a candidate that raises gives status "error" (``Unsupported``:
        "unsupported").
    """
    adapter = _resolve_adapter(adapter)
    if baseline is None:
        baseline = prepare(case, seed=seed, device=device, inputs=inputs, oracle=oracle)
    elif baseline.case != case:
        raise ValueError(f"baseline: built for case {baseline.case.id}, not {getattr(case, 'id', case)}")
    case, dev = baseline.case, baseline.device
    result = CaseResult(
        backend=adapter.name,
        case=case.id,
        family=case.family,
        dtype=case.dtype,
        device=str(dev),
        seed=baseline.seed,
        status="pass",
    )
    t0 = time.perf_counter()
    try:
        want_grad = _wants_grad(adapter, case, check_backward)
        try:
            reason = adapter.supports(case, dev) if hasattr(adapter, "supports") else None
            if reason:
                result.status, result.reason = "unsupported", str(reason)
                return result
            t_call = time.perf_counter()
            first = _run_once(adapter, case, baseline.inputs, want_grad=want_grad, poison=True)
            result.timings["first_call_s"] = time.perf_counter() - t_call
            second = None
            if check_determinism:
                t_call = time.perf_counter()
                second = _run_once(adapter, case, baseline.inputs, want_grad=want_grad, poison=True)
                result.timings["second_call_s"] = time.perf_counter() - t_call
        except Unsupported as e:
            result.status, result.reason = "unsupported", str(e) or type(e).__name__
            return result
        except _ContractError as e:
            result.status, result.reason = "fail", f"contract: {e}"
            result.properties.append(PropertyResult("contract", "fail", str(e)))
            return result
        except Exception as e:  # the candidate crashed: an error, with its traceback
            result.status = "error"
            result.reason = (
                f"run raised {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            )
            result.error_traceback = traceback.format_exc(limit=-6)
            return result
        t_judge = time.perf_counter()
        _judge(result, adapter, baseline, first, second, want_grad)
        result.timings["judge_s"] = time.perf_counter() - t_judge
        return result
    finally:
        result.seconds = time.perf_counter() - t0


def _wants_grad(adapter, case: Case, check_backward: bool) -> bool:
    """Whether gradients are checked: FP8 cases only with ``fp8_grad`` and a backend that declares an
    FP8 backward (their gradients are not autograd's), others when the backend is differentiable."""
    return bool(check_backward) and has_backward(adapter, case)


def judge_runs(adapter, baseline: Baseline, first: _Run, second: _Run | None, *, want_grad: bool) -> CaseResult:
    """The verdict on runs made elsewhere: ``first`` (and ``second``, for determinism) of ``adapter``
    on ``baseline``'s inputs, e.g. read back from the acceptance check's child process. ``adapter``
    supplies only its declarations (``name``, ``differentiable``, ``deterministic_backward``,
    ``nondifferentiable_inputs``, ``masked_rows``); nothing of it runs."""
    case = baseline.case
    result = CaseResult(backend=adapter.name, case=case.id, family=case.family, dtype=case.dtype,
                        device=str(baseline.device), seed=baseline.seed, status="pass")
    _judge(result, adapter, baseline, first, second, want_grad)
    return result


def _map_empty_rows(adapter, run, dead: torch.Tensor | None) -> None:
    """The backend's declared lse on rows that see no key (``lse_empty_rows``, e.g. flash-attn's +inf)
    as the oracle's -inf, on those rows only: a +inf anywhere else stays and fails. Done here, after the
    run, so that the mapping is never part of a timed call."""
    value = getattr(adapter, "lse_empty_rows", None)
    if run is None or value is None or dead is None or "lse" not in run.tensors:
        return
    lse = run.tensors["lse"]
    rows = dead.movedim(-1, -2).to(lse.device)  # (B, Sq, Hq) -> lse's (B, Hq, Sq); (total, Hq) -> (Hq, total)
    if tuple(lse.shape) == tuple(rows.shape):
        run.tensors["lse"] = torch.where(rows & (lse == value), torch.full_like(lse, -math.inf), lse)


def _judge(result: CaseResult, adapter, baseline: Baseline, first: _Run, second, want_grad: bool) -> None:
    case = baseline.case
    expected = baseline.oracle_tensors()
    ref_errors = baseline.reference_errors
    contract = _check_contract(case, first, expected, baseline.device)
    dead = _masked_rows(case, expected)
    for run in (first, second):
        _map_empty_rows(adapter, run, dead)
    masked = _check_masked_rows(adapter, case, first, dead)
    for name in tolerance.TENSOR_NAMES:
        if name not in first.tensors or name not in expected:
            continue
        if not want_grad and name not in ("out", "lse", "final_state"):
            continue
        exp = expected[name]
        if masked.status == "documented" and name in ("out", "lse") and dead is not None:
            # The backend documents another convention for rows that see no key: leave those
            # rows out of the numbers (the property reports the difference).
            exp = exp.clone()
            if name == "out":
                exp[dead] = math.nan
            else:
                exp.movedim(-2, -1)[dead] = math.nan
        result.tensors.append(
            tolerance.compare_tensor(
                name,
                first.tensors[name],
                exp,
                reference_error=ref_errors.get(name, 0.0),
                dtype=_compare_dtype(name, case),
                case_dtype=case.factor_dtype_of(name) if isinstance(case, SoftmaxCase) else getattr(
                    case, "factor_dtype", case.dtype),
                floor=baseline.fp8_lse_floor() if name == "lse" else 0.0,
            )
        )
    runs = [first] + ([second] if second is not None else [])
    result.properties = [contract, _check_unchanged(case, baseline.inputs, runs), masked]
    if isinstance(case, DecodeCase):
        result.properties.append(_check_cache_write(case, runs, baseline.oracle_tensors()))
    if second is not None:
        result.properties.append(_check_determinism(adapter, first, second, want_grad, case, baseline.device))
    else:
        result.properties.append(
            PropertyResult("determinism", "skipped", "not checked (check_determinism=False)")
        )
    if not want_grad:
        why = ("check_backward=False" if getattr(adapter, "differentiable", True) else "inference-only backend")
        if getattr(case, "fp8", ""):
            why = fp8_backward_reason(adapter, case) or why
        result.properties.append(PropertyResult("backward", "skipped", f"gradients not checked ({why})"))
    else:
        constant = [
            n for n in getattr(adapter, "nondifferentiable_inputs", ()) if GRAD_NAMES.get(n) in expected
        ]
        if constant:
            text = ", ".join(f"{n} (no {GRAD_NAMES[n]})" for n in constant)
            result.properties.append(
                PropertyResult("backward", "documented", f"declared constant by the backend: {text}")
            )
    for t in result.tensors:
        lost = [n for n in first.missing_grads if GRAD_NAMES[n] == t.name]
        if lost and not t.passed:
            t.reason = (
                f"{t.name}: no gradient reaches {lost[0]} (the candidate's graph does not depend on it); "
                + t.reason
            )
    failed = [p for p in result.properties if p.failed]
    bad_tensors = [t for t in result.tensors if not t.passed]
    if failed or bad_tensors:
        result.status = "fail"
        # Properties that explain the numbers first (a mutated input or a wrong shape is the
        # cause; the tensor errors are its symptoms).
        causes = [p for p in failed if p.name in ("contract", "inputs_unchanged")]
        reasons = [(p.name, f"{p.name}: {p.detail}") for p in causes] + [
            (t.name, t.reason) for t in bad_tensors
        ]
        reasons += [(p.name, f"{p.name}: {p.detail}") for p in failed if p not in causes]
        others = [name for name, _ in reasons[1:]]
        result.reason = reasons[0][1] + (f" (also failed: {', '.join(others)})" if others else "")
