"""Spreading the GPU suite and the benchmarks over every GPU of one host.

* Tests: pytest-xdist with one worker per GPU. Each worker pins itself to one device by setting
  ``CUDA_VISIBLE_DEVICES`` in ``pytest_configure``, before anything touches CUDA
  (:func:`pin_xdist_worker`, called by the plugin when ``ATTN_HARNESS_PIN_GPUS`` is set).
* Benchmarks: pytest-benchmark switches itself off under xdist (timings of workers sharing a
  host are not trusted), so ``nox -s bench`` starts one pytest process per GPU instead, each on
  its shard of the cases (``--attn-shard i/N``) and its own device, and merges their JSON files
  (:func:`merge_benchmark_json`). No two benchmark processes ever share a GPU.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

PIN_ENV = "ATTN_HARNESS_PIN_GPUS"


def visible_gpus(count: int | None = None) -> list[str]:
    """The device ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else 0..count-1."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()]
    return [str(i) for i in range(count or 0)]


def pin_xdist_worker() -> str | None:
    """Pin this xdist worker (``gwN``) to GPU ``N mod count``; returns the device id chosen.

    ``ATTN_HARNESS_PIN_GPUS`` holds the number of GPUs (set by the nox sessions). Must run before
    CUDA is initialised in the worker; pytest_configure is early enough.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = os.environ.get(PIN_ENV)
    if not worker or not count:
        return None
    gpus = visible_gpus(int(count))
    if not gpus:
        return None
    index = int(worker.removeprefix("gw"))
    chosen = gpus[index % len(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen


def parse_shard(spec: str) -> tuple[int, int]:
    """'1/4' -> (1, 4); raises ValueError naming the option otherwise."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--attn-shard: expected I/N (e.g. 0/2), got {spec!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"--attn-shard: expected 0 <= I < N, got {spec!r}")
    return i, n


def in_shard(test_id: str, shard: tuple[int, int]) -> bool:
    """Stable assignment of a test to a shard (crc32 of its id): the same on every run/host."""
    i, n = shard
    return zlib.crc32(test_id.encode()) % n == i


def merge_benchmark_json(parts: list[Path], out: Path) -> Path:
    """Merge pytest-benchmark JSON files of shards into one (benchmarks concatenated, machine and
    commit info from the first, each part's device kept in the benchmark's extra_info)."""
    merged = None
    for part in parts:
        data = json.loads(Path(part).read_text())
        if merged is None:
            merged = data
            merged["benchmarks"] = list(data.get("benchmarks", []))
        else:
            merged["benchmarks"].extend(data.get("benchmarks", []))
    if merged is None:
        raise ValueError("merge_benchmark_json: no parts given")
    names = [b["fullname"] for b in merged["benchmarks"]]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"merge_benchmark_json: a benchmark ran in two shards: {sorted(dupes)[:3]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merged, indent=2))
    return out
