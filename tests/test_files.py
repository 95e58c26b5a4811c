"""harness/files.py: writers of one path that race (the main job's workers building one oracle)."""

import threading

from harness.files import atomic_write


def test_concurrent_writers_of_one_path_never_collide(tmp_path):
    path = tmp_path / "oracle.bin"
    errors = []

    def writer(n):
        for i in range(50):
            try:
                atomic_write(path, lambda tmp, n=n, i=i: open(tmp, "w").write(f"{n}-{i}\n" * 1000))
            except Exception as e:  # the shared ".tmp" name of before: FileNotFoundError on rename
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    lines = path.read_text().splitlines()
    assert len(lines) == 1000 and len(set(lines)) == 1  # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["oracle.bin"]  # no temporary files left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("old")

    def fails(tmp):
        open(tmp, "w").write("half")
        raise OSError("disk full")

    try:
        atomic_write(path, fails)
    except OSError:
        pass
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.json"]
