"""The judge: every decision of the acceptance check, in the parent process, which never imports the
candidate.

Per case the parent builds everything that does not depend on the candidate (seeded inputs, the
FP64 oracle computed afresh, the eager reference's error in the case's dtype: a
:class:`harness.check.verify.Baseline`), writes the inputs to a file for the candidate's process
(:mod:`harness.accept.runner`), asks it for calls, reads back the raw tensors and judges them with
the tolerance engine and the property checks of :mod:`harness.check.verify`. Determinism is two calls
compared bitwise here; the anti-cheat checks (:mod:`harness.accept.anticheat`) choose the inputs
of each call and judge its outputs here. The child's answers besides tensors (a reason, a
traceback, the device an output was on) are shown, never trusted to pass anything: a patched
verifier, tolerance module or oracle in the child changes nothing the parent computes.

The candidate's declarations (``attn_capabilities``: features, dtypes, a documented
nondeterministic backward, constant inputs) come from the child's probe; they decide what is
"unsupported" and how determinism is reported, as they did in-process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.accept import anticheat, exchange
from harness.accept.exchange import case_to_dict
from harness.adapters.base import fp8_backward_reason
from harness.cases import make_inputs
from harness.check import verify as V

#: Offset of the anti-cheat checks' seeds from the case's first seed: inputs the verification
#: seeds never used, yet reproducible from the one seed the report records.
ANTICHEAT_SEED_OFFSET = 1_000_003

#: Outputs a candidate returns, by family (besides the gradients named in verify.GRAD_NAMES).
_FORWARD_NAMES = {"softmax": ("out", "lse"), "linear": ("out", "final_state"), "decode": ("out", "lse")}


def read_answer(out_path: str, res: dict, *, device=None) -> dict:
    """The tensors of a child's answer, from the file *this* process named (``out_path``): the path
    in the child's message is never opened or deleted (a candidate could name any file of the user's).
    The file is removed after reading."""
    claimed = (res.get("outputs") or {}).get("path")
    path = Path(out_path)
    try:
        if claimed != out_path:
            raise exchange.ExchangeError(f"an answer naming {claimed!r} instead of the file it was given")
        return exchange.read_tensors(path, (res.get("outputs") or {}).get("sha256") or "-", device=device)
    finally:
        path.unlink(missing_ok=True)


def declared_adapter(name: str, family: str, capabilities: dict):
    """An adapter carrying only the candidate's declarations (as its child reported them): its
    ``supports`` and attributes are the callable adapter's; running it is an error."""
    from harness.adapters.user import DEFAULT_CAPABILITIES, make_callable_adapter

    def not_here(*args, **kwargs):
        raise RuntimeError("the judge never runs the candidate: calls go to its child process")

    not_here.attn_capabilities = {k: v for k, v in (capabilities or {}).items() if k in DEFAULT_CAPABILITIES}
    return make_callable_adapter(not_here, family=family, name=name)


def baseline(case, seed: int, device) -> V.Baseline:
    """Inputs, oracle and reference errors of (case, seed), computed here and now: the oracle is
    never read from a cache or the golden store, which the candidate's process could write."""
    dev = torch.device(device)
    inputs = make_inputs(case, seed, dev)
    oracle = V._compute_oracle(case, inputs)
    return V.prepare(case, seed=seed, device=dev, inputs=inputs, oracle=oracle)


@dataclass
class Answer:
    """One call's answer: ``status`` "ok" (``run`` holds the tensors), "unsupported", "contract"
    (the candidate returned something the contract forbids) or "error" (it raised)."""

    status: str
    reason: str = ""
    traceback: str = ""
    run: V._Run | None = None


