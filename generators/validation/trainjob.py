"""The TrainJob path held to the PyTorchJob's rules: each TrainJob composed with the runtime it names.

A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) carries no pod template: the Trainer
builds its pods from the ClusterTrainingRuntime (or namespaced TrainingRuntime) it names, with the
TrainJob's `runtimePatches` merged in and its `trainer` applied to the container named "node" (the
torch plugin's trainer container). So the checks that apply to a PyTorchJob's pods apply to that
composition, which this module builds the way the Trainer does (v2.3.0, pkg/runtime/core/
trainingruntime.go and pkg/runtime/framework/plugins/jobset/builder.go):

- the runtime's replicated Job labelled trainer.kubeflow.org/trainjob-ancestor-step: trainer is the
  trainer Job; its pod template is the one the nodes run;
- each runtimePatches entry is a strategic merge patch of the JobSet spec: maps merge, lists of
  volumes, containers, init containers and env merge by name (volume mounts by mountPath), other lists
  are replaced;
- the trainer's image, command and args replace the node container's, its env is upserted by name, and
  resourcesPerNode is merged into the container's resources (a strategic merge too);
- numNodes is the number of pods, numProcPerNode the torchrun processes per pod.

The composition is shaped as a PyTorchJob whose one replica is named after the trainer Job ("node"),
so semantics.py (GPUs and EFA of the instance, torchrun processes, privilege, the ConfigMaps it
mounts, unique rendezvous ids and output directories), podsecurity.py, readability.py and
device_plugins.py judge it with the rules they hold for PyTorchJobs. Problems name the TrainJob and
are blamed on the file that holds the field: the TrainJob's for what it sets, the runtime's for the
rest. A TrainJob whose runtime no build applies is a problem of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from generators.validation.device_plugins import cluster_of
from generators.validation.manifests import Doc, Problem, gvk, meta, obj_name
from generators.validation.semantics import Blame

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINJOB = (TRAINER_GROUP, "TrainJob")
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE = "node"
# Lists a strategic merge patch merges by a key (k8s.io/api core/v1 patchMergeKey); others are replaced.
MERGE_KEYS = {
    "volumes": "name",
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "replicatedJobs": "name",
}
_REPLICA = ("spec", "pytorchReplicaSpecs", NODE)
# Rules of the Training Operator's own structure (generators/validation/operator_fields.py) that the
# PyTorchJob shape of a composition does not have to meet: the Trainer names the replica and its
# container "node", and JobSet, not the operator, reads the exit codes.
OPERATOR_ONLY = ("is not one the operator knows; use Master or Worker", "no container named pytorch;")
_POD = _REPLICA + ("template", "spec")


def smp(base: Any, patch: Any, key: str = "") -> Any:
    """A strategic merge of `patch` into `base` (a copy), as the API machinery merges the pod types."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = smp(base.get(k), v, k) if k in base else copy.deepcopy(v)
        return out
    merge_key = MERGE_KEYS.get(key)
    if merge_key and isinstance(base, list) and isinstance(patch, list):
        out_list = [copy.deepcopy(x) for x in base]
        for item in patch:
            at = next(
                (
                    i
                    for i, x in enumerate(out_list)
                    if isinstance(x, dict) and isinstance(item, dict) and x.get(merge_key) == item.get(merge_key)
                ),
                None,
            )
            if at is None:
                out_list.append(copy.deepcopy(item))
            else:
                out_list[at] = smp(out_list[at], item)
        return out_list
    return copy.deepcopy(patch)


