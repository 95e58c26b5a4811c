"""Standalone reproduction scripts: what a maintainer upstream needs in a bug report.

:func:`write_repro` writes a Python script that needs torch and the backend, and nothing of this
project: it rebuilds the exact inputs of (case, seed) (the same seeded generator and the same order
of draws as :func:`harness.cases.make_inputs`, the same memory layout), computes the answer in
float64 with an inline materialised reference (softmax) or the plain recurrence (linear), runs the
backend the way its adapter does, and compares every tensor with the bound the harness's tolerance
rule set on those inputs (factor x the eager reference's error + a rounding floor: the numbers are
written into the script). It prints the errors and exits 1 while any is above its bound, 0 once the
defect is fixed; ``--impl MODULE:CALLABLE`` runs another callable on the same inputs (a fixed
version, or a correct one for comparison).
"""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from pathlib import Path

from harness.adapters.optional import POSITIONAL_FILL
from harness.cases import LinearCase, SoftmaxCase, _seed_from
from harness.check.results import CaseResult

#: How each registered backend is called without the harness (softmax: q, k, v (B, S, H, D)).
_SOFTMAX_CALLS = {
    "flash_attn": ("flash-attn 2", "from flash_attn import flash_attn_func as fn", "flash"),
    "flash_attn_cute": ("flash-attn-4", "from flash_attn.cute.interface import flash_attn_func as fn", "cute"),
    "triton_fa": ("this project's kernels/ (the in-repo Triton kernel; run from the project root)",
                  "from kernels.flash_attn import flash_attn_func as fn", "flash"),
    "sdpa": ("torch", "", "sdpa:"),
    "sdpa_math": ("torch", "", "sdpa:MATH"),
    "sdpa_flash": ("torch", "", "sdpa:FLASH_ATTENTION"),
    "sdpa_efficient": ("torch", "", "sdpa:EFFICIENT_ATTENTION"),
    "sdpa_cudnn": ("torch", "", "sdpa:CUDNN_ATTENTION"),
}
_SOFTMAX_CALLS["triton_fa_det"] = _SOFTMAX_CALLS["triton_fa"]  # (the same function: _SOFTMAX_EXTRA tells them apart)
#: Keywords a backend's adapter adds to its call (dense cases, where the function takes them), so the script runs the
#: same path: the in-repo kernel's fast backward (``deterministic=False``, triton_fa) or its default (triton_fa_det).
_SOFTMAX_EXTRA = {"triton_fa": {"deterministic": False}, "triton_fa_det": {"deterministic": True}}
_LINEAR_CALLS = {
    "fla_chunk": ("fla-core", "from fla.ops.simple_gla import chunk_simple_gla as fn"),
    "fla_fused_chunk": ("fla-core", "from fla.ops.simple_gla import fused_chunk_simple_gla as fn"),
    "fla_recurrent": ("fla-core", "from fla.ops.simple_gla import fused_recurrent_simple_gla as fn"),
    "triton_la_chunk": ("this project's kernels/ (the in-repo Triton kernel; run from the project root)",
                        "from kernels.linear_attn import chunk_linear_attn as fn"),
}


#: Decode backends (flash_attn_with_kvcache-like: q, k_cache, v_cache, k, v, cache_seqlens=, ...):
#: (what the script needs, its import, the keywords the adapter adds).
_DECODE_CALLS = {
    "triton_decode": ("this project's kernels/ (the in-repo Triton kernel; run from the project root)",
                      "from kernels.decode import decode_attention as fn", "return_lse=True, validate=False"),
    "flash_attn_kvcache": ("flash-attn 2 (`flash_attn`) on a CUDA GPU",
                           "from flash_attn import flash_attn_with_kvcache as fn", "return_softmax_lse=True"),
    # flash-attn 3 names the page table page_table
    "flash_attn3_kvcache": ("flash-attn 3 (`flash_attn_interface`, the hopper build) on a CUDA GPU",
                            "from flash_attn_interface import flash_attn_with_kvcache as fn",
                            "return_softmax_lse=True, page_table=kw.pop('block_table')"),
}


