"""What the real-pods modules of the generated deployment share (test_realpods_runs.py,
test_realpods_trainjob.py, test_realpods_flux.py): the tiny test matrix on one cluster of matrix.yaml,
the copy of the repository it is expanded in (images pointed at the imported test images), the
storage and staging Jobs applied as Flux orders them, and the waits that fail with what stopped a run
(a pod that cannot be scheduled, an init container still waiting, a container's exit code and the end
of its log, a mount the trainer's user cannot read or write)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.build import tool_path
from tools.cluster.cluster import Cluster

CLUSTER = "fsdp-p4de"
INSTANCE = "p4de.24xlarge"
# The level test_realpods_level.py and test_realpods_runs.py share (one start for both modules).
SHARED_LEVEL = {
    "instance_type": INSTANCE,
    "gpu_nodes": 2,
    "cpu_node": True,
    "trainer": True,
    "kueue": True,
    "prometheus": True,
}
NS = "fsdp"
TRAINER_IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/fsdp-gitops/trainer"
BUSYBOX_IMAGE = "docker.io/library/busybox"
STEPS = 12
MAX_RETRIES = 2
INTERVAL = 2
JOB_LABEL = "training.kubeflow.org/job-name"
TRAINER_UID = 10001
METRICS_PORT = 8000  # trainer.metrics.prometheus_port of the test matrix


def small_matrix() -> dict[str, Any]:
    """matrix.yaml reduced to one tiny run on CLUSTER, through the matrix's own fields."""
    seed = yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())
    cluster = {**seed["clusters"][CLUSTER], "max_nodes": 2}
    return {
        "apiVersion": seed["apiVersion"],
        "kind": seed["kind"],
        "repository": seed["repository"],
        "clusters": {CLUSTER: cluster},
        "defaults": {
            "active_deadline_s": 3600,
            "max_retries": MAX_RETRIES,
            "shm_size_gib": 1,
            "trainer": {
                "data": {"path": "/shared/data/samsum/train.jsonl", "format": "samsum", "seq_len": 256},
                "training": {"batch_size_per_gpu": 2, "max_steps": STEPS, "lr": 3.0e-3, "warmup_steps": 1},
                "parallelism": {"precision": "fp32", "compile": False},
                "checkpoint": {"interval_steps": INTERVAL},
                "metrics": {"prometheus_port": METRICS_PORT},
            },
        },
        "include": [{"cluster": CLUSTER, "model": "tiny", "nodes": 2, "gpus_per_node": 1, "trainer.model.path": ""}],
    }


@dataclass
class Deployment:
    cluster: Cluster
    repo: Path  # the test's copy of the repository
    volume: Path  # the shared volume's folder on this machine
    run: str  # the run's name
    setup_s: dict[str, float]  # bring-up of the deployment, seconds since the level was up
    root: tuple[int, int] = (-1, 0)  # the volume root's (owner, mode) before the storage Job ran

    def render(self, path: str) -> list[dict[str, Any]]:
        return dryrun.render(self.repo, path)

    def job(self) -> list[dict[str, Any]]:
        return self.render(f"overlays/runs/{CLUSTER}/{self.run}")


def copy_repository(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        src = REPO_ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)


def set_images(folder: Path, trainer: str, utility: str) -> None:
    """kustomize's `images:` in one kustomization, the way a user points overlays at a mirror."""
    for old, new in ((TRAINER_IMAGE, trainer), (BUSYBOX_IMAGE, utility)):
        subprocess.run([tool_path("kustomize"), "edit", "set", "image", f"{old}={new}"], cwd=folder, check=True)


def is_preflight_job(doc: dict[str, Any]) -> bool:
    return doc["kind"] == "Job" and doc["metadata"]["name"].startswith("fsdp-preflight")


def apply_in_namespaces(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    """Apply `docs`, creating first the namespaces they name (infra-controllers creates them under Flux)."""
    names = {d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")}
    names -= {n["metadata"]["name"] for n in cluster.get("namespaces")["items"]}
    if names:  # only missing ones: an apply without its labels would drop the labels a later apply set
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in sorted(names)])
    cluster.apply(docs)


def wait_job(cluster: Cluster, name: str, timeout_s: float) -> None:
    def done() -> bool:
        job = cluster.get("job", NS, name=name)
        conds = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
        if conds.get("Failed") == "True":
            raise AssertionError(f"Job {name} failed: {pod_problems(cluster, f'job-name={name}')}")
        return conds.get("Complete") == "True"

    try:
        cluster.wait_for(done, timeout_s, f"Job {name} complete")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {pod_problems(cluster, f'job-name={name}')}") from None


def pod_problems(cluster: Cluster, selector: str) -> str:
    """What each selected pod is stuck on or died of: scheduling, init containers, exit codes, log ends."""
    out = []
    for pod in cluster.get("pods", NS, selector=selector)["items"]:
        name, status = pod["metadata"]["name"], pod.get("status", {})
        for c in status.get("conditions", []):
            if c.get("reason") == "Unschedulable":
                out.append(f"{name}: unschedulable: {c.get('message')}")
        for kind in ("initContainerStatuses", "containerStatuses"):
            for cs in status.get(kind, []):
                state = cs.get("state", {})
                last = cs.get("lastState", {}).get("terminated")
                if "waiting" in state and state["waiting"].get("reason") not in (None, "PodInitializing"):
                    out.append(
                        f"{name}/{cs['name']}: {state['waiting'].get('reason')}: {state['waiting'].get('message')}"
                    )
                term = state.get("terminated") or last
                if (term and term.get("exitCode")) or "running" in state:
                    res = cluster.kubectl_result("logs", "-n", NS, name, "-c", cs["name"], "--tail=4")
                    tail = " | ".join(res.stdout.strip().splitlines()[-4:])
                    code = f"exit {term['exitCode']}" if term and term.get("exitCode") else "running"
                    out.append(f"{name}/{cs['name']}: {code}: {tail}")
    return "; ".join(out) or "no pod"