def trainer_job(runtime: Mapping[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """(index, replicated Job) of the runtime's trainer Job, None when it has none."""
    jobs = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for i, job in enumerate(jobs):
        labels = (((job or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(ANCESTOR_LABEL) == "trainer":
            return i, job
    return None


@dataclass(frozen=True)
class Runtime:
    doc: Doc
    blame: Blame
    unit: str  # the build or file that applies it


@dataclass(frozen=True)
class Composed:
    """A TrainJob as the pods it makes, and whose file holds each of its fields."""

    doc: Doc  # shaped as a PyTorchJob (see the module docstring); file and line are the TrainJob's
    blame: Blame
    runtime: Runtime


def compose(job: Doc, job_blame: Blame, runtime: Runtime) -> Composed | None:
    """The pods of `job` made from `runtime`; None when the runtime has no trainer Job."""
    found = trainer_job(runtime.doc.data)
    if found is None:
        return None
    index, rjob = found
    spec = job.data.get("spec") or {}
    runtime_spec = copy.deepcopy(((runtime.doc.data.get("spec") or {}).get("template") or {}).get("spec") or {})
    # Fields the TrainJob sets: composed keys (below the replica) -> the TrainJob's own keys.
    from_job: dict[tuple[str, ...], tuple[str, ...]] = {}
    pod_patches: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for p_i, patch in enumerate(spec.get("runtimePatches") or []):
        patch_spec = ((((patch or {}).get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")) or {}
        if not patch_spec:
            continue
        runtime_spec = smp(runtime_spec, patch_spec)
        for r_i, rp in enumerate(patch_spec.get("replicatedJobs") or []):
            if (rp or {}).get("name") == rjob.get("name"):
                where: tuple[str, ...] = (
                    "spec", "runtimePatches", str(p_i), "trainingRuntimeSpec", "template", "spec", "replicatedJobs",
                    str(r_i), "template", "spec", "template",
                )  # fmt: skip
                pod_patches.append((where, (((rp.get("template") or {}).get("spec") or {}).get("template")) or {}))
    rjob = ((runtime_spec.get("replicatedJobs") or [])[index:] or [rjob])[0]
    template = copy.deepcopy(((rjob.get("template") or {}).get("spec") or {}).get("template") or {})
    pod = template.setdefault("spec", {})
    for where, pod_patch in pod_patches:
        for key in pod_patch.get("metadata") or {}:
            from_job[("template", "metadata", key)] = where + ("metadata", key)
        for key, value in (pod_patch.get("spec") or {}).items():
            merge_key = MERGE_KEYS.get(key)
            if not (merge_key and isinstance(value, list)):
                from_job[("template", "spec", key)] = where + ("spec", key)
                continue
            # A merged list: the items the patch names (the rest stay the runtime's).
            merged = pod.get(key) or []
            for i, item in enumerate(value):
                pos = next(
                    (n for n, x in enumerate(merged) if (x or {}).get(merge_key) == (item or {}).get(merge_key)), None
                )
                if pos is not None:
                    from_job[("template", "spec", key, str(pos))] = where + ("spec", key, str(i))
    trainer = spec.get("trainer") or {}
    containers = pod.get("containers") or []
    for c_i, c in enumerate(containers):
        if not isinstance(c, dict) or c.get("name") != NODE:
            continue
        at = ("template", "spec", "containers", str(c_i))
        for key in ("image", "command", "args"):
            if key in trainer:
                c[key] = copy.deepcopy(trainer[key])
                from_job[at + (key,)] = ("spec", "trainer", key)
        if trainer.get("env"):
            c["env"] = smp(c.get("env") or [], trainer["env"], "env")
            names = {str((e or {}).get("name")) for e in trainer["env"]}
            for e_i, e in enumerate(c["env"]):
                if str((e or {}).get("name")) in names:
                    from_job[at + ("env", str(e_i))] = ("spec", "trainer", "env")
        if "resourcesPerNode" in trainer:
            c["resources"] = smp(c.get("resources") or {}, trainer["resourcesPerNode"])
            from_job[at + ("resources",)] = ("spec", "trainer", "resourcesPerNode")
    nodes = trainer.get("numNodes", ((runtime.doc.data.get("spec") or {}).get("mlPolicy") or {}).get("numNodes", 1))
    composed: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": copy.deepcopy(job.data.get("metadata") or {}),
        "spec": {"pytorchReplicaSpecs": {NODE: {"replicas": nodes, "template": template}}},
    }
    if "numProcPerNode" in trainer:
        composed["spec"]["nprocPerNode"] = str(trainer["numProcPerNode"])
    runtime_at = ("spec", "template", "spec", "replicatedJobs", str(index), "template", "spec")

    def blame(doc: Doc, keys: tuple[str, ...]) -> str:
        if keys[: len(_REPLICA)] != _REPLICA:  # the job itself: metadata, processes per node
            if keys[:1] == ("metadata",):
                return job_blame(job, keys)
            return job_blame(job, ("spec", "trainer") + (("numProcPerNode",) if "nprocPerNode" in keys else ()))
        below = keys[len(_REPLICA) :]
        if below[:1] == ("replicas",):
            return job_blame(job, ("spec", "trainer", "numNodes"))
        for n in range(len(below), 0, -1):
            if below[:n] in from_job:
                return job_blame(job, from_job[below[:n]])
        # A whole list (volumes, containers) some of whose items the TrainJob patched: the TrainJob's.
        patched = [k for k in from_job if k[: len(below)] == below]
        if below and patched:
            return job_blame(job, from_job[patched[0]])
        return runtime.blame(runtime.doc, runtime_at + below if below else ())

    return Composed(Doc(composed, job.file, job.line), blame, runtime)


def runtimes_by_name(units: Sequence[tuple[str, Sequence[Doc], Blame]]) -> dict[tuple[str, str], list[Runtime]]:
    """(kind, name) -> the runtimes of that name the units apply (a namespaced one keyed namespace/name)."""
    out: dict[tuple[str, str], list[Runtime]] = {}
    for label, docs, blame in units:
        for d in docs:
            group, kind = gvk(d.data)
            if group == TRAINER_GROUP and kind in RUNTIME_KINDS:
                name = meta(d.data, "name")
                key = (kind, f"{meta(d.data, 'namespace')}/{name}" if kind == "TrainingRuntime" else name)
                out.setdefault(key, []).append(Runtime(d, blame, label))
    return out


def compose_trainjobs(
    units: Sequence[tuple[str, Sequence[Doc], Blame]],
) -> tuple[list[list[Composed]], list[Problem]]:
    """Per unit, its TrainJobs composed with their runtimes (from the same cluster's units where the unit
    belongs to a generated cluster); and a problem per TrainJob whose runtime no unit applies."""
    runtimes = runtimes_by_name(units)
    out: list[list[Composed]] = []
    problems: list[Problem] = []
    for label, docs, blame in units:
        mine: list[Composed] = []
        where = cluster_of(label)
        for d in docs:
            if gvk(d.data) != TRAINJOB:
                continue
            ref = (d.data.get("spec") or {}).get("runtimeRef") or {}
            if ref.get("apiGroup", TRAINER_GROUP) != TRAINER_GROUP:
                # The Trainer resolves only its own runtimes: another group's object is never found.
                problems.append(
                    Problem(
                        blame(d, ("spec", "runtimeRef", "apiGroup")),
                        d.line,
                        obj_name(d.data),
                        f"runtimeRef.apiGroup is {ref.get('apiGroup')!r}, but the Trainer resolves runtimes of "
                        f"{TRAINER_GROUP} only, so its pods would never be created. Fix: apiGroup: {TRAINER_GROUP}",
                    )
                )
                continue
            kind = str(ref.get("kind") or "ClusterTrainingRuntime")
            name = str(ref.get("name") or "")
            key = (kind, f"{meta(d.data, 'namespace')}/{name}" if kind == "TrainingRuntime" else name)
            candidates = runtimes.get(key, [])
            if where is not None:  # a generated run: its cluster's runtime, never another cluster's
                candidates = [r for r in candidates if (cluster_of(r.unit) or ("", ""))[1] == where[1]]
            if not candidates:
                problems.append(
                    Problem(
                        blame(d, ("spec", "runtimeRef", "name")),
                        d.line,
                        obj_name(d.data),
                        f"names {kind} {name or '(none)'}, which no build "
                        + (f"of cluster {where[1]} " if where else "")
                        + "applies; its pods would never be created. Fix: name the project's runtime fsdp-torch "
                        "(base/trainjob), which a job_api: trainjob cluster's configs apply",
                    )
                )
                continue
            c = compose(d, blame, candidates[0])
            if c is None:
                problems.append(
                    Problem(
                        candidates[0].doc.file,
                        candidates[0].doc.line,
                        obj_name(candidates[0].doc.data),
                        f"has no replicated Job labelled {ANCESTOR_LABEL}: trainer, so {obj_name(d.data)} has no "
                        "trainer pods; label the torch Job as base/trainjob/runtime.yaml does",
                    )
                )
                continue
            mine.append(c)
        out.append(mine)
    return out, problems


def as_trainjob(problems: Sequence[Problem], composed: Sequence[Composed]) -> list[Problem]:
    """Problems found on compositions name the TrainJob, not the PyTorchJob shape they were checked in."""
    names = {obj_name(c.doc.data): "TrainJob/" + obj_name(c.doc.data).split("/", 1)[1] for c in composed}
    out = []
    for p in problems:
        message = p.message
        for shape, name in names.items():
            message = message.replace(shape + " ", name + " ")
        out.append(replace(p, obj=names.get(p.obj, p.obj), message=message))
    return out


def object_problems(
    checks: Sequence[Callable[[Sequence[Doc], Blame], list[Problem]]], composed: Sequence[Composed]
) -> list[Problem]:
    """The object checks (pod security, readability, images, secrets) on each composition. What they find
    in the runtime alone is reported on the runtime already; what is new comes from the TrainJob, and a
    problem the check places in the runtime's fields (a volume the TrainJob's securityContext made
    unreadable) is blamed on the TrainJob."""
    out: list[Problem] = []
    for c in composed:
        for check in checks:
            known = {(p.file, p.message) for p in check([c.runtime.doc], c.runtime.blame)}
            runtime_file = c.runtime.blame(c.runtime.doc, ())
            for p in check([c.doc], c.blame):
                if (p.file, p.message) in known or any(rule in p.message for rule in OPERATOR_ONLY):
                    continue
                if p.file in (runtime_file, c.runtime.doc.file):
                    p = replace(p, file=c.blame(c.doc, ("metadata",)), line=0)
                out.append(p)
    return as_trainjob(out, composed)


def with_composed(docs: Sequence[Doc], blame: Blame, composed: Sequence[Composed]) -> tuple[list[Doc], Blame]:
    """A unit's documents with its compositions added, and a blame that knows both."""
    by_doc = {id(c.doc): c.blame for c in composed}
    return list(docs) + [c.doc for c in composed], lambda doc, keys: by_doc.get(id(doc), blame)(doc, keys)


def _is_trainer_release(data: Any) -> bool:
    if gvk(data) != ("helm.toolkit.fluxcd.io", "HelmRelease"):
        return False
    spec = data.get("spec") or {}
    chart = ((spec.get("chart") or {}).get("spec") or {}).get("chart")
    return "kubeflow-trainer" in (meta(data, "name"), chart, (spec.get("chartRef") or {}).get("name"))


def check_trainer_installed(units: Sequence[tuple[str, Sequence[Doc], Blame]]) -> list[Problem]:
    """Per cluster whose builds apply TrainJobs or Trainer runtimes: its controllers install the Trainer
    with its CRDs and JobSet (the chart's crds.enabled and jobset.install, CRDs created on install and
    replaced on upgrade). Without them Flux's apply of the runtime and the runs fails on unknown kinds, or
    the TrainJobs wait for a JobSet controller that is not there. Judged where the cluster's controllers
    are in scope."""
    users: dict[str, Doc] = {}
    releases: dict[str, list[tuple[Doc, Blame]]] = {}
    controllers: set[str] = set()
    for path, docs, blame in units:
        where = cluster_of(path)
        if not where or where[0] not in ("infrastructure", "runs"):
            continue
        if where[0] == "infrastructure" and path.rstrip("/").endswith(f"infrastructure/{where[1]}/controllers"):
            controllers.add(where[1])
        for d in docs:
            group, kind = gvk(d.data)
            if group == TRAINER_GROUP and (kind == "TrainJob" or kind in RUNTIME_KINDS):
                users.setdefault(where[1], d)
            elif _is_trainer_release(d.data):
                releases.setdefault(where[1], []).append((d, blame))
    problems: list[Problem] = []
    for cluster, user in sorted(users.items()):
        if cluster not in controllers:
            continue
        found = releases.get(cluster, [])
        if not found:
            problems.append(
                Problem(
                    user.file,
                    user.line,
                    obj_name(user.data),
                    f"cluster {cluster} applies Kubeflow Trainer objects but its controllers install no Trainer "
                    "(HelmRelease kubeflow-trainer), so their kinds are unknown to the API server; fix: job_api: "
                    "trainjob for the cluster in the matrix (its controllers add base/components/kubeflow-trainer)",
                )
            )
            continue
        for d, blame in found:
            spec = d.data.get("spec") or {}
            values = spec.get("values") or {}
            missing = [
                (keys, want)
                for keys, have, want in (
                    (("spec", "values", "crds", "enabled"), (values.get("crds") or {}).get("enabled"), "true"),
                    (("spec", "values", "jobset", "install"), (values.get("jobset") or {}).get("install"), "true"),
                    (("spec", "install", "crds"), (spec.get("install") or {}).get("crds"), "CreateReplace"),
                    (("spec", "upgrade", "crds"), (spec.get("upgrade") or {}).get("crds"), "CreateReplace"),
                )
                if str(have) != want and not (want == "true" and have is True)
            ]
            for keys, want in missing:
                problems.append(
                    Problem(
                        blame(d, keys),
                        d.line,
                        obj_name(d.data),
                        f"cluster {cluster}: the Trainer release does not install "
                        + ("JobSet" if "jobset" in keys else "the Trainer CRDs")
                        + f" ({'.'.join(keys[1:])} is not {want}), so its TrainJobs cannot run; fix: "
                        f"{'.'.join(keys[1:])}: {want}",
                    )
                )
    return problems
