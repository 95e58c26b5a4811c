"""Files several processes may write at once (the main job's workers share the oracle cache)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file of this writer's own beside ``path``, then rename it over
    ``path``: readers see the old file or the whole new one, and two writers of the same path (two
    workers building the same case's oracle) never rename each other's half-written file."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
