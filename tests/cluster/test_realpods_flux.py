"""Flux on the real-pods level (tools/cluster/realpods.py, option flux): real Flux controllers reconcile
one matrix cluster's entry from the local git server, the controllers they install run as real pods,
and a tiny run trains to Succeeded.

The level: two p4de-shaped GPU nodes and one CPU node, no Training Operator or Kueue process: Flux
installs both, from the operator's upstream standalone manifests (webhooks by Service; the API server
reaches them with --enable-aggregator-routing) and from the real Kueue chart of the pinned module,
packaged as its release is (tools/cluster/image/controllers.py) and served under the pinned OCI name and
version. Their images are imported into the nodes under the upstream references (what `kind load
docker-image` does). Flux's own controllers, the git/Helm/OCI server and the API server run as
processes in the level's namespaces.

The served repository is the test's copy (tools/cluster/gitops.py: loopback sources, Secrets for a test
age key, stub charts for kube-prometheus-stack and dcgm-exporter, whose Prometheus operator, Grafana and
DCGM images are not built here; the real Prometheus scrape has its own test), its matrix reduced to
fsdp-p4de and one tiny run (test_realpods_runs.small_matrix: 2 nodes x 1 process, gloo) and expanded by
the real generator. Departures, each in the copy only, each a user's own kind of edit:
- kustomize `images:` points the trainer, busybox and etcd images at the imported test images (etcd:
  the harness's etcd 3.5 binary; the overlay's v3.5.26 is not built here);
- the data staging Job reads its dataset from a folder on the shared volume (the matrix has no field
  for a dataset's source: generators/render/data.py maps a dataset name to a hub dataset, and no hub
  is reachable here);
- the NCCL pre-flight Job (two whole p4de nodes, 8 ranks each, EFA expected) is applied suspended
  and without its queue label: admitted, it would hold every GPU of both nodes (and this machine's two
  cores with 16 ranks) until it failed on a node without EFA, and the run would wait behind it in
  Kueue. No run depends on it in Flux's graph (infra-configs does not wait for Jobs), which the test
  shows; the pre-flight itself runs in its own test, in a mode a CPU node can pass.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from realpods_support import (
    BUSYBOX_IMAGE,
    CLUSTER,
    INSTANCE,
    JOB_LABEL,
    NS,
    TRAINER_IMAGE,
    TRAINER_UID,
    Deployment,
    admitted,
    assert_trained,
    check_access,
    metrics,
    pod_problems,
    small_matrix,
    wait_run,
)
from support import REPO_ROOT

from tools.cluster import dryrun, gitops
from tools.cluster.build import tool_path
from tools.cluster.cluster import Cluster
from tools.cluster.image import controllers

pytestmark = [pytest.mark.realpods, pytest.mark.cluster, pytest.mark.slow]

REALPODS_OPTIONS = {"instance_type": INSTANCE, "gpu_nodes": 2, "cpu_node": True, "trainer": True, "flux": True}
ETCD_IMAGE = "quay.io/coreos/etcd"
# DaemonSets whose pods cannot start here, and why (their images are not built here, and the device
# plugins would find no device on a CPU machine); no Kustomization waits for them.
PENDING_DAEMONSETS = {
    ("device-plugins", "nvidia-device-plugin"): "the NVIDIA device plugin's image, and a GPU to find",
    ("device-plugins", "efa-device-plugin"): "the EFA device plugin's image, and an EFA device to find",
    ("node-tools", "htop"): "the node tools' image (built by docker/, not here)",
    ("node-tools", "nvtop"): "the node tools' image (built by docker/, not here)",
}


@dataclass
class FluxRun:
    deployment: Deployment
    clone: gitops.Clone
    times: dict[str, float]  # seconds since the fixture started: "ready", "run"


def _kustomize_images(folder: Any, pairs: list[tuple[str, str]]) -> None:
    for old, new in pairs:
        subprocess.run([tool_path("kustomize"), "edit", "set", "image", f"{old}={new}"], cwd=folder, check=True)


def _prepare_copy(pods: Cluster, clone: gitops.Clone) -> str:
    """The copy's matrix, expanded, with the departures of the module docstring; returns the run's name."""
    repo = clone.repo
    (repo / "matrix.yaml").write_text(yaml.safe_dump(small_matrix(), sort_keys=False))
    res = subprocess.run(
        [sys.executable, "generators/expand.py", "matrix.yaml"], cwd=repo, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    clone.localize()
    (run,) = [p.name for p in (repo / "overlays" / "runs" / CLUSTER).iterdir() if p.is_dir()]
    trainer, utility = pods.level.images[2].name, pods.level.images[1].name
    infra = repo / "overlays" / "infrastructure" / CLUSTER
    pairs = [(TRAINER_IMAGE, trainer), (BUSYBOX_IMAGE, utility)]
    for folder in [infra / "configs", infra / "storage", infra / "data", repo / "overlays" / "runs" / CLUSTER / run]:
        _kustomize_images(folder, pairs)
    _kustomize_images(infra / "controllers", [(ETCD_IMAGE, controllers.etcd_image().name)])
    job = infra / "data" / "samsum" / "job.data.yaml"
    text = job.read_text()
    assert "knkarthick/samsum" in text, text
    job.write_text(text.replace("knkarthick/samsum", "/shared/source/samsum"))
    preflight = infra / "configs" / "preflight-p4de" / "job.preflight.yaml"
    preflight.write_text(
        preflight.read_text()
        + "- op: remove\n  path: /metadata/labels/kueue.x-k8s.io~1queue-name\n"
        + "- op: add\n  path: /spec/suspend\n  value: true\n"
    )
    clone.commit_and_push("the test's matrix, images and local dataset")
    return run


@pytest.fixture(scope="module")
def flux_run(pods: Cluster) -> Iterator[FluxRun]:
    # The level stops after this module (no other asks for its options: tests/cluster/conftest.py).
    yield from _flux_run(pods)


def _flux_run(pods: Cluster) -> Iterator[FluxRun]:
    started = time.monotonic()
    clone = gitops.prepare(pods.work, pods.sources_url, 0, real_charts={"kueue": controllers.kueue_chart()})
    run = _prepare_copy(pods, clone)
    configs = dryrun.render(clone.repo, f"overlays/infrastructure/{CLUSTER}/configs")
    (pvc,) = [x for x in configs if x["kind"] == "PersistentVolumeClaim"]
    volume = pods.level.shared_volume(pvc)
    root = (volume.stat().st_uid, volume.stat().st_mode & 0o7777)
    # The dataset the staging Job reads: the repository's made-up samsum records, as a local folder.
    (volume / "source" / "samsum").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "tests" / "data" / "samsum_tiny.jsonl", volume / "source" / "samsum" / "train.jsonl")
    gitops.bootstrap(pods, clone, CLUSTER)
    times: dict[str, float] = {}
    pods.wait_for(
        lambda: not gitops.not_ready(pods) and _jobs(pods) == {run},
        600,
        f"every Kustomization and HelmRelease Ready and the run applied (still: {_not_ready_now(pods)})",
    )
    times["ready"] = time.monotonic() - started
    d = Deployment(pods, clone.repo, volume, run, times, root)
    yield FluxRun(d, clone, times)


def _jobs(cluster: Cluster) -> set[str]:
    return {j["metadata"]["name"] for j in cluster.get("pytorchjobs.kubeflow.org")["items"]}


def _not_ready_now(cluster: Cluster) -> str:
    try:
        return str(gitops.not_ready(cluster))
    except RuntimeError as e:
        return str(e)


def _available(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    dep = cluster.get("deployment", namespace, name=name)
    conds = {c["type"]: c["status"] for c in dep.get("status", {}).get("conditions", [])}
    assert conds.get("Available") == "True", (namespace, name, dep.get("status"))
    return dep


def test_flux_reconciles_the_cluster_until_every_kustomization_and_release_is_ready(flux_run: FluxRun) -> None:
    cluster = flux_run.deployment.cluster
    assert gitops.not_ready(cluster) == {}
    names = {k["metadata"]["name"] for k in cluster.get("kustomizations.kustomize.toolkit.fluxcd.io")["items"]}
    assert {
        "flux-system",
        "infra-controllers",
        "infra-configs",
        "secrets",
        "training-operator",
        "shared-storage",
        "data-staging",
        f"run-{flux_run.deployment.run}",
    } <= names


def test_the_operator_kueue_and_etcd_run_as_real_pods_from_the_upstream_manifests(flux_run: FluxRun) -> None:
    cluster = flux_run.deployment.cluster
    assert "training-operator" not in cluster.procs and "kueue" not in cluster.procs
    for namespace, name, image in (
        ("kubeflow", "training-operator", controllers.operator_reference()),
        ("kueue-system", "kueue-controller-manager", controllers.kueue_reference()),
        ("fsdp-system", "etcd", controllers.etcd_image().name),
    ):
        dep = _available(cluster, namespace, name)
        assert [c["image"] for c in dep["spec"]["template"]["spec"]["containers"]] == [image]
        (pod,) = cluster.get("pods", namespace, selector=",".join(f"{k}={v}" for k, v in _selector(dep).items()))[
            "items"
        ]
        assert pod["spec"]["nodeName"] == "cpu-0" and pod["status"]["phase"] == "Running", pod["status"]
    # The webhooks are called by Service (the upstream manifests), not by URL as on the kwok levels.
    hooks = cluster.get("validatingwebhookconfiguration", name="validator.training-operator.kubeflow.org")["webhooks"]
    assert all(h["clientConfig"].get("service", {}).get("namespace") == "kubeflow" for h in hooks)


def _selector(dep: dict[str, Any]) -> dict[str, str]:
    return dep["spec"]["selector"]["matchLabels"]


def test_the_daemonsets_that_cannot_run_here_stay_pending_and_hold_nothing(flux_run: FluxRun) -> None:
    cluster = flux_run.deployment.cluster
    pending = {}
    for ds in cluster.get("daemonsets")["items"]:
        key = (ds["metadata"]["namespace"], ds["metadata"]["name"])
        status = ds.get("status", {})
        if status.get("numberReady", 0) < status.get("desiredNumberScheduled", 0):
            pending[key] = status
    assert set(pending) == set(PENDING_DAEMONSETS), pending
    # They are scheduled on the two GPU nodes only (none tolerates nothing), and no Kustomization waits for
    # them: infra-controllers checks the health of exactly these, and every Kustomization is Ready.
    for key in pending:
        ds = cluster.get("daemonset", key[0], name=key[1])
        assert ds["status"]["desiredNumberScheduled"] == 2, ds["status"]
    infra = cluster.get("kustomizations.kustomize.toolkit.fluxcd.io", "flux-system", name="infra-controllers")
    assert {(c["kind"], c["name"]) for c in infra["spec"]["healthChecks"]} == {
        ("Kustomization", "training-operator"),
        ("HelmRelease", "kube-prometheus-stack"),
        ("Deployment", "etcd"),
        ("HelmRelease", "kueue"),
    }
    # The cluster autoscaler's image is not here either: its Deployment stays unavailable, unchecked.
    autoscaler = cluster.get("deployment", "kube-system", name="cluster-autoscaler")
    assert not autoscaler.get("status", {}).get("availableReplicas")
    assert gitops.not_ready(cluster) == {}


def test_the_preflight_job_is_applied_and_holds_no_run(flux_run: FluxRun) -> None:
    cluster = flux_run.deployment.cluster
    (job,) = [j for j in cluster.get("jobs", NS)["items"] if j["metadata"]["name"].startswith("fsdp-preflight")]
    assert job["spec"]["suspend"] is True
    run = cluster.get(
        "kustomizations.kustomize.toolkit.fluxcd.io", "flux-system", name=f"run-{flux_run.deployment.run}"
    )
    assert {d["name"] for d in run["spec"]["dependsOn"]} == {"infra-configs", "shared-storage", "data-staging"}


def test_the_storage_and_staging_jobs_ran_in_containers_and_wrote_the_marker(flux_run: FluxRun) -> None:
    d = flux_run.deployment
    assert d.root == (0, 0o755)
    for sub in ("data", "checkpoints", "runs"):
        assert (d.volume / sub).stat().st_uid == TRAINER_UID, sub
    marker = d.volume / "data" / "samsum" / "_COMPLETE"
    assert marker.is_file() and marker.stat().st_uid == TRAINER_UID
    assert (d.volume / "data" / "samsum" / "train.jsonl").stat().st_size > 0
    for job in d.cluster.get("jobs", NS)["items"]:
        if not job["metadata"]["name"].startswith("fsdp-preflight"):
            assert job.get("status", {}).get("succeeded") == 1, (job["metadata"]["name"], job.get("status"))


def test_the_tiny_run_is_admitted_by_kueue_and_trains_to_succeeded(flux_run: FluxRun) -> None:
    d = flux_run.deployment
    started = time.monotonic()
    d.cluster.wait_for(lambda: admitted(d), 180, "Kueue admits the run's Workload")
    try:
        d.cluster.wait_for(lambda: metrics(d), 300, "the first step")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {pod_problems(d.cluster, f'{JOB_LABEL}={d.run}')}") from None
    check_access(d, f"{d.run}-worker-1")
    wait_run(d)
    flux_run.times["run"] = time.monotonic() - started
    assert_trained(d)
    level = sum(d.cluster.timings.values())
    print(f"flux on real pods: level start {level:.0f} s, {flux_run.times}", file=sys.stderr)