def supported(backend: str | None, impl: str | None, family: str) -> str | None:
    """None when a standalone call is known, else why not."""
    if impl:
        return None
    if family == "decode":
        if backend in _DECODE_CALLS or backend in _DECODE_OWN_CALLS:
            return None
        return (f"no standalone decode call is known for {backend!r} (harness/check/repro.py: --impl callables "
                "with flash_attn_with_kvcache's signature, and the in-repo kernel); wrap it and shrink with --impl")
    table = _SOFTMAX_CALLS if family == "softmax" else _LINEAR_CALLS
    if backend in table:
        return None
    return f"no standalone call is known for {backend!r} (harness/check/repro.py); shrink it with --impl instead"


def write_repro(path: Path, *, case, seed: int, result: CaseResult, backend: str | None = None,
                impl: str | None = None, device: str = "cpu") -> Path:
    """Write the script for ``case`` / ``seed`` failing as ``result`` (its tensors' bounds)."""
    why = supported(backend, impl, case.family)
    if why:
        raise ValueError(why)
    bounds = {t.name: float(t.allowed) for t in result.tensors}
    check = result.failures[0] if result.failures else result.status
    name = impl or backend
    if case.family == "softmax":
        needs, call = _softmax_call(backend, impl, case)
    elif case.family == "decode":
        needs, call = _decode_call(backend, impl)
        bounds.update(k_cache=0.0, v_cache=0.0)  # the written caches must equal the expected ones exactly
    else:
        needs, call = _linear_call(backend, impl, case)
    fields = {f: getattr(case, f) for f in case.__dataclass_fields__ if f != "family"}
    head = textwrap.dedent(f'''\
        #!/usr/bin/env python3
        """{name} on {case.id} (seed {seed}): `{check}` fails.

        Generated by attn-harness (`python -m harness shrink`) on {datetime.now(UTC):%Y-%m-%d}.
        Harness verdict: {result.reason[:400]}

        Needs torch and {needs}; nothing of attn-harness. Rebuilds the exact inputs, computes the
        answer in float64, runs {name}, and exits 1 while a tensor's relative RMS error is above the
        bound the harness's tolerance rule set on these inputs (factor x the error of a careful eager
        implementation in {case.dtype} + a rounding floor), 0 once fixed.

            python {Path(path).name} [--device cpu|cuda]{" [--impl MODULE:CALLABLE]" if impl else ""}
        """
        import argparse
        import importlib
        import math
        import sys

        import torch

        CASE = {fields!r}
        FAMILY = {case.family!r}
        SEED = {_seed_from(case.id, seed)}  # torch.Generator seed of the inputs
        SCALE = {case.effective_scale!r}  # {"passed to the kernel" if case.scale is not None else "the kernel's default, not passed"}
        PASS_SCALE = {case.scale is not None!r}
        BOUNDS = {bounds!r}  # tensor -> largest relative RMS error allowed
        DEVICE = {device!r}
        IMPL = {impl!r}
        DTYPES = {{"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}}
        ''')
    if case.family == "softmax":  # flash-attn 2's values for positional parameters the harness does not pass
        head += f"FILL = {POSITIONAL_FILL!r}\n"
    if case.family == "decode":  # the cache's shape, as the harness derives it from the case
        head += (f"PAGED = {case.paged!r}\nNUM_BLOCKS = {case.num_blocks!r}\nPAGES_PER_SEQ = {case.pages_per_seq!r}\n"
                 f"CAPACITY = {case.capacity!r}\nCACHE_SEQLENS = {list(case.cache_seqlens)!r}\n")
    body = _COMMON + {"softmax": _ATTEND + _SOFTMAX, "linear": _LINEAR, "decode": _ATTEND + _DECODE}[case.family] + call + _MAIN
    path = Path(path)
    if "importlib." not in body:  # only the --impl and optional-backend calls import by name
        head = head.replace("import importlib\n", "", 1)
    path.write_text(head + body)
    path.chmod(0o755)
    return path


