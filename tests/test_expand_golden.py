"""Golden run overlays: tests/data/matrix-golden.yaml renders byte for byte to tests/golden/expand/runs/,
and every golden overlay builds with the real kustomize into the PyTorchJob the run asked for.

Regenerate after an intended change: UPDATE_GOLDEN=1 python -m pytest tests/test_expand_golden.py
(and review the diff of tests/golden/ like any other change).
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators.core import outdir, writer
from generators.core.gotools import tool
from generators.matrix import expand, load
from generators.plan import plan
from generators.render import layout_for, render

MATRIX = REPO_ROOT / "tests" / "data" / "matrix-golden.yaml"
GOLDEN = REPO_ROOT / "tests" / "golden" / "expand"
LABEL = "tests/data/matrix-golden.yaml"


def expected_files() -> dict[str, bytes]:
    m = load(str(MATRIX))
    files = render(plan(m, expand(m)), layout_for(GOLDEN, REPO_ROOT))
    # Only the run overlays: the per-cluster files have their own renderer and tests.
    return writer.serialize({k: v for k, v in files.items() if k.startswith("runs/")}, LABEL)


def test_golden_overlays_match():
    expected = expected_files()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        outdir.write(GOLDEN, expected, generator=writer.GENERATOR, banner=writer.banner_prefix().encode())
    changes = outdir.compare(GOLDEN, expected, generator=writer.GENERATOR, banner=writer.banner_prefix().encode())
    assert not changes.all(), (
        f"golden overlays differ: {changes.all()}; if the change is intended run: "
        "UPDATE_GOLDEN=1 python -m pytest tests/test_expand_golden.py"
    )
    assert len(expected) == 4 * 4  # kustomization, patch, train.yaml, rbac.yaml per run


@functools.cache
def _build_text(overlay: Path) -> str:
    out = subprocess.run([tool("kustomize"), "build", str(overlay)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def build(overlay: Path) -> list[dict]:
    return list(yaml.safe_load_all(_build_text(overlay)))


def golden_runs() -> list[Path]:
    runs = sorted(p.parent for p in GOLDEN.glob("runs/*/*/kustomization.yaml"))
    assert len(runs) == 4, "golden overlays missing; run UPDATE_GOLDEN=1 python -m pytest tests/test_expand_golden.py"
    return runs


def job_and_config(overlay: Path) -> tuple[dict, dict, dict]:
    docs = build(overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "PyTorchJob", "Role", "RoleBinding", "ServiceAccount"]
    job = next(d for d in docs if d["kind"] == "PyTorchJob")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    return job, cm, yaml.safe_load(cm["data"]["train.yaml"])


def container(job: dict) -> dict:
    (c,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    return c


def flags(command: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in command if arg.startswith("--") and "=" in arg)


@pytest.mark.gotools
def test_every_golden_overlay_builds_into_the_run_it_describes():
    for overlay in golden_runs():
        name, cluster = overlay.name, overlay.parent.name
        job, cm, cfg = job_and_config(overlay)
        worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
        pod = worker["template"]["spec"]
        c = container(job)
        f = flags(c["command"])
        assert job["metadata"]["name"] == name and cm["metadata"]["name"] == f"{name}-config"
        assert (
            job["metadata"]["namespace"]
            == cm["metadata"]["namespace"]
            == ("golden" if cluster == "golden-p4" else "fsdp")
        )
        assert worker["template"]["metadata"]["labels"]["fsdp-gitops/run"] == name
        assert worker["replicas"] == int(f["nnodes"])
        gpus = c["resources"]["limits"]["nvidia.com/gpu"]
        assert int(f["nproc_per_node"]) == gpus == int(job["spec"]["nprocPerNode"])
        # Devices: requests equal limits; CPU and memory: requests only (the node's share, no cap).
        assert {k: v for k, v in c["resources"]["requests"].items() if "/" in k} == c["resources"]["limits"]
        assert set(c["resources"]["requests"]) - set(c["resources"]["limits"]) == {"cpu", "memory"}
        assert f["rdzv-id"] == name
        # torchrun through trainer.launch, with restarts that resume from the checkpoints.
        assert c["command"][:3] == ["python", "-m", "trainer.launch"] and int(f["max-restarts"]) > 0
        assert c["command"][-4:] == ["-m", "trainer.train", "--config", "/etc/fsdp/train.yaml"]
        grace = pod["terminationGracePeriodSeconds"]
        assert grace > int({e["name"]: e.get("value") for e in c["env"]}["FSDP_TERM_GRACE_S"]) > 0
        assert c["image"].endswith(":0.1.0") and c["securityContext"]["privileged"] is False
        assert pod["volumes"][1]["configMap"]["name"] == f"{name}-config"
        assert cfg["checkpoint"]["dir"] == f"/shared/checkpoints/{name}"
        assert cfg["metrics"]["output_dir"] == f"/shared/runs/{name}"
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["HF_TOKEN_FILE"] == "/etc/hf-token/token"
        assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"]) == ("efa", "1")
        # The pods' ServiceAccount may only patch the run's own pods (progress annotations).
        docs = {d["kind"]: d for d in build(overlay)}
        assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"] == name
        (rule,) = docs["Role"]["rules"]
        assert rule == {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["patch"],
            "resourceNames": [f"{name}-worker-{i}" for i in range(worker["replicas"])],
        }
        assert docs["RoleBinding"]["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": job["metadata"]["namespace"]}
        ]
        assert docs["RoleBinding"]["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
        assert env["FSDP_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # turns progress on


@pytest.mark.gotools
def test_golden_overlays_carry_each_branch():
    by_model = {}
    for overlay in golden_runs():
        job, _, cfg = job_and_config(overlay)
        by_model[cfg["model"]["name"]] = (job, cfg)

    job, cfg = by_model["llama2-7b"]
    c = container(job)
    f = flags(c["command"])
    assert (f["rdzv-backend"], f["rdzv-endpoint"]) == ("c10d", f"{job['metadata']['name']}-worker-0:29400")
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32}
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p5.48xlarge"
    }
    assert [p["name"] for p in c["ports"]] == ["c10d", "metrics"]

    job, cfg = by_model["llama3.1-8b"]
    c = container(job)
    f = flags(c["command"])
    assert (f["rdzv-backend"], f["rdzv-endpoint"], f["rdzv-conf"]) == (
        "etcd",
        "etcd.fsdp-system.svc.cluster.local:2379",
        "timeout=1800",
    )
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == 16
    assert cfg["parallelism"] == {**cfg["parallelism"], "sharding_strategy": "HYBRID_SHARD", "shard_group_size": 16}

    job, cfg = by_model["tiny"]
    c = container(job)
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 2, "vpc.amazonaws.com/efa": 1}
    assert [p["name"] for p in c["ports"]] == ["c10d"]  # prometheus_port 0: no metrics port
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["volumes"][0] == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    assert cfg["model"]["path"] == ""

    job, cfg = by_model["llama2-13b"]
    assert job["metadata"]["name"].startswith("grad-op-baseline-")
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert cfg["parallelism"]["sharding_strategy"] == "SHARD_GRAD_OP"


@pytest.mark.gotools
def test_golden_pytorchjobs_pass_the_pytorchjob_schema():
    crds = Path(os.environ.get("FSDP_GITOPS_CRD_SCHEMAS", REPO_ROOT.parent / "shared" / "schemas" / "crds"))
    schema = crds / "kubeflow.org" / "pytorchjob_v1.json"
    assert schema.is_file(), f"PyTorchJob schema missing at {schema}; set FSDP_GITOPS_CRD_SCHEMAS"
    docs = "---\n".join(
        yaml.safe_dump(d) for overlay in golden_runs() for d in build(overlay) if d["kind"] == "PyTorchJob"
    )
    cmd = [
        tool("kubeconform"),
        "-strict",
        "-summary",
        "-schema-location",
        str(crds) + "/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json",
        "-",
    ]
    out = subprocess.run(cmd, input=docs, capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"{shlex.join(cmd)}\n{out.stdout}{out.stderr}"
    assert "Valid: 4, Invalid: 0, Errors: 0, Skipped: 0" in out.stdout


@pytest.mark.gotools
def test_a_reordered_base_fails_the_build_instead_of_patching_the_wrong_volume(tmp_path):
    # The run patch tests list positions in base/pytorchjob; a base with swapped volumes must not build.
    base = tmp_path / "base" / "pytorchjob"
    base.mkdir(parents=True)
    (base / "kustomization.yaml").write_text((REPO_ROOT / "base/pytorchjob/kustomization.yaml").read_text())
    job = yaml.safe_load((REPO_ROOT / "base/pytorchjob/pytorchjob.yaml").read_text())
    volumes = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
    volumes[0], volumes[1] = volumes[1], volumes[0]
    (base / "pytorchjob.yaml").write_text(yaml.safe_dump(job))
    overlay = golden_runs()[0]
    copy = tmp_path / "runs" / "c" / overlay.name
    copy.mkdir(parents=True)
    for f in overlay.iterdir():
        (copy / f.name).write_text(
            f.read_text().replace("../../../../../../base/pytorchjob", "../../../base/pytorchjob")
        )
    out = subprocess.run([tool("kustomize"), "build", str(copy)], capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "test" in out.stderr.lower()
