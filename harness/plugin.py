"""pytest plugin: attention backends x cases as tests, judged by the tolerance engine.

Registered through the ``pytest11`` entry point (``attn_harness = "harness.plugin"``); a source
checkout that is not pip-installed loads it from ``tests/conftest.py``.

Options (one group, ``attn-harness``):
    --attn-backends NAMES   comma-separated registered adapters (default: all)
    --attn-dtypes DTYPES    comma-separated, e.g. fp16,bf16 (default: fp32,fp16 on CPU;
                            fp16,bf16,fp32 with CUDA)
    --attn-preset NAMES     comma-separated presets (default: small,small-linear; none with --attn-case)
    --attn-case IDS         comma-separated case ids as the harness prints them (your own shapes, e.g.
                            B6-H16-S2048x2048-D64-causal-bf16), beside the presets' cases; their dtype is the
                            id's unless --attn-dtypes is given
    --attn-seed SEEDS       comma-separated input seeds (default: 0); printed in the header
    --attn-impl SPEC        a vendor callable joins the run: ``module:function``, or
                            ``linear=module:function`` / ``decode=module:function`` for a
                            linear-attention / KV-cache decode callable (repeatable)
    --attn-result-log PATH  every test's outcome, duration and failure text, one JSON line each,
                            written as it finishes (with xdist, by the controller): what ran
                            survives a run killed by a time limit or hung at teardown

Fixtures: ``attn_case`` (parametrised from the presets; the case id is the test id),
``attn_backend`` (parametrised adapter name), ``attn_seed``, ``attn_device``, ``attn_inputs``,
``attn_oracle`` (computed once per (case, seed, device) and cached for the session; from the
golden store when there), ``attn_adapter``, and ``attn_check(adapter, case)``, which verifies and
fails with a readable message (tensor, error, ratio, worst element) or skips with the adapter's
reason. A test that requests both ``attn_backend`` and ``attn_case`` gets the matching-family
pairs, case-major (so consecutive tests share the cached oracle).

Markers: ``gpu`` (skipped with the reason on a machine without CUDA) and ``slow``.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from dataclasses import dataclass, field

import pytest

GPU_SKIP_REASON = "needs a CUDA device; none is visible (torch.cuda.is_available() is False)"
MARKERS = {
    "gpu": "needs a CUDA device (skipped with the reason on a machine without one)",
    "slow": "long-running; deselect with -m 'not slow'",
}
DEFAULT_PRESETS = ("small", "small-linear")
DEFAULT_DTYPES_CPU = ("fp32", "fp16")
DEFAULT_DTYPES_CUDA = ("fp16", "bf16", "fp32")
#: Session cache bound: oracle + inputs bytes kept (least recently used dropped first).
BASELINE_CACHE_BYTES = 4 << 30


# --------------------------------------------------------------------------------------------
# Options and settings
# --------------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-harness", "attention kernels: backends x cases against the FP64 oracle")
    group.addoption(
        "--attn-backends",
        default=None,
        metavar="NAMES",
        help="comma-separated registered backends to test (default: every registered one)",
    )
    group.addoption(
        "--attn-dtypes",
        default=None,
        metavar="DTYPES",
        help="comma-separated dtypes among fp16,bf16,fp32,fp64 "
        "(default: fp32,fp16 on CPU; fp16,bf16,fp32 with CUDA)",
    )
    group.addoption(
        "--attn-preset",
        default=None,
        metavar="NAMES",
        help="comma-separated case presets (default: small,small-linear; none with --attn-case)",
    )
    group.addoption(
        "--attn-case",
        default=None,
        metavar="IDS",
        help="comma-separated case ids as the harness prints them (e.g. B6-H16-S2048x2048-D64-causal-bf16): "
        "your own shapes beside the presets' cases, in the id's dtype unless --attn-dtypes is given",
    )
    group.addoption(
        "--attn-seed",
        default=None,
        metavar="SEEDS",
        help="comma-separated input seeds (default: 0); printed in the report header for replay",
    )
    group.addoption(
        "--attn-impl",
        action="append",
        default=[],
        metavar="SPEC",
        help="a vendor callable joins the run: module:function (softmax), "
        "linear=module:function or decode=module:function; repeatable",
    )
    group.addoption(
        "--attn-result-log",
        default=None,
        metavar="PATH",
        help="append one JSON line per finished test (id, outcome, seconds, failure text) as it "
        "finishes, so a run that is killed or hangs still leaves its results",
    )
    group.addoption(
        "--attn-shard",
        default=None,
        metavar="I/N",
        help="run only shard I of N of the collected tests (stable by test id); nox -s bench "
        "starts one process per GPU, each on its own shard",
    )


@dataclass
class Settings:
    backends: list[str] | None  # None: every registered adapter
    dtypes: list[str]
    presets: list[str]
    seeds: list[int]
    impls: list[str] = field(default_factory=list)  # adapter names added by --attn-impl
    given: list = field(default_factory=list)  # cases named by --attn-case (dtypes applied)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _parse_settings(config: pytest.Config) -> Settings:
    """Validate the options; a bad one raises pytest.UsageError naming it."""
    import torch

    from harness.cases import DTYPES
    from harness.presets import PRESETS

    dtypes = _split(config.getoption("attn_dtypes"))
    if not dtypes:
        dtypes = list(DEFAULT_DTYPES_CUDA if torch.cuda.is_available() else DEFAULT_DTYPES_CPU)
    for dt in dtypes:
        if dt not in DTYPES:
            raise pytest.UsageError(
                f"--attn-dtypes: unknown dtype {dt!r}; expected some of {', '.join(DTYPES)}"
            )
    from harness.cases import case_from_id
    from harness.presets import in_dtypes

    given = []
    for case_id in _split(config.getoption("attn_case")):
        try:
            case = case_from_id(case_id)
        except ValueError as e:
            raise pytest.UsageError(f"--attn-case: {e}") from None
        given += in_dtypes([case], dtypes if config.getoption("attn_dtypes") else None)
    presets = _split(config.getoption("attn_preset")) or ([] if given else list(DEFAULT_PRESETS))
    if given and not presets and not config.getoption("attn_dtypes"):  # (the header's dtypes: the ids')
        dtypes = list(dict.fromkeys(c.dtype for c in given))
    for p in presets:
        if p not in PRESETS:
            raise pytest.UsageError(f"--attn-preset: unknown preset {p!r}; known: {', '.join(PRESETS)}")
    seeds = []
    for s in _split(config.getoption("attn_seed")) or ["0"]:
        try:
            seeds.append(int(s))
            if seeds[-1] < 0:
                raise ValueError
        except ValueError:
            raise pytest.UsageError(f"--attn-seed: expected non-negative integers, got {s!r}") from None
    settings = Settings(
        backends=_split(config.getoption("attn_backends")) or None,
        dtypes=dtypes,
        presets=presets,
        seeds=seeds,
        given=given,
    )
    from harness.adapters import registry

    for spec in config.getoption("attn_impl") or []:
        family, _, target = spec.rpartition("=")
        family = family or "softmax"
        if family not in ("softmax", "linear", "decode") or ":" not in target:
            raise pytest.UsageError(
                f"--attn-impl: expected module:function, linear=module:function or decode=module:function, got {spec!r}"
            )
        try:
            adapter = registry.from_spec(target, family=family)
        except Exception as e:
            raise pytest.UsageError(f"--attn-impl: cannot load {target!r}: {type(e).__name__}: {e}") from None
        settings.impls.append(adapter.name)
    if settings.backends is not None:
        known = set(registry.names())
        for name in settings.backends:
            if name not in known:
                raise pytest.UsageError(
                    f"--attn-backends: unknown backend {name!r}; known: {', '.join(sorted(known))}"
                )
        settings.backends += [n for n in settings.impls if n not in settings.backends]
    return settings


class _State:
    """Per-session plugin state, kept in ``config.stash``."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self._settings: Settings | None = None
        self.baselines: OrderedDict[tuple, object] = OrderedDict()
        self.bytes = 0

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = _parse_settings(self.config)
        return self._settings

    def baseline(self, case, seed: int, device):
        """The cached :class:`harness.check.verify.Baseline` of (case, seed, device)."""
        from harness.check.verify import prepare

        key = (case.id, seed, str(device))
        if key in self.baselines:
            self.baselines.move_to_end(key)
            return self.baselines[key][0]
        b = prepare(case, seed=seed, device=device)
        size = sum(
            t.numel() * t.element_size() for t in (*b.inputs.tensors().values(), *b.oracle.tensors().values())
        )
        self.baselines[key] = (b, size)
        self.bytes += size
        while self.bytes > BASELINE_CACHE_BYTES and len(self.baselines) > 1:
            _, (_, old) = self.baselines.popitem(last=False)
            self.bytes -= old
        return b


_STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[_STATE]


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker of a multi-GPU run pins itself to one GPU before anything touches CUDA.
    from harness.multigpu import pin_xdist_worker

    pin_xdist_worker()
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_STATE] = _State(config)
    log = config.getoption("attn_result_log")
    if log and not hasattr(config, "workerinput"):  # xdist workers send their reports to the controller
        from harness.result_log import ResultLog

        config.pluginmanager.register(ResultLog(log), "attn-result-log")
    given = [config.getoption(o) for o in ("attn_backends", "attn_dtypes", "attn_preset", "attn_case", "attn_seed")]
    if any(v is not None for v in given) or config.getoption("attn_impl"):
        _ = _state(config).settings  # validate now: a bad option is a usage error before collection


def pytest_report_header(config: pytest.Config) -> list[str]:
    import torch

    import harness

    try:
        import triton

        tri = f"triton {triton.__version__}"
    except ImportError:
        tri = "no triton"
    interp = " (TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1" else ""
    if torch.cuda.is_available():
        dev = f"cuda ({torch.cuda.get_device_name(0)})"
    else:
        dev = "cpu (no CUDA visible)"
    s = _state(config).settings
    seeds = ",".join(map(str, s.seeds))
    return [
        f"attn-harness {harness.__version__}: torch {torch.__version__}, {tri}{interp}, "
        f"python {sys.version.split()[0]}, device {dev}",
        f"attn-harness: seeds {seeds} (replay: --attn-seed {seeds}), presets {','.join(s.presets) or 'none'}, "
        + (f"cases {','.join(c.id for c in s.given)}, " if s.given else "") +
        f"dtypes {','.join(s.dtypes)}, backends {','.join(s.backends) if s.backends else 'all'}",
    ]


