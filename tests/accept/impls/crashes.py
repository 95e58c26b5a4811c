"""Wrong: the process dies (os.abort, as an illegal memory access or a failed assert in C++ does)."""

import os


def flash_attn_func(q, k, v, **kw):
    os.abort()
