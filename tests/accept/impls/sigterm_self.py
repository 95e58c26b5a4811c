"""Dies of SIGTERM (as a child does when a time limit signals the whole process group)."""

import os
import signal
import time


def flash_attn_func(q, k, v, **kw):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