def _softmax_call(backend, impl, case: SoftmaxCase) -> tuple[str, str]:
    if impl:
        return f"`{impl}` importable from the current directory", textwrap.dedent('''\

            def candidate(q, k, v, cu_q, cu_k, impl):
                mod, _, attr = impl.partition(":")
                fn = importlib.import_module(mod)
                for part in attr.split("."):
                    fn = getattr(fn, part)
                kw = dict(causal=CASE["causal"], window_size=tuple(CASE["window"]))
                if PASS_SCALE:
                    kw["softmax_scale"] = SCALE
                if CASE["softcap"]:
                    kw["softcap"] = CASE["softcap"]
                if cu_q is not None:
                    kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=CASE["seqlen_q"],
                              max_seqlen_k=CASE["seqlen_k"])
                res = call(fn, q, k, v, kw)
                if isinstance(res, (tuple, list)):
                    return res[0], (res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None)
                return res, None
            ''')
    needs, imp, how = _SOFTMAX_CALLS[backend]
    if how.startswith("sdpa:"):
        forced = how.split(":", 1)[1]
        return needs, textwrap.dedent(f'''\

            def candidate(q, k, v, cu_q, cu_k, impl):
                """torch SDPA{" with the " + forced + " backend forced" if forced else ""}, a bottom-right mask as the harness passes it."""
                Sq, Sk = q.shape[1], k.shape[1]
                qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                kw = dict(scale=SCALE) if PASS_SCALE else {{}}
                if CASE["causal"] and tuple(CASE["window"]) == (-1, -1) and Sq == Sk:
                    kw["is_causal"] = True
                else:
                    mask = visible(Sq, Sk, q.device)
                    if not bool(mask.all()):
                        kw["attn_mask"] = mask
                if kh.shape[1] != qh.shape[1]:
                    kw["enable_gqa"] = True
                sdpa = torch.nn.functional.scaled_dot_product_attention
                {"return sdpa(qh, kh, vh, **kw).transpose(1, 2), None" if not forced else
                 "from torch.nn.attention import SDPBackend, sdpa_kernel" + chr(10) + "                with sdpa_kernel(SDPBackend." + forced + "):" + chr(10) + "                    return sdpa(qh, kh, vh, **kw).transpose(1, 2), None"}
            ''')
    if how == "cute":
        return needs, textwrap.dedent(f'''\

            def candidate(q, k, v, cu_q, cu_k, impl):
                """flash-attn-4: window bounds as None for unbounded (its convention)."""
                {imp}
                left, right = CASE["window"]
                kw = dict(causal=CASE["causal"])
                if PASS_SCALE:
                    kw["softmax_scale"] = SCALE
                if (left, right) != (-1, -1):
                    kw["window_size"] = (None if left < 0 else left, None if right < 0 else right)
                if CASE["softcap"]:
                    kw["softcap"] = CASE["softcap"]
                res = call(fn, q, k, v, kw)
                if not isinstance(res, (tuple, list)):
                    return res, None
                lse = res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None
                if lse is not None:  # flash-attn writes +inf for rows that see no key; the convention is -inf
                    lse = torch.where(torch.isinf(lse), torch.full_like(lse, -math.inf), lse)
                return res[0], lse
            ''')
    extra = _SOFTMAX_EXTRA.get(backend)
    keywords = "" if not extra else (  # (as the adapter calls it, where the function takes the keyword)
        f"\n            import inspect\n            for name, value in {extra!r}.items():"
        "\n                if name in inspect.signature(fn).parameters:\n                    kw[name] = value")
    return needs, textwrap.dedent(f'''\

        def candidate(q, k, v, cu_q, cu_k, impl):
            {imp}
            kw = dict(causal=CASE["causal"], window_size=tuple(CASE["window"]))
            if PASS_SCALE:
                kw["softmax_scale"] = SCALE
            if CASE["softcap"]:
                kw["softcap"] = CASE["softcap"]{keywords}
            res = call(fn, q, k, v, kw, attn_probs=True)
            if isinstance(res, (tuple, list)):
                return res[0], (res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None)
            return res, None
        ''')


