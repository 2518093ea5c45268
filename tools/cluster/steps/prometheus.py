"""Step `prometheus` (the level option `prometheus`): the pinned Prometheus (tools/cluster/go/prometheus)
where the cluster's components run (on the real-pods level inside its namespaces, so it reaches pod IPs
and the API server at the kubeconfig's address), registered in cluster.procs so the level's stop stops
it. It starts with no targets; a test hands it the scrape configuration once the monitors it derives
it from exist (tools/cluster/scrape.py):

    prom = cluster.addons["prometheus"]
    prom.scrape(scrape.scrape_configs(monitors, interval="1s", kubeconfig=cluster.kubeconfig), interval="1s")
    prom.query('fsdp_step{run="..."}'); prom.targets()
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.processes import free_port


@dataclass
class Prometheus:
    """The started Prometheus; its API is reached from where it listens."""

    cluster: Cluster
    url: str
    folder: Path

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")

        def get() -> Any:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)

        body = self.cluster.in_netns(get)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def targets(self) -> dict[str, list[dict[str, Any]]]:
        """{"activeTargets": [...], "droppedTargets": [...]} of /api/v1/targets."""
        found: dict[str, list[dict[str, Any]]] = self.api("targets")
        return found

    def ready(self) -> bool:
        return self.cluster.get_url(f"{self.url}/-/ready") is not None

    def scrape(self, configs: list[dict[str, Any]], interval: str = "1s") -> None:
        """Scrape with `configs` from now on: the configuration file rewritten, then Prometheus' reload
        endpoint; returns once the running configuration holds every job of `configs`."""
        write_config(self.folder, configs, interval)

        def post() -> int:
            req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
            with urllib.request.urlopen(req, timeout=30) as r:
                return int(r.status)

        status = self.cluster.in_netns(post)
        if status != 200:
            raise RuntimeError(f"Prometheus reload answered HTTP {status}")
        jobs = {c["job_name"] for c in configs}
        self.cluster.wait_for(
            lambda: (
                jobs
                <= {
                    c["job_name"] for c in yaml.safe_load(self.api("status/config")["yaml"]).get("scrape_configs") or []
                }
            ),
            60,
            "Prometheus running the new scrape configuration",
        )


def write_config(folder: Path, configs: list[dict[str, Any]], interval: str) -> None:
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": configs,
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))


def start(c: Cluster) -> None:
    folder = c.work / "prometheus"
    folder.mkdir(exist_ok=True)
    write_config(folder, [], "1s")
    port = free_port()
    proc = c.start_process(
        "prometheus",
        [
            build.binary("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",  # the reload endpoint scrape() calls
        ],
        # Prometheus' web UI asks for its working directory at start (os.Getwd, a panic on error); the
        # getcwd call fails for the folder nsenter enters in the other mount namespace, while Go's check
        # of $PWD against "." (stat by path) succeeds: $PWD names that folder.
        env={**os.environ, "PWD": str(c.work)},
    )
    prom = Prometheus(c, f"http://127.0.0.1:{port}", folder)
    proc.wait_ready(prom.ready, 60, "ready")
    c.addons["prometheus"] = prom
