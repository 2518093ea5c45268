"""The generators' writes where the output folder is a mount point, which cannot be renamed (a tmpfs, a
bind mount, a volume below a read-only root): the generator swaps the folder's entries instead, and a
write killed between two swaps is completed by the next. Each test mounts in a private mount namespace
of its own (unshare, as root), never the machine's. The other write paths:
tests/test_expand_write_paths.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from expand_support import OTHER_MATRIX, repository_copy, with_code

pytestmark = pytest.mark.realpods  # root and a mount namespace


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The repository copy with its code, for `python generators/expand.py` of that checkout."""
    return with_code(repository_copy(tmp_path, monkeypatch))


MOUNT_SCRIPT = textwrap.dedent(
    """\
    import hashlib, json, pathlib, subprocess, sys
    expand, matrix, out, kind = sys.argv[1:5]
    out_p = pathlib.Path(out)

    def tree():  # the output (at a mount point its lock is a hidden file inside, not part of it)
        return {p.relative_to(out_p).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(out_p.rglob("*")) if p.is_file() and p.name != ".fsdp-gitops.lock"}

    def gen(*extra):
        r = subprocess.run([sys.executable, expand, matrix, "--out", out, *extra], capture_output=True, text=True)
        return [r.returncode, r.stderr]

    def write_matrix(runs):
        text = pathlib.Path(matrix).read_text().split("axes:")[0]
        pathlib.Path(matrix).write_text(text + "axes:\\n  rev: [" + ", ".join(map(str, range(runs))) + "]\\n")

    def sequence(name):
        # A first write, a file of the user's, then the matrix shrinks: stale runs go, the note stays.
        write_matrix(3)
        result[name + "-first"] = gen()
        (out_p / "NOTES.md").write_text("mine\\n")
        write_matrix(1)
        result[name] = gen()
        result[name + "-check"] = gen("--check")
        result[name + "-tree"] = tree()

    result = {}
    parent = str(out_p.parent)
    if kind == "read-only-parent":  # a container's volume below a read-only root
        subprocess.run(["mount", "--bind", parent, parent], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", parent], check=True)
    if kind == "bind":
        subprocess.run(["mount", "--bind", out, out], check=True)
    else:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", out], check=True)
    sequence("mounted")
    result["leftovers"] = sorted(p.name for p in out_p.iterdir() if "writing" in p.name or "replaced" in p.name)
    result["beside"] = sorted(p.name for p in out_p.parent.iterdir())
    subprocess.run(["umount", out], check=True)
    if kind == "read-only-parent":
        subprocess.run(["umount", parent], check=True)
    subprocess.run(["rm", "-rf", out], check=True)
    out_p.mkdir()
    sequence("plain")
    print(json.dumps(result))
    """
)


@pytest.mark.parametrize("kind", ["tmpfs", "bind", "read-only-parent"])
def test_a_mount_point_as_out_is_written(checkout, tmp_path, kind):
    """A mount point cannot be renamed: the generator swaps its entries instead (in a private mount
    namespace of this test, never the machine's)."""
    assert os.geteuid() == 0 and shutil.which("unshare"), (
        "this test mounts a tmpfs in a private mount namespace: run it as root with unshare (util-linux)"
    )
    out = tmp_path / "volumes" / "mnt"
    out.mkdir(parents=True)
    m = tmp_path / "m.yaml"
    m.write_text(OTHER_MATRIX)
    script = tmp_path / "mount_write.py"
    script.write_text(MOUNT_SCRIPT)
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, str(script)]
        + [str(checkout / "generators" / "expand.py"), str(m), str(out), kind],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    for name in ("mounted", "plain"):
        for step in (name + "-first", name, name + "-check"):
            assert got[step][0] == 0, (step, got[step])
        assert "0 stale deleted" not in got[name][1], got[name]
    assert got["leftovers"] == [] and got["beside"] == ["mnt"]  # nothing written beside the mount point
    assert got["mounted-tree"]["NOTES.md"] == hashlib.sha256(b"mine\n").hexdigest()
    # The tree written at the mount point is the one a plain folder gets.
    assert got["mounted-tree"] == got["plain-tree"]