#: Decode backends with a call of their own (not flash_attn_with_kvcache's): (needs, candidate's body).
_DECODE_OWN_CALLS = {
    "flash_attn_cute_decode": ("flash-attn-4 (`flash_attn.cute`, with nvidia-cutlass-dsl) on a CUDA GPU", '''

def candidate(q, k_cache, v_cache, k, v, lens, bt, impl):
    """flash-attn-4's flash_attn_varlen_func over the cache, as the harness calls it: the new k, v
    written into the cache first (index_copy_), then seqused_k = the lengths with them, page_table
    when paged. lse is not compared (flash-attn-4 writes +inf on rows that see no key)."""
    from flash_attn.cute.interface import flash_attn_varlen_func as fn
    used = lens
    if k is not None:
        B, Sq, Hk = k.shape[0], k.shape[1], k.shape[2]
        pos = lens.long()[:, None] + torch.arange(Sq, device=k.device)[None, :]
        if bt is None:
            slot = torch.arange(B, device=k.device)[:, None] * k_cache.shape[1] + pos
        else:
            page = k_cache.shape[1]
            slot = bt.long().gather(1, pos // page) * page + pos % page
        slot = slot.reshape(-1)
        k_cache.view(-1, Hk, k_cache.shape[-1]).index_copy_(0, slot, k.reshape(-1, Hk, k.shape[-1]))
        v_cache.view(-1, Hk, v_cache.shape[-1]).index_copy_(0, slot, v.reshape(-1, Hk, v.shape[-1]))
        used = lens + Sq
    window = tuple(None if w < 0 else w for w in CASE["window"])
    kw = dict(seqused_k=used.to(torch.int32), causal=CASE["causal"], window_size=window, return_lse=True)
    if PASS_SCALE:
        kw["softmax_scale"] = SCALE
    if bt is not None:
        kw["page_table"] = bt.to(torch.int32)
    if CASE["softcap"]:
        kw["softcap"] = CASE["softcap"]
    res = fn(q, k_cache, v_cache, **kw)
    return (res[0] if isinstance(res, (tuple, list)) else res), None
'''),
}


def _decode_call(backend, impl) -> tuple[str, str]:
    if backend in _DECODE_OWN_CALLS:
        return _DECODE_OWN_CALLS[backend]
    if impl:
        needs, extra = f"`{impl}` importable from the current directory", ""
        imp = ('mod, _, attr = impl.partition(":")\n    fn = importlib.import_module(mod)\n'
               '    for part in attr.split("."):\n        fn = getattr(fn, part)')
    else:
        needs, imp, extra = _DECODE_CALLS[backend]
        extra = f"\n    kw.update({extra}, softcap=CASE['softcap'])"
    return needs, f'''

def candidate(q, k_cache, v_cache, k, v, lens, bt, impl):
    """flash_attn_with_kvcache's signature: the new k, v written into the caches in place."""
    {imp}
    kw = dict(cache_seqlens=lens, block_table=bt, causal=CASE["causal"], window_size=tuple(CASE["window"]))
    if PASS_SCALE:
        kw["softmax_scale"] = SCALE
    if CASE["softcap"]:
        kw["softcap"] = CASE["softcap"]{extra}
    res = fn(q, k_cache, v_cache, k, v, **kw)
    if isinstance(res, (tuple, list)):
        return res[0], (res[1] if len(res) > 1 and isinstance(res[1], torch.Tensor) else None)
    return res, None
'''


def _linear_call(backend, impl, case: LinearCase) -> tuple[str, str]:
    if impl:
        needs = f"`{impl}` importable from the current directory"
        imp = ('mod, _, attr = impl.partition(":")' + "\n    fn = importlib.import_module(mod)\n"
               '    for part in attr.split("."):\n        fn = getattr(fn, part)')
    else:
        needs, imp = _LINEAR_CALLS[backend]
    return needs, f'''

def candidate(q, k, v, g, g_gamma, h0, impl):
    {imp}
    kw = dict(initial_state=h0, output_final_state=True)
    if PASS_SCALE:
        kw["scale"] = SCALE
    if g is not None:
        kw["g"] = g
    if g_gamma is not None:
        kw["g_gamma"] = g_gamma
    o, ht = fn(q, k, v, **kw)
    return o, ht
'''


