"""A run's overlay on a `job_api: trainjob` cluster: Plan -> {path: manifest}. Pure, no I/O.

One kustomize overlay per run, in runs/<cluster>/<run>/, the TrainJob counterpart of runs.py:
- kustomization.yaml: the run namespace, run labels, the trainer config as ConfigMap `<run>-config`
  (no hash suffix: the runtime patch names it, and kustomize does not rewrite names inside a TrainJob);
- trainjob.yaml: one Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on the project's
  ClusterTrainingRuntime fsdp-torch (base/trainjob/runtime.yaml, which carries the pod template and the
  failure policy). What differs per run is in the TrainJob: numNodes, numProcPerNode, resourcesPerNode
  (GPUs, EFA, CPU and memory, as runs.resources), the torchrun command and environment, the deadline,
  the Kueue queue label, and one runtimePatches entry for the pod fields the Trainer lets a TrainJob
  patch (instance type, ServiceAccount, grace period, config map, /dev/shm size, data marker);
- train.yaml: the resolved trainer config, mounted at /etc/fsdp/train.yaml;
- rbac.yaml: ServiceAccount `<run>`, and Role and RoleBinding `<run>-progress` that let it patch this
  TrainJob by name: rank 0 writes its progress annotations on the TrainJob (FSDP_TRAINJOB_NAME in the
  trainer's env, trainer/progress.py), not on a pod (a JobSet's pods are named by their Job with a
  random suffix, so no Role could name them).
The cluster's Trainer release and runtime come from generators/render/flux.py (TRAINER_CONTROLLER,
TRAINJOB_RUNTIME).
"""

from __future__ import annotations

from typing import Any

from generators.plan import TRAINJOB_METRICS_PORT, Plan
from generators.render.layout import Layout
from generators.render.runs import (
    FSDP_GRACE_ENV,
    QUEUE_LABEL,
    TERM_SLACK_S,
    data_marker,
    efa_env,
    guard_env,
    resources,
    run_labels,
    termination_grace_s,
    torchrun_command,
)
from trainer.config import to_dict

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
# The project's ClusterTrainingRuntime (base/trainjob/runtime.yaml): its trainer Job and container.
RUNTIME_NAME = "fsdp-torch"
RUNTIME_JOB = "node"
RUNTIME_CONTAINER = "node"
RUNTIME_METRICS_PORT = TRAINJOB_METRICS_PORT
# Kustomize Components the generator adds per trainjob cluster: the Trainer release (controllers
# overlay, infra-controllers) and the runtime (configs overlay, infra-configs, after the CRDs exist).
TRAINER_CONTROLLER = "base/components/kubeflow-trainer"
TRAINJOB_RUNTIME = "base/trainjob"
# What infra-controllers waits for on a trainjob cluster before the runtime and the runs are applied.
TRAINER_PREREQUISITE = {
    "apiVersion": "helm.toolkit.fluxcd.io/v2",
    "kind": "HelmRelease",
    "name": "kubeflow-trainer",
    "namespace": "kubeflow-system",
}
# Owner of the runtime patch (a domain-prefixed path, as the Trainer's webhook requires).
PATCH_MANAGER = "fsdp-gitops.io/overlay"
# Names the TrainJob rank 0 annotates with its progress (trainer/progress.py TRAINJOB_ENV).
PROGRESS_ENV = "FSDP_TRAINJOB_NAME"


def trainer_env(p: Plan) -> list[dict[str, Any]]:
    """The run's environment on top of the runtime's: torchrun's wait for the checkpoint after SIGTERM
    (trainer.launch), on EFA instances the libfabric settings, and trainer.launch's retry bound and
    transport check (runs.guard_env; the retry count is kept per PET_NODE_RANK)."""
    return [
        {"name": FSDP_GRACE_ENV, "value": str(termination_grace_s(p) - TERM_SLACK_S)},
        # The TrainJob's own name: rank 0 writes its progress annotations on it (trainer/progress.py).
        {"name": PROGRESS_ENV, "value": p.name},
        *efa_env(p),
        *guard_env(p),
    ]


def runtime_patch(p: Plan) -> dict[str, Any]:
    """The pod fields of the runtime's trainer Job that differ per run (merged by name by the Trainer)."""
    pod: dict[str, Any] = {
        "serviceAccountName": p.name,
        "terminationGracePeriodSeconds": termination_grace_s(p),
        "nodeSelector": {"node.kubernetes.io/instance-type": p.instance_type},
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{p.shm_size_gib}Gi"}},
            {"name": "train-config", "configMap": {"name": f"{p.name}-config"}},
        ],
        "initContainers": [{"name": "wait-for-data", "env": [{"name": "DATA_MARKER", "value": data_marker(p)}]}],
    }
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": RUNTIME_JOB,
                            "template": {
                                "spec": {"template": {"metadata": {"labels": run_labels(p)}, "spec": pod}},
                            },
                        }
                    ]
                }
            }
        },
    }


def trainjob(p: Plan, queue: str = "") -> dict[str, Any]:
    """The run's TrainJob; `queue`: the Kueue LocalQueue, "" without Kueue."""
    labels = {"app.kubernetes.io/name": "fsdp-trainer", "app.kubernetes.io/part-of": "fsdp-gitops"}
    if queue:
        # Kueue suspends the TrainJob until the cluster's quota covers all of its pods, then admits it whole.
        labels[QUEUE_LABEL] = queue
    return {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": p.name, "labels": labels},
        "spec": {
            "runtimeRef": {"name": RUNTIME_NAME, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            # A hard cap on GPU time; the Trainer fails the TrainJob (DeadlineExceeded) and stops its pods.
            "activeDeadlineSeconds": p.active_deadline_s,
            "trainer": {
                # The run's own image (part of its name): an image release never changes a running job.
                "image": p.run.image,
                "numNodes": p.nodes,
                "numProcPerNode": p.gpus_per_node,
                "command": torchrun_command(p),
                "env": trainer_env(p),
                "resourcesPerNode": resources(p),
            },
            "runtimePatches": [runtime_patch(p)],
        },
    }


def service_account(p: Plan) -> list[dict[str, Any]]:
    """The run's ServiceAccount, and the one permission its progress annotations need: patch of this
    TrainJob by name."""
    role = f"{p.name}-progress"
    meta = {"namespace": p.namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": p.name, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": role, **meta},
            "rules": [
                {
                    "apiGroups": ["trainer.kubeflow.org"],
                    "resources": ["trainjobs"],
                    "verbs": ["patch"],
                    "resourceNames": [p.name],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": p.name, "namespace": p.namespace}],
        },
    ]


def kustomization(p: Plan) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": p.namespace,
        "resources": ["trainjob.yaml", "rbac.yaml"],
        "labels": [{"pairs": run_labels(p)}],
        "configMapGenerator": [
            {"name": f"{p.name}-config", "files": ["train.yaml"], "options": {"disableNameSuffixHash": True}}
        ],
    }


def render_trainjob_run(p: Plan, layout: Layout, queue: str = "") -> dict[str, Any]:
    """The overlay of one run on a trainjob cluster; `queue`: the Kueue LocalQueue, "" without Kueue.
    `layout` is unused (the overlay needs nothing from base/: the runtime is cluster-wide) and kept so
    that both job APIs render through one signature."""
    del layout
    return {
        f"{p.overlay_dir}/kustomization.yaml": kustomization(p),
        f"{p.overlay_dir}/trainjob.yaml": trainjob(p, queue),
        f"{p.overlay_dir}/train.yaml": to_dict(p.trainer),
        f"{p.overlay_dir}/rbac.yaml": service_account(p),
    }
