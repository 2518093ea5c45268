"""The TrainJob path is held to every rule the PyTorchJobs are: one mutation per rule on a trainjob overlay.

The example matrix with one cluster on each job API (examples/matrix-two-apis.yaml: fsdp-p4de on
PyTorchJob, fsdp-p5 on TrainJob) is rendered by the real generator into a copy of base/ in a git work
tree, with its eksctl node groups, and goes through the real validation pipeline (kustomize,
kubeconform with the Trainer v2 and JobSet schemas, the semantic rules). The clean tree passes; then
one mistake at a time in a TrainJob (or its runtime) must fail with a line that names the TrainJob and
the file holding the mistake.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO_ROOT

from generators import matrix
from generators.core import writer
from generators.plan import plan
from generators.render import OVERLAYS, render
from generators.render import provisioning as provisioning_render
from generators.validation import pipeline, schemas

pytestmark = [pytest.mark.gotools, pytest.mark.slow]

EXAMPLE = REPO_ROOT / "examples" / "matrix-two-apis.yaml"
RUNTIME = "base/trainjob/runtime.yaml"


def make_tree(root: Path) -> None:
    """base/, the example's overlays and its eksctl node groups in a git work tree at root."""
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copytree(REPO_ROOT / "base", root / "base")
    shutil.copy(EXAMPLE, root / "matrix.yaml")
    m = matrix.load(str(root / "matrix.yaml"))
    plans = plan(m, matrix.expand(m))
    files = render(plans, OVERLAYS)
    files.update({f"provisioning/{k}": v for k, v in provisioning_render.render(plans, karpenter=False).items()})
    for rel, data in writer.serialize(files, "matrix.yaml").items():
        path = root / "overlays" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def problems(root: Path) -> list[str]:
    return [str(p) for p in pipeline.validate(root, crd_dir=schemas.default_crd_dir()).problems]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("clean")
    make_tree(root)
    return problems(root)


def run_dirs(root: Path) -> list[Path]:
    return sorted((root / "overlays" / "runs" / "fsdp-p5").iterdir())


def edit(path: Path, change: Callable[[Any], None]) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    change(docs[0] if len(docs) == 1 else docs)
    path.write_text(yaml.safe_dump_all(docs if len(docs) > 1 else [docs[0]], sort_keys=False))


