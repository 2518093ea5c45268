"""Taint the GPU nodes that Prometheus reports unhealthy, so that no new run is scheduled on them.

The PrometheusRule `fsdp` (base/monitoring/configs/prometheusrule-fsdp.yaml, group fsdp-gpu-health)
records `fsdp:gpu_unhealthy` for every node with a fatal GPU sign from the DCGM exporter: a fatal XID
(48, 63, 64, 74, 79, 94, 95), double-bit ECC errors, a failed or pending row remap, a GPU missing from
the exporter; its `reason` label says which. This process, Deployment monitoring/fsdp-gpu-health
(base/gpu-health), asks Prometheus every FSDP_GPU_HEALTH_POLL_S seconds (default 30)

    GET <FSDP_PROMETHEUS_URL>/api/v1/query?query=max by (node, reason) (max_over_time(fsdp:gpu_unhealthy[5m])) > 0

(FSDP_PROMETHEUS_URL default: kube-prometheus-stack's Prometheus Service in namespace monitoring) and
puts the taint `fsdp-gitops/gpu-unhealthy=true:NoSchedule` on each node it names, with the reasons in
the annotation `fsdp-gitops/gpu-unhealthy-reason`. The window of 5 minutes keeps a fatal sign that the
exporter showed briefly (an XID code overwritten by a later, harmless one) and bridges a restart of
this process.

The node is the `node` label, which the exporter's ServiceMonitor relabels from the exporter pod's
node name (base/monitoring/controllers/dcgm-exporter.yaml), so it is the Kubernetes Node's name
whatever the exporter's own host label says (its spelling changed between exporter releases, and
without NODE_NAME it is the pod's host name). A name that is no Node is reported once, not retried.

Why NoSchedule and never NoExecute: a run on the node fails by its own (a fatal XID ends the CUDA
context; the run restarts from its last checkpoint elsewhere, within its retry bound), and evicting
pods that still train would throw away work the node might yet save in a checkpoint. New runs and
restarted pods do not tolerate the taint, so they avoid the node. The taint is never removed here: a
person removes it after the repair, `kubectl taint node <node> fsdp-gitops/gpu-unhealthy-`
(docs/operations.md, A GPU node is unhealthy); a GPU reset clears the signs, so a node that keeps its
taint after they are gone was repaired and not yet released.

API access: the pod's service-account credentials (FSDP_SERVICEACCOUNT_DIR, default the standard
mount; the address in KUBERNETES_SERVICE_HOST/PORT), ClusterRole fsdp-gpu-health (get, list, patch on
nodes). Per poll: one LIST of nodes when Prometheus names any, then for each untainted one a JSON merge
patch of its taints and annotation, guarded by the resourceVersion it was read at (a conflict waits
for the next poll). One line on stdout per taint; a failure is one line on stderr and is retried at
the next poll. Run it as `python -m trainer.gpu_health`.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

PROMETHEUS_ENV = "FSDP_PROMETHEUS_URL"
POLL_ENV = "FSDP_GPU_HEALTH_POLL_S"
# kube-prometheus-stack's Prometheus Service for the HelmRelease kube-prometheus-stack in monitoring
# (base/monitoring/controllers/kube-prometheus-stack.yaml): <release>-prometheus, port 9090.
PROMETHEUS_URL = "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
POLL_S = 30.0
QUERY = "max by (node, reason) (max_over_time(fsdp:gpu_unhealthy[5m])) > 0"
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NODES = "/api/v1/nodes"
TAINT = {"key": "fsdp-gitops/gpu-unhealthy", "value": "true", "effect": "NoSchedule"}
REASON_ANNOTATION = "fsdp-gitops/gpu-unhealthy-reason"


class Api:
    """LIST and merge-PATCH of Nodes with in-cluster credentials."""

    def __init__(self, environ: Mapping[str, str]):
        sa_dir = environ.get("FSDP_SERVICEACCOUNT_DIR", SERVICEACCOUNT_DIR)
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SystemExit("error: KUBERNETES_SERVICE_HOST is not set: run this in a pod of the cluster")
        host = f"[{host}]" if ":" in host else host
        self.base = f"https://{host}:{port}"
        self.token_path = os.path.join(sa_dir, "token")
        self.context = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with open(self.token_path, encoding="utf-8") as fh:
            token = fh.read().strip()  # re-read: projected tokens are rotated
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                **({"Content-Type": "application/merge-patch+json"} if body is not None else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=10, context=self.context) as resp:
            return dict(json.loads(resp.read()))


def unhealthy_nodes(prometheus_url: str, query: str = QUERY) -> dict[str, list[str]]:
    """{node: sorted reasons} of the nodes the query returns (Prometheus' instant-query API)."""
    url = f"{prometheus_url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body.get('errorType')}: {body.get('error')}")
    out: dict[str, set[str]] = {}
    for series in body["data"]["result"]:
        labels = series["metric"]
        if labels.get("node"):
            out.setdefault(labels["node"], set()).add(labels.get("reason") or "unknown")
    return {node: sorted(reasons) for node, reasons in sorted(out.items())}


