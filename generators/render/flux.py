"""Per-cluster Flux entry point and infrastructure overlays (pure: ClusterPlan -> manifests).

For a cluster `<c>` of the matrix, paths relative to the output directory (overlays/):

    clusters/<c>/sources.yaml          GitRepository fsdp-gitops: this repository, the matrix's url/branch
    clusters/<c>/infrastructure.yaml   Kustomizations infra-controllers -> infra-configs -> secrets,
                                       and image-automation (base/image-automation, on its own)
    clusters/<c>/experiments.yaml      one Kustomization run-<run> per run (absent when <c> has no runs)
    infrastructure/<c>/controllers/    base/infrastructure/controllers + GPU instance-type patches
    infrastructure/<c>/configs/        base/infrastructure/configs + run Namespace + PVC fsdp-shared
                                       (+ patches that size the optional Kueue queues to the cluster)
                                       + preflight-<family>/: the NCCL pre-flight Job of each GPU
                                       instance type (generators/render/preflight.py)

`flux bootstrap ... --path=overlays/clusters/<c>` makes Flux apply clusters/<c>/; the objects there
pull in the rest, in this order (each `dependsOn` waits for the Ready condition of the one before):

    infra-controllers   device plugins, cluster autoscaler, etcd, Training Operator (its own Flux
                        Kustomization), kube-prometheus-stack, dcgm-exporter, Kueue (when the
                        cluster has it). Health-checked (healthChecks, not wait) on what runs and
                        configs need only: the Training Operator, kube-prometheus-stack (the CRDs of
                        the monitors in infra-configs), etcd and Kueue (RUN_PREREQUISITES). The
                        GPU-node DaemonSets (device plugins, DCGM exporter) are applied here but
                        not waited for: one GPU node whose agent cannot start must not hold back
                        every new run (alerts and `kubectl get ds` watch them instead).
    infra-configs       monitors, rules, dashboard, the run namespace, the shared PVC. wait: false:
                        none of these has a rollout to wait for, and a PVC whose StorageClass binds
                        on first use stays Pending until a run mounts it, so waiting would deadlock.
    secrets             base/secrets/<c> (SOPS-encrypted Secret hf-token), decrypted by
                        kustomize-controller with the age key in Secret flux-system/sops-age.
    shared-storage      infrastructure/<c>/storage: base/shared-storage's Job, which creates the
                        project's folders on the shared volume owned by the trainer's uid (the FSx
                        CSI driver applies no fsGroup to it). After infra-configs; wait and force
                        as data-staging; its first run binds the volume (FSx creates the file
                        system: about 10 minutes).
    data-staging        infrastructure/<c>/data (generators/render/data.py): a Job per dataset the
                        runs read, after shared-storage. wait: true (Ready once every
                        Job completed), force: true (a Job is immutable; a changed one is replaced).
                        Only where the cluster's runs read a staged dataset.
    node-tools          infrastructure/<c>/node-tools: htop and nvtop on the GPU nodes. On its own:
                        a node tool that cannot pull its image must not hold back any run.
    image-automation    base/image-automation: Flux writes new trainer image tags into base/. Only in
                        the first cluster of the matrix (every cluster would push the same commit).
                        Independent of the chain; it needs the image controllers that
                        `flux bootstrap --components-extra=image-reflector-controller,image-automation-controller`
                        installs, and a repository URL Flux may push to (ssh:// with the bootstrap key).
    run-<run>           one per run, after infra-configs, shared-storage and data-staging; wait:
                        false because a PyTorchJob has no status Flux can read as "ready" before it
                        finishes, and a job runs for hours:
                        Ready means "applied", the Training Operator reports progress. One
                        Kustomization per run keeps a failed or invalid run from blocking the others.

Every Kustomization has prune: true, so removing a run from the matrix (and regenerating) deletes
its Kustomization and, through it, its PyTorchJob and ConfigMap. The namespace and the PVC carry
`kustomize.toolkit.fluxcd.io/prune: disabled`: checkpoints outlive any change to the tree.

Paths follow the output directory's place in the repository (generators/render/layout.py): with
overlays/ at the root, Flux paths are ./overlays/... and the overlays reach base/ as ../../../../base.

GPU-node contract (base/node-tools, base/monitoring/controllers/dcgm-exporter.yaml): each GPU
workload has one nodeSelectorTerm whose first matchExpression is the instance-type list; the
controllers overlay tests that key and replaces the values with the cluster's GPU instance types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from generators.core.writer import JsonPatch
from generators.matrix.schema import Cluster, GitSource, base_image_override
from generators.plan import ClusterPlan, Plan
from generators.render.block_queue import BLOCK_QUEUE_DIR, holds_queue_at_block_end, render_block_queue
from generators.render.data import render_data
from generators.render.layout import Layout
from generators.render.preflight import preflight_dir, render_preflight
from generators.render.trainjob import TRAINER_CONTROLLER, TRAINER_PREREQUISITE, TRAINJOB_RUNTIME
from trainer.catalog import INSTANCE_TYPES

FLUX_NAMESPACE = "flux-system"
# The GitRepository every Kustomization of a cluster reads from.
SOURCE_NAME = "fsdp-gitops"
KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
FLUX_KUSTOMIZATION_API = "kustomize.toolkit.fluxcd.io/v1"
GIT_REPOSITORY_API = "source.toolkit.fluxcd.io/v1"
# Secret (in flux-system) holding the age private key kustomize-controller decrypts SOPS files with.
SOPS_AGE_SECRET = "sops-age"
# Secret flux bootstrap creates with the repository's deploy key; used for ssh:// URLs.
BOOTSTRAP_GIT_SECRET = "flux-system"
# The shared ReadWriteMany volume every run mounts at /shared (checkpoints, Hugging Face cache).
SHARED_PVC = "fsdp-shared"
# StorageClass of the shared volume: FSx for Lustre through the aws-fsx-csi-driver, created with
# the cluster (it needs the cluster's subnet and security group, see docs/deploy-eks.md).
SHARED_STORAGE_CLASS = "fsx-sc"
# Optional Kueue component (base/components/kueue/queues): names the configs overlay patches.
KUEUE_QUEUE = "fsdp"
# The run namespace's label that Kueue's managedJobsNamespaceSelector selects (base/components/kueue/
# controller/release.yaml): Kueue and its webhooks act in this namespace only.
KUEUE_NAMESPACE_LABEL = ("fsdp-gitops/kueue", "managed")

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
_AFFINITY = (
    "/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/0"
)
# Every GPU-node workload of base/infrastructure/controllers: (patch target, JSON pointer of the
# matchExpression that holds the instance types, patch file). tests/test_infra_clusters.py checks
# that this covers every workload of the base that carries the contract.
GPU_WORKLOADS: tuple[tuple[dict[str, str], str, str], ...] = (
    (
        {
            "group": "apps",
            "version": "v1",
            "kind": "DaemonSet",
            "namespace": "device-plugins",
            "name": "nvidia-device-plugin",
        },
        "/spec/template/spec" + _AFFINITY,
        "daemonset.gpu-nodes.yaml",
    ),
    (
        {
            "group": "apps",
            "version": "v1",
            "kind": "DaemonSet",
            "namespace": "device-plugins",
            "name": "efa-device-plugin",
        },
        "/spec/template/spec" + _AFFINITY,
        "daemonset.gpu-nodes.yaml",
    ),
    (
        {
            "group": "helm.toolkit.fluxcd.io",
            "version": "v2",
            "kind": "HelmRelease",
            "namespace": "monitoring",
            "name": "dcgm-exporter",
        },
        "/spec/values" + _AFFINITY,
        "helmrelease.gpu-nodes.yaml",
    ),
)
# The same contract for the node tools (base/node-tools), in their own overlay and Flux Kustomization.
NODE_TOOL_WORKLOADS: tuple[tuple[dict[str, str], str, str], ...] = tuple(
    (
        {"group": "apps", "version": "v1", "kind": "DaemonSet", "namespace": "node-tools", "name": name},
        "/spec/template/spec" + _AFFINITY,
        "daemonset.gpu-nodes.yaml",
    )
    for name in ("htop", "nvtop")
)
# base/cluster-autoscaler's auto-discovery argument; the controllers overlay puts the cluster's name in.
AUTOSCALER_DISCOVERY = (
    "--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/{cluster}"
)
AUTOSCALER_ARG = "/spec/template/spec/containers/0/command/2"
KUEUE_CONTROLLER = "base/components/kueue/controller"
# The shared volume's ownership Job (base/shared-storage), one per cluster, and its Flux Kustomization.
STORAGE_BASE = "base/shared-storage"
STORAGE_KUSTOMIZATION = "shared-storage"
# The cluster's Capacity Block end time, which every run pod mounts (base/pytorchjob, volume
# capacity-block) and trainer.launch stops before (trainer/capacity_block.py). A ConfigMap and not a
# field of the jobs: a new end time reaches running pods without changing any job.
CAPACITY_BLOCK_CONFIGMAP = "fsdp-capacity-block"
CAPACITY_BLOCK_FILE = "configmap.capacity-block.yaml"
# What infra-controllers is health-checked on: the controllers runs and infra-configs need, never a
# GPU-node DaemonSet (generators/validation/fluxgraph.py check_run_prerequisites holds that).
RUN_PREREQUISITES: tuple[dict[str, str], ...] = (
    {
        "apiVersion": FLUX_KUSTOMIZATION_API,
        "kind": "Kustomization",
        "name": "training-operator",
        "namespace": FLUX_NAMESPACE,
    },
    {
        "apiVersion": "helm.toolkit.fluxcd.io/v2",
        "kind": "HelmRelease",
        "name": "kube-prometheus-stack",
        "namespace": "monitoring",
    },
    {"apiVersion": "apps/v1", "kind": "Deployment", "name": "etcd", "namespace": "fsdp-system"},
)
KUEUE_PREREQUISITE = {
    "apiVersion": "helm.toolkit.fluxcd.io/v2",
    "kind": "HelmRelease",
    "name": "kueue",
    "namespace": "kueue-system",
}
KUEUE_QUEUES = "base/components/kueue/queues"


def render_cluster(plan: ClusterPlan, layout: Layout, *, image_automation: bool = True) -> dict[str, Any]:
    """{path relative to the output directory: manifest dict or list of manifest dicts}; no I/O.
    `image_automation`: this cluster runs the trainer image automation (one cluster of the matrix)."""
    cluster = plan.cluster
    c = cluster.name
    runs = sorted(plan.runs, key=lambda p: p.name)
    data = render_data(plan, layout)
    out: dict[str, Any] = {
        f"clusters/{c}/sources.yaml": git_repository(plan.source, layout),
        f"clusters/{c}/infrastructure.yaml": infrastructure_kustomizations(
            c,
            layout,
            staged=bool(data),
            image_automation=image_automation,
            kueue=cluster.kueue,
            trainjob=cluster.job_api == "trainjob",
        ),
        f"infrastructure/{c}/controllers/kustomization.yaml": controllers_kustomization(cluster, layout),
        f"infrastructure/{c}/controllers/deployment.cluster-autoscaler.yaml": autoscaler_patch(cluster),
        f"infrastructure/{c}/node-tools/kustomization.yaml": node_tools_kustomization(c, layout),
        f"infrastructure/{c}/storage/kustomization.yaml": storage_kustomization(cluster, layout),
        f"infrastructure/{c}/configs/kustomization.yaml": configs_kustomization(cluster, layout),
        f"infrastructure/{c}/configs/namespace.yaml": run_namespace(cluster),
        f"infrastructure/{c}/configs/pvc.yaml": shared_pvc(cluster),
        f"infrastructure/{c}/configs/{CAPACITY_BLOCK_FILE}": capacity_block_config(cluster),
        f"infrastructure/{c}/configs/clusterqueue.quota.yaml": kueue_quota_patch(cluster),
        f"infrastructure/{c}/configs/localqueue.namespace.yaml": kueue_namespace_patch(cluster),
    }
    out.update(render_preflight(cluster, layout, KUEUE_QUEUE if cluster.kueue else ""))
    out.update(render_block_queue(plan, layout))
    out.update(data)
    for _, pointer, patch_file in GPU_WORKLOADS:
        # The two DaemonSets share one pointer, hence one file.
        out[f"infrastructure/{c}/controllers/{patch_file}"] = instance_type_patch(cluster, pointer)
    for _, pointer, patch_file in NODE_TOOL_WORKLOADS:
        out[f"infrastructure/{c}/node-tools/{patch_file}"] = instance_type_patch(cluster, pointer)
    if runs:
        out[f"clusters/{c}/experiments.yaml"] = [run_kustomization(p, layout, staged=bool(data)) for p in runs]
    return out


def git_repository(repository: GitSource, layout: Layout) -> dict[str, Any]:
    """This repository as a Flux source; only base/ and the output's top folder (overlays/) reach the
    cluster."""
    top = layout.out_from_root.split("/", 1)[0]
    top = top if top not in ("", ".", "..") else "overlays"  # an output outside the repository is never synced
    spec: dict[str, Any] = {
        "interval": "1m",
        "url": repository.url,
        "ref": {"branch": repository.branch},
        # Everything Flux builds lives in base/ and overlays/; the trainer, docker/ and tests stay out
        # of the artifact kustomize-controller downloads on every change, and so do the cluster
        # definitions for eksctl and CloudFormation (provisioning/), which Flux never applies.
        "ignore": f"/*\n!/base/\n!/{top}/\n/{top}/provisioning/\n",
    }
    if repository.url.startswith("ssh://"):
        # A private repository over SSH: reuse the deploy key `flux bootstrap` installed.
        spec["secretRef"] = {"name": BOOTSTRAP_GIT_SECRET}
    return {
        "apiVersion": GIT_REPOSITORY_API,
        "kind": "GitRepository",
        "metadata": {"name": SOURCE_NAME, "namespace": FLUX_NAMESPACE},
        "spec": spec,
    }


def flux_kustomization(
    name: str,
    path: str,
    *,
    depends_on: Sequence[str],
    wait: bool,
    interval: str,
    timeout: str,
    decrypt: bool = False,
    force: bool = False,
    health_checks: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """A Flux Kustomization over `path` (relative to the repository root) of this repository."""
    spec: dict[str, Any] = {
        "interval": interval,
        "retryInterval": "2m",
        "timeout": timeout,
        "sourceRef": {"kind": "GitRepository", "name": SOURCE_NAME},
        "path": path,
        "prune": True,
        "wait": wait,
    }
    if depends_on:
        spec["dependsOn"] = [{"name": d} for d in depends_on]
    if decrypt:
        spec["decryption"] = {"provider": "sops", "secretRef": {"name": SOPS_AGE_SECRET}}
    if force:
        spec["force"] = True
    if health_checks:
        spec["healthChecks"] = [dict(h) for h in health_checks]
    return {
        "apiVersion": FLUX_KUSTOMIZATION_API,
        "kind": "Kustomization",
        "metadata": {"name": name, "namespace": FLUX_NAMESPACE},
        "spec": spec,
    }


def infrastructure_kustomizations(
    c: str,
    layout: Layout,
    *,
    staged: bool = False,
    image_automation: bool = True,
    kueue: bool = False,
    trainjob: bool = False,
) -> list[dict[str, Any]]:
    """infra-controllers -> infra-configs -> secrets, shared-storage -> data-staging; node-tools and
    image-automation on their own (see the module docstring)."""
    out = [
        # kube-prometheus-stack's first install takes several minutes; the timeout covers it.
        flux_kustomization(
            "infra-controllers",
            layout.flux_path(f"infrastructure/{c}/controllers"),
            depends_on=(),
            wait=False,
            interval="1h",
            timeout="20m",
            health_checks=RUN_PREREQUISITES
            + ((KUEUE_PREREQUISITE,) if kueue else ())
            + ((TRAINER_PREREQUISITE,) if trainjob else ()),
        ),
        flux_kustomization(
            "infra-configs",
            layout.flux_path(f"infrastructure/{c}/configs"),
            depends_on=("infra-controllers",),
            wait=False,
            interval="1h",
            timeout="5m",
        ),
        # After infra-configs: the Secret goes into the run namespace that infra-configs creates.
        flux_kustomization(
            "secrets",
            f"./base/secrets/{c}",
            depends_on=("infra-configs",),
            wait=False,
            interval="1h",
            timeout="2m",
            decrypt=True,
        ),
        # The shared volume's folders, owned by the trainer's uid, before anything writes there.
        flux_kustomization(
            STORAGE_KUSTOMIZATION,
            layout.flux_path(f"infrastructure/{c}/storage"),
            depends_on=("infra-configs",),
            wait=True,
            interval="1h",
            timeout="60m",
            force=True,
        ),
        # Nothing depends on the node tools: one that cannot pull its image holds back no run.
        flux_kustomization(
            "node-tools",
            layout.flux_path(f"infrastructure/{c}/node-tools"),
            depends_on=(),
            wait=False,
            interval="1h",
            timeout="5m",
        ),
    ]
    if staged:
        # The first staging binds the shared volume (FSx creates the file system, about 10 minutes)
        # and downloads the datasets; the timeout covers both.
        out.append(
            flux_kustomization(
                "data-staging",
                layout.flux_path(f"infrastructure/{c}/data"),
                depends_on=("infra-configs", STORAGE_KUSTOMIZATION),
                wait=True,
                interval="1h",
                timeout="60m",
                force=True,
            )
        )
    if image_automation:
        # Needs only Flux's image controllers (flux bootstrap --components-extra); nothing waits on it.
        out.append(
            flux_kustomization(
                "image-automation", "./base/image-automation", depends_on=(), wait=False, interval="1h", timeout="2m"
            )
        )
    return out


def run_kustomization(plan: Plan, layout: Layout, *, staged: bool = False) -> dict[str, Any]:
    """Kustomization run-<run> over the run's overlay (the overlay sets its own namespace); after the
    cluster's data staging when it has one, so no GPU node is asked for before the data exists."""
    depends = ("infra-configs", STORAGE_KUSTOMIZATION) + (("data-staging",) if staged else ())
    return flux_kustomization(
        f"run-{plan.name}",
        layout.flux_path(plan.overlay_dir),
        depends_on=depends,
        wait=False,
        interval="10m",
        timeout="5m",
    )


