"""Progress annotations (trainer/progress.py) on a real kube-apiserver: the run's generated RBAC lets
its token patch the run's own pods and nothing else, and the trainer's annotations land on its pod
while it trains (real torchrun on CPU with the in-cluster environment pointed at the API server).
The same publisher against a stand-in API, and its failures, are tests/test_observability_progress.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from matrix_support import GOOD, plans
from observability_support import STEPS, in_cluster_env, run_trainer

from generators.render.runs import progress_rbac
from tools.cluster import levels
from tools.cluster.build import tool_path
from trainer.progress import ProgressPublisher

pytestmark = pytest.mark.cluster


def test_annotations_appear_on_a_real_api_server_with_rbac_that_allows_only_that(tmp_path):
    """The run's generated RBAC on a real kube-apiserver (tools/cluster/levels.py): its token may
    patch the run's own pods and nothing else, and the trainer's annotations land on its pod."""
    p = next(p for p in plans(GOOD) if p.nodes == 2)
    ns, pod = p.namespace, f"{p.name}-worker-0"

    def bare_pod(name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "serviceAccountName": p.name,
                "automountServiceAccountToken": False,
                "containers": [{"name": "pytorch", "image": "example.invalid/trainer:1"}],
            },
        }

    cluster = levels.start("api")
    watch = None
    try:
        cluster.apply(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                *progress_rbac(p),
                bare_pod(pod),
                bare_pod(f"{p.name}-worker-1"),
                bare_pod("another-run-worker-0"),
            ]
        )
        token = cluster.kubectl("create", "token", p.name, "-n", ns).strip()

        def can_i(*args: str) -> str:
            res = cluster.kubectl_result(f"--token={token}", "auth", "can-i", *args, "-n", ns)
            return res.stdout.strip()

        assert [can_i("patch", f"pods/{p.name}-worker-{i}") for i in range(2)] == ["yes", "yes"]
        for denied in (
            ("patch", "pods/another-run-worker-0"),
            ("patch", f"pods/{p.name}-worker-2"),
            ("get", f"pods/{pod}"),
            ("list", "pods"),
            ("create", "pods"),
            ("delete", f"pods/{pod}"),
            ("get", "secrets"),
            ("patch", f"pytorchjobs.kubeflow.org/{p.name}"),
        ):
            assert can_i(*denied) == "no", denied

        # Every change of the pod's annotations while the trainer runs, as kubectl sees them.
        watch = subprocess.Popen(
            [
                tool_path("kubectl"),
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                "pod",
                pod,
                "-n",
                ns,
                "--watch",
                "-o",
                'jsonpath={.metadata.annotations}{"\\n"}',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text(token)
        (sa / "namespace").write_text(ns)
        (sa / "ca.crt").write_bytes((cluster.work / "pki" / "apiserver.crt").read_bytes())
        port = int(cluster.server.rsplit(":", 1)[1])
        env = {**in_cluster_env(sa, port, 0), "FSDP_POD_NAME": pod}
        log, records = run_trainer(tmp_path, env)
        assert "warning: progress annotations" not in log, log[-3000:]
        final = cluster.get("pod", ns, pod)["metadata"]["annotations"]
        assert final["fsdp-gitops/step"] == f"{STEPS}/{STEPS}" and final["fsdp-gitops/eta"] == "done"
        assert final["fsdp-gitops/loss"] == f"{records[-1]['loss']:.4f}"
        watch.terminate()
        seen = [json.loads(line) for line in watch.communicate(timeout=30)[0].splitlines() if line.startswith("{")]
        steps = [int(a["fsdp-gitops/step"].split("/")[0]) for a in seen if "fsdp-gitops/step" in a]
        assert steps and steps[-1] == STEPS and len(set(steps)) >= 2, seen  # updated during the run, not once
        # The same token cannot annotate another run's pod: the API refuses, the publisher only counts it.
        other = ProgressPublisher.from_environment(STEPS, {**env, "FSDP_POD_NAME": "another-run-worker-0"})
        other.publish(records[-1], force=True)
        other.close()
        assert other.failed == 1 and other.sent == 0
        assert "fsdp-gitops/step" not in (
            cluster.get("pod", ns, "another-run-worker-0")["metadata"].get("annotations") or {}
        )
    finally:
        if watch and watch.poll() is None:
            watch.kill()
            watch.wait()
        cluster.stop()
