"""The generated deployment on real pods (tools/cluster/realpods.py): one tiny run, end to end and
under faults, in the trainer test image (tools/cluster/image/).

The level: two p4de-shaped GPU nodes (the pre-flight Job needs two nodes) and one CPU node, with the
real Kueue and Training Operator. The repository is copied into the cluster's work folder and its
matrix replaced by a test matrix: one cluster (fsdp-p4de as matrix.yaml has it) and one run, the tiny
random-init model, 2 nodes x 1 GPU, a few steps with a checkpoint every two; the real generator
expands it. In that copy kustomize's `images:` points the trainer and the busybox images at the
imported test images, and nothing else changes, except that the data staging Job reads its dataset
from a folder the test puts on the shared volume (no hub here) instead of knkarthick/samsum.

The manifests are applied in the order Flux's dependsOn chain gives them (configs, shared-storage,
data, the run), by kubectl; Flux itself reconciles on the kwok levels (test_cluster_flux.py).

Every run is checked by `wait_run`, which fails with what stopped the run (a pod that cannot be
scheduled, an init container still waiting, a container's exit code and the end of its log, a
mount the trainer's user cannot read or write), so each mutation test asserts on that message.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from realpods_support import (
    CLUSTER,
    INTERVAL,
    JOB_LABEL,
    MAX_RETRIES,
    METRICS_PORT,
    NS,
    SHARED_LEVEL,
    STEPS,
    TRAINER_UID,
    Deployment,
    admitted,
    apply_in_namespaces,
    assert_trained,
    check_access,
    copy_repository,
    is_preflight_job,
    job_state,
    metrics,
    pod_problems,
    set_images,
    small_matrix,
    stage_storage_and_data,
    wait_job,
    wait_run,
)
from support import REPO_ROOT

from tools.cluster import dryrun, scrape
from tools.cluster.cluster import Cluster
from tools.cluster.steps.prometheus import Prometheus

pytestmark = [pytest.mark.realpods, pytest.mark.cluster, pytest.mark.slow]

REALPODS_OPTIONS = SHARED_LEVEL
MONITORS = ("podmonitors.monitoring.coreos.com", "servicemonitors.monitoring.coreos.com")
KILL_RUN_STEPS = 40  # the SIGKILL test's run: long enough that the kill lands far from its end
WRONG_PORT = "http-metrics"  # a port name no container of the run declares (the mutation of the scrape test)


def apply_run(d: Deployment, mutate: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Apply the run's manifests (the PyTorchJob changed by `mutate`, if given), after removing the
    previous attempt's job, checkpoints, metrics and attempt counts."""
    d.cluster.kubectl("delete", "pytorchjob", "-n", NS, d.run, "--ignore-not-found", "--wait=true")
    d.cluster.wait_for(
        lambda: not d.cluster.get("pods", NS, selector=f"{JOB_LABEL}={d.run}")["items"], 120, "old pods gone"
    )
    for sub in ("checkpoints", "runs"):
        shutil.rmtree(d.volume / sub / d.run, ignore_errors=True)
    docs = d.job()
    job = next(x for x in docs if x["kind"] == "PyTorchJob")
    if mutate:
        mutate(job)
    d.cluster.apply(docs)
    return job


