"""Correct where it runs, and says where it does not.

* ``no_window``: declares no window / softcap support through ``attn_capabilities``.
* ``no_gqa``: raises NotImplementedError for GQA/MQA (heads_q != heads_k).
* ``forward_only``: declares no backward (an inference kernel).
"""

try:
    from ._reference import flash_attn_func as _ref
except ImportError:  # imported as a top-level module from this directory, as a vendor module is
    from _reference import flash_attn_func as _ref


def no_window(q, k, v, **kw):
    return _ref(q, k, v, **kw)


no_window.attn_capabilities = {"window": False, "softcap": False}


def no_gqa(q, k, v, **kw):
    if q.shape[-2] != k.shape[-2]:
        raise NotImplementedError("GQA/MQA (heads_q != heads_k) is not implemented")
    return _ref(q, k, v, **kw)


def forward_only(q, k, v, **kw):
    return _ref(q, k, v, **kw)


forward_only.attn_capabilities = {"backward": False}