def controllers_kustomization(cluster: Cluster, layout: Layout) -> dict[str, Any]:
    """base/infrastructure/controllers with every GPU workload pinned by the patch files beside it, the
    cluster autoscaler told the cluster's name, and Kueue's controller where the cluster queues."""
    here = f"infrastructure/{cluster.name}/controllers"
    out: dict[str, Any] = {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "resources": [layout.to_repo(here, "base/infrastructure/controllers")],
        "patches": [{"path": patch_file, "target": dict(target)} for target, _, patch_file in GPU_WORKLOADS]
        + [
            {
                "path": "deployment.cluster-autoscaler.yaml",
                "target": {
                    "group": "apps",
                    "version": "v1",
                    "kind": "Deployment",
                    "namespace": "kube-system",
                    "name": "cluster-autoscaler",
                },
            }
        ],
    }
    if cluster.kueue:
        out["components"] = [layout.to_repo(here, KUEUE_CONTROLLER)]
    if cluster.job_api == "trainjob":
        # Kubeflow Trainer v2 and JobSet (docs/job-api.md).
        out.setdefault("components", []).append(layout.to_repo(here, TRAINER_CONTROLLER))
    return out


def autoscaler_patch(cluster: Cluster) -> JsonPatch:
    """The cluster autoscaler scales the Auto Scaling groups tagged with this cluster's name."""
    return JsonPatch(
        ops=(
            {"op": "test", "path": AUTOSCALER_ARG, "value": AUTOSCALER_DISCOVERY.format(cluster="fsdp-cluster")},
            {"op": "replace", "path": AUTOSCALER_ARG, "value": AUTOSCALER_DISCOVERY.format(cluster=cluster.name)},
        )
    )


