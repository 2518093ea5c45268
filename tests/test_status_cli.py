"""generators/status.py without a cluster: what it makes of the objects the API server returns (the
phase each job API's conditions give, the newest progress record, restarts), and bad input as one
line. Against a real API server: tests/cluster/test_cluster_status.py and test_realpods_runs.py."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from support import REPO_ROOT

from generators import status
from trainer.progress import pod_annotations

RECORD = {"step": 120, "data_epoch": 0, "loss": 1.0, "tokens_per_s": 900.0, "step_time_s": 1.0, "time": 1.8e9}


def obj(name: str, conditions: dict[str, str] | None = None, notes: dict[str, str] | None = None, **extra: Any):
    return {
        "metadata": {"name": name, "namespace": "fsdp", "annotations": notes or {}, **extra},
        "status": {"conditions": [{"type": t, "status": s} for t, s in (conditions or {}).items()]},
    }


def pod(job_label: str, run: str, phase: str = "Running", restarts: int = 0, notes: dict[str, str] | None = None):
    p = obj(f"{run}-pod", notes=notes, labels={job_label: run})
    p["status"] = {"phase": phase, "containerStatuses": [{"restartCount": restarts}]}
    return p


def test_pytorchjob_phase_follows_the_operators_condition_precedence():
    assert status.phase("PyTorchJob", obj("a"), []) == "Pending"
    assert status.phase("PyTorchJob", obj("a", {"Created": "True"}), []) == "Created"
    assert status.phase("PyTorchJob", obj("a", {"Created": "True", "Running": "True"}), []) == "Running"
    # On success the operator leaves Running False beside Succeeded True.
    assert status.phase("PyTorchJob", obj("a", {"Running": "False", "Succeeded": "True"}), []) == "Succeeded"
    assert status.phase("PyTorchJob", obj("a", {"Running": "True", "Suspended": "True"}), []) == "Suspended"
    assert status.phase("PyTorchJob", obj("a", {"Restarting": "True", "Failed": "True"}), []) == "Failed"


def test_trainjob_phase_from_its_conditions_else_its_pods():
    label = status.APIS["trainjobs.trainer.kubeflow.org"][1]
    assert status.phase("TrainJob", obj("t"), []) == "Pending"
    assert status.phase("TrainJob", obj("t"), [pod(label, "t", "Pending")]) == "Pending"
    assert status.phase("TrainJob", obj("t"), [pod(label, "t")]) == "Running"
    assert status.phase("TrainJob", obj("t", {"Complete": "True"}), [pod(label, "t")]) == "Succeeded"
    assert status.phase("TrainJob", obj("t", {"Suspended": "True"}), []) == "Suspended"
    assert status.phase("TrainJob", obj("t", {"Suspended": "False", "Failed": "True"}), []) == "Failed"


def test_rows_take_the_newest_record_and_count_pod_restarts_without_the_annotation():
    label = status.APIS["pytorchjobs.kubeflow.org"][1]
    old = pod_annotations({**RECORD, "time": 1.7e9}, 1000, restarts=5)
    new = pod_annotations(RECORD, 1000, checkpoint=100)
    del new["fsdp-gitops/restarts"]
    pods = [pod(label, "b", notes=old, restarts=1), pod(label, "b", notes=new, restarts=2), pod(label, "other")]
    jobs = {"pytorchjobs.kubeflow.org": [obj("b", {"Running": "True"}), obj("a")], "trainjobs.trainer.kubeflow.org": []}
    a, b = status.rows(jobs, pods)
    assert (a.run, a.phase, a.step, a.restarts) == ("a", "Pending", None, 0)
    assert (b.step, b.total_steps, b.tokens_per_second, b.eta, b.checkpoint, b.restarts) == (
        120, 1000, 900, "14m40s", 100, 3
    )  # fmt: skip
    assert status.format_table([a]).splitlines()[1].split() == [
        "fsdp",
        "a",
        "PyTorchJob",
        "Pending",
        "-",
        "-",
        "-",
        "-",
        "0",
    ]


def test_a_missing_kubeconfig_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "generators/status.py", "--kubeconfig", str(tmp_path / "none")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc
    assert proc.stderr.count("\n") == 1 and "--kubeconfig" in proc.stderr and "no such file" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "generators/status.py"],
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2, proc
    assert "no kubeconfig" in proc.stderr and "KUBECONFIG" in proc.stderr, proc.stderr
