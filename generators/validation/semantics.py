"""Checks no schema can make, on the objects a kustomize build or a manifest file yields.

On every object: images well formed and pinned by tag or digest, never `latest`
(generators/matrix/images.py), no secret written inline in a container's command, arguments or env
values, no unencrypted Secret. On every PyTorchJob that gets
applied: its GPUs and EFA interfaces fit the instance type it is pinned to (trainer/catalog.py),
torchrun's processes per node equal its GPUs, its pods are not privileged, the ConfigMaps it mounts come
with it; across runs: rendezvous ids and output directories on the shared volume are unique.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from generators.core.yamlio import SafeLoader
from generators.matrix.images import image_problem
from generators.validation.manifests import HELM_RELEASE, PYTORCHJOB, Doc, Problem, gvk, meta, obj_name, walk
from trainer.catalog import INSTANCE_TYPES, InstanceType, efa_for

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"


# Trainer config keys (trainer/config.py) naming directories a run writes to: two runs must not share one.
RUN_DIR_KEYS = {
    "checkpoint.dir": "checkpoint directory",
    "checkpoint.export_dir": "export directory",
    "metrics.output_dir": "metrics directory",
}

SECRET_PATTERNS = (
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), "a Hugging Face token"),
    (re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), "an AWS access key id"),
    (re.compile(r"--(?:hf[-_])?token[= ]+(?![\"']?\$)[\"']?[^\s\"'$]+"), "a literal --token value"),
    (
        re.compile(r"\b(?:[A-Z0-9]+_)*(?:TOKEN|SECRET|PASSWORD)=(?![\"']?\$)[\"']?([^\s\"'$;]+)"),
        "a literal secret assignment",
    ),
)
# An env name names a secret when one of its words does (HF_TOKEN, DB_PASSWORD, AWS_SECRET_ACCESS_KEY),
# not when a word merely contains one (TOKENIZERS_PARALLELISM, MAX_NEW_TOKENS).
SECRET_ENV_NAME = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|APIKEY|ACCESS_KEY|SECRET_KEY|API_KEY|"
    r"PRIVATE_KEY)(_|$)",
    re.I,
)
# Values that are settings, never credentials: switches, numbers and paths (USE_AUTH_TOKEN=true,
# HF_HUB_TOKEN_TIMEOUT=30, TOKEN_PATH-like values).
NOT_SECRET_VALUE = re.compile(r"^(true|false|yes|no|on|off|none|null|auto|-?[0-9]+(\.[0-9]+)?|\.{0,2}/.*)$", re.I)
# Env vars that name where a secret is, not the secret itself.
REFERENCE_ENV_SUFFIXES = ("_FILE", "_PATH", "_DIR", "_NAME", "_REF")


def containers(data: Any) -> Iterator[tuple[tuple[str, ...], dict]]:
    """(JSON path, container) for every container of every pod spec inside a manifest (anything with a
    list of containers: Deployments, DaemonSets, PyTorchJob replicas, ...)."""
    for at, v in walk(data):
        if isinstance(v, dict) and isinstance(v.get("containers"), list):
            for key in ("initContainers", "containers", "ephemeralContainers"):
                for i, c in enumerate(v.get(key) or []):
                    if isinstance(c, dict):
                        yield at + (key, str(i)), c


def looks_secret(value: Any) -> bool:
    """Whether a literal value could be a credential (judged by the value, not only the name)."""
    text = str(value).strip().strip("'\"")
    return bool(text) and not NOT_SECRET_VALUE.match(text)


def secret_problems(c: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(JSON path in the container, message) for each secret written inline in a container."""
    out: list[tuple[tuple[str, ...], str]] = []
    texts: list[tuple[tuple[str, ...], str, Any]] = [(("command",), "command", x) for x in c.get("command") or []] + [
        (("args",), "args", x) for x in c.get("args") or []
    ]
    for i, e in enumerate(c.get("env") or []):
        if not isinstance(e, dict):
            continue
        name, value = str(e.get("name") or ""), e.get("value")
        if value not in (None, "") and "valueFrom" not in e:
            texts.append((("env", str(i)), f"env {name}", value))
            if (
                SECRET_ENV_NAME.search(name)
                and not name.upper().endswith(REFERENCE_ENV_SUFFIXES)
                and looks_secret(value)
            ):
                out.append(
                    (
                        ("env", str(i)),
                        f"env {name} holds a literal value; take it from a Secret with "
                        "valueFrom.secretKeyRef or mount the Secret as a file",
                    )
                )
    for keys, where, text in texts:
        for pattern, what in SECRET_PATTERNS:
            found = pattern.search(text) if isinstance(text, str) else None
            if found and (not found.groups() or looks_secret(found.group(1))):
                out.append(
                    (
                        keys,
                        f"{where} contains {what}; keep it in a SOPS-encrypted Secret and read it "
                        "from the mounted file (HF_TOKEN_FILE for the Hugging Face token) or "
                        "valueFrom.secretKeyRef",
                    )
                )
                break
    return out


