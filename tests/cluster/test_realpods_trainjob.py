"""The TrainJob path on real pods (tools/cluster/realpods.py with `trainjob=True`): the real Kubeflow
Trainer v2.3.0 and JobSet v0.12.0 controllers run beside the level's kubelets, and one tiny TrainJob
trains in the trainer test image, to completion and through a retryable failure.

The level: two p4de-shaped GPU nodes and one CPU node, without Kueue (a TrainJob runs unsuspended when
no Kueue webhook suspends it; Kueue's admission of TrainJobs is proven on the kwok level,
test_cluster_trainjob_kueue.py). The repository is copied into the cluster's work folder and its matrix
replaced by the tiny test matrix of test_realpods_runs.py with its cluster on `job_api: trainjob`; the
real generator expands it, and kustomize's `images:` points the trainer and busybox images (of the
ClusterTrainingRuntime, and of the run's TrainJob through a configuration naming spec.trainer.image) at
the imported test images. The configs (with the runtime), the
shared storage, the data staging and the run are applied in Flux's dependsOn order by kubectl.

What the torch plugin and JobSet give the pods is what a cluster gets: the rendezvous goes to
<run>-node-0-0.<run>:29400, the pod hostname in JobSet's headless Service, which CoreDNS answers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from realpods_support import (
    CLUSTER,
    INSTANCE,
    INTERVAL,
    NS,
    STEPS,
    TRAINER_UID,
    Deployment,
    copy_repository,
    metrics,
    pod_problems,
    set_images,
    small_matrix,
    stage_storage_and_data,
)

from tools.cluster import dryrun
from tools.cluster.cluster import Cluster

pytestmark = [pytest.mark.realpods, pytest.mark.cluster, pytest.mark.slow]

REALPODS_OPTIONS = {"instance_type": INSTANCE, "gpu_nodes": 2, "cpu_node": True, "trainer": True, "trainjob": True}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
RUNTIME = "fsdp-torch"


def trainjob_matrix() -> dict[str, Any]:
    """The tiny test matrix (one run, 2 nodes x 1 process, gloo on CPU) with its cluster on TrainJobs."""
    m = small_matrix()
    m["clusters"][CLUSTER]["job_api"] = "trainjob"
    return m


def _image_field_of_trainjobs(folder: Path) -> None:
    """A TrainJob's image (spec.trainer.image) is not a container's: kustomize's `images:` reaches it
    through a configuration naming the field, as a user mirroring images would add one."""
    (folder / "images.trainjob.yaml").write_text(
        yaml.safe_dump({"images": [{"path": "spec/trainer/image", "kind": "TrainJob"}]})
    )
    path = folder / "kustomization.yaml"
    k = yaml.safe_load(path.read_text())
    k["configurations"] = [*k.get("configurations", []), "images.trainjob.yaml"]
    path.write_text(yaml.safe_dump(k, sort_keys=False))


@pytest.fixture(scope="module")
def deployment(pods: Cluster) -> Iterator[Deployment]:
    started = time.monotonic()
    repo = pods.work / "repo-trainjob"
    copy_repository(repo)
    (repo / "matrix.yaml").write_text(yaml.safe_dump(trainjob_matrix(), sort_keys=False))
    res = subprocess.run(
        [sys.executable, "generators/expand.py", "matrix.yaml"], cwd=repo, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    (run,) = [p.name for p in (repo / "overlays" / "runs" / CLUSTER).iterdir() if p.is_dir()]
    assert (repo / "overlays" / "runs" / CLUSTER / run / "trainjob.yaml").is_file()
    trainer, utility = pods.level.images[2].name, pods.level.images[1].name
    infra = repo / "overlays" / "infrastructure" / CLUSTER
    _image_field_of_trainjobs(repo / "overlays" / "runs" / CLUSTER / run)
    for folder in [infra / "configs", infra / "storage", infra / "data", repo / "overlays" / "runs" / CLUSTER / run]:
        set_images(folder, trainer, utility)
    configs = dryrun.render(repo, f"overlays/infrastructure/{CLUSTER}/configs")
    (pvc,) = [x for x in configs if x["kind"] == "PersistentVolumeClaim"]
    volume = pods.level.shared_volume(pvc)
    d = Deployment(pods, repo, volume, run, {})
    # The configs carry the ClusterTrainingRuntime (validated by the Trainer's webhook on apply).
    stage_storage_and_data(d, configs, started)
    yield d
    print(f"\nTrainJob real-pods timings (s): { {k: round(v, 1) for k, v in d.setup_s.items()} }")


def selector(d: Deployment) -> str:
    return f"{JOBSET_LABEL}={d.run}"


def trainjob_state(d: Deployment) -> str:
    conds = d.cluster.get("trainjob", NS, name=d.run).get("status", {}).get("conditions", [])
    return next((c["type"] for c in conds if c["type"] in ("Complete", "Failed") and c["status"] == "True"), "")


def wait_trainjob(d: Deployment, want: str = "Complete", stall_s: float = 240, timeout_s: float = 900) -> None:
    """Wait for the TrainJob to end as `want`; fail with what stopped it when it ends otherwise or logs
    no new step for stall_s."""
    deadline, last_step, last_change = time.monotonic() + timeout_s, -1, time.monotonic()
    while True:
        state = trainjob_state(d)
        if state:
            if state != want:
                raise AssertionError(f"TrainJob {d.run} {state}: {pod_problems(d.cluster, selector(d))}")
            return
        steps = [r["step"] for r in metrics(d)]
        if steps and steps[-1] != last_step:
            last_step, last_change = steps[-1], time.monotonic()
        if time.monotonic() - last_change > stall_s or time.monotonic() > deadline:
            raise AssertionError(
                f"TrainJob {d.run} logged no new step for {stall_s:.0f} s: {pod_problems(d.cluster, selector(d))}"
            )
        time.sleep(2)


def apply_run(d: Deployment) -> dict[str, Any]:
    """Apply the run's manifests after removing the previous attempt's TrainJob (and with it its JobSet
    and pods), checkpoints, metrics and attempt counts."""
    d.cluster.kubectl("delete", "trainjob", "-n", NS, d.run, "--ignore-not-found", "--wait=true")
    d.cluster.wait_for(lambda: not d.cluster.get("pods", NS, selector=selector(d))["items"], 180, "old pods gone")
    for sub in ("checkpoints", "runs"):
        shutil.rmtree(d.volume / sub / d.run, ignore_errors=True)
    docs = d.job()
    d.cluster.apply(docs)
    return next(x for x in docs if x["kind"] == "TrainJob")


def running_pods(d: Deployment) -> list[dict[str, Any]] | None:
    ps = sorted(d.cluster.get("pods", NS, selector=selector(d))["items"], key=lambda p: p["spec"]["hostname"])
    return ps if len(ps) == 2 and all(p["status"].get("phase") == "Running" for p in ps) else None


def _launcher_pid(run: str, rank: int) -> int:
    """The host pid of trainer.launch (the node container's first process) on node `rank` of `run`."""
    master = f"PET_MASTER_ADDR={run}-node-0-0.{run}".encode()
    for entry in sorted((e for e in Path("/proc").iterdir() if e.name.isdigit()), key=lambda e: int(e.name)):
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"trainer.launch" in cmd and master in env and f"PET_NODE_RANK={rank}".encode() in env:
            return int(entry.name)
    raise AssertionError(f"no trainer.launch process of {run} on node {rank}")


def test_the_tiny_trainjob_meets_through_the_headless_service_and_trains_to_complete(deployment: Deployment) -> None:
    d = deployment
    assert d.cluster.get("clustertrainingruntime", name=RUNTIME)["spec"]["mlPolicy"]["torch"] == {}
    started = time.monotonic()
    job = apply_run(d)
    assert job["spec"]["runtimeRef"]["name"] == RUNTIME
    assert job["spec"]["trainer"]["image"] == d.cluster.level.images[2].name
    d.cluster.wait_for(lambda: metrics(d), 300, f"the first step: {pod_problems(d.cluster, selector(d))}")
    d.setup_s["TrainJob applied to its first step"] = time.monotonic() - started
    # Node 1 found node 0 by the name the rendezvous endpoint carries: JobSet's pod hostname in its
    # headless Service, answered by CoreDNS with node 0's pod address.
    placed = d.cluster.wait_for(lambda: running_pods(d), 60, "both pods running")
    assert [p["spec"]["hostname"] for p in placed] == [f"{d.run}-node-0-0", f"{d.run}-node-0-1"]
    assert {p["spec"]["nodeName"] for p in placed} == {f"{INSTANCE.replace('.', '-')}-{i}" for i in (0, 1)}
    probe = f"import socket; print(socket.gethostbyname('{d.run}-node-0-0.{d.run}'))"
    res = d.cluster.kubectl_result(
        "exec", "-n", NS, placed[1]["metadata"]["name"], "-c", "node", "--", "python", "-c", probe
    )
    assert res.returncode == 0 and res.stdout.strip() == placed[0]["status"]["podIP"], (res.stdout, res.stderr)
    wait_trainjob(d)
    d.setup_s["tiny TrainJob to Complete"] = time.monotonic() - started
    assert [r["step"] for r in metrics(d)] == list(range(1, STEPS + 1))
    checkpoints = d.volume / "checkpoints" / d.run
    kept = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    assert kept[-1] == f"step-{STEPS:08d}", kept
    assert (checkpoints / kept[-1]).stat().st_uid == TRAINER_UID
    assert (d.volume / "runs" / d.run / "metrics.jsonl").stat().st_uid == TRAINER_UID
    jobset = d.cluster.get("jobset", NS, name=d.run)
    assert jobset["status"].get("restarts", 0) == 0, jobset["status"]
    assert jobset["status"].get("terminalState") == "Completed", jobset["status"]
    # Rank 0 wrote its progress on the TrainJob itself, through the run's own Role (patch of this
    # TrainJob by name), as PyTorchJob runs do on their pods.
    notes = d.cluster.get("trainjob", NS, name=d.run)["metadata"].get("annotations", {})
    assert notes.get("fsdp-gitops/step") == f"{STEPS}/{STEPS}", notes
    assert notes.get("fsdp-gitops/eta") == "done" and float(notes["fsdp-gitops/tokens-per-second"]) > 0, notes
    # The last checkpoint complete when the final record was written (the final save may still be
    # in flight then): one of the interval's.
    assert 0 < int(notes["fsdp-gitops/checkpoint"]) <= STEPS and int(notes["fsdp-gitops/checkpoint"]) % INTERVAL == 0


def test_sigkill_of_a_trainer_container_restarts_the_gang_from_the_last_checkpoint(deployment: Deployment) -> None:
    """Exit 137 fails the pod's Job (BackoffLimitExceeded), JobSet's Retryable rule re-creates the whole
    gang once the old pods are gone, and the run resumes from its newest complete checkpoint."""
    d = deployment
    started = time.monotonic()
    apply_run(d)
    d.cluster.wait_for(lambda: len(metrics(d)) >= 2 * INTERVAL, 300, "two checkpoint intervals")
    first = d.cluster.wait_for(lambda: running_pods(d), 60, "both pods running")
    os.kill(_launcher_pid(d.run, 1), signal.SIGKILL)
    killed_at = max(r["step"] for r in metrics(d))
    wait_trainjob(d)
    d.setup_s["TrainJob with a SIGKILL to Complete"] = time.monotonic() - started
    jobset = d.cluster.get("jobset", NS, name=d.run)
    assert jobset["status"].get("restarts") == 1, jobset["status"]
    assert jobset["status"].get("terminalState") == "Completed", jobset["status"]
    now = {p["metadata"]["uid"] for p in d.cluster.get("pods", NS, selector=selector(d))["items"]}
    assert len(now) == 2 and not now & {p["metadata"]["uid"] for p in first}, "the whole gang was re-created"
    # The new gang's node 0 says which checkpoint it resumed from: the newest complete interval
    # checkpoint at or before the step reached, or the one before it when the kill landed while the
    # newest was still being written asynchronously. No step is lost beyond the last interval, none
    # past the kill is skipped, and every step is trained.
    (node0,) = [
        p
        for p in d.cluster.get("pods", NS, selector=selector(d))["items"]
        if p["spec"]["hostname"] == f"{d.run}-node-0-0"
    ]
    log = d.cluster.kubectl("logs", "-n", NS, node0["metadata"]["name"], "-c", "node")
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", log)
    assert len(resumed) == 1, log[-2000:]
    path, at = resumed[0][0], int(resumed[0][1])
    last_interval = (killed_at // INTERVAL) * INTERVAL
    assert at in (last_interval, last_interval - INTERVAL) and at > 0, (at, killed_at)
    assert Path(path).name == f"step-{at:08d}", path
    steps = [r["step"] for r in metrics(d)]
    assert set(steps) == set(range(1, STEPS + 1)), steps
    assert steps[-(STEPS - at) :] == list(range(at + 1, STEPS + 1)), (steps, at)
    assert killed_at < STEPS, (steps, killed_at)
