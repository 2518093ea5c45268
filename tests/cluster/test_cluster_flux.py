"""Level 3: real Flux controllers reconcile a cluster's entry point from a local git server until every
Kustomization and HelmRelease is Ready; a pull-request-like commit (one run added, one removed,
regenerated with expand.py) creates and prunes PyTorchJobs; a broken commit leaves the cluster on
the last good revision with the Kustomization reporting the API server's error.

Each cluster of matrix.yaml gets its own control plane (the clusters' Flux objects share names) and
is reconciled until Ready; the pull-request and broken commits, which exercise the same generated
Flux graph whatever the cluster, run on the first cluster only.
Sources are loopback copies (tools/cluster/gitops.py): the repository, the operator's manifests,
stub Helm charts under the pinned names and versions, Secrets encrypted for a test age key.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import dryrun, gitops, levels
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster

CLUSTERS = sorted(yaml.safe_load((REPO_ROOT / "matrix.yaml").read_text())["clusters"])


class Flux:
    def __init__(self, cluster: Cluster, clone: gitops.Clone, name: str):
        self.cluster, self.clone, self.name = cluster, clone, name

    def jobs(self) -> set[str]:
        return {j["metadata"]["name"] for j in self.cluster.get("pytorchjobs.kubeflow.org")["items"]}

    def runs(self) -> set[str]:
        return {p.name for p in (self.clone.repo / "overlays" / "runs" / self.name).iterdir() if p.is_dir()}

    def kustomization(self, name: str) -> dict[str, Any]:
        return self.cluster.get("kustomizations.kustomize.toolkit.fluxcd.io", "flux-system", name=name)

    def wait_ready(self, timeout_s: float = 600) -> None:
        self.cluster.wait_for(
            lambda: not gitops.not_ready(self.cluster) and self.runs() <= self.jobs(),
            timeout_s,
            f"every Kustomization and HelmRelease of {self.name} Ready (still: {gitops.not_ready(self.cluster)})",
        )


def start(name: str) -> Iterator[Flux]:
    cluster = levels.start("flux")
    try:
        clone = gitops.prepare(cluster.work, cluster.sources_url, cluster.webhook_port)
        cluster.add_cpu_node()  # the controllers' Deployments (etcd, operator, autoscaler) run here
        # Two GPU nodes of the cluster's instance type for the pre-flight and staging Jobs, and the
        # volume the FSx CSI driver would provision for the cluster's claim.
        matrix = yaml.safe_load((clone.repo / "matrix.yaml").read_text())
        cluster.add_gpu_nodes(matrix["clusters"][name]["instance_types"][0], 2)
        configs = dryrun.render(clone.repo, f"overlays/infrastructure/{name}/configs")
        for pvc in [d for d in configs if d["kind"] == "PersistentVolumeClaim"]:
            cluster.add_shared_volume(pvc)
        gitops.bootstrap(cluster, clone, name)
        flux = Flux(cluster, clone, name)
        flux.wait_ready()
        yield flux
    finally:
        cluster.stop()


class Environments:
    """One Flux environment per cluster, started by its first test and stopped after its last one
    (counted over the collected tests), whatever order the tests run in: under pytest-xdist a
    parametrized module fixture could be torn down and started again between two tests of one cluster."""

    def __init__(self, items: list[pytest.Item]):
        self.left = Counter(
            i.callspec.params["flux"] for i in items if hasattr(i, "callspec") and "flux" in i.callspec.params
        )
        self.open: dict[str, tuple[Iterator[Flux], Flux]] = {}

    def get(self, name: str) -> Flux:
        if name not in self.open:
            env = start(name)
            self.open[name] = (env, next(env))
        return self.open[name][1]

    def done(self, name: str) -> None:
        self.left[name] -= 1
        if self.left[name] <= 0:
            self.stop(name)

    def stop(self, name: str) -> None:
        if name in self.open:
            self.open.pop(name)[0].close()  # runs start()'s finally: the control plane stops


@pytest.fixture(scope="session")
def environments(request: pytest.FixtureRequest) -> Iterator[Environments]:
    envs = Environments(request.session.items)
    try:
        yield envs
    finally:
        for name in list(envs.open):
            envs.stop(name)


@pytest.fixture(params=CLUSTERS)
def flux(request: pytest.FixtureRequest, environments: Environments) -> Iterator[Flux]:
    yield environments.get(request.param)
    environments.done(request.param)


def test_flux_reconciles_the_cluster_until_everything_is_ready(flux: Flux) -> None:
    assert gitops.not_ready(flux.cluster) == {}
    names = {k["metadata"]["name"] for k in flux.cluster.get("kustomizations.kustomize.toolkit.fluxcd.io")["items"]}
    assert {"flux-system", "infra-controllers", "infra-configs", "secrets", "training-operator"} <= names
    assert len(flux.cluster.get("helmreleases.helm.toolkit.fluxcd.io")["items"]) >= 2
    assert flux.jobs() == flux.runs()
    # The Secret Flux decrypted with the test key is there, in clear, as the pods would read it.
    secret = flux.cluster.get("secret", "fsdp", name="hf-token")
    assert "sops" not in secret and secret.get("data")


def _expand(flux: Flux) -> None:
    res = subprocess.run(
        [sys.executable, "generators/expand.py", "matrix.yaml"], cwd=flux.clone.repo, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    flux.clone.localize()


@pytest.mark.parametrize("flux", CLUSTERS[:1], indirect=True)
def test_pull_request_adds_one_run_and_prunes_another(flux: Flux) -> None:
    before = flux.runs()
    matrix = yaml.safe_load((flux.clone.repo / "matrix.yaml").read_text())
    removed_rule = {"cluster": flux.name, "model": "llama2-7b", "nodes": 1}
    matrix.setdefault("exclude", []).append(removed_rule)
    matrix.setdefault("include", []).append({"cluster": flux.name, "model": "llama2-7b", "nodes": 2, "rev": 7})
    (flux.clone.repo / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    _expand(flux)
    after = flux.runs()
    added, removed = after - before, before - after
    assert len(added) == 1 and len(removed) == 1, (added, removed)
    revision = flux.clone.commit_and_push("one run added, one removed")
    gitops.reconcile_now(flux.cluster)
    flux.cluster.wait_for(lambda: flux.jobs() == after, 300, f"Flux applies {added} and prunes {removed}")
    assert flux.kustomization("flux-system")["status"]["lastAppliedRevision"].endswith(revision)


@pytest.mark.parametrize("flux", CLUSTERS[:1], indirect=True)
def test_broken_commit_keeps_the_last_good_revision_and_reports_the_error(flux: Flux) -> None:
    run = sorted(flux.runs())[0]
    # The last good revision is the clone's head: wait until this run's Kustomization applied it
    # (after the previous commit it may still be on the one before).
    head = flux.clone.git("rev-parse", "HEAD").strip()
    good = flux.cluster.wait_for(
        lambda: (
            (r := flux.kustomization(f"run-{run}").get("status", {}).get("lastAppliedRevision", "")).endswith(head)
            and r
        ),
        300,
        f"run-{run} applies the last good revision {head}",
    )
    jobs = flux.jobs()
    patch = flux.clone.repo / "overlays" / "runs" / flux.name / run / "pytorchjob.run.yaml"
    patch.write_text(patch.read_text() + '- op: add\n  path: /spec/nprocPerNodeX\n  value: "8"\n')
    revision = flux.clone.commit_and_push("broken: a field the PyTorchJob schema does not have")
    gitops.reconcile_now(flux.cluster)

    def failed() -> str:
        k = flux.kustomization(f"run-{run}")
        ready = next((c for c in k.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
        return (
            ready.get("message", "")
            if ready.get("status") == "False"
            and revision in ready.get("message", "") + k["status"].get("lastAttemptedRevision", "")
            else ""
        )

    message = flux.cluster.wait_for(failed, 300, f"run-{run} reports the broken revision")
    assert "nprocPerNodeX" in message, message
    status = flux.kustomization(f"run-{run}")["status"]
    assert status["lastAppliedRevision"] == good
    assert status["lastAttemptedRevision"].endswith(revision)
    assert flux.jobs() == jobs  # nothing pruned, nothing half-applied