def pod_patch(job: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of the TrainJob's runtime patch for the trainer Job."""
    rjob = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return rjob["template"]["spec"]["template"]["spec"]


def new_problems(tmp_path: Path, clean: list[str], change: Callable[[Path], None]) -> list[str]:
    make_tree(tmp_path)
    change(tmp_path)
    return [p for p in problems(tmp_path) if p not in clean]


def one(found: list[str], *needles: str) -> str:
    hits = [p for p in found if all(n in p for n in needles)]
    assert hits, f"no problem mentions {needles}; got:\n" + "\n".join(found)
    return hits[0]


def trainjob_file(root: Path, i: int = 0) -> Path:
    return run_dirs(root)[i] / "trainjob.yaml"


def test_the_example_has_a_cluster_on_each_api_and_passes(clean: list[str], tmp_path: Path) -> None:
    make_tree(tmp_path)
    runs = tmp_path / "overlays" / "runs"
    assert len(list((runs / "fsdp-p4de").glob("*/pytorchjob.run.yaml"))) == 2
    assert len(list((runs / "fsdp-p5").glob("*/trainjob.yaml"))) == 2
    report = pipeline.validate(tmp_path, crd_dir=schemas.default_crd_dir())
    assert report.problems == [], "\n".join(map(str, report.problems))
    # 2 PyTorchJobs and 2 TrainJobs checked as jobs.
    assert report.num_pytorchjobs == 4


# ----------------------------------------------------------------------------------- semantic rules


def test_gpus_above_the_instance(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: j["spec"]["trainer"]["resourcesPerNode"]["limits"].update({"nvidia.com/gpu": 9}),
        )

    line = one(new_problems(tmp_path, clean, change), "requests 9 GPUs", "p5.48xlarge has 8")
    assert line.startswith(str(trainjob_file(tmp_path).relative_to(tmp_path))) and "TrainJob/fsdp/" in line


def test_efa_interfaces_that_do_not_match_the_gpus(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: j["spec"]["trainer"]["resourcesPerNode"]["limits"].update({"vpc.amazonaws.com/efa": 4}),
        )

    one(new_problems(tmp_path, clean, change), "requests 4 EFA interfaces", "TrainJob/", "trainjob.yaml")


def test_processes_per_node_other_than_the_gpus(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: j["spec"]["trainer"].update({"numProcPerNode": 4}))

    one(new_problems(tmp_path, clean, change), "nprocPerNode is 4 but each pod has 8 GPUs", "trainjob.yaml")


def test_torchrun_processes_other_than_the_gpus(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        def flag(j: dict[str, Any]) -> None:
            cmd = j["spec"]["trainer"]["command"]
            cmd[cmd.index("--nproc_per_node=8")] = "--nproc_per_node=2"

        edit(trainjob_file(root), flag)

    one(new_problems(tmp_path, clean, change), "torchrun --nproc_per_node is 2", "trainjob.yaml")


def test_an_instance_type_outside_the_catalog(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: pod_patch(j)["nodeSelector"].update({"node.kubernetes.io/instance-type": "x9"}),
        )

    one(new_problems(tmp_path, clean, change), "instance type x9 is not in the catalog", "trainjob.yaml")


def test_a_privileged_trainer_container(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: pod_patch(j).update({"containers": [{"name": "node", "securityContext": {"privileged": True}}]}),
        )

    one(new_problems(tmp_path, clean, change), "container node is privileged", "TrainJob/", "trainjob.yaml")


def test_a_config_map_that_is_not_applied_with_the_job(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: pod_patch(j)["volumes"][1]["configMap"].update({"name": "elsewhere"}))

    one(new_problems(tmp_path, clean, change), "mounts ConfigMap elsewhere, which is not applied", "trainjob.yaml")


def test_two_runs_with_one_rendezvous_id(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        def same_id(j: dict[str, Any]) -> None:
            cmd = j["spec"]["trainer"]["command"]
            cmd[[i for i, a in enumerate(cmd) if a.startswith("--rdzv-id=")][0]] = "--rdzv-id=shared"

        for i in (0, 1):
            edit(trainjob_file(root, i), same_id)

    one(new_problems(tmp_path, clean, change), "rendezvous id shared is also used by TrainJob/")


def test_a_runtime_that_no_build_of_the_cluster_applies(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: j["spec"]["runtimeRef"].update({"name": "torch-distributed"}))

    one(new_problems(tmp_path, clean, change), "names ClusterTrainingRuntime torch-distributed", "fsdp-p5")


# ------------------------------------------------------------------------------ pod-security rules


def test_root_through_the_runtime_patch(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: pod_patch(j).update({"securityContext": {"runAsNonRoot": False, "runAsUser": 0}}),
        )

    one(new_problems(tmp_path, clean, change), "root is not allowed here", "TrainJob/", "trainjob.yaml")


def test_a_host_path_volume_through_the_runtime_patch(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: pod_patch(j)["volumes"].append({"name": "host", "hostPath": {"path": "/"}}))

    one(new_problems(tmp_path, clean, change), "hostPath / is not allowed here", "trainjob.yaml")


def test_an_added_capability_in_the_runtime(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        def cap(r: dict[str, Any]) -> None:
            pod = r["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
            pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]

        edit(root / RUNTIME, cap)

    one(new_problems(tmp_path, clean, change), "capability NET_ADMIN is not allowed here", RUNTIME)


# ------------------------------------------------------------------------------- readability rules


def test_no_fs_group_makes_the_token_unreadable_and_the_shared_volume_unwritable(
    tmp_path: Path, clean: list[str]
) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: pod_patch(j).update({"securityContext": {"fsGroup": None}}))

    found = new_problems(tmp_path, clean, change)
    one(found, "cannot read Secret hf-token", "TrainJob/", "trainjob.yaml")
    one(found, "writes PersistentVolumeClaim fsdp-shared", "trainjob.yaml")


# ---------------------------------------------------------------------------- device-plugin rules


def test_a_trainjob_that_tolerates_no_gpu_node_selects_none(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: pod_patch(j).update({"tolerations": [{"key": "other", "operator": "Exists"}]}),
        )

    one(new_problems(tmp_path, clean, change), "selects no node of cluster fsdp-p5", "TrainJob/")


def test_without_the_efa_plugin_nothing_advertises_the_trainjobs_efa(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        kust = root / "base" / "device-plugins" / "kustomization.yaml"
        edit(kust, lambda k: k["resources"].remove("efa-device-plugin.yaml"))

    one(new_problems(tmp_path, clean, change), "requests vpc.amazonaws.com/efa", "TrainJob/", "none advertises it")


# ------------------------------------------------------------------------------ images and secrets


def test_a_literal_token_in_the_trainer_env(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(
            trainjob_file(root),
            lambda j: j["spec"]["trainer"]["env"].append(
                {"name": "HF_TOKEN", "value": "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"}
            ),
        )

    one(new_problems(tmp_path, clean, change), "env HF_TOKEN holds a literal value", "trainjob.yaml")


def test_a_moving_image_tag_in_the_trainer(tmp_path: Path, clean: list[str]) -> None:
    def change(root: Path) -> None:
        edit(trainjob_file(root), lambda j: j["spec"]["trainer"].update({"image": "example.com/trainer:latest"}))

    one(new_problems(tmp_path, clean, change), "uses the moving tag latest", "TrainJob/", "trainjob.yaml")
