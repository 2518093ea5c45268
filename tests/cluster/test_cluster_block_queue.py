"""At a Capacity Block's end Kueue admits nothing more, and a later block lifts that: the real
`python -m trainer.block_queue` (what base/capacity-block runs) against the real Kueue and API server,
with the repository's queues and a generated run, and a block end a few seconds from its stop time.

Before the runs' stop time the ClusterQueue admits; from it on (stopPolicy Hold) a run applied stays
queued, suspended and holding no quota; a new, later end in the file lifts the hold and the waiting run
is admitted whole."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from block_queue_support import admitted, end_stopping_in, run_docs, start_block_queue, stop_policy, workload_of

from tools.cluster.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_the_queue_holds_from_the_runs_stop_time_and_a_later_block_lifts_it(kcluster: Cluster, tmp_path: Path) -> None:
    c = kcluster
    end_file = tmp_path / "end"
    end_file.write_text(end_stopping_in(8))
    log = tmp_path / "block-queue.log"
    proc = start_block_queue(c, tmp_path, end_file, log)
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