_COMMON = '''

def randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)


def laid_out(tensors):
    """The memory layout the harness passed (same values)."""
    kind = CASE.get("layout", "contiguous")
    if kind == "contiguous":
        return dict(tensors)
    if kind == "qkvpacked":
        packed = torch.stack([tensors["q"], tensors["k"], tensors["v"]], dim=2)
        return {**tensors, "q": packed[:, :, 0], "k": packed[:, :, 1], "v": packed[:, :, 2]}
    out = {}
    for name, t in tensors.items():
        if t is None or not t.is_floating_point() or t.dim() < 2:
            out[name] = t
        elif kind == "transposed":
            a, b = (1, 2) if t.dim() == 4 else (0, 1)
            out[name] = t.transpose(a, b).contiguous().transpose(a, b)
        else:  # offset: one element into the buffer
            out[name] = torch.cat([t.new_zeros(1), t.reshape(-1)])[1:].view(t.shape)
    return out


def rel_rms(got, want):
    """||got - want|| / ||want|| where want is finite (the harness's error measure); inf if got is not finite there."""
    want = want.detach().double()
    got = got.detach().double().to(want.device)
    keep = torch.isfinite(want)
    want, got = want[keep], got[keep]
    if want.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(got).all()):
        return math.inf
    norm = float(torch.linalg.vector_norm(want))
    return float(torch.linalg.vector_norm(got - want)) / (norm if norm > 0 else 1.0)
'''

_ATTEND = '''

def visible(sq, sk, device):
    """Bottom-right aligned mask (flash-attn's): query i sees key j iff i+off-left <= j <= i+off+right."""
    left, right = CASE["window"]
    if CASE["causal"]:
        right = 0
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + right
    if left >= 0:
        mask &= j >= i - left
    return mask


def attend(q, k, v):
    """float64, materialised; q (B, Sq, Hq, D): (out, lse (B, Hq, Sq)); rows that see no key: out 0, lse -inf."""
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * SCALE
    if CASE["softcap"]:
        s = CASE["softcap"] * torch.tanh(s / CASE["softcap"])
    mask = visible(q.shape[1], k.shape[1], q.device)
    live = mask.any(-1)[:, None]
    s = torch.where(mask & live, s, torch.full_like(s, -math.inf))
    p = torch.softmax(torch.where(live, s, torch.zeros_like(s)), dim=-1) * live
    lse = torch.where(live[..., 0], torch.logsumexp(torch.where(live, s, torch.zeros_like(s)), dim=-1),
                      torch.full_like(s[..., 0], -math.inf))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse
'''

