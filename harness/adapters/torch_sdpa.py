"""torch's scaled_dot_product_attention, one adapter per forced backend plus the default dispatch.

* ``sdpa_math``, ``sdpa_flash``, ``sdpa_efficient``, ``sdpa_cudnn``: the backend is forced with
  ``torch.nn.attention.sdpa_kernel``; when torch refuses the case it warns its reasons and raises
  "No available kernel". Those warnings become ``Unsupported("unsupported: <torch's reasons>")``:
  a forced backend never falls back to another one.
* ``sdpa``: torch's own choice (no context manager), i.e. what a user gets by default.

Conventions. SDPA's ``is_causal`` is *top-left* aligned, flash-attn's causal is bottom-right; the
two agree only when Sq == Sk. So ``is_causal=True`` is passed only for a square causal case with
no window; every other mask (causal with Sq != Sk, local windows) is a boolean (Sq, Sk) mask built
with flash-attn's bottom-right convention. ``torch.nn.attention.bias.causal_lower_right`` is *not*
used: its dispatcher calls the flash / efficient kernels directly when they can run, whatever
backend ``sdpa_kernel`` forced, which would be a silent backend switch. Backends that refuse an
explicit mask (CUDA flash) report that as unsupported with torch's reason.

GQA uses ``enable_gqa=True`` (torch >= 2.5). On an older torch without it, or when torch refuses
``enable_gqa`` for the forced backend (its reasons name the head counts), the kv heads are repeated
(``repeat_interleave``) and the *same* backend runs again: Hq / Hk times the kv memory traffic,
but never another backend. ``EXPAND_KV_WHEN_GQA_REFUSED = False`` reports those as unsupported.
SDPA has no softcap, no packed variable-length entry point, and returns no lse.
"""

from __future__ import annotations

import functools
import re
import warnings

import torch

from harness.adapters.base import SoftmaxAdapter, SoftmaxOutput, Unsupported, scale_kwargs
from harness.adapters.eager import visibility_mask
from harness.adapters.registry import register
from harness.cases import SoftmaxCase

# A forced backend whose torch refuses ``enable_gqa`` (its reasons mention the head counts) gets
# the kv heads repeated instead, on the same backend. False: report such cases as unsupported.
EXPAND_KV_WHEN_GQA_REFUSED = True
_GQA_WORDS = re.compile(r"num_heads|number of heads|grouped query|enable_gqa|\bGQA\b", re.IGNORECASE)

# Suffix torch's C++ warnings carry; it says where in torch's source, not why.
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")


@functools.cache
def _has_enable_gqa() -> bool:
    """True when this torch's SDPA takes ``enable_gqa`` (torch >= 2.5)."""
    x = torch.zeros(1, 2, 1, 8)
    try:
        torch.nn.functional.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
    except TypeError:
        return False
    return True


class _Refused(Exception):
    """torch refused the forced backend; ``reasons`` are its own words."""

    def __init__(self, reasons: str):
        super().__init__(reasons)
        self.reasons = reasons


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, name)


def _torch_reasons(caught: list[warnings.WarningMessage], err: Exception) -> str:
    """torch's reasons for refusing a kernel, one sentence each, from its warnings and error.

    torch explains every backend it skipped; the ones skipped only because the harness forced
    another ("X kernel not used because:" + "X has been runtime disabled.") are dropped, so the
    reason names what the forced backend itself lacks."""
    msgs = []
    for w in caught:
        msg = _TRIGGERED.sub("", str(w.message)).strip()
        if msg and msg not in msgs:
            msgs.append(msg)
    reasons, header = [], None
    for msg in msgs:
        if msg.endswith("not used because:"):
            header = msg
            continue
        if "has been runtime disabled" in msg:
            header = None
            continue
        reasons.append(f"{header} {msg}" if header else msg)
        header = None
    text = " ".join(r if r.endswith((".", ":")) else r + "." for r in reasons)
    return text or str(err).strip()


# Boolean masks are built once per (Sq, Sk, mask, device), not inside every timed call; at 16k x 16k
# one is 256 MiB, so only a few are kept.
MASK_CACHE = 4


@functools.lru_cache(maxsize=MASK_CACHE)
def _cached_mask(sq: int, sk: int, causal: bool, window: tuple[int, int], device: str):
    return visibility_mask(sq, sk, causal, window, torch.device(device))


def _cuda_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


