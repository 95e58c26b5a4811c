"""The issue-17 probes of benchmarks/ on the CPU (they are GPU tools; here they must run and say what
they measured): repeat_probe's four settings, sdpa_capture_probe's capture and value swap, and
fp8_configs' config parsing."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fp8_configs  # noqa: E402
import repeat_probe  # noqa: E402
import sdpa_capture_probe  # noqa: E402

sys.path.pop(0)

CASE = "B2-H4/1-Q1-L70-P16-new-D32-scale0.0625-fp16"


def test_repeat_probe_takes_the_check_apart(capsys):
    assert repeat_probe.main(["--backend", "decode_sdpa", "--case", CASE, "--calls", "3", "--sdpa", "default",
                              "--device", "cpu"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "calls differ" in x]
    settings = ("harness", "fresh copies", "same inputs", "same inputs, poisoned")
    assert len(lines) == 4 and all(s in x for s, x in zip(settings, lines))
    assert all("0/2 calls differ" in x for x in lines)  # the CPU's SDPA repeats


def test_capture_probe_records_the_adapters_sdpa_call():
    from harness.adapters import registry
    from harness.cases import case_from_id
    from harness.check import verify as V

    case = case_from_id(CASE)
    got = sdpa_capture_probe.capture(registry.get("decode_sdpa"), case, V.prepare(case, seed=1, device="cpu").inputs)
    assert got["query"].shape == (2, 4, 1, 32) and got["key"].shape == (2, 4, 71, 32) and got["scale"] == 0.0625
    assert torch.nn.functional.scaled_dot_product_attention(**got).shape == (2, 4, 1, 32)  # replayable as captured
    fresh = sdpa_capture_probe.like(got["key"], torch.Generator().manual_seed(0))
    assert fresh.stride() == got["key"].stride() and not torch.equal(fresh, got["key"])


def test_fp8_configs_reads_its_try_list():
    assert fp8_configs._config("64,128,4,3,T") == (64, 128, 4, 3, True)
    assert fp8_configs._config("128,64,8,2,P") == (128, 64, 8, 2, False)
    with pytest.raises(ValueError, match="BM,BN,WARPS,STAGES"):
        fp8_configs._config("256,64")
    from kernels.flash_attn import configs

    assert fp8_configs._as_tuple(configs._cfg(64, 128, 4, 3, True)) == (64, 128, 4, 3, True)
