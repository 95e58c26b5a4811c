"""Roofline sanity: flags fire on implausible results (synthetic on CPU, a deliberately mis-timed
backward on the GPU) and never on plausible ones; flagged cells never print as plain numbers."""

import time

import pytest
import torch

from harness.cases import SoftmaxCase
from harness.perf import roofline
from harness.perf.bench import Bench
from harness.perf.flops import flops
from harness.perf.reports.markdown import case_tables
from harness.perf.timing import CLOCK_DEVICE, CLOCK_HOST

CASE = SoftmaxCase(4, 16, 16, 2048, 2048, 128, dtype="bf16")
H100ISH = roofline.Peaks(device="test", clock="cuda-events", matmul_tflops={"bf16": 800.0}, copy_gbps=3000.0)


def ms_at(tflops: float, mode: str = "fwd") -> float:
    return flops(CASE, mode) / (tflops * 1e12) * 1e3


def test_plausible_results_are_not_flagged():
    ms = {"fwd": ms_at(500), "bwd": ms_at(400, "bwd"), "fwd+bwd": ms_at(420, "fwd+bwd")}
    assert roofline.check(CASE, ms, H100ISH) == {}


def test_above_the_matmul_peak_is_flagged():
    flags = roofline.check(CASE, {"fwd": ms_at(1000)}, H100ISH)
    assert list(flags) == ["fwd"] and "matmul peak" in flags["fwd"][0]
    assert roofline.check(CASE, {"fwd": ms_at(860)}, H100ISH) == {}  # inside the 1.1x margin


def test_above_the_copy_bandwidth_is_flagged():
    lin = roofline.Peaks(device="t", clock="cuda-events", matmul_tflops={"bf16": 1e6}, copy_gbps=10.0)
    flags = roofline.check(CASE, {"fwd": 1.0}, lin)  # ~170 MB in 1 ms = 170 GB/s > 10
    assert "copy bandwidth" in flags["fwd"][0]


def test_backward_ten_times_faster_than_forward_is_flagged():
    fwd = ms_at(300)
    flags = roofline.check(CASE, {"fwd": fwd, "bwd": fwd / 10}, None)
    assert list(flags) == ["bwd"] and "faster than 0.5x its forward" in flags["bwd"][0]


def test_backward_rule_is_not_applied_to_the_host_clock():
    """On a CPU every call is synchronous (the mis-timing rule 3 catches cannot happen) and a small case is
    mostly per-operation host work: an honest eager backward measured at 0.48x its forward there."""
    fwd = ms_at(300)
    assert roofline.check(CASE, {"fwd": fwd, "bwd": fwd / 10}, None, clock=CLOCK_HOST) == {}
    assert list(roofline.check(CASE, {"fwd": fwd, "bwd": fwd / 10}, None, clock=CLOCK_DEVICE)) == ["bwd"]
    # rule 4 (fwd+bwd contains the forward) holds on every clock
    assert list(roofline.check(CASE, {"fwd": 2.0, "bwd": 4.0, "fwd+bwd": 1.0}, None, clock=CLOCK_HOST)) == ["fwd+bwd"]


def test_fwd_bwd_faster_than_its_forward_is_flagged():
    flags = roofline.check(CASE, {"fwd": 2.0, "bwd": 4.0, "fwd+bwd": 1.0}, None)
    assert list(flags) == ["fwd+bwd"]


