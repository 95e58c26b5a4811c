"""The benchmark JSON: its name, version and outline (written by ``bench``, read by ``compare``).

Outline of version 1 (``results.json``)::

    schema: "attn-harness-bench", schema_version: 1, created (UTC ISO), command, seconds
    device:   type, name, capability, sm_count, memory_gib, l2_bytes, clocks {source, sm_mhz,
              mem_mhz, max_sm_mhz, max_mem_mhz, power_w, temperature_c}
    versions: python, torch, cuda, cudnn, triton, harness, git, source (harness.provenance), pytest-benchmark,
              flash-attn-4, fla-core
    settings: presets, backends, modes, seed, dtypes, cases, target_ms, warmup_ms, min_reps,
              max_reps, reps, flush_l2, cuda_graphs, settle {window_ms, min_ms, tol, max_ms},
              clock ("cuda-events" | "host"), baseline
    peaks:    device, clock, matmul_tflops {dtype: TFLOP/s}, copy_gbps, measured_at, method
    results:  one per (case, backend):
        case, family, dtype, params {case fields}, backend, baseline,
        status: ok | unsupported | not-timed | oom | error, reason,
        verify: {status, reason, case (the id verified), reduced, verify_status, max_budget, seconds},
        modes: {fwd | bwd | fwd+bwd: {
            status: ok | implausible | unsupported | oom | error, reason, flags [..],
            clock, times_ms [..] (every repetition), reps, median_ms, q1_ms, q3_ms, iqr_ms,
            spread (IQR / median), min_ms, mean_ms, warmup_calls, flush_l2, rotate, cuda_graph,
            enqueue_ms (host time to enqueue one repetition), flush_ms (device time of its flush), drain_ms,
            settle_ms [..] (median of each settling window before the timed loop: harness.perf.timing),
            unsteady (null, or why settling did not reach a steady device),
            launch_bound (null, or why the number is mostly launch latency: harness.perf.timing), flops, bytes (minimum traffic), tflops, gbps, speedup (baseline median / median)}},
        memory: {inputs_mib, fwd_peak_mib, out_mib, saved_mib, bwd_peak_mib, peak_mib} | {error} | null
"""

SCHEMA = "attn-harness-bench"
SCHEMA_VERSION = 1
#: Whole-row statuses of a (case, backend).
ROW_STATUSES = ("ok", "unsupported", "not-timed", "oom", "error")
#: Statuses of one mode's cell.
CELL_STATUSES = ("ok", "implausible", "unsupported", "oom", "error")


def check_schema(data: dict, where: str = "file") -> None:
    """Raise ValueError when ``data`` is not a benchmark JSON of a version this code reads."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not an attn-harness benchmark JSON (schema {data.get('schema') if isinstance(data, dict) else None!r})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema_version {data.get('schema_version')!r}; this harness reads {SCHEMA_VERSION}")
