"""Step `hosts`: the hosts file bound over /etc/hosts in the private mount namespaces (the API
server's and the webhook servers'): the webhook host names of the serving certificates resolve to
127.0.0.1 there only (tools/cluster/certs.py adds each controller's)."""

from __future__ import annotations

from tools.cluster.cluster import Cluster


def start(c: Cluster) -> None:
    (c.work / "hosts").write_text("127.0.0.1 localhost\n")
