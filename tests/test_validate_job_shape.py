"""The validator holds each job's shape to what its API does with it: torchrun's --nnodes against the
pods the job makes (PyTorchJob replicas, TrainJob numNodes), the c10d rendezvous endpoint against the
first pod's name under that API, and a TrainJob's runtimeRef.apiGroup against the Trainer's own. The real
pipeline over copies of the committed overlays and of the two-API example, one mistake at a time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import generated_copy

from generators.core.gotools import REPO_ROOT
from generators.validation import pipeline, schemas


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base/ and the two-API example's overlays (a pytorchjob cluster fsdp-p4de, a trainjob one fsdp-p5)."""
    return generated_copy(tmp_path_factory.mktemp("repo"), (REPO_ROOT / "examples/matrix-two-apis.yaml").read_text())


def run_file(repo: Path, cluster: str, name: str) -> Path:
    (path,) = (repo / "overlays" / "runs" / cluster).glob(f"*-n2-*/{name}")
    return path


def scope(repo: Path, run: Path) -> list[str]:
    """The run and its cluster's configs (where a trainjob cluster's runtime is)."""
    cluster = run.parent.name
    return [str(run.relative_to(repo)), f"overlays/infrastructure/{cluster}/configs"]


def problems_after(repo: Path, path: Path, old: str, new: str) -> list[str]:
    original = path.read_text()
    assert len(re.findall(re.escape(old), original)) == 1, f"{old!r} moved in {path}"
    path.write_text(original.replace(old, new))
    try:
        report = pipeline.validate(repo, scope(repo, path.parent), crd_dir=schemas.default_crd_dir())
    finally:
        path.write_text(original)
    return [str(p) for p in report.problems]


@pytest.mark.gotools
def test_both_apis_runs_pass_as_generated(repo: Path) -> None:
    for cluster in ("fsdp-p4de", "fsdp-p5"):
        for run in sorted((repo / "overlays" / "runs" / cluster).iterdir()):
            report = pipeline.validate(repo, scope(repo, run), crd_dir=schemas.default_crd_dir())
            assert [str(p) for p in report.problems if "device plugin" not in p.message] == []


@pytest.mark.gotools
@pytest.mark.parametrize(
    ("cluster", "file", "old", "new", "expected"),
    [
        # A PyTorchJob of 2 workers whose torchrun waits for 3 nodes.
        (
            "fsdp-p4de",
            "pytorchjob.run.yaml",
            "  - --nnodes=2\n",
            "  - --nnodes=3\n",
            "torchrun --nnodes is 3 but the job has 2 pods (replicas)",
        ),
        # A TrainJob of 2 nodes whose torchrun waits for up to 4.
        (
            "fsdp-p5",
            "trainjob.yaml",
            "    - --nnodes=2\n",
            "    - --nnodes=1:4\n",
            "torchrun --nnodes is 1:4 but the job has 2 pods (trainer.numNodes)",
        ),
        # A PyTorchJob given the TrainJob path's rendezvous host.
        (
            "fsdp-p4de",
            "pytorchjob.run.yaml",
            "-worker-0:29400",
            "-node-0-0:29400",
            "names no pod of this job: the first pod of a PyTorchJob is",
        ),
        # A TrainJob given the PyTorchJob path's rendezvous host.
        (
            "fsdp-p5",
            "trainjob.yaml",
            "-node-0-0.",
            "-worker-0.",
            "names no pod of this job: the first pod of a TrainJob's JobSet is",
        ),
        # A runtime of another API group: the Trainer never finds it.
        (
            "fsdp-p5",
            "trainjob.yaml",
            "    apiGroup: trainer.kubeflow.org\n",
            "    apiGroup: kubeflow.org\n",
            "runtimeRef.apiGroup is 'kubeflow.org'",
        ),
    ],
)
def test_a_job_shape_mistake_is_one_finding_on_the_file_that_holds_it(
    repo: Path, cluster: str, file: str, old: str, new: str, expected: str
) -> None:
    path = run_file(repo, cluster, file)
    found = problems_after(repo, path, old, new)
    hits = [p for p in found if expected in p]
    assert len(hits) == 1, found
    assert hits[0].startswith(str(path.relative_to(repo))), hits
    assert "fix" in hits[0].lower() or "make them equal" in hits[0], hits


@pytest.mark.gotools
@pytest.mark.parametrize(
    ("file", "old", "new", "scope", "expected"),
    [
        # The data staging Job's pods restart Always: the API server refuses the Job.
        (
            "base/data-staging/job.yaml",
            "      restartPolicy: Never\n",
            "      restartPolicy: Always\n",
            "overlays/infrastructure/fsdp-p4de/data",
            "the Job's pods have restartPolicy Always, which the API server refuses for a Job",
        ),
        # The runtime's trainer Job has a podFailurePolicy: OnFailure is refused when JobSet creates it.
        (
            "base/trainjob/runtime.yaml",
            "                  restartPolicy: Never\n",
            "                  restartPolicy: OnFailure\n",
            "overlays/infrastructure/fsdp-p5/configs",
            "the Job has a podFailurePolicy and its pods restartPolicy OnFailure",
        ),
    ],
)
def test_a_job_template_the_api_server_refuses_is_found_in_the_base_that_holds_it(
    repo: Path, file: str, old: str, new: str, scope: str, expected: str
) -> None:
    path = repo / file
    original = path.read_text()
    assert original.count(old) == 1, f"{old!r} moved in {file}"
    path.write_text(original.replace(old, new))
    try:
        report = pipeline.validate(repo, [scope], crd_dir=schemas.default_crd_dir())
    finally:
        path.write_text(original)
    hits = [str(p) for p in report.problems if expected in p.message]
    assert hits and all(h.startswith(file) and "fix: restartPolicy: Never" in h for h in hits), [
        str(p) for p in report.problems
    ]


@pytest.mark.gotools
def test_a_trainjob_cluster_whose_trainer_release_lost_its_crds_is_one_finding(repo: Path) -> None:
    file = "base/components/kubeflow-trainer/release.yaml"
    path = repo / file
    original = path.read_text()
    old = "    crds:\n      enabled: true\n"
    assert original.count(old) == 1, f"{old!r} moved in {file}"
    path.write_text(original.replace(old, "    crds:\n      enabled: false\n"))
    try:
        report = pipeline.validate(
            repo, ["overlays/infrastructure/fsdp-p5", "overlays/runs/fsdp-p5"], crd_dir=schemas.default_crd_dir()
        )
    finally:
        path.write_text(original)
    hits = [str(p) for p in report.problems if "does not install the Trainer CRDs" in p.message]
    assert len(hits) == 1 and hits[0].startswith(file) and "fix: values.crds.enabled: true" in hits[0], [
        str(p) for p in report.problems
    ]
