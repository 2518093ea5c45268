"""The hand-written infrastructure bases: they build, pass kubeconform strict, and keep their promises.

Builds and schemas go through the repository's validation pipeline (generators/validate.py: real
kustomize, kubeconform -strict, core schemas from kubernetes-validate, CRD schemas from the schema
directory). The other tests read the built objects and check what no schema can: pins, the GPU-node
contract, least privilege and that every privilege the node tools keep is documented.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from generators.core.gotools import tool
from generators.validation import pipeline, schemas
from trainer.catalog import INSTANCE_TYPES

# Builds every base with kustomize and checks it with kubeconform.
pytestmark = pytest.mark.gotools

BASES = [
    "base/etcd",
    "base/training-operator",
    "base/monitoring/controllers",
    "base/monitoring/configs",
    "base/node-tools",
    "base/infrastructure/controllers",
    "base/infrastructure/configs",
]
DCGM_PANEL_METRICS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
]
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_TAINTS = {"nvidia.com/gpu", "vpc.amazonaws.com/efa"}
EXACT_SEMVER = re.compile(r"^\d+\.\d+\.\d+$")


def build(path: str, root: Path = REPO_ROOT) -> list[dict[str, Any]]:
    out = subprocess.run(
        [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(root / path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.fixture(scope="module")
def controllers() -> list[dict[str, Any]]:
    return build("base/infrastructure/controllers")


@pytest.fixture(scope="module")
def configs() -> list[dict[str, Any]]:
    return build("base/infrastructure/configs")


def test_every_base_builds_and_passes_kubeconform_strict() -> None:
    report = pipeline.validate(REPO_ROOT, BASES, crd_dir=schemas.default_crd_dir())
    assert report.problems == [], "\n".join(map(str, report.problems))
    assert report.num_builds >= len(BASES)


def test_the_validation_catches_an_unknown_field_in_a_base(tmp_path: Path) -> None:
    """The strict check above can fail: the same pipeline on a copy with one typo'd field."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copytree(REPO_ROOT / "base" / "etcd", tmp_path / "base" / "etcd")
    dep = tmp_path / "base" / "etcd" / "deployment.yaml"
    dep.write_text(dep.read_text().replace("readinessProbe:", "readinesProbe:"))
    report = pipeline.validate(tmp_path, ["base/etcd"], crd_dir=schemas.default_crd_dir())
    assert any("readinesProbe" in p.message and "etcd" in str(p) for p in report.problems), report.problems


def test_etcd_is_3_5_with_v2_api_probe_requests_and_no_privilege(controllers: list[dict[str, Any]]) -> None:
    dep = find(controllers, "Deployment", "etcd")
    assert dep["metadata"]["namespace"] == "fsdp-system"
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", c["image"]), c["image"]
    assert "--enable-v2=true" in c["args"]
    assert {"name": "ETCDCTL_API", "value": "2"} in c["env"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    svc = find(controllers, "Service", "etcd")
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("client", 2379)]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_training_operator_is_the_pinned_upstream_standalone_overlay(controllers: list[dict[str, Any]]) -> None:
    repo = find(controllers, "GitRepository", "training-operator")
    assert repo["spec"]["url"] == "https://github.com/kubeflow/trainer"
    # The same release the PyTorchJob schema in CI was generated from.
    tag = repo["spec"]["ref"]["tag"]
    assert re.fullmatch(r"v1\.9\.\d+", tag), tag
    sources = (schemas.default_crd_dir() / "SOURCES.md").read_text().splitlines()
    (row,) = [line for line in sources if "kubeflow.org/pytorchjob_v1.json" in line and line.startswith("|")]
    assert f"| {tag} " in row, row
    ks = find(controllers, "Kustomization", "training-operator")
    assert ks["apiVersion"] == "kustomize.toolkit.fluxcd.io/v1"
    assert ks["spec"]["path"] == "./manifests/overlays/standalone"
    assert ks["spec"]["sourceRef"] == {"kind": "GitRepository", "name": "training-operator"}
    assert ks["spec"]["prune"] is True and ks["spec"]["wait"] is True
    # No vendored upstream files: nothing in the repository defines the operator's CRDs.
    vendored = [p for p in (REPO_ROOT / "base").rglob("*.yaml") if "CustomResourceDefinition" in p.read_text()]
    assert vendored == []


