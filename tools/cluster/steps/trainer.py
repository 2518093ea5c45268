"""Kubeflow Trainer v2 and the JobSet controller in the cluster harness, for clusters with job_api: trainjob.

    levels.start("operator", trainjob=True)   # the step `kubeflow-trainer` (on the pods level too)
    trainer.stop(cluster, cluster.addons["kubeflow-trainer"])   # kills both, removes their webhooks

What runs (tools/cluster/go/kubeflow-trainer/go.mod: github.com/kubeflow/trainer/v2 v2.3.0 and
sigs.k8s.io/jobset v0.12.0, the releases base/components/kubeflow-trainer installs):
- the JobSet controller (`sigs.k8s.io/jobset`, main.go) and the Trainer controller manager
  (cmd/trainer-controller-manager), each configured by the file its upstream manifests mount from a
  ConfigMap (jobset: config/default's manager config; Trainer: manifests/base/manager's), with only
  what a process on loopback needs changed: health on a 127.0.0.1 port, metrics off, the webhook on a
  port picked at start, leader election off, the Trainer's status server on a free port;
- their webhook configurations and certificate Secrets from the same upstream manifests (kustomize
  builds of the module zips), with every webhook called by URL on the host name of the controller's
  serving certificate (jobset-webhook-service.jobset-system.svc,
  kubeflow-trainer-controller-manager.kubeflow-system.svc), which the harness adds to the hosts file
  the API server's private mount namespace sees; Deployments, Services and RBAC are what the process
  replaces (it talks to the API server as the harness's admin). The CRDs are the ones every harness
  level installs (tools/cluster/schemas.py, the same module zips).
- Certificates: both controllers run open-policy-agent/cert-controller's rotator, which fills the
  Secret and injects the CA into the webhook configurations, then waits for the files in the
  hard-coded folder /tmp/k8s-webhook-server/serving-certs (a kubelet's Secret volume); as for the
  Training Operator (tools/cluster/certs.py), each process gets a private /tmp where that folder is a
  bind mount of one the harness fills from the Secret. Each finds its namespace (kubeflow-system, jobset-system) by
  its default, as no service account file exists outside a pod.
"""

from __future__ import annotations

import copy
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, certs, processes, schemas
from tools.cluster.cluster import Cluster
from tools.cluster.processes import Process, free_port

