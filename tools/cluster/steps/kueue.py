"""Kueue's real controller in the cluster harness, configured by what the repository ships.

    levels.start("operator", kueue=True)   # the step `kueue` (kueue="<cluster>": that cluster's release)
    kueue.start(cluster)                   # the same on a started level
    kueue.stop(cluster)                    # kills the process; its webhooks stay registered, as when its pod dies

What runs (sigs.k8s.io/kueue v0.16.2, tools/cluster/go/kueue, the release base/components/kueue installs):
- The manifests are the real chart's: charts/kueue of the same module zip, rendered by Helm's own
  template engine (tools/cluster/go/helm-template, the Helm packages Flux's helm-controller links) with
  the `values` of the repository's HelmRelease (base/components/kueue/controller/release.yaml, or a
  cluster's controllers overlay as kustomize builds it), then the HelmRelease's kustomize
  postRenderers applied with kustomize, as helm-controller applies them. Of those the harness applies
  the webhook configurations, the CRDs (with their conversion webhook) and the empty certificate
  Secret; the Deployment, Services and RBAC are what the harness replaces with a process.
- The process's configuration file is the chart's rendered ConfigMap (controller_manager_config.yaml:
  the repository's managerConfig plus what the chart adds, internalCertManagement) with only what a
  process on loopback needs changed: health, metrics and webhook servers on 127.0.0.1 ports picked at
  start, the webhook's certificate folder in the harness's work folder (a kubelet would mount the
  Secret at /tmp/k8s-webhook-server/serving-certs), leader election off (one replica), and the
  VisibilityOnDemand feature off (its API server binds port 8082 on every address and writes certificates
  to /visibility; it serves `kubectl get --raw` views of pending workloads only, nothing admission uses).
- Webhooks and conversion are called by URL instead of by Service (a Service would send the API server
  to a ClusterIP beyond loopback), on the host name of Kueue's serving certificate,
  kueue-webhook-service.kueue-system.svc: the harness adds it to the hosts file that the API
  server's private mount namespace sees (tools/cluster/certs.py), so it resolves to 127.0.0.1 there only.
- Certificates: Kueue's internal certificate management (open-policy-agent/cert-controller's
  rotator, as in the Training Operator) fills the Secret kueue-system/kueue-webhook-server-cert and
  injects the CA into the webhook configurations and the CRDs, then waits until the certificate is in
  its certificate folder (a kubelet's Secret volume); the harness copies the Secret's files there
  (tools/cluster/certs.py), as for the operator. Kueue needs no private mount namespace of its own: its certificate
  folder is a configuration field, not a hard-coded path.
"""

from __future__ import annotations

import copy
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, certs, processes, schemas
from tools.cluster.cluster import Cluster
from tools.cluster.processes import Process, free_port

SOURCE = schemas.Source("kueue", "sigs.k8s.io/kueue", ())
REPO_ROOT = build.HERE.parent.parent
RELEASE_FILE = REPO_ROOT / "base" / "components" / "kueue" / "controller" / "release.yaml"
NAMESPACE = "kueue-system"
RELEASE = "kueue"  # Flux's release name for HelmRelease kueue-system/kueue (no targetNamespace)
WEBHOOK_HOST = f"{RELEASE}-webhook-service.{NAMESPACE}.svc"  # the DNS name in Kueue's serving certificate
CERT_SECRET = f"{RELEASE}-webhook-server-cert"
WEBHOOK_CONFIGURATIONS = (
    ("mutatingwebhookconfiguration", f"{RELEASE}-mutating-webhook-configuration"),
    ("validatingwebhookconfiguration", f"{RELEASE}-validating-webhook-configuration"),
)
PROCESS = "kueue"
# The chart's templates the harness applies (the rest is the Deployment and what serves it).
TEMPLATES = ("templates/webhook/manifests.yaml", "templates/crd/", "templates/internalcert/")
CONFIG_TEMPLATE = "templates/manager/manager-config.yaml"


