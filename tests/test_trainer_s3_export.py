"""Checkpoints copied to S3 and verified there (checkpoint.s3_uri, trainer/s3_export.py).

Against a real S3-compatible server: moto's, started by the tests as a process on 127.0.0.1 and a free
port, reached through AWS_ENDPOINT_URL as the trainer's boto3 reaches any store. The trainer runs
for real (2 ranks on CPU through torchrun, the tiny config). The checkpointer's test hook
(FSDP_CHECKPOINT_TEST_HOOK) logs the export events and holds an export between its upload and its
verification (hold-export-step-N), the window in which a test looks at the local folder or changes an
object behind the trainer's back.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import (
    LAUNCH_TIMEOUT_S,
    finish,
    free_port,
    output_overrides,
    torchrun_cmd,
    trainer_env,
    wait_for,
)

from trainer.checkpoint import TEST_HOOK_ENV, verify
from trainer.config import CheckpointConfig, ConfigError
from trainer.s3_export import StepCopy, digest

pytestmark = pytest.mark.slow

BUCKET = "fsdp-checkpoints"


@pytest.fixture
def s3(monkeypatch, tmp_path) -> Iterator[dict[str, str]]:
    """moto's S3 server on loopback with one bucket; the environment that points boto3 at it."""
    port = free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{env['AWS_ENDPOINT_URL']}/moto-api/", timeout=2).close()
                break
            except OSError as err:
                if server.poll() is not None or time.monotonic() > deadline:
                    stderr = server.stderr.read() if server.stderr else ""
                    raise AssertionError(f"moto's server did not start: {stderr}") from err
                time.sleep(0.1)
        client().create_bucket(Bucket=BUCKET)
        yield env
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def client():
    import boto3

    return boto3.client("s3")


def objects(prefix: str) -> dict[str, bytes]:
    """{key relative to `prefix`: content} of every object under it."""
    s3 = client()
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"][len(prefix) :]] = s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
    return found


def sha256s(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(folder.iterdir())}


