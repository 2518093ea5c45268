"""The shared volume's footprint (generators/plan/footprint.py): `expand.py --plan` shows it per cluster
and per run, and `expand.py` and `validate.py` refuse a matrix that overflows a cluster's volume, in
one line naming the setting, the largest runs and the fix, with nothing on disk changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from matrix_support import line_of, load, plans, snapshot
from support import REPO_ROOT, crd_schemas

from generators.expand import main as expand_main
from generators.matrix import expand
from generators.plan.footprint import cluster_footprints
from trainer.catalog import MODELS
from trainer.storage import checkpoint_bytes

GIB = 1024**3


def matrix_text(runs: str, shared_storage_gib: int = 1200, max_nodes: int = 16) -> str:
    return f"""\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository:
  url: https://github.com/example-org/fsdp-gitops
  branch: main
clusters:
  c1:
    region: us-west-2
    availability_zones: [us-west-2a]
    instance_types: [p5.48xlarge]
    max_nodes: {max_nodes}
    shared_storage_gib: {shared_storage_gib}
defaults:
  cluster: c1
  trainer:
    data:
      path: /shared/data/samsum/train.jsonl
    checkpoint:
      interval_steps: 200
{runs}"""


SMALL = "axes:\n  model: [llama2-7b]\n  nodes: [1, 2]\n"
# A 70B run: three checkpoints of 771 GiB while it trains (keep_last 2), on a 1,200 GiB volume.
LARGE = "axes:\n  model: [llama2-7b, llama2-70b]\n  nodes: [4]\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    return path


def test_a_matrix_that_fits_is_written_and_its_plan_shows_the_footprint(cli, tmp_path):
    matrix = write(tmp_path, matrix_text(SMALL))
    out = tmp_path / "out"
    written = cli(expand_main, [matrix, "--out", out])
    assert written.exit_code == 0, written.output
    assert (out / "infrastructure" / "c1" / "configs" / "pvc.yaml").is_file()

    shown = cli(expand_main, [matrix, "--plan"])
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "Shared volume (PVC fsdp-shared at /shared)" in text
    # The cluster's row of the footprint table (the totals table has a row for c1 too).
    row = next(line for line in text.splitlines() if line.startswith("| c1 ") and line.count("|") == 10)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # cluster, volume, kept, in flight (runs), start room, model cache (models), datasets, footprint, fits
    assert cells[0] == "c1" and cells[1] == "1,200" and cells[-1] == "yes", row
    assert cells[3] == "0.0 (0)" and cells[5].endswith("(1)"), row
    # The two 7B runs keep one checkpoint each (they end before their first interval save).
    for p in plans(matrix.read_text()):
        (run_row,) = [line for line in text.splitlines() if line.startswith("| c1 ") and f"| {p.name} " in line]
        assert "(1 kept)" in run_row, run_row


def test_a_matrix_that_overflows_a_volume_is_refused_in_one_line_and_nothing_changes(cli, tmp_path):
    text = matrix_text(LARGE)
    matrix = write(tmp_path, text)
    out = tmp_path / "out"
    ok = cli(expand_main, [write(tmp_path, matrix_text(SMALL)), "--out", out])
    assert ok.exit_code == 0, ok.output
    before = snapshot(out)
    matrix.write_text(text)

    for args in ([matrix, "--out", out], [matrix, "--out", out, "--check"]):
        result = cli(expand_main, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        line = lines[0]
        assert "Traceback" not in result.output
        assert f"matrix.yaml:{line_of(text, 'shared_storage_gib')}: clusters.c1.shared_storage_gib" in line, line
        large = next(p.name for p in plans(text) if p.model == "llama2-70b")
        assert large in line and "1,200 GiB" in line, line
        assert "raise clusters.c1.shared_storage_gib to 4800" in line, line
        assert "lower trainer.checkpoint.keep_last" in line and "export" in line, line
    assert snapshot(out) == before

    # --plan shows the overflow and exits 1 with the same line.
    shown = cli(expand_main, [matrix, "--plan"])
    assert shown.exit_code == 1, shown.output
    assert "NO: needs 4,800" in shown.stdout and "c1 DOES NOT FIT" in shown.stdout
    assert "clusters.c1.shared_storage_gib" in shown.stderr

    # The fix it names makes the matrix fit.
    matrix.write_text(matrix_text(LARGE, shared_storage_gib=4800))
    fixed = cli(expand_main, [matrix, "--out", out])
    assert fixed.exit_code == 0, fixed.output


def test_validate_refuses_a_committed_matrix_that_overflows(tmp_path):
    text = matrix_text(LARGE)
    write(tmp_path, text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    before = snapshot(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "generators" / "validate.py"), "matrix.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"matrix.yaml:{line_of(text, 'shared_storage_gib')}: clusters.c1.shared_storage_gib" in lines[0]
    assert "raise clusters.c1.shared_storage_gib to 4800" in lines[0]
    assert snapshot(tmp_path) == before


def test_lowering_keep_last_lowers_what_a_run_needs_while_it_trains():
    two, one = (
        cluster_footprints(m, plans(text))[0]
        for text in (matrix_text(LARGE), matrix_text(LARGE + "  trainer.checkpoint.keep_last: [1]\n"))
        for m in [load(text)]
    )
    large_two = next(r for r in two.runs if "70b" in r.name)
    large_one = next(r for r in one.runs if "70b" in r.name)
    assert large_two.start_gib == pytest.approx(3 * large_two.checkpoint_gib)
    assert large_one.start_gib == pytest.approx(2 * large_one.checkpoint_gib)
    assert one.total_gib < two.total_gib


def test_the_runs_that_may_train_at_once_fit_the_node_group():
    # max_nodes 4: the 7B run on 4 nodes, or both 13B runs on 2 nodes each; the 13B pair holds more
    # (1,000 steps save 5 times: each holds keep_last + 1 checkpoints while it trains, keep_last after).
    runs = (
        "  trainer.training.max_steps: 1000\n"
        "include:\n  - {model: llama2-7b, nodes: 4}\n  - {model: llama2-13b, nodes: 2}\n"
        "  - {model: llama2-13b, nodes: 2, rev: 1}\n"
    )
    text = matrix_text(runs, shared_storage_gib=2400, max_nodes=4)
    m = load(text)
    fp = cluster_footprints(m, plans(text))[0]
    assert sorted(r.nodes for r in fp.runs if r.name in fp.in_flight) == [2, 2]
    assert fp.in_flight_gib == pytest.approx(sum(r.checkpoint_gib for r in fp.runs if r.nodes == 2))
    assert all(r.kept_checkpoints == 2 for r in fp.runs)
    # The start room: the largest run's third checkpoint, counted once.
    assert fp.start_gib == pytest.approx(max(r.checkpoint_gib for r in fp.runs))
    # The model cache counts each model once, in bf16.
    assert fp.model_cache_gib == pytest.approx(
        2 * (MODELS["llama2-7b"].num_params + MODELS["llama2-13b"].num_params) / GIB
    )


def test_a_checkpoint_is_the_size_the_trainer_checks_for():
    # 80.9 GB for Llama-2-7B with fp32 moments on 8 ranks (measured: trainer/storage.py).
    text = matrix_text("axes:\n  model: [llama2-7b]\n  nodes: [1]\n")
    fp = cluster_footprints(load(text), plans(text))[0]
    (run,) = fp.runs
    assert run.checkpoint_gib * GIB == checkpoint_bytes(MODELS["llama2-7b"], False, 8, 8)
    assert run.checkpoint_gib * GIB / 1e9 == pytest.approx(80.9, abs=0.05)


def test_the_seed_matrix_fits_its_volumes(cli):
    m = load((REPO_ROOT / "matrix.yaml").read_text(), "matrix.yaml")
    footprints = cluster_footprints(m, plans((REPO_ROOT / "matrix.yaml").read_text()))
    assert [fp.cluster for fp in footprints] == list(m.clusters)
    assert all(fp.fits for fp in footprints), [(fp.cluster, fp.total_gib, fp.size_gib) for fp in footprints]
    assert len(expand(m)) == sum(len(fp.runs) for fp in footprints)
    shown = cli(expand_main, [REPO_ROOT / "matrix.yaml", "--plan"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.count(" yes |") == len(footprints)


@pytest.mark.gotools
def test_validate_passes_the_seed_matrix():
    proc = subprocess.run(
        [sys.executable, "generators/validate.py", "--crd-schemas", str(crd_schemas()), "matrix.yaml"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(": OK")


def test_the_footprint_needs_no_torch():
    # The plan workflow runs the generators with click and PyYAML alone (requirements/generator.txt).
    code = "import sys; import generators.expand, generators.validate; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False", proc.stderr
