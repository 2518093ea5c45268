"""The harness's process handling: a taken port is a clear error within seconds, and stopping a
component stops everything in its process group."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tools.cluster import processes
from tools.cluster.build import etcd_path

pytestmark = pytest.mark.cluster


def test_a_taken_port_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        proc = processes.start(
            "etcd",
            [
                etcd_path(),
                f"--data-dir={tmp_path / 'data'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                "--listen-peer-urls=http://127.0.0.1:0",
            ],
            tmp_path / "etcd.log",
        )
        try:
            with pytest.raises(processes.StartError, match="address already in use"):
                proc.wait_ready(lambda: False, timeout_s=60, what="serving")
        finally:
            processes.stop(proc)
    assert proc.popen.returncode is not None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    proc = processes.start("wrapper", ["sh", "-c", f"sleep 300 & echo $! > {child_pid}; wait"], tmp_path / "w.log")
    proc.wait_ready(lambda: child_pid.is_file() and child_pid.read_text().strip() != "", 30, "forking")
    child = int(child_pid.read_text())
    processes.stop(proc, timeout_s=5)
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, "the wrapper's child outlived stop()"
        time.sleep(0.1)
    assert proc.pid not in {p.pid for p in processes.running()}
    assert os.getpgid(os.getpid()) != proc.pid


def test_private_tmp_reaches_a_cache_folder_under_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator runs with a /tmp of its own and its certificate folder bind-mounted from the work
    # folder; with the cache folder under /tmp (FSDP_GITOPS_CACHE=/tmp/...) its binary, kubeconfig and
    # certificates must stay reachable at their own paths, and nothing else of the host's /tmp.
    from tools.cluster.cluster import Cluster

    assert str(tmp_path).startswith("/tmp/")
    monkeypatch.setenv("FSDP_GITOPS_CACHE", str(tmp_path / "cache"))
    cluster = Cluster(tmp_path / "cache" / "run" / "cluster-1")
    cluster.work.mkdir(parents=True)
    (cluster.work / "hosts").write_text("127.0.0.1 localhost\n")
    (cluster.work / "kubeconfig").write_text("kubeconfig\n")
    certs = cluster.work / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("certificate\n")
    probe = tmp_path / "cache" / "bin" / "probe"
    probe.parent.mkdir()
    probe.write_text(
        f"#!/bin/sh\ncat /tmp/k8s/certs/tls.crt {cluster.work / 'kubeconfig'}; ls -A /tmp\n"
        f"test ! -e {tmp_path / 'outside'}\necho written > /tmp/k8s/certs/back\n"
    )
    probe.chmod(0o755)
    (tmp_path / "outside").write_text("the host's /tmp\n")
    try:
        proc = cluster.start_process(
            "probe", [str(probe)], private_ns=True, mounts=[(certs, "/tmp/k8s/certs")], private_tmp=True
        )
        assert proc.popen.wait(timeout=30) == 0, proc.tail()
        assert proc.log.read_text().splitlines() == ["certificate", "kubeconfig", "k8s", tmp_path.parts[2]]
        assert (certs / "back").read_text() == "written\n"  # writes land in the work folder
    finally:
        cluster.stop()
