"""Anti-cheat checks: what a plain correctness run does not see.

* :func:`check_caching`: two back-to-back calls on different inputs of the same shape, each judged
  against its own oracle. A kernel that memoises its last output (keyed on shapes) returns the
  first answer to the second question.
* :func:`recheck_after_calls`: a burst of back-to-back calls, as a timing loop makes, then a full
  verification on fresh inputs. Catches a kernel whose results change once warmed up (a fast
  path switched on after N calls, an autotuned config that is wrong). The speed section runs it
  again right after the real timing.
* :func:`check_side_stream` (CUDA): the output read on the calling stream right after the call
  returns must equal the output after a full device sync. A kernel that leaves its work on a side
  stream without joining the caller's stream returns too early: a timer on the calling stream
  measures nothing, and a consumer reads unfinished (NaN-poisoned) memory. On CPU there are no
  streams and the check is a recorded no-op.

Each returns a :class:`harness.verify.PropertyResult` ("pass", "fail" or "skipped").
"""

from __future__ import annotations

import torch

from harness import tolerance
from harness import verify as V
from harness.adapters.base import Unsupported
from harness.cases import Case
from harness.verify import PropertyResult

#: Back-to-back calls before the re-check: a timing loop in miniature. harness.timing warms up
#: with at least 3 calls before its first timed repetition, so a kernel that changes behaviour
#: after its first calls has changed by then; cheap on the CPU variants.
RECHECK_CALLS = 3

#: GPU cycles the calling stream sleeps before the side-stream probe's call (~30 ms at 1.7 GHz):
#: a candidate whose side stream waits on the calling stream then starts its work only when the
#: sleep ends, at the same moment as our read of its output, so an unjoined side stream is seen.
SIDE_STREAM_SLEEP_CYCLES = 50_000_000


def check_caching(adapter, case: Case, seeds: tuple[int, int], device, *, prior_failed: bool = False) -> PropertyResult:
    """Call the candidate on inputs of ``seeds[0]`` then ``seeds[1]`` (same shapes, forward only);
    each output must match its own oracle within the tolerance rule. With ``prior_failed`` (the
    per-seed checks already fail), only a bit-identical answer to different inputs is counted: a
    wrong output is then the known failure again, not evidence of caching."""
    baselines = [V.prepare(case, seed=s, device=device) for s in seeds]
    try:
        runs = [V._run_once(adapter, case, b.inputs, want_grad=False, poison=True) for b in baselines]
    except Unsupported as e:
        return PropertyResult("caching", "skipped", f"unsupported: {e}")
    reports = []
    for b, r in zip(baselines, runs):
        expected = b.oracle_tensors()["out"]
        got = r.tensors["out"]
        reports.append(
            tolerance.compare_tensor(
                "out", got, expected, reference_error=b.reference_errors.get("out", 0.0),
                dtype=case.torch_dtype, case_dtype=case.dtype,
            )
        )
    out_a, out_b = runs[0].tensors["out"], runs[1].tensors["out"]
    exp_a, exp_b = (b.oracle_tensors()["out"] for b in baselines)
    same_answer = V.bitwise_equal(out_a, out_b) and not torch.equal(exp_a, exp_b)
    s_a, s_b = seeds
    if same_answer:
        return PropertyResult(
            "caching", "fail",
            f"the call on inputs of seed {s_b} returned bit for bit the output of the previous call (seed {s_a}) "
            f"although the inputs differ: the output is cached between calls ({reports[1].summary()})",
        )
    bad = [(s, rep) for s, rep in zip(seeds, reports) if not rep.passed]
    if bad:
        text = "; ".join(f"seed {s}: {rep.summary()}" for s, rep in bad)
        if prior_failed:
            return PropertyResult(
                "caching", "skipped",
                f"not judged: the per-seed checks already fail and no output was returned twice ({text})",
            )
        return PropertyResult(
            "caching", "fail",
            f"back-to-back calls on different inputs of the same shape: an output does not match its own inputs ({text})",
        )
    return PropertyResult(
        "caching", "pass",
        f"two back-to-back calls on different inputs (seeds {s_a}, {s_b}) each match their own oracle "
        f"(out within {max(r.budget for r in reports):.2f} of the bound)",
    )


