"""Which code made a report: a digest of the measuring code's source, that git history can be searched for.

Every benchmark report records ``versions.git`` (the checkout's commit, "+dirty" when tracked files
differ) and ``versions.source``: a SHA-256 over the Python files of ``harness/`` and ``kernels/``
(their paths and bytes, sorted by path). The commit alone can mislead: a machine that receives a
copy of the working tree with a stale ``.git`` reports an old commit "+dirty" while running newer
code. The digest names the code itself; find the commit it came from with

    python -m harness.provenance                      # the digest of this working tree
    python -m harness.provenance --find DIGEST [-n 50]  # the commits (of the last 50) with that digest
"""
from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The folders whose Python files decide what a report measures.
SOURCE_DIRS = ("harness", "kernels")
DIGEST_CHARS = 16


def _digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for path, data in sorted(files):
        h.update(path.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()[:DIGEST_CHARS]


def source_digest(root: Path = ROOT) -> str:
    """The digest of the working tree's ``harness/`` and ``kernels/`` Python files."""
    files = [(p.relative_to(root).as_posix(), p.read_bytes())
             for d in SOURCE_DIRS for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts]
    return _digest(files)


def _git(*args: str, root: Path = ROOT) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True, timeout=60).stdout


def commit_digest(rev: str, root: Path = ROOT) -> str:
    """The same digest for a commit, read from git (no checkout)."""
    names = [n for n in _git("ls-tree", "-r", "--name-only", rev, "--", *SOURCE_DIRS, root=root).decode().splitlines()
             if n.endswith(".py")]
    return _digest([(n, _git("show", f"{rev}:{n}", root=root)) for n in names])


def find(digest: str, last: int = 50, root: Path = ROOT) -> list[str]:
    """Commits among the last ``last`` of HEAD's history whose source digest is ``digest``."""
    revs = _git("rev-list", f"--max-count={last}", "HEAD", root=root).decode().split()
    return [r for r in revs if commit_digest(r, root) == digest[:DIGEST_CHARS]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.provenance", description=__doc__.split("\n")[0])
    ap.add_argument("--find", metavar="DIGEST", help="list the commits whose source digest is DIGEST")
    ap.add_argument("-n", type=int, default=50, help="how many commits back --find searches (default 50)")
    a = ap.parse_args(argv)
    if not a.find:
        print(source_digest())
        return 0
    hits = find(a.find, a.n)
    if not hits:
        print(f"no commit among the last {a.n} has source digest {a.find} (uncommitted code, or older)", file=sys.stderr)
        return 1
    print("\n".join(hits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
