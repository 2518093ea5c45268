"""Rule: a non-root container can read the Secrets it mounts and write the shared volume it writes.

Unit cases on pod specs (the kubelet's rules for Secret modes and fsGroup), then the real PyTorchJob
and data staging bases as built by kustomize, and the old template (uid 10001, Secret mode 0400, no
fsGroup) through the real validation pipeline, where the rule must name the file and the volume.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT
from validate_support import mutated, only

from generators.core.gotools import tool
from generators.core.yamlio import Doc
from generators.validation.readability import check_readability

TOKEN = {"name": "hf-token", "secret": {"secretName": "hf-token", "defaultMode": 0o440}}
SHARED = {"name": "shared", "persistentVolumeClaim": {"claimName": "fsdp-shared"}}


def pod(
    *,
    security: dict[str, Any] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    container_security: dict[str, Any] | None = None,
) -> Doc:
    spec = {
        "securityContext": security or {},
        "containers": [
            {
                "name": "pytorch",
                "image": "x:1",
                "securityContext": container_security or {},
                "volumeMounts": mounts or [],
            }
        ],
        "volumes": volumes or [],
    }
    return Doc(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": "fsdp"},
            "spec": {"template": {"spec": spec}},
        },
        "job.yaml",
        1,
    )


def messages(doc: Doc) -> list[str]:
    return [p.message for p in check_readability([doc])]


def test_a_root_only_secret_is_unreadable_for_uid_10001_without_fsgroup():
    volume = copy.deepcopy(TOKEN)
    volume["secret"]["defaultMode"] = 0o400
    (msg,) = messages(
        pod(
            security={"runAsUser": 10001},
            volumes=[volume],
            mounts=[{"name": "hf-token", "mountPath": "/etc/hf-token", "readOnly": True}],
        )
    )
    assert "container pytorch (uid 10001) cannot read Secret hf-token" in msg and "mode 0400" in msg
    assert "fsGroup" in msg


def test_fsgroup_makes_the_secret_readable_whatever_its_mode():
    volume = copy.deepcopy(TOKEN)
    volume["secret"]["defaultMode"] = 0o400
    assert (
        messages(
            pod(
                security={"runAsUser": 10001, "fsGroup": 10001},
                volumes=[volume],
                mounts=[{"name": "hf-token", "mountPath": "/etc/hf-token"}],
            )
        )
        == []
    )


def test_an_item_mode_overrides_the_default_mode():
    volume = {
        "name": "hf-token",
        "secret": {
            "secretName": "hf-token",
            "defaultMode": 0o444,
            "items": [{"key": "token", "path": "token", "mode": 0o400}],
        },
    }
    assert messages(
        pod(security={"runAsNonRoot": True}, volumes=[volume], mounts=[{"name": "hf-token", "mountPath": "/t"}])
    )


def test_root_and_unknown_users_are_not_judged():
    volume = copy.deepcopy(TOKEN)
    volume["secret"]["defaultMode"] = 0o400
    mounts = [{"name": "hf-token", "mountPath": "/t"}]
    assert messages(pod(security={"runAsUser": 0}, volumes=[volume], mounts=mounts)) == []
    assert messages(pod(volumes=[volume], mounts=mounts)) == []
    # The container's own runAsUser wins over the pod's.
    assert (
        messages(
            pod(security={"runAsUser": 10001}, container_security={"runAsUser": 0}, volumes=[volume], mounts=mounts)
        )
        == []
    )


def test_writing_the_shared_volume_needs_fsgroup_reading_it_does_not():
    (msg,) = messages(
        pod(security={"runAsUser": 10001}, volumes=[SHARED], mounts=[{"name": "shared", "mountPath": "/shared"}])
    )
    assert "writes PersistentVolumeClaim fsdp-shared" in msg and "root:root 0755" in msg
    assert (
        messages(
            pod(
                security={"runAsUser": 10001},
                volumes=[SHARED],
                mounts=[{"name": "shared", "mountPath": "/shared", "readOnly": True}],
            )
        )
        == []
    )
    assert (
        messages(
            pod(
                security={"runAsUser": 10001, "fsGroup": 10001},
                volumes=[SHARED],
                mounts=[{"name": "shared", "mountPath": "/shared"}],
            )
        )
        == []
    )


def build(path: str) -> list[Doc]:
    out = subprocess.run(
        [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(REPO_ROOT / path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [Doc(d, path) for d in yaml.safe_load_all(out) if d]


@pytest.mark.gotools
def test_the_training_and_staging_pods_of_the_repository_can_read_and_write_what_they_mount():
    for path in ("base/pytorchjob", "base/data-staging"):
        docs = build(path)
        assert check_readability(docs) == [], path
        # Guard against a vacuous pass: the pods are non-root and mount the shared volume read-write.
        text = yaml.safe_dump_all([d.data for d in docs])
        assert "runAsUser: 10001" in text and "claimName: fsdp-shared" in text


@pytest.mark.gotools
def test_the_old_template_fails_the_pipeline_naming_the_base_and_the_volume(tmp_path: Path):
    """uid 10001 (the image's user), the token Secret at mode 0400, no fsGroup: what every run had."""

    def change(files: dict[str, Any]) -> None:
        job = files["base/pytorchjob/pytorchjob.yaml"]
        spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        spec["securityContext"] = {"runAsUser": 10001, "runAsNonRoot": True}
        spec["volumes"].append({"name": "hf-token", "secret": {"secretName": "hf-token", "defaultMode": 0o400}})
        spec["containers"][0]["volumeMounts"].append({"name": "hf-token", "mountPath": "/secrets/hf", "readOnly": True})

    found = mutated(tmp_path, change)
    line = only(found, "cannot read Secret hf-token", "mode 0400")
    assert line.startswith("base/pytorchjob/pytorchjob.yaml"), line
    assert "PyTorchJob/" in line and "volume hf-token at /secrets/hf" in line, line
