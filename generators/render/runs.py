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

import math
import posixpath
from typing import Any

from generators.core.writer import JsonPatch
from generators.plan import Plan
from generators.render.layout import Layout
from trainer.catalog import INSTANCE_TYPES, MODELS
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
_WAIT = f"{_POD}/initContainers/0"
LABEL_PREFIX = "fsdp-gitops/"
# Kueue picks up a job by this label; the LocalQueue of base/components/kueue/queues.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Restarts of the worker group that torchrun makes itself (a node's workers died, a node left and
# its replacement pod joined again) before it gives up; each resumes from the newest checkpoint.
MAX_RESTARTS = 3
# Datasets staged on the shared volume: data.path under this root has a staging Job per cluster
# (generators/render/data.py) writing <directory>/_COMPLETE last, which the pods wait for.
SHARED_DATA_ROOT = "/shared/data/"
DATA_MARKER = "_COMPLETE"
# Sizing of the graceful stop: on SIGTERM the trainer finishes its step and writes a checkpoint of
# about CHECKPOINT_BYTES_PER_PARAM bytes per parameter (fp32 master weights and two AdamW moments)
# to the shared volume, which all nodes together write at about CHECKPOINT_WRITE_GBPS (an FSx for
# Lustre PERSISTENT_2 volume of a few TiB at 250 MB/s per TiB). The grace period is that time with
# a margin of half again, plus time for the step in flight; torchrun gets it minus TERM_SLACK_S to
# pass on to the workers (trainer.launch, FSDP_TERM_GRACE_S) so the kubelet's SIGKILL comes last.
CHECKPOINT_BYTES_PER_PARAM = 12
CHECKPOINT_WRITE_GBPS = 0.5
STEP_MARGIN_S = 60
TERM_SLACK_S = 30
FSDP_GRACE_ENV = "FSDP_TERM_GRACE_S"
# trainer.launch's guards (trainer/attempts.py, trainer/transport_check.py): the retry bound, counted
# per pod under the run's metrics folder, and the transport a multi-node EFA run must come up on.
ATTEMPTS_DIR = "attempts"
# Of the node's CPUs and memory, what a training pod requests (per GPU share of the node): the rest
# is for the kubelet, the system and the DaemonSets. Requests make the kubelet evict other pods
# before a training pod under memory pressure.
CPU_REQUEST_FRACTION = 0.9
MEMORY_REQUEST_FRACTION = 0.85


