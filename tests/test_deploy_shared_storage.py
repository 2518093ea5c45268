"""The shared volume's ownership Job (base/shared-storage): what it creates, that it is the one root
container the pod-security rules allow (and only with the capabilities it names), and that Flux runs it
before anything writes to the volume. Its effect on a real root:root 0755 directory is proven with real
processes in tests/cluster/test_deploy_shared_storage_realpods.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from matrix_support import cluster_plans
from support import REPO_ROOT

from generators.plan import CHECKPOINT_ROOT, RUNS_ROOT, SHARED_MOUNT
from generators.render import OVERLAYS, render
from generators.render.flux import STORAGE_KUSTOMIZATION
from generators.render.runs import SHARED_DATA_ROOT
from generators.validation.manifests import Doc
from generators.validation.podsecurity import check_pod_security

JOB_FILE = REPO_ROOT / "base" / "shared-storage" / "job.yaml"
MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: main}
clusters:
  c1: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p5.48xlarge], namespace: train}
  c2: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p5.48xlarge]}
include:
  - {cluster: c1, model: llama2-7b, nodes: 2, trainer.data.path: /shared/data/samsum/train.jsonl}
  - {cluster: c2, model: tiny, nodes: 1, trainer.data.format: synthetic, trainer.data.path: ""}
"""


def job() -> dict[str, Any]:
    return yaml.safe_load(JOB_FILE.read_text())


def folders(data: dict[str, Any]) -> list[str]:
    command = data["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "-c"] and command[3] == "shared-storage-init"
    return command[4:]


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def problems(data: dict[str, Any], namespace: str = "fsdp") -> list[str]:
    data = copy.deepcopy(data)
    data["metadata"]["namespace"] = namespace
    return [p.message for p in check_pod_security([Doc(data, "base/shared-storage/job.yaml", 1)])]


def test_the_job_creates_every_folder_the_trainer_and_the_staging_write():
    made = {f"{SHARED_MOUNT}/{f}" for f in folders(job())}
    # Checkpoints and metrics (the planner), staged datasets, exports and the Hugging Face cache (HF_HOME).
    pod = yaml.safe_load((REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text())
    trainer = pod["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    staging = yaml.safe_load((REPO_ROOT / "base" / "data-staging" / "job.yaml").read_text())
    hf_homes = {env_of(trainer)["HF_HOME"], env_of(staging["spec"]["template"]["spec"]["containers"][0])["HF_HOME"]}
    for path in {CHECKPOINT_ROOT, RUNS_ROOT, SHARED_DATA_ROOT.rstrip("/"), f"{SHARED_MOUNT}/exports", *hf_homes}:
        assert path in made, f"{path} is written by the pods but not created by the ownership Job"
    # Parents before children (mkdir -p would create the parent root-owned otherwise).
    order = folders(job())
    for i, f in enumerate(order):
        if "/" in f:
            assert f.rsplit("/", 1)[0] in order[:i]
    container = job()["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["OWNER"] == "10001:10001"
    assert trainer_uid(pod) == 10001


def trainer_uid(pod: dict[str, Any]) -> int:
    return pod["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["securityContext"]["runAsUser"]


def test_the_job_is_the_named_root_exception_with_exactly_its_three_capabilities():
    data = job()
    assert problems(data) == [] and problems(data, namespace="train") == []
    ctx = data["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "FOWNER", "DAC_OVERRIDE"]}
    assert ctx["allowPrivilegeEscalation"] is False and ctx["privileged"] is False


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (lambda c, d: c["securityContext"]["capabilities"]["add"].append("SYS_ADMIN"), "capability SYS_ADMIN"),
        (lambda c, d: c["securityContext"].update(privileged=True), "privileged is not allowed"),
        (lambda c, d: d["metadata"].update(name="another-job"), "root is not allowed"),
        # The exception is for a Job: the same name on a Deployment gets none.
        (lambda c, d: d.update(kind="Deployment", apiVersion="apps/v1"), "root is not allowed"),
    ],
)
def test_anything_beyond_the_named_exception_is_a_problem(mutation, expected):
    data = job()
    mutation(data["spec"]["template"]["spec"]["containers"][0], data)
    assert any(expected in m for m in problems(data)), problems(data)


def test_flux_runs_the_job_before_the_staging_and_the_runs_in_every_cluster():
    files = render(cluster_plans(MATRIX), OVERLAYS)
    for c, ns in (("c1", "train"), ("c2", "fsdp")):
        infra = {k["metadata"]["name"]: k["spec"] for k in files[f"clusters/{c}/infrastructure.yaml"]}
        storage = infra[STORAGE_KUSTOMIZATION]
        assert storage["path"] == f"./overlays/infrastructure/{c}/storage"
        assert storage["wait"] is True and storage["force"] is True
        assert storage["dependsOn"] == [{"name": "infra-configs"}]
        assert files[f"infrastructure/{c}/storage/kustomization.yaml"]["namespace"] == ns
        if "data-staging" in infra:
            assert {"name": STORAGE_KUSTOMIZATION} in infra["data-staging"]["dependsOn"]
        for run in files[f"clusters/{c}/experiments.yaml"]:
            assert {"name": STORAGE_KUSTOMIZATION} in run["spec"]["dependsOn"], run["metadata"]["name"]
    assert "data-staging" in {k["metadata"]["name"] for k in files["clusters/c1/infrastructure.yaml"]}
