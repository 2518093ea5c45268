"""Step `kubelet` (the real-pods level): one kubelet v1.34.2 per node, all in the holder's namespaces
(each on its own ports), each on its own containerd; the node's labels and taint are the instance
type's (realpods.node_shape), its capacity the machine files of the `namespaces` step."""

from __future__ import annotations

import yaml

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.realpods import NODE_IP, Node, RealPods, node_shape


def start(c: Cluster) -> None:
    rp: RealPods = c.level
    for node in rp.nodes:
        start_one(c, rp, node)


def start_one(c: Cluster, rp: RealPods, node: Node) -> None:
    labels, taints, _ = node_shape(node)
    folder = rp.dir / f"kubelet-{node.name}"
    folder.mkdir()
    healthz = 10248 - node.index
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": 10250 + node.index,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        # Reachable only inside the namespace: the API server (logs, exec) is its only client.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{rp.cgroup}/{node.name}",
        # No QoS cgroups: the kubelet would write the node's (the instance's) CPU list into
        # kubepods' cpuset, which this machine's few CPUs refuse; pods' cgroups go under cgroupRoot.
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{rp.socks[node.name]}",
        "clusterDNS": [NODE_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": str(rp.dir / "resolv.conf"),
        "podLogsDir": str(folder / "pod-logs"),
        "serializeImagePulls": False,
        # The imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        # A node is Ready at the first status update after the runtime reports its network ready:
        # every second (the status is sent only when it changes, or at the report frequency).
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "1m",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "runtimeRequestTimeout": "2m",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "protectKernelDefaults": False,
    }
    path = folder / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = c.start_process(
        f"kubelet-{node.name}",
        [
            str(build.binary("kubelet")),
            f"--config={path}",
            f"--kubeconfig={c.kubeconfig}",
            f"--root-dir={folder / 'root'}",
            f"--cert-dir={folder / 'pki'}",
            f"--hostname-override={node.name}",
            f"--node-ip={NODE_IP}",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items() if not k.startswith("kubernetes.io/")),
            *(
                ["--register-with-taints=" + ",".join(f"{t['key']}={t['value']}:{t['effect']}" for t in taints)]
                if taints
                else []
            ),
            "--v=2",
        ],
    )
    url = f"http://127.0.0.1:{healthz}/healthz"
    proc.wait_ready(lambda: c.get_url(url) == "ok", 60, "healthy")