# --------------------------------------------------------------------------------------------
# Collection
# --------------------------------------------------------------------------------------------


def _cases(settings: Settings):
    from harness.presets import preset

    seen, cases = set(), []
    for case in [c for name in settings.presets for c in preset(name, settings.dtypes)] + settings.given:
        if case.id not in seen:
            seen.add(case.id)
            cases.append(case)
    return cases


def _backends(settings: Settings) -> list[str]:
    from harness.adapters import registry

    if settings.backends is not None:
        return list(settings.backends)
    return registry.names()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.fixturenames
    want_case, want_backend = "attn_case" in names, "attn_backend" in names
    if not (want_case or want_backend):
        return
    settings = _state(metafunc.config).settings
    if want_case and want_backend:
        from harness.adapters import registry

        family = {n: registry.get(n).family for n in _backends(settings)}
        pairs = [(b, c) for c in _cases(settings) for b in family if family[b] == c.family]
        metafunc.parametrize(
            ("attn_backend", "attn_case"), pairs, indirect=True, ids=[f"{b}-{c.id}" for b, c in pairs]
        )
    elif want_case:
        cases = _cases(settings)
        metafunc.parametrize("attn_case", cases, indirect=True, ids=[c.id for c in cases])
    else:
        backends = _backends(settings)
        metafunc.parametrize("attn_backend", backends, indirect=True, ids=backends)
    if want_case and len(settings.seeds) > 1:
        metafunc.parametrize(
            "attn_seed", settings.seeds, indirect=True, ids=[f"seed{s}" for s in settings.seeds]
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("attn_shard")
    if shard:
        from harness.multigpu import in_shard, parse_shard

        try:
            where = parse_shard(shard)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        keep = [it for it in items if in_shard(it.nodeid, where)]
        config.hook.pytest_deselected(items=[it for it in items if not in_shard(it.nodeid, where)])
        items[:] = keep
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


def _param(request, fixture: str):
    if not hasattr(request, "param"):
        raise pytest.UsageError(
            f"{fixture} is parametrised by the attn-harness plugin; request it from a test function"
        )
    return request.param


@pytest.fixture(scope="session")
def attn_device():
    """torch.device: CUDA when visible, else CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def attn_case(request):
    """The case (SoftmaxCase / LinearCase / DecodeCase) of this test; its id is the test id."""
    return _param(request, "attn_case")


@pytest.fixture
def attn_backend(request) -> str:
    """The name of the adapter under test."""
    return _param(request, "attn_backend")


@pytest.fixture
def attn_seed(request) -> int:
    """The input seed (first of --attn-seed unless parametrised over several)."""
    return request.param if hasattr(request, "param") else _state(request.config).settings.seeds[0]


@pytest.fixture
def attn_baseline(request, attn_case, attn_seed, attn_device):
    """Inputs, oracle and reference errors of (case, seed, device), cached for the session."""
    return _state(request.config).baseline(attn_case, attn_seed, attn_device)


@pytest.fixture
def attn_inputs(attn_baseline):
    """Seeded inputs (SoftmaxInputs / LinearInputs) on ``attn_device``."""
    return attn_baseline.inputs


@pytest.fixture
def attn_oracle(attn_baseline):
    """The FP64 oracle result (``.tensors()``: out, lse, dq, ... / out, final_state, ...)."""
    return attn_baseline.oracle


@pytest.fixture
def attn_adapter(attn_backend):
    """The registered adapter named by ``attn_backend``."""
    from harness.adapters import registry

    return registry.get(attn_backend)


class Checker:
    """``attn_check(adapter, case, seed=None, **verify_kwargs) -> CaseResult``.

    Skips (with the adapter's reason) when the adapter does not support the case here; fails
    with :meth:`CaseResult.message` when any tensor or property fails or the run raises.
    """

    def __init__(self, state: _State, device):
        self._state = state
        self._device = device
        self.last = None  # the last CaseResult, for tests that inspect it after a failure

    def run(self, adapter, case, *, seed: int | None = None, **kwargs):
        """Verify without asserting; returns the CaseResult."""
        from harness.check.verify import verify

        seed = self._state.settings.seeds[0] if seed is None else seed
        baseline = self._state.baseline(case, seed, self._device)
        self.last = verify(adapter, case, baseline=baseline, **kwargs)
        return self.last

    def __call__(self, adapter, case, *, seed: int | None = None, **kwargs):
        result = self.run(adapter, case, seed=seed, **kwargs)
        if result.status == "unsupported":
            pytest.skip(f"{result.backend}: {result.reason}")
        if result.status != "pass":
            pytest.fail(result.message(), pytrace=False)
        return result


@pytest.fixture
def attn_check(request, attn_device) -> Checker:
    """Run an adapter on a case and assert with the tolerance engine (see :class:`Checker`)."""
    return Checker(_state(request.config), attn_device)
