"""Step `coredns` (the real-pods level): a trimmed CoreDNS (tools/cluster/go/coredns) on the node
address, the kubelets' clusterDNS: pods find each other's headless Services through it."""

from __future__ import annotations

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.realpods import NODE_IP, RealPods

COREDNS_READY = "http://127.0.0.1:8181/ready"


def start(c: Cluster) -> None:
    rp: RealPods = c.level
    corefile = rp.dir / "Corefile"
    corefile.write_text(
        f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    cache 1
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {c.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
}}
"""
    )
    proc = c.start_process("coredns", [str(build.binary("coredns")), f"-conf={corefile}"])
    proc.wait_ready(lambda: c.get_url(COREDNS_READY) == "OK", 60, "ready")