_SOFTMAX = '''


def call(fn, q, k, v, kw, attn_probs=False):
    """fn(q, k, v, ...) as the harness calls it: lse asked for (return_lse, or flash-attn 2's
    return_attn_probs) only when the case does, and by position after q, k, v on positional cases."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    for name in ("return_lse",) + (("return_attn_probs",) if attn_probs else ()):
        if name in params:
            kw[name] = CASE.get("return_lse", True)
            break
    if CASE.get("call", "keyword") != "positional":
        return fn(q, k, v, **kw)
    declared = (getattr(fn, "attn_capabilities", None) or {}).get("positional")  # a wrapper over *args
    order = list(declared or [p.name for p in list(params.values())[3:] if p.kind is p.POSITIONAL_OR_KEYWORD])
    last = max((i for i, n in enumerate(order) if n in kw), default=-1)
    def skipped(n):  # the callee's own default, else flash-attn 2's
        default = params[n].default if n in params else inspect.Parameter.empty
        return FILL[n] if default is inspect.Parameter.empty else default

    pos = [kw.pop(n) if n in kw else skipped(n) for n in order[: last + 1]]
    return fn(q, k, v, *pos, **kw)

def inputs():
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    dt = DTYPES[CASE["dtype"]]
    hq, hk, d, dv = CASE["heads_q"], CASE["heads_k"], CASE["d"], CASE["d_v"]
    if CASE["varlen"]:
        tq = sum(a for a, _ in CASE["varlen"])
        tk = sum(b for _, b in CASE["varlen"])
        q, k = randn(gen, tq, hq, d, dtype=dt), randn(gen, tk, hk, d, dtype=dt)
        v, do = randn(gen, tk, hk, dv, dtype=dt), randn(gen, tq, hq, dv, dtype=dt)
        cu_q = torch.tensor([0] + [a for a, _ in CASE["varlen"]], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu_k = torch.tensor([0] + [b for _, b in CASE["varlen"]], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return q, k, v, do, cu_q, cu_k
    b, sq, sk = CASE["batch"], CASE["seqlen_q"], CASE["seqlen_k"]
    q, k = randn(gen, b, sq, hq, d, dtype=dt), randn(gen, b, sk, hk, d, dtype=dt)
    v, do = randn(gen, b, sk, hk, dv, dtype=dt), randn(gen, b, sq, hq, dv, dtype=dt)
    return q, k, v, do, None, None


def reference(q, k, v, do, cu_q, cu_k):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    if cu_q is None:
        out, lse = attend(q, k, v)
    else:
        parts, lses = [], []
        for a0, a1, b0, b1 in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist()):
            if a1 == a0:
                continue
            if b1 == b0:
                parts.append(q[a0:a1].new_zeros(a1 - a0, q.shape[1], v.shape[2]) + 0 * q[a0:a1, :, :1])
                lses.append(torch.full((q.shape[1], a1 - a0), -math.inf, dtype=q.dtype))
                continue
            o, l_ = attend(q[None, a0:a1], k[None, b0:b1], v[None, b0:b1])
            parts.append(o[0])
            lses.append(l_[0])
        out = torch.cat(parts, 0) if parts else q.new_zeros(0, q.shape[1], v.shape[2])
        lse = torch.cat(lses, 1) if lses else q.new_zeros(q.shape[1], 0)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do.double(), allow_unused=True)
    zero = lambda g, t: g if g is not None else torch.zeros_like(t)  # noqa: E731
    return {"out": out.detach(), "lse": lse.detach(), "dq": zero(dq, q), "dk": zero(dk, k), "dv": zero(dv, v)}


def run(impl, device):
    q, k, v, do, cu_q, cu_k = inputs()
    want = reference(q, k, v, do, cu_q, cu_k)
    leaves = {n: t.to(device).clone().requires_grad_() for n, t in (("q", q), ("k", k), ("v", v))}
    passed = laid_out({n: t.clone() for n, t in leaves.items()})
    cu = (cu_q.to(device), cu_k.to(device)) if cu_q is not None else (None, None)
    out, lse = candidate(passed["q"], passed["k"], passed["v"], *cu, impl)
    got = {"out": out.detach()}
    if lse is not None and CASE.get("return_lse", True):  # an out-only case: lse is not the callee's answer
        got["lse"] = lse.detach()
    if any(n in BOUNDS for n in ("dq", "dk", "dv")):
        grads = torch.autograd.grad(out, [leaves["q"], leaves["k"], leaves["v"]], do.to(device).to(out.dtype),
                                    allow_unused=True)
        for n, t, g in zip(("dq", "dk", "dv"), (q, k, v), grads):
            got[n] = g if g is not None else torch.zeros_like(t)
    return got, want
'''

