"""Every write path of the generators refuses an output folder whose write would delete or overwrite
files the same command does not own, as the user meets it: the commands run against a copy of the
repository's committed overlays/ and docs/generated/ (in process, with the commands' repository
root pointed at the copy; the script itself, `python generators/<command>.py` of a copied checkout,
where the case is the one users report and for the mount points). Each refusal is exit 2, one line
naming the folder and the fix, and every file of the copy and of the folders named is byte for byte
what it was. At a mount point (root, a private mount namespace):
tests/cluster/test_expand_mount_points.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from expand_support import OTHER_MATRIX, repository_copy, with_code
from support import cli_run


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """expand_support.repository_copy: the commands (in process) take the copy for their repository."""
    return repository_copy(tmp_path, monkeypatch)


@pytest.fixture
def checkout(repo: Path) -> Path:
    """`repo` with the code beside it, for `python generators/<command>.py` of that checkout."""
    return with_code(repo)


def snapshot(*roots: Path) -> dict[str, str]:
    """Every path under the roots with a hash of each file's bytes (folders as "dir")."""
    seen: dict[str, str] = {}
    for root in roots:
        if not root.exists():
            continue
        for p in sorted(root.rglob("*")):
            key = p.as_posix()
            seen[key] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return seen


@dataclass(frozen=True)
class Ran:
    returncode: int
    stderr: str


