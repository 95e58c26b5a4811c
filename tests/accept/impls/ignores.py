"""Wrong: each callable here ignores exactly one keyword (or property) of the contract and is
otherwise the correct reference. tests/accept/test_contract_keywords.py asserts that each is
caught on the case that exercises its keyword, and generates docs/contract-keywords.md from that
table (issue 17: for every keyword, the test that would catch a kernel that ignores it)."""

try:
    from . import correct_linear as _lin_mod
    from ._reference import _as_if_contiguous
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    import correct_linear as _lin_mod
    from _reference import _as_if_contiguous
    from _reference import flash_attn_func as _ref

_lin = _lin_mod.chunk_linear_attn

# -- softmax (flash-attn's signature) --------------------------------------------------------


def positional_misread(q, k, v, *args, **kw):
    """A wrapper over *args that declares flash-attn 2's positional order but forgets its dropout_p:
    it reads (softmax_scale, causal, ...) from the front. By keyword it is right; called positionally,
    dropout_p's 0.0 lands in softmax_scale (read as "the default") and the scale in causal."""
    scale, causal, *_ = args + (None, False)
    kw.setdefault("causal", bool(causal))
    if scale:
        kw.setdefault("softmax_scale", scale)
    return _ref(q, k, v, **kw)


positional_misread.attn_capabilities = {"positional": ["dropout_p", "softmax_scale", "causal", "window_size", "softcap"]}


def wrong_without_lse(q, k, v, *, return_lse=True, **kw):
    """Right when lse is asked for; its out-only path (return_lse=False, flash-attn-4's keyword)
    forgets the causal mask, as a separate fast path can."""
    if return_lse:
        return _ref(q, k, v, **kw)
    return _ref(q, k, v, **{**kw, "causal": False})[0]


def ignores_causal(q, k, v, *, causal=False, **kw):
    return _ref(q, k, v, **kw)


def ignores_window(q, k, v, *, window_size=(-1, -1), **kw):
    return _ref(q, k, v, **kw)


def ignores_softcap(q, k, v, *, softcap=0.0, **kw):
    return _ref(q, k, v, **kw)


def ignores_cu_seqlens(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, **kw):
    """The packed batch attended as one sequence."""
    if cu_seqlens_q is None:
        return _ref(q, k, v, **kw)
    out, lse = _ref(q[None], k[None], v[None], **kw)
    return out[0], lse[0]


ignores_cu_seqlens.attn_capabilities = {"varlen": True}


# -- linear (FLA's signature) ----------------------------------------------------------------


def linear_ignores_g(q, k, v, g=None, g_gamma=None, **kw):
    return _lin(q, k, v, g_gamma=g_gamma, **kw)


def linear_ignores_g_gamma(q, k, v, g=None, g_gamma=None, **kw):
    return _lin(q, k, v, g=g, **kw)


def linear_ignores_scale(q, k, v, g=None, g_gamma=None, *, scale=None, **kw):
    """The scale passed is ignored for the default K ** -0.5."""
    return _lin(q, k, v, g=g, g_gamma=g_gamma, **kw)


def linear_wrong_default_scale(q, k, v, g=None, g_gamma=None, *, scale=None, **kw):
    """The default scale (keyword omitted) is 1/K instead of 1/sqrt(K)."""
    return _lin(q, k, v, g=g, g_gamma=g_gamma, scale=q.shape[-1] ** -1.0 if scale is None else scale, **kw)


def linear_ignores_initial_state(q, k, v, g=None, g_gamma=None, *, initial_state=None, **kw):
    return _lin(q, k, v, g=g, g_gamma=g_gamma, **kw)


def linear_ignores_output_final_state(q, k, v, g=None, g_gamma=None, *, output_final_state=False, **kw):
    """output_final_state=True is ignored: no state comes back."""
    o, _ = _lin(q, k, v, g=g, g_gamma=g_gamma, **kw)
    return o, None


def linear_contiguous_only(q, k, v, g=None, g_gamma=None, **kw):
    """Reads q, k, v (and g) as dense arrays from their storage's start: strides and offsets ignored."""
    q, k, v = (_as_if_contiguous(t) for t in (q, k, v))
    if g is not None:
        g = _as_if_contiguous(g)
    return _lin(q, k, v, g=g, g_gamma=g_gamma, **kw)
