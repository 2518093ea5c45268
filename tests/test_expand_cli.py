"""The expand CLI through Click's CliRunner (and once as a real process): writing, --check, --list,
stale runs, banners, determinism, and one-line errors with exit 2 that leave --out untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matrix_support import GOOD, HEADER, line_of, snapshot
from support import REPO_ROOT, cli_run

from generators.core.writer import BANNER_PREFIX
from generators.expand import main


def invoke(*args: str):
    return cli_run(main, list(args))


@pytest.fixture
def good(tmp_path: Path) -> tuple[Path, Path]:
    """A matrix file and an output directory already holding its overlays plus one hand-made file."""
    matrix = tmp_path / "m.yaml"
    matrix.write_text(GOOD)
    out = tmp_path / "out"
    result = invoke(str(matrix), "--out", str(out))
    assert result.exit_code == 0, result.output
    (out / "NOTES.md").write_text("not generated\n")
    return matrix, out


def run_dirs(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "runs" / "fsdp-p5").iterdir())


def test_write_creates_one_overlay_per_run_and_check_is_clean(good):
    matrix, out = good
    assert len(run_dirs(out)) == 4
    for d in (out / "runs" / "fsdp-p5").iterdir():
        assert sorted(f.name for f in d.iterdir()) == [
            "kustomization.yaml",
            "pytorchjob.run.yaml",
            "rbac.yaml",
            "train.yaml",
        ]
    result = invoke(str(matrix), "--out", str(out), "--check")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_every_generated_file_starts_with_the_banner_naming_generator_and_matrix(good):
    _, out = good
    files = [p for p in out.rglob("*.yaml")]
    assert len(files) >= 12
    for f in files:
        head = f.read_text().splitlines()[0]
        assert head == f"{BANNER_PREFIX} from m.yaml. Do not edit by hand:", f


def test_check_names_a_hand_edited_file_and_exits_1(good):
    matrix, out = good
    target = next((out / "runs" / "fsdp-p5").iterdir()) / "train.yaml"
    target.write_text(target.read_text().replace("num_epochs: 1", "num_epochs: 2"))
    before = snapshot(out)
    result = invoke(str(matrix), "--out", str(out), "--check")
    assert result.exit_code == 1
    rel = target.relative_to(out).as_posix()
    assert result.stdout.splitlines() == [f"differs: {out}/{rel}"]
    assert "run: python generators/expand.py" in result.stderr
    assert snapshot(out) == before  # --check writes nothing
    assert invoke(str(matrix), "--out", str(out)).exit_code == 0
    assert invoke(str(matrix), "--out", str(out), "--check").exit_code == 0


def test_check_names_missing_and_stale_files(good):
    matrix, out = good
    victim = sorted((out / "runs" / "fsdp-p5").iterdir())[0] / "kustomization.yaml"
    victim.unlink()
    matrix.write_text(GOOD.replace("nodes: [1, 2]", "nodes: [1]"))
    result = invoke(str(matrix), "--out", str(out), "--check")
    assert result.exit_code == 1
    kinds = sorted(line.split(":")[0] for line in result.stdout.splitlines())
    assert kinds.count("stale") == 8  # two removed runs x four files
    assert any(
        line.startswith("missing:") and line.endswith("kustomization.yaml") for line in result.stdout.splitlines()
    )


def test_stale_run_directories_are_deleted_and_other_files_kept(good):
    matrix, out = good
    assert len(run_dirs(out)) == 4
    matrix.write_text(GOOD.replace("model: [llama2-7b, llama2-13b]", "model: [llama2-7b]"))
    result = invoke(str(matrix), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert [d.split("-p5")[0] for d in run_dirs(out)] == ["llama2-7b", "llama2-7b"]
    assert "8 stale deleted" in result.stderr
    assert (out / "NOTES.md").read_text() == "not generated\n"
    # A directory that is not empty after the deletion (a hand-made file in it) stays, with that file.
    keep = out / "runs" / "fsdp-p5" / run_dirs(out)[0] / "notes.txt"
    keep.write_text("mine\n")
    matrix.write_text(GOOD.replace("model: [llama2-7b, llama2-13b]", "model: [llama2-13b]"))
    assert invoke(str(matrix), "--out", str(out)).exit_code == 0
    assert keep.read_text() == "mine\n"
    assert sorted(f.name for f in keep.parent.iterdir()) == ["notes.txt"]


def test_running_twice_changes_nothing_and_bytes_do_not_depend_on_the_working_directory(good, tmp_path, monkeypatch):
    matrix, out = good
    first = snapshot(out)
    result = invoke(str(matrix), "--out", str(out))
    assert "0 created, 0 updated, 0 stale deleted" in result.stderr
    assert snapshot(out) == first
    # The same output from another working directory, named by relative paths: the same bytes.
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    result = invoke("../m.yaml", "--out", "../out")
    assert result.exit_code == 0 and "0 created, 0 updated, 0 stale deleted" in result.stderr
    assert snapshot(out) == first


def test_list_prints_the_runs_and_writes_nothing(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(GOOD)
    out = tmp_path / "out"
    result = invoke(str(matrix), "--out", str(out), "--list")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "NAME",
        "CLUSTER",
        "MODEL",
        "INSTANCE",
        "TYPE",
        "NODES",
        "GPUS/NODE",
        "WORLD",
        "SHARDING",
        "ACT.",
        "CKPT",
        "EST.",
        "GIB/GPU",
    ]
    assert len(lines) == 5
    assert lines[4].split()[1:8] == ["fsdp-p5", "llama2-13b", "p5.48xlarge", "2", "8", "16", "FULL_SHARD"]
    assert lines[4].split()[8] in ("none", "selective", "full")  # `auto` is resolved per run
    assert float(lines[4].split()[9]) < 80
    assert not out.exists()


def test_the_committed_overlays_match_the_seed_matrix():
    result = invoke(str(REPO_ROOT / "matrix.yaml"), "--check")
    assert result.exit_code == 0, result.stdout + result.stderr


def test_runs_as_a_script_from_another_directory_without_importing_torch(tmp_path):
    script = REPO_ROOT / "generators" / "expand.py"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), str(REPO_ROOT / "matrix.yaml"), "--list"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 31
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "generators.plan" in imported
    assert not {m for m in imported if m == "torch" or m.startswith("torch.")}


# --------------------------------------------------------------------------------------------
# Bad input: one line on stderr with file, line, key and fix; exit 2; no traceback; --out untouched.

BAD_CASES = {
    # name: (matrix text, text on the offending line, key in the message)
    "yaml-syntax": (GOOD.replace("nodes: [1, 2]", "nodes: [1, 2"), None, None),
    "empty-file": ("", None, "(top level)"),
    "top-level-list": ("- fsdp\n- gitops\n", "- fsdp", "(top level)"),
    "duplicate-top-level": (GOOD + "axes: {nodes: [4]}\n", "axes: {nodes: [4]}", "axes"),
    "duplicate-nested": (
        GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  cluster: fsdp-p5\n"),
        None,
        "defaults.cluster",
    ),
    "anchor": (GOOD.replace("defaults:", "defaults: &d"), "defaults: &d", "defaults"),
    "alias": (GOOD + "include:\n  - *d\n", "*d", "include[0]"),
    "unknown-top-level": (GOOD + "excludes: []\n", "excludes:", "excludes"),
    "unknown-run-field": (
        GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  node: 1\n"),
        "node: 1",
        "defaults.node",
    ),
    "unknown-trainer-key": (GOOD.replace("      path:", "      paht:"), "paht:", "defaults.trainer.data.paht"),
    "unknown-cluster-key": (
        GOOD.replace("    region: us-west-2", "    zone: us-west-2"),
        "zone:",
        "clusters.fsdp-p5.zone",
    ),
    "wrong-type": (GOOD.replace("nodes: [1, 2]", "nodes: [1, '2']"), "nodes: [1, '2']", "axes.nodes[1]"),
    "wrong-trainer-type": (
        GOOD.replace("nodes: [1, 2]", "nodes: [1, 2]\n  trainer.training.num_epochs: [five]"),
        "num_epochs: [five]",
        "axes.trainer.training.num_epochs[0]",
    ),
    "unknown-model": (GOOD.replace("llama2-13b]", "llama2-130b]"), "llama2-130b]", "axes.model[1]"),
    "unknown-instance-type": (
        GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  instance_type: p5.xlarge\n"),
        "instance_type: p5.xlarge",
        "defaults.instance_type",
    ),
    "unknown-cluster": (
        GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p9\n"),
        "cluster: fsdp-p9",
        "defaults.cluster",
    ),
    "nodes-below-1": (GOOD.replace("nodes: [1, 2]", "nodes: [0, 2]"), "nodes: [0, 2]", "axes.nodes[0]"),
    "gpus-above-instance": (
        GOOD.replace("  cluster: fsdp-p5\n", "  cluster: fsdp-p5\n  gpus_per_node: 9\n"),
        "gpus_per_node: 9",
        "defaults.gpus_per_node",
    ),
    "hybrid-group": (
        GOOD.replace(
            "nodes: [1, 2]",
            "nodes: [1, 2]\n  trainer.parallelism:\n    - {sharding_strategy: HYBRID_SHARD, shard_group_size: 16}",
        ),
        "shard_group_size: 16",
        "axes.trainer.parallelism[0].shard_group_size",
    ),
    "same-name-twice": (
        GOOD + "include:\n  - {model: llama2-13b, nodes: 1}\n",
        "- {model: llama2-13b, nodes: 1}",
        "include[0]",
    ),
    "does-not-fit": (GOOD.replace("llama2-13b]", "llama2-70b]"), "nodes: [1, 2]", "axes.nodes[0]"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_line_exit_2_and_leaves_out_untouched(good, case):
    matrix, out = good
    text, needle, key = BAD_CASES[case]
    matrix.write_text(text)
    before = snapshot(out)
    result = invoke(str(matrix), "--out", str(out))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert "Traceback" not in line
    assert line.startswith(f"error: {matrix}:")
    assert "; fix: " in line
    if needle is not None:
        assert line.startswith(f"error: {matrix}:{line_of(text, needle)}: "), line
    if key is not None:
        assert f": {key}: " in line, line
    if case == "yaml-syntax":
        assert int(line.split(":")[2]) >= line_of(text, "nodes: [1, 2")
    assert snapshot(out) == before


def test_out_pointing_at_a_file_is_a_usage_error(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(GOOD)
    target = tmp_path / "overlays.txt"
    target.write_text("keep\n")
    result = invoke(str(matrix), "--out", str(target))
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: --out {target}: is a file, not a directory; fix: ")
    assert target.read_text() == "keep\n"


def test_missing_matrix_file_and_conflicting_options(tmp_path):
    result = invoke(str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert (
        result.stderr == f"error: {tmp_path / 'nope.yaml'}: MATRIX: file not found; "
        "fix: pass the path of an existing matrix file, e.g. matrix.yaml\n"
    )
    matrix = tmp_path / "m.yaml"
    matrix.write_text(HEADER)
    result = invoke(str(matrix), "--check", "--list")
    assert (result.exit_code, len(result.stderr.splitlines())) == (2, 1)
    assert not (tmp_path / "o").exists()


def test_non_ascii_matrix_file_name_is_bad_input(tmp_path):
    matrix = tmp_path / "matr\u00efx.yaml"
    matrix.write_text(GOOD)
    result = invoke(str(matrix), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "a generated banner cannot carry" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["m\nkind: Secret\n.yaml", "m-->x.yaml", "m x.yaml"])
def test_a_matrix_file_name_that_would_break_a_banner_is_bad_input(tmp_path, name):
    """A name holding a newline would paste YAML into every generated file through the banner."""
    matrix = tmp_path / name
    matrix.write_text(GOOD)
    result = invoke(str(matrix), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()