_DECODE = '''

def inputs():
    """q, the caches (contiguous (B, capacity, Hk, D) or a paged pool with its block table), the new
    tokens and the cache lengths, drawn in the harness's order."""
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    dt = DTYPES[CASE["dtype"]]
    b, sq, hq, hk, d, dv = (CASE[n] for n in ("batch", "seqlen_q", "heads_q", "heads_k", "d", "d_v"))
    q = randn(gen, b, sq, hq, d, dtype=dt)
    if PAGED:
        page = CASE["page_size"]
        kc, vc = randn(gen, NUM_BLOCKS, page, hk, d, dtype=dt), randn(gen, NUM_BLOCKS, page, hk, dv, dtype=dt)
        order = torch.randperm(NUM_BLOCKS, generator=gen)[: b * PAGES_PER_SEQ]
        bt = order.view(b, PAGES_PER_SEQ).to(torch.int32)
    else:
        kc, vc = randn(gen, b, CAPACITY, hk, d, dtype=dt), randn(gen, b, CAPACITY, hk, dv, dtype=dt)
        bt = None
    kn = randn(gen, b, sq, hk, d, dtype=dt) if CASE["append"] else None
    vn = randn(gen, b, sq, hk, dv, dtype=dt) if CASE["append"] else None
    return q, kc, vc, kn, vn, torch.tensor(CACHE_SEQLENS, dtype=torch.int32), bt


def slot(cache, bt, b, i):
    """Row i of sequence b in a cache (the page table's page when paged)."""
    if bt is None:
        return cache[b, i]
    page = CASE["page_size"]
    return cache[int(bt[b, i // page]), i % page]


def reference(q, kc, vc, kn, vn, lens, bt):
    """The caches after the new tokens are written at each sequence's length (in the cache's dtype),
    and float64 attention of the new queries over each sequence's whole cache (bottom-right masks)."""
    kc, vc = kc.clone(), vc.clone()
    b, sq = q.shape[:2]
    outs, lses = [], []
    for s_ in range(b):
        n = int(lens[s_])
        if kn is not None:
            for i in range(sq):
                slot(kc, bt, s_, n + i).copy_(kn[s_, i])
                slot(vc, bt, s_, n + i).copy_(vn[s_, i])
            n += sq
        if n == 0:
            outs.append(q.new_zeros(sq, q.shape[2], vc.shape[-1], dtype=torch.float64))
            lses.append(torch.full((q.shape[2], sq), -math.inf, dtype=torch.float64))
            continue
        keys = torch.stack([slot(kc, bt, s_, i) for i in range(n)]).double()
        vals = torch.stack([slot(vc, bt, s_, i) for i in range(n)]).double()
        o, l_ = attend(q[s_:s_ + 1].double(), keys[None], vals[None])
        outs.append(o[0])
        lses.append(l_[0])
    return {"out": torch.stack(outs), "lse": torch.stack(lses), "k_cache": kc, "v_cache": vc}


def run(impl, device):
    q, kc, vc, kn, vn, lens, bt = inputs()
    want = reference(q, kc, vc, kn, vn, lens, bt)
    on = lambda t: None if t is None else t.to(device)  # noqa: E731
    kc_d, vc_d = kc.to(device).clone(), vc.to(device).clone()
    out, lse = candidate(q.to(device), kc_d, vc_d, on(kn), on(vn), lens.to(device), on(bt), impl)
    got = {"out": out.detach(), "k_cache": kc_d, "v_cache": vc_d}  # caches: written in place, compared exactly
    if lse is not None:
        got["lse"] = lse.detach()
    return got, want
'''

