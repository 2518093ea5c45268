"""Hostile input is one line and exit 2, never a traceback, and nothing on disk changes: matrices whose
product is huge (refused at load, before any expansion), files that are not regular or too large,
control characters, deep nesting, and values that would pass here and fail later on the cluster."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from matrix_support import GOOD, HEADER, load
from support import cli_run

from generators import cluster, expand, report
from generators.core.errors import InputError

RUNS = """\
defaults:
  cluster: fsdp-p5
  model: tiny
  nodes: 1
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
"""


def tree(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def refused(command, args: list[str], out: Path) -> str:
    """Run a command that must refuse: exit 2, one line naming a fix, the output tree unchanged."""
    before = tree(out)
    result = cli_run(command.main, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "fix: " in lines[0], result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert tree(out) == before
    return lines[0]


@pytest.fixture
def out(tmp_path: Path, cli) -> Path:
    """An output directory already holding a good matrix's overlays."""
    m = tmp_path / "good.yaml"
    m.write_text(GOOD)
    target = tmp_path / "out"
    assert cli(expand.main, [str(m), "--out", str(target)]).exit_code == 0
    return target


@pytest.mark.parametrize("values, total", [(10, "1,000,000"), (1000, "1,000,000,000")])
def test_a_huge_product_is_refused_at_load_before_expansion(values, total):
    axes = "axes:\n" + "".join(
        f"  trainer.training.{k}: [{', '.join(str(i + 1) for i in range(values))}]\n"
        for k in ("seed", "num_epochs", "batch_size_per_gpu")[: 6 if values == 10 else 3]
    )
    if values == 10:
        axes += "".join(f"  {k}: [{', '.join(str(60 + i) for i in range(10))}]\n" for k in ("active_deadline_s",))
        axes += (
            "  rev: ["
            + ", ".join(str(i) for i in range(10))
            + "]\n  shm_size_gib: ["
            + ", ".join(str(i + 1) for i in range(10))
            + "]\n"
        )
    with pytest.raises(InputError) as info:
        load(HEADER + RUNS + axes)
    assert f"{total} runs" in str(info.value) and "cap" in str(info.value) and info.value.key == "axes"


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory", "too-large"])
def test_inputs_that_are_not_sane_files_are_refused(tmp_path, out, kind):
    if kind == "dev-zero":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "pipe.yaml")
        os.mkfifo(path)
    elif kind == "directory":
        path = str(tmp_path)
    else:
        path = str(tmp_path / "big.yaml")
        Path(path).write_text(GOOD + "#" * (5 * 1024 * 1024) + "\n")
    for command, args in ((expand, [path, "--out", str(out)]), (cluster, [path, "--out", str(out)]), (report, [path])):
        line = refused(command, args, out)
        assert path in line


@pytest.mark.parametrize(
    "text, fragment",
    [
        (GOOD.replace("cluster: fsdp-p5", 'cluster: "fsdp\\x07p5"'), "control character"),
        (GOOD.replace("branch: main", 'branch: "ma\\x1bin"'), "control character"),
        (GOOD + "include:\n  - " + "{a: " * 200 + "1" + "}" * 200 + "\n", "nested deeper than"),
        (GOOD + "include:\n  - trainer: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than"),
        (GOOD.replace("branch: main", "branch: 2024-13-45"), "cannot be read as YAML"),
        (GOOD.replace("branch: main", "branch: \x01main"), "YAML error"),
    ],
)
def test_loader_errors_are_one_line(tmp_path, out, text, fragment):
    m = tmp_path / "m.yaml"
    m.write_text(text)
    for command in (expand, cluster):
        assert fragment in refused(command, [str(m), "--out", str(out)], out)


@pytest.mark.parametrize(
    "edit, key",
    [
        (("  nodes: 1\n", "  nodes: 1\n  active_deadline_s: 9223372036854775808\n"), "defaults.active_deadline_s"),
        (("  nodes: 1\n", "  nodes: 2147483648\n"), "defaults.nodes"),
        (("  nodes: 1\n", "  nodes: 1\n  rev: 99999999999\n"), "defaults.rev"),
        (
            ("    region: us-west-2\n", "    region: us-west-2\n    max_nodes: 4294967296\n"),
            "clusters.fsdp-p5.max_nodes",
        ),
        (
            ("    region: us-west-2\n", "    region: us-west-2\n    namespace: kube-system\n"),
            "clusters.fsdp-p5.namespace",
        ),
        (
            ("    region: us-west-2\n", "    region: us-west-2\n    namespace: flux-system\n"),
            "clusters.fsdp-p5.namespace",
        ),
        (("  branch: main\n", "  branch: main..release\n"), "repository.branch"),
        (("  branch: main\n", "  branch: -main\n"), "repository.branch"),
        (("  branch: main\n", "  branch: main.lock\n"), "repository.branch"),
        (("  branch: main\n", '  branch: "a~1"\n'), "repository.branch"),
        (("    data:", "    training: {lr: .inf}\n    data:"), "defaults.trainer.training.lr"),
        (("    data:", "    training: {lr: .nan}\n    data:"), "defaults.trainer.training.lr"),
        (
            ("    data:", "    training: {max_steps: 99999999999999999999}\n    data:"),
            "defaults.trainer.training.max_steps",
        ),
        (("    data:", "    metrics: {prometheus_port: 29400}\n    data:"), "defaults.trainer.metrics.prometheus_port"),
    ],
)
def test_values_that_would_fail_on_the_cluster_are_refused_naming_the_key(tmp_path, out, edit, key):
    text = (HEADER + RUNS + "axes:\n  rev: [0]\n").replace(*edit)
    assert text != HEADER + RUNS + "axes:\n  rev: [0]\n"
    m = tmp_path / "m.yaml"
    m.write_text(text)
    line = refused(expand, [str(m), "--out", str(out)], out)
    assert f": {key}: " in line


def test_a_refusal_stays_small_in_memory(tmp_path):
    """The 10^9-run matrix is refused by a process whose resident memory never passes 100 MiB."""
    import subprocess
    import sys

    axes = "axes:\n" + "".join(
        f"  trainer.training.{k}: [{', '.join(str(i + 1) for i in range(1000))}]\n"
        for k in ("seed", "num_epochs", "batch_size_per_gpu")
    )
    m = tmp_path / "huge.yaml"
    m.write_text(HEADER + RUNS + axes)
    # The command runs in a fresh interpreter, which then reports its own peak (VmHWM: this process
    # only, unlike getrusage, which also counts the forked copy of the test process).
    code = (
        "import sys\nfrom generators.expand import main\n"
        "try:\n    main([sys.argv[1], '--out', sys.argv[2]])\nexcept SystemExit as e:\n    code = e.code\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print(code, hwm)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(m), str(tmp_path / "out")], capture_output=True, text=True, check=False
    )
    exit_code, peak_kib = done.stdout.split()
    assert exit_code == "2" and "1,000,000,000 runs" in done.stderr
    assert int(peak_kib) < 100 * 1024
    assert not (tmp_path / "out").exists()


def test_a_results_line_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "\n")
    assert "deep.jsonl:1: nested too deeply" in refused(report, [str(path)], tmp_path)