@dataclass
class Kueue:
    """What start() set up: the process, its ports and the manifests it applied."""

    process: Process
    webhook_port: int
    health_port: int
    config: dict[str, Any]
    manifests: list[dict[str, Any]]


def repository_release(cluster_name: str | None = None) -> dict[str, Any]:
    """The HelmRelease kueue as the repository ships it: base/components/kueue/controller/release.yaml,
    or as `kustomize build overlays/infrastructure/<cluster_name>/controllers` gives it."""
    if cluster_name is None:
        docs = yaml.safe_load_all(RELEASE_FILE.read_text())
    else:
        out = _run(
            [
                build.tool_path("kustomize"),
                "build",
                str(REPO_ROOT / "overlays" / "infrastructure" / cluster_name / "controllers"),
            ]
        )
        docs = yaml.safe_load_all(out)
    found = [
        d for d in docs if isinstance(d, dict) and d.get("kind") == "HelmRelease" and d["metadata"]["name"] == RELEASE
    ]
    if len(found) != 1:
        raise ValueError(f"no HelmRelease {RELEASE} in {cluster_name or RELEASE_FILE}")
    return found[0]


def render_chart(values: dict[str, Any], post_renderers: list[dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """charts/kueue of the pinned module rendered with `values`, then the HelmRelease's kustomize
    post-renderers (patches and images, in order), as Flux's helm-controller installs it."""
    work.mkdir(parents=True, exist_ok=True)
    chart = schemas.module_dir(SOURCE) / "charts" / "kueue"
    (work / "values.yaml").write_text(yaml.safe_dump(values))
    text = _run(
        [
            str(build.binary("helm-template")),
            str(chart),
            RELEASE,
            NAMESPACE,
            str(work / "values.yaml"),
            *TEMPLATES,
            CONFIG_TEMPLATE,
        ]
    )
    for i, renderer in enumerate(post_renderers):
        k = dict(renderer.get("kustomize") or {})
        unknown = set(renderer) - {"kustomize"} or set(k) - {"patches", "images"}
        if unknown:
            raise ValueError(f"postRenderers[{i}]: {sorted(unknown)} not supported by the harness")
        step = work / f"post-render-{i}"
        step.mkdir(exist_ok=True)
        (step / "rendered.yaml").write_text(text)
        (step / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": ["rendered.yaml"],
                    **k,
                }
            )
        )
        text = _run([build.tool_path("kustomize"), "build", str(step)])
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]


def for_process(docs: list[dict[str, Any]], webhook_port: int) -> list[dict[str, Any]]:
    """The rendered objects the harness applies, with every webhook and CRD conversion called by URL on
    the certificate's host name instead of by Service."""
    out = []
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            continue  # the configuration goes into the process's file (config_for_process)
        doc = copy.deepcopy(doc)
        if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in doc["webhooks"]:
                hook["clientConfig"] = _by_url(hook["clientConfig"], webhook_port)
        if doc["kind"] == "CustomResourceDefinition":
            webhook = ((doc["spec"].get("conversion") or {}).get("webhook")) or {}
            if "clientConfig" in webhook:
                webhook["clientConfig"] = _by_url(webhook["clientConfig"], webhook_port)
        out.append(doc)
    return out


def _by_url(client_config: dict[str, Any], port: int) -> dict[str, Any]:
    service = client_config.get("service")
    if not service:
        return client_config
    return {"url": f"https://{WEBHOOK_HOST}:{port}{service.get('path', '/')}"}


def rendered_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """controller_manager_config.yaml of the chart's rendered ConfigMap: what the Kueue pod reads."""
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{RELEASE}-manager-config"]
    return yaml.safe_load(cm["data"]["controller_manager_config.yaml"])


