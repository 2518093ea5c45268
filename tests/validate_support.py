"""A minimal GitOps tree for the validation pipeline's tests (a PyTorchJob base, two run overlays, an
infrastructure overlay and a cluster's Flux entry), written into a folder and run through the real
pipeline: tests/test_validate_mutations.py breaks it one mistake at a time, and the rule tests
(test_validate_device_plugins.py, test_validate_readability.py) build their cases on it."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from support import crd_schemas

from generators.validation import pipeline

BASE_JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "fsdp-job"},
    "spec": {
        "runPolicy": {"activeDeadlineSeconds": 3600},
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 1,
                "restartPolicy": "OnFailure",
                "template": {
                    "spec": {
                        "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                        "containers": [
                            {
                                "name": "pytorch",
                                # {"$imagepolicy": ...} markers live in the real base; a pinned tag is what
                                # matters here.
                                "image": "public.ecr.aws/example/fsdp-trainer:0.1.0",
                                "command": [
                                    "torchrun",
                                    "--nproc_per_node=8",
                                    "--rdzv_id=RDZV",
                                    "-m",
                                    "trainer.train",
                                    "--config",
                                    "/config/train.yaml",
                                ],
                                "env": [{"name": "HF_TOKEN_FILE", "value": "/secrets/hf/token"}],
                                "resources": {"limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}},
                                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "train-config"}}],
                    }
                },
            },
        },
    },
}


def run_overlay(run: str) -> dict[str, Any]:
    return {
        "kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": "fsdp",
            "resources": ["../../../../base/pytorchjob"],
            # PyTorchJob is a custom resource: a strategic merge patch would replace the whole containers
            # list, so the container is changed by JSON patch.
            "patches": [
                {"path": "pytorchjob.patch.yaml"},
                {"path": "pytorchjob.command.yaml", "target": {"kind": "PyTorchJob", "name": "fsdp-job"}},
            ],
            # kustomize does not rewrite references inside custom resources, so the ConfigMap keeps a
            # fixed name that the JSON patch puts into the job.
            "configMapGenerator": [
                {"name": f"train-{run}", "files": ["train.yaml"], "options": {"disableNameSuffixHash": True}}
            ],
        },
        "pytorchjob.patch.yaml": {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "fsdp-job"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}},
        },
        "pytorchjob.command.yaml": [
            {
                "op": "replace",
                "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/command",
                "value": [
                    "torchrun",
                    "--nproc_per_node=8",
                    f"--rdzv_id={run}",
                    "-m",
                    "trainer.train",
                    "--config",
                    "/config/train.yaml",
                ],
            },
            {"op": "replace", "path": "/metadata/name", "value": run},
            {
                "op": "replace",
                "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/volumes/0/configMap/name",
                "value": f"train-{run}",
            },
        ],
        "train.yaml": {"model": {"name": "llama2-7b"}, "checkpoint": {"dir": f"/shared/checkpoints/{run}"}},
    }


def flux_kustomization(name: str, path: str, depends: list[str] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "interval": "10m",
        "path": path,
        "prune": True,
        "sourceRef": {"kind": "GitRepository", "name": "fsdp-gitops"},
    }
    if depends:
        spec["dependsOn"] = [{"name": d} for d in depends]
    return {
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
        "kind": "Kustomization",
        "metadata": {"name": name, "namespace": "flux-system"},
        "spec": spec,
    }


def fixture_files() -> dict[str, Any]:
    """{path: document or [documents]} of the clean tree."""
    files: dict[str, Any] = {
        "base/pytorchjob/kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["pytorchjob.yaml"],
        },
        "base/pytorchjob/pytorchjob.yaml": copy.deepcopy(BASE_JOB),
        "overlays/infrastructure/c1/configs/kustomization.yaml": {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["namespace.yaml"],
        },
        "overlays/infrastructure/c1/configs/namespace.yaml": {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "fsdp"},
        },
        "overlays/clusters/c1/sources.yaml": {
            "apiVersion": "source.toolkit.fluxcd.io/v1",
            "kind": "GitRepository",
            "metadata": {"name": "fsdp-gitops", "namespace": "flux-system"},
            "spec": {"interval": "1m", "url": "https://github.com/example/fsdp-gitops", "ref": {"branch": "main"}},
        },
        "overlays/clusters/c1/infrastructure.yaml": flux_kustomization(
            "infra-configs", "./overlays/infrastructure/c1/configs"
        ),
        "overlays/clusters/c1/experiments.yaml": [
            flux_kustomization("run-a", "./overlays/runs/c1/run-a", ["infra-configs"]),
            flux_kustomization("run-b", "./overlays/runs/c1/run-b", ["infra-configs"]),
        ],
        "matrix.yaml": {"defaults": {"nodes": 1}},  # not a manifest: parsed only
    }
    for run in ("run-a", "run-b"):
        for name, doc in run_overlay(run).items():
            files[f"overlays/runs/c1/{run}/{name}"] = doc
    return files


def write_tree(root: Path, files: dict[str, Any]) -> None:
    for rel, doc in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(doc, str):
            p.write_text(doc)
        else:
            # A list is several documents, except in a JSON patch file (one document that is a list).
            many = isinstance(doc, list) and not rel.endswith(".command.yaml")
            p.write_text(yaml.safe_dump_all(doc if many else [doc], sort_keys=False))
    subprocess.run(["git", "init", "-q", str(root)], check=True)


def problems(root: Path) -> list[str]:
    return [str(p) for p in pipeline.validate(root, crd_dir=crd_schemas()).problems]


def mutated(tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> list[str]:
    files = fixture_files()
    change(files)
    write_tree(tmp_path, files)
    return problems(tmp_path)


def only(found: list[str], *needles: str) -> str:
    """The one problem line that contains every needle (and the test fails otherwise)."""
    hits = [p for p in found if all(n in p for n in needles)]
    assert hits, f"no problem mentions {needles}; got {found}"
    return hits[0]