def test_flagged_cell_is_never_printed_as_a_number():
    fwd = ms_at(300)
    cells = {m: {"status": "ok", "median_ms": v, "spread": 0.01, "tflops": flops(CASE, m) / (v * 1e-3) / 1e12}
             for m, v in (("fwd", fwd), ("bwd", fwd / 10), ("fwd+bwd", fwd * 3.2))}
    Bench("cpu", peaks=H100ISH).flag(CASE, cells)
    assert cells["bwd"]["status"] == "implausible"
    rec = {"case": CASE.id, "backend": "mistimed", "status": "ok", "reason": "", "modes": cells, "memory": None,
           "verify": {}, "family": "softmax", "params": {}}
    text = "\n".join(case_tables({"results": [rec], "settings": {}}))
    bwd_ms, bwd_tflops = cells["bwd"]["median_ms"], cells["bwd"]["tflops"]
    assert roofline.IMPLAUSIBLE in text
    row = next(line for line in text.splitlines() if line.startswith("| mistimed"))
    assert f"{bwd_ms:.4g}" not in row and f"{bwd_tflops:.1f}" not in row
    assert row.count(roofline.IMPLAUSIBLE) == 3  # bwd ms, bwd TFLOP/s, bwd speedup
    # the reason, in the notes under the table (a CPU bench: rule 1 fires, rule 3 is the device clock's)
    assert "above the measured dense bf16 matmul peak" in text and "faster than 0.5x" not in text


def test_peaks_are_measured_once_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_HARNESS_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(roofline, "measure_matmul_tflops", lambda d, dt: calls.append(dt) or 1.0)
    monkeypatch.setattr(roofline, "measure_copy_gbps", lambda d: calls.append("copy") or 2.0)
    p1 = roofline.device_peaks("cpu", ["fp32"])
    p2 = roofline.device_peaks("cpu", ["fp32"])
    assert calls == ["fp32", "copy"] and p2.matmul_tflops == {"fp32": 1.0} and p2.copy_gbps == 2.0
    roofline.device_peaks("cpu", ["fp32", "fp16"])  # a new dtype is added, the rest reused
    assert calls == ["fp32", "copy", "fp16"]
    assert list((tmp_path / "roofline").glob("*.json"))
    assert p1.device == roofline.device_key(torch.device("cpu"))


def test_measured_cpu_peaks_are_positive(tmp_path, monkeypatch):
    monkeypatch.setattr(roofline, "MATMUL_N", {"cpu": 128, "cuda": 8192})
    monkeypatch.setattr(roofline, "COPY_BYTES", {"cpu": 1 << 20, "cuda": 1 << 30})
    p = roofline.device_peaks("cpu", ["fp32"], cache=False)
    assert p.matmul_tflops["fp32"] > 0 and p.copy_gbps > 0 and p.clock == "host"


@pytest.mark.gpu
@pytest.mark.timing
def test_backward_timed_without_synchronisation_is_flagged():
    """The seeds' mistake: a host clock around an asynchronous backward measures the launch."""
    from harness.adapters import registry
    from harness.cases import make_inputs
    from harness.perf.timing import time_adapter

    adapter = registry.get("sdpa_flash")
    if adapter.supports(CASE, torch.device("cuda")):
        adapter = registry.get("eager")
    peaks = roofline.device_peaks("cuda", ["bf16"])
    fwd = time_adapter(adapter, CASE, "fwd", device="cuda").median_ms
    inputs = make_inputs(CASE, 0, "cuda")
    q, k, v = (x.clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    out = adapter.run(CASE, q=q, k=k, v=v).out
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), inputs.grad_out, retain_graph=True)
    torch.cuda.synchronize()
    wrong = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.autograd.grad(out, (q, k, v), inputs.grad_out, retain_graph=True)
        wrong.append((time.perf_counter() - t0) * 1e3)  # no synchronize: launch time only
    torch.cuda.synchronize()
    wrong_bwd = sorted(wrong)[len(wrong) // 2]
    flags = roofline.check(CASE, {"fwd": fwd, "bwd": wrong_bwd}, peaks)
    assert "bwd" in flags, f"mis-timed backward {wrong_bwd:.4f} ms vs forward {fwd:.4f} ms was not flagged"
    right = time_adapter(adapter, CASE, "bwd", device="cuda").median_ms
    assert roofline.check(CASE, {"fwd": fwd, "bwd": right}, peaks) == {}, "the properly timed backward was flagged"