def storage_kustomization(cluster: Cluster, layout: Layout) -> dict[str, Any]:
    """base/shared-storage in the cluster's run namespace (where PVC fsdp-shared lives)."""
    here = f"infrastructure/{cluster.name}/storage"
    return {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "namespace": cluster.namespace,
        "resources": [layout.to_repo(here, STORAGE_BASE)],
    }


def node_tools_kustomization(c: str, layout: Layout) -> dict[str, Any]:
    """base/node-tools pinned to the cluster's GPU instance types."""
    return {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "resources": [layout.to_repo(f"infrastructure/{c}/node-tools", "base/node-tools")],
        "patches": [{"path": patch_file, "target": dict(target)} for target, _, patch_file in NODE_TOOL_WORKLOADS],
    }


def instance_type_patch(cluster: Cluster, pointer: str) -> JsonPatch:
    """Replace the instance-type list at `pointer` with the cluster's GPU instance types (matrix order)."""
    return JsonPatch(
        ops=(
            # Fails the build if the base ever moves the instance-type expression (the contract).
            {"op": "test", "path": f"{pointer}/key", "value": INSTANCE_TYPE_LABEL},
            {"op": "replace", "path": f"{pointer}/values", "value": list(cluster.instance_types)},
        )
    )


def kueue_quota(cluster: Cluster) -> dict[str, int | str]:
    """Resource -> quota of the cluster at its largest (max_nodes of each GPU instance type), in the
    order of the ClusterQueue's resources. CPU and memory are covered too: Kueue refuses a job that
    requests a resource its ClusterQueue does not list, and the training pods request both."""
    types = [INSTANCE_TYPES[t] for t in cluster.instance_types]
    return {
        "nvidia.com/gpu": sum(cluster.max_nodes * t.num_gpus for t in types),
        "vpc.amazonaws.com/efa": sum(cluster.max_nodes * t.num_efa for t in types),
        "cpu": sum(cluster.max_nodes * t.num_vcpus for t in types),
        "memory": f"{sum(cluster.max_nodes * t.host_memory_gib for t in types)}Gi",
    }


