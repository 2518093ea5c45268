"""Level 3 for a `job_api: trainjob` cluster: the real Flux controllers reconcile the entry point of
fsdp-p5 of examples/matrix-two-apis.yaml (expanded by the real generator in the served copy of the
repository) until every Kustomization and HelmRelease is Ready.

As in test_cluster_flux.py the sources are loopback copies (tools/cluster/gitops.py) and the Helm
charts stubs under the pinned names and versions, the Kubeflow Trainer chart included; what that chart
would run, the Trainer controller manager and the JobSet controller, runs as processes
(tools/cluster/steps/trainer.py) with their upstream webhooks registered before Flux starts. So the
ClusterTrainingRuntime and the TrainJobs Flux applies pass the Trainer's and JobSet's real admission,
and each TrainJob becomes its JobSet, Jobs and pods on the fake p5.48xlarge nodes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from support import REPO_ROOT

from tools.cluster import dryrun, gitops, levels
from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster

EXAMPLE = REPO_ROOT / "examples" / "matrix-two-apis.yaml"
CLUSTER = "fsdp-p5"  # the example's cluster on job_api: trainjob
NS = "fsdp"
RUNTIME = "fsdp-torch"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


@dataclass
class Flux:
    cluster: Cluster
    clone: gitops.Clone

    def runs(self) -> set[str]:
        return {p.name for p in (self.clone.repo / "overlays" / "runs" / CLUSTER).iterdir() if p.is_dir()}

    def trainjobs(self) -> set[str]:
        return {j["metadata"]["name"] for j in self.cluster.get("trainjobs.trainer.kubeflow.org")["items"]}

    def jobsets(self) -> set[str]:
        return {j["metadata"]["name"] for j in self.cluster.get("jobsets.jobset.x-k8s.io")["items"]}


def _serve_the_example(clone: gitops.Clone) -> None:
    """The served repository's matrix is the example, expanded by the real generator and pushed."""
    (clone.repo / "matrix.yaml").write_text(EXAMPLE.read_text())
    res = subprocess.run(
        [sys.executable, "generators/expand.py", "matrix.yaml"], cwd=clone.repo, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    clone.upstream = yaml.safe_load(EXAMPLE.read_text())["repository"]["url"]
    clone.localize()
    clone.commit_and_push("the example matrix with one cluster on each job API")


@pytest.fixture(scope="module")
def flux() -> Iterator[Flux]:
    # With trainjob the Trainer's and JobSet's webhooks answer before Flux applies a TrainJob.
    cluster = levels.start("flux", trainjob=True)
    try:
        clone = gitops.prepare(cluster.work, cluster.sources_url, cluster.webhook_port)
        _serve_the_example(clone)
        cluster.add_cpu_node()
        matrix = yaml.safe_load((clone.repo / "matrix.yaml").read_text())
        assert matrix["clusters"][CLUSTER]["job_api"] == "trainjob"
        cluster.add_gpu_nodes(matrix["clusters"][CLUSTER]["instance_types"][0], 2)
        configs = dryrun.render(clone.repo, f"overlays/infrastructure/{CLUSTER}/configs")
        for pvc in [d for d in configs if d["kind"] == "PersistentVolumeClaim"]:
            cluster.add_shared_volume(pvc)
        gitops.bootstrap(cluster, clone, CLUSTER)
        f = Flux(cluster, clone)
        cluster.wait_for(
            lambda: not gitops.not_ready(cluster) and f.runs() <= f.trainjobs(),
            600,
            f"every Kustomization and HelmRelease of {CLUSTER} Ready (still: {gitops.not_ready(cluster)})",
        )
        yield f
    finally:
        cluster.stop()


def test_flux_reconciles_a_trainjob_cluster_until_everything_is_ready(flux: Flux) -> None:
    cluster = flux.cluster
    assert gitops.not_ready(cluster) == {}
    names = {k["metadata"]["name"] for k in cluster.get("kustomizations.kustomize.toolkit.fluxcd.io")["items"]}
    assert {"flux-system", "infra-controllers", "infra-configs", "secrets"} <= names
    assert {f"run-{r}" for r in flux.runs()} <= names
    releases = {h["metadata"]["name"] for h in cluster.get("helmreleases.helm.toolkit.fluxcd.io")["items"]}
    assert "kubeflow-trainer" in releases, releases
    # The stub chart stands for the Trainer chart; its release is installed under the pinned name.
    stub = cluster.get("configmap", "kubeflow-system", name="kubeflow-trainer-stub")
    assert stub["data"]["chart"] == "kubeflow-trainer"


def test_flux_applies_the_runtime_and_one_trainjob_per_run_which_become_jobsets(flux: Flux) -> None:
    cluster = flux.cluster
    runtime = cluster.get("clustertrainingruntime", name=RUNTIME)
    assert runtime["metadata"]["labels"]["kustomize.toolkit.fluxcd.io/name"] == "infra-configs"
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 10
    runs = flux.runs()
    assert len(runs) == 2 and flux.trainjobs() == runs  # llama2-7b on 1 and 2 nodes
    assert not cluster.get("pytorchjobs.kubeflow.org")["items"]  # this cluster's runs are TrainJobs only
    cluster.wait_for(lambda: flux.jobsets() >= runs, 180, "a JobSet for every TrainJob")
    for run in sorted(runs):
        job = cluster.get("trainjob", NS, name=run)
        assert job["metadata"]["labels"]["kustomize.toolkit.fluxcd.io/name"] == f"run-{run}"
        assert job["spec"]["runtimeRef"]["name"] == RUNTIME
        jobset = cluster.get("jobset", NS, name=run)
        (owner,) = jobset["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("TrainJob", run, job["metadata"]["uid"])
        nodes = job["spec"]["trainer"]["numNodes"]
        (rjob,) = jobset["spec"]["replicatedJobs"]
        assert rjob["template"]["spec"]["parallelism"] == nodes, rjob["template"]["spec"]
        cluster.wait_for(
            lambda run=run: cluster.get("jobs", NS, selector=f"{JOBSET_LABEL}={run}")["items"],
            120,
            f"the Jobs of {run}",
        )
