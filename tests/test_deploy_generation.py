"""What the generators write so that a first reconcile on EKS trains: retries that keep their
checkpoints, data staging the runs wait for, the graceful stop, queueing, Capacity Blocks and the
cluster autoscaler. Pure renderers on small matrices; the validation and the cluster tests build them."""

from __future__ import annotations

from typing import Any

import pytest
from matrix_support import cluster_plans, load, plans

from generators.core.errors import InputError
from generators.render import OVERLAYS, provisioning, render
from generators.render.runs import FSDP_GRACE_ENV, termination_grace_s

HEAD = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: main}
clusters:
  c1:
    region: us-west-2
    availability_zones: [us-west-2a]
    instance_types: [p5.48xlarge]
    capacity_reservation_ids: [cr-0123456789abcdef0]
    capacity_blocks: true
  c2: {region: us-east-1, availability_zones: [us-east-1a], instance_types: [p4de.24xlarge], kueue: false}
"""
RUNS = """\
defaults:
  trainer: {data: {path: /shared/data/samsum/train.jsonl, format: samsum}}
include:
  - {cluster: c1, model: llama2-7b, nodes: 2}
  - {cluster: c1, model: llama2-7b, nodes: 2, rev: 1, retry: 2}
  - {cluster: c1, model: llama2-70b, nodes: 4}
  - {cluster: c2, model: llama2-7b, nodes: 1, trainer.data.path: /shared/data/mine/train.jsonl}
  - {cluster: c2, model: tiny, nodes: 1, trainer.data.format: synthetic, trainer.data.path: ""}