def tainted(node: Mapping[str, Any]) -> bool:
    return any(t.get("key") == TAINT["key"] for t in (node.get("spec") or {}).get("taints") or [])


def taint_patch(node: Mapping[str, Any], reasons: list[str]) -> dict[str, Any]:
    """The merge patch that adds the taint to the node's own (a merge patch replaces the whole list,
    hence the resourceVersion it was read at) and records the reasons."""
    meta = node["metadata"]
    return {
        "metadata": {
            "resourceVersion": meta["resourceVersion"],
            "annotations": {REASON_ANNOTATION: "; ".join(reasons)},
        },
        "spec": {"taints": [*((node.get("spec") or {}).get("taints") or []), dict(TAINT)]},
    }


def reconcile(api: Api, bad: Mapping[str, list[str]], unknown: set[str]) -> list[str]:
    """Taint every node of `bad` that is not tainted yet; the names tainted now. A name that is no Node
    is printed once (added to `unknown`)."""
    if not bad:
        return []
    nodes = {n["metadata"]["name"]: n for n in api.request("GET", NODES).get("items", [])}
    done = []
    for name, reasons in bad.items():
        node = nodes.get(name)
        if node is None:
            if name not in unknown:
                unknown.add(name)
                print(f"warning: Prometheus reports node {name} unhealthy, but no Node has that name", file=sys.stderr)
            continue
        if tainted(node):
            continue
        api.request("PATCH", f"{NODES}/{urllib.parse.quote(name)}", taint_patch(node, reasons))
        print(
            f"gpu-health: tainted node {name} {TAINT['key']}={TAINT['value']}:{TAINT['effect']} ({'; '.join(reasons)})",
            flush=True,
        )
        done.append(name)
    return done


def main(environ: Mapping[str, str] = os.environ) -> int:
    prometheus = environ.get(PROMETHEUS_ENV) or PROMETHEUS_URL
    try:
        poll_s = float(environ.get(POLL_ENV, str(POLL_S)))
    except ValueError:
        print(f"error: {POLL_ENV}={environ[POLL_ENV]!r} is not a number of seconds", file=sys.stderr)
        return 2
    if poll_s <= 0:
        print(f"error: {POLL_ENV}={environ[POLL_ENV]!r} must be above 0", file=sys.stderr)
        return 2
    api = Api(environ)
    unknown: set[str] = set()
    print(f"gpu-health: tainting the nodes {prometheus} reports for {QUERY}, every {poll_s:g} s", flush=True)
    while True:
        try:
            reconcile(api, unhealthy_nodes(prometheus), unknown)
        except (OSError, ValueError, KeyError) as e:
            reason = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else f"{type(e).__name__}: {e}"
            print(f"warning: GPU node health not reconciled ({reason}); retrying in {poll_s:g} s", file=sys.stderr)
        sys.stderr.flush()
        time.sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main())
