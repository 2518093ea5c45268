"""What a Capacity Block cluster that queues with Kueue gets for the block's end: the queue hold of
base/capacity-block in its configs, in the run namespace, with the longest checkpoint grace of its runs
(so the queue holds at the earliest stop time of any of them), pulling the trainer image from the
cluster's registry; a cluster without a block or without Kueue gets none. The real generator, kustomize
and validation over a copy of the checkout; trainer.block_queue's decision on its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from support import generated_copy

from generators.core.gotools import tool
from generators.validation import pipeline, schemas
from trainer import block_queue, capacity_block

MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: main}
clusters:
  c1:
    region: us-east-1
    availability_zones: [us-east-1a]
    instance_types: [p5.48xlarge]
    capacity_reservation_ids: [cr-0123456789abcdef0]
    capacity_blocks: true
    capacity_block_end: "2099-12-10T11:30:00Z"
    shared_storage_gib: 7200
  c2: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p4de.24xlarge]}
defaults:
  trainer: {data: {path: /shared/data/samsum/train.jsonl, format: samsum}}
include:
  - {cluster: c1, model: llama2-7b, nodes: 2}
  - {cluster: c1, model: llama2-70b, nodes: 8}
  - {cluster: c2, model: llama2-7b, nodes: 1}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_copy(tmp_path_factory.mktemp("repo"), MATRIX)


def build(repo: Path, path: str) -> list[dict]:
    out = subprocess.run([tool("kustomize"), "build", str(repo / path)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def grace_of_runs(repo: Path, cluster: str) -> list[int]:
    graces = []
    for run in (repo / "overlays/runs" / cluster).iterdir():
        (job,) = [d for d in build(repo, str(run.relative_to(repo))) if d["kind"] == "PyTorchJob"]
        env = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
        graces.append(int(next(e["value"] for e in env if e["name"] == capacity_block.GRACE_ENV)))
    return graces


@pytest.mark.gotools
def test_a_capacity_block_cluster_holds_its_queue_from_its_runs_earliest_stop(repo: Path) -> None:
    docs = build(repo, "overlays/infrastructure/c1/configs")
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "fsdp-block-queue"]
    assert deploy["metadata"]["namespace"] == "fsdp"
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    graces = grace_of_runs(repo, "c1")
    assert len(set(graces)) == 2 and int(env[capacity_block.GRACE_ENV]) == max(graces)  # the 70B run's
    assert container["image"].startswith("111122223333.dkr.ecr.us-east-1.amazonaws.com/fsdp-gitops/trainer:")
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "fsdp-block-queue"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fsdp-block-queue", "namespace": "fsdp"}]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "fsdp-block-queue"]
    assert role["rules"] == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues"],
            "resourceNames": ["fsdp"],
            "verbs": ["get", "patch"],
        }
    ]
    # c2 has no Capacity Block: nothing of it.
    assert not any(
        d["metadata"]["name"] == "fsdp-block-queue" for d in build(repo, "overlays/infrastructure/c2/configs")
    )
    # The whole cluster validates (pod security, readability, Kueue references).
    report = pipeline.validate(repo, ["overlays/infrastructure/c1"], crd_dir=schemas.default_crd_dir())
    assert [str(p) for p in report.problems] == []


def test_the_hold_starts_at_the_stop_time_of_the_block_and_ends_with_a_later_block() -> None:
    end = "2099-12-10T11:30:00Z"
    stop = capacity_block.stop_time(capacity_block.parse_end(end) or 0.0, 600.0)
    assert block_queue.desired_policy(end, stop - 1, 600.0) == "None"
    assert block_queue.desired_policy(end, stop, 600.0) == "Hold"
    assert block_queue.desired_policy(end, stop + 86400, 600.0) == "Hold"  # after the end too
    assert block_queue.desired_policy("", stop, 600.0) == "None"  # no block known