def test_helm_charts_are_pinned_and_prometheus_installs_its_crds(controllers: list[dict[str, Any]]) -> None:
    releases = {d["metadata"]["name"]: d for d in controllers if d["kind"] == "HelmRelease"}
    assert set(releases) == {"kube-prometheus-stack", "dcgm-exporter"}
    for r in releases.values():
        assert EXACT_SEMVER.match(r["spec"]["chart"]["spec"]["version"]), r["spec"]["chart"]["spec"]
    kps = releases["kube-prometheus-stack"]["spec"]
    assert kps["install"]["crds"] == "CreateReplace" and kps["upgrade"]["crds"] == "CreateReplace"
    sidecar = kps["values"]["grafana"]["sidecar"]["dashboards"]
    assert sidecar["enabled"] is True and (sidecar["label"], sidecar["labelValue"]) == ("grafana_dashboard", "1")
    dcgm = releases["dcgm-exporter"]["spec"]
    assert dcgm["dependsOn"] == [{"name": "kube-prometheus-stack"}]
    assert dcgm["values"]["serviceMonitor"]["enabled"] is True
    assert re.fullmatch(r"\d+\.\d+\.\d+-\d+\.\d+\.\d+-[a-z0-9.]+", dcgm["values"]["image"]["tag"])


def test_dashboard_has_the_six_dcgm_panels_by_node_and_gpu(configs: list[dict[str, Any]]) -> None:
    cm = find(configs, "ConfigMap", "grafana-dashboard-fsdp-gpus")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    dash = json.loads(text)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for metric in DCGM_PANEL_METRICS:
        mine = [e for e in exprs if metric in e]
        assert len(mine) == 1, (metric, mine)
        assert "by (node, gpu)" in mine[0]
    assert any("fsdp_tokens_per_second" in e for e in exprs) and any("fsdp_mfu_ratio" in e for e in exprs)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


