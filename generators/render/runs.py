"""A run's overlay: Plan -> {path relative to the output directory: manifest}. Pure, no I/O.

One kustomize overlay per run, in runs/<cluster>/<run>/:
- kustomization.yaml: base/pytorchjob, the run namespace, run labels, the trainer config as a
  ConfigMap `<run>-config` (configMapGenerator over train.yaml, without a hash suffix because the
  PyTorchJob's volume is a path kustomize does not rewrite), and the patch below;
- pytorchjob.run.yaml: a JSON patch on the base PyTorchJob (JSON patch rather than a strategic merge:
  kustomize has no schema for PyTorchJob, so a strategic merge would replace the whole container
  list). It starts with `test` operations on the list positions it patches, so a reordered base fails
  the build instead of patching the wrong entry;
- train.yaml: the fully resolved trainer config (trainer.config.to_dict), which the pods read from
  /etc/fsdp/train.yaml;
- rbac.yaml: ServiceAccount `<run>` the pods run as, and a Role and RoleBinding `<run>-progress` that
  allow it exactly one thing: `patch` on the run's own pods, by name (`<run>-worker-<i>`, the names the
  Training Operator gives them), which trainer/progress.py needs to write the progress annotations.
The per-cluster Flux entry and infrastructure overlays come from generators/render/flux.py.
"""
from __future__ import annotations

from typing import Any

from generators.core.writer import JsonPatch
from generators.plan import Plan
from generators.render.layout import Layout
from trainer.config import to_dict

BASE_PYTORCHJOB = "base/pytorchjob"
BASE_JOB_NAME = "fsdp-run"
CONFIG_MOUNT = "/etc/fsdp/train.yaml"
# A late node (image pull, node provisioning) may join up to this long after the first; torchrun's
# default of 600 s is short for a cold 16-node start. The key differs by backend: c10d uses the
# dynamic rendezvous (join_timeout), etcd the legacy etcd rendezvous (timeout).
RDZV_JOIN_TIMEOUT_S = 1800
_RDZV_TIMEOUT_KEY = {"c10d": "join_timeout", "etcd": "timeout"}
_WORKER = "/spec/pytorchReplicaSpecs/Worker"
_POD = f"{_WORKER}/template/spec"
_CONTAINER = f"{_POD}/containers/0"
LABEL_PREFIX = "fsdp-gitops/"


def _ptr(key: str) -> str:
    """JSON-pointer escape of one key ('fsdp-gitops/run' -> 'fsdp-gitops~1run')."""
    return key.replace("~", "~0").replace("/", "~1")


def run_labels(p: Plan) -> dict[str, str]:
    """Labels on the PyTorchJob, its pods and its ConfigMap (for selection and metrics)."""
    return {
        f"{LABEL_PREFIX}run": p.name,
        f"{LABEL_PREFIX}cluster": p.cluster,
        f"{LABEL_PREFIX}model": p.model,
        f"{LABEL_PREFIX}instance-type": p.instance_type,
    }


def torchrun_command(p: Plan) -> list[str]:
    return [
        "torchrun",
        f"--nnodes={p.nodes}",
        f"--nproc_per_node={p.gpus_per_node}",
        f"--rdzv-backend={p.rdzv_backend}",
        f"--rdzv-endpoint={p.rdzv_endpoint}",
        f"--rdzv-id={p.rdzv_id}",
        f"--rdzv-conf={_RDZV_TIMEOUT_KEY[p.rdzv_backend]}={RDZV_JOIN_TIMEOUT_S}",
        "-m",
        "trainer.train",
        "--config",
        CONFIG_MOUNT,
    ]


def efa_env(p: Plan) -> list[dict[str, str]]:
    """libfabric settings, only on instances with EFA: insist on the EFA provider (never fall back to
    TCP sockets silently) and use GPUDirect RDMA where the instance supports it."""
    if p.efa_per_node == 0:
        return []
    env = [{"name": "FI_PROVIDER", "value": "efa"}]
    if p.efa_rdma:
        env.append({"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"})
    return env


