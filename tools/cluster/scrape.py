"""The Prometheus scrape configuration prometheus-operator generates for PodMonitors and ServiceMonitors,
which the level option `prometheus` (tools/cluster/steps/prometheus.py) scrapes a cluster with.

    configs = scrape_configs(cluster.get("podmonitors.monitoring.coreos.com")["items"], kubeconfig=...)
    cluster.addons["prometheus"].scrape(configs, interval="1s")

The rules are prometheus-operator v0.85.0's (the version whose CRDs tools/cluster/go/crds pins),
pkg/prometheus/promcfg.go generatePodMonitorConfig / generateServiceMonitorConfig, for a Prometheus
object without scrape classes, enforced labels or limits and one shard: one scrape job per endpoint,
named `podMonitor/<namespace>/<name>/<i>` (`serviceMonitor/...`), Kubernetes service discovery of
role pod (endpoints) in the namespaces the namespaceSelector names (all with `any: true`, the
monitor's own without one), then these relabelings in order: the job into __tmp_prometheus_job_name;
pods in phase Failed or Succeeded dropped (unless filterRunning is false); a keep per matchLabels key
and per matchExpressions entry; a keep on the endpoint's port name (or number); namespace, container
and pod labels (ServiceMonitor: node, pod, namespace, service, pod, container); targetLabels and
podTargetLabels; job = "<namespace>/<name>" (ServiceMonitor: the Service's name), replaced by the
pod's (Service's) jobLabel label where it has one; endpoint = the port name; the endpoint's own
relabelings; the sharding relabelings with shard 0 of 1. metricRelabelings become
metric_relabel_configs.

What the operator would add from the Prometheus object is added here as keyword arguments instead:
`kubeconfig` (Prometheus runs beside the cluster, not in a pod with a service account token) and
`interval` (replaces every endpoint's scrape interval, so a test scrapes every second). A field this
module does not translate raises UnsupportedField naming it: nothing is silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

POD_MONITOR_FIELDS = {"jobLabel", "namespaceSelector", "selector", "podMetricsEndpoints", "podTargetLabels"}
SERVICE_MONITOR_FIELDS = {"jobLabel", "namespaceSelector", "selector", "endpoints", "targetLabels", "podTargetLabels"}
ENDPOINT_FIELDS = {
    "port",
    "portNumber",
    "path",
    "interval",
    "scrapeTimeout",
    "scheme",
    "params",
    "honorLabels",
    "honorTimestamps",
    "relabelings",
    "metricRelabelings",
    "filterRunning",
}
SELECTOR_FIELDS = {"matchLabels", "matchExpressions"}
NAMESPACE_SELECTOR_FIELDS = {"any", "matchNames"}
RELABEL_FIELDS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement", "action"}
SHARD = 0  # the operator's config reloader substitutes $(SHARD); one shard here
SHARDS = 1


class UnsupportedField(ValueError):
    """A monitor field this translation does not cover (it would be dropped silently otherwise)."""


def sanitize(name: str) -> str:
    """A Kubernetes label name as the meta label suffix Prometheus gives it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _check(where: str, obj: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise UnsupportedField(
            f"{where}: unsupported field(s) {', '.join(extra)} (supported: {', '.join(sorted(allowed))}); "
            "fix: extend tools/cluster/scrape.py from prometheus-operator's promcfg.go, or drop the field"
        )


def _namespaces(monitor: dict[str, Any], where: str) -> list[str]:
    sel = monitor["spec"].get("namespaceSelector") or {}
    _check(f"{where}.spec.namespaceSelector", sel, NAMESPACE_SELECTOR_FIELDS)
    if sel.get("any"):
        return []
    return list(sel.get("matchNames") or [monitor["metadata"]["namespace"]])


def _sd_config(monitor: dict[str, Any], role: str, where: str, kubeconfig: Path | None) -> list[dict[str, Any]]:
    sd: dict[str, Any] = {"role": role}
    names = _namespaces(monitor, where)
    if names:
        sd["namespaces"] = {"names": names}
    if kubeconfig is not None:
        sd["kubeconfig_file"] = str(kubeconfig)
    return [sd]


def _selector_relabelings(selector: dict[str, Any], kind: str, where: str) -> list[dict[str, Any]]:
    """`kind` is "pod" or "service": the keep/drop rules for matchLabels and matchExpressions."""
    _check(f"{where}.spec.selector", selector, SELECTOR_FIELDS)
    out: list[dict[str, Any]] = []
    label, present = f"__meta_kubernetes_{kind}_label_", f"__meta_kubernetes_{kind}_labelpresent_"
    for key in sorted(selector.get("matchLabels") or {}):
        value = selector["matchLabels"][key]
        out.append(
            {
                "action": "keep",
                "source_labels": [label + sanitize(key), present + sanitize(key)],
                "regex": f"({value});true",
            }
        )
    for exp in selector.get("matchExpressions") or []:
        key, op, values = exp["key"], exp["operator"], "|".join(exp.get("values") or [])
        if op in ("In", "NotIn"):
            action = "keep" if op == "In" else "drop"
            out.append(
                {
                    "action": action,
                    "source_labels": [label + sanitize(key), present + sanitize(key)],
                    "regex": f"({values});true",
                }
            )
        elif op in ("Exists", "DoesNotExist"):
            action = "keep" if op == "Exists" else "drop"
            out.append({"action": action, "source_labels": [present + sanitize(key)], "regex": "true"})
        else:
            raise UnsupportedField(f"{where}.spec.selector.matchExpressions: unknown operator {op!r}")
    return out


def _relabel(rules: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The CRD's RelabelConfig (camelCase) as Prometheus' relabel_config, in the operator's key order."""
    out = []
    for i, rule in enumerate(rules):
        _check(f"{where}[{i}]", rule, RELABEL_FIELDS)
        r: dict[str, Any] = {}
        for src, dst in (
            ("sourceLabels", "source_labels"),
            ("separator", "separator"),
            ("targetLabel", "target_label"),
            ("regex", "regex"),
            ("modulus", "modulus"),
            ("replacement", "replacement"),
        ):
            if rule.get(src) not in (None, "", [], 0):
                r[dst] = rule[src]
        if rule.get("action"):
            r["action"] = rule["action"].lower()
        out.append(r)
    return out


def _sharding() -> list[dict[str, Any]]:
    return [
        {
            "source_labels": ["__address__", "__tmp_hash"],
            "target_label": "__tmp_hash",
            "regex": "(.+);",
            "replacement": "$1",
            "action": "replace",
        },
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": SHARDS, "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": f"{SHARD};|.+;.+", "action": "keep"},
    ]


def _endpoint_head(job: str, ep: dict[str, Any], sd: list[dict[str, Any]], interval: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"job_name": job, "honor_labels": bool(ep.get("honorLabels", False))}
    if "honorTimestamps" in ep:
        cfg["honor_timestamps"] = bool(ep["honorTimestamps"])
    cfg["kubernetes_sd_configs"] = sd
    if interval or ep.get("interval"):
        cfg["scrape_interval"] = interval or ep["interval"]
    if ep.get("scrapeTimeout"):
        cfg["scrape_timeout"] = ep["scrapeTimeout"]
    if ep.get("path"):
        cfg["metrics_path"] = ep["path"]
    if ep.get("params"):
        cfg["params"] = ep["params"]
    if ep.get("scheme"):
        cfg["scheme"] = ep["scheme"]
    return cfg


def _endpoint_tail(cfg: dict[str, Any], ep: dict[str, Any], where: str) -> dict[str, Any]:
    if ep.get("metricRelabelings"):
        cfg["metric_relabel_configs"] = _relabel(ep["metricRelabelings"], f"{where}.metricRelabelings")
    return cfg


def _pod_target_labels(labels: Iterable[str], kind: str) -> list[dict[str, Any]]:
    return [
        {
            "source_labels": [f"__meta_kubernetes_{kind}_label_{sanitize(name)}"],
            "target_label": sanitize(name),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for name in labels
    ]


def pod_monitor_configs(
    monitor: dict[str, Any], *, interval: str | None = None, kubeconfig: Path | None = None
) -> list[dict[str, Any]]:
    """The scrape configs of one PodMonitor, one per podMetricsEndpoints entry."""
    meta, spec = monitor["metadata"], monitor["spec"]
    ns, name = meta["namespace"], meta["name"]
    where = f"PodMonitor {ns}/{name}"
    _check(f"{where}.spec", spec, POD_MONITOR_FIELDS)
    out = []
    for i, ep in enumerate(spec.get("podMetricsEndpoints") or []):
        ep_where = f"{where}.spec.podMetricsEndpoints[{i}]"
        _check(ep_where, ep, ENDPOINT_FIELDS)
        cfg = _endpoint_head(f"podMonitor/{ns}/{name}/{i}", ep, _sd_config(monitor, "pod", where, kubeconfig), interval)
        rel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        if ep.get("filterRunning", True):
            rel.append(
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}
            )
        rel += _selector_relabelings(spec.get("selector") or {}, "pod", where)
        if ep.get("port"):
            rel.append(
                {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]}
            )
        elif ep.get("portNumber"):
            rel.append(
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                    "regex": ep["portNumber"],
                }
            )
        rel += [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        ]
        rel += _pod_target_labels(spec.get("podTargetLabels") or [], "pod")
        rel.append({"target_label": "job", "replacement": f"{ns}/{name}"})
        rel += _job_and_endpoint(spec, ep, ep_where, "pod")
        cfg["relabel_configs"] = rel
        out.append(_endpoint_tail(cfg, ep, ep_where))
    return out


