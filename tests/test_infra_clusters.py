"""generators/render/flux.py: the per-cluster Flux entry point and infrastructure overlays.

A matrix is rendered by the real generator (plan -> render -> writer) into a copy of base/ in a
temporary git work tree, and the result goes through the repository's validation pipeline (kustomize
builds, kubeconform strict, the Flux graph: every path exists and builds, every dependsOn and
sourceRef resolves, no cycle). The other tests read the built overlays.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from generators import matrix
from generators.core import writer
from generators.core.gotools import tool
from generators.matrix.schema import GitSource
from generators.plan import ClusterPlan, plan
from generators.render import OVERLAYS, render
from generators.render import flux as clusters
from generators.validation import pipeline, schemas
from trainer.catalog import INSTANCE_TYPES

# fsdp-p5: two GPU instance types, a non-default namespace, runs on a staged dataset, Kueue (the
# default). fsdp-p4de: no runs at all, no Kueue.
MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: release}
clusters:
  fsdp-p5:
    region: us-west-2
    availability_zones: [us-west-2a]
    instance_types: [p5en.48xlarge, p5.48xlarge]
    namespace: llm
    max_nodes: 2
    shared_storage_gib: 2400
  fsdp-p4de: {region: us-east-1, availability_zones: [us-east-1b], instance_types: [p4de.24xlarge], kueue: false}
defaults:
  cluster: fsdp-p5
  model: llama2-7b
  trainer: {data: {path: /shared/data/samsum/train.jsonl}}
axes:
  instance_type: [p5.48xlarge, p5en.48xlarge]
  nodes: [1, 2]
"""


def kustomize_build(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(path)],
        capture_output=True,
        text=True,
    )