def test_trainer_podmonitor_matches_the_pytorchjob_template(configs: list[dict[str, Any]]) -> None:
    pm = find(configs, "PodMonitor", "fsdp-trainer")
    job = yaml.safe_load((REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml").read_text())
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    labels = template["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    # The DCGM exporter owns 9400; the trainer's port must differ.
    assert ports[endpoint["port"]] != 9400


def gpu_workloads(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(label, nodeAffinity, tolerations) of every DaemonSet and every HelmRelease's values."""
    for d in docs:
        if d["kind"] == "DaemonSet":
            pod = d["spec"]["template"]["spec"]
            yield f"DaemonSet/{d['metadata']['name']}", pod.get("affinity", {}), pod.get("tolerations", [])
        elif d["kind"] == "HelmRelease" and "affinity" in d["spec"].get("values", {}):
            values = d["spec"]["values"]
            yield f"HelmRelease/{d['metadata']['name']}", values["affinity"], values.get("tolerations", [])


def test_gpu_workloads_follow_the_node_affinity_contract(controllers: list[dict[str, Any]]) -> None:
    # The node tools are built on their own (a Flux Kustomization nothing depends on).
    found = list(gpu_workloads(controllers + build("base/node-tools")))
    assert {label for label, _, _ in found} == {
        "DaemonSet/htop",
        "DaemonSet/nvtop",
        "HelmRelease/dcgm-exporter",
        "DaemonSet/nvidia-device-plugin",
        "DaemonSet/efa-device-plugin",
    }
    assert not [d for d in controllers if d["metadata"].get("namespace") == "node-tools"]
    for label, affinity, tolerations in found:
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert len(terms) == 1, label
        first = terms[0]["matchExpressions"][0]
        assert (first["key"], first["operator"]) == (INSTANCE_TYPE_LABEL, "In"), label
        # The base lists every GPU instance type the generator knows; overlays narrow it per cluster.
        assert first["values"] == list(INSTANCE_TYPES), label
        assert {t["key"] for t in tolerations} >= GPU_TAINTS, label


def test_node_tools_are_unprivileged_and_images_pinned() -> None:
    tools = build("base/node-tools")
    for name in ("htop", "nvtop"):
        ds = find(tools, "DaemonSet", name)
        assert ds["metadata"]["namespace"] == "node-tools"
        pod = ds["spec"]["template"]["spec"]
        assert pod["hostPID"] is True
        assert not pod.get("hostNetwork") and not pod.get("hostIPC")
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert not any("hostPath" in vol for vol in pod.get("volumes", []))
        (c,) = pod["containers"]
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})
        assert re.search(r":\d+\.\d+\.\d+$", c["image"]), c["image"]


def kept_privileges(docs: list[dict[str, Any]]) -> set[str]:
    """Every privilege the node-tools objects keep, spelled as the README table names it."""
    kept = set()
    for d in docs:
        if d["kind"] == "Namespace":
            level = d["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce")
            if level and level != "restricted":
                kept.add(f"pod-security.kubernetes.io/enforce: {level}")
        if d["kind"] != "DaemonSet":
            continue
        pod = d["spec"]["template"]["spec"]
        for key in ("hostPID", "hostNetwork", "hostIPC"):
            if pod.get(key):
                kept.add(f"{key}: true")
        for c in pod["containers"]:
            for cap in c.get("securityContext", {}).get("capabilities", {}).get("add", []):
                kept.add(cap)
            for env in c.get("env", []):
                if env["name"].startswith("NVIDIA_"):
                    kept.add(f"{env['name']}={env['value']}")
    return kept


def test_every_privilege_of_the_node_tools_is_documented() -> None:
    kept = kept_privileges(build("base/node-tools"))
    assert "hostPID: true" in kept  # the check sees what it must document
    readme = (REPO_ROOT / "base" / "node-tools" / "README.md").read_text()
    table = [line for line in readme.splitlines() if line.startswith("|") and not line.startswith("|--")]
    for privilege in sorted(kept):
        rows = [line for line in table if privilege in line]
        assert rows, f"{privilege} is kept by base/node-tools but has no row in base/node-tools/README.md"
        assert len(rows[0].split("|")[-2].strip()) > 40, f"{privilege}: the reason is missing"


def test_kueue_components_build_and_validate_when_enabled(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copytree(REPO_ROOT / "base", tmp_path / "base", ignore=shutil.ignore_patterns("secrets"))
    for k, comp in (("controllers", "controller"), ("configs", "queues")):
        f = tmp_path / "base" / "infrastructure" / k / "kustomization.yaml"
        f.write_text(f.read_text() + f"components:\n  - ../../components/kueue/{comp}\n")
    report = pipeline.validate(tmp_path, ["base/infrastructure", "base/components"], crd_dir=schemas.default_crd_dir())
    assert report.problems == [], "\n".join(map(str, report.problems))
    kinds = {d["kind"] for d in build("base/infrastructure/configs", tmp_path)}
    assert {"ResourceFlavor", "ClusterQueue", "LocalQueue"} <= kinds
    assert "HelmRelease" in {
        d["kind"] for d in build("base/infrastructure/controllers", tmp_path) if d["metadata"]["name"] == "kueue"
    }


def test_kueue_is_not_in_the_shared_bases(controllers: list[dict[str, Any]], configs: list[dict[str, Any]]) -> None:
    # Each cluster's overlays add the components (on by default, `kueue: false` in the matrix turns them off).
    assert not [d for d in controllers + configs if "kueue" in d["apiVersion"] or d["metadata"]["name"] == "kueue"]


def test_an_undocumented_privilege_would_be_caught() -> None:
    docs = build("base/node-tools")
    nvtop = find(docs, "DaemonSet", "nvtop")
    nvtop["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_PTRACE"]
    nvtop["spec"]["template"]["spec"]["hostNetwork"] = True
    kept = kept_privileges(docs)
    readme = (REPO_ROOT / "base" / "node-tools" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("|")]
    assert {"SYS_PTRACE", "hostNetwork: true"} <= kept
    assert not any("SYS_PTRACE" in r or "hostNetwork: true" in r for r in rows)


def test_node_tools_image_is_built_from_a_linted_pinned_dockerfile() -> None:
    dockerfile = REPO_ROOT / "base" / "node-tools" / "image" / "Dockerfile"
    lint = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = dockerfile.read_text()
    assert re.search(r"^FROM ubuntu:\d+\.\d+$", text, re.M)
    assert re.search(r"htop=\S+", text) and re.search(r"nvtop=\S+", text)
    images = {
        find(build("base/node-tools"), "DaemonSet", n)["spec"]["template"]["spec"]["containers"][0]["image"]
        for n in ("htop", "nvtop")
    }
    (image,) = images
    # The build command in the Dockerfile names the tag the DaemonSets run.
    assert f"docker build -t {image} " in text
