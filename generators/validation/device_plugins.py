"""Every extended resource a job requests is advertised where the job can run.

A node offers `nvidia.com/gpu` or `vpc.amazonaws.com/efa` only while the device plugin for it runs
there, and a DaemonSet runs only on nodes whose taints it tolerates and whose labels match its node
selector and required node affinity. So, per cluster:

- the nodes: each GPU node group of `provisioning/<cluster>/eksctl.yaml` (labels, instance type,
  taints) and each NodePool of `provisioning/<cluster>/karpenter/` (template labels and taints, one
  node per instance type its requirements allow). A cluster whose provisioning files define no
  node is not checked: its nodes are unknown (generators/cluster.py writes them for every cluster of the matrix);
- the jobs: every pod template of the cluster's runs and infrastructure that requests an extended
  resource (the PyTorchJobs, the NCCL pre-flight Jobs);
- the nodes a job selects: those matching its node selector and required node affinity and whose
  NoSchedule/NoExecute taints it tolerates (a job that selects none is a problem of its own);
- for every extended resource the job's containers request, a DaemonSet in that cluster's
  infrastructure (`infrastructure/<cluster>/...` builds) running a known device plugin image for it
  must select each of those nodes by the same rules.

Device plugins are recognised by image repository (ADVERTISERS), not by a label a manifest could
claim; a plugin installed some other way (a HelmRelease, the GPU operator) is invisible here and the
rule reports the resource as not advertised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from generators.validation.manifests import Doc, Problem, gvk, meta, obj_name
from generators.validation.readability import pod_specs

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Image repository (without tag) -> the extended resource its device plugin advertises.
ADVERTISERS = {
    "nvcr.io/nvidia/k8s-device-plugin": "nvidia.com/gpu",
    "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin": "vpc.amazonaws.com/efa",
}
# Resources the kubelet itself reports; everything else a container requests is an extended resource.
NATIVE = re.compile(r"^(cpu|memory|ephemeral-storage|hugepages-.+|storage)$")
CLUSTER_PATH = re.compile(r"(?:^|/)(?P<area>runs|infrastructure|provisioning)/(?P<cluster>[^/]+)(?:/|$)")


@dataclass(frozen=True)
class Node:
    source: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator", "Equal") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and str(t.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = str(expr.get("key") or ""), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def selects(pod: Mapping[str, Any], node: Node) -> bool:
    """The scheduler's predicates that depend on the pod and the node's labels and taints alone."""
    if any(node.labels.get(k) != str(v) for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms and not any(
        all(_expression_matches(e, node.labels) for e in t.get("matchExpressions") or []) for t in terms
    ):
        return False
    return all(
        _tolerates(pod.get("tolerations") or [], t)
        for t in node.taints
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )


def cluster_of(path: str) -> tuple[str, str] | None:
    """('runs' | 'infrastructure' | 'provisioning', cluster) of a generated path; None for base/ and the rest."""
    if path.startswith("base/"):
        return None
    m = CLUSTER_PATH.search(path)
    return (m.group("area"), m.group("cluster")) if m else None


def nodes_from_provisioning(docs: Iterable[Doc]) -> list[Node]:
    nodes = []
    for d in docs:
        data = d.data if isinstance(d.data, dict) else {}
        if data.get("kind") == "ClusterConfig":
            for ng in (data.get("managedNodeGroups") or []) + (data.get("nodeGroups") or []):
                types = [ng["instanceType"]] if ng.get("instanceType") else list(ng.get("instanceTypes") or [])
                for t in types:
                    labels = {**{k: str(v) for k, v in (ng.get("labels") or {}).items()}, INSTANCE_TYPE_LABEL: t}
                    nodes.append(Node(f"{d.file}: node group {ng.get('name')}", labels, tuple(ng.get("taints") or [])))
        elif gvk(data) == ("karpenter.sh", "NodePool"):
            spec = (data.get("spec") or {}).get("template") or {}
            labels = {k: str(v) for k, v in ((spec.get("metadata") or {}).get("labels") or {}).items()}
            s = spec.get("spec") or {}
            types = [
                v
                for r in s.get("requirements") or []
                if r.get("key") == INSTANCE_TYPE_LABEL and r.get("operator") == "In"
                for v in r.get("values") or []
            ]
            for t in types:
                nodes.append(
                    Node(
                        f"{d.file}: NodePool {meta(data, 'name')}",
                        {**labels, INSTANCE_TYPE_LABEL: t},
                        tuple(s.get("taints") or []),
                    )
                )
    return nodes


def requested(pod: Mapping[str, Any]) -> set[str]:
    out = set()
    for key in ("initContainers", "containers"):
        for c in pod.get(key) or []:
            res = (c or {}).get("resources") or {}
            for part in ("requests", "limits"):
                out |= {r for r in (res.get(part) or {}) if not NATIVE.match(r)}
    return out


def plugins(docs: Iterable[Doc]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(resource advertised, DaemonSet name, pod spec) of every known device plugin DaemonSet."""
    out = []
    for d in docs:
        if gvk(d.data) != ("apps", "DaemonSet"):
            continue
        pod = ((d.data.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in pod.get("containers") or []:
            repository = str((c or {}).get("image", "")).split("@")[0].rsplit(":", 1)[0]
            if repository in ADVERTISERS:
                out.append((ADVERTISERS[repository], obj_name(d.data), pod))
    return out


def check_device_plugins(
    units: Sequence[tuple[str, Sequence[Doc]]], provisioning: Mapping[str, Sequence[Doc]]
) -> list[Problem]:
    """`units`: (path, documents) of every build and manifest file; `provisioning`: file -> documents of
    the files under provisioning/ (eksctl and Karpenter, which are not cluster objects)."""
    jobs: dict[str, list[Doc]] = {}
    infra: dict[str, list[Doc]] = {}
    for path, docs in units:
        where = cluster_of(path)
        if where and where[0] in ("runs", "infrastructure"):
            jobs.setdefault(where[1], []).extend(docs)
        if where and where[0] == "infrastructure":
            infra.setdefault(where[1], []).extend(docs)
    nodes: dict[str, list[Node]] = {}
    for file, docs in provisioning.items():
        where = cluster_of(file)
        if where and where[0] == "provisioning":
            nodes.setdefault(where[1], []).extend(nodes_from_provisioning(docs))

    problems = []
    for cluster, docs in sorted(jobs.items()):
        if not nodes.get(cluster):
            continue
        advertisers = plugins(infra.get(cluster, []))
        for d in docs:
            if not isinstance(d.data, dict):
                continue
            for _, pod in pod_specs(d.data):
                wanted = requested(pod)
                if not wanted:
                    continue
                chosen = [n for n in nodes[cluster] if selects(pod, n)]
                if not chosen:
                    problems.append(
                        Problem(
                            d.file,
                            d.line,
                            obj_name(d.data),
                            f"selects no node of cluster {cluster} (node selector "
                            f"{pod.get('nodeSelector') or {}}, tolerations "
                            f"{[t.get('key') for t in pod.get('tolerations') or []]}); fix: pin an "
                            f"instance type the cluster provisions and tolerate its taints",
                        )
                    )
                    continue
                for resource in sorted(wanted):
                    for node in chosen:
                        if not any(r == resource and selects(p, node) for r, _, p in advertisers):
                            names = [n for r, n, _ in advertisers if r == resource]
                            problems.append(
                                Problem(
                                    d.file,
                                    d.line,
                                    obj_name(d.data),
                                    f"requests {resource}, but no device plugin DaemonSet in cluster {cluster}'s "
                                    f"infrastructure runs on {node.source} (labels {dict(node.labels)}, taints "
                                    f"{[t.get('key') for t in node.taints]}): "
                                    + (
                                        f"{', '.join(names)} does not tolerate its taints or select its labels"
                                        if names
                                        else "none advertises it"
                                    )
                                    + "; the job would stay Pending. Fix: base/device-plugins (tolerations, "
                                    "instance types)",
                                )
                            )
    return problems