_LINEAR = '''

def inputs():
    gen = torch.Generator(device="cpu").manual_seed(SEED)
    dt = DTYPES[CASE["dtype"]]
    B, T, H, K, V = CASE["batch"], CASE["seqlen"], CASE["heads"], CASE["d_k"], CASE["d_v"]
    q, k = randn(gen, B, T, H, K, dtype=dt), randn(gen, B, T, H, K, dtype=dt)
    v, do = randn(gen, B, T, H, V, dtype=dt), randn(gen, B, T, H, V, dtype=dt)
    g = g_gamma = None
    if CASE["gate"] == "g":
        g = torch.nn.functional.logsigmoid(randn(gen, B, T, H, dtype=torch.float32)) / CASE["gate_n"]
    elif CASE["gate"] == "g_gamma":
        g_gamma = torch.nn.functional.logsigmoid(3.0 + randn(gen, H, dtype=torch.float32)) / CASE["gate_n"]
    h0 = randn(gen, B, H, K, V, dtype=torch.float32) if CASE["initial_state"] else None
    dht = randn(gen, B, H, K, V, dtype=torch.float32) if CASE["grad_final_state"] else None
    return q, k, v, do, g, g_gamma, h0, dht


def recurrence(q, k, v, g, g_gamma, h0):
    """float64: S_t = exp(g_t) S_(t-1) + k_t^T v_t, o_t = scale q_t S_t."""
    B, T, H, K = q.shape
    S = h0 if h0 is not None else q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        if g is not None:
            S = S * g[:, t].exp()[..., None, None]
        elif g_gamma is not None:
            S = S * g_gamma.exp()[None, :, None, None]
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(SCALE * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(outs, 1), S


def reference(q, k, v, do, g, g_gamma, h0, dht):
    names = ["q", "k", "v", "g", "h0"]
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (q, k, v, g if g is not None else g_gamma, h0)]
    o, S = recurrence(leaves[0], leaves[1], leaves[2], leaves[3] if g is not None else None,
                      leaves[3] if g_gamma is not None else None, leaves[4])
    loss = (o * do.double()).sum() + ((S * dht.double()).sum() if dht is not None else 0.0)
    use = [(n, t) for n, t in zip(names, leaves) if t is not None]
    grads = torch.autograd.grad(loss, [t for _, t in use], allow_unused=True)
    want = {"out": o.detach(), "final_state": S.detach()}
    for (n, t), gr in zip(use, grads):
        want[{"q": "dq", "k": "dk", "v": "dv", "g": "dg", "h0": "dh0"}[n]] = gr if gr is not None else torch.zeros_like(t)
    return want


def run(impl, device):
    q, k, v, do, g, g_gamma, h0, dht = inputs()
    want = reference(q, k, v, do, g, g_gamma, h0, dht)
    raw = {"q": q, "k": k, "v": v, "g": g, "g_gamma": g_gamma, "h0": h0}
    leaves = {n: (t.to(device).clone().requires_grad_() if t is not None else None) for n, t in raw.items()}
    passed = laid_out({n: (t.clone() if t is not None else None) for n, t in leaves.items()})
    o, ht = candidate(passed["q"], passed["k"], passed["v"], passed["g"], passed["g_gamma"], passed["h0"], impl)
    got = {"out": o.detach(), "final_state": ht.detach() if ht is not None else torch.full_like(want["final_state"], math.nan)}
    grad_names = [n for n in ("dq", "dk", "dv", "dg", "dh0") if n in BOUNDS]
    if grad_names:
        loss = (o * do.to(device).to(o.dtype)).sum()
        if dht is not None and ht is not None:
            loss = loss + (ht * dht.to(device)).sum()
        use = [(n, t) for n, t in leaves.items() if t is not None]
        grads = torch.autograd.grad(loss, [t for _, t in use], allow_unused=True)
        for (n, t), gr in zip(use, grads):
            gname = {"q": "dq", "k": "dk", "v": "dv", "g": "dg", "g_gamma": "dg", "h0": "dh0"}[n]
            got[gname] = gr if gr is not None else torch.zeros_like(t)
    return got, want
'''

_MAIN = '''

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=DEVICE)
    if IMPL:
        ap.add_argument("--impl", default=IMPL, help="MODULE:CALLABLE to run instead (default: the one that failed)")
    args = ap.parse_args()
    sys.path.insert(0, ".")
    got, want = run(getattr(args, "impl", None), args.device)
    bad = []
    print(f"{CASE}")
    for name, bound in BOUNDS.items():
        if name not in want:
            continue
        if name not in got:
            print(f"  {name:12s} not returned")
            bad.append(name)
            continue
        err = rel_rms(got[name].cpu(), want[name].cpu())
        flag = "FAIL" if not err <= bound else "ok"
        print(f"  {name:12s} relative RMS error {err:.3e}  (bound {bound:.3e})  {flag}")
        if flag == "FAIL":
            bad.append(name)
    print("defect reproduced: " + ", ".join(bad) if bad else "no defect: every tensor within its bound")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
'''