class Judge:
    """Talks to one candidate child (``session``) about cases on ``device``; ``declared``: the
    candidate's declarations (:func:`declared_adapter`)."""

    def __init__(self, session, declared, device):
        self.session = session
        self.declared = declared
        self.device = torch.device(device)
        self._sent: dict[int, dict] = {}

    # -- inputs and calls ---------------------------------------------------------------------

    def inputs_ref(self, base: V.Baseline) -> dict:
        """Write ``base``'s inputs (with grad_out) for the child, once; their file and digest."""
        key = id(base)
        if key not in self._sent:
            path = self.session.file(f"inputs-{base.seed}")
            sha = exchange.write_tensors(Path(path), base.inputs.tensors())
            self._sent[key] = {"path": path, "sha256": sha, "base": base}
        return {"path": self._sent[key]["path"], "sha256": self._sent[key]["sha256"]}

    def forget(self, base: V.Baseline) -> None:
        """Remove ``base``'s input file (its calls are done)."""
        ref = self._sent.pop(id(base), None)
        if ref:
            Path(ref["path"]).unlink(missing_ok=True)

    def call(self, base: V.Baseline, *, want_grad: bool, poison: bool = True, with_inputs: bool = True) -> Answer:
        """One call of the candidate on ``base``'s inputs in the child; its tensors on our device."""
        case = base.case
        out_path = self.session.file("outputs")
        res = self.session.ask(
            "call", case=case_to_dict(case), inputs=self.inputs_ref(base), want_grad=want_grad, poison=poison,
            with_inputs=with_inputs, out_path=out_path,
        )
        status = res.get("status")
        if status != "ok":
            status = status if status in ("unsupported", "contract") else "error"
            return Answer(status, str(res.get("reason", "")), str(res.get("traceback", "")))
        tensors = read_answer(out_path, res, device=self.device)
        return self._as_run(case, base, tensors, res, want_grad=want_grad, with_inputs=with_inputs)

    def _as_run(self, case, base, tensors, res, *, want_grad, with_inputs) -> Answer:
        """The child's tensors as a verify._Run, after the contract checks the parent makes itself."""
        fwd_names = _FORWARD_NAMES[case.family]
        run_inputs = V._run_inputs(case, base.inputs)
        grad_names = {V.GRAD_NAMES[n] for n in run_inputs if n in V.GRAD_NAMES}
        constant = set(getattr(self.declared, "nondifferentiable_inputs", ()))
        wanted_grads = sorted(V.GRAD_NAMES[n] for n in run_inputs if want_grad and n in V.GRAD_NAMES and n not in constant)
        outs = {n: t for n, t in tensors.items() if n in fwd_names or n in grad_names}
        passed = {n[len("input."):]: t for n, t in tensors.items() if n.startswith("input.")}
        stray = sorted(n for n in tensors if n not in outs and not n.startswith("input."))
        problems = []
        if "out" not in outs:
            problems.append("out: not returned")
        elif tuple(outs["out"].shape) != V._out_shape(case, base.inputs):
            problems.append(f"out: shape {tuple(outs['out'].shape)}, the contract says {V._out_shape(case, base.inputs)}")
        missing = [g for g in wanted_grads if g not in outs]
        if missing:
            problems.append(f"gradients not returned: {', '.join(missing)}")
        if stray:
            problems.append(f"unexpected tensors returned: {', '.join(stray)}")
        if with_inputs:
            lost = sorted(set(run_inputs) - set(passed))
            if lost:
                problems.append(f"the inputs as the candidate left them were not returned: {', '.join(lost)}")
        if problems:
            return Answer("contract", "; ".join(problems))
        devices = {n: str(d) for n, d in (res.get("devices") or {}).items() if n in outs}
        missing_grads = tuple(n for n in res.get("missing_grads") or () if n in V.GRAD_NAMES)
        return Answer("ok", run=V._Run(output=None, tensors=outs, passed_inputs=passed,
                                       missing_grads=missing_grads, devices=devices))

    # -- one verification ---------------------------------------------------------------------

    def verify(self, base: V.Baseline, *, want_grad: bool, determinism: bool = True) -> V.CaseResult:
        """What :func:`harness.check.verify.verify` does, with the calls made in the child: two runs
        (determinism), each judged here against ``base``."""
        case = base.case
        t0 = time.perf_counter()
        result = V.CaseResult(backend=self.declared.name, case=case.id, family=case.family, dtype=case.dtype,
                              device=str(self.device), seed=base.seed, status="pass")
        want_grad = V._wants_grad(self.declared, case, want_grad)
        reason = self.declared.supports(case, self.device)
        if reason:
            result.status, result.reason = "unsupported", str(reason)
            return result
        answers = [self.call(base, want_grad=want_grad)]
        if determinism and answers[0].status == "ok":
            answers.append(self.call(base, want_grad=want_grad))
        bad = next((a for a in answers if a.status != "ok"), None)
        if bad is not None:
            if bad.status == "unsupported":
                result.status, result.reason = "unsupported", bad.reason
            elif bad.status == "contract":
                result.status, result.reason = "fail", f"contract: {bad.reason}"
                result.properties.append(V.PropertyResult("contract", "fail", bad.reason))
            else:
                result.status, result.reason, result.error_traceback = "error", bad.reason, bad.traceback
        else:
            result = V.judge_runs(self.declared, base, answers[0].run,
                                  answers[1].run if len(answers) > 1 else None, want_grad=want_grad)
        result.seconds = time.perf_counter() - t0
        return result


# --------------------------------------------------------------------------------------------
# One case
# --------------------------------------------------------------------------------------------