def launch(tmp_path: Path, overrides: list[str], hook: Path) -> subprocess.Popen:
    hook.mkdir(exist_ok=True)
    return subprocess.Popen(
        torchrun_cmd([*output_overrides(tmp_path), *overrides]),
        cwd=REPO_ROOT,
        env=trainer_env(**{TEST_HOOK_ENV: str(hook)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def events(hook: Path) -> list[dict]:
    return [json.loads(line) for line in (hook / "events-rank0.jsonl").read_text().splitlines()]


def run_overrides(steps: int, uri: str) -> list[str]:
    return [
        f"training.max_steps={steps}",
        "checkpoint.interval_steps=1",
        "checkpoint.keep_last=2",
        "checkpoint.async_mode=disabled",
        f"checkpoint.s3_uri={uri}",
        "checkpoint.prune_after_export=true",
    ]


def test_every_kept_checkpoint_is_on_s3_verified_with_complete_last_and_the_final_one_pruned_after(s3, tmp_path):
    hook, ckpt = tmp_path / "hook", tmp_path / "ckpt"
    hook.mkdir()
    release = hook / "hold-export-step-3"
    release.touch()
    proc = launch(tmp_path, run_overrides(3, f"s3://{BUCKET}/runs/a"), hook)
    wait_for((hook / "held-export-step-3").exists, proc, LAUNCH_TIMEOUT_S, "the final export held")
    # Uploaded, not yet verified: the local final checkpoint is still there, and COMPLETE is not on S3.
    final_local = sha256s(ckpt / "step-00000003")
    assert "COMPLETE" not in objects("runs/a/step-00000003/")
    release.unlink()
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]

    # The final checkpoint was removed locally, and only after its copy verified.
    assert not (ckpt / "step-00000003").exists()
    log = events(hook)
    names = [(e["event"], e["step"]) for e in log]
    assert names.index(("exported", 3)) < names.index(("pruned", 3)), names
    assert "checkpoint: removed the local" in out and "warning" not in out, out[-3000:]

    # Every kept step (step 2 kept locally by keep_last 2, step 3 the pruned final) is on S3, file by
    # file the local folder, with COMPLETE put last.
    for step, local in ((2, sha256s(ckpt / "step-00000002")), (3, final_local)):
        prefix = f"runs/a/step-{step:08d}/"
        remote = objects(prefix)
        assert {name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in remote.items()} == local
        puts = [e["key"] for e in log if e["event"] == "s3_put" and e["step"] == step]
        assert puts[-1] == prefix + "COMPLETE" and sorted(puts) == sorted(prefix + n for n in local), puts
        assert json.loads(remote["COMPLETE"])["step"] == step
        head = client().head_object(Bucket=BUCKET, Key=prefix + ".metadata", ChecksumMode="ENABLED")
        assert head["Metadata"]["sha256"] == local[".metadata"][1]
    # The copy is a checkpoint: brought back as a folder it passes the checkpointer's own check.
    back = tmp_path / "back" / "step-00000003"
    back.mkdir(parents=True)
    for name, data in objects("runs/a/step-00000003/").items():
        (back / name).write_bytes(data)
    assert verify(str(back)) is None


def test_an_object_changed_between_upload_and_verification_leaves_no_complete_and_the_local_checkpoint(s3, tmp_path):
    hook, ckpt = tmp_path / "hook", tmp_path / "ckpt"
    hook.mkdir()
    release = hook / "hold-export-step-2"
    release.touch()
    proc = launch(tmp_path, run_overrides(2, f"s3://{BUCKET}/runs/b"), hook)
    wait_for((hook / "held-export-step-2").exists, proc, LAUNCH_TIMEOUT_S, "the final export held")
    # Same size, other bytes, and the original's sha256 metadata: only S3's own checksum can tell.
    key = "runs/b/step-00000002/.metadata"
    s3c = client()
    original = s3c.get_object(Bucket=BUCKET, Key=key)
    body = bytearray(original["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3c.put_object(Bucket=BUCKET, Key=key, Body=bytes(body), Metadata=original["Metadata"])
    release.unlink()
    out = finish(proc)
    assert proc.returncode == 0, out[-4000:]

    warnings = [line for line in out.splitlines() if "warning: export of" in line]
    assert len(warnings) == 1 and ".metadata" in warnings[0] and "the local checkpoint is kept" in warnings[0], out
    assert "COMPLETE" not in objects("runs/b/step-00000002/")
    assert "COMPLETE" in objects("runs/b/step-00000001/"), "the step before verified and is complete"
    assert (ckpt / "step-00000002").is_dir() and verify(str(ckpt / "step-00000002")) is None
    assert ("pruned", 2) not in [(e["event"], e["step"]) for e in events(hook)]


def test_a_file_uploaded_in_parts_verifies_and_one_changed_behind_it_does_not(s3, tmp_path):
    folder = tmp_path / "step-00000007"
    folder.mkdir()
    part = 5 * 2**20  # S3's smallest part
    (folder / "__0_0.distcp").write_bytes(os.urandom(2 * part + 12345))
    (folder / "COMPLETE").write_text("{}")
    copy = StepCopy(client(), BUCKET, "parts", str(folder), part=part)
    copy.compute()
    assert copy.digests["__0_0.distcp"].parts == 3
    copy.upload("__0_0.distcp")
    assert copy.problem(["__0_0.distcp"], copy.listed(), complete=False) is None
    head = client().head_object(Bucket=BUCKET, Key="parts/step-00000007/__0_0.distcp", ChecksumMode="ENABLED")
    expected = digest(str(folder / "__0_0.distcp"), part).checksum
    assert expected.endswith("-3") and head["ChecksumSHA256"] in (expected, expected.split("-")[0])

    client().put_object(Bucket=BUCKET, Key="parts/step-00000007/__0_0.distcp", Body=b"x" * (2 * part + 12345))
    problem = copy.problem(["__0_0.distcp"], copy.listed(), complete=False)
    assert problem is not None and problem.startswith("__0_0.distcp: no SHA-256 reported"), problem
    client().put_object(Bucket=BUCKET, Key="parts/step-00000007/stray", Body=b"")
    assert "1 objects that are not files of the checkpoint (first: stray)" in (
        copy.problem(["__0_0.distcp"], copy.listed(), complete=False) or ""
    )


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"s3_uri": "s3:/bucket"}, "checkpoint.s3_uri"),
        ({"s3_uri": "s3://B"}, "checkpoint.s3_uri"),
        ({"prune_after_export": True, "dir": "/ckpt"}, "checkpoint.prune_after_export"),
        ({"prune_after_export": True, "s3_uri": "s3://bucket/p"}, "checkpoint.prune_after_export"),
    ],
)
def test_a_bad_s3_setting_is_refused_naming_its_key(fields, key):
    with pytest.raises(ConfigError) as err:
        CheckpointConfig(**fields)
    assert err.value.key == key
    assert CheckpointConfig(dir="/ckpt", s3_uri="s3://my.bucket-1/some/prefix", prune_after_export=True).s3_uri