def json_pointer_escape(key: str) -> str:
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
    """torchrun through trainer.launch, which waits for a late worker 0 and turns a preemption into an
    exit code the Training Operator restarts."""
    return [
        "python",
        "-m",
        "trainer.launch",
        f"--nnodes={p.nodes}",
        f"--nproc_per_node={p.gpus_per_node}",
        f"--max-restarts={MAX_RESTARTS}",
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


def guard_env(p: Plan) -> list[dict[str, str]]:
    """The environment of trainer.launch's retry bound and transport check for the run."""
    env = [
        {"name": "FSDP_MAX_RETRIES", "value": str(p.run.max_retries)},
        {"name": "FSDP_ATTEMPTS_DIR", "value": posixpath.join(p.trainer.metrics.output_dir, ATTEMPTS_DIR)},
    ]
    # Only between nodes, and only where EFA is what NCCL should use.
    if p.nodes > 1 and p.efa_per_node and p.run.transport_check != "off":
        env += [
            {"name": "FSDP_EXPECT_TRANSPORT", "value": "efa"},
            {"name": "FSDP_TRANSPORT_CHECK", "value": p.run.transport_check},
        ]
    return env


def checkpoint_write_s(p: Plan) -> float:
    """Seconds to write one checkpoint of the run's model to the shared volume (estimate)."""
    return MODELS[p.model].num_params * CHECKPOINT_BYTES_PER_PARAM / (CHECKPOINT_WRITE_GBPS * 1e9)


def termination_grace_s(p: Plan) -> int:
    """terminationGracePeriodSeconds: the checkpoint with a margin, the step in flight, the slack."""
    return math.ceil(1.5 * checkpoint_write_s(p)) + STEP_MARGIN_S + TERM_SLACK_S


def data_marker(p: Plan) -> str:
    """The marker the data staging Job writes for the run's dataset; "" when nothing stages it."""
    path = p.trainer.data.path
    # Staged datasets are directories: /shared/data/<dataset>/<file>.
    if (
        p.trainer.data.format == "synthetic"
        or not path.startswith(SHARED_DATA_ROOT)
        or "/" not in path[len(SHARED_DATA_ROOT) :]
    ):
        return ""
    return posixpath.join(posixpath.dirname(path), DATA_MARKER)


def resources(p: Plan) -> dict[str, Any]:
    """GPUs and EFA interfaces (requests equal limits) and the pod's share of the node's CPU and memory."""
    instance = INSTANCE_TYPES[p.instance_type]
    share = p.gpus_per_node / instance.num_gpus
    devices: dict[str, Any] = {"nvidia.com/gpu": p.gpus_per_node}
    if p.efa_per_node:
        devices["vpc.amazonaws.com/efa"] = p.efa_per_node
    return {
        "limits": devices,
        "requests": {
            **devices,
            "cpu": str(math.floor(instance.num_vcpus * share * CPU_REQUEST_FRACTION)),
            "memory": f"{math.floor(instance.host_memory_gib * share * MEMORY_REQUEST_FRACTION)}Gi",
        },
    }


def pytorchjob_patch(p: Plan, queue: str = "") -> JsonPatch:
    """The run's JSON patch over base/pytorchjob; `queue`: the Kueue LocalQueue, "" without Kueue."""
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"{_CONTAINER}/name", "value": "pytorch"},
        {"op": "test", "path": f"{_CONTAINER}/ports/1/name", "value": "metrics"},
        {"op": "test", "path": f"{_POD}/volumes/0/name", "value": "shm"},
        {"op": "test", "path": f"{_POD}/volumes/1/name", "value": "train-config"},
        {"op": "test", "path": f"{_WAIT}/name", "value": "wait-for-data"},
        {"op": "replace", "path": "/metadata/name", "value": p.name},
        # The run's own image: part of its name's hash, never rewritten by the image automation.
        {"op": "replace", "path": f"{_CONTAINER}/image", "value": p.run.image},
    ]
    if queue:
        # Kueue suspends the job until the cluster's quota covers all of its pods, then admits it whole.
        ops.append({"op": "add", "path": f"/metadata/labels/{json_pointer_escape(QUEUE_LABEL)}", "value": queue})
    labels = run_labels(p)
    for key in sorted(labels):
        ops.append(
            {
                "op": "add",
                "path": f"{_WORKER}/template/metadata/labels/{json_pointer_escape(key)}",
                "value": labels[key],
            }
        )
    ops += [
        {"op": "replace", "path": "/spec/nprocPerNode", "value": str(p.gpus_per_node)},
        {"op": "replace", "path": "/spec/runPolicy/activeDeadlineSeconds", "value": p.active_deadline_s},
        {"op": "replace", "path": f"{_WORKER}/replicas", "value": p.nodes},
        {
            "op": "replace",
            "path": f"{_POD}/nodeSelector/{json_pointer_escape('node.kubernetes.io/instance-type')}",
            "value": p.instance_type,
        },
        {"op": "replace", "path": f"{_CONTAINER}/command", "value": torchrun_command(p)},
        {"op": "replace", "path": f"{_POD}/terminationGracePeriodSeconds", "value": termination_grace_s(p)},
        # torchrun's wait for the workers' checkpoint after forwarding SIGTERM (trainer.launch).
        {
            "op": "add",
            "path": f"{_CONTAINER}/env/-",
            "value": {"name": FSDP_GRACE_ENV, "value": str(termination_grace_s(p) - TERM_SLACK_S)},
        },
        # The run's own ServiceAccount (rbac.yaml): it may only annotate the run's pods, and the pod's
        # name, which turns the trainer's progress annotations on (trainer/progress.py).
        {"op": "add", "path": f"{_POD}/serviceAccountName", "value": p.name},
        {
            "op": "add",
            "path": f"{_CONTAINER}/env/-",
            "value": {"name": "FSDP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        },
    ]
    for var in efa_env(p) + guard_env(p):
        ops.append({"op": "add", "path": f"{_CONTAINER}/env/-", "value": var})
    port = p.trainer.metrics.prometheus_port
    if port:
        ops.append({"op": "replace", "path": f"{_CONTAINER}/ports/1/containerPort", "value": port})
    else:
        ops.append({"op": "remove", "path": f"{_CONTAINER}/ports/1"})
    marker = data_marker(p)
    if marker:
        ops.append({"op": "replace", "path": f"{_WAIT}/env/0/value", "value": marker})
    else:
        ops.append({"op": "remove", "path": f"{_POD}/initContainers"})
    ops += [
        {"op": "replace", "path": f"{_CONTAINER}/resources", "value": resources(p)},
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
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(role),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["patch"],
                    "resourceNames": [f"{name}-worker-{i}" for i in range(p.nodes)],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": p.namespace}],
        },
    ]


def kustomization(p: Plan, base_ref: str) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": p.namespace,
        "resources": [base_ref, "rbac.yaml"],
        # Metadata labels of the job and the ConfigMap (the pod labels come with the patch).
        "labels": [{"pairs": run_labels(p)}],
        "configMapGenerator": [
            {
                "name": f"{p.name}-config",
                "files": ["train.yaml"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
        "patches": [
            {
                "path": "pytorchjob.run.yaml",
                "target": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob", "name": BASE_JOB_NAME},
            }
        ],
    }


def render_run(p: Plan, layout: Layout, queue: str = "") -> dict[str, Any]:
    """The overlay of one run; `queue`: the Kueue LocalQueue of its cluster, "" without Kueue."""
    return {
        f"{p.overlay_dir}/kustomization.yaml": kustomization(p, layout.to_repo(p.overlay_dir, BASE_PYTORCHJOB)),
        f"{p.overlay_dir}/pytorchjob.run.yaml": pytorchjob_patch(p, queue),
        f"{p.overlay_dir}/train.yaml": to_dict(p.trainer),
        f"{p.overlay_dir}/rbac.yaml": progress_rbac(p),
    }
