"""clusters.<name>.job_api: the matrix field, and what a `trainjob` cluster renders.

The same runs on a `pytorchjob` and a `trainjob` cluster: same names, same plan, same trainer config;
the trainjob cluster gets the Kubeflow Trainer release (with JobSet) in its controllers, the project's
ClusterTrainingRuntime in its configs, and one TrainJob per run carrying what differs per run. The
pins of the chart and of the harness's Go module are one version.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from matrix_support import GOOD, HEADER, cluster_plans, line_of, load, plans, snapshot
from support import REPO_ROOT

from generators.core.errors import InputError
from generators.expand import main as expand_main
from generators.render import OVERLAYS, render
from generators.render.runs import resources, termination_grace_s
from generators.render.trainjob import RUNTIME_NAME

TRAINJOB = GOOD.replace("    namespace: research\n", "    namespace: research\n    job_api: trainjob\n").replace(
    "  cluster: fsdp-p5\n", "  cluster: fsdp-mixed\n  instance_type: p5en.48xlarge\n"
)
ON_P5 = HEADER.replace(
    "    instance_types: [p5.48xlarge]\n", "    instance_types: [p5.48xlarge]\n    job_api: trainjob\n"
)


def test_the_default_is_pytorchjob_and_trainjob_is_accepted() -> None:
    assert {c.job_api for c in load(GOOD).clusters.values()} == {"pytorchjob"}
    m = load(TRAINJOB)
    assert m.clusters["fsdp-mixed"].job_api == "trainjob" and m.clusters["fsdp-p5"].job_api == "pytorchjob"


def test_an_unknown_job_api_is_one_line_naming_file_line_key_and_fix() -> None:
    text = GOOD.replace("    namespace: research\n", "    namespace: research\n    job_api: mpijob\n")
    with pytest.raises(InputError) as info:
        load(text)
    err = str(info.value)
    assert err.startswith(f"m.yaml:{line_of(text, 'job_api: mpijob')}: clusters.fsdp-mixed.job_api: ")
    assert "'mpijob'" in err and "fix: use one of pytorchjob, trainjob" in err and "\n" not in err


def test_kueue_is_off_on_a_trainjob_cluster_and_asking_for_it_is_one_line_naming_the_fix() -> None:
    m = load(TRAINJOB)
    assert not m.clusters["fsdp-mixed"].kueue and m.clusters["fsdp-p5"].kueue
    text = TRAINJOB.replace("    job_api: trainjob\n", "    job_api: trainjob\n    kueue: true\n")
    with pytest.raises(InputError) as info:
        load(text)
    err = str(info.value)
    assert err.startswith(f"m.yaml:{line_of(text, 'kueue: true')}: clusters.fsdp-mixed.kueue: "), err
    assert "runtimePatches" in err and "fix: set kueue: false on this cluster" in err and "\n" not in err
    # kueue: false, written out, is the default said again.
    assert not load(text.replace("kueue: true", "kueue: false")).clusters["fsdp-mixed"].kueue


def test_a_trainjob_cluster_installs_no_kueue_objects() -> None:
    files = rendered(TRAINJOB)
    for cluster, kueue in (("fsdp-mixed", False), ("fsdp-p5", True)):
        components = [
            c
            for part in ("controllers", "configs")
            for c in files[f"infrastructure/{cluster}/{part}/kustomization.yaml"].get("components", [])
        ]
        assert any("components/kueue/" in c for c in components) is kueue, (cluster, components)


def test_the_expand_command_refuses_it_with_exit_2_and_writes_nothing(tmp_path: Path, cli) -> None:
    matrix, out = tmp_path / "m.yaml", tmp_path / "out"
    matrix.write_text(GOOD)
    assert cli(expand_main, [str(matrix), "--out", str(out)]).exit_code == 0
    before = snapshot(out)
    matrix.write_text(GOOD.replace("    namespace: research\n", "    namespace: research\n    job_api: TrainJob\n"))
    result = cli(expand_main, [str(matrix), "--out", str(out)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1, result.output
    assert ": clusters.fsdp-mixed.job_api: " in result.stderr and "; fix: " in result.stderr
    assert snapshot(out) == before


def test_names_and_plans_do_not_depend_on_the_job_api() -> None:
    # The same runs on fsdp-p5 as PyTorchJobs and as TrainJobs.
    before, after = plans(GOOD), plans(ON_P5 + GOOD[len(HEADER) :])
    assert [p.name for p in before] == [p.name for p in after]
    assert [p.trainer for p in before] == [p.trainer for p in after]
    assert [p.rdzv_endpoint for p in before] == [f"{p.name}-worker-0:29400" for p in before]
    assert [p.rdzv_endpoint for p in after] == [f"{p.name}-node-0-0.{p.name}:29400" for p in after]


def rendered(text: str) -> dict[str, Any]:
    return render(cluster_plans(text), OVERLAYS)


def test_one_trainjob_per_run_with_what_differs_per_run() -> None:
    files = rendered(TRAINJOB)
    ps = [p for p in plans(TRAINJOB) if p.cluster == "fsdp-mixed"]
    assert ps and not any(k.endswith("pytorchjob.run.yaml") for k in files if "/fsdp-mixed/" in k)
    for p in ps:
        job = files[f"{p.overlay_dir}/trainjob.yaml"]
        assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
        assert job["metadata"]["name"] == p.name
        # A trainjob cluster runs without Kueue (the pinned Kueue cannot start a TrainJob): no queue label.
        assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
        spec = job["spec"]
        assert spec["runtimeRef"] == {
            "name": RUNTIME_NAME,
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
        }
        assert spec["activeDeadlineSeconds"] == p.active_deadline_s
        trainer = spec["trainer"]
        assert trainer["image"] == p.run.image
        assert trainer["numNodes"] == p.nodes and trainer["numProcPerNode"] == p.gpus_per_node
        assert trainer["resourcesPerNode"] == resources(p)
        assert trainer["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == p.efa_per_node > 0
        assert f"--rdzv-endpoint={p.name}-node-0-0.{p.name}:29400" in trainer["command"]
        env = {e["name"]: e["value"] for e in trainer["env"]}
        assert env["FSDP_TERM_GRACE_S"] == str(termination_grace_s(p) - 30) and env["FI_PROVIDER"] == "efa"
        assert env["FSDP_MAX_RETRIES"] == str(p.run.max_retries)
        assert env["FSDP_TRAINJOB_NAME"] == p.name
        (patch,) = spec["runtimePatches"]
        (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        assert rjob["name"] == "node"
        pod = rjob["template"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == p.name
        assert pod["terminationGracePeriodSeconds"] == termination_grace_s(p)
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5en.48xlarge"}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["train-config"]["configMap"]["name"] == f"{p.name}-config"
        assert volumes["shm"]["emptyDir"]["sizeLimit"] == f"{p.shm_size_gib}Gi"
        assert pod["initContainers"] == [
            {"name": "wait-for-data", "env": [{"name": "DATA_MARKER", "value": "/shared/data/samsum/_COMPLETE"}]}
        ]
        kust = files[f"{p.overlay_dir}/kustomization.yaml"]
        assert kust["resources"] == ["trainjob.yaml", "rbac.yaml"]
        assert kust["configMapGenerator"][0]["name"] == f"{p.name}-config"
        # Only the ServiceAccount: no Role could name a JobSet's pods (random suffixes).
        rbac = files[f"{p.overlay_dir}/rbac.yaml"]
        assert [d["kind"] for d in rbac] == ["ServiceAccount", "Role", "RoleBinding"]
        # Rank 0 annotates this TrainJob, and only it, with its progress.
        assert rbac[1]["rules"] == [
            {
                "apiGroups": ["trainer.kubeflow.org"],
                "resources": ["trainjobs"],
                "verbs": ["patch"],
                "resourceNames": [p.name],
            }
        ]
        assert rbac[2]["subjects"] == [{"kind": "ServiceAccount", "name": p.name, "namespace": p.namespace}]


def test_the_trainjob_cluster_installs_the_trainer_and_its_runtime_and_waits_for_them() -> None:
    files = rendered(TRAINJOB)
    controllers = files["infrastructure/fsdp-mixed/controllers/kustomization.yaml"]
    configs = files["infrastructure/fsdp-mixed/configs/kustomization.yaml"]
    assert "../../../../base/components/kubeflow-trainer" in controllers["components"]
    assert "../../../../base/trainjob" in configs["components"]
    chain = {k["metadata"]["name"]: k for k in files["clusters/fsdp-mixed/infrastructure.yaml"]}
    checks = chain["infra-controllers"]["spec"]["healthChecks"]
    assert {"kind": "HelmRelease", "name": "kubeflow-trainer", "namespace": "kubeflow-system"}.items() <= next(
        c for c in checks if c["name"] == "kubeflow-trainer"
    ).items()
    # The PyTorchJob cluster gets none of it.
    other = files["infrastructure/fsdp-p5/controllers/kustomization.yaml"]
    assert not any("kubeflow-trainer" in c for c in other.get("components", []))
    assert not any("trainjob" in c for c in files["infrastructure/fsdp-p5/configs/kustomization.yaml"]["components"])


def test_a_metrics_port_the_runtime_does_not_declare_is_refused_on_a_trainjob_cluster() -> None:
    text = TRAINJOB.replace(
        "      path: /shared/data/samsum/train.jsonl\n",
        "      path: /shared/data/samsum/train.jsonl\n    metrics: {prometheus_port: 9100}\n",
    )
    with pytest.raises(InputError) as info:
        plans(text)
    assert "trainer.metrics.prometheus_port" in str(info.value) and "use 8000" in str(info.value)
    # The same port is fine for PyTorchJobs, whose port the overlay sets.
    assert plans(text.replace("    job_api: trainjob\n", ""))


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_runtime_carries_the_pytorchjob_pod_template_and_the_failure_policy() -> None:
    (pj,) = load_yaml(REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml")
    (rt,) = load_yaml(REPO_ROOT / "base" / "trainjob" / "runtime.yaml")
    assert rt["metadata"]["name"] == RUNTIME_NAME and rt["spec"]["mlPolicy"]["torch"] == {}
    jobset = rt["spec"]["template"]["spec"]
    (rjob,) = jobset["replicatedJobs"]
    assert rjob["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    old = pj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    new = rjob["template"]["spec"]["template"]
    for key in ("securityContext", "tolerations"):
        assert new["spec"][key] == old["spec"][key], key
    assert new["metadata"] == old["metadata"]
    (c_old,), (c_new,) = old["spec"]["containers"], new["spec"]["containers"]
    assert c_new["name"] == "node" and c_new["image"] == c_old["image"]
    for key in ("env", "ports", "securityContext", "volumeMounts"):
        assert c_new[key] == c_old[key], key
    assert new["spec"]["volumes"][2:] == old["spec"]["volumes"][2:]  # token and shared volume
    assert [i["name"] for i in new["spec"]["initContainers"]] == ["wait-for-data"]
    # Failure policy: exit 1 and 2 fail the Job at once (podFailurePolicy), which fails the JobSet;
    # any other failure restarts the whole gang, at most 10 times, after the old pods are gone.
    job = rjob["template"]["spec"]
    assert job["backoffLimit"] == 0 and new["spec"]["restartPolicy"] == "Never"
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule == {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, 2]}}
    policy = jobset["failurePolicy"]
    assert policy["maxRestarts"] == pj["spec"]["runPolicy"]["backoffLimit"] == 10
    assert policy["restartStrategy"] == "BlockingRecreate"
    assert [(r["action"], r["onJobFailureReasons"]) for r in policy["rules"]] == [
        ("FailJobSet", ["PodFailurePolicy"]),
        ("RestartJobSet", ["BackoffLimitExceeded"]),
    ]


def test_the_chart_and_the_harness_pin_one_trainer_version() -> None:
    release = load_yaml(REPO_ROOT / "base" / "components" / "kubeflow-trainer" / "release.yaml")
    repo = next(d for d in release if d["kind"] == "OCIRepository")
    helm = next(d for d in release if d["kind"] == "HelmRelease")
    gomod = (REPO_ROOT / "tools" / "cluster" / "go" / "kubeflow-trainer" / "go.mod").read_text()
    trainer = re.search(r"github.com/kubeflow/trainer/v2 v(\S+)", gomod)
    jobset = re.search(r"sigs.k8s.io/jobset v(\S+)", gomod)
    assert trainer and jobset
    assert repo["spec"]["ref"]["tag"] == trainer.group(1) == "2.3.0"
    assert (
        f"JobSet {jobset.group(1)}"
        in (REPO_ROOT / "base" / "components" / "kubeflow-trainer" / "release.yaml").read_text()
    )
    # No default runtimes: the project's runtime is the only one a TrainJob can name.
    assert helm["spec"]["values"]["runtimes"]["defaultEnabled"] is False


def test_the_seed_matrix_stays_on_pytorchjob() -> None:
    seed = load((REPO_ROOT / "matrix.yaml").read_text(), "matrix.yaml")
    assert {c.job_api for c in seed.clusters.values()} == {"pytorchjob"}
    assert "job_api" not in (REPO_ROOT / "matrix.yaml").read_text()
    assert not list((REPO_ROOT / "overlays").rglob("trainjob.yaml"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_plan_and_plan_base_treat_both_apis_the_same(tmp_path: Path, cli) -> None:
    example = (REPO_ROOT / "examples" / "matrix-two-apis.yaml").read_text()
    plan = cli(expand_main, [str(REPO_ROOT / "examples" / "matrix-two-apis.yaml"), "--plan"])
    assert plan.exit_code == 0, plan.output
    rows = [line for line in plan.stdout.splitlines() if line.startswith("| llama2-7b-")]
    assert len(rows) == 4 and sum("-p5-" in r for r in rows) == 2
    assert "Job API per cluster: fsdp-p4de PyTorchJob, fsdp-p5 TrainJob (Kubeflow Trainer v2)" in plan.stdout
    # Moving a cluster from one API to the other changes no run, no figure and no cost.
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    matrix = repo / "matrix.yaml"
    matrix.write_text(example.replace("    job_api: trainjob\n", "    job_api: pytorchjob\n"))
    git(repo, "add", "matrix.yaml")
    git(repo, "commit", "-q", "-m", "before")
    matrix.write_text(example)
    git(repo, "commit", "-q", "-am", "after")
    diff = cli(expand_main, [str(matrix), "--plan", "--base", "HEAD~1"])
    assert diff.exit_code == 0, diff.output
    assert "Added: 0, removed: 0, changed: 0" in diff.stdout, diff.stdout[:3000]
    assert "| difference  |   +0 |      +0.0 |     +0.00 |" in diff.stdout
