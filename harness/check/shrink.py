"""Shrinking a failing case to the smallest one that fails the same way.

The failure's *signature* is its status and its first failed check (``("fail", "dv")``,
``("error", "run raised ...")`` becomes ``("error", None)``). :func:`shrink` tries, in passes until
nothing more applies, each feature switched off alone (GQA -> MHA, window, softcap, causal, the
passed scale, the layout, varlen -> one dense sequence, d_v -> d, the out-only and positional call
forms back to the plain call), then smaller sizes (batch, heads,
each sequence length by bisection, head dim), and last fp32 instead of a 16-bit dtype; a change is
kept when the check still fails with the same signature, about as badly (``KEEP_SEVERITY``), not
only because the reference became exact there (its bound is then the rounding floor alone), and not
as another recorded third-party defect (harness/check/known_issues.py). The log says what each feature did:
"needed" (switching it off made the case pass, or fail differently) or "dropped".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.cases import Case, DecodeCase, SoftmaxCase
from harness.check.results import CaseResult

#: The smallest sizes the shrinker goes down to (a 16-wide head dim is what most kernels take).
MIN_HEAD_DIM = 16
#: A smaller case must keep the failure this severe: its failed tensor's error at least this many
#: times its allowed bound (or half the original's excess, when the original fails by less). Without
#: it, a 300x-off gradient shrinks to a case 1.2x over the bound: technically failing, unconvincing
#: in a bug report, and maybe another (rounding) effect altogether.
KEEP_SEVERITY = 10.0


def severity(r: CaseResult, sig: tuple[str, str | None]) -> float | None:
    """How far past its bound the signature's tensor is (error / allowed), None for a property or crash."""
    t = r.tensor(sig[1]) if sig[1] else None
    return t.budget if t is not None else None


def exact_reference(r: CaseResult, sig: tuple[str, str | None]) -> bool:
    """Whether the signature's tensor was judged against an exact reference (error 0): its bound is
    then the rounding floor alone, and any kernel that rounds as the dtype allows fails it."""
    t = r.tensor(sig[1]) if sig[1] else None
    return t is not None and t.reference_error == 0


def signature(r: CaseResult) -> tuple[str, str | None]:
    """How a result fails: (status, first failed tensor or property) or (status, None)."""
    return r.status, (r.failures[0] if r.failures else None)


@dataclass
class Step:
    what: str  # "window off", "seqlen_q 64 -> 32", ...
    kept: bool  # the change kept the failure (and was kept)
    outcome: str  # "still fails (fail: out)", "passes", "fails differently (error: ...)"
    feature: bool = False  # a feature switched off (reported as needed / dropped)


@dataclass
class Shrunk:
    original: Case
    minimal: Case
    signature: tuple[str, str | None]
    result: CaseResult  # the minimal case's failing result
    steps: list[Step] = field(default_factory=list)
    checks: int = 0

    def features(self) -> list[tuple[str, str]]:
        """(feature, "dropped" | "needed (what switching it off did)") per feature of the original case."""
        seen: dict[str, str] = {}
        for s in self.steps:
            if not s.feature:
                continue
            if s.kept:
                seen[s.what] = "dropped (still fails without it)"
            else:
                seen.setdefault(s.what, f"needed: without it the case {s.outcome}")
        return list(seen.items())


def _rep(case: Case, **changes) -> Case | None:
    """``case`` with ``changes``, or None when that is not a valid case (a packed layout with Sq != Sk)."""
    try:
        return dataclasses.replace(case, **changes)
    except ValueError:
        return None


