"""Step `sources`: tools/cluster/servers.py over the work folder's serve/ (git over HTTP, Helm and OCI
repositories), where tools/cluster/gitops.py publishes what Flux reads; its URL is cluster.sources_url."""

from __future__ import annotations

import os
import sys

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port


def start(c: Cluster) -> None:
    port = free_port()
    (c.work / "serve").mkdir(exist_ok=True)
    proc = c.start_process(
        "sources-server",
        [sys.executable, "-m", "tools.cluster.servers", c.work / "serve", port],
        env={**os.environ, "PYTHONPATH": str(build.HERE.parent.parent)},
    )
    proc.wait_ready(lambda: c.get_url(f"http://127.0.0.1:{port}/v2/") is not None, 30, "serving")
    c.sources_url = f"http://127.0.0.1:{port}"