Blame = Callable[[Doc, tuple[str, ...]], str]


def reporter(problems: list[Problem], doc: Doc, blame: Blame) -> Callable[[tuple[str, ...], str], None]:
    """`bad(keys, msg)` for one object: appends a Problem against the file `blame` names for those
    keys, with the object's line only where that file is the object's own."""

    def bad(keys: tuple[str, ...], msg: str) -> None:
        file = blame(doc, keys)
        problems.append(Problem(file, doc.line if file == doc.file else 0, obj_name(doc.data), msg))

    return bad


def check_objects(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    """Checks that apply to every object: images, inline secrets, unencrypted Secrets. `blame` names the
    file that holds a field (for a build: the input file that set it)."""
    problems: list[Problem] = []
    for d in docs:
        data = d.data
        if not isinstance(data, dict):
            continue
        bad = reporter(problems, d, blame)

        for at, c in containers(data):
            label = f"container {c.get('name', '?')}"
            msg = image_problem(c.get("image"))
            if msg:
                bad(at + ("image",), f"{label}: {msg}")
            for keys, msg in secret_problems(c):
                bad(at + keys, f"{label}: {msg}")
        if gvk(data) == ("", "Secret") and "sops" not in data and (data.get("data") or data.get("stringData")):
            bad((), "Secret holds unencrypted data; encrypt the file with sops (see .sops.yaml)")
        if gvk(data) == HELM_RELEASE:
            for at, v in walk((data.get("spec") or {}).get("values"), ("spec", "values")):
                if isinstance(v, dict) and str(v.get("tag", "")) == "latest":
                    bad(at + ("tag",), "values use the image tag latest; pin a version")
    return problems


def _int(v: Any) -> int | None:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


def _flag_values(tokens: Sequence[str], names: Sequence[str]) -> list[str]:
    out = []
    for i, t in enumerate(tokens):
        for n in names:
            if t == n and i + 1 < len(tokens):
                out.append(tokens[i + 1])
            elif t.startswith(n + "="):
                out.append(t[len(n) + 1 :])
    return out


def _tokens(c: Mapping[str, Any]) -> list[str]:
    """command + args, shell scripts split into words, $(VAR) replaced from the container's env."""
    env = {
        str(e.get("name")): str(e.get("value"))
        for e in c.get("env") or []
        if isinstance(e, dict) and e.get("value") is not None
    }
    out = []
    for part in list(c.get("command") or []) + list(c.get("args") or []):
        s = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(part))
        try:
            out += shlex.split(s) if (" " in s or "\n" in s) else [s]
        except ValueError:
            out += s.split()
    return out


@dataclass(frozen=True)
class JobFacts:
    """What the cross-run checks need from one PyTorchJob."""

    doc: Doc
    rdzv_ids: tuple[str, ...]
    # (what, absolute path) of each directory the run writes to on the shared volume.
    run_dirs: tuple[tuple[str, str], ...]