def _features(case: Case) -> list[tuple[str, Case | None]]:
    """(words, the case with that feature off) for each feature ``case`` has."""
    r = _rep
    out = []
    if isinstance(case, SoftmaxCase):
        if case.is_varlen:
            first = next(((a, b) for a, b in case.varlen if a and b), case.varlen[0])
            out.append(("varlen -> one dense sequence", r(case, varlen=None, batch=1, seqlen_q=max(first[0], 1),
                                                            seqlen_k=max(first[1], 1))))
        if case.heads_q != case.heads_k:
            out.append(("GQA -> MHA", r(case, heads_k=case.heads_q)))
        if case.has_window:
            out.append(("window off", r(case, window=(-1, -1))))
        if case.softcap:
            out.append(("softcap off", r(case, softcap=0.0)))
        if case.causal:
            out.append(("causal off", r(case, causal=False)))
        if case.d_v != case.d:
            out.append(("d_v -> d", r(case, d_v=case.d)))
        if not case.return_lse:
            out.append(("lse asked for (return_lse on)", r(case, return_lse=True)))
        if case.call != "keyword":
            out.append(("positional call -> keywords", r(case, call="keyword")))
    elif isinstance(case, DecodeCase):
        if case.heads_q != case.heads_k:
            out.append(("GQA -> MHA", r(case, heads_k=case.heads_q)))
        if case.paged:
            out.append(("paged -> contiguous cache", r(case, page_size=0)))
        if case.append:
            out.append(("no new tokens appended", r(case, append=False)))
        if case.ragged:
            out.append(("ragged -> equal lengths", r(case, ragged=False)))
        if case.has_window:
            out.append(("window off", r(case, window=(-1, -1))))
        if case.softcap:
            out.append(("softcap off", r(case, softcap=0.0)))
        if not case.causal:
            out.append(("causal on (the default)", r(case, causal=True)))
        if case.d_v != case.d:
            out.append(("d_v -> d", r(case, d_v=case.d)))
    else:
        if case.gate != "none":
            out.append(("decay off", r(case, gate="none")))
        if case.initial_state:
            out.append(("initial state off", r(case, initial_state=False)))
        if case.grad_final_state:
            out.append(("final-state gradient off", r(case, grad_final_state=False)))
        if case.d_v != case.d_k:
            out.append(("d_v -> d_k", r(case, d_v=case.d_k)))
    if case.scale is not None:
        out.append(("passed scale off (default)", r(case, scale=None)))
    if getattr(case, "layout", "contiguous") != "contiguous":
        out.append((f"{case.layout} layout -> contiguous", r(case, layout="contiguous")))
    return out


