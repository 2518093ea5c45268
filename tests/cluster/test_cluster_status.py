"""`python generators/status.py` against the real control plane with the Training Operator and kwok
nodes (tests/cluster/conftest.py), run as the user runs it: a subprocess with the cluster's kubeconfig.

A committed fsdp-p5 run is applied and the operator makes its pod on a fake p5 node (the first node of
test_cluster_operator.py's pool, so the pool's size stays what that module counts); rank 0's pod gets
the progress annotations trainer/progress.py writes, by the same JSON merge patch. A TrainJob (no
Trainer controller here: its status is written the way the controller writes it) carries its
annotations itself. The rows, in the table and in json, are the annotations and the phases the
conditions give; a type the server does not have is no runs, an unreachable server and an unknown
context are one line each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from generators import status
from tools.cluster import dryrun
from tools.cluster.cluster import Cluster
from trainer.progress import pod_annotations

pytestmark = pytest.mark.cluster

CLUSTER = "fsdp-p5"
INSTANCE = "p5.48xlarge"
NS = "fsdp"
TRAINJOB = "status-trainjob"
# A record as trainer.metrics logs it at step 120 of 1000: 880 steps x 4.5 s left.
RECORD = {"step": 120, "data_epoch": 0, "loss": 1.2345, "tokens_per_s": 45210.4, "step_time_s": 4.5, "time": 1.8e9}


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def status_command(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "generators/status.py", "--kubeconfig", str(kubeconfig or cluster.kubeconfig), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def table_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "RUN",
        "API",
        "PHASE",
        "STEP",
        "TOKENS/S",
        "ETA",
        "CHECKPOINT",
        "RESTARTS",
    ], lines[0]
    return {line.split()[1]: line.split() for line in lines[1:]}


@pytest.fixture(scope="module")
def p5_node(cluster: Cluster) -> list[str]:
    if cluster.kubectl_result("get", "namespace", NS).returncode != 0:
        cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    if cluster.kubectl_result("get", "pvc", "-n", NS, "fsdp-shared").returncode != 0:
        pvc = only(dryrun.render(REPO_ROOT, f"overlays/infrastructure/{CLUSTER}/configs"), "PersistentVolumeClaim")
        cluster.apply([pvc])
        cluster.add_shared_volume(pvc)
    return cluster.add_gpu_nodes(INSTANCE, 1)


def test_status_lists_a_pytorchjob_and_a_trainjob_with_their_progress(cluster: Cluster, p5_node: list[str]) -> None:
    (run_dir,) = sorted((REPO_ROOT / "overlays" / "runs" / CLUSTER).glob("llama2-7b-*-n1-fullshard-*"))
    docs = dryrun.render(REPO_ROOT, str(run_dir.relative_to(REPO_ROOT)))
    run = only(docs, "PyTorchJob")["metadata"]["name"]
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": TRAINJOB, "namespace": NS, "labels": {"app.kubernetes.io/part-of": "fsdp-gitops"}},
        "spec": {"runtimeRef": {"name": "fsdp-torch"}},
    }
    cluster.apply(docs)
    try:
        pod = f"{run}-worker-0"

        def running() -> bool:
            job = cluster.get("pytorchjob", NS, name=run)
            conds = {c["type"]: c["status"] for c in job.get("status", {}).get("conditions", [])}
            pods = cluster.get("pods", NS, selector=f"training.kubeflow.org/job-name={run}")["items"]
            return conds.get("Running") == "True" and [p["status"].get("phase") for p in pods] == ["Running"]

        cluster.wait_for(running, 180, "the run's pod running")
        # Before any progress: the phase, no step, restarts from the pods (none on kwok).
        res = status_command(cluster)
        assert res.returncode == 0, res.stderr
        assert table_rows(res.stdout)[run] == [NS, run, "PyTorchJob", "Running", "-", "-", "-", "-", "0"]

        notes = pod_annotations(RECORD, 1000, checkpoint=100, restarts=1)
        assert notes["fsdp-gitops/eta"] == "1h06m"
        patch = json.dumps({"metadata": {"annotations": notes}})
        cluster.kubectl("patch", "pod", "-n", NS, pod, "--type=merge", "-p", patch)
        cluster.apply([trainjob])
        tj_notes = pod_annotations({**RECORD, "step": 1000}, 1000, done=True, checkpoint=1000)
        tj_notes.pop("fsdp-gitops/restarts")  # without the annotation: the pods' restart counts (no pods: 0)
        cluster.kubectl(
            "patch",
            "trainjob",
            "-n",
            NS,
            TRAINJOB,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"annotations": tj_notes}}),
        )

        res = status_command(cluster)
        assert res.returncode == 0, res.stderr
        found = table_rows(res.stdout)
        assert found[run] == [NS, run, "PyTorchJob", "Running", "120/1000", "45210", "1h06m", "100", "1"], res.stdout
        # No condition and no pod running yet: Pending.
        assert found[TRAINJOB] == [NS, TRAINJOB, "TrainJob", "Pending", "1000/1000", "45210", "done", "1000", "0"]
        assert [r[:2] for r in found.values()] == sorted(r[:2] for r in found.values())

        # The Trainer's Complete condition, written on the status subresource as its controller writes it.
        complete = {
            "type": "Complete",
            "status": "True",
            "reason": "JobsCompleted",
            "message": "jobs completed",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        cluster.kubectl(
            "patch", "trainjob", "-n", NS, TRAINJOB, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"conditions": [complete]}}),
        )  # fmt: skip
        res = status_command(cluster, "--format", "json", "--namespace", NS)
        assert res.returncode == 0, res.stderr
        by_name = {r["run"]: r for r in json.loads(res.stdout)}
        assert by_name[run] == {
            "namespace": NS,
            "run": run,
            "api": "PyTorchJob",
            "phase": "Running",
            "step": 120,
            "total_steps": 1000,
            "tokens_per_second": 45210,
            "eta": "1h06m",
            "checkpoint": 100,
            "restarts": 1,
        }
        assert by_name[TRAINJOB]["phase"] == "Succeeded" and by_name[TRAINJOB]["step"] == 1000, by_name[TRAINJOB]

        # Another namespace holds none of these runs.
        res = status_command(cluster, "--format", "json", "--namespace", "kube-system")
        assert (res.returncode, json.loads(res.stdout)) == (0, [])
    finally:
        cluster.kubectl("delete", "pytorchjob", "-n", NS, run, "--wait=false")
        cluster.kubectl("delete", "trainjob", "-n", NS, TRAINJOB, "--ignore-not-found", "--wait=false")


def test_a_type_the_server_does_not_have_is_no_runs(cluster: Cluster) -> None:
    kubectl = status.kubectl_runner(str(cluster.kubeconfig), None)
    assert status.list_objects(kubectl, "nosuchruns.example.com", None) == []
    assert isinstance(status.list_objects(kubectl, "pytorchjobs.kubeflow.org", None), list)


def test_an_unknown_context_and_an_unreachable_server_are_one_line_each(cluster: Cluster, tmp_path: Path) -> None:
    res = status_command(cluster, "--context", "nosuch")
    assert res.returncode == 2, res
    assert res.stderr.count("\n") == 1 and "--context" in res.stderr and "nosuch" in res.stderr, res.stderr

    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for c in config["clusters"]:
        c["cluster"]["server"] = "https://127.0.0.1:1"
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(yaml.safe_dump(config))
    res = status_command(cluster, kubeconfig=unreachable)
    assert res.returncode == 1, res
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: kubectl get "), res.stderr
    assert "Traceback" not in res.stderr
