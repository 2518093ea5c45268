"""The validator resolves every Kueue reference of a cluster: a job's queue label -> a LocalQueue of its
namespace -> a ClusterQueue -> ResourceFlavors, and Kueue's frameworks cover each queued kind. Each
reference that resolves to nothing would leave a run suspended for good, so each is a finding that
names the file and the fix. The real pipeline over a copy of the repository, one mistake at a time."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from generators.core.gotools import REPO_ROOT
from generators.validation import pipeline, schemas

CLUSTER = "fsdp-p5"
SCOPE = [f"overlays/infrastructure/{CLUSTER}", f"overlays/runs/{CLUSTER}"]
QUEUES = "base/components/kueue/queues/queues.yaml"
RELEASE = "base/components/kueue/controller/release.yaml"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for top in ("base", "overlays"):
        shutil.copytree(REPO_ROOT / top, root / top)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def replace_once(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert text.count(old) == 1, f"{old!r} moved"
        return text.replace(old, new)

    return edit


def problems_with(repo: Path, file: str, edit: Callable[[str], str]) -> list[str]:
    path = repo / file
    original = path.read_text()
    path.write_text(edit(original))
    try:
        report = pipeline.validate(repo, SCOPE, crd_dir=schemas.default_crd_dir())
    finally:
        path.write_text(original)
    return [str(p) for p in report.problems]


@pytest.mark.gotools
def test_the_committed_cluster_resolves_every_reference(repo: Path) -> None:
    report = pipeline.validate(repo, SCOPE, crd_dir=schemas.default_crd_dir())
    assert [str(p) for p in report.problems if "Kueue" in p.message or "Queue" in p.message] == []


@pytest.mark.gotools
@pytest.mark.parametrize(
    ("file", "edit", "expected", "blamed"),
    [
        # The LocalQueue is renamed: every run's label (and the pre-flight Jobs') names nothing.
        (
            QUEUES,
            replace_once("kind: LocalQueue\nmetadata:\n  name: fsdp\n", "kind: LocalQueue\nmetadata:\n  name: gpu\n"),
            "the queue label names LocalQueue fsdp in namespace fsdp, which the cluster's builds do not create",
            "overlays/",
        ),
        # The LocalQueue points at a ClusterQueue that does not exist.
        (
            QUEUES,
            replace_once("  clusterQueue: fsdp\n", "  clusterQueue: fsdp-main\n"),
            "LocalQueue fsdp/fsdp names ClusterQueue fsdp-main, which the cluster's builds do not create",
            QUEUES,
        ),
        # The ClusterQueue's flavor is misspelt.
        (
            QUEUES,
            replace_once("        - name: gpu-nodes\n", "        - name: gpu-node\n"),
            "ClusterQueue fsdp names ResourceFlavor gpu-node, which the cluster's builds do not create",
            QUEUES,
        ),
        # Kueue's frameworks lose batch/job: the queued NCCL pre-flight Jobs would start outside the quota.
        (
            RELEASE,
            replace_once("            - batch/job\n", ""),
            "Kueue's integrations.frameworks lacks batch/job, so the queue label of this Job is ignored",
            "overlays/infrastructure/",
        ),
    ],
)
def test_an_unresolved_kueue_reference_names_the_file_and_the_fix(
    repo: Path, file: str, edit: Callable[[str], str], expected: str, blamed: str
) -> None:
    found = problems_with(repo, file, edit)
    hits = [p for p in found if expected in p]
    assert hits, found
    assert all(p.startswith(blamed) and "; fix: " in p and "\n" not in p for p in hits), hits


@pytest.mark.gotools
def test_a_queued_trainjob_is_refused_with_the_reason(tmp_path: Path) -> None:
    # The two-API example expanded, with a TrainJob given the queue label by hand.
    root = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "base", root / "base")
    subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "generators/expand.py"),
            str(REPO_ROOT / "examples/matrix-two-apis.yaml"),
            "--out",
            str(root / "overlays"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (job,) = [p for p in (root / "overlays/runs/fsdp-p5").glob("*-n2-*/trainjob.yaml")]
    text = job.read_text()
    job.write_text(
        text.replace(
            "    app.kubernetes.io/part-of: fsdp-gitops\n",
            "    app.kubernetes.io/part-of: fsdp-gitops\n    kueue.x-k8s.io/queue-name: fsdp\n",
            1,
        )
    )
    report = pipeline.validate(
        root, ["overlays/infrastructure/fsdp-p5", "overlays/runs/fsdp-p5"], crd_dir=schemas.default_crd_dir()
    )
    hits = [str(p) for p in report.problems if "a TrainJob queued with Kueue never starts" in p.message]
    assert len(hits) == 1 and hits[0].startswith(str(job.relative_to(root))), [str(p) for p in report.problems]
    assert "fix: kueue: false for this cluster in the matrix" in hits[0]
