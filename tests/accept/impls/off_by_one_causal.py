"""Wrong: the causal mask is one key too wide (query i also sees key i + 1), the classic `<=` vs
`<` on the diagonal tile."""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def flash_attn_func(q, k, v, **kw):
    return _ref(q, k, v, mask_shift=1, **kw)
