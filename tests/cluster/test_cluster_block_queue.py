"""At a Capacity Block's end Kueue admits nothing more, and a later block lifts that: the real
`python -m trainer.block_queue` (what base/capacity-block runs) against the real Kueue and API server,
with the repository's queues and a generated run, and a block end a few seconds from its stop time.

Before the runs' stop time the ClusterQueue admits; from it on (stopPolicy Hold) a run applied stays
queued, suspended and holding no quota; a new, later end in the file lifts the hold and the waiting run
is admitted whole."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import REPO_ROOT

from tools.cluster import dryrun
from tools.cluster.client import TOKEN
from tools.cluster.cluster import Cluster
from trainer import capacity_block

pytestmark = pytest.mark.cluster

CLUSTER = "fsdp-p5"
INSTANCE = "p5.48xlarge"
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


def test_the_queue_holds_from_the_runs_stop_time_and_a_later_block_lifts_it(kcluster: Cluster, tmp_path: Path) -> None:
    c = kcluster
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_bytes((c.work / "pki" / "apiserver.crt").read_bytes())
    end_file = tmp_path / "end"
    end_file.write_text(end_stopping_in(8))
    log = tmp_path / "block-queue.log"
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.block_queue"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    docs = run_docs()
    (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    try:
        # Before the stop time: the queue admits.
        c.wait_for(lambda: "block-queue: holding" in log.read_text(), 60, "the queue hold process started")
        assert stop_policy(c) == "None", log.read_text()
        # From the stop time on: held.
        c.wait_for(lambda: stop_policy(c) == "Hold", 60, "the queue held at the runs' stop time")
        assert "stopPolicy Hold" in log.read_text()
        c.apply(docs)
        wl = c.wait_for(lambda: workload_of(c, ns, name), 60, "the run's Workload")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # a held queue admits nothing, however long the run waits
            wl = workload_of(c, ns, name)
            assert not admitted(wl), wl
            time.sleep(0.5)
        assert not (wl or {}).get("status", {}).get("admission"), wl  # no quota held
        got = c.get("pytorchjob", ns, name=name)
        assert got["spec"]["runPolicy"]["suspend"] is True
        # A new block ends later: the hold is lifted and the waiting run is admitted whole.
        end_file.write_text(end_stopping_in(3 * 3600))
        c.wait_for(lambda: stop_policy(c) == "None", 60, "the hold lifted by a later block")
        c.wait_for(lambda: admitted(workload_of(c, ns, name)), 120, "the waiting run admitted")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        c.kubectl("delete", "--ignore-not-found", "-n", ns, "pytorchjob", name)
    assert "stopPolicy None" in log.read_text(), log.read_text()