def run(repo: Path, command: str, *args: object) -> Ran:
    """A command in process, on the `repo` fixture's copy."""
    from generators import cluster, expand

    # Never the checkout's own outputs: the fixture pointed the commands at the copy.
    assert expand.DEFAULT_OUT.is_relative_to(repo) and cluster.DEFAULT_OUT.is_relative_to(repo)
    result = cli_run({"expand": expand, "cluster": cluster}[command].main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return Ran(result.exit_code, result.stderr)


def run_script(repo: Path, command: str, *args: object) -> Ran:
    """`python generators/<command>.py ...` of the `checkout` fixture's copy, run from it."""
    done = subprocess.run(
        [sys.executable, str(repo / "generators" / f"{command}.py"), *map(str, args)],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
    )
    return Ran(done.returncode, done.stderr)


def assert_refused(result: Ran, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "; fix: " in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def test_the_repository_matrix_rewrites_its_own_committed_output(repo):
    """The committed records are this matrix's: regenerating keeps every record's header."""
    for command in ("expand", "cluster"):
        result = run(repo, command, "matrix.yaml")
        assert result.returncode == 0, result.stderr
    for record, output in (
        ("overlays/.fsdp-gitops-expand.files", "overlays"),
        ("docs/generated/.fsdp-gitops-expand.files", "plan document"),
        ("overlays/provisioning/.fsdp-gitops-cluster.files", "provisioning"),
    ):
        assert (repo / record).read_text().splitlines()[1:3] == [f"# output: {output}", "# matrix: matrix.yaml"]
    assert run(repo, "expand", "matrix.yaml", "--check").returncode == 0
    assert run(repo, "cluster", "matrix.yaml", "--check").returncode == 0


def test_records_without_header_lines_are_adopted_by_the_matrix_their_files_name(repo):
    """Records written before they named their output and matrix: the repository's name matrix.yaml."""
    records = [repo / "overlays/.fsdp-gitops-expand.files", repo / "docs/generated/.fsdp-gitops-expand.files"]
    for record in records:
        lines = record.read_text().splitlines()
        record.write_text("\n".join(line for line in lines if not line.startswith(("# output:", "# matrix:"))) + "\n")
    before = snapshot(repo)
    assert_refused(run(repo, "expand", "other-matrix.yaml"), "--out overlays", "matrix.yaml")
    assert_refused(run(repo, "expand", "matrix.yaml", "--out", "elsewhere", "--plan-out", "overlays"), "--plan-out")
    assert snapshot(repo) == before
    result = run(repo, "expand", "matrix.yaml")
    assert result.returncode == 0, result.stderr
    assert all("# matrix: matrix.yaml" in r.read_text().splitlines() for r in records)


@pytest.mark.parametrize("command", ["expand", "cluster"])
def test_another_matrix_into_the_committed_output_is_refused(checkout, command):
    """`python generators/expand.py other-matrix.yaml` once deleted ~150 files of matrix.yaml's overlays/."""
    repo = checkout
    before = snapshot(repo)
    line = assert_refused(run_script(repo, command, "other-matrix.yaml"), "--out", "matrix.yaml", "another folder")
    assert "overlays" in line
    assert snapshot(repo) == before


def test_another_matrix_into_another_matrix_output_elsewhere_is_refused(repo, tmp_path):
    out = tmp_path / "mine"
    assert run(repo, "expand", "matrix.yaml", "--out", out).returncode == 0
    before = snapshot(repo, out)
    assert_refused(run(repo, "expand", "other-matrix.yaml", "--out", out), f"--out {out}", "matrix.yaml")
    assert snapshot(repo, out) == before
    # --check says the same instead of listing the other matrix's files as stale.
    assert_refused(run(repo, "expand", "other-matrix.yaml", "--out", out, "--check"), f"--out {out}")


@pytest.mark.parametrize(
    "args",
    [
        ["--plan-out", "overlays"],
        ["--out", "overlays", "--plan-out", "overlays"],
        ["--out", "{tmp}/both", "--plan-out", "{tmp}/both"],
        ["--out", "{tmp}/o", "--plan-out", "{tmp}/o/docs"],
        ["--out", "{tmp}/o/overlays", "--plan-out", "{tmp}/o"],
    ],
    ids=["plan-out-overlays", "both-overlays", "both-new", "plan-inside-out", "out-inside-plan"],
)
def test_out_and_plan_out_in_one_folder_are_refused(repo, tmp_path, args):
    args = [a.format(tmp=tmp_path) for a in args]
    before = snapshot(repo, tmp_path / "both", tmp_path / "o")
    assert_refused(run(repo, "expand", "matrix.yaml", *args), "--out", "--plan-out", args[-1])
    assert snapshot(repo, tmp_path / "both", tmp_path / "o") == before


def test_plan_out_into_committed_overlays_from_elsewhere_is_refused(repo, tmp_path):
    before = snapshot(repo)
    out = tmp_path / "o"
    assert_refused(run(repo, "expand", "matrix.yaml", "--out", out, "--plan-out", "overlays"), "--plan-out overlays")
    assert snapshot(repo) == before and not out.exists()


@pytest.mark.parametrize(
    ("command", "out"),
    [
        ("expand", "overlays/runs/fsdp-p5"),
        ("expand", "overlays/runs"),
        ("expand", "overlays/clusters/fsdp-p4de"),
        ("cluster", "overlays/runs/fsdp-p5"),
        ("cluster", "overlays/provisioning/fsdp-p5"),
        ("expand", "overlays/provisioning/fsdp-p5"),
    ],
)
def test_an_out_nested_inside_another_output_is_refused(repo, command, out):
    before = snapshot(repo)
    assert_refused(run(repo, command, "matrix.yaml", "--out", out), f"--out {out}", "inside")
    assert snapshot(repo) == before


def test_an_out_that_holds_another_output_it_would_write_into_is_refused(repo, tmp_path):
    out = tmp_path / "o"
    nested = out / "runs" / "fsdp-p5"
    assert run(repo, "expand", "other-matrix.yaml", "--out", nested).returncode == 0
    before = snapshot(repo, out)
    assert_refused(run(repo, "expand", "matrix.yaml", "--out", out), f"--out {out}", "runs/fsdp-p5")
    assert snapshot(repo, out) == before


@pytest.mark.parametrize(
    ("option", "value"),
    [("--out", "matrix.yaml"), ("--out", "matrix.yaml/o"), ("--plan-out", "matrix.yaml/docs/deeper")],
)
def test_a_path_at_or_below_a_regular_file_is_refused(repo, option, value):
    before = snapshot(repo)
    extra = ["--out", "o"] if option == "--plan-out" else []
    assert_refused(run(repo, "expand", "matrix.yaml", *extra, option, value), f"{option} {value}", "choose a folder")
    assert_refused(run(repo, "cluster", "matrix.yaml", "--out", value), f"--out {value}", "choose a folder")
    assert snapshot(repo) == before


@pytest.mark.parametrize(
    "name", ["a\nb.yaml", "a#b.yaml", "a: b.yaml", "a\n#b: c.yaml", "a-->b.yaml", "x: #y/m.yaml", "x\ny/m.yaml"]
)
def test_a_matrix_name_that_would_inject_into_a_banner_is_refused(repo, tmp_path, name):
    """Banners name the matrix by its path in the repository (folders included), or its file name."""
    m = repo / name
    m.parent.mkdir(exist_ok=True)
    m.write_text((repo / "matrix.yaml").read_text())
    out = tmp_path / "o"
    before = snapshot(repo)
    assert_refused(run(repo, "expand", name, "--out", out), "rename the matrix file")
    assert snapshot(repo) == before and not out.exists()


def test_an_out_with_yaml_syntax_in_its_name_is_written_escaped(repo):
    """The output's place in the repository becomes Flux paths: quoted, so they load back unchanged."""
    out = repo / "odd: #name"
    result = run(repo, "expand", "matrix.yaml", "--out", out)
    assert result.returncode == 0, result.stderr
    paths = set()
    for f in (out / "clusters").rglob("*.yaml"):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "Kustomization" and "path" in doc.get("spec", {}):
                paths.add(doc["spec"]["path"])
    odd = {p for p in paths if "odd" in p}
    assert odd and all(p.startswith("./odd: #name/") for p in odd), paths


def test_a_matrix_path_with_line_breaks_stays_one_header_line_of_the_record(repo, tmp_path):
    """A matrix outside the repository is named by its absolute path in the record: quoted, so a folder
    name cannot add a line or a header there, and the same matrix reads its own record back."""
    folder = tmp_path / "odd\n# matrix: matrix.yaml\nx: y"
    folder.mkdir()
    m = folder / "m.yaml"
    m.write_text(OTHER_MATRIX)
    out = tmp_path / "o"
    assert run(repo, "expand", m, "--out", out).returncode == 0
    lines = (out / ".fsdp-gitops-expand.files").read_text().splitlines()
    assert lines[1:3] == ["# output: overlays", "# matrix: " + json.dumps(str(m))]
    assert not [line for line in lines[3:] if line.startswith("#") or ":" in line]
    again = run(repo, "expand", m, "--out", out, "--check")
    assert again.returncode == 0, again.stderr
    before = snapshot(out)
    assert_refused(run(repo, "expand", "matrix.yaml", "--out", out), "the overlays of")
    assert snapshot(out) == before