def built(path: Path) -> list[dict[str, Any]]:
    out = kustomize_build(path)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def make_tree(root: Path, text: str = MATRIX) -> matrix.Matrix:
    """A git work tree holding base/ and the overlays rendered from `text`."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copytree(REPO_ROOT / "base", root / "base")
    (root / "matrix.yaml").write_text(text)
    m = matrix.load(str(root / "matrix.yaml"))
    for rel, data in writer.serialize(render(plan(m, matrix.expand(m)), OVERLAYS), "matrix.yaml").items():
        path = root / "overlays" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return m


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, matrix.Matrix]:
    root = tmp_path_factory.mktemp("repo")
    return root, make_tree(root)


@pytest.mark.gotools
def test_rendered_clusters_validate_with_their_flux_graph(tree: tuple[Path, matrix.Matrix]) -> None:
    root, _ = tree
    report = pipeline.validate(root, crd_dir=schemas.default_crd_dir())
    assert report.problems == [], "\n".join(map(str, report.problems))
    # 2 clusters x 5 infrastructure (controllers, configs, secrets, shared storage, node tools), data
    # staging and image automation in fsdp-p5 only, 4 runs, and the Training Operator's own Kustomization
    # per cluster.
    assert report.num_flux_kustomizations == 2 * 5 + 2 + 4 + 2


@pytest.mark.gotools
def test_the_flux_graph_check_can_fail_on_a_missing_secrets_folder(tmp_path: Path) -> None:
    make_tree(tmp_path)
    shutil.rmtree(tmp_path / "base" / "secrets" / "fsdp-p4de")
    report = pipeline.validate(tmp_path, crd_dir=schemas.default_crd_dir())
    assert any(
        "base/secrets/fsdp-p4de" in p.message and "overlays/clusters/fsdp-p4de" in p.file for p in report.problems
    ), report.problems


def test_infrastructure_chain_is_controllers_configs_secrets(tree: tuple[Path, matrix.Matrix]) -> None:
    root, _ = tree
    docs = load_all(root / "overlays/clusters/fsdp-p5/infrastructure.yaml")
    by_name = {d["metadata"]["name"]: d["spec"] for d in docs}
    images = by_name.pop("image-automation")
    assert images["path"] == "./base/image-automation" and "dependsOn" not in images
    # Only the first cluster of the matrix runs the image automation (each would push the same commit).
    assert "image-automation" not in {
        d["metadata"]["name"] for d in load_all(root / "overlays/clusters/fsdp-p4de/infrastructure.yaml")
    }
    # The node tools hang off nothing and nothing waits for them.
    tools = by_name.pop("node-tools")
    assert tools["path"] == "./overlays/infrastructure/fsdp-p5/node-tools" and "dependsOn" not in tools
    assert tools["wait"] is False
    # The data staging waits for its Jobs (Ready = data on the volume) and may replace a changed Job.
    data = by_name.pop("data-staging")
    assert data["path"] == "./overlays/infrastructure/fsdp-p5/data"
    assert data["dependsOn"] == [{"name": "infra-configs"}, {"name": "shared-storage"}]
    assert data["wait"] is True and data["force"] is True
    # The shared volume's folders get the trainer's owner before anything writes there.
    storage = by_name.pop("shared-storage")
    assert storage["path"] == "./overlays/infrastructure/fsdp-p5/storage"
    assert storage["dependsOn"] == [{"name": "infra-configs"}] and storage["wait"] is True and storage["force"] is True
    assert list(by_name) == ["infra-controllers", "infra-configs", "secrets"]
    assert "dependsOn" not in by_name["infra-controllers"]
    assert by_name["infra-configs"]["dependsOn"] == [{"name": "infra-controllers"}]
    assert by_name["secrets"]["dependsOn"] == [{"name": "infra-configs"}]
    # Ready of infra-controllers must mean "CRDs and the controllers runs need are up" (healthChecks: the
    # GPU-node DaemonSets are not waited for); the others have no rollout.
    assert [s["wait"] for s in by_name.values()] == [False, False, False]
    checked = {(h["kind"], h["name"]) for h in by_name["infra-controllers"]["healthChecks"]}
    assert ("Kustomization", "training-operator") in checked and not any(k == "DaemonSet" for k, _ in checked)
    assert all(
        s["prune"] is True and s["sourceRef"] == {"kind": "GitRepository", "name": "fsdp-gitops"}
        for s in by_name.values()
    )
    assert by_name["infra-controllers"]["path"] == "./overlays/infrastructure/fsdp-p5/controllers"
    assert by_name["infra-configs"]["path"] == "./overlays/infrastructure/fsdp-p5/configs"
    assert by_name["secrets"]["path"] == "./base/secrets/fsdp-p5"
    assert by_name["secrets"]["decryption"] == {"provider": "sops", "secretRef": {"name": "sops-age"}}
    assert not any("decryption" in s for name, s in by_name.items() if name != "secrets")


def test_one_kustomization_per_run_after_infra_configs(tree: tuple[Path, matrix.Matrix]) -> None:
    root, m = tree
    plans = [p for cp in plan(m, matrix.expand(m)) for p in cp.runs if p.cluster == "fsdp-p5"]
    docs = load_all(root / "overlays/clusters/fsdp-p5/experiments.yaml")
    assert [d["metadata"]["name"] for d in docs] == sorted(f"run-{p.name}" for p in plans)
    for d in docs:
        spec = d["spec"]
        run = d["metadata"]["name"].removeprefix("run-")
        assert spec["path"] == f"./overlays/runs/fsdp-p5/{run}"
        assert (root / spec["path"]).is_dir()
        # After the data: no PyTorchJob (so no GPU node) before the dataset is on the volume.
        assert spec["dependsOn"] == [{"name": "infra-configs"}, {"name": "shared-storage"}, {"name": "data-staging"}]
        assert spec["prune"] is True and spec["wait"] is False
        assert "targetNamespace" not in spec
        assert len(d["metadata"]["name"]) <= 63
    # A cluster without runs gets no experiments file (and no empty YAML document).
    assert not (root / "overlays/clusters/fsdp-p4de/experiments.yaml").exists()
    # The Flux entry folder holds Flux objects only, and no kustomization.yaml (Flux generates one).
    for f in (root / "overlays/clusters").rglob("*"):
        if f.is_file():
            assert f.name != "kustomization.yaml"
            assert all(d["apiVersion"].split("/")[0].endswith("toolkit.fluxcd.io") for d in load_all(f))


def test_source_is_the_matrix_repository(tree: tuple[Path, matrix.Matrix]) -> None:
    root, _ = tree
    (src,) = load_all(root / "overlays/clusters/fsdp-p4de/sources.yaml")
    assert (src["kind"], src["metadata"]["name"], src["metadata"]["namespace"]) == (
        "GitRepository",
        "fsdp-gitops",
        "flux-system",
    )
    assert src["spec"]["url"] == "https://github.com/example/fsdp-gitops"
    assert src["spec"]["ref"] == {"branch": "release"}
    assert "secretRef" not in src["spec"]
    ssh = clusters.git_repository(GitSource(url="ssh://git@github.com/example/fsdp-gitops", branch="main"), OVERLAYS)
    assert ssh["spec"]["secretRef"] == {"name": "flux-system"}


@pytest.mark.gotools
def test_gpu_workloads_are_pinned_to_the_cluster_instance_types(tree: tuple[Path, matrix.Matrix]) -> None:
    root, m = tree
    for name, cluster in m.clusters.items():
        docs = built(root / f"overlays/infrastructure/{name}/controllers")
        pinned = {}
        for d in docs:
            spec = d.get("spec", {})
            if d["kind"] == "DaemonSet":
                affinity = spec["template"]["spec"]["affinity"]
            elif d["kind"] == "HelmRelease" and "affinity" in spec.get("values", {}):
                affinity = spec["values"]["affinity"]
            else:
                continue
            terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            pinned[f"{d['kind']}/{d['metadata']['name']}"] = terms[0]["matchExpressions"][0]["values"]
        assert set(pinned) == {
            "DaemonSet/nvidia-device-plugin",
            "DaemonSet/efa-device-plugin",
            "HelmRelease/dcgm-exporter",
        }
        assert all(values == list(cluster.instance_types) for values in pinned.values()), (name, pinned)
        tools = {
            d["metadata"]["name"]: d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
            for d in built(root / f"overlays/infrastructure/{name}/node-tools")
            if d["kind"] == "DaemonSet"
        }
        assert tools == {"htop": list(cluster.instance_types), "nvtop": list(cluster.instance_types)}


@pytest.mark.gotools
def test_the_patch_table_covers_every_gpu_workload_of_the_base() -> None:
    docs = built(REPO_ROOT / "base/infrastructure/controllers")
    carrying = set()
    for d in docs:
        text = yaml.safe_dump(d.get("spec", {}))
        if clusters.INSTANCE_TYPE_LABEL in text:
            carrying.add((d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]))
    table = {(t["kind"], t["namespace"], t["name"]) for t, _, _ in clusters.GPU_WORKLOADS}
    assert carrying == table


@pytest.mark.gotools
def test_a_base_that_breaks_the_contract_fails_the_cluster_build(tmp_path: Path) -> None:
    make_tree(tmp_path)
    ds = tmp_path / "base/node-tools/daemonset-nvtop.yaml"
    # Another expression in front of the instance types: the overlay's test op must refuse it.
    ds.write_text(
        ds.read_text().replace(
            "              - matchExpressions:\n",
            "              - matchExpressions:\n"
            "                  - {key: kubernetes.io/os, operator: In, values: [linux]}\n",
        )
    )
    out = kustomize_build(tmp_path / "overlays/infrastructure/fsdp-p5/node-tools")
    assert out.returncode != 0
    assert "nvtop" in out.stderr or "test" in out.stderr


@pytest.mark.gotools
def test_configs_hold_the_run_namespace_and_shared_volume(tree: tuple[Path, matrix.Matrix]) -> None:
    root, _ = tree
    docs = built(root / "overlays/infrastructure/fsdp-p5/configs")
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == "llm"
    # Training pods need no privilege; the namespace's admission refuses privileged pods.
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    (pvc,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert (pvc["metadata"]["name"], pvc["metadata"]["namespace"]) == ("fsdp-shared", "llm")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == clusters.SHARED_STORAGE_CLASS
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2400Gi"
    # Checkpoints outlive the tree: Flux never prunes the namespace or the volume.
    for d in (ns, pvc):
        assert d["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"


@pytest.mark.gotools
def test_kueue_queues_are_sized_to_the_cluster_when_enabled(tree: tuple[Path, matrix.Matrix]) -> None:
    root, m = tree
    docs = built(root / "overlays/infrastructure/fsdp-p5/configs")
    (lq,) = [d for d in docs if d["kind"] == "LocalQueue"]
    assert lq["metadata"]["namespace"] == "llm"
    (cq,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    quota = {r["name"]: r["nominalQuota"] for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    types = [INSTANCE_TYPES[t] for t in m.clusters["fsdp-p5"].instance_types]
    # max_nodes (2) of each GPU instance type; CPU and memory too, which the training pods request.
    assert quota == {
        "nvidia.com/gpu": sum(2 * t.num_gpus for t in types),
        "vpc.amazonaws.com/efa": sum(2 * t.num_efa for t in types),
        "cpu": sum(2 * t.num_vcpus for t in types),
        "memory": f"{sum(2 * t.host_memory_gib for t in types)}Gi",
    }
    controllers = built(root / "overlays/infrastructure/fsdp-p5/controllers")
    assert any(d["kind"] == "HelmRelease" and d["metadata"]["name"] == "kueue" for d in controllers)
    # Every job of the cluster carries the queue label, so Kueue admits it as one gang.
    for k in sorted((root / "overlays/runs/fsdp-p5").glob("*/kustomization.yaml")):
        (job,) = [d for d in built(k.parent) if d["kind"] == "PyTorchJob"]
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == lq["metadata"]["name"]
    # A cluster with kueue: false gets neither the controller nor the queues.
    for part in ("controllers", "configs"):
        assert not [
            d
            for d in built(root / f"overlays/infrastructure/fsdp-p4de/{part}")
            if "kueue" in d["apiVersion"] or d["metadata"]["name"] == "kueue"
        ]


@pytest.mark.gotools
def test_no_training_pod_is_privileged(tree: tuple[Path, matrix.Matrix]) -> None:
    root, _ = tree
    jobs = 0
    for k in sorted((root / "overlays/runs").glob("*/*/kustomization.yaml")):
        for d in built(k.parent):
            if d["kind"] != "PyTorchJob":
                continue
            jobs += 1
            for spec in d["spec"]["pytorchReplicaSpecs"].values():
                pod = spec["template"]["spec"]
                assert not (pod.get("hostPID") or pod.get("hostNetwork") or pod.get("hostIPC"))
                for c in pod["containers"]:
                    assert c.get("securityContext", {}).get("privileged", False) is False
                    assert not c.get("securityContext", {}).get("capabilities", {}).get("add")
    assert jobs == 4


def test_rendering_is_deterministic(tree: tuple[Path, matrix.Matrix]) -> None:
    _, m = tree
    plans = plan(m, matrix.expand(m))
    first = [clusters.render_cluster(cp, OVERLAYS) for cp in plans]
    again = [
        clusters.render_cluster(
            ClusterPlan(
                matrix_file=cp.matrix_file, cluster=cp.cluster, source=cp.source, runs=tuple(reversed(cp.runs))
            ),
            OVERLAYS,
        )
        for cp in plans
    ]
    assert first == again


def test_every_cluster_of_the_seed_matrix_has_its_secrets_folder() -> None:
    m = matrix.load(str(REPO_ROOT / "matrix.yaml"))
    for name, cluster in m.clusters.items():
        folder = REPO_ROOT / "base/secrets" / name
        k = yaml.safe_load((folder / "kustomization.yaml").read_text())
        secrets = [d for f in k["resources"] for d in load_all(folder / f) if d["kind"] == "Secret"]
        assert [(s["metadata"]["name"], s["metadata"]["namespace"]) for s in secrets] == [
            ("hf-token", cluster.namespace)
        ]
