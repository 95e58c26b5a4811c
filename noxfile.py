"""nox sessions: how users and CI drive the harness.

    nox -s tests                       # the CPU suite (README's test command; what .ci/run runs)
    nox -s gpu-tests                   # GPU suite, matrixed over dtype x arch (only the present arch runs)
    nox -s "gpu-tests(dtype='bf16', arch='sm90')"
    nox -s bench                       # benchmarks, saved (--benchmark-autosave) under .benchmarks/
    nox -s bench-compare               # regression gate against the saved baseline
    nox -s golden [-- --regenerate]    # check (default) or rewrite the golden store
    nox -s accept -- --impl MOD:FN ... # the vendor acceptance check
    nox -s lint

Offline GPU boxes cannot install anything: run every session with ``nox --no-venv`` (or
``python3 -m nox --no-venv``); sessions then use the packages already installed instead of
installing the project's extras. Everything after ``--`` goes to pytest (or to the command).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from harness.arch import ARCHS, DTYPES, required_backends  # noqa: E402  (pure Python, no torch)
from harness.multigpu import PIN_ENV, visible_gpus  # noqa: E402  (pure Python)

nox.options.sessions = ["tests", "lint"]
nox.options.default_venv_backend = "venv"

# The CPU build of torch that CI installs; GPU sessions in a venv take the registry's default build.
CPU_TORCH = ("torch==2.13.0", "triton==3.6.0")
BENCH_STORAGE = ROOT / ".benchmarks"
# The regression gate: a benchmark whose median got slower than this fails bench-compare.
COMPARE_FAIL = "median:5%"
# Correctness tests per GPU at once in gpu-tests: most of their time is Triton / torch.compile /
# CuTe compiles on the CPU, so a few workers keep the GPU busy (timing tests run alone afterwards).
WORKERS_PER_GPU = 4


def _offline(session: nox.Session) -> bool:
    return session.venv_backend == "none"


def _python(session: nox.Session) -> str:
    return sys.executable if _offline(session) else "python"


def _install(session: nox.Session, extras: str, *, torch_spec=CPU_TORCH) -> None:
    if _offline(session):
        session.log("--no-venv: using the packages already installed (offline box); nothing is installed")
        return
    session.install(*torch_spec)
    session.install("-e", f".[{extras}]")


def _workers_per_gpu() -> int:
    """xdist workers per GPU for the correctness part of gpu-tests (ATTN_HARNESS_WORKERS_PER_GPU)."""
    raw = os.environ.get("ATTN_HARNESS_WORKERS_PER_GPU", str(WORKERS_PER_GPU))
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"ATTN_HARNESS_WORKERS_PER_GPU must be a positive integer, got {raw!r}")
    return int(raw)


def _gpu_probe(session: nox.Session) -> dict:
    """{'count': N, 'archs': ['sm90', ...], 'names': [...]} of the CUDA devices visible here."""
    out = session.run(_python(session), "-m", "harness.arch", silent=True, external=True)
    return json.loads(out.strip().splitlines()[-1])


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU suite: README's test command (what .ci/run runs)."""
    _install(session, "test,plot")
    session.run(_python(session), "-m", "pytest", "-q", *session.posargs, external=True)


