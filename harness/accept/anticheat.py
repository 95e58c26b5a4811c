"""Anti-cheat checks: what a plain correctness run does not see. The rules live here; the parent
(:mod:`harness.accept.judge`) chooses each call's inputs, has the candidate's process make the
calls, and applies these rules to the tensors that come back.

* caching (:func:`caching_verdict`): two back-to-back calls on different inputs of the same shape,
  each judged against its own oracle. A kernel that memoises its last output (keyed on shapes)
  returns the first answer to the second question.
* re-check after timing (:func:`recheck_verdict`): a burst of back-to-back calls, as a timing loop
  makes, then a full verification on fresh inputs. Catches a kernel whose results change once
  warmed up (a fast path switched on after N calls, an autotuned config that is wrong). The speed
  section re-checks again right after the real timing.
* side stream (:func:`side_stream_verdict`, CUDA): the outputs read on the calling stream right
  after the call returns must equal the outputs after a full device sync. A kernel that leaves its
  work on a side stream without joining the caller's stream returns too early: a timer on the
  calling stream measures nothing, and a consumer reads unfinished (NaN-poisoned) memory. The
  copies are made in the candidate's process (:func:`harness.accept.runner.early_and_late`: only
  there is "right after the call returns"); on CPU there are no streams and the check is a
  recorded no-op.

Each verdict is a :class:`harness.check.verify.PropertyResult` ("pass", "fail" or "skipped").
"""

from __future__ import annotations

import torch

from harness.cases import Case
from harness.check import tolerance
from harness.check import verify as V
from harness.check.properties import _bits
from harness.check.verify import PropertyResult

#: Back-to-back calls before the re-check: a timing loop in miniature. harness.perf.timing warms up
#: with at least 3 calls before its first timed repetition, so a kernel that changes behaviour
#: after its first calls has changed by then; cheap on the CPU variants.
RECHECK_CALLS = 3

#: GPU cycles the calling stream sleeps before the side-stream probe's call (~30 ms at 1.7 GHz):
#: a candidate whose side stream waits on the calling stream then starts its work only when the
#: sleep ends, at the same moment as our read of its output, so an unjoined side stream is seen.
SIDE_STREAM_SLEEP_CYCLES = 50_000_000


def caching_verdict(case: Case, baselines: list, outs: list[torch.Tensor], seeds: tuple[int, int], *,
                    prior_failed: bool = False) -> PropertyResult:
    """``outs``: the outputs of two back-to-back forward calls on the inputs of ``baselines``
    (seeds ``seeds``); each must match its own oracle within the tolerance rule. With
    ``prior_failed`` (the per-seed checks already fail), only a bit-identical answer to different
    inputs is counted: a wrong output is then the known failure again, not evidence of caching."""
    reports = []
    for b, got in zip(baselines, outs):
        expected = b.oracle_tensors()["out"]
        reports.append(
            tolerance.compare_tensor(
                "out", got, expected, reference_error=b.reference_errors.get("out", 0.0),
                dtype=case.torch_dtype, case_dtype=case.dtype,
            )
        )
    exp_a, exp_b = (b.oracle_tensors()["out"] for b in baselines)
    same_answer = V.bitwise_equal(outs[0], outs[1]) and not torch.equal(exp_a, exp_b)
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


def recheck_verdict(res: V.CaseResult, *, calls: int, check_seed: int, after: str = "",
                    prior_failed: bool = False) -> tuple[PropertyResult, V.CaseResult | None]:
    """``res``: the verification on fresh inputs (``check_seed``) made after ``calls`` back-to-back
    calls, or after what ``after`` names (the report's words, e.g. "timing (120 calls)"). With
    ``prior_failed`` (the per-seed checks already fail) a failure here is reported as skipped."""
    what = after or f"a burst of {calls} back-to-back calls (a timing loop in miniature)"
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


def side_stream_not_applicable() -> PropertyResult:
    return PropertyResult(
        "side_stream", "skipped",
        "CPU: there are no streams, so work cannot be hidden on one; the check runs on CUDA only",
    )


def side_stream_verdict(pairs: list[tuple[int, dict, dict]], *, with_grads: bool) -> PropertyResult:
    """``pairs``: per probe (sleep cycles before the call, tensors copied on the calling stream right
    after the call returned, the same tensors after a full device sync). Every pair must be
    bitwise equal."""
    problems = []
    for sleep, early, late in pairs:
        when = "calling stream busy before the call" if sleep else "idle calling stream"
        if "out" not in early or set(early) != set(late):
            problems.append(f"the probe returned {sorted(early)} early and {sorted(late)} late ({when})")
            continue
        for name, e in early.items():
            l_ = late[name]
            if not V.bitwise_equal(e, l_):
                n = int((_bits(e) != _bits(l_)).sum()) if e.shape == l_.shape and e.dtype == l_.dtype else e.numel()
                nan = int(torch.isnan(e).sum()) if e.is_floating_point() else 0
                problems.append(f"{name}: {n} element(s) differ ({nan} NaN) ({when})")
    if problems:
        return PropertyResult(
            "side_stream", "fail",
            "values read on the calling stream right after the call returned differ from the values after a "
            "full device sync: the work continues on another stream the caller's stream does not wait for ("
            + "; ".join(problems) + ")",
        )
    what = "out and gradients" if with_grads else "out"
    return PropertyResult(
        "side_stream", "pass", f"{what} complete on the calling stream when the call returns (idle and busy stream)"
    )
