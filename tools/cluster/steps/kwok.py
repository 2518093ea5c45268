"""Step `kwok`: kwok plays the kubelet for the fake Nodes tests add (Cluster.add_gpu_nodes, made from the
instance catalog) and turns their scheduled pods Running, then Succeeded.

Option `pods_complete` (default True): kwok's pod-complete stage ends a running pod by itself; with
False a pod runs until the test says how it ends (a TrainJob's gang, a controller's view of a failure).
"""

from __future__ import annotations

import subprocess

import yaml

from tools.cluster import build, schemas
from tools.cluster.cluster import FAKE_NODE_ANNOTATION, Cluster
from tools.cluster.processes import free_port

STAGES = ("node/fast", "node/heartbeat", "pod/fast")


def start(c: Cluster) -> None:
    kwok_dir = schemas.module_dir(schemas.Source("kwok", "sigs.k8s.io/kwok", ()))
    stages = []
    for stage in STAGES:
        out = subprocess.run(
            [build.tool_path("kustomize"), "build", str(kwok_dir / "kustomize" / "stage" / stage)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        stages += [d for d in yaml.safe_load_all(out) if d]
    if not c.options.get("pods_complete", True):
        stages = [d for d in stages if d["metadata"]["name"] != "pod-complete"]
    config = c.work / "kwok-stages.yaml"
    config.write_text(yaml.safe_dump_all(stages))
    c.start_process(
        "kwok",
        [
            build.binary("kwok"),
            f"--config={config}",
            f"--kubeconfig={c.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.1.0.1",
            f"--server-address=127.0.0.1:{free_port()}",
        ],
    )