@nox.session(name="gpu-tests", default=False)
@nox.parametrize("arch", ARCHS)
@nox.parametrize("dtype", DTYPES)
def gpu_tests(session: nox.Session, dtype: str, arch: str) -> None:
    """GPU suite for one dtype on one architecture; fails when no CUDA device is visible, skips
    (saying which arch is present) when the GPU here is another arch. Required backends of the
    arch (harness/arch.py) that are missing or unsupported fail the session."""
    _install(session, "test,plot", torch_spec=("torch", "triton"))
    gpus = _gpu_probe(session)
    if gpus["count"] == 0:
        session.error(
            "gpu-tests needs a CUDA device and none is visible (torch.cuda.is_available() is False): "
            "a GPU runner that lost its GPU must not pass"
        )
    if arch not in gpus["archs"]:
        session.skip(f"this session is for {arch}; the GPU here is {gpus['archs'][0]} ({gpus['names'][0]})")
    # Only this arch's devices take part (ids as the caller names them: CUDA_VISIBLE_DEVICES=1
    # must stay on physical GPU 1, not become the first GPU of the host).
    names = visible_gpus(gpus["count"])
    ids = [names[i] for i, a in enumerate(gpus["archs"]) if a == arch]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(ids),
        "ATTN_HARNESS_ARCH": arch,
        "ATTN_HARNESS_DTYPE": dtype,
        "ATTN_HARNESS_REQUIRE": ",".join(required_backends(arch, dtype)),
        # Correctness, not speed: the in-repo kernels take their first pruned config instead of
        # timing every config of every shape (the benchmarks tune).
        "FLASH_ATTN_AUTOTUNE": "0",
        "KERNELS_LINEAR_ATTN_AUTOTUNE": "0",
        "ATTN_HARNESS_FLA_AUTOTUNE": "0",  # FLA's tuners take their first config (harness/adapters/fla.py)
        # inductor (flex) compiles in-process: each xdist worker would otherwise start its own pool
        # of compile subprocesses (one per CPU) on a box the workers already keep busy
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    # Every test's outcome and seconds stream to reports/ as they finish (a run cut by a time
    # limit, or hung in xdist's teardown, still says what passed, what failed and what was slow).
    logs = ROOT / "reports" / f"gpu-tests-{arch}-{dtype}"
    logs.mkdir(parents=True, exist_ok=True)
    for old in logs.glob("*.jsonl"):
        old.unlink()
    base = ["-m", "pytest", "-q", "-rfE", "--tb=short", "--durations=15", "--attn-dtypes", dtype,
            "-p", "no:cacheprovider"]
    workers = len(ids) * _workers_per_gpu()
    env[PIN_ENV] = str(len(ids))
    session.log(
        f"{arch} x {dtype}: required backends {env['ATTN_HARNESS_REQUIRE']}; GPUs {env['CUDA_VISIBLE_DEVICES']}; "
        f"{workers} xdist workers ({workers // len(ids)} per GPU)"
    )
    # 1. correctness: every GPU test and the adapter matrix, spread over the GPUs (compiles and
    #    autotuning are CPU-bound, so several workers share a GPU).
    correctness = [*base, "-m", "(gpu or matrix) and not timing", "-n", str(workers), "--benchmark-disable",
                   f"--attn-result-log={logs / 'correctness.jsonl'}"]
    # pytest exit 5 (nothing collected) is fine only when the user narrowed the run (-k / a path).
    codes = [0, 5] if session.posargs else [0]
    session.run(_python(session), *correctness, *session.posargs, env=env, external=True, success_codes=codes)
    # 2. timing: the device-time checks alone, one process on one GPU (no neighbour to disturb them).
    timing = [*base, "-m", "gpu and timing", f"--attn-result-log={logs / 'timing.jsonl'}"]
    session.run(_python(session), *timing, *session.posargs, env={**env, "CUDA_VISIBLE_DEVICES": ids[0], PIN_ENV: ""},
                external=True, success_codes=codes)


def _bench_args(session: nox.Session) -> list[str]:
    return ["-m", "pytest", "tests/bench", "-q", "--benchmark-only", f"--benchmark-storage={BENCH_STORAGE}"]


def _storage_dir() -> Path:
    """pytest-benchmark's per-machine folder (its machine id: system-implementation-version-bits)."""
    impl = platform.python_implementation()
    ver = ".".join(platform.python_version_tuple()[:2])
    bits = platform.architecture()[0]
    return BENCH_STORAGE / f"{platform.system()}-{impl}-{ver}-{bits}"