def configs_kustomization(cluster: Cluster, layout: Layout) -> dict[str, Any]:
    """base/infrastructure/configs + the run namespace, the shared volume and the pre-flight Jobs.

    Where the cluster queues with Kueue, base/components/kueue/queues adds the queues, and the two
    patches size them to this cluster and move the LocalQueue into its run namespace.
    """
    c = cluster.name
    out: dict[str, Any] = {
        "apiVersion": KUSTOMIZE_API,
        "kind": "Kustomization",
        "resources": [
            layout.to_repo(f"infrastructure/{c}/configs", "base/infrastructure/configs"),
            "namespace.yaml",
            "pvc.yaml",
            CAPACITY_BLOCK_FILE,
            *(preflight_dir(cluster, INSTANCE_TYPES[t]).rsplit("/", 1)[1] for t in cluster.instance_types),
            *([BLOCK_QUEUE_DIR] if holds_queue_at_block_end(cluster) else []),
        ],
        "patches": [
            {
                "path": "clusterqueue.quota.yaml",
                "target": {"group": "kueue.x-k8s.io", "kind": "ClusterQueue", "name": KUEUE_QUEUE},
            },
            {
                "path": "localqueue.namespace.yaml",
                "target": {"group": "kueue.x-k8s.io", "kind": "LocalQueue", "name": KUEUE_QUEUE},
            },
        ],
    }
    if moved := base_image_override(cluster):
        out["images"] = moved  # the trainer image of every Job and Deployment here from the cluster's registry
    if cluster.kueue:
        out["components"] = [layout.to_repo(f"infrastructure/{c}/configs", KUEUE_QUEUES)]
    if cluster.job_api == "trainjob":
        # The project's ClusterTrainingRuntime, after infra-controllers installed its CRD.
        out.setdefault("components", []).append(layout.to_repo(f"infrastructure/{c}/configs", TRAINJOB_RUNTIME))
    return out


