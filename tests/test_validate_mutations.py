"""The validation pipeline against a small, real repository tree, then one mistake at a time.

Each test copies a minimal GitOps tree (a PyTorchJob base, two run overlays, an infrastructure
overlay and a cluster's Flux entry; tests/validate_support.py) into tmp_path, breaks one thing, and
runs the real pipeline (real kustomize, kubeconform, core schemas from kubernetes-validate, CRD schemas
from the schema directory the CLI uses). The clean tree must pass; each mistake must fail naming the
file and the object.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml
from support import REPO_ROOT, crd_schemas
from validate_support import fixture_files, flux_kustomization, mutated, only, problems, write_tree

from generators.validate import main as validate_main
from generators.validation import pipeline, schemas

# Every case runs the real validation (kustomize, kubeconform) over a tree.
pytestmark = pytest.mark.gotools


def test_crd_schema_dir_is_there():
    # The mutation tests below are only meaningful with the real schemas: fail, never skip.
    assert (crd_schemas() / "kubeflow.org" / "pytorchjob_v1.json").is_file(), (
        f"CRD schemas not found at {crd_schemas()}; set {schemas.CRD_SCHEMAS_ENV}"
    )


def test_clean_tree_passes(tmp_path):
    write_tree(tmp_path, fixture_files())
    report = pipeline.validate(tmp_path, crd_dir=crd_schemas())
    assert [str(p) for p in report.problems] == []
    assert report.num_builds == 4  # the base, the infrastructure overlay, two runs
    assert report.num_flux_kustomizations == 3
    # 4 builds (1 + 1 + 2x job and ConfigMap) and the 4 Flux objects of the bootstrap directory
    assert report.num_resources == 1 + 1 + 4 + 4


def test_what_flux_bootstrap_commits_is_the_bootstrap_itself(tmp_path):
    # `flux bootstrap --path=overlays/clusters/c1` commits flux-system/ with a Kustomization that syncs
    # the bootstrap directory itself; following it would apply everything twice.
    files = fixture_files()
    files["overlays/clusters/c1/flux-system/kustomization.yaml"] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["gotk-sync.yaml"],
    }
    sync = flux_kustomization("flux-system", "./overlays/clusters/c1")
    sync["spec"]["sourceRef"]["name"] = "flux-system"
    source = copy.deepcopy(files["overlays/clusters/c1/sources.yaml"])
    source["metadata"]["name"] = "flux-system"
    files["overlays/clusters/c1/flux-system/gotk-sync.yaml"] = [source, sync]
    write_tree(tmp_path, files)
    report = pipeline.validate(tmp_path, crd_dir=crd_schemas())
    assert [str(p) for p in report.problems] == []
    assert report.num_flux_kustomizations == 4


def test_a_source_applied_by_another_kustomization_resolves(tmp_path):
    files = fixture_files()
    # experiments.yaml is read before infrastructure.yaml, whose Kustomization applies the source.
    upstream = flux_kustomization("upstream-manifests", "./deploy")
    upstream["spec"]["sourceRef"]["name"] = "upstream"
    files["overlays/clusters/c1/experiments.yaml"].append(upstream)
    files["overlays/infrastructure/c1/configs/source.yaml"] = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "GitRepository",
        "metadata": {"name": "upstream", "namespace": "flux-system"},
        "spec": {"interval": "1h", "url": "https://github.com/example/upstream", "ref": {"tag": "v1.0.0"}},
    }
    files["overlays/infrastructure/c1/configs/kustomization.yaml"]["resources"].append("source.yaml")
    write_tree(tmp_path, files)
    assert problems(tmp_path) == []  # ./deploy is upstream's path: not checked against this repository
    del files["overlays/infrastructure/c1/configs/source.yaml"]
    files["overlays/infrastructure/c1/configs/kustomization.yaml"]["resources"].remove("source.yaml")
    write_tree(tmp_path / "without", files)
    only(
        problems(tmp_path / "without"),
        "overlays/clusters/c1/experiments.yaml",
        "Kustomization/flux-system/upstream-manifests",
        "sourceRef GitRepository/flux-system/upstream is not defined",
    )


def test_typo_in_api_version_fails(tmp_path):
    def change(f):
        f["overlays/infrastructure/c1/configs/namespace.yaml"]["apiVersion"] = "v2"

    line = only(mutated(tmp_path, change), "overlays/infrastructure/c1/configs/namespace.yaml", "Namespace/fsdp")
    assert "could not find schema for Namespace" in line


def test_unknown_field_in_a_run_patch_fails(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-b/pytorchjob.patch.yaml"]["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2

    line = only(mutated(tmp_path, change), "overlays/runs/c1/run-b/pytorchjob.patch.yaml", "PyTorchJob/fsdp/run-b")
    assert "additional properties 'replica' not allowed" in line


def test_unknown_field_in_a_json_patch_is_blamed_on_the_patch(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-a/pytorchjob.command.yaml"].append(
            {
                "op": "add",
                "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/resources",
                "value": {"limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}, "limit": {}},
            }
        )

    line = only(mutated(tmp_path, change), "overlays/runs/c1/run-a/pytorchjob.command.yaml", "PyTorchJob/fsdp/run-a")
    assert "additional properties 'limit' not allowed" in line


def test_unknown_field_in_the_base_is_blamed_on_the_base(tmp_path):
    def change(f):
        f["base/pytorchjob/pytorchjob.yaml"]["spec"]["runPolicy"]["deadline"] = 5

    # One line for the base and the two runs built on it.
    assert mutated(tmp_path, change) == [
        "base/pytorchjob/pytorchjob.yaml: PyTorchJob/fsdp-job: kubeconform: at '/spec/runPolicy': additional "
        "properties 'deadline' not allowed (in the build of base/pytorchjob) (and 2 more like it)"
    ]


def test_depends_on_missing_kustomization_fails(tmp_path):
    def change(f):
        f["overlays/clusters/c1/experiments.yaml"][1]["spec"]["dependsOn"] = [{"name": "infra-config"}]

    line = only(mutated(tmp_path, change), "overlays/clusters/c1/experiments.yaml", "Kustomization/flux-system/run-b")
    assert "dependsOn Kustomization flux-system/infra-config does not exist" in line


def test_dependency_cycle_fails(tmp_path):
    def change(f):
        f["overlays/clusters/c1/infrastructure.yaml"]["spec"]["dependsOn"] = [{"name": "run-a"}]

    line = only(mutated(tmp_path, change), "overlays/clusters/c1/", "cycle")
    assert "infra-configs -> run-a -> infra-configs" in line


def test_flux_path_that_does_not_exist_fails(tmp_path):
    def change(f):
        f["overlays/clusters/c1/experiments.yaml"][0]["spec"]["path"] = "./overlays/runs/c1/run-z"

    line = only(mutated(tmp_path, change), "overlays/clusters/c1/experiments.yaml", "Kustomization/flux-system/run-a")
    assert "spec.path ./overlays/runs/c1/run-z does not exist" in line


def test_gpu_request_above_the_instance_fails(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-a/pytorchjob.command.yaml"] += [
            {
                "op": "replace",
                "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/resources/limits",
                "value": {"nvidia.com/gpu": 16, "vpc.amazonaws.com/efa": 32},
            }
        ]
        f["overlays/runs/c1/run-a/pytorchjob.command.yaml"][0]["value"][1] = "--nproc_per_node=16"

    line = only(mutated(tmp_path, change), "overlays/runs/c1/run-a/pytorchjob.command.yaml", "PyTorchJob/fsdp/run-a")
    assert "requests 16 GPUs (nvidia.com/gpu) but p5.48xlarge has 8" in line


def test_latest_image_fails(tmp_path):
    def change(f):
        pod = f["base/pytorchjob/pytorchjob.yaml"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        c = pod["containers"][0]
        c["image"] = "public.ecr.aws/example/fsdp-trainer:latest"

    assert mutated(tmp_path, change) == [
        "base/pytorchjob/pytorchjob.yaml: PyTorchJob/fsdp-job: container pytorch: image "
        "public.ecr.aws/example/fsdp-trainer:latest uses the moving tag latest; pin it by tag or digest "
        "(and 2 more like it)"
    ]


def test_token_inline_in_a_command_fails(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-b/pytorchjob.command.yaml"][0]["value"] = [
            "bash",
            "-c",
            "HF_TOKEN=hf_abcdefghijklmnopqrstuvwx torchrun --nproc_per_node=8 --rdzv_id=run-b -m trainer.train",
        ]

    line = only(mutated(tmp_path, change), "overlays/runs/c1/run-b/pytorchjob.command.yaml", "PyTorchJob/fsdp/run-b")
    assert "command contains a Hugging Face token" in line


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-a/train.yaml"] = "model:\n  name: llama2-7b\n checkpoint: [\n"

    line = only(mutated(tmp_path, change), "overlays/runs/c1/run-a/train.yaml:3:")
    assert "YAML" in line


def test_duplicate_rendezvous_id_and_checkpoint_dir_fail(tmp_path):
    def change(f):
        f["overlays/runs/c1/run-b/pytorchjob.command.yaml"][0]["value"][2] = "--rdzv_id=run-a"
        f["overlays/runs/c1/run-b/train.yaml"]["checkpoint"]["dir"] = "/shared/checkpoints/run-a"

    found = mutated(tmp_path, change)
    only(found, "PyTorchJob/fsdp/run-b", "rendezvous id run-a is also used by PyTorchJob/fsdp/run-a")
    only(found, "PyTorchJob/fsdp/run-b", "checkpoint directory /shared/checkpoints/run-a is also used")


def test_object_applied_by_two_kustomizations_fails(tmp_path):
    def change(f):
        k = f["overlays/runs/c1/run-a/kustomization.yaml"]
        k["resources"].append("../../../infrastructure/c1/configs/namespace.yaml")

    line = only(mutated(tmp_path, change), "Namespace/fsdp", "applied by both")
    assert "Kustomization flux-system/infra-configs" in line and "Kustomization flux-system/run-a" in line


def test_source_ref_that_does_not_resolve_fails(tmp_path):
    def change(f):
        f["overlays/clusters/c1/infrastructure.yaml"]["spec"]["sourceRef"]["name"] = "fsdp"

    line = only(
        mutated(tmp_path, change), "overlays/clusters/c1/infrastructure.yaml", "Kustomization/flux-system/infra-configs"
    )
    assert "sourceRef GitRepository/flux-system/fsdp is not defined" in line


def test_cli_exit_codes(tmp_path, cli):
    files = fixture_files()
    write_tree(tmp_path, files)
    ok = cli(validate_main, ["--crd-schemas", str(crd_schemas()), str(tmp_path)])
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.strip().endswith(": OK")
    (tmp_path / "overlays/clusters/c1/infrastructure.yaml").write_text(
        yaml.safe_dump(flux_kustomization("infra-configs", "./nowhere"))
    )
    bad = cli(validate_main, ["--crd-schemas", str(crd_schemas()), str(tmp_path)])
    assert bad.exit_code == 1
    assert (
        "overlays/clusters/c1/infrastructure.yaml:1: Kustomization/flux-system/infra-configs: spec.path ./nowhere"
    ) in bad.stderr
    usage = cli(validate_main, ["--crd-schemas", str(tmp_path / "missing"), str(tmp_path)])
    assert usage.exit_code == 2 and "not a directory" in usage.stderr
    version = cli(validate_main, ["--crd-schemas", str(crd_schemas()), "--k8s-version", "1.2.0", str(tmp_path)])
    assert version.exit_code == 2 and "kubernetes-validate has no schemas for it" in version.stderr
    outside = cli(validate_main, ["--crd-schemas", str(crd_schemas()), str(tmp_path / "nowhere")])
    assert outside.exit_code == 2 and "no such file or directory" in outside.stderr


def test_non_cluster_documents_go_to_their_own_schema(tmp_path):
    schema = tmp_path / "thing.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "required": ["apiVersion", "kind", "size"],
                "additionalProperties": False,
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "size": {"type": "integer"},
                },
            }
        )
    )
    table = {**schemas.NON_CLUSTER_SCHEMAS, ("example.io/v1", "Thing"): str(schema)}
    files = fixture_files()
    files["provisioning/c1/thing.yaml"] = {
        "apiVersion": "example.io/v1",
        "kind": "Thing",
        "metadata": {"name": "t"},
        "size": 3,
    }
    write_tree(tmp_path / "repo", files)
    assert pipeline.validate(tmp_path / "repo", crd_dir=crd_schemas(), non_cluster=table).problems == []
    # Without the table entry the same document is an unknown kind for the cluster.
    found = [str(p) for p in pipeline.validate(tmp_path / "repo", crd_dir=crd_schemas()).problems]
    only(found, "provisioning/c1/thing.yaml:1: Thing/t:", "could not find schema for Thing")
    (tmp_path / "repo/provisioning/c1/thing.yaml").write_text(
        "apiVersion: example.io/v1\nkind: Thing\nmetadata: {name: t}\nsize: big\n"
    )
    found = [str(p) for p in pipeline.validate(tmp_path / "repo", crd_dir=crd_schemas(), non_cluster=table).problems]
    only(found, "provisioning/c1/thing.yaml:1: Thing/t:", "/size", "want integer")


def test_unused_component_is_built_through_an_empty_parent(tmp_path):
    files = fixture_files()
    files["base/components/extra/kustomization.yaml"] = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": ["cm.yaml"],
    }
    files["base/components/extra/cm.yaml"] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "extra"},
        "data": {"a": "b"},
        "bogus": 1,
    }
    write_tree(tmp_path, files)
    found = problems(tmp_path)
    only(found, "base/components/extra/cm.yaml", "ConfigMap/extra", "'bogus' not allowed")


def test_sops_encrypted_secret_passes_and_plaintext_secret_fails(tmp_path):
    files = fixture_files()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token", "namespace": "fsdp"},
        "type": "Opaque",
        "stringData": {"token": "ENC[AES256_GCM,data:abc,iv:x,tag:y,type:str]"},
        "sops": {
            "age": [{"recipient": "age1xyz", "enc": "x"}],
            "version": "3.11.0",
            "mac": "ENC[AES256_GCM,data:m,iv:x,tag:y,type:str]",
        },
    }
    files["overlays/infrastructure/c1/configs/secret.yaml"] = secret
    files["overlays/infrastructure/c1/configs/kustomization.yaml"]["resources"].append("secret.yaml")
    write_tree(tmp_path, files)
    assert problems(tmp_path) == []
    del secret["sops"]
    write_tree(tmp_path, files)
    only(problems(tmp_path), "overlays/infrastructure/c1/configs/secret.yaml", "Secret/fsdp/hf-token", "unencrypted")
    # A copied sops block over a plain-text value only pretends to be encrypted.
    secret["sops"] = {"age": [], "mac": "ENC[AES256_GCM,data:m,iv:x,tag:y,type:str]"}
    secret["stringData"]["token"] = "hf_plaintexttokenplaintexttoken"
    write_tree(tmp_path, files)
    only(
        problems(tmp_path),
        "overlays/infrastructure/c1/configs/secret.yaml",
        "Secret/fsdp/hf-token",
        "stringData.token is not encrypted",
    )


def test_script_runs_from_a_checkout(tmp_path):
    # `python generators/validate.py` (as tools/test.sh and CI call it), not only the importable core.
    write_tree(tmp_path, fixture_files())
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "generators" / "validate.py"),
            "--crd-schemas",
            str(crd_schemas()),
            str(tmp_path / "overlays"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("validated ") and proc.stdout.strip().endswith(": OK")
