"""Step `nodes` (the real-pods level): every kubelet's node Ready, then the GPU nodes' extended
resources advertised (what the NVIDIA and EFA device plugins would register; no devices behind them)."""

from __future__ import annotations

import json

from tools.cluster.cluster import Cluster
from tools.cluster.realpods import RealPods, node_shape


def start(c: Cluster) -> None:
    rp: RealPods = c.level
    c.wait_for(lambda: nodes_ready(c, rp), 60, f"nodes {[n.name for n in rp.nodes]} Ready")
    for node in rp.nodes:
        _, _, extended = node_shape(node)
        if not extended:
            continue
        patch = [
            {"op": "add", "path": f"/status/capacity/{k.replace('/', '~1')}", "value": v} for k, v in extended.items()
        ]
        c.kubectl("patch", "node", node.name, "--subresource=status", "--type=json", "-p", json.dumps(patch))

    def advertised() -> bool:
        for node in rp.nodes:
            alloc = c.get("node", name=node.name)["status"].get("allocatable", {})
            if any(alloc.get(k) != v for k, v in node_shape(node)[2].items()):
                return False
        return True

    c.wait_for(advertised, 60, "the GPU nodes advertising nvidia.com/gpu and vpc.amazonaws.com/efa")


def nodes_ready(c: Cluster, rp: RealPods) -> bool:
    res = c.kubectl_result("get", "nodes", "-o", "json")
    if res.returncode != 0:
        return False
    ready = {
        n["metadata"]["name"]
        for n in json.loads(res.stdout)["items"]
        if any(k["type"] == "Ready" and k["status"] == "True" for k in n.get("status", {}).get("conditions", []))
    }
    return ready >= {n.name for n in rp.nodes}