TRAINER_SOURCE = schemas.Source("kubeflow-trainer", "github.com/kubeflow/trainer/v2", ())
JOBSET_SOURCE = schemas.Source("kubeflow-trainer", "sigs.k8s.io/jobset", ())
KEEP = ("Namespace", "Secret", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@dataclass(frozen=True)
class Controller:
    process: str  # the harness's name for the process
    binary: str  # tools/cluster/build.py name
    namespace: str
    service: str  # the webhook Service whose DNS name the serving certificate carries
    secret: str
    config_map: str

    @property
    def host(self) -> str:
        return f"{self.service}.{self.namespace}.svc"


JOBSET = Controller(
    "jobset", "jobset", "jobset-system", "jobset-webhook-service", "jobset-webhook-server-cert", "jobset-manager-config"
)
TRAINER = Controller(
    "trainer-controller-manager",
    "trainer-controller-manager",
    "kubeflow-system",
    "kubeflow-trainer-controller-manager",
    "kubeflow-trainer-webhook-cert",
    "kubeflow-trainer-config",
)


@dataclass
class Running:
    process: Process
    webhook_port: int
    health_port: int
    manifests: list[dict[str, Any]]


def _kustomize(folder: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [build.tool_path("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(folder)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kustomize build {folder} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if isinstance(d, dict)]


def upstream_manifests(c: Controller, work: Path) -> list[dict[str, Any]]:
    """The controller's upstream manifests from its module zip (JobSet: config/default; Trainer: the
    manager overlay without its JobSet, which manifests/third-party fetches from the network)."""
    if c is JOBSET:
        return _kustomize(schemas.module_dir(JOBSET_SOURCE) / "config" / "default")
    folder = work / "trainer-manifests"
    folder.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(schemas.module_dir(TRAINER_SOURCE) / "manifests", folder)  # kustomize wants relative
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": c.namespace,
                "resources": [
                    f"{base}/overlays/manager/namespace.yaml",
                    f"{base}/base/manager",
                    f"{base}/base/webhook",
                ],
                "secretGenerator": [
                    {"name": c.secret, "namespace": c.namespace, "options": {"disableNameSuffixHash": True}}
                ],
            }
        )
    )
    return _kustomize(folder)


def for_process(c: Controller, docs: list[dict[str, Any]], webhook_port: int) -> list[dict[str, Any]]:
    """What the harness applies: the namespace, the empty certificate Secret and the webhook
    configurations, each webhook called by URL on the certificate's host name."""
    out = []
    for doc in docs:
        if doc["kind"] not in KEEP or (doc["kind"] == "Secret" and doc["metadata"]["name"] != c.secret):
            continue
        doc = copy.deepcopy(doc)
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"].get("service") or {}
            hook["clientConfig"] = {"url": f"https://{c.host}:{webhook_port}{service.get('path', '/')}"}
        out.append(doc)
    return out


def config_for_process(c: Controller, docs: list[dict[str, Any]], webhook_port: int, health_port: int) -> dict:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == c.config_map]
    cfg = yaml.safe_load(cm["data"]["controller_manager_config.yaml"])
    cfg["health"] = {**(cfg.get("health") or {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    cfg["metrics"] = {**(cfg.get("metrics") or {}), "bindAddress": "0"}
    cfg["webhook"] = {**(cfg.get("webhook") or {}), "port": webhook_port}
    cfg["leaderElection"] = {**(cfg.get("leaderElection") or {}), "leaderElect": False}
    if "statusServer" in cfg:
        cfg["statusServer"] = {**cfg["statusServer"], "port": free_port()}
    return cfg


def start_one(cluster: Cluster, c: Controller, timeout_s: float = 300) -> Running:
    work = Path(cluster.work) / c.process
    work.mkdir(parents=True, exist_ok=True)
    webhook_port, health_port = free_port(), free_port()
    certs.add_host(cluster, c.host)
    docs = upstream_manifests(c, work)
    applied = for_process(c, docs, webhook_port)
    cluster.apply(applied)
    (work / "config.yaml").write_text(yaml.safe_dump(config_for_process(c, docs, webhook_port, health_port)))
    folder = work / "certs"
    folder.mkdir(exist_ok=True)
    proc = cluster.start_process(
        c.process,
        [str(build.binary(c.binary)), f"--config={work / 'config.yaml'}", "--zap-log-level=2"],
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
        private_ns=True,
        mounts=[(folder, certs.DEFAULT_CERT_DIR)],
        private_tmp=True,
    )

    copied = lambda: certs.copy_secret(cluster, c.namespace, c.secret, folder)  # noqa: E731
    proc.wait_ready(copied, timeout_s, "writing its webhook certificate")
    proc.wait_ready(lambda: cluster.get_url(f"http://127.0.0.1:{health_port}/readyz") == "ok", timeout_s, "ready")
    return Running(proc, webhook_port, health_port, applied)


def start(cluster: Cluster, timeout_s: float = 300) -> dict[str, Running]:
    """JobSet first (the Trainer creates JobSets through its webhooks), then the Trainer; returns once
    both answer their webhooks."""
    out = {JOBSET.process: start_one(cluster, JOBSET, timeout_s)}
    out[JOBSET.process].process.wait_ready(lambda: jobset_webhook_answers(cluster), 60, "answering its webhooks")
    out[TRAINER.process] = start_one(cluster, TRAINER, timeout_s)
    out[TRAINER.process].process.wait_ready(lambda: trainer_webhook_answers(cluster), 60, "answering its webhooks")
    cluster.addons["kubeflow-trainer"] = out
    return out


def jobset_webhook_answers(cluster: Cluster) -> bool:
    """A JobSet without replicated Jobs is refused by JobSet's validating webhook (failurePolicy Fail):
    the refusal names the webhook only while the API server reaches the controller."""
    probe = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "harness-probe", "namespace": "default"},
        "spec": {"replicatedJobs": []},
    }
    res = cluster.kubectl_result("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe))
    return res.returncode == 0 or 'admission webhook "vjobset.kb.io" denied' in res.stderr


def trainer_webhook_answers(cluster: Cluster) -> bool:
    """A TrainJob naming a runtime that does not exist is refused by the Trainer's validating webhook."""
    probe = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "harness-probe", "namespace": "default"},
        "spec": {"runtimeRef": {"name": "harness-no-such-runtime"}},
    }
    res = cluster.kubectl_result("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe))
    return 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied' in res.stderr


def stop(cluster: Cluster, running: dict[str, Running]) -> None:
    """Kill both processes and remove what start() applied of their webhooks (as `helm uninstall`)."""
    for name, r in reversed(list(running.items())):
        proc = cluster.procs.pop(name, None)
        if proc is not None:
            processes.stop(proc)
        for doc in r.manifests:
            if doc["kind"].endswith("WebhookConfiguration"):
                cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")
