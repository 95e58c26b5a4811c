"""The flash-attn-4 shim (``harness.accept.shims``) on the CPU, with a stand-in for flash-attn-4.

The real package runs only on sm90+; these tests put a recording fake in its place so that the
shim's own code (window mapping, lse request and normalisation, deterministic flag, asserts ->
NotImplementedError) runs in the CPU suite. A broken import in the shim once surfaced only on the
H100, as 14 errored acceptance cases.
"""

import json
import math

import pytest
import torch

from harness.accept import shims
from harness.adapters import flash_attn as fa_adapters
from harness.adapters.eager import eager_attention


class FakeFA4:
    """flash_attn.cute.interface.flash_attn_func's signature; eager maths; records its kwargs."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
                 deterministic=False, return_lse=False):
        self.calls.append(dict(softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                               deterministic=deterministic, return_lse=return_lse))
        if window_size != (None, None) and window_size[0] is not None:
            raise AssertionError("local attention is not supported in this build")
        out, lse = eager_attention(q, k, v, causal=causal, softmax_scale=softmax_scale)
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)  # FA's +inf on empty rows
        return (out, lse) if return_lse else out


@pytest.fixture
def fake(monkeypatch):
    f = FakeFA4()
    monkeypatch.setattr(fa_adapters, "_probe_fa4", lambda: (f, None, None))
    return f


def _qkv(sq=5, sk=3):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, sq, 2, 8, generator=g), torch.randn(1, sk, 2, 8, generator=g),
            torch.randn(1, sk, 2, 8, generator=g))


def test_shim_maps_the_contract_onto_flash_attn_4(fake):
    q, k, v = _qkv()
    out, lse = shims.flash_attn_cute(q, k, v, causal=True, softmax_scale=0.3)
    call = fake.calls[-1]
    assert call == dict(softmax_scale=0.3, causal=True, window_size=(None, None), deterministic=True, return_lse=True)
    # bottom-right causal with Sq > Sk: the first two query rows see no key: flash-attn-4's +inf, as it
    # wrote it, declared for the judge to map after the call (lse_empty_rows)
    assert torch.isposinf(lse[..., :2]).all() and torch.isfinite(lse[..., 2:]).all()
    assert shims.flash_attn_cute.attn_capabilities["lse_empty_rows"] == math.inf
    assert out.shape == q.shape
    shims.flash_attn_cute_fast(q, k, v)
    assert fake.calls[-1]["deterministic"] is False


def test_shim_turns_flash_attn_4_asserts_into_unsupported(fake):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="flash-attn-4.*local attention"):
        shims.flash_attn_cute(q, k, v, window_size=(2, 0))


def test_shim_without_flash_attn_4_says_so(monkeypatch):
    monkeypatch.setattr(fa_adapters, "_probe_fa4", lambda: (None, None, "flash_attn.cute (flash-attn-4) not installed"))
    with pytest.raises(NotImplementedError, match="not installed"):
        shims.flash_attn_cute(*_qkv())


def test_the_judge_rebuilds_a_declared_lse_on_empty_rows():
    """The parent's judge sees the candidate only through its declarations, sent as JSON
    (harness.accept.exchange: allow_nan): flash-attn's +inf survives the trip (json's Infinity) and the
    rebuilt adapter carries it as the in-process one does."""
    from harness.accept.judge import declared_adapter

    caps = json.loads(json.dumps({"lse_empty_rows": math.inf, "dtypes": ["bf16"]}, allow_nan=True))
    assert declared_adapter("fa4", "softmax", caps).lse_empty_rows == math.inf
    assert declared_adapter("plain", "softmax", {}).lse_empty_rows is None
