"""Prepared containerd roots are pruned to the most recently used ones, so a machine that tests many
trainer changes does not fill its disk (each change prepares a root of its own)."""

from __future__ import annotations

import fcntl
import os

from tools.cluster.realpods import prune_prepared_roots


def _root(folder, name, used_at):
    base = folder / name
    (base / "root" / "io.containerd.content.v1.content").mkdir(parents=True)
    (base / "root" / "io.containerd.content.v1.content" / "blob").write_bytes(b"x" * 10)
    (base / "ready").touch()
    os.utime(base / "ready", (used_at, used_at))
    return base


def test_only_the_most_recently_used_roots_are_kept(tmp_path):
    old, middle, new = (_root(tmp_path, n, t) for n, t in (("a", 100), ("b", 200), ("c", 300)))
    removed = prune_prepared_roots(tmp_path, keep=2)
    assert removed == [old]
    assert not (old / "ready").exists() and not (old / "root").exists()
    assert (middle / "root").is_dir() and (new / "root").is_dir()


def test_a_root_another_session_holds_is_left_alone(tmp_path):
    held = _root(tmp_path, "a", 100)
    _root(tmp_path, "b", 200)
    with open(held / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The prune opens its own file description, so this lock blocks it as another process's would.
        assert prune_prepared_roots(tmp_path, keep=1) == []
    assert (held / "ready").exists()
    assert prune_prepared_roots(tmp_path, keep=1) == [held]