@pytest.fixture(scope="module")
def deployment(pods: Cluster) -> Iterator[Deployment]:
    started = time.monotonic()
    setup: dict[str, float] = {}
    repo = pods.work / "repo"
    copy_repository(repo)
    (repo / "matrix.yaml").write_text(yaml.safe_dump(small_matrix(), sort_keys=False))
    res = subprocess.run(
        [sys.executable, "generators/expand.py", "matrix.yaml"], cwd=repo, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    (run,) = [p.name for p in (repo / "overlays" / "runs" / CLUSTER).iterdir() if p.is_dir()]
    trainer, utility = pods.level.images[2].name, pods.level.images[1].name
    infra = repo / "overlays" / "infrastructure" / CLUSTER
    for folder in [infra / "configs", infra / "storage", infra / "data", repo / "overlays" / "runs" / CLUSTER / run]:
        set_images(folder, trainer, utility)
    configs = dryrun.render(repo, f"overlays/infrastructure/{CLUSTER}/configs")
    (pvc,) = [x for x in configs if x["kind"] == "PersistentVolumeClaim"]
    volume = pods.level.shared_volume(pvc)
    d = Deployment(pods, repo, volume, run, setup, (volume.stat().st_uid, volume.stat().st_mode & 0o7777))
    stage_storage_and_data(d, configs, started)
    yield d


@pytest.fixture(scope="module")
def prometheus(deployment: Deployment) -> Iterator[Prometheus]:
    """A real Prometheus in the level's namespaces, scraping every second with the scrape configuration
    prometheus-operator generates from the PodMonitors and ServiceMonitors the configs overlay applied
    (read back from the API server), plus one mutant: the trainer's PodMonitor with a port name no
    container declares. Service discovery through the harness kubeconfig, as the operator's in-cluster
    config would; nothing static."""
    d = deployment
    monitors = [m for kind in MONITORS for m in d.cluster.get(kind)["items"]]
    (trainer,) = [m for m in monitors if m["kind"] == "PodMonitor"]
    wrong = copy.deepcopy(trainer)
    wrong["metadata"]["name"] += "-wrong-port"
    wrong["spec"]["podMetricsEndpoints"][0]["port"] = WRONG_PORT
    configs = scrape.scrape_configs([*monitors, wrong], interval="1s", kubeconfig=d.cluster.kubeconfig)
    assert not any("static_configs" in c for c in configs)
    started = time.monotonic()
    prom: Prometheus = d.cluster.addons["prometheus"]  # the level option `prometheus`
    prom.scrape(configs, interval="1s")
    d.setup_s["prometheus scraping"] = time.monotonic() - started
    yield prom


def train_longer(steps: int, *overrides: str) -> Callable[[dict[str, Any]], None]:
    """A PyTorchJob mutation: the run's config with `steps` steps and `overrides` (trainer config keys)."""

    def mutate(job: dict[str, Any]) -> None:
        _spec(job)["containers"][0]["command"] += [f"training.max_steps={steps}", *overrides]

    return mutate


def test_the_shared_volume_comes_up_root_owned_and_the_storage_job_hands_it_over(deployment: Deployment) -> None:
    assert deployment.root == (0, 0o755)
    for sub in ("data", "checkpoints", "runs"):
        assert (deployment.volume / sub).stat().st_uid == TRAINER_UID, sub


def test_the_staging_job_writes_the_dataset_and_its_marker_as_the_trainer_user(deployment: Deployment) -> None:
    marker = deployment.volume / "data" / "samsum" / "_COMPLETE"
    assert marker.is_file(), sorted(p.name for p in marker.parent.iterdir())
    assert marker.stat().st_uid == TRAINER_UID
    assert (deployment.volume / "data" / "samsum" / "train.jsonl").stat().st_size > 0


def test_the_tiny_run_trains_to_succeeded_under_kueue(deployment: Deployment) -> None:
    d = deployment
    started = time.monotonic()
    apply_run(d)
    d.cluster.wait_for(lambda: admitted(d), 180, "Kueue admits the run's Workload")
    d.cluster.wait_for(lambda: metrics(d), 300, "the first step")
    check_access(d, f"{d.run}-worker-1")
    wait_run(d)
    d.setup_s["tiny run"] = time.monotonic() - started
    assert_trained(d)


def test_the_status_command_lists_the_trained_run_from_the_trainers_annotations(deployment: Deployment) -> None:
    """`python generators/status.py` (run where the API server listens) on the run the test above trained:
    Succeeded, with the step, ETA and checkpoint the real trainer wrote on worker 0's pod."""
    d = deployment
    assert job_state(d.cluster, d.run) == "Succeeded", "the tiny run's test above left no succeeded run"
    command = [sys.executable, "generators/status.py", "--kubeconfig", str(d.cluster.kubeconfig), "--namespace", NS]
    netns = ["nsenter", "-t", str(d.cluster.holder), "-n"]
    res = subprocess.run([*netns, *command, "--format", "json"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (row,) = [r for r in json.loads(res.stdout) if r["run"] == d.run]
    assert (row["api"], row["phase"], row["step"], row["total_steps"], row["eta"]) == (
        "PyTorchJob",
        "Succeeded",
        STEPS,
        STEPS,
        "done",
    ), row
    assert row["tokens_per_second"] > 0 and row["restarts"] == 0, row
    assert row["checkpoint"] is not None and 0 < row["checkpoint"] <= STEPS and row["checkpoint"] % INTERVAL == 0, row
    res = subprocess.run([*netns, *command], cwd=REPO_ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    (line,) = [line.split() for line in res.stdout.splitlines() if d.run in line.split()]
    assert line[:5] == [NS, d.run, "PyTorchJob", "Succeeded", f"{STEPS}/{STEPS}"], res.stdout


def test_a_real_prometheus_discovers_and_scrapes_the_run_pods_with_the_run_labels(
    deployment: Deployment, prometheus: Prometheus
) -> None:
    """The PodMonitor's scrape configuration finds both pods of a training run through the API server,
    scrapes their metrics port, and the trainer's series carry the run's labels (run from the Training
    Operator's job-name pod label, node, namespace, pod, job from jobLabel). The mutant PodMonitor,
    whose port name matches no container port, sees the same pods and keeps no target."""
    d, prom = deployment, prometheus
    pool, wrong_pool = "podMonitor/monitoring/fsdp-trainer/0", "podMonitor/monitoring/fsdp-trainer-wrong-port/0"
    pods = [f"{d.run}-worker-{i}" for i in range(2)]
    started = time.monotonic()
    apply_run(d, train_longer(100_000, "checkpoint.interval_steps=100000"))  # trains until deleted
    try:
        d.cluster.wait_for(lambda: metrics(d), 300, "the first step")
        first_step = time.monotonic()
        series = d.cluster.wait_for(
            lambda: prom.query(f'fsdp_step{{run="{d.run}"}}'), 120, "Prometheus scraping the run's fsdp_step"
        )
        first_scrape = time.monotonic()
        d.cluster.wait_for(
            lambda: len(prom.query(f'up{{run="{d.run}"}} == 1')) == 2, 60, "both pods' targets up in Prometheus"
        )
        d.setup_s["first step"] = first_step - started
        d.setup_s["first scrape after the first step"] = first_scrape - first_step
        print(f"scrape timings (s): {d.setup_s}")

        # Discovered from the pods (Kubernetes service discovery, role pod), one target per pod.
        targets = prom.targets()
        active = [t for t in targets["activeTargets"] if t["scrapePool"] == pool]
        assert sorted(t["labels"]["pod"] for t in active) == pods, [t["labels"] for t in active]
        for t in active:
            pod = d.cluster.get("pod", NS, name=t["labels"]["pod"])
            found = t["discoveredLabels"]
            assert found["__meta_kubernetes_pod_name"] == pod["metadata"]["name"], found
            assert found["__meta_kubernetes_pod_ip"] == pod["status"]["podIP"], found
            assert found["__meta_kubernetes_pod_container_port_name"] == "metrics", found
            assert t["scrapeUrl"] == f"http://{pod['status']['podIP']}:{METRICS_PORT}/metrics", t["scrapeUrl"]
            assert t["health"] == "up", t
            assert t["labels"] == {
                "container": "pytorch",
                "endpoint": "metrics",
                "instance": f"{pod['status']['podIP']}:{METRICS_PORT}",
                "job": "fsdp-trainer",
                "namespace": NS,
                "node": pod["spec"]["nodeName"],
                "pod": pod["metadata"]["name"],
                "run": d.run,
            }, t["labels"]

        # The training series with the run's labels: the job's figures once (the pod of global rank 0),
        # each node's own from every pod.
        (step,) = series
        assert step["metric"]["pod"] in pods and step["metric"]["namespace"] == NS, step["metric"]
        assert 1 <= float(step["value"][1]) <= max(r["step"] for r in metrics(d)), (step, metrics(d)[-1])
        for name in ("fsdp_tokens_per_second", "fsdp_tokens_total", "fsdp_mfu_ratio", "fsdp_loss"):
            (found,) = prom.query(f'{name}{{run="{d.run}", namespace="{NS}", job="fsdp-trainer"}}')
            assert found["metric"]["pod"] == step["metric"]["pod"], (name, found["metric"])
        assert float(prom.query(f'fsdp_tokens_per_second{{run="{d.run}"}}')[0]["value"][1]) > 0
        ranks = prom.query(f'fsdp_node_ranks{{run="{d.run}"}}')
        assert sorted(r["metric"]["pod"] for r in ranks) == pods, ranks

        # The mutation: a port name no container declares keeps none of the pods it discovers.
        assert not [t for t in targets["activeTargets"] if t["scrapePool"] == wrong_pool], (
            f"a PodMonitor whose port name ({WRONG_PORT}) matches no container port must yield no target"
        )
        dropped = {
            t["discoveredLabels"].get("__meta_kubernetes_pod_name")
            for t in targets["droppedTargets"]
            if (t.get("scrapePool") or t["discoveredLabels"].get("job")) == wrong_pool
        }
        assert set(pods) <= dropped, (
            f"the mutant PodMonitor (port {WRONG_PORT}) should discover the run's pods and drop them: {sorted(dropped)}"
        )
    finally:
        d.cluster.kubectl("delete", "pytorchjob", "-n", NS, d.run, "--ignore-not-found", "--wait=false")


def test_deleting_worker_0_checkpoints_within_the_grace_period_and_resumes(deployment: Deployment) -> None:
    d = deployment
    apply_run(d, train_longer(KILL_RUN_STEPS))  # long enough that the delete lands mid-run
    d.cluster.wait_for(lambda: len(metrics(d)) >= 2, 300, "two steps")
    pod = f"{d.run}-worker-0"
    uid = d.cluster.get("pod", NS, name=pod)["metadata"]["uid"]
    d.cluster.kubectl("delete", "pod", "-n", NS, pod, "--wait=false")
    exit_code = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the deleted pod's last status, before the API server drops it
        res = d.cluster.kubectl_result("get", "pod", "-n", NS, pod, "-o", "json")
        if res.returncode != 0 or json.loads(res.stdout)["metadata"]["uid"] != uid:
            break
        for cs in json.loads(res.stdout)["status"].get("containerStatuses", []):
            if cs["name"] == "pytorch" and "terminated" in cs.get("state", {}):
                exit_code = cs["state"]["terminated"]["exitCode"]
        time.sleep(0.3)
    stopped_at = max(r["step"] for r in metrics(d))
    wait_run(d)
    steps = [r["step"] for r in metrics(d)]
    assert exit_code in (None, 143), exit_code  # None: the pod was gone before a poll saw its status
    assert d.cluster.get("pod", NS, name=pod)["metadata"]["uid"] != uid  # the operator re-created it
    # Resumed from the checkpoint written on SIGTERM at the step it had reached: every step once, none
    # redone (a resume from the interval checkpoint before it would log steps again), none lost.
    assert steps == list(range(1, KILL_RUN_STEPS + 1)), (steps, stopped_at)
    assert stopped_at < KILL_RUN_STEPS


def test_sigkill_of_a_trainer_container_restarts_from_the_last_interval_checkpoint(deployment: Deployment) -> None:
    """The kill lands mid-run: the run is long (KILL_RUN_STEPS), worker 1's trainer process is found
    before the first checkpoint and killed as soon as a step past it is logged, far from the end."""
    d = deployment
    pod = f"{d.run}-worker-1"
    apply_run(d, train_longer(KILL_RUN_STEPS))
    pid = d.cluster.wait_for(lambda: _container_pid_or_none(pod), 300, f"the trainer process of {pod}")
    uid = d.cluster.get("pod", NS, name=pod)["metadata"]["uid"]
    deadline = time.monotonic() + 300
    while len(metrics(d)) < INTERVAL + 1:  # polled faster than wait_for, so the kill is close to the step
        assert job_state(d.cluster, d.run) not in ("Succeeded", "Failed"), pod_problems(
            d.cluster, f"{JOB_LABEL}={d.run}"
        )
        assert time.monotonic() < deadline, "no step past the first checkpoint within 300 s"
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    killed_at = max(r["step"] for r in metrics(d))
    assert killed_at < KILL_RUN_STEPS - INTERVAL, (
        f"the run reached step {killed_at} of {KILL_RUN_STEPS} before the kill: too close to its end to see a restart"
    )
    wait_run(d)
    # The restart: restartPolicy ExitCode makes the pod's own policy Never, so the retry of exit 137 is a
    # pod the operator re-creates (a new uid), and trainer.launch counts a second start of the replica.
    assert d.cluster.get("pod", NS, name=pod)["metadata"]["uid"] != uid, f"{pod} was not re-created after SIGKILL"
    attempts = sorted(p.name for p in (d.volume / "runs" / d.run / "attempts" / pod).iterdir())
    assert len(attempts) >= 2, f"{pod} started {len(attempts)} time(s) (a restart after SIGKILL makes 2): {attempts}"
    steps = [r["step"] for r in metrics(d)]
    # Resumed from the newest complete interval checkpoint: the one at or before the step reached, or,
    # when the kill landed while that save was still being written in the background (asynchronous
    # saves), the one before it. Never older, never a step past the kill.
    last_interval = (killed_at // INTERVAL) * INTERVAL
    restart = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), None)
    if restart is None:  # no step logged twice: the kill came right at a checkpoint step, resumed after it
        assert killed_at == last_interval and steps == list(range(1, KILL_RUN_STEPS + 1)), (
            f"no step logged again after the SIGKILL at step {killed_at}, which is not a checkpoint step: {steps}"
        )
    else:
        assert steps[restart] - 1 in (last_interval, last_interval - INTERVAL), (steps, killed_at)
    assert set(steps) == set(range(1, KILL_RUN_STEPS + 1))


def test_a_retryable_failure_that_repeats_ends_after_max_retries(deployment: Deployment) -> None:
    """SIGKILL (exit 137, which the operator restarts) at every start of worker 1: trainer.launch counts
    the starts on the shared volume; the first start and MAX_RETRIES restarts are killed, and the start
    after them fails the job."""
    d = deployment
    apply_run(d, train_longer(KILL_RUN_STEPS))  # a start that escaped its kill would train a while
    pod = f"{d.run}-worker-1"
    folder = d.volume / "runs" / d.run / "attempts" / pod
    killed: set[int] = set()
    deadline = time.monotonic() + 600
    while job_state(d.cluster, d.run) not in ("Failed", "Succeeded") and time.monotonic() < deadline:
        pid = _container_pid_or_none(pod)
        # Killed only once this start recorded its attempt (a kill before it would not count, on a busy
        # machine the interpreter's imports can take seconds), so every kill is one counted start.
        started = len(list(folder.glob("attempt-*"))) if folder.is_dir() else 0
        if pid is not None and pid not in killed and len(killed) < MAX_RETRIES + 1 and started > len(killed):
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.3)
    assert job_state(d.cluster, d.run) == "Failed", (
        f"killed {len(killed)} start(s): {pod_problems(d.cluster, f'{JOB_LABEL}={d.run}')}"
    )
    attempts = sorted(p.name for p in folder.iterdir())
    assert len(attempts) == MAX_RETRIES + 2, attempts
    assert len(killed) == MAX_RETRIES + 1, killed


def _container_pid(pod: str) -> int:
    """The host pid of the trainer container's first process (trainer.launch) in `pod`."""
    pid = _container_pid_or_none(pod)
    if pid is None:
        raise AssertionError(f"no trainer.launch process of {pod}")
    return pid


def _container_pid_or_none(pod: str) -> int | None:
    return _pid_in_pod(pod, lambda cmd, env: b"trainer.launch" in cmd)


def _pid_in_pod(pod: str, wanted: Callable[[list[bytes], list[bytes]], bool]) -> int | None:
    """The host pid of the first process of `pod`'s trainer container for which `wanted(cmdline, environ)`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FSDP_POD_NAME={pod}".encode() in env and wanted(cmd, env):
            return int(entry.name)
    return None


def test_a_config_error_fails_the_job_without_restarts(deployment: Deployment) -> None:
    d = deployment

    def bad_config(job: dict[str, Any]) -> None:
        cmd = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
        cmd += ["training.max_steps=-1"]

    apply_run(d, bad_config)
    with pytest.raises(AssertionError) as failed:
        wait_run(d)
    assert "Failed" in str(failed.value) and "exit 2" in str(failed.value), failed.value
    for pod in d.cluster.get("pods", NS, selector=f"{JOB_LABEL}={d.run}")["items"]:
        assert all(cs["restartCount"] == 0 for cs in pod["status"].get("containerStatuses", []))


def _spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]


def test_mutation_a_wrong_service_name_fails_the_run_naming_it(deployment: Deployment) -> None:
    d = deployment

    def wrong_endpoint(job: dict[str, Any]) -> None:
        cmd = _spec(job)["containers"][0]["command"]
        i = next(i for i, a in enumerate(cmd) if a.startswith("--rdzv-endpoint="))
        cmd[i] = f"--rdzv-endpoint={d.run}-wrkr-0:29400"

    apply_run(d, wrong_endpoint)
    with pytest.raises(AssertionError) as failed:
        wait_run(d, stall_s=45)  # the launcher names the host it waits for at once, then every minute
    assert f"{d.run}-wrkr-0" in str(failed.value), failed.value


def test_mutation_a_secret_the_trainer_cannot_read_fails_naming_it(deployment: Deployment) -> None:
    """The token's mode 0440 is readable through the pod's fsGroup only (the kubelet gives the file that
    group); without fsGroup the file is root's and the trainer's user cannot read it. The run is made
    long (the tiny model reads no token), so that its container is still there when the probe runs in it:
    the tiny run's own length ended it before the probe once on a fast machine."""
    d = deployment

    def no_fsgroup(job: dict[str, Any]) -> None:
        del _spec(job)["securityContext"]["fsGroup"]
        del _spec(job)["securityContext"]["fsGroupChangePolicy"]
        _spec(job)["containers"][0]["command"] += ["training.max_steps=100000"]

    apply_run(d, no_fsgroup)
    d.cluster.wait_for(
        lambda: any(
            "running" in cs.get("state", {})
            for p in d.cluster.get("pods", NS, selector=f"{JOB_LABEL}={d.run}")["items"]
            for cs in p.get("status", {}).get("containerStatuses", [])
        ),
        300,
        "a running trainer container",
    )
    with pytest.raises(AssertionError) as failed:
        check_access(d, f"{d.run}-worker-0")
    assert "cannot read /etc/hf-token/token: Permission denied" in str(failed.value), failed.value


def test_mutation_a_volume_the_trainer_cannot_write_fails_naming_it(deployment: Deployment) -> None:
    d = deployment
    (d.volume / "runs").chmod(0o755)
    owner = (d.volume / "runs").stat().st_uid
    os.chown(d.volume / "runs", 0, 0)
    try:
        apply_run(d)
        with pytest.raises(AssertionError) as failed:
            wait_run(d, stall_s=120)
        assert "Permission denied" in str(failed.value) and "/shared/runs" in str(failed.value), failed.value
    finally:
        os.chown(d.volume / "runs", owner, owner)


def test_the_preflight_job_runs_on_two_nodes_over_gloo(deployment: Deployment) -> None:
    """The generated pre-flight Job (manifest, Service, two nodes by anti-affinity, exit path) on CPU:
    one rank per node and any transport expected, since there are no GPUs or EFA here: it measures
    gloo, says so, and completes."""
    d = deployment
    (job,) = [x for x in d.render(f"overlays/infrastructure/{CLUSTER}/configs") if is_preflight_job(x)]
    name = job["metadata"]["name"]
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    cmd[:] = ["--nproc_per_node=1" if a.startswith("--nproc_per_node=") else a for a in cmd]
    cmd[cmd.index("--expect-transport") + 1] = "any"
    cmd[cmd.index("--min-busbw-gbs") + 1] = "0"
    d.cluster.kubectl("delete", "job", "-n", NS, name, "--ignore-not-found", "--wait=true")
    apply_in_namespaces(d.cluster, [job])
    wait_job(d.cluster, name, 600)
    pods = d.cluster.get("pods", NS, selector=f"job-name={name}")["items"]
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    logs = "".join(d.cluster.kubectl("logs", "-n", NS, p["metadata"]["name"]) for p in pods)
    (result,) = [json.loads(x) for x in logs.splitlines() if x.startswith('{"world_size"')]  # rank 0's line
    assert (result["transport"], result["passed"], result["world_size"]) == ("gloo", True, 2), result


def test_the_preflight_job_fails_at_once_on_the_wrong_transport(deployment: Deployment) -> None:
    """The exit path of a failed check: the generated expectation (EFA) is kept, the measurement is gloo,
    so preflight exits 3 (CHECK_FAILED), trainer.launch passes 3 through torchrun, and the Job's
    podFailurePolicy fails the whole Job on it without the backoffLimit's retries."""
    d = deployment
    (job,) = [x for x in d.render(f"overlays/infrastructure/{CLUSTER}/configs") if is_preflight_job(x)]
    name = job["metadata"]["name"]
    cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--expect-transport") + 1] == "efa"
    cmd[:] = ["--nproc_per_node=1" if a.startswith("--nproc_per_node=") else a for a in cmd]
    d.cluster.kubectl("delete", "job", "-n", NS, name, "--ignore-not-found", "--wait=true")
    apply_in_namespaces(d.cluster, [job])

    # Each pod's log as last read: a pod the Job controller removes once the Job fails takes its log
    # with it, so the logs are read while the Job runs, too.
    logs_of: dict[str, str] = {}

    def failed() -> dict[str, Any] | None:
        for p in d.cluster.get("pods", NS, selector=f"job-name={name}")["items"]:
            res = d.cluster.kubectl_result("logs", "-n", NS, p["metadata"]["name"])
            if res.returncode == 0 and len(res.stdout) >= len(logs_of.get(p["metadata"]["name"], "")):
                logs_of[p["metadata"]["name"]] = res.stdout
        conds = d.cluster.get("job", NS, name=name).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == "Failed" and c["status"] == "True"), None)

    cond = d.cluster.wait_for(failed, 300, f"Job {name} failed")
    assert cond["reason"] == "PodFailurePolicy", cond
    pods = d.cluster.get("pods", NS, selector=f"job-name={name}")["items"]
    codes = [
        cs["state"]["terminated"]["exitCode"]
        for p in pods
        for cs in p["status"].get("containerStatuses", [])
        if "terminated" in cs.get("state", {})
    ]
    assert 3 in codes, codes
    assert len(pods) <= 2, [p["metadata"]["name"] for p in pods]  # failed at once: no retry pods
    for p in pods:
        res = d.cluster.kubectl_result("logs", "-n", NS, p["metadata"]["name"])
        if res.returncode == 0 and len(res.stdout) >= len(logs_of.get(p["metadata"]["name"], "")):
            logs_of[p["metadata"]["name"]] = res.stdout
    logs = "".join(logs_of.values())
    assert "transport gloo, expected efa" in logs, logs[-2000:]
    d.cluster.kubectl("delete", "job", "-n", NS, name, "--wait=true")