def _halves(n: int, low: int) -> list[int]:
    """Candidates below ``n``, smallest first: low, n/4, n/2, n - 1 (bisection toward ``low``)."""
    c = sorted({low, n // 4, n // 2, n - 1} - {n})
    return [x for x in c if low <= x < n]


def _batch_and_heads(case) -> list[tuple[str, Case | None]]:
    """Smaller batch, fewer kv heads (the group kept), a smaller group: softmax and decode cases."""
    r = _rep
    out = [(f"batch {case.batch} -> {b}", r(case, batch=b)) for b in _halves(case.batch, 1)]
    g = case.heads_q // case.heads_k
    for hk in _halves(case.heads_k, 1):
        out.append((f"heads {case.heads_q}/{case.heads_k} -> {hk * g}/{hk}", r(case, heads_q=hk * g, heads_k=hk)))
    for gg in _halves(g, 1):
        out.append((f"GQA group {g} -> {gg}", r(case, heads_q=case.heads_k * gg)))
    return out


def _sizes(case: Case) -> list[tuple[str, Case | None]]:
    r = _rep
    out = []
    if isinstance(case, SoftmaxCase):
        if case.is_varlen:
            return out
        out += _batch_and_heads(case)
        packed = case.layout == "qkvpacked"
        for s in _halves(case.seqlen_q, 1):
            c = r(case, seqlen_q=s, seqlen_k=s) if packed else r(case, seqlen_q=s)
            out.append((f"seqlen_q {case.seqlen_q} -> {s}", c))
        if not packed:
            for s in _halves(case.seqlen_k, 1):
                out.append((f"seqlen_k {case.seqlen_k} -> {s}", r(case, seqlen_k=s)))
        for d in _halves(case.d, MIN_HEAD_DIM):
            if d % 8 == 0:
                c = r(case, d=d, d_v=d if case.d_v == case.d else min(case.d_v, d))
                out.append((f"head dim {case.d} -> {d}", c))
    elif isinstance(case, DecodeCase):
        out += _batch_and_heads(case)
        for s in _halves(case.seqlen_q, 1):
            out.append((f"new tokens {case.seqlen_q} -> {s}", r(case, seqlen_q=s)))
        for n in _halves(case.cache_len, 0):
            out.append((f"cache length {case.cache_len} -> {n}", r(case, cache_len=n)))
        for d in _halves(case.d, MIN_HEAD_DIM):
            if d % 8 == 0:
                out.append((f"head dim {case.d} -> {d}", r(case, d=d, d_v=d if case.d_v == case.d else min(case.d_v, d))))
    else:
        for b in _halves(case.batch, 1):
            out.append((f"batch {case.batch} -> {b}", r(case, batch=b)))
        for h in _halves(case.heads, 1):
            out.append((f"heads {case.heads} -> {h}", r(case, heads=h)))
        for t in _halves(case.seqlen, 1):
            out.append((f"seqlen {case.seqlen} -> {t}", r(case, seqlen=t)))
        for d in _halves(case.d_k, MIN_HEAD_DIM):
            if d % 8 == 0:
                out.append((f"d_k {case.d_k} -> {d}", r(case, d_k=d, d_v=d if case.d_v == case.d_k else case.d_v)))
    return out


def shrink(case: Case, check: Callable[[Case], CaseResult], *, supported: Callable[[Case], bool] = lambda c: True,
           known: Callable[[Case, CaseResult], str | None] = lambda c, r: None,
           max_checks: int = 400, log: Callable[[str], None] | None = None) -> Shrunk:
    """Shrink ``case`` while ``check`` (case -> result) keeps failing with the same signature.

    ``supported``: cases the backend declares it cannot run are not tried. ``known``: the recorded
    defect that explains a (case, result), or None: a smaller case that fails as a *different*
    recorded defect is not kept (it would turn a new finding into an old one: a head dim shrunk
    onto a head dim with its own known bug). Raises ValueError when ``case`` does not fail."""
    first = check(case)
    sig = signature(first)
    if first.status not in ("fail", "error"):
        raise ValueError(f"{case.id} does not fail ({first.status}): nothing to shrink")
    state = Shrunk(case, case, sig, first, checks=1)
    recorded = known(case, first)
    first_severity = severity(first, sig)
    need = None if first_severity is None else max(1.0, min(first_severity / 2, KEEP_SEVERITY))

    def attempt(what: str, candidate: Case | None, feature: bool) -> bool:
        if candidate is None or candidate == state.minimal or state.checks >= max_checks:
            return False
        if not supported(candidate):
            state.steps.append(Step(what, False, "not supported by the backend", feature))
            return False
        res = check(candidate)
        state.checks += 1
        got = signature(res)
        if got != sig:
            outcome = "passes" if res.status == "pass" else f"fails differently ({got[0]}: {got[1] or res.reason[:80]})"
        elif need is not None and (now := severity(res, got)) is not None and now < need:
            outcome = (f"fails more mildly ({got[1]} {now:.3g}x its bound, the original {first_severity:.3g}x; "
                       f"kept at >= {need:.3g}x)")
        elif exact_reference(res, got) and not exact_reference(first, sig):
            # e.g. FLA's dg at one step: the bf16 reference is exact there, so the bound falls to fp32's
            # rounding; a failure against that is another finding than the original's ratio
            outcome = f"fails only against the rounding floor ({got[1]}: the reference is exact here)"
        elif (other := known(candidate, res)) is not None and other != recorded:
            outcome = f"fails as another recorded defect ({other[:80]})"
        else:
            state.minimal, state.result = candidate, res
            state.steps.append(Step(what, True, f"still fails ({got[0]}: {got[1]})", feature))
            if log:
                log(f"  kept: {what} -> {candidate.id}")
            return True
        state.steps.append(Step(what, False, outcome, feature))
        if log:
            log(f"  not kept: {what}: {outcome}")
        return False

    changed = True
    while changed and state.checks < max_checks:
        changed = False
        for what, cand in _features(state.minimal):
            changed |= attempt(what, cand, True)
        for what, cand in _sizes(state.minimal):
            if attempt(what, cand, False):
                changed = True
                break  # sizes are re-derived from the smaller case
    if state.minimal.dtype in ("fp16", "bf16"):
        attempt(f"dtype {state.minimal.dtype} -> fp32", state.minimal.with_dtype("fp32"), False)
    return state