class _SDPAAdapter(SoftmaxAdapter):
    """Shared run/supports; subclasses set ``backend`` (an SDPBackend name, or None = default)."""

    backend: str | None = None
    #: Devices this backend exists on.
    device_types: tuple[str, ...] = ("cpu", "cuda")

    def supports(self, case, device):
        reason = super().supports(case, device)
        if reason:
            return reason
        device = torch.device(device)
        if device.type not in self.device_types:
            return f"needs CUDA (torch's {self._backend_words()} backend has no {device.type} kernel)"
        if case.softcap:
            return "softcap is not supported by torch SDPA"
        if case.is_varlen:
            return "variable-length (packed) batches are not supported by torch SDPA"
        if device.type == "cuda" and not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        return self._backend_supports(case, device)

    def _backend_words(self) -> str:
        return {
            None: "default",
            "MATH": "math",
            "FLASH_ATTENTION": "flash",
            "EFFICIENT_ATTENTION": "memory-efficient",
            "CUDNN_ATTENTION": "cuDNN",
        }[self.backend]

    def _backend_supports(self, case: SoftmaxCase, device: torch.device) -> str | None:
        """Cheap, documented limits; anything subtler is left to torch and reported from run."""
        return None

    def run(self, case: SoftmaxCase, *, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None) -> SoftmaxOutput:
        if case.is_varlen:
            raise Unsupported("variable-length (packed) batches are not supported by torch SDPA")
        if case.softcap:
            raise Unsupported("softcap is not supported by torch SDPA")
        Sq, Sk = q.shape[1], k.shape[1]
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D)
        kw = dict(**scale_kwargs(case, "scale"))
        if case.causal and not case.has_window and Sq == Sk:
            kw["is_causal"] = True  # top-left == bottom-right when square; lets every backend run
        else:
            mask = _cached_mask(Sq, Sk, case.causal, tuple(case.window), str(q.device))
            if mask is not None:
                kw["attn_mask"] = mask
        if kh.shape[1] != qh.shape[1]:
            if _has_enable_gqa():
                kw["enable_gqa"] = True
            else:
                rep = qh.shape[1] // kh.shape[1]
                kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
        try:
            out = self._call(qh, kh, vh, kw)
        except _Refused as refused:
            if not (
                kw.get("enable_gqa") and EXPAND_KV_WHEN_GQA_REFUSED and _GQA_WORDS.search(refused.reasons)
            ):
                raise Unsupported(f"unsupported: {refused.reasons}") from None
            # The forced backend has no native GQA in this torch: give it repeated kv heads (the
            # same kernel, with Hq / Hk times the kv traffic) rather than no result at all.
            rep = qh.shape[1] // kh.shape[1]
            kw = {n: x for n, x in kw.items() if n != "enable_gqa"}
            try:
                out = self._call(qh, kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1), kw)
            except _Refused as again:
                raise Unsupported(f"unsupported: {again.reasons}") from None
        return SoftmaxOutput(out.transpose(1, 2), None)

    def _call(self, qh, kh, vh, kw):
        """SDPA under the forced backend; torch's refusal becomes :class:`_Refused` with its reasons."""
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if self.backend is None:
            return sdpa(qh, kh, vh, **kw)
        from torch.nn.attention import sdpa_kernel

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(_backend(self.backend)):
                    return sdpa(qh, kh, vh, **kw)
            except RuntimeError as e:
                msg = str(e)
                if "not correctly aligned" in msg:  # the efficient kernel's own alignment check: a refusal
                    raise _Refused(msg.strip().splitlines()[0]) from None
                if "No available kernel" not in msg and "No viable backend" not in msg:
                    raise
                raise _Refused(_torch_reasons(caught, e)) from None


class SDPAMath(_SDPAAdapter):
    name = "sdpa_math"
    backend = "MATH"
    description = "torch SDPA, math backend forced (composite ops; any device and dtype)"


class SDPAFlash(_SDPAAdapter):
    name = "sdpa_flash"
    backend = "FLASH_ATTENTION"
    description = "torch SDPA, flash backend forced (FA2 code on CUDA; torch's own flash kernel on CPU)"
    deterministic_backward = False  # FA2's backward accumulates dq with atomics on CUDA

    def _backend_supports(self, case, device):
        if device.type == "cuda":
            if _cuda_capability(device) < (8, 0):
                return "needs sm80+"
            if case.dtype not in ("fp16", "bf16"):
                return f"torch's flash backend on CUDA takes fp16/bf16 only, not {case.dtype}"
        return None


class SDPAEfficient(_SDPAAdapter):
    name = "sdpa_efficient"
    backend = "EFFICIENT_ATTENTION"
    description = "torch SDPA, memory-efficient (xformers cutlass) backend forced"
    device_types = ("cuda",)
    deterministic_backward = False  # torch documents its backward as nondeterministic


class SDPACudnn(_SDPAAdapter):
    name = "sdpa_cudnn"
    backend = "CUDNN_ATTENTION"
    description = "torch SDPA, cuDNN backend forced"
    device_types = ("cuda",)
    deterministic_backward = False

    def _backend_supports(self, case, device):
        if _cuda_capability(device) < (8, 0):
            return "needs sm80+"
        if case.dtype not in ("fp16", "bf16"):
            return f"torch's cuDNN backend takes fp16/bf16 only, not {case.dtype}"
        return None


class SDPADefault(_SDPAAdapter):
    name = "sdpa"
    backend = None
    description = "torch SDPA, torch's default backend choice (may differ per case)"
    deterministic_backward = False  # torch may pick flash / efficient / cuDNN


for _cls in (SDPAMath, SDPAFlash, SDPAEfficient, SDPACudnn, SDPADefault):
    register(_cls)
