"""What the generator writes for trainer.launch's guards and the pre-flight Job: the run's own image
(part of its name), the retry bound, the transport check of multi-node EFA runs, the Capacity Block
end every run pod reads, and the pre-flight Job queued through Kueue with retries only for a check
that could not run. Pure renderers on small matrices."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from matrix_support import cluster_plans, line_of, plans

from generators.core.errors import InputError
from generators.core.gotools import REPO_ROOT
from generators.matrix.schema import DEFAULT_IMAGE
from generators.render import OVERLAYS, render
from generators.render.flux import CAPACITY_BLOCK_CONFIGMAP, CAPACITY_BLOCK_FILE
from trainer import attempts, capacity_block, transport_check

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
    capacity_block_end: "2099-12-10T11:30:00Z"
  c2: {region: us-east-1, availability_zones: [us-east-1a], instance_types: [p4de.24xlarge], kueue: false}
defaults:
  trainer: {data: {path: /shared/data/samsum/train.jsonl, format: samsum}}
"""
RUNS = """\
include:
  - {cluster: c1, model: llama2-7b, nodes: 2}
  - {cluster: c1, model: llama2-7b, nodes: 2, image: "registry.example/trainer:0.2.0", max_retries: 3}
  - {cluster: c1, model: llama2-7b, nodes: 1}
  - {cluster: c1, model: llama2-13b, nodes: 4, transport_check: warn}
  - {cluster: c2, model: llama2-7b, nodes: 2, transport_check: "off"}
"""
JOB = yaml.safe_load((REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text())
POD = JOB["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


@pytest.fixture(scope="module")
def rendered() -> tuple[list, dict[str, Any]]:
    cps = cluster_plans(HEAD + RUNS)
    return [p for cp in cps for p in cp.runs], render(cps, OVERLAYS)


def ops_of(files: dict[str, Any], run: str) -> list[dict[str, Any]]:
    (path,) = [p for p in files if p.endswith(f"/{run}/pytorchjob.run.yaml")]
    return [o for o in files[path].ops if o["op"] != "test"]


def env_of(files: dict[str, Any], run: str) -> dict[str, str]:
    return {o["value"]["name"]: o["value"].get("value", "") for o in ops_of(files, run) if o["path"].endswith("/env/-")}


def test_the_image_is_the_runs_own_and_part_of_its_name(rendered):
    runs, files = rendered
    same, other = runs[0], runs[1]
    images = {
        p.name: [o["value"] for o in ops_of(files, p.name) if o["path"].endswith("/containers/0/image")] for p in runs
    }
    assert images[same.name] == [DEFAULT_IMAGE] and images[other.name] == ["registry.example/trainer:0.2.0"]
    # Only the image (and the retry bound) differ: still two runs under two names.
    assert same.name != other.name
    only_image = plans(HEAD + RUNS.replace(", max_retries: 3", ""))
    assert only_image[0].name != only_image[1].name
    # The template's image is the default, and nothing marks it for the image automation.
    assert POD["containers"][0]["image"] == DEFAULT_IMAGE
    text = (REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text()
    assert "$imagepolicy" not in "".join(line for line in text.splitlines() if "image:" in line)


def test_the_retry_bound_is_counted_per_run(rendered):
    runs, files = rendered
    env = env_of(files, runs[0].name)
    assert env[attempts.MAX_ENV] == "10" and env_of(files, runs[1].name)[attempts.MAX_ENV] == "3"
    assert env[attempts.DIR_ENV] == f"/shared/runs/{runs[0].name}/attempts"
    # The pod name is the replica's identity (the operator re-creates a pod under the same name).
    assert attempts.REPLICA_ENV in {
        o["value"]["name"] for o in ops_of(files, runs[0].name) if o["path"].endswith("/env/-")
    }


def test_the_transport_check_covers_multi_node_efa_runs_only(rendered):
    runs, files = rendered
    two, _, one, warn, off = (env_of(files, p.name) for p in runs)
    assert two[transport_check.EXPECT_ENV] == "efa" and two[transport_check.MODE_ENV] == "fail"
    assert warn[transport_check.MODE_ENV] == "warn"
    assert transport_check.EXPECT_ENV not in one  # single node: nothing between nodes to check
    assert transport_check.EXPECT_ENV not in off
    # The check reads NCCL's own log: the template asks for WARN, which the check keeps showing.
    assert {e["name"]: e.get("value") for e in POD["containers"][0]["env"]}["NCCL_DEBUG"] == "WARN"


def test_every_run_pod_reads_its_clusters_capacity_block_end(rendered):
    _, files = rendered
    env = {e["name"]: e.get("value") for e in POD["containers"][0]["env"]}
    mounts = {m["name"]: m["mountPath"] for m in POD["containers"][0]["volumeMounts"]}
    volume = next(v for v in POD["volumes"] if v["name"] == "capacity-block")
    assert volume["configMap"] == {"name": CAPACITY_BLOCK_CONFIGMAP, "optional": True}
    assert env[capacity_block.FILE_ENV] == mounts["capacity-block"] + "/end"
    for c, end in (("c1", "2099-12-10T11:30:00Z"), ("c2", "")):
        cm = files[f"infrastructure/{c}/configs/{CAPACITY_BLOCK_FILE}"]
        assert cm["metadata"]["name"] == CAPACITY_BLOCK_CONFIGMAP and cm["data"] == {"end": end}
        assert CAPACITY_BLOCK_FILE in files[f"infrastructure/{c}/configs/kustomization.yaml"]["resources"]
    # The stop comes before AWS starts terminating the block's instances, with the checkpoint's time.
    end = capacity_block.parse_end("2099-12-10T11:30:00Z")
    assert end is not None and end - capacity_block.stop_time(end, 300) == 1800 + 300 + capacity_block.MARGIN_S


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ('capacity_block_end: "2099-12-10T11:30:00Z"', None),
        ('capacity_block_end: "2026-12-10 11:30"', "has no time zone"),
        ('capacity_block_end: "next tuesday"', "is not an ISO 8601 time"),
    ],
)
def test_a_bad_block_end_is_one_error_at_its_line(change, message):
    text = HEAD.replace('capacity_block_end: "2099-12-10T11:30:00Z"', change) + RUNS
    if message is None:
        text = text.replace("    capacity_blocks: true\n", "")
        message = "is set but capacity_blocks is not true"
    with pytest.raises(InputError) as err:
        cluster_plans(text)
    assert message in str(err.value) and f":{line_of(text, 'capacity_block_end')}:" in str(err.value)


def test_the_preflight_job_is_queued_like_the_runs_where_the_cluster_queues(rendered):
    _, files = rendered
    for c, family, queued in (("c1", "p5", True), ("c2", "p4de", False)):
        ops = files[f"infrastructure/{c}/configs/preflight-{family}/job.preflight.yaml"].ops
        labels = [o for o in ops if o["path"] == "/metadata/labels/kueue.x-k8s.io~1queue-name"]
        assert (
            labels == [{"op": "add", "path": "/metadata/labels/kueue.x-k8s.io~1queue-name", "value": "fsdp"}]
        ) == queued
        assert labels or not queued
    job = yaml.safe_load((REPO_ROOT / "base" / "preflight" / "job.yaml").read_text())
    assert job["spec"]["backoffLimit"] > 0 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    fail = job["spec"]["podFailurePolicy"]["rules"][0]
    from trainer.preflight import CHECK_FAILED

    assert fail["action"] == "FailJob" and fail["onExitCodes"]["values"] == [CHECK_FAILED]