def config_for_process(
    config: dict[str, Any], *, webhook_port: int, health_port: int, metrics_port: int, cert_dir: Path
) -> dict[str, Any]:
    """The pod's configuration with only the loopback process's differences (see the module docstring)."""
    cfg = copy.deepcopy(config)
    cfg.setdefault("namespace", NAMESPACE)
    cfg["health"] = {**(cfg.get("health") or {}), "healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    cfg["metrics"] = {**(cfg.get("metrics") or {}), "bindAddress": f"127.0.0.1:{metrics_port}"}
    cfg["webhook"] = {**(cfg.get("webhook") or {}), "port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)}
    cfg["leaderElection"] = {**(cfg.get("leaderElection") or {}), "leaderElect": False}
    cfg["featureGates"] = {**(cfg.get("featureGates") or {}), "VisibilityOnDemand": False}
    return cfg


def install(cluster: Cluster, release: dict[str, Any] | None = None, *, webhook_port: int) -> list[dict[str, Any]]:
    """Render Kueue's chart with the HelmRelease `release` (default: the repository's) and apply what the
    harness keeps of it, its webhooks and conversion calling https://WEBHOOK_HOST:`webhook_port`; starts
    nothing (so Kueue is "not serving", as while its pod starts). Returns the whole rendering."""
    release = release or repository_release()
    spec = release.get("spec") or {}
    work = Path(cluster.work) / "kueue"
    docs = render_chart(spec.get("values") or {}, list(spec.get("postRenderers") or []), work / "chart")
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    cluster.apply(for_process(docs, webhook_port))
    return docs


def start(cluster: Cluster, release: dict[str, Any] | None = None, *, timeout_s: float = 240) -> Kueue:
    """install() Kueue into `cluster` and start the controller as a process; returns once its webhooks
    answer. `release`: the HelmRelease whose values and post-renderers configure Kueue (default: the one
    of the level's option `kueue` when it names a cluster of matrix.yaml, else the repository's)."""
    if release is None and isinstance(cluster.options.get("kueue"), str):
        release = repository_release(cluster.options["kueue"])
    work = Path(cluster.work) / "kueue"
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    certs.add_host(cluster, WEBHOOK_HOST)
    docs = install(cluster, release, webhook_port=webhook_port)
    folder = work / "certs"
    folder.mkdir(parents=True, exist_ok=True)
    config = config_for_process(
        rendered_config(docs),
        webhook_port=webhook_port,
        health_port=health_port,
        metrics_port=metrics_port,
        cert_dir=folder,
    )
    (work / "controller_manager_config.yaml").write_text(yaml.safe_dump(config))
    proc = cluster.start_process(
        PROCESS,
        [build.binary("kueue"), f"--config={work / 'controller_manager_config.yaml'}", "--zap-log-level=2"],
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    copied = lambda: certs.copy_secret(cluster, NAMESPACE, CERT_SECRET, folder)  # noqa: E731
    proc.wait_ready(copied, timeout_s, "writing its webhook certificate")
    ready = f"http://127.0.0.1:{health_port}/readyz"
    proc.wait_ready(lambda: cluster.get_url(ready) == "ok", timeout_s, "ready")
    proc.wait_ready(lambda: webhook_answers(cluster), 60, "answering its webhooks")
    kueue = Kueue(proc, webhook_port, health_port, config, for_process(docs, webhook_port))
    cluster.addons["kueue"] = kueue
    return kueue


def webhook_answers(cluster: Cluster) -> bool:
    """A ClusterQueue create (dry run) goes through Kueue's mutating and validating webhooks, which
    have failurePolicy Fail: it succeeds only while the API server reaches Kueue."""
    probe = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "harness-probe"},
        "spec": {"namespaceSelector": {}, "resourceGroups": []},
    }
    res = cluster.kubectl_result("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(probe))
    return res.returncode == 0


def stop(cluster: Cluster) -> None:
    """Kill the Kueue process (SIGTERM, then SIGKILL); its webhook configurations stay registered."""
    proc = cluster.procs.pop(PROCESS, None)
    if proc is not None:
        processes.stop(proc)


def uninstall(cluster: Cluster) -> None:
    """Remove Kueue's webhook configurations (what `helm uninstall` removes first)."""
    for kind, name in WEBHOOK_CONFIGURATIONS:
        cluster.kubectl("delete", kind, name, "--ignore-not-found")


def _run(args: list[str]) -> str:
    res = subprocess.run(args, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed: {res.stderr.strip()}")
    return res.stdout