# The hang watch's bounds shrunk for the tiny model on CPU, as tests/test_trainer_launch_hang.py does.
FAST_HANG = {
    "FSDP_HANG_MIN_S": "6",
    "FSDP_HANG_FACTOR": "10",
    "FSDP_HANG_FIRST_STEP_S": "240",
    "FSDP_HANG_CHECKPOINT_S": "120",
    "FSDP_HANG_POLL_S": "0.5",
    "FSDP_HANG_DUMP_WAIT_S": "3",
}


def _worker_pid_or_none(pod: str) -> int | None:
    """The host pid of the trainer worker (trainer.train under torchrun, with a LOCAL_RANK) in `pod`."""
    return _pid_in_pod(
        pod,
        lambda cmd, env: (
            b"trainer.train" in cmd and b"trainer.launch" not in cmd and any(e.startswith(b"LOCAL_RANK=") for e in env)
        ),
    )


def test_a_rank_stopped_mid_run_is_caught_as_a_hang_and_the_run_resumes(deployment: Deployment) -> None:
    """Worker 1's trainer process is stopped (SIGSTOP) after the first checkpoint: it makes no progress
    and worker 0's rank blocks in the step's collective. The hang watch of the launchers stops the run
    with exit 201 (restartable), the operator re-creates the pods, and the run resumes from its last
    checkpoint to Succeeded."""
    d = deployment
    pod = f"{d.run}-worker-1"

    def with_fast_hang_watch(job: dict[str, Any]) -> None:
        train_longer(KILL_RUN_STEPS)(job)
        for replica in job["spec"]["pytorchReplicaSpecs"].values():
            for c in replica["template"]["spec"]["containers"]:
                c.setdefault("env", []).extend({"name": k, "value": v} for k, v in FAST_HANG.items())

    apply_run(d, with_fast_hang_watch)
    uid = d.cluster.wait_for(
        lambda: next(
            (p["metadata"]["uid"] for p in d.cluster.get("pods", NS)["items"] if p["metadata"]["name"] == pod), None
        ),
        300,
        f"pod {pod}",
    )
    d.cluster.wait_for(lambda: len(metrics(d)) > INTERVAL + 2, 300, "steps past the first checkpoint")
    pid = d.cluster.wait_for(lambda: _worker_pid_or_none(pod), 60, f"the trainer worker of {pod}")
    os.kill(pid, signal.SIGSTOP)
    stopped_at = max(r["step"] for r in metrics(d))
    exits: set[int] = set()
    deadline = time.monotonic() + 600
    while job_state(d.cluster, d.run) not in ("Succeeded", "Failed"):
        assert time.monotonic() < deadline, f"no end within 600 s: {pod_problems(d.cluster, f'{JOB_LABEL}={d.run}')}"
        for p in d.cluster.get("pods", NS, selector=f"{JOB_LABEL}={d.run}")["items"]:
            for s in p.get("status", {}).get("containerStatuses", []):
                done = s.get("state", {}).get("terminated") or s.get("lastState", {}).get("terminated")
                if done:
                    exits.add(int(done["exitCode"]))
        time.sleep(0.3)
    assert job_state(d.cluster, d.run) == "Succeeded", pod_problems(d.cluster, f"{JOB_LABEL}={d.run}")
    assert 201 in exits, f"exit codes seen: {sorted(exits)} (the hang watch's is 201)"
    assert d.cluster.get("pod", NS, name=pod)["metadata"]["uid"] != uid, f"{pod} was not re-created after the hang"
    steps = [r["step"] for r in metrics(d)]
    assert set(steps) == set(range(1, KILL_RUN_STEPS + 1)) and stopped_at < KILL_RUN_STEPS, (stopped_at, steps)