def _run_sharded(session: nox.Session, count: int, extra: list[str]) -> list[Path]:
    """One pytest process per GPU, each pinned to its device and to its shard of the cases."""
    outdir = ROOT / "reports" / f"bench-shards-{time.strftime('%Y%m%d-%H%M%S')}"
    outdir.mkdir(parents=True, exist_ok=True)
    procs = []
    devices = visible_gpus(count)
    for i in range(count):
        part = outdir / f"part-{i}.json"
        cmd = [_python(session), *_bench_args(session), f"--attn-shard={i}/{count}", f"--benchmark-json={part}"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[i]}
        log = open(outdir / f"part-{i}.log", "w")
        procs.append((subprocess.Popen(cmd + extra, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), part, log))
    failed = []
    for i, (proc, _part, log) in enumerate(procs):
        rc = proc.wait()
        log.close()
        session.log(f"shard {i}/{count} on GPU {devices[i]}: exit {rc} (log: {outdir / f'part-{i}.log'})")
        if rc != 0:
            failed.append(i)
    if failed:
        session.error(f"benchmark shards {failed} failed; see their logs in {outdir}")
    return [p for _, p, _ in procs]


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks through pytest-benchmark, saved under .benchmarks/ (--benchmark-autosave).
    With several GPUs: one process per GPU on its shard of the cases, results merged."""
    _install(session, "test,plot", torch_spec=("torch", "triton"))
    gpus = _gpu_probe(session)
    if gpus["count"] <= 1:
        session.run(_python(session), *_bench_args(session), "--benchmark-autosave", *session.posargs, external=True)
        return
    parts = _run_sharded(session, gpus["count"], list(session.posargs))
    storage = _storage_dir()
    storage.mkdir(parents=True, exist_ok=True)
    counter = 1 + max((int(p.name[:4]) for p in storage.glob("[0-9][0-9][0-9][0-9]_*.json")), default=0)
    from harness.multigpu import merge_benchmark_json

    out = merge_benchmark_json(parts, storage / f"{counter:04d}_merged-{gpus['count']}gpus.json")
    session.log(f"merged {len(parts)} shards into {out}")


@nox.session(name="bench-compare", default=False)
def bench_compare(session: nox.Session) -> None:
    """The CI regression gate: benchmarks compared with the newest saved run; a median slower by
    more than COMPARE_FAIL fails (override: -- --benchmark-compare=NNNN --benchmark-compare-fail=...)."""
    _install(session, "test,plot", torch_spec=("torch", "triton"))
    args = [*_bench_args(session), "--benchmark-compare", f"--benchmark-compare-fail={COMPARE_FAIL}"]
    gpus = _gpu_probe(session)
    if gpus["count"] <= 1:
        session.run(_python(session), *args, *session.posargs, external=True)
        return
    newest = max(_storage_dir().glob("[0-9][0-9][0-9][0-9]_*.json"), default=None)
    if newest is None:
        session.error(f"no saved baseline under {_storage_dir()}: run `nox -s bench` first")
    _run_sharded(
        session, gpus["count"], [f"--benchmark-compare={newest.name[:4]}", f"--benchmark-compare-fail={COMPARE_FAIL}"]
        + list(session.posargs)
    )


@nox.session(default=False)
def golden(session: nox.Session) -> None:
    """Check the golden store (default) or rewrite it: nox -s golden -- --regenerate."""
    _install(session, "test")
    session.run(_python(session), "-m", "harness", "golden", *(session.posargs or ["--check"]), external=True)


@nox.session(default=False)
def accept(session: nox.Session) -> None:
    """The vendor acceptance check: nox -s accept -- --impl MODULE:CALLABLE [--profile ...]."""
    _install(session, "test,plot")
    if not session.posargs:
        session.error("usage: nox -s accept -- --impl MODULE:CALLABLE [--profile NAME] [--device cpu|cuda] ...")
    session.run(_python(session), "-m", "harness", "accept", *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the project."""
    if not _offline(session):
        session.install("ruff")
    session.run("ruff", "check", "harness", "kernels", "tests", "benchmarks", "noxfile.py", *session.posargs, external=True)