def _job_and_endpoint(spec: dict[str, Any], ep: dict[str, Any], ep_where: str, role: str) -> list[dict[str, Any]]:
    """The rules both monitor kinds end with, after their default `job`: the jobLabel's value (from the
    pod's or the service's labels) as `job`, the port name as `endpoint`, the endpoint's own
    relabelings, then the shard rules."""
    rel: list[dict[str, Any]] = []
    if spec.get("jobLabel"):
        rel.append(
            {
                "source_labels": [f"__meta_kubernetes_{role}_label_{sanitize(spec['jobLabel'])}"],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }
        )
    if ep.get("port"):
        rel.append({"target_label": "endpoint", "replacement": ep["port"]})
    return rel + _relabel(ep.get("relabelings") or [], f"{ep_where}.relabelings") + _sharding()


def service_monitor_configs(
    monitor: dict[str, Any], *, interval: str | None = None, kubeconfig: Path | None = None
) -> list[dict[str, Any]]:
    """The scrape configs of one ServiceMonitor (role endpoints, the operator's default), one per endpoint."""
    meta, spec = monitor["metadata"], monitor["spec"]
    ns, name = meta["namespace"], meta["name"]
    where = f"ServiceMonitor {ns}/{name}"
    _check(f"{where}.spec", spec, SERVICE_MONITOR_FIELDS)
    out = []
    for i, ep in enumerate(spec.get("endpoints") or []):
        ep_where = f"{where}.spec.endpoints[{i}]"
        _check(ep_where, ep, ENDPOINT_FIELDS - {"portNumber"})
        sd = _sd_config(monitor, "endpoints", where, kubeconfig)
        cfg = _endpoint_head(f"serviceMonitor/{ns}/{name}/{i}", ep, sd, interval)
        rel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        rel += _selector_relabelings(spec.get("selector") or {}, "service", where)
        if ep.get("port"):
            rel.append(
                {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]}
            )
        target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
        rel += [
            {
                "source_labels": list(target),
                "separator": ";",
                "regex": "Node;(.*)",
                "replacement": "${1}",
                "target_label": "node",
            },
            {
                "source_labels": list(target),
                "separator": ";",
                "regex": "Pod;(.*)",
                "replacement": "${1}",
                "target_label": "pod",
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ]
        if ep.get("filterRunning", True):
            rel.append(
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}
            )
        rel += _pod_target_labels(spec.get("targetLabels") or [], "service")
        rel += _pod_target_labels(spec.get("podTargetLabels") or [], "pod")
        rel.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"})
        rel += _job_and_endpoint(spec, ep, ep_where, "service")
        cfg["relabel_configs"] = rel
        out.append(_endpoint_tail(cfg, ep, ep_where))
    return out


def scrape_configs(
    monitors: Iterable[dict[str, Any]], *, interval: str | None = None, kubeconfig: Path | None = None
) -> list[dict[str, Any]]:
    """The scrape configs of every PodMonitor and ServiceMonitor among `monitors` (other kinds are skipped),
    ordered as the operator orders them: PodMonitors after ServiceMonitors, each by namespace/name."""
    found: dict[str, list[dict[str, Any]]] = {"ServiceMonitor": [], "PodMonitor": []}
    for m in monitors:
        if m.get("kind") in found:
            found[m["kind"]].append(m)
    out = []
    for kind, make in (("ServiceMonitor", service_monitor_configs), ("PodMonitor", pod_monitor_configs)):
        for m in sorted(found[kind], key=lambda m: (m["metadata"]["namespace"], m["metadata"]["name"])):
            out += make(m, interval=interval, kubeconfig=kubeconfig)
    return out
