"""python -m trainer.launch under both job APIs: the rendezvous from the environment each one injects.

Kubeflow Trainer v2's torch plugin sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR
and PET_MASTER_PORT; the Training Operator sets PET_NNODES and PET_NPROC_PER_NODE and names the pod
<job>-worker-<index> (its HOSTNAME). A command that leaves the rendezvous out still trains: two real
launcher processes ("nodes") with only the Trainer's variables rendezvous over c10d and train the tiny
config together; with only the operator's variables the launcher looks for worker 0 of the pod's job.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO_ROOT
from trainer_support import LAUNCH_TIMEOUT_S, TINY, finish, free_port, read_metrics, trainer_env

from trainer.rendezvous_env import fill

TRAINER_ARGS = ["-m", "trainer.train", "--config", "/etc/fsdp/train.yaml"]


def test_trainjob_env_gives_the_endpoint_the_id_and_the_store_host() -> None:
    env = {"PET_MASTER_ADDR": "run-a-node-0-0.run-a", "PET_MASTER_PORT": "29500", "PET_NODE_RANK": "0"}
    assert fill(["--rdzv-backend=c10d", *TRAINER_ARGS], env) == [
        "--rdzv-endpoint=run-a-node-0-0.run-a:29500",
        "--rdzv-id=run-a",
        "--rdzv-conf=is_host=true",
        "--rdzv-backend=c10d",
        *TRAINER_ARGS,
    ]
    # Node 1 connects; a join timeout the command gives is kept.
    out = fill(
        ["--rdzv-backend", "c10d", "--rdzv-conf=join_timeout=1800", *TRAINER_ARGS], {**env, "PET_NODE_RANK": "1"}
    )
    assert "--rdzv-conf=join_timeout=1800,is_host=false" in out
    assert out.count("--rdzv-conf=join_timeout=1800") == 0 and out[-len(TRAINER_ARGS) :] == TRAINER_ARGS


def test_operator_env_points_at_worker_0_of_the_pods_job() -> None:
    env = {"HOSTNAME": "llama-p5-n2-abc123-worker-1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "8"}
    out = fill(["--rdzv-backend=c10d", "--rdzv-id=given", *TRAINER_ARGS], env)
    assert out[:2] == ["--rdzv-endpoint=llama-p5-n2-abc123-worker-0:29400", "--rdzv-conf=is_host=false"]
    assert "--rdzv-id=given" in out and not any(a.startswith("--rdzv-id=llama") for a in out)
    assert "--rdzv-conf=is_host=true" in fill(["--rdzv-backend=c10d"], {"HOSTNAME": "job-worker-0"})


@pytest.mark.parametrize(
    "argv, env",
    [
        # The generated commands name their endpoint: unchanged under either API.
        (["--rdzv-backend=c10d", "--rdzv-endpoint=x-worker-0:29400", *TRAINER_ARGS], {"PET_MASTER_ADDR": "y"}),
        # etcd and static rendezvous take nothing from here (torchrun reads PET_MASTER_* for static itself).
        (["--rdzv-backend=etcd", *TRAINER_ARGS], {"PET_MASTER_ADDR": "y"}),
        ([*TRAINER_ARGS], {"PET_MASTER_ADDR": "y", "PET_NODE_RANK": "0"}),
        # Neither API: nothing to go by.
        (["--rdzv-backend=c10d", *TRAINER_ARGS], {"HOSTNAME": "laptop"}),
        # Flags after the module are the trainer's, not torchrun's.
        (["--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "-m", "x", "--rdzv-conf=a"], {"PET_MASTER_ADDR": "y"}),
    ],
)
def test_what_names_its_rendezvous_or_is_not_c10d_is_unchanged(argv: list[str], env: dict[str, str]) -> None:
    assert fill(argv, env) == argv


def launcher(tmp_path: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    log = (tmp_path / f"{name}.log").open("w")
    cmd = [
        sys.executable,
        "-m",
        "trainer.launch",
        "--rdzv-backend=c10d",
        "-m",
        "trainer.train",
        "--config",
        str(TINY),
        "training.max_steps=3",
        "checkpoint.dir=",
        "checkpoint.export_dir=",
        f"metrics.output_dir={tmp_path / name / 'metrics'}",
    ]
    return subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=trainer_env(**env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


@pytest.mark.slow
def test_two_nodes_with_only_the_trainjob_env_train_together(tmp_path: Path) -> None:
    port = free_port()
    # What the torch plugin injects for a 2-node TrainJob with one process per node, with node 0's
    # address on loopback (both "nodes" are on this machine).
    pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
    # Node 1 first: it waits for node 0's store at PET_MASTER_ADDR:PET_MASTER_PORT, which only the
    # environment names.
    n1 = launcher(tmp_path, "n1", {**pet, "PET_NODE_RANK": "1", "FSDP_RDZV_WAIT_S": "300"})
    wait_for_line(tmp_path / "n1.log", f"waiting for the rendezvous store at 127.0.0.1:{port}", n1)
    n0 = launcher(tmp_path, "n0", {**pet, "PET_NODE_RANK": "0"})
    for name, proc in (("n0", n0), ("n1", n1)):
        finish(proc, LAUNCH_TIMEOUT_S)
        log = (tmp_path / f"{name}.log").read_text()
        assert proc.returncode == 0, f"{name} exit {proc.returncode}:\n{log[-4000:]}"
    writer = next(tmp_path / n for n in ("n0", "n1") if (tmp_path / n / "metrics").is_dir())
    records = read_metrics(writer)
    assert [r["step"] for r in records] == [1, 2, 3] and records[-1]["world_size"] == 2


@pytest.mark.slow
def test_with_only_the_operator_env_the_launcher_waits_for_worker_0_of_its_job(tmp_path: Path) -> None:
    env = trainer_env(HOSTNAME="fsdp-op-test-worker-1", PET_NNODES="2", PET_NPROC_PER_NODE="1", FSDP_RDZV_WAIT_S="1")
    done = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--rdzv-backend=c10d", "-m", "trainer.train", "--config", str(TINY)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--rdzv-endpoint fsdp-op-test-worker-0:29400" in errors[0], done.stderr