def pytorchjob_patch(p: Plan) -> JsonPatch:
    resources = {"nvidia.com/gpu": p.gpus_per_node}
    if p.efa_per_node:
        resources["vpc.amazonaws.com/efa"] = p.efa_per_node
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{_CONTAINER}/name", "value": "pytorch"},
        {"op": "test", "path": f"{_CONTAINER}/ports/1/name", "value": "metrics"},
        {"op": "test", "path": f"{_POD}/volumes/0/name", "value": "shm"},
        {"op": "test", "path": f"{_POD}/volumes/1/name", "value": "train-config"},
        {"op": "replace", "path": "/metadata/name", "value": p.name},
    ]
    labels = run_labels(p)
    for key in sorted(labels):
        ops.append({"op": "add", "path": f"{_WORKER}/template/metadata/labels/{_ptr(key)}", "value": labels[key]})
    ops += [
        {"op": "replace", "path": "/spec/nprocPerNode", "value": str(p.gpus_per_node)},
        {"op": "replace", "path": "/spec/runPolicy/activeDeadlineSeconds", "value": p.active_deadline_s},
        {"op": "replace", "path": f"{_WORKER}/replicas", "value": p.nodes},
        {"op": "replace", "path": f"{_POD}/nodeSelector/{_ptr('node.kubernetes.io/instance-type')}",
         "value": p.instance_type},
        {"op": "replace", "path": f"{_CONTAINER}/command", "value": torchrun_command(p)},
        # The run's own ServiceAccount (rbac.yaml): it may only annotate the run's pods.
        {"op": "add", "path": f"{_POD}/serviceAccountName", "value": p.name},
    ]
    for var in efa_env(p):
        ops.append({"op": "add", "path": f"{_CONTAINER}/env/-", "value": var})
    port = p.trainer.metrics.prometheus_port
    if port:
        ops.append({"op": "replace", "path": f"{_CONTAINER}/ports/1/containerPort", "value": port})
    else:
        ops.append({"op": "remove", "path": f"{_CONTAINER}/ports/1"})
    ops += [
        {"op": "replace", "path": f"{_CONTAINER}/resources", "value": {"limits": resources, "requests": dict(resources)}},
        {"op": "replace", "path": f"{_POD}/volumes/0/emptyDir/sizeLimit", "value": f"{p.shm_size_gib}Gi"},
        {"op": "replace", "path": f"{_POD}/volumes/1/configMap/name", "value": f"{p.name}-config"},
    ]
    return JsonPatch(tuple(ops))


def progress_rbac(p: Plan) -> list[dict[str, Any]]:
    """The run's ServiceAccount and the least privilege its progress annotations need."""
    name, role = p.name, f"{p.name}-progress"
    meta = lambda n: {"name": n, "namespace": p.namespace}  # noqa: E731
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(role),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"],
                    "resourceNames": [f"{name}-worker-{i}" for i in range(p.nodes)]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(role),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": p.namespace}]},
    ]


def kustomization(p: Plan, base_ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": p.namespace,
        "resources": [base_ref, "rbac.yaml"],
        # Metadata labels of the job and the ConfigMap (the pod labels come with the patch).
        "labels": [{"pairs": run_labels(p)}],
        "configMapGenerator": [{
            "name": f"{p.name}-config",
            "files": ["train.yaml"],
            "options": {"disableNameSuffixHash": True},
        }],
        "patches": [{
            "path": "pytorchjob.run.yaml",
            "target": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob", "name": BASE_JOB_NAME},
        }],
    }


def render_run(p: Plan, layout: Layout) -> dict[str, Any]:
    """The overlay of one run."""
    return {
        f"{p.overlay_dir}/kustomization.yaml": kustomization(p, layout.to_repo(p.overlay_dir, BASE_PYTORCHJOB)),
        f"{p.overlay_dir}/pytorchjob.run.yaml": pytorchjob_patch(p),
        f"{p.overlay_dir}/train.yaml": to_dict(p.trainer),
        f"{p.overlay_dir}/rbac.yaml": progress_rbac(p),
    }