def recheck_after_calls(
    adapter, case: Case, *, warm_seed: int, check_seed: int, device, backward: bool, calls: int = RECHECK_CALLS,
    after: str = "", prior_failed: bool = False,
) -> tuple[PropertyResult, V.CaseResult | None]:
    """Run ``calls`` back-to-back forward (+ backward) calls on the inputs of ``warm_seed``, then
    :func:`harness.verify.verify` on fresh inputs (``check_seed``). ``after`` names what preceded
    (the report's words, e.g. "timing 120 reps"); default: the burst itself. With ``prior_failed``
    (the per-seed checks already fail) a failure here is reported as skipped: nothing new."""
    what = after or f"a burst of {calls} back-to-back calls (a timing loop in miniature)"
    if calls > 0:
        warm = V.prepare(case, seed=warm_seed, device=device)
        want_grad = bool(backward and getattr(adapter, "differentiable", True))
        try:
            for _ in range(calls):
                V._run_once(adapter, case, warm.inputs, want_grad=want_grad, poison=False)
        except Unsupported as e:
            return PropertyResult("recheck_after_timing", "skipped", f"unsupported: {e}"), None
    res = V.verify(adapter, case, seed=check_seed, device=device, check_backward=backward, check_determinism=False)
    if res.status == "pass":
        return PropertyResult(
            "recheck_after_timing", "pass", f"results re-checked after {what}: fresh inputs (seed {check_seed}) pass"
        ), res
    if res.status == "unsupported":
        return PropertyResult("recheck_after_timing", "skipped", f"unsupported: {res.reason}"), res
    if prior_failed:
        return PropertyResult(
            "recheck_after_timing", "skipped",
            f"not judged: the per-seed checks already fail (after {what}, seed {check_seed}: {res.reason})",
        ), res
    return PropertyResult(
        "recheck_after_timing", "fail", f"after {what}, fresh inputs (seed {check_seed}) fail: {res.reason}"
    ), res


def _early_and_late(adapter, case: Case, inputs, *, sleep_cycles: int, backward: bool):
    """Outputs (and gradients) copied on the calling stream right after the call returned, and the
    same tensors after a full device sync."""
    dev = inputs.q.device
    originals = V._run_inputs(case, inputs)
    leaves = {n: t.detach().clone().requires_grad_(backward and n in V.GRAD_NAMES) for n, t in originals.items()}
    passed = {n: (t.clone() if t.requires_grad else t) for n, t in leaves.items()}
    torch.cuda.synchronize(dev)
    with V.poisoned_memory(dev):  # free memory holds NaN: an unfinished output reads as NaN
        stream = torch.cuda.current_stream(dev)
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        with torch.set_grad_enabled(backward):
            output = adapter.run(case, **passed)
        tensors = V._output_tensors(case, output)
        # Enqueued on the calling stream the moment the call returns: what the caller (or the end
        # event of a timer on this stream) sees.
        early = {n: t.detach().clone() for n, t in tensors.items()}
        if backward:
            grads = V._gradients(case, inputs, output, leaves)
            early.update({n: g.detach().clone() for n, g in grads.items()})
            tensors.update(grads)
        stream.synchronize()
        early = {n: t.cpu() for n, t in early.items()}
        torch.cuda.synchronize(dev)
        late = {n: t.detach().cpu() for n, t in tensors.items()}
    return early, late


def check_side_stream(adapter, case: Case, seed: int, device, *, backward: bool) -> PropertyResult:
    """CUDA: outputs read on the calling stream right after return == outputs after a full device
    sync, with and without the calling stream busy before the call. CPU: skipped (no streams)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return PropertyResult(
            "side_stream", "skipped",
            "CPU: there are no streams, so work cannot be hidden on one; the check runs on CUDA only",
        )
    base = V.prepare(case, seed=seed, device=dev)
    want_grad = bool(backward and getattr(adapter, "differentiable", True))
    problems = []
    try:
        for sleep in (0, SIDE_STREAM_SLEEP_CYCLES):
            early, late = _early_and_late(adapter, case, base.inputs, sleep_cycles=sleep, backward=want_grad)
            for name, e in early.items():
                l_ = late[name]
                if not V.bitwise_equal(e, l_):
                    n = int((V._bits(e) != V._bits(l_)).sum()) if e.shape == l_.shape else e.numel()
                    nan = int(torch.isnan(e).sum()) if e.is_floating_point() else 0
                    when = "calling stream busy before the call" if sleep else "idle calling stream"
                    problems.append(f"{name}: {n} element(s) differ ({nan} NaN) ({when})")
    except Unsupported as e:
        return PropertyResult("side_stream", "skipped", f"unsupported: {e}")
    if problems:
        return PropertyResult(
            "side_stream", "fail",
            "values read on the calling stream right after the call returned differ from the values after a "
            "full device sync: the work continues on another stream the caller's stream does not wait for ("
            + "; ".join(problems) + ")",
        )
    what = "out and gradients" if want_grad else "out"
    return PropertyResult(
        "side_stream", "pass", f"{what} complete on the calling stream when the call returns (idle and busy stream)"
    )
