"""Wrong: never returns (a deadlocked kernel or a spin on a flag never set)."""

import time


def flash_attn_func(q, k, v, **kw):
    while True:
        time.sleep(60)