def run_case(judge: Judge, case, seeds: list[int], *, backward: bool,
             recheck_calls: int = anticheat.RECHECK_CALLS) -> dict:
    """Per seed a verification, then the anti-cheat checks; the case's raw results (what
    :func:`harness.accept.report.judge_case` reads)."""
    declared, dev = judge.declared, judge.device
    out: dict = {"case": case.id, "seeds": [], "anticheat": [], "unsupported_feature": None}
    if backward and getattr(case, "fp8", "") and fp8_backward_reason(declared, case):
        out["unsupported_feature"] = "backward"
        out["unsupported_reason"] = ("declares no FP8 backward (attn_capabilities['fp8_backward']): gradients cannot be "
                                     "checked" if case.fp8_grad else "a forward-only FP8 case")
        backward = False
    elif backward and not getattr(declared, "differentiable", True):
        out["unsupported_feature"] = "backward"
        out["unsupported_reason"] = "declares no backward (attn_capabilities backward=False): gradients cannot be checked"
        backward = False  # the forward is still checked and reported
    for seed in seeds:
        base = baseline(case, seed, dev)
        r = judge.verify(base, want_grad=backward)
        judge.forget(base)
        del base
        out["seeds"].append(r.to_dict())
        if r.status in ("unsupported", "error"):
            break  # the same answer for every seed: do not repeat it
    if any(s["status"] in ("unsupported", "error") for s in out["seeds"]):
        return out
    s0 = seeds[0] + ANTICHEAT_SEED_OFFSET
    prior = any(s["status"] == "fail" for s in out["seeds"])
    checks = [
        ("caching", lambda: _caching(judge, case, (s0, s0 + 1), prior)),
        ("recheck_after_timing", lambda: _recheck(judge, case, s0 + 2, s0 + 3, backward, recheck_calls, prior)),
        ("side_stream", lambda: _side_stream(judge, case, s0 + 4, backward)),
    ]
    for name, check in checks:
        try:
            res = check()
        except _CandidateRaised as e:  # the candidate raised inside a check: that check fails
            out["anticheat"].append({"name": name, "status": "fail", "detail": f"the candidate raised {e.answer.reason}",
                                     "traceback": e.answer.traceback, "seed_base": s0})
            continue
        if isinstance(res, tuple):
            prop, result = res
            entry = prop.to_dict()
            if result is not None and result.status != "pass":
                entry["result"] = result.to_dict()
        else:
            entry = res.to_dict()
        entry["seed_base"] = s0
        out["anticheat"].append(entry)
    return out


class _CandidateRaised(Exception):
    def __init__(self, answer: Answer):
        super().__init__(answer.reason)
        self.answer = answer


def _ask_status(judge: Judge, op: str, **fields) -> dict:
    """A request whose answer is only a status: raises _CandidateRaised when the candidate raised."""
    res = judge.session.ask(op, **fields)
    if res.get("status") not in ("ok", "unsupported"):
        raise _CandidateRaised(Answer("error", str(res.get("reason", "")), str(res.get("traceback", ""))))
    return res


def _caching(judge: Judge, case, seeds: tuple[int, int], prior_failed: bool) -> V.PropertyResult:
    bases = [baseline(case, s, judge.device) for s in seeds]
    answers = [judge.call(b, want_grad=False, with_inputs=False) for b in bases]
    for b in bases:
        judge.forget(b)
    for a in answers:
        if a.status == "unsupported":
            return V.PropertyResult("caching", "skipped", f"unsupported: {a.reason}")
        if a.status != "ok":
            raise _CandidateRaised(a)
    return anticheat.caching_verdict(case, bases, [a.run.tensors["out"] for a in answers], seeds,
                                     prior_failed=prior_failed)


def _recheck(judge: Judge, case, warm_seed: int, check_seed: int, backward: bool, calls: int,
             prior_failed: bool, after: str = ""):
    want_grad = V._wants_grad(judge.declared, case, backward)
    if calls > 0:
        warm = baseline(case, warm_seed, judge.device)
        try:
            res = _ask_status(judge, "burst", case=case_to_dict(case), inputs=judge.inputs_ref(warm), calls=calls,
                              want_grad=want_grad)
        finally:
            judge.forget(warm)
        if res["status"] == "unsupported":
            return V.PropertyResult("recheck_after_timing", "skipped", f"unsupported: {res.get('reason')}"), None
    check = baseline(case, check_seed, judge.device)
    result = judge.verify(check, want_grad=backward, determinism=False)
    judge.forget(check)
    return anticheat.recheck_verdict(result, calls=calls, after=after, check_seed=check_seed, prior_failed=prior_failed)


def _side_stream(judge: Judge, case, seed: int, backward: bool) -> V.PropertyResult:
    if judge.device.type != "cuda":
        return anticheat.side_stream_not_applicable()
    base = baseline(case, seed, judge.device)
    want_grad = V._wants_grad(judge.declared, case, backward)
    pairs = []
    try:
        for sleep in (0, anticheat.SIDE_STREAM_SLEEP_CYCLES):
            out_path = judge.session.file("side")
            res = _ask_status(judge, "side_stream", case=case_to_dict(case), inputs=judge.inputs_ref(base),
                              sleep_cycles=sleep, want_grad=want_grad, out_path=out_path)
            if res["status"] == "unsupported":
                return V.PropertyResult("side_stream", "skipped", f"unsupported: {res.get('reason')}")
            t = read_answer(out_path, res)
            early = {n[len("early."):]: x for n, x in t.items() if n.startswith("early.")}
            late = {n[len("late."):]: x for n, x in t.items() if n.startswith("late.")}
            pairs.append((sleep, early, late))
    finally:
        judge.forget(base)
    return anticheat.side_stream_verdict(pairs, with_grads=want_grad)

