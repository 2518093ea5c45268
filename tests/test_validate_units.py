"""Unit tests of the validation pipeline's pieces: YAML loading, schema preparation, the checks."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from generators.core import yamlio
from generators.core.errors import InputError
from generators.validation import fluxgraph, manifests, schemas, semantics


def test_duplicate_key_is_a_yaml_error_with_its_line():
    with pytest.raises(yaml.YAMLError) as err:
        yamlio.load_documents("a: 1\nb:\n  c: 2\n  c: 3\n", "x.yaml")
    problem = manifests.yaml_error("x.yaml", err.value)
    assert problem.line == 4
    assert "duplicate key 'c' (first at line 3)" in str(problem)


def test_documents_keep_their_first_line_and_skip_empty_ones():
    docs = yamlio.load_documents("---\na: 1\n---\n---\nb: 2\n", "x.yaml")
    assert [(d.data, d.line) for d in docs] == [({"a": 1}, 2), ({"b": 2}, 5)]


def test_syntax_error_names_file_and_line():
    with pytest.raises(yaml.YAMLError) as err:
        yamlio.load_documents("a: 1\nb: c: d\n", "x.yaml")
    assert str(manifests.yaml_error("x.yaml", err.value)).startswith("x.yaml:2: YAML:")


def test_find_cycles_reports_each_cycle_once_from_its_smallest_node():
    edges = {"c": ["a"], "a": ["b"], "b": ["c"], "d": ["d"], "e": ["a"]}
    assert fluxgraph.find_cycles(edges) == [["a", "b", "c"], ["d"]]
    assert fluxgraph.find_cycles({"a": ["b"], "b": []}) == []


@pytest.mark.parametrize(
    "image, fine",
    [
        ("ghcr.io/org/trainer:0.3.1", True),
        ("registry:5000/org/trainer:1.0", True),
        ("nvcr.io/nvidia/k8s/dcgm-exporter@sha256:" + "a" * 64, True),
        ("ghcr.io/org/trainer:latest", False),
        ("ghcr.io/org/trainer", False),
        ("registry:5000/org/trainer", False),
        ("", False),
    ],
)
def test_image_pins(image, fine):
    assert (semantics.image_problem(image) == "") is fine


@pytest.mark.parametrize(
    "container, what",
    [
        ({"args": ["--hf_token", "hf_" + "x" * 30]}, "Hugging Face token"),
        ({"command": ["sh", "-c", "AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP aws s3 ls"]}, "AWS access key id"),
        ({"args": ["--token=abc123"]}, "literal --token value"),
        ({"command": ["bash", "-c", "HF_TOKEN=abc123 torchrun x"]}, "literal secret assignment"),
        ({"env": [{"name": "WANDB_API_TOKEN", "value": "abc"}]}, "env WANDB_API_TOKEN holds a literal value"),
        ({"env": [{"name": "DB_PASSWORD", "value": "abc"}]}, "env DB_PASSWORD holds a literal value"),
    ],
)
def test_inline_secrets_are_found(container, what):
    found = [msg for _, msg in semantics.secret_problems(container)]
    assert any(what in p for p in found), found


@pytest.mark.parametrize(
    "container",
    [
        {"env": [{"name": "HF_TOKEN_FILE", "value": "/var/run/secrets/hf/token"}]},
        {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]},
        {"args": ["--token", "$(HF_TOKEN)"]},
        {"command": ["bash", "-c", 'HF_TOKEN="$(cat $HF_TOKEN_FILE)" torchrun x']},
        {"args": ["--token-file", "/secrets/token"]},
    ],
)
def test_secret_references_are_fine(container):
    assert semantics.secret_problems(container) == []


@pytest.mark.slow
def test_core_schemas_are_prepared_once_in_kubeconform_layout(tmp_path):
    out = schemas.prepare_core_schemas(schemas.K8S_VERSION, tmp_path)
    assert out == tmp_path / f"v{schemas.K8S_VERSION}"
    deployment = json.loads((out / "deployment-apps-v1.json").read_text())
    assert "$id" not in deployment
    # Every reference is local and resolves inside the file.
    refs = set(re.findall(r'"\$ref":"([^"]+)"', json.dumps(deployment, separators=(",", ":"))))
    assert refs and all(r.startswith("#/$defs/") for r in refs)
    assert {r.removeprefix("#/$defs/") for r in refs} <= set(deployment["$defs"])
    assert deployment["additionalProperties"] is False  # the strict variant
    assert (out / "configmap-v1.json").is_file()  # core group: -v1
    assert (out / "clusterrole-rbac-v1.json").is_file()  # rbac.authorization.k8s.io: first label
    assert not (out / "podspec-v1.json").exists()  # not a kind
    stamp = (out / "SOURCE").stat().st_mtime_ns
    assert schemas.prepare_core_schemas(schemas.K8S_VERSION, tmp_path) == out
    assert (out / "SOURCE").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary folder left behind


@pytest.mark.slow
def test_core_schemas_are_prepared_again_for_another_package_version(tmp_path):
    out = schemas.prepare_core_schemas(schemas.K8S_VERSION, tmp_path)
    (out / "SOURCE").write_text("kubernetes-validate 0.0.1\n")
    (out / "stale.json").write_text("{}")
    assert schemas.prepare_core_schemas(schemas.K8S_VERSION, tmp_path) == out
    assert not (out / "stale.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_unknown_kubernetes_version_is_a_usage_error(tmp_path):
    with pytest.raises(InputError, match="kubernetes-validate has no schemas"):
        schemas.prepare_core_schemas("1.2.0", tmp_path)


def _job(**container):
    c = {
        "name": "pytorch",
        "image": "x/trainer:1",
        "command": ["torchrun", "--nproc_per_node=8", "--rdzv_id=r1"],
        "resources": {"limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}},
    }
    c.update(container)
    pod = {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}, "containers": [c]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "fsdp"},
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": {"spec": pod}}}},
    }
    return manifests.Doc(job, "run/kustomization.yaml")


def _job_problems(doc):
    return [p.message for p in semantics.check_pytorchjob(doc, {}, semantics.INSTANCE_TYPES)[0]]


def test_a_job_that_fits_its_instance_passes():
    assert _job_problems(_job()) == []
    facts = semantics.check_pytorchjob(_job(), {}, semantics.INSTANCE_TYPES)[1]
    assert facts.rdzv_ids == ("r1",)


def test_efa_must_match_the_instance():
    msgs = _job_problems(_job(resources={"limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4}}))
    assert msgs == [
        "Worker: requests 4 EFA interfaces (vpc.amazonaws.com/efa) but 8 GPUs of p5.48xlarge come with 32; request 32"
    ]


def test_nproc_per_node_must_equal_the_gpus():
    msgs = _job_problems(_job(command=["bash", "-c", "torchrun --nproc-per-node 4 --rdzv-id r1 -m trainer.train"]))
    assert msgs == [
        "Worker: torchrun --nproc_per_node is 4 but the container has 8 GPUs (nvidia.com/gpu); make them equal"
    ]


def test_nproc_from_an_env_reference_is_resolved():
    ok = _job(command=["torchrun", "--nproc_per_node=$(GPUS)"], env=[{"name": "GPUS", "value": "8"}])
    bad = _job(command=["torchrun", "--nproc_per_node=$(GPUS)"], env=[{"name": "GPUS", "value": "2"}])
    assert _job_problems(ok) == []
    assert "torchrun --nproc_per_node is 2" in _job_problems(bad)[0]


def test_privileged_training_pod_fails():
    assert "is privileged" in _job_problems(_job(securityContext={"privileged": True}))[0]


def test_unknown_instance_type_fails():
    doc = _job()
    doc.data["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = {
        "node.kubernetes.io/instance-type": "p9.48xlarge"
    }
    assert _job_problems(doc) == ["Worker: instance type p9.48xlarge is not in the catalog (trainer/catalog.py)"]


def test_unencrypted_secret_fails_and_sops_secret_passes():
    plain = manifests.Doc(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}, "stringData": {"token": "x"}},
        "s.yaml",
        1,
    )
    sealed = manifests.Doc(
        {**plain.data, "stringData": {"token": "ENC[AES256_GCM,data:xx]"}, "sops": {"version": "3"}}, "s.yaml", 1
    )
    assert ["Secret holds unencrypted data" in p.message for p in semantics.check_objects([plain])] == [True]
    assert semantics.check_objects([sealed]) == []


def test_instance_type_pinned_by_required_node_affinity_counts():
    doc = _job()
    pod = doc.data["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    del pod["nodeSelector"]
    pod["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p4d.24xlarge"]}
                        ]
                    }
                ]
            }
        }
    }
    assert _job_problems(doc) == [
        "Worker: requests 32 EFA interfaces (vpc.amazonaws.com/efa) but 8 GPUs of p4d.24xlarge come with 4; request 4"
    ]
    del pod["affinity"]
    assert "no nodeSelector node.kubernetes.io/instance-type" in _job_problems(doc)[0]


def test_mounted_config_map_must_come_with_the_job_and_its_directories_are_collected():
    doc = _job()
    pod = doc.data["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    pod["volumes"] = [{"name": "config", "configMap": {"name": "run-config"}}]
    assert "mounts ConfigMap run-config, which is not applied with the job" in _job_problems(doc)[0]
    train = "checkpoint:\n  dir: /shared/ckpt/r1\nmetrics:\n  output_dir: out\n"
    found, facts = semantics.check_pytorchjob(doc, {"fsdp/run-config": {"train.yaml": train}}, semantics.INSTANCE_TYPES)
    assert found == []
    assert facts.run_dirs == (("checkpoint directory", "/shared/ckpt/r1"),)  # relative paths are per pod
