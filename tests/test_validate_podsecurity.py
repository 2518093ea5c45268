"""Pod security: host access, privilege, added capabilities and root are problems everywhere but where
HOST_ACCESS documents why a node tool needs them; a Secret that only pretends to be SOPS-encrypted is a
problem; env names that merely contain TOKEN are judged by their value."""

from __future__ import annotations

import copy

import pytest
import yaml
from support import REPO_ROOT

from generators.validation import semantics
from generators.validation.manifests import Doc
from generators.validation.podsecurity import HOST_ACCESS, check_pod_security

SAFE_POD = {
    "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
    "containers": [
        {
            "name": "app",
            "image": "x:1",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


def deployment(pod: dict, namespace: str = "fsdp", name: str = "app") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": pod}},
    }


def messages(obj: dict) -> list[str]:
    return [p.message for p in check_pod_security([Doc(obj, "x.yaml", 1)])]


def test_a_safe_pod_passes():
    assert messages(deployment(copy.deepcopy(SAFE_POD))) == []


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda p: p.update(hostNetwork=True), "hostNetwork is not allowed"),
        (lambda p: p.update(hostPID=True), "hostPID is not allowed"),
        (lambda p: p.update(hostIPC=True), "hostIPC is not allowed"),
        (lambda p: p.update(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "hostPath / is not allowed"),
        (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "privileged is not allowed"),
        (
            lambda p: p["containers"][0]["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
            "capability SYS_ADMIN is not allowed",
        ),
        (lambda p: p.pop("securityContext"), "root is not allowed"),
        (lambda p: p["containers"][0]["securityContext"].update(runAsUser=0), "root is not allowed"),
    ],
)
def test_each_privilege_is_a_problem(edit, expected):
    pod = copy.deepcopy(SAFE_POD)
    edit(pod)
    found = messages(deployment(pod))
    assert len(found) == 1 and expected in found[0], found


def test_node_tools_keep_exactly_their_documented_privileges():
    pod = copy.deepcopy(SAFE_POD)
    pod["hostPID"] = True
    assert messages(deployment(pod, "node-tools", "htop")) == []
    # The documented allowance is per privilege: hostNetwork or privileged is still refused for a node tool.
    pod["hostNetwork"] = True
    pod["containers"][0]["securityContext"]["privileged"] = True
    found = messages(deployment(pod, "node-tools", "htop"))
    assert any("hostNetwork" in m for m in found) and any("privileged" in m for m in found)
    for privileges in HOST_ACCESS.values():
        assert all(len(why) > 30 for why in privileges.values())


def test_a_secret_that_only_pretends_to_be_encrypted_is_a_problem():
    path = REPO_ROOT / "base" / "secrets" / "fsdp-p5" / "hf-token.sops.yaml"
    real = yaml.safe_load(path.read_text())
    assert messages(real) == []
    fake = copy.deepcopy(real)
    fake["stringData"]["token"] = "hf_plaintexttoken0123456789"
    assert any("stringData.token is not encrypted" in m for m in messages(fake))
    no_mac = copy.deepcopy(real)
    no_mac["sops"] = {"age": [], "version": "3.11.0"}
    assert any("no MAC" in m for m in messages(no_mac))


@pytest.mark.parametrize(
    "env",
    [
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "MAX_NEW_TOKENS", "value": "512"},
        {"name": "HF_HUB_ENABLE_HF_TRANSFER", "value": "1"},
        {"name": "USE_AUTH_TOKEN", "value": "true"},
        {"name": "TOKEN_CACHE", "value": "/cache/tokens"},
    ],
)
def test_settings_whose_names_mention_tokens_are_not_secrets(env):
    assert semantics.secret_problems({"env": [env], "command": [f"{env['name']}={env['value']} run"]}) == []


@pytest.mark.parametrize(
    "env",
    [
        {"name": "HF_TOKEN", "value": "hf_abcdefghijklmnopqrstuvwxyz"},
        {"name": "API_TOKEN", "value": "s3cr3t-v4lue"},
        {"name": "DB_PASSWORD", "value": "hunter2"},
    ],
)
def test_literal_credentials_are_still_found(env):
    assert semantics.secret_problems({"env": [env]}) != []