KILL_SCRIPT = textwrap.dedent(
    """\
    import hashlib, json, os, pathlib, subprocess, sys
    repo, matrix, out = sys.argv[1:4]
    out_p, m = pathlib.Path(out), pathlib.Path(matrix)
    expand = [sys.executable, repo + "/generators/expand.py", matrix, "--out", out]
    # The write of the changed matrix, killed (SIGKILL) right after its first swap of an entry.
    killed = "\\n".join([
        "import os, signal, sys",
        "sys.path.insert(0, sys.argv[1])",
        "from generators.core import outdir",
        "real, calls = outdir._exchange, []",
        "def exchange(a, b):",
        "    calls.append(a)",
        "    done = real(a, b)",
        "    if len(calls) == 1:",
        "        os.kill(os.getpid(), signal.SIGKILL)",
        "    return done",
        "outdir._exchange = exchange",
        "sys.argv = sys.argv[2:]",
        "from generators import expand",
        "expand.main()",
    ])

    def tree():  # the output, without the lock and the hidden folder of a write in progress
        return {p.relative_to(out_p).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(out_p.rglob("*"))
                if p.is_file() and p.name != ".fsdp-gitops.lock"
                and not p.relative_to(out_p).parts[0].startswith(".fsdp-gitops.writing-")}

    data_line = "    data: {path: /shared/data/samsum/train.jsonl}\\n"
    base = m.read_text()

    def matrix_of(lr):
        m.write_text(base.replace(data_line, data_line + "    training: {lr: " + lr + "}\\n"))

    result = {}
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", out], check=True)
    matrix_of("1.0e-5")
    subprocess.run(expand, check=True, capture_output=True)
    result["old"] = tree()
    matrix_of("2.0e-5")
    kill = subprocess.run([sys.executable, "-c", killed, repo, "expand.py", matrix, "--out", out], capture_output=True)
    result["kill_rc"] = kill.returncode
    result["kill_err"] = kill.stderr.decode()[-800:]
    result["mix"] = tree()
    result["hidden_after_kill"] = len([p for p in out_p.iterdir() if p.name.startswith(".fsdp-gitops.writing-")])
    result["record"] = (out_p / ".fsdp-gitops-expand.files").read_text()
    result["check_rc"] = subprocess.run(expand + ["--check"], capture_output=True).returncode
    again = subprocess.run(expand, capture_output=True, text=True)
    result["again"] = [again.returncode, again.stderr]
    result["repaired"] = tree()
    result["hidden"] = sorted(p.name for p in out_p.iterdir() if p.name.startswith(".fsdp-gitops.writing-"))
    subprocess.run(["umount", out], check=True)
    subprocess.run(expand, check=True, capture_output=True)
    result["plain"] = tree()
    print(json.dumps(result))
    """
)


def test_a_write_killed_between_swaps_at_a_mount_point_is_completed_by_the_next(checkout, tmp_path):
    """At a mount point entries are swapped one by one: killed after the first, the output holds each
    file's old or new bytes, never a half-written one, and the next write makes it exactly new."""
    assert os.geteuid() == 0 and shutil.which("unshare"), (
        "this test mounts a tmpfs in a private mount namespace: run it as root with unshare (util-linux)"
    )
    out = tmp_path / "mnt"
    out.mkdir()
    m = tmp_path / "m.yaml"
    m.write_text(OTHER_MATRIX)
    script = tmp_path / "kill_write.py"
    script.write_text(KILL_SCRIPT)
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, str(script)]
        + [str(checkout), str(m), str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["kill_rc"] == -9, got["kill_err"]
    old, new, mix = got["old"], got["plain"], got["mix"]
    record = ".fsdp-gitops-expand.files"
    assert mix != old and mix != new and got["hidden_after_kill"] == 1  # some entries swapped, some not
    for path, digest in mix.items():
        assert path == record or digest in (old.get(path), new.get(path)), path
    # Until the write completes, the record owns the old files and the new ones.
    listed = {line for line in got["record"].splitlines() if not line.startswith("#")}
    assert listed == (set(old) | set(new)) - {record}
    assert got["check_rc"] == 1
    assert got["again"][0] == 0, got["again"]
    assert got["repaired"] == new and got["hidden"] == []
