"""The quick-start tests' stand-ins for a fresh machine (tests/test_quickstart.py and
cluster/test_quickstart_without_root.py): a checkout holding only the scripts behind the README's
commands, and a PATH holding only the commands named."""

from __future__ import annotations

from pathlib import Path

from support import REPO_ROOT


def bin_with(tmp_path: Path, **links: str) -> Path:
    """A PATH folder holding only the named commands (name -> target)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, target in links.items():
        (folder / name).symlink_to(target)
    return folder


def checkout_copy(tmp_path: Path) -> Path:
    """tools/python.sh and tools/test.sh alone in a folder shaped like the checkout (tmp_path/repo)."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    for name in ("python.sh", "test.sh"):
        (repo / "tools" / name).write_bytes((REPO_ROOT / "tools" / name).read_bytes())
    return repo
