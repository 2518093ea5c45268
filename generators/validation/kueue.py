"""Kueue is scoped to the runs' namespace and to the job kinds the repository queues.

Kueue's admission webhooks have failurePolicy Fail: while Kueue is not serving (first install, an
upgrade, its pod evicted) the API server refuses every object they match. With the chart's default
values (sigs.k8s.io/kueue v0.16.2, charts/kueue/values.yaml and templates/webhook/manifests.yaml) that is
every Job in every namespace (the job-kind webhooks carry a namespaceSelector only when
managedJobsNamespaceSelector is set) and every Pod, Deployment and StatefulSet outside kube-system and
kueue-system (those three webhooks fail closed while "pod", "deployment" and "statefulset" are in
integrations.frameworks, which they are by default). So, for every HelmRelease of the Kueue chart:

- values.managerConfig.controllerManagerConfigYaml is set (the chart's default is the unscoped
  configuration above) and is a Kueue Configuration;
- its managedJobsNamespaceSelector is set and selects no system namespace (generators/matrix/load.py
  SYSTEM_NAMESPACES, each with the kubernetes.io/metadata.name label the API server gives it);
- manageJobsWithoutQueueName is not true (it would queue every unlabelled Job of a selected namespace);
- integrations.frameworks is set, lists kubeflow.org/pytorchjob (the runs) and nothing beyond QUEUED.

And per cluster (the builds under infrastructure/<cluster>/): the namespaces the selector selects,
among those the cluster's builds create, are exactly those that hold a LocalQueue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from generators.matrix.load import SYSTEM_NAMESPACES
from generators.validation.device_plugins import cluster_of
from generators.validation.manifests import HELM_RELEASE, Doc, Problem, gvk, meta, obj_name
from generators.validation.semantics import Blame, reporter

CONFIG_KEYS = ("spec", "values", "managerConfig", "controllerManagerConfigYaml")
# The job kinds the repository puts under Kueue: the runs (PyTorchJob or TrainJob), and the NCCL pre-flight Job.
QUEUED = ("kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob", "batch/job")
# Frameworks whose webhooks match objects every controller creates (the chart renders them with
# failurePolicy Fail when listed).
POD_BASED = ("pod", "deployment", "statefulset")
NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every Namespace
LOCAL_QUEUE = ("kueue.x-k8s.io", "LocalQueue")
EXAMPLE = "see base/components/kueue/controller/release.yaml"


def is_kueue_release(data: Any) -> bool:
    if gvk(data) != HELM_RELEASE:
        return False
    spec = data.get("spec") or {}
    chart = ((spec.get("chart") or {}).get("spec") or {}).get("chart")
    ref = (spec.get("chartRef") or {}).get("name")
    return "kueue" in (meta(data, "name"), chart, ref)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels; an empty selector matches everything."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(str(k)) != str(v):
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = str(e.get("key")), e.get("operator"), [str(v) for v in e.get("values") or []]
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }.get(str(op), False)
        if not ok:
            return False
    return True


def kueue_config(data: Any) -> tuple[dict[str, Any] | None, str]:
    """(the Configuration of a Kueue HelmRelease, "") or (None, what is wrong with it)."""
    raw: Any = data
    for k in CONFIG_KEYS:
        raw = raw.get(k) if isinstance(raw, dict) else None
    if raw is None:
        return None, (
            "sets no managerConfig.controllerManagerConfigYaml, so the chart's default applies: its Job webhook "
            "(failurePolicy Fail) matches every namespace and its Pod, Deployment and StatefulSet webhooks every "
            "namespace but kube-system and kueue-system, so none of those can be created while Kueue is down; "
            f"fix: set it with managedJobsNamespaceSelector and integrations.frameworks ({EXAMPLE})"
        )
    try:
        cfg = yaml.safe_load(str(raw))
    except yaml.YAMLError as e:
        return None, f"managerConfig.controllerManagerConfigYaml is not YAML ({str(e).splitlines()[0]})"
    if not isinstance(cfg, dict) or cfg.get("kind") != "Configuration":
        return None, "managerConfig.controllerManagerConfigYaml is not a Kueue Configuration (kind: Configuration)"
    return cfg, ""


def system_namespaces_selected(selector: Mapping[str, Any]) -> list[str]:
    return sorted(ns for ns in SYSTEM_NAMESPACES | {"kube-system"} if selector_matches(selector, {NAME_LABEL: ns}))


def check_kueue_values(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    """The values of every Kueue HelmRelease scope Kueue (see the module docstring)."""
    problems: list[Problem] = []
    for d in docs:
        if not is_kueue_release(d.data):
            continue
        bad = reporter(problems, d, blame)
        cfg, why = kueue_config(d.data)
        if cfg is None:
            bad(CONFIG_KEYS, why)
            continue
        selector = cfg.get("managedJobsNamespaceSelector")
        if not isinstance(selector, dict):
            bad(
                CONFIG_KEYS,
                "Kueue configuration sets no managedJobsNamespaceSelector: Kueue's default selects every "
                "namespace but kube-system and kueue-system, and the chart then leaves the Job webhooks "
                "(failurePolicy Fail) without a namespaceSelector, so no Job anywhere can be created while "
                "Kueue is down; fix: select the run namespace only, e.g. matchLabels fsdp-gitops/kueue: managed "
                f"({EXAMPLE})",
            )
        else:
            hit = system_namespaces_selected(selector)
            if hit:
                bad(
                    CONFIG_KEYS,
                    f"Kueue's managedJobsNamespaceSelector selects system namespaces ({', '.join(hit)}): "
                    "Kueue's webhooks (failurePolicy Fail) would refuse their Jobs while Kueue is down; "
                    f"fix: select the run namespace only, e.g. matchLabels fsdp-gitops/kueue: managed ({EXAMPLE})",
                )
        if cfg.get("manageJobsWithoutQueueName") is True:
            bad(
                CONFIG_KEYS,
                "Kueue configuration sets manageJobsWithoutQueueName: true, which suspends every Job without a "
                "queue label in the selected namespaces (the data staging and volume setup Jobs would never "
                "run); fix: false",
            )
        frameworks = (
            (cfg.get("integrations") or {}).get("frameworks") if isinstance(cfg.get("integrations"), dict) else None
        )
        if not isinstance(frameworks, list):
            bad(
                CONFIG_KEYS,
                "Kueue configuration sets no integrations.frameworks: Kueue's default enables every framework, "
                "pod, deployment and statefulset included, whose webhooks then fail closed; "
                f"fix: list only {', '.join(QUEUED)}",
            )
            continue
        extra = [str(f) for f in frameworks if f not in QUEUED]
        if extra:
            pod_based = [f for f in extra if f in POD_BASED]
            why = (
                f" ({', '.join(pod_based)}: the chart then renders those webhooks with failurePolicy Fail, so "
                "every Pod, Deployment or StatefulSet in the selected namespaces waits on Kueue)"
                if pod_based
                else ""
            )
            bad(
                CONFIG_KEYS,
                f"Kueue's integrations.frameworks lists {', '.join(extra)}, which the repository does not queue"
                f"{why}; fix: list only {', '.join(QUEUED)}",
            )
        if "kubeflow.org/pytorchjob" not in frameworks:
            bad(
                CONFIG_KEYS,
                "Kueue's integrations.frameworks lacks kubeflow.org/pytorchjob: the runs' queue label would be "
                "ignored and every run would start at once; fix: list kubeflow.org/pytorchjob",
            )
    return problems


def check_kueue_scope(units: Sequence[tuple[str, Sequence[Doc], Blame]]) -> list[Problem]:
    """Per cluster: the namespaces its Kueue selects, of those its builds create, are those with a LocalQueue."""
    by_cluster: dict[str, list[Doc]] = {}
    blames: dict[int, Blame] = {}
    for path, docs, blame in units:
        where = cluster_of(path)
        if where and where[0] == "infrastructure":
            by_cluster.setdefault(where[1], []).extend(d for d in docs if isinstance(d.data, dict))
            blames.update((id(d), blame) for d in docs)
    problems: list[Problem] = []
    for cluster, docs in sorted(by_cluster.items()):
        releases = [d for d in docs if is_kueue_release(d.data)]
        configs = [(d, kueue_config(d.data)[0]) for d in releases]
        selectors = [
            (d, c["managedJobsNamespaceSelector"])
            for d, c in configs
            if c and isinstance(c.get("managedJobsNamespaceSelector"), dict)
        ]
        if not selectors:
            continue  # no Kueue, or values check_kueue_values already reports
        namespaces = {meta(d.data, "name"): d for d in docs if gvk(d.data) == ("", "Namespace")}

        def report(d: Doc, msg: str) -> None:
            reporter(problems, d, blames[id(d)])(("metadata", "labels"), msg)

        queued = {meta(d.data, "namespace"): d for d in docs if gvk(d.data) == LOCAL_QUEUE}
        for release, selector in selectors:
            selected = {
                name
                for name, d in namespaces.items()
                if selector_matches(
                    selector, {**((d.data.get("metadata") or {}).get("labels") or {}), NAME_LABEL: name}
                )
            }
            for ns, q in sorted(queued.items()):
                if ns in namespaces and ns not in selected:
                    report(
                        namespaces[ns],
                        f"cluster {cluster}: Kueue's managedJobsNamespaceSelector does not select this namespace, "
                        f"which holds {obj_name(q.data)}: its runs are never queued and start at once; fix: label "
                        "it as the selector asks (the generator labels the run namespace fsdp-gitops/kueue: managed)",
                    )
            for ns in sorted(selected - set(queued)):
                report(
                    namespaces[ns],
                    f"cluster {cluster}: Kueue's managedJobsNamespaceSelector selects this namespace, which holds "
                    f"no LocalQueue: its Jobs would wait on Kueue's webhooks for nothing ({obj_name(release.data)}); "
                    "fix: select the run namespace only",
                )
    return problems


CLUSTER_QUEUE = ("kueue.x-k8s.io", "ClusterQueue")
RESOURCE_FLAVOR = ("kueue.x-k8s.io", "ResourceFlavor")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The Kueue framework that queues each job kind carrying the queue label.
FRAMEWORK_OF = {
    ("kubeflow.org", "PyTorchJob"): "kubeflow.org/pytorchjob",
    ("trainer.kubeflow.org", "TrainJob"): "trainer.kubeflow.org/trainjob",
    ("batch", "Job"): "batch/job",
}


def check_kueue_references(units: Sequence[tuple[str, Sequence[Doc], Blame]]) -> list[Problem]:
    """Per cluster, every Kueue reference resolves: a job's queue label names a LocalQueue of its
    namespace, the LocalQueue a ClusterQueue, the ClusterQueue's flavors ResourceFlavors, and the
    cluster's Kueue lists the framework of each queued job kind. A reference that resolves to nothing
    leaves the job suspended for good. A queued TrainJob is refused on its own: the pinned Kueue admits it
    with older Trainer types that drop its runtimePatches (docs/job-api.md#kueue-and-trainjobs)."""
    by_cluster: dict[str, dict[int, tuple[Doc, Blame]]] = {}
    # Only clusters whose Kueue (controllers) and queues (configs) are both in scope are judged.
    parts: dict[str, set[str]] = {}
    for path, docs, blame in units:
        where = cluster_of(path)
        if where and where[0] in ("infrastructure", "runs"):
            if where[0] == "infrastructure":
                part = path.rstrip("/").split(f"infrastructure/{where[1]}/", 1)[-1].split("/", 1)[0]
                parts.setdefault(where[1], set()).add(part)
            seen = by_cluster.setdefault(where[1], {})
            for d in docs:
                if isinstance(d.data, dict):
                    seen.setdefault(id(d), (d, blame))
    problems: list[Problem] = []
    for cluster, entries in sorted(by_cluster.items()):
        if not {"controllers", "configs"} <= parts.get(cluster, set()):
            continue
        docs = [d for d, _ in entries.values()]

        def report(
            d: Doc,
            keys: tuple[str, ...],
            msg: str,
            entries: dict[int, tuple[Doc, Blame]] = entries,
            cluster: str = cluster,
        ) -> None:
            reporter(problems, d, entries[id(d)][1])(keys, f"cluster {cluster}: {msg}")

        local = {(meta(d.data, "namespace"), meta(d.data, "name")): d for d in docs if gvk(d.data) == LOCAL_QUEUE}
        cluster_queues = {meta(d.data, "name"): d for d in docs if gvk(d.data) == CLUSTER_QUEUE}
        flavors = {meta(d.data, "name") for d in docs if gvk(d.data) == RESOURCE_FLAVOR}
        configs = [c for d in docs if is_kueue_release(d.data) for c in [kueue_config(d.data)[0]] if c]
        frameworks = {str(f) for c in configs for f in ((c.get("integrations") or {}).get("frameworks") or [])}
        reported: set[tuple[str, str, str]] = set()
        for d in docs:
            kind = gvk(d.data)
            queue = ((d.data.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
            if kind not in FRAMEWORK_OF or not queue:
                continue
            ns, key = meta(d.data, "namespace"), ("metadata", "labels", QUEUE_LABEL)
            if (obj_name(d.data), ns, "") in reported:
                continue
            reported.add((obj_name(d.data), ns, ""))
            if kind == ("trainer.kubeflow.org", "TrainJob"):
                report(
                    d,
                    key,
                    "a TrainJob queued with Kueue never starts: the pinned Kueue admits it with older Trainer "
                    "types that drop its runtimePatches, so its JobSet stays suspended "
                    "(docs/job-api.md#kueue-and-trainjobs); "
                    "fix: kueue: false for this cluster in the matrix, or job_api: pytorchjob",
                )
                continue
            if not configs:
                report(
                    d,
                    key,
                    f"the queue label names LocalQueue {queue}, but the cluster installs no Kueue, so the job is "
                    "never queued; fix: kueue: true for this cluster in the matrix, or drop the label",
                )
                continue
            if (ns, queue) not in local:
                have = sorted(f"{q}" for n, q in local if n == ns)
                report(
                    d,
                    key,
                    f"the queue label names LocalQueue {queue} in namespace {ns}, which the cluster's builds do not "
                    f"create, so the job stays suspended for good; fix: name {' or '.join(have) or 'a LocalQueue'} "
                    f"of namespace {ns}" + ("" if have else " (the configs overlay adds base/components/kueue/queues)"),
                )
            if FRAMEWORK_OF[kind] not in frameworks:
                report(
                    d,
                    key,
                    f"Kueue's integrations.frameworks lacks {FRAMEWORK_OF[kind]}, so the queue label of this "
                    f"{kind[1]} is ignored and it starts at once, outside the quota; fix: list {FRAMEWORK_OF[kind]}",
                )
        for (ns, name), q in sorted(local.items()):
            target = (q.data.get("spec") or {}).get("clusterQueue")
            if target not in cluster_queues:
                report(
                    q,
                    ("spec", "clusterQueue"),
                    f"LocalQueue {ns}/{name} names ClusterQueue {target}, which the cluster's builds do not create, "
                    f"so its jobs are never admitted; fix: name one of {', '.join(sorted(cluster_queues)) or 'none'}",
                )
        for name, cq in sorted(cluster_queues.items()):
            for i, group in enumerate((cq.data.get("spec") or {}).get("resourceGroups") or []):
                for j, flavor in enumerate(group.get("flavors") or []):
                    if flavor.get("name") not in flavors:
                        report(
                            cq,
                            ("spec", "resourceGroups", str(i), "flavors", str(j), "name"),
                            f"ClusterQueue {name} names ResourceFlavor {flavor.get('name')}, which the cluster's "
                            "builds do not create, so it admits nothing; fix: name one of "
                            f"{', '.join(sorted(flavors)) or 'none (add the ResourceFlavor)'}",
                        )
    return problems
