"""What the Capacity Block tests share: block ends a given time from the runs' stop time, a generated
fsdp-p5 run, the ClusterQueue's policy and a run's Workload, and the real `python -m trainer.block_queue`
started against a harness cluster with the service-account files a pod would have."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.client import TOKEN
from tools.cluster.cluster import Cluster
from trainer import capacity_block

CLUSTER = "fsdp-p5"
GRACE_S = 30.0


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def end_stopping_in(seconds: float) -> str:
    """A block end whose runs' stop time (capacity_block.stop_time) is `seconds` away."""
    return iso(time.time() + seconds + capacity_block.TERMINATION_LEAD_S + GRACE_S + capacity_block.MARGIN_S)


def run_docs() -> list[dict[str, Any]]:
    (found,) = sorted((REPO_ROOT / "overlays" / "runs" / CLUSTER).glob("llama2-7b-*-n1-fullshard-*"))
    return dryrun.render(REPO_ROOT, str(found.relative_to(REPO_ROOT)))


def stop_policy(c: Cluster) -> str:
    return c.get("clusterqueue", name="fsdp")["spec"].get("stopPolicy") or "None"


def workload_of(c: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    for w in c.get("workloads.kueue.x-k8s.io", ns)["items"]:
        if any(o.get("name") == name for o in w["metadata"].get("ownerReferences", [])):
            return w
    return None


def admitted(w: dict[str, Any] | None) -> bool:
    conditions = {x["type"]: x["status"] for x in (w or {}).get("status", {}).get("conditions", [])}
    return conditions.get("Admitted") == "True"


def start_block_queue(c: Cluster, folder: Path, end_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """`python -m trainer.block_queue` for ClusterQueue fsdp of `c`, reading the block end from
    `end_file` every 0.5 s, with its output in `log`."""
    sa = folder / "sa"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_bytes((c.work / "pki" / "apiserver.crt").read_bytes())
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": c.server.rsplit(":", 1)[1],
        "FSDP_SERVICEACCOUNT_DIR": str(sa),
        capacity_block.FILE_ENV: str(end_file),
        capacity_block.GRACE_ENV: str(GRACE_S),
        capacity_block.POLL_ENV: "0.5",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.block_queue"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
