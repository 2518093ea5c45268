"""The validator holds what the Training Operator interprets to the values it accepts, holds every
container of every pod template (init containers, CronJobs, replica specs) to the pod-security rules,
and blames each problem on the file that holds it. Unit cases on the real base PyTorchJob; then the real
pipeline over a copy of the repository with one mistake at a time in a run's patch or a base."""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from generators.core.gotools import REPO_ROOT
from generators.validation import pipeline, schemas
from generators.validation.manifests import Doc
from generators.validation.operator_fields import check_operator_fields
from generators.validation.podsecurity import check_pod_security

BASE_FILE = "base/pytorchjob/pytorchjob.yaml"
BASE_JOB = yaml.safe_load((REPO_ROOT / BASE_FILE).read_text())
WORKER = ("spec", "pytorchReplicaSpecs", "Worker")


def at(data: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        data = data[int(k)] if isinstance(data, list) else data[k]
    return data


def messages(data: dict[str, Any]) -> list[str]:
    return [p.message for p in check_operator_fields([Doc(data, BASE_FILE, 1)])]


def test_the_base_job_and_every_committed_run_pass():
    assert messages(BASE_JOB) == []


def _container(j: dict) -> dict:
    return at(j, (*WORKER, "template", "spec", "containers", "0"))


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda j: at(j, WORKER).update(restartPolicy="Exitcode"), "restartPolicy 'Exitcode' is not one"),
        (lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="Succeeded"), "cleanPodPolicy 'Succeeded'"),
        (lambda j: j["spec"].update(elasticPolicy={"rdzvBackend": "etcd3"}), "rdzvBackend 'etcd3'"),
        (lambda j: j["spec"].update(nprocPerNode="eight"), "nprocPerNode 'eight'"),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"].pop("Worker")),
            "replica type 'Chief'",
        ),
        (
            lambda j: j["spec"]["pytorchReplicaSpecs"].update(Master={**copy.deepcopy(at(j, WORKER)), "replicas": 2}),
            "Master: replicas is 2",
        ),
        (lambda j: at(j, WORKER).update(replicas=0), "Worker: replicas is 0"),
        (lambda j: _container(j).update(name="trainer"), "no container named pytorch"),
        (lambda j: _container(j).pop("image"), "has no image"),
        (
            lambda j: _container(j).update(
                command=["python", "-m", "trainer.launch", "--rdzv-backend=zeus", "-m", "x"]
            ),
            "--rdzv-backend 'zeus'",
        ),
        (lambda j: _container(j).update(command=["torchrun", "--rdzv_backend", "c10"]), "--rdzv-backend 'c10'"),
    ],
)
def test_a_value_the_operator_does_not_accept_is_a_problem(mutate, expected):
    job = copy.deepcopy(BASE_JOB)
    mutate(job)
    found = messages(job)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("backend", ["c10d", "etcd", "etcd-v2", "static"])
def test_every_backend_torchrun_knows_passes(backend):
    job = copy.deepcopy(BASE_JOB)
    _container(job)["command"] = ["torchrun", f"--rdzv-backend={backend}", "-m", "trainer.train"]
    assert messages(job) == []


def cronjob(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c", "namespace": "fsdp"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": pod}}}},
    }


@pytest.mark.parametrize(
    ("where", "mutate", "expected"),
    [
        ("initContainers", lambda c: c["securityContext"].update(privileged=True), "privileged is not allowed"),
        ("initContainers", lambda c: c["securityContext"].update(runAsUser=0), "root is not allowed"),
        ("containers", lambda c: c["securityContext"]["capabilities"].update(add=["NET_ADMIN"]), "NET_ADMIN"),
    ],
)
def test_every_container_of_every_pod_template_is_held_to_pod_security(where, mutate, expected):
    safe = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    pod = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
        "initContainers": [{"name": "init", "image": "x:1", "securityContext": copy.deepcopy(safe)}],
        "containers": [{"name": "app", "image": "x:1", "securityContext": copy.deepcopy(safe)}],
    }
    assert check_pod_security([Doc(cronjob(pod), "c.yaml", 1)]) == []
    mutate(pod[where][0])
    found = [p.message for p in check_pod_security([Doc(cronjob(pod), "c.yaml", 1)])]
    assert any(expected in m for m in found), found
    # The same pod as a PyTorchJob replica's init container.
    job = copy.deepcopy(BASE_JOB)
    spec = at(job, (*WORKER, "template", "spec"))
    spec["initContainers"] = [copy.deepcopy(pod[where][0])]
    if where == "initContainers":
        found = [
            p.message
            for p in check_pod_security([Doc({**job, "metadata": {"name": "r", "namespace": "fsdp"}}, BASE_FILE, 1)])
        ]
        assert any(expected in m for m in found), found


# The real pipeline over a copy of the repository: the problem names the file that holds the mistake.


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for top in ("base", "overlays"):
        shutil.copytree(REPO_ROOT / top, root / top)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def a_run(root: Path) -> Path:
    return sorted((root / "overlays" / "runs" / "fsdp-p5").iterdir())[0]


def edit_yaml(path: Path, change: Callable[[Any], None]) -> str:
    original = path.read_text()
    data = yaml.safe_load(original)
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return original


@pytest.mark.gotools
@pytest.mark.parametrize(
    ("file", "change", "expected"),
    [
        # A run's patch sets a restart policy the operator does not know: blamed on the patch.
        (
            "run-patch",
            lambda ops: ops.append(
                {"op": "replace", "path": "/spec/pytorchReplicaSpecs/Worker/restartPolicy", "value": "Exitcode"}
            ),
            "restartPolicy 'Exitcode'",
        ),
        # The base's init container runs as root: blamed on the base, for every run built from it.
        (
            BASE_FILE,
            lambda job: at(job, (*WORKER, "template", "spec", "initContainers", "0", "securityContext")).update(
                runAsUser=0
            ),
            "root is not allowed",
        ),
        # The data staging Job gets a privileged init container.
        (
            "base/data-staging/job.yaml",
            lambda job: job["spec"]["template"]["spec"].update(
                initContainers=[{"name": "x", "image": "busybox:1.37.0", "securityContext": {"privileged": True}}]
            ),
            "privileged is not allowed",
        ),
    ],
)
def test_the_pipeline_blames_the_file_that_holds_the_mistake(repo, file, change, expected):
    path = a_run(repo) / "pytorchjob.run.yaml" if file == "run-patch" else repo / file
    original = edit_yaml(path, change)
    try:
        scope = (
            [str(a_run(repo).relative_to(repo))]
            if file != "base/data-staging/job.yaml"
            else ["overlays/infrastructure/fsdp-p5/data"]
        )
        report = pipeline.validate(repo, scope, crd_dir=schemas.default_crd_dir())
    finally:
        path.write_text(original)
    hits = [p for p in report.problems if expected in p.message]
    assert hits, [str(p) for p in report.problems]
    assert {p.file for p in hits} == {str(path.relative_to(repo))}, [str(p) for p in hits]