def job_state(cluster: Cluster, run: str) -> str:
    conds = cluster.get("pytorchjob", NS, name=run).get("status", {}).get("conditions", [])
    return next((c["type"] for c in reversed(conds) if c["status"] == "True"), "")


def metrics(d: Deployment) -> list[dict[str, Any]]:
    path = d.volume / "runs" / d.run / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if "loss" in r]


def wait_run(d: Deployment, want: str = "Succeeded", stall_s: float = 240, timeout_s: float = 900) -> None:
    """Wait for the PyTorchJob to end as `want`; fail with what stopped it when it ends otherwise or
    logs no new step for stall_s (a run that cannot start never reaches its deadline here)."""
    deadline, last_step, last_change = time.monotonic() + timeout_s, -1, time.monotonic()
    while True:
        state = job_state(d.cluster, d.run)
        if state in ("Succeeded", "Failed"):
            if state != want:
                raise AssertionError(f"PyTorchJob {d.run} {state}: {pod_problems(d.cluster, f'{JOB_LABEL}={d.run}')}")
            return
        steps = [r["step"] for r in metrics(d)]
        if steps and steps[-1] != last_step:
            last_step, last_change = steps[-1], time.monotonic()
        if time.monotonic() - last_change > stall_s or time.monotonic() > deadline:
            raise AssertionError(
                f"PyTorchJob {d.run} ({state or 'no condition'}) logged no new step for {stall_s:.0f} s: "
                f"{pod_problems(d.cluster, f'{JOB_LABEL}={d.run}')}"
            )
        time.sleep(2)


def check_access(d: Deployment, pod: str) -> None:
    """The trainer's user reads its Secret and config and writes the shared volume, in the pod itself."""
    probe = (
        "import os\n"
        "for p in (os.environ['HF_TOKEN_FILE'], '/etc/fsdp/train.yaml'):\n"
        "    try:\n"
        "        open(p).read()\n"
        "    except OSError as e:\n"
        "        raise SystemExit(f'uid {os.getuid()} cannot read {p}: {e.strerror}')\n"
        "p = '/shared/runs/.write-probe-' + os.environ['HOSTNAME']\n"
        "try:\n"
        "    open(p, 'w').close(); os.unlink(p)\n"
        "except OSError as e:\n"
        "    raise SystemExit(f'uid {os.getuid()} cannot write {p}: {e.strerror}')\n"
    )
    res = d.cluster.kubectl_result("exec", "-n", NS, pod, "-c", "pytorch", "--", "python", "-c", probe)
    assert res.returncode == 0, f"{pod}: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.stdout}"


def stage_storage_and_data(d: Deployment, configs: list[dict[str, Any]], started: float) -> None:
    """What Flux applies before a run, in its dependsOn order: the configs (without the pre-flight Job,
    which waits for its own test in a CPU mode), the Secret Flux would decrypt (base/secrets, SOPS: here
    a plain one with a test token), the shared-storage Job, then the staging Job, whose dataset is the
    repository's made-up samsum records as a folder on the volume (no hub here)."""
    apply_in_namespaces(d.cluster, [x for x in configs if not is_preflight_job(x)])
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token", "namespace": NS}}
    d.cluster.apply([{**secret, "stringData": {"token": "hf_test"}}])
    storage = d.render(f"overlays/infrastructure/{CLUSTER}/storage")
    apply_in_namespaces(d.cluster, storage)
    for x in storage:
        if x["kind"] == "Job":
            wait_job(d.cluster, x["metadata"]["name"], 300)
    d.setup_s["shared-storage"] = time.monotonic() - started
    source = d.volume / "source" / "samsum"
    source.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "tests" / "data" / "samsum_tiny.jsonl", source / "train.jsonl")
    data = d.render(f"overlays/infrastructure/{CLUSTER}/data")
    for x in data:
        if x["kind"] == "Job":
            cmd = x["spec"]["template"]["spec"]["containers"][0]["command"]
            cmd[cmd.index("--dataset") + 1] = "/shared/source/samsum"
    apply_in_namespaces(d.cluster, data)
    for x in data:
        if x["kind"] == "Job":
            wait_job(d.cluster, x["metadata"]["name"], 600)
    d.setup_s["data-staging"] = time.monotonic() - started


def admitted(d: Deployment) -> bool:
    """Kueue admitted the run's Workload."""
    for w in d.cluster.get("workloads.kueue.x-k8s.io", NS)["items"]:
        owners = {o["name"] for o in w["metadata"].get("ownerReferences", [])}
        conds = {c["type"]: c["status"] for c in w.get("status", {}).get("conditions", [])}
        if d.run in owners and conds.get("Admitted") == "True":
            return True
    return False


def assert_trained(d: Deployment) -> None:
    """Every step logged once, the last checkpoint and the metrics written as the trainer's user, and
    worker 0's progress annotation at the end."""
    records = metrics(d)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    checkpoints = d.volume / "checkpoints" / d.run
    kept = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    assert kept[-1] == f"step-{STEPS:08d}", kept
    assert (checkpoints / kept[-1]).stat().st_uid == TRAINER_UID
    assert (d.volume / "runs" / d.run / "metrics.jsonl").stat().st_uid == TRAINER_UID
    pod = d.cluster.get("pod", NS, name=f"{d.run}-worker-0")
    notes = pod["metadata"].get("annotations", {})
    assert notes.get("fsdp-gitops/step") == f"{STEPS}/{STEPS}", notes