def pinned_instance_type(pod: Mapping[str, Any]) -> str:
    """The one instance type a pod is pinned to, by nodeSelector or a required node affinity ("" if none)."""
    selected = (pod.get("nodeSelector") or {}).get(INSTANCE_TYPE_LABEL)
    if selected:
        return str(selected)
    affinity = (pod.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    for term in required.get("nodeSelectorTerms") or []:
        for e in term.get("matchExpressions") or []:
            if e.get("key") == INSTANCE_TYPE_LABEL and e.get("operator") == "In" and len(e.get("values") or []) == 1:
                return str(e["values"][0])
    return ""


def _limit(c: Mapping[str, Any], resource: str) -> int:
    return _int(((c.get("resources") or {}).get("limits") or {}).get(resource, 0)) or 0


# The one replica of a TrainJob composed with its runtime (generators/validation/trainjob.py NODE).
TRAINJOB_ROLE = "node"


def check_pytorchjob(
    doc: Doc,
    configmaps: Mapping[str, dict],
    instance_types: Mapping[str, InstanceType],
    blame: Blame = lambda doc, keys: doc.file,
) -> tuple[list[Problem], JobFacts]:
    """A PyTorchJob against the instance type its pods are pinned to, and the ids and directories that
    must be unique across runs. `configmaps`: data of the ConfigMaps applied with it, by namespace/name."""
    data, spec = doc.data, doc.data.get("spec") or {}
    elastic = spec.get("elasticPolicy") or {}
    problems: list[Problem] = []
    bad = reporter(problems, doc, blame)
    rdzv_ids = {str(elastic["rdzvId"])} if elastic.get("rdzvId") else set()
    run_dirs: set[tuple[str, str]] = set()
    replica_specs = spec.get("pytorchReplicaSpecs") or {}
    total_nodes = sum(_int((r or {}).get("replicas", 1)) or 0 for r in replica_specs.values())
    for role, replicas in sorted((spec.get("pytorchReplicaSpecs") or {}).items()):
        pod = ((replicas or {}).get("template") or {}).get("spec") or {}
        at = ("spec", "pytorchReplicaSpecs", role, "template", "spec")
        pod_containers = [c for c in pod.get("containers") or [] if isinstance(c, dict)]
        gpu_at = next(
            (
                at + ("containers", str(i), "resources", "limits", GPU_RESOURCE)
                for i, c in enumerate(pod_containers)
                if _limit(c, GPU_RESOURCE)
            ),
            at,
        )
        gpus = sum(_limit(c, GPU_RESOURCE) for c in pod_containers)
        efa = sum(_limit(c, EFA_RESOURCE) for c in pod_containers)

        instance = pinned_instance_type(pod)
        if not instance:
            bad(at, f"{role}: no nodeSelector {INSTANCE_TYPE_LABEL}; pin the pods to a GPU instance type")
        elif instance not in instance_types:
            bad(at + ("nodeSelector",), f"{role}: instance type {instance} is not in the catalog (trainer/catalog.py)")
        elif not 1 <= gpus <= instance_types[instance].num_gpus:
            have = instance_types[instance].num_gpus
            bad(gpu_at, f"{role}: requests {gpus} GPUs ({GPU_RESOURCE}) but {instance} has {have}; request 1 to {have}")
        elif efa != efa_for(instance_types[instance], gpus):
            want = efa_for(instance_types[instance], gpus)
            bad(
                gpu_at[:-1] + (EFA_RESOURCE,),
                f"{role}: requests {efa} EFA interfaces ({EFA_RESOURCE}) but {gpus} GPUs of {instance} "
                f"come with {want}; request {want}",
            )

        for n in (spec.get("nprocPerNode"), elastic.get("nProcPerNode")):
            if n is not None and str(n) not in ("gpu", "auto") and _int(n) != gpus:
                bad(("spec",), f"{role}: nprocPerNode is {n} but each pod has {gpus} GPUs; make them equal")
        if (pod.get("securityContext") or {}).get("privileged"):
            bad(
                at + ("securityContext", "privileged"),
                f"{role}: the pod is privileged; training pods need no privilege",
            )
        for i, c in enumerate(pod_containers):
            c_at = at + ("containers", str(i))
            if (c.get("securityContext") or {}).get("privileged"):
                bad(
                    c_at + ("securityContext", "privileged"),
                    f"{role}: container {c.get('name')} is privileged; training pods need no privilege",
                )
            tokens = _tokens(c)
            env = {str(e.get("name")): e.get("value") for e in c.get("env") or [] if isinstance(e, dict)}
            nprocs = _flag_values(tokens, ("--nproc_per_node", "--nproc-per-node"))
            nprocs += [str(env["PET_NPROC_PER_NODE"])] if env.get("PET_NPROC_PER_NODE") is not None else []
            for n in nprocs:
                if n not in ("gpu", "auto") and _int(n) != _limit(c, GPU_RESOURCE):
                    bad(
                        c_at + ("command",),
                        f"{role}: torchrun --nproc_per_node is {n} but the container has "
                        f"{_limit(c, GPU_RESOURCE)} GPUs ({GPU_RESOURCE}); make them equal",
                    )
            for n in _flag_values(tokens, ("--nnodes",)):
                most = _int(n.rsplit(":", 1)[-1])
                if most is not None and most != total_nodes:
                    pods = "trainer.numNodes" if role == TRAINJOB_ROLE else "replicas"
                    bad(
                        c_at + ("command",),
                        f"{role}: torchrun --nnodes is {n} but the job has {total_nodes} pods ({pods}): the "
                        f"rendezvous would wait for nodes that never come, or leave pods out; make them equal",
                    )
            backend = (_flag_values(tokens, ("--rdzv_backend", "--rdzv-backend")) or ["static"])[-1]
            for endpoint in _flag_values(tokens, ("--rdzv_endpoint", "--rdzv-endpoint")) if backend == "c10d" else []:
                host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
                name = meta(data, "name")
                if role == TRAINJOB_ROLE:
                    hosts = [f"{name}-{TRAINJOB_ROLE}-0-0.{name}"]
                else:
                    hosts = [f"{name}-worker-0", f"{name}-master-0"]
                if host.split(".svc", 1)[0] not in hosts and not any(host.startswith(w + ".") for w in hosts):
                    api = "a TrainJob's JobSet" if role == TRAINJOB_ROLE else "a PyTorchJob"
                    bad(
                        c_at + ("command",),
                        f"{role}: --rdzv-endpoint {endpoint} names no pod of this job: the first pod of {api} is "
                        f"{hosts[0]}, so the rendezvous never meets; fix: --rdzv-endpoint={hosts[0]}:29400",
                    )
            rdzv_ids.update(_flag_values(tokens, ("--rdzv_id", "--rdzv-id")))
            rdzv_ids.update([str(env["PET_RDZV_ID"])] if env.get("PET_RDZV_ID") else [])
            # Trainer overrides (section.key=value) on the command line name output directories too.
            for key, what in RUN_DIR_KEYS.items():
                run_dirs.update((what, t.split("=", 1)[1]) for t in tokens if t.startswith(key + "=/"))

        for v in pod.get("volumes") or []:
            ref = (v or {}).get("configMap") or {}
            if not ref.get("name"):
                continue
            cfg = configmaps.get(f"{meta(data, 'namespace')}/{ref['name']}")
            if cfg is None and not ref.get("optional"):
                # kustomize renames generated ConfigMaps (hash suffix, name prefix/suffix) but does not
                # rewrite references inside custom resources, so a stale name here is easy to get.
                bad(
                    at + ("volumes",),
                    f"{role}: volume {v.get('name')} mounts ConfigMap {ref['name']}, which is not "
                    "applied with the job; generate it with that exact name (kustomize does not "
                    "rename references inside a PyTorchJob)",
                )
            for text in (cfg or {}).values():
                run_dirs.update(_run_dirs(text))
    return problems, JobFacts(doc, tuple(sorted(rdzv_ids)), tuple(sorted(run_dirs)))


def _run_dirs(text: Any) -> list[tuple[str, str]]:
    """(what, path) of the absolute output directories of a trainer config held in a ConfigMap value."""
    if not isinstance(text, str) or "checkpoint" not in text:
        return []
    try:
        cfg = yaml.load(text, Loader=SafeLoader)
    except yaml.YAMLError:
        return []
    out = []
    for key, what in RUN_DIR_KEYS.items():
        section, name = key.split(".")
        part = cfg.get(section) if isinstance(cfg, dict) else None
        value = part.get(name) if isinstance(part, dict) else None
        if isinstance(value, str) and value.startswith("/"):
            out.append((what, value))
    return out


def check_unique(facts: Sequence[JobFacts]) -> list[Problem]:
    problems = []
    first: dict[tuple[str, str], JobFacts] = {}
    for f in facts:
        for key in [("rendezvous id", x) for x in f.rdzv_ids] + list(f.run_dirs):
            other = first.setdefault(key, f)
            if other is not f:
                problems.append(
                    Problem(
                        f.doc.file,
                        f.doc.line,
                        obj_name(f.doc.data),
                        f"{key[0]} {key[1]} is also used by {obj_name(other.doc.data)} "
                        f"({other.doc.file}); every run needs its own",
                    )
                )
    return problems


def check_jobs(
    applied: Sequence[tuple[Sequence[Doc], Blame]], instance_types: Mapping[str, InstanceType] = INSTANCE_TYPES
) -> tuple[list[Problem], int]:
    """PyTorchJob checks on the units that get applied as they are (the documents of one build or file,
    with its blame; not bases that others build on), and across them. (problems, PyTorchJobs checked)"""
    problems: list[Problem] = []
    facts: list[JobFacts] = []
    for docs, blame in applied:
        configmaps = {
            f"{meta(d.data, 'namespace')}/{meta(d.data, 'name')}": d.data.get("data") or {}
            for d in docs
            if gvk(d.data) == ("", "ConfigMap")
        }
        for d in docs:
            if gvk(d.data) == PYTORCHJOB:
                p, f = check_pytorchjob(d, configmaps, instance_types, blame)
                problems += p
                facts.append(f)
    return problems + check_unique(facts), len(facts)
