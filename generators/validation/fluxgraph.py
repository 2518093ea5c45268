"""The Flux graph of a bootstrap directory, checked the way Flux would walk it.

A bootstrap directory is a folder of plain manifests holding Flux Kustomizations
(overlays/clusters/<cluster>/, the --path of `flux bootstrap`). Starting there, every Kustomization whose
source is this repository is followed into its spec.path (built like kustomize-controller builds it),
and the Flux objects found there join the graph. Then:

- every Kustomization's sourceRef and every HelmRelease's chart source is defined in the graph;
- every spec.path of this repository exists, is not a kustomize Component, and builds;
- every dependsOn names a Kustomization (HelmRelease) of the graph, and dependsOn has no cycle;
- no object is applied by two Kustomizations (they would fight over it and prune it from each other);
- a Kustomization that applies a PyTorchJob waits, through its dependsOn chain, on no node agent: no
  Kustomization it depends on health-checks (wait: true, or healthChecks) a DaemonSet or a HelmRelease
  whose values tolerate the GPU taint (the DCGM exporter). A DaemonSet is Ready only once its pod runs
  on every node it selects, so one GPU node whose agent cannot start would hold back every new run;
  runs wait only on what they need (the operator, the queues, the storage, the data).

Sources declared in the bootstrap directory itself are this repository (Flux bootstrap puts the
repository's GitRepository there); sources that synced overlays declare point at other repositories
(the Training Operator's manifests, Helm charts), whose paths cannot be checked offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from generators.validation.index import RepoIndex
from generators.validation.manifests import (
    FLUX_KUSTOMIZATION,
    FLUX_SOURCE_GROUP,
    HELM_RELEASE,
    PYTORCHJOB,
    Doc,
    Problem,
    gvk,
    meta,
    norm,
    obj_name,
)

# Kinds without a namespace: a Kustomization's targetNamespace leaves them alone.
CLUSTER_SCOPED_KINDS = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
        "RuntimeClass",
        "IngressClass",
        "CSIDriver",
        "APIService",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ClusterQueue",
        "ResourceFlavor",
        "WorkloadPriorityClass",
        "NodePool",
        "EC2NodeClass",
        "NodeClaim",
        "ClusterPolicy",
    }
)

ObjectId = tuple[str, str, str, str]  # group, kind, namespace, name


@dataclass(frozen=True)
class FluxObject:
    doc: Doc

    @property
    def data(self) -> dict:
        return self.doc.data

    @property
    def ns(self) -> str:
        # Flux applies an object without a namespace to the default namespace.
        return meta(self.data, "namespace") or "default"

    @property
    def key(self) -> tuple[str, str]:
        return self.ns, meta(self.data, "name")

    @property
    def id(self) -> ObjectId:
        return gvk(self.data)[0], str(self.data.get("kind")), self.ns, meta(self.data, "name")

    def problem(self, message: str) -> Problem:
        return Problem(self.doc.file, self.doc.line, obj_name(self.data), message)


def object_id(data: Mapping[str, Any]) -> ObjectId:
    group, kind = gvk(data)
    return group, kind, meta(data, "namespace"), meta(data, "name")


def source_id(ref: Any, default_ns: str) -> ObjectId:
    ref = ref if isinstance(ref, dict) else {}
    return (
        FLUX_SOURCE_GROUP,
        str(ref.get("kind") or ""),
        str(ref.get("namespace") or default_ns),
        str(ref.get("name") or ""),
    )


def check_flux(repo: RepoIndex, roots: Sequence[str], kustomize: str) -> tuple[list[Problem], int]:
    """The Flux graph of each bootstrap directory; (problems, number of Flux Kustomizations)."""
    problems: list[Problem] = []
    total = 0
    for root_dir in roots:
        graph = FluxGraph(repo, root_dir, kustomize)
        problems += graph.problems + graph.check_dependencies() + graph.check_chart_sources() + graph.check_owners()
        problems += graph.check_run_prerequisites()
        total += len(graph.kustomizations)
    return problems, total


class FluxGraph:
    """The Flux objects reachable from one bootstrap directory, and what each Kustomization applies."""

    def __init__(self, repo: RepoIndex, root_dir: str, kustomize: str):
        self.repo, self.root_dir, self.kustomize = repo, root_dir, kustomize
        self.problems: list[Problem] = []
        bootstrap = repo.plain_dir_docs(root_dir, kustomize)
        self.objects = [FluxObject(d) for d in bootstrap if _is_flux(d.data)]
        self.sources = {o.id: o for o in self.objects if gvk(o.data)[0] == FLUX_SOURCE_GROUP}
        self.local_sources = set(self.sources)
        self.applied: dict[str, list[Doc]] = {f"the bootstrap directory {root_dir}": bootstrap}
        self.kustomizations: dict[tuple[str, str], FluxObject] = {}
        # Follow each Kustomization once its source is known; a source may come from what another
        # Kustomization applies, so keep going while that uncovers more.
        waiting: list[FluxObject] = []
        seen = 0
        while True:
            for o in self.objects[seen:]:
                if gvk(o.data) != FLUX_KUSTOMIZATION:
                    continue
                if o.key in self.kustomizations:
                    self.problems.append(o.problem(f"defined twice (also in {self.kustomizations[o.key].doc.file})"))
                else:
                    self.kustomizations[o.key] = o
                    waiting.append(o)
            seen = len(self.objects)
            ready = [o for o in waiting if self._source(o) in self.sources]
            if not ready:
                break
            waiting = [o for o in waiting if all(o is not r for r in ready)]
            for o in ready:
                self._follow(o)
        for o in waiting:
            self.problems.append(
                o.problem(
                    f"sourceRef {'/'.join(self._source(o)[1:])} is not defined in "
                    f"{self.root_dir} or in what it applies; define the source or fix the "
                    "reference"
                )
            )
        self.releases = {o.key: o for o in self.objects if gvk(o.data) == HELM_RELEASE}

    @staticmethod
    def _source(o: FluxObject) -> ObjectId:
        return source_id((o.data.get("spec") or {}).get("sourceRef"), o.ns)

    def _follow(self, o: FluxObject) -> None:
        spec = o.data.get("spec") or {}
        if self._source(o) not in self.local_sources:
            return
        path = str(spec.get("path") or "./")
        d = norm(path.lstrip("/"))
        if d.startswith(".."):
            self.problems.append(o.problem(f"spec.path {path} leaves the repository"))
            return
        if d == self.root_dir:
            return  # the sync that `flux bootstrap` commits (flux-system/gotk-sync.yaml): the bootstrap itself
        if d not in self.repo.dirs:
            self.problems.append(
                o.problem(f"spec.path {path} does not exist in the repository; fix the path or generate the overlay")
            )
            return
        if d in self.repo.kfiles:
            if self.repo.is_component(d):
                self.problems.append(
                    o.problem(f"spec.path {path} is a kustomize Component, which cannot be applied alone")
                )
                return
            build = self.repo.get_build(d, self.kustomize)
            if build.error:
                self.problems.append(o.problem(f"spec.path {path} does not build: {build.error}"))
                return
            # Name the file a Flux object comes from, not only the overlay that built it.
            docs = [
                Doc(x.data, self.repo.origin(build, str(x.data.get("kind")), meta(x.data, "name")), x.line)
                if _is_flux(x.data)
                else x
                for x in build.docs
            ]
        else:
            docs = self.repo.plain_dir_docs(d, self.kustomize)
        target_ns = spec.get("targetNamespace")
        if target_ns:
            docs = [Doc(_with_namespace(x.data, target_ns), x.file, x.line) for x in docs]
        self.applied[f"Kustomization {o.ns}/{meta(o.data, 'name')}"] = docs
        for x in docs:
            if _is_flux(x.data):
                fo = FluxObject(x)
                self.objects.append(fo)
                if gvk(x.data)[0] == FLUX_SOURCE_GROUP:
                    self.sources.setdefault(fo.id, fo)

    def check_dependencies(self) -> list[Problem]:
        """Every dependsOn resolves (namespace: the dependent's own by default) and there is no cycle."""
        problems = []
        for graph, kind in ((self.kustomizations, "Kustomization"), (self.releases, "HelmRelease")):
            edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
            for key, o in graph.items():
                edges[key] = []
                for dep in (o.data.get("spec") or {}).get("dependsOn") or []:
                    dep = dep if isinstance(dep, dict) else {}
                    target = (str(dep.get("namespace") or o.ns), str(dep.get("name") or ""))
                    if target in graph:
                        edges[key].append(target)
                    else:
                        problems.append(
                            o.problem(
                                f"dependsOn {kind} {target[0]}/{target[1]} does not exist in "
                                f"{self.root_dir} or in what it applies; fix the name or remove "
                                "the dependency"
                            )
                        )
            for cycle in find_cycles(edges):
                names = " -> ".join(k[1] for k in cycle + [cycle[0]])
                problems.append(graph[cycle[0]].problem(f"dependsOn cycle: {names}; remove one of these dependencies"))
        return problems

    def check_chart_sources(self) -> list[Problem]:
        problems = []
        for o in self.releases.values():
            spec = o.data.get("spec") or {}
            for ref in (((spec.get("chart") or {}).get("spec") or {}).get("sourceRef"), spec.get("chartRef")):
                if ref is None:
                    continue
                src = source_id(ref, o.ns)
                if src not in self.sources:
                    problems.append(
                        o.problem(
                            f"chart source {'/'.join(src[1:])} is not defined in {self.root_dir} "
                            "or in what it applies; define the source or fix the reference"
                        )
                    )
        return problems

    def check_run_prerequisites(self) -> list[Problem]:
        """No Kustomization that applies a PyTorchJob waits, through dependsOn, on a node agent."""
        by_id: dict[tuple[str, str, str], Any] = {}
        for docs in self.applied.values():
            for x in docs:
                if isinstance(x.data, dict):
                    by_id.setdefault((str(x.data.get("kind")), meta(x.data, "namespace"), meta(x.data, "name")), x.data)

        def label(o: FluxObject) -> str:
            return f"Kustomization {o.ns}/{meta(o.data, 'name')}"

        def checked(o: FluxObject) -> list[tuple[str, Any]]:
            spec = o.data.get("spec") or {}
            out = [("wait: true", x.data) for x in self.applied.get(label(o), [])] if spec.get("wait") is True else []
            for h in spec.get("healthChecks") or []:
                h = h if isinstance(h, dict) else {}
                ref = (str(h.get("kind")), str(h.get("namespace") or o.ns), str(h.get("name")))
                meta_ = {"name": ref[2], "namespace": ref[1]}
                out.append(
                    (
                        "healthChecks",
                        by_id.get(ref, {"apiVersion": h.get("apiVersion"), "kind": ref[0], "metadata": meta_}),
                    )
                )
            return out

        # (dependency, object) -> (how it is checked, why it is an agent, runs that wait on it)
        found: dict[tuple[tuple[str, str], str], tuple[str, str, list[str]]] = {}
        for key, run in sorted(self.kustomizations.items()):
            if not any(gvk(x.data) == PYTORCHJOB for x in self.applied.get(label(run), [])):
                continue
            seen: set[tuple[str, str]] = set()
            stack = [key]
            while stack:
                o = self.kustomizations[stack.pop()]
                for dep in (o.data.get("spec") or {}).get("dependsOn") or []:
                    dep = dep if isinstance(dep, dict) else {}
                    target = (str(dep.get("namespace") or o.ns), str(dep.get("name") or ""))
                    if target in self.kustomizations and target not in seen:
                        seen.add(target)
                        stack.append(target)
            for target in sorted(seen):
                for how, data in checked(self.kustomizations[target]):
                    why = node_agent(data)
                    if why:
                        found.setdefault((target, obj_name(data)), (how, why, []))[2].append(meta(run.data, "name"))
        problems = []
        for (target, what), (how, why, runs) in sorted(found.items()):
            others = f" and {len(runs) - 1} more runs" if len(runs) > 1 else ""
            problems.append(
                self.kustomizations[target].problem(
                    f"{runs[0]}{others} wait through dependsOn on {what} ({how}): {why}, so one node whose "
                    "agent cannot start holds back every new run; health-check only what runs need "
                    "(spec.healthChecks) or apply the agents in a Kustomization no run depends on"
                )
            )
        return problems

    def check_owners(self) -> list[Problem]:
        """No object is applied by two Kustomizations (or twice by one)."""
        appliers: dict[ObjectId, list[tuple[str, Doc]]] = {}
        for owner, docs in self.applied.items():
            for x in docs:
                if isinstance(x.data, dict):
                    appliers.setdefault(object_id(x.data), []).append((owner, x))
        problems = []
        for users in appliers.values():
            if len(users) > 1:
                who = sorted({u for u, _ in users})
                what = f"applied twice by {who[0]}" if len(who) == 1 else "applied by both " + " and ".join(who)
                x = users[-1][1]
                problems.append(Problem(x.file, x.line, obj_name(x.data), f"{what}; keep it in one place"))
        return problems


# The taint the GPU node groups carry (generators/render/provisioning.py GPU_TAINT).
GPU_TAINT_KEY = "nvidia.com/gpu"


def node_agent(data: Any) -> str:
    """Why an object is a node agent a run must not wait on ("" when it is not one)."""
    group, kind = gvk(data)
    if (group, kind) == ("apps", "DaemonSet"):
        return "a DaemonSet is Ready only once its pod runs on every node it selects"
    if (group, kind) == HELM_RELEASE and GPU_TAINT_KEY in repr((data.get("spec") or {}).get("values")):
        return "a HelmRelease of a GPU-node agent (its values tolerate the GPU taint) waits for its DaemonSet"
    return ""


def _is_flux(data: Any) -> bool:
    return gvk(data)[0].endswith(".toolkit.fluxcd.io")


def _with_namespace(data: Any, namespace: str) -> Any:
    if not isinstance(data, dict) or data.get("kind") in CLUSTER_SCOPED_KINDS:
        return data
    return {**data, "metadata": {**(data.get("metadata") or {}), "namespace": namespace}}


def find_cycles(edges: Mapping[Any, Sequence[Any]]) -> list[list[Any]]:
    """Each cycle a depth-first search meets, once, rotated to start at its smallest node."""
    cycles: list[list[Any]] = []
    state: dict[Any, int] = {}  # 1: on the current path, 2: done
    stack: list[Any] = []

    def visit(n: Any) -> None:
        state[n] = 1
        stack.append(n)
        for m in edges.get(n, ()):
            if state.get(m) == 1:
                cycle = stack[stack.index(m) :]
                k = cycle.index(min(cycle))
                cycle = cycle[k:] + cycle[:k]
                if cycle not in cycles:
                    cycles.append(cycle)
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return cycles
