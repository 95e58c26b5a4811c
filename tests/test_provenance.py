"""The source digest names the measuring code even where .git is stale (harness/provenance.py)."""
import shutil
import subprocess

import pytest

from harness import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    for d, name, text in (("harness", "a.py", "A = 1\n"), ("kernels", "k.py", "K = 2\n"), ("docs", "x.py", "X = 0\n")):
        (tmp_path / d).mkdir()
        (tmp_path / d / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_digest_of_the_tree_matches_its_commit_and_is_found(repo):
    d = provenance.source_digest(repo)
    assert d == provenance.commit_digest("HEAD", repo) and len(d) == provenance.DIGEST_CHARS
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance.find(d, root=repo) == [head]


def test_digest_follows_the_measuring_code_only(repo):
    d = provenance.source_digest(repo)
    (repo / "docs" / "x.py").write_text("X = 1\n")  # not measuring code
    assert provenance.source_digest(repo) == d
    (repo / "kernels" / "k.py").write_text("K = 3\n")
    changed = provenance.source_digest(repo)
    assert changed != d and provenance.find(changed, root=repo) == []
    (repo / "harness" / "new.py").write_text("")  # a new file counts too
    assert provenance.source_digest(repo) not in (d, changed)


def test_bench_environment_records_the_digest():
    import torch

    from harness.perf.bench import environment

    assert environment(torch.device("cpu"))["versions"]["source"] == provenance.source_digest()