def kueue_quota_patch(cluster: Cluster) -> JsonPatch:
    resources = "/spec/resourceGroups/0/flavors/0/resources"
    ops: list[dict[str, Any]] = []
    for i, (name, quota) in enumerate(kueue_quota(cluster).items()):
        ops += [
            {"op": "test", "path": f"{resources}/{i}/name", "value": name},
            {"op": "replace", "path": f"{resources}/{i}/nominalQuota", "value": quota},
        ]
    return JsonPatch(ops=tuple(ops))


def kueue_namespace_patch(cluster: Cluster) -> JsonPatch:
    return JsonPatch(ops=({"op": "replace", "path": "/metadata/namespace", "value": cluster.namespace},))


_KEEP = {"kustomize.toolkit.fluxcd.io/prune": "disabled"}


def run_namespace(cluster: Cluster) -> dict[str, Any]:
    """The namespace the cluster's PyTorchJobs run in; kept by Flux when it leaves the tree."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": cluster.namespace,
            "annotations": dict(_KEEP),
            # Training pods need no host access: admission rejects privileged pods here.
            "labels": {
                "pod-security.kubernetes.io/enforce": "baseline",
                # Kueue queues jobs in this namespace only, and its webhooks are called for no other.
                **(dict([KUEUE_NAMESPACE_LABEL]) if cluster.kueue else {}),
            },
        },
    }


def capacity_block_config(cluster: Cluster) -> dict[str, Any]:
    """ConfigMap fsdp-capacity-block: `end`, the cluster's capacity_block_end ("" without a block)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CAPACITY_BLOCK_CONFIGMAP, "namespace": cluster.namespace},
        "data": {"end": cluster.capacity_block_end},
    }


def shared_pvc(cluster: Cluster) -> dict[str, Any]:
    """PVC fsdp-shared: checkpoints and the model cache, mounted by every pod of every run."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": SHARED_PVC, "namespace": cluster.namespace, "annotations": dict(_KEEP)},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": SHARED_STORAGE_CLASS,
            "resources": {"requests": {"storage": f"{cluster.shared_storage_gib}Gi"}},
        },
    }