"""


def patch_ops(files: dict[str, Any], run: str) -> list[dict[str, Any]]:
    (path,) = [p for p in files if p.endswith(f"/{run}/pytorchjob.run.yaml")]
    return list(files[path].ops)


def op(ops: list[dict[str, Any]], path_end: str) -> dict[str, Any] | None:
    found = [o for o in ops if o["path"].endswith(path_end) and o["op"] != "test"]
    return found[0] if found else None


@pytest.fixture(scope="module")
def rendered() -> tuple[list, dict[str, Any]]:
    cps = cluster_plans(HEAD + RUNS)
    return [p for cp in cps for p in cp.runs], render(cps, OVERLAYS)


def test_a_retry_gets_a_new_name_and_keeps_the_checkpoints_of_retry_0():
    first, retried = plans(HEAD + RUNS.replace("rev: 1, retry: 2", "rev: 1"))[1], plans(HEAD + RUNS)[1]
    assert retried.name != first.name and "-t2-" in retried.name
    assert retried.trainer.checkpoint.dir == first.trainer.checkpoint.dir == f"/shared/checkpoints/{first.name}"
    # Its own rendezvous and metrics: it is a new job.
    assert retried.rdzv_id == retried.name and retried.trainer.metrics.output_dir.endswith(retried.name)


def test_runs_wait_for_their_staged_dataset_and_the_cluster_stages_it(rendered):
    runs, files = rendered
    by_model = {(p.cluster, p.model): p for p in runs}
    ops = patch_ops(files, by_model["c1", "llama2-70b"].name)
    assert op(ops, "initContainers/0/env/0/value")["value"] == "/shared/data/samsum/_COMPLETE"
    job = files["infrastructure/c1/data/samsum/job.data.yaml"].ops
    command = [o for o in job if o["path"].endswith("/command")][0]["value"]
    assert command == [
        "python",
        "-m",
        "trainer.prepare_data",
        "--dataset",
        "knkarthick/samsum",
        "--format",
        "samsum",
        "--out",
        "/shared/data/samsum",
    ]
    runs_c1 = files["clusters/c1/experiments.yaml"]
    assert all({"name": "data-staging"} in k["spec"]["dependsOn"] for k in runs_c1)


def test_an_unknown_dataset_is_waited_for_but_not_staged_and_synthetic_data_waits_for_nothing(rendered):
    runs, files = rendered
    by_model = {(p.cluster, p.model): p for p in runs}
    ops = patch_ops(files, by_model["c2", "llama2-7b"].name)
    assert op(ops, "initContainers/0/env/0/value")["value"] == "/shared/data/mine/_COMPLETE"
    assert not [p for p in files if p.startswith("infrastructure/c2/data/")]
    # No staging Job in c2, so no data-staging Kustomization to depend on.
    assert "data-staging" not in {k["metadata"]["name"] for k in files["clusters/c2/infrastructure.yaml"]}
    ops = patch_ops(files, by_model["c2", "tiny"].name)
    assert {"op": "remove", "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/initContainers"} in ops


def test_the_grace_period_follows_the_checkpoint_size_and_torchrun_stops_before_it(rendered):
    runs, files = rendered
    by_model = {(p.cluster, p.model): p for p in runs}
    small, large = by_model["c1", "llama2-7b"], by_model["c1", "llama2-70b"]
    assert termination_grace_s(large) > 5 * termination_grace_s(small) > 0
    for p in (small, large):
        ops = patch_ops(files, p.name)
        grace = op(ops, "/terminationGracePeriodSeconds")["value"]
        env = [o["value"] for o in ops if o["path"].endswith("/env/-") and o["value"]["name"] == FSDP_GRACE_ENV]
        assert grace == termination_grace_s(p) and 0 < int(env[0]["value"]) < grace


def test_jobs_carry_the_queue_label_only_where_the_cluster_queues(rendered):
    runs, files = rendered
    for p in runs:
        label = op(patch_ops(files, p.name), "/metadata/labels/kueue.x-k8s.io~1queue-name")
        assert (label is not None) == (p.cluster == "c1"), p.name
    assert "components" in files["infrastructure/c1/configs/kustomization.yaml"]
    assert "components" not in files["infrastructure/c2/configs/kustomization.yaml"]


def test_capacity_blocks_launch_with_their_market_type_and_the_autoscaler_finds_the_groups():
    cps = cluster_plans(HEAD + RUNS)
    config = provisioning.render_eksctl(cps[0], karpenter=False)
    (gpu,) = [g for g in config["managedNodeGroups"] if g["name"] != "system"]
    assert gpu["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert gpu["capacityReservation"]["capacityReservationTarget"]["capacityReservationID"] == "cr-0123456789abcdef0"
    assert gpu["tags"]["k8s.io/cluster-autoscaler/enabled"] == "true" and gpu["tags"]["k8s.io/cluster-autoscaler/c1"]
    assert gpu["tags"]["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"] == "true:NoSchedule"
    (system,) = [g for g in config["managedNodeGroups"] if g["name"] == "system"]
    assert not any(k.startswith("k8s.io/cluster-autoscaler") for k in system.get("tags", {}))
    assert {
        "namespace": "kube-system",
        "serviceAccountName": "cluster-autoscaler",
        "wellKnownPolicies": {"autoScaler": True},
    } in config["iam"]["podIdentityAssociations"]
    assert "--install-nvidia-plugin=false" in config["metadata"]["annotations"]["fsdp-gitops/create-with"]
    (cni,) = [a for a in config["addons"] if a["name"] == "vpc-cni"]
    assert '"enableNetworkPolicy":"true"' in cni["configurationValues"]
    # On-Demand reservations (c2 has none; c1 without capacity_blocks) get no market type.
    plain = provisioning.render_eksctl(
        cluster_plans(HEAD.replace("    capacity_blocks: true\n", "") + RUNS)[0], karpenter=False
    )
    assert all("instanceMarketOptions" not in g for g in plain["managedNodeGroups"])


def test_capacity_blocks_without_a_reservation_is_one_line_of_bad_input():
    text = HEAD.replace("    capacity_reservation_ids: [cr-0123456789abcdef0]\n", "") + RUNS
    with pytest.raises(InputError) as err:
        load(text)
    assert "clusters.c1.capacity_blocks" in str(err.value) and "capacity_reservation_ids" in str(err.value)
