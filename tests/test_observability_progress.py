"""Progress annotations (trainer/progress.py): what is written, how often, and that a failing API never
stops training.

The API here is a real HTTPS server started by the test on loopback (a self-signed certificate made
with openssl, as the cluster harness makes the API server's), which records every request and
answers as told: 200, an error status, or nothing at all (a hung connection). The trainer runs under
real torchrun on CPU with the in-cluster environment pointed at it, or at a port nobody listens on.
On a real kube-apiserver, with the run's generated RBAC: tests/cluster/test_cluster_progress.py.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from observability_support import POD, STEPS, in_cluster_env, run_trainer

from trainer.progress import ProgressPublisher, format_eta, pod_annotations

TOKEN = "sa-token-of-the-run"
NAMESPACE = "fsdp"

RECORD = {
    "step": 120,
    "data_epoch": 1,
    "loss": 1.23456,
    "tokens_per_s": 45210.4,
    "step_time_s": 2.5,
    "time": 1796070000.0,
}


def test_annotations_carry_step_epoch_loss_throughput_and_eta():
    assert pod_annotations(RECORD, 1000) == {
        "fsdp-gitops/step": "120/1000",
        "fsdp-gitops/epoch": "1",
        "fsdp-gitops/loss": "1.2346",
        "fsdp-gitops/tokens-per-second": "45210",
        "fsdp-gitops/eta": "36m40s",  # 880 steps x 2.5 s
        "fsdp-gitops/updated": "2026-11-30T20:20:00Z",
        "fsdp-gitops/checkpoint": "",
        "fsdp-gitops/restarts": "0",
    }
    assert pod_annotations({**RECORD, "step": 1000}, 1000)["fsdp-gitops/eta"] == "done"
    # The last complete checkpoint, and the pod's restarts plus torchrun's worker restarts.
    later = pod_annotations({**RECORD, "restart_count": 1}, 1000, checkpoint=100, restarts=2)
    assert later["fsdp-gitops/checkpoint"] == "100" and later["fsdp-gitops/restarts"] == "3"
    assert [format_eta(s) for s in (0, 59.6, 61, 3600 * 26 + 125)] == ["0s", "1m00s", "1m01s", "26h02m"]


def test_outside_a_cluster_nothing_is_published(tmp_path):
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "FSDP_POD_NAME": POD, "FSDP_SERVICEACCOUNT_DIR": str(tmp_path)}
    assert ProgressPublisher.from_environment(10, env) is None  # no token file
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "namespace").write_text(NAMESPACE)
    for absent in ("KUBERNETES_SERVICE_HOST", "FSDP_POD_NAME"):  # not in a cluster, or a pod that did not ask
        assert ProgressPublisher.from_environment(10, {k: v for k, v in env.items() if k != absent}) is None
    publisher = ProgressPublisher.from_environment(10, env)
    assert publisher is not None
    publisher.close()


class FakeAPI:
    """HTTPS on loopback; `replies` says what each request gets in turn (an int status, or "hang");
    after the list, 200."""

    def __init__(self, workdir: Path, replies: list = ()):
        self.requests: list[dict] = []
        self.replies = list(replies)
        self.release = threading.Event()
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "api.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=fake-api",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
            cwd=workdir,
            check=True,
            capture_output=True,
        )
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_PATCH(self):  # noqa: N802 - the http.server naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                api.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                reply = api.replies.pop(0) if api.replies else 200
                if reply == "hang":
                    api.release.wait(60)  # the client gives up long before
                    return
                self.send_response(reply)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(workdir / "ca.crt", workdir / "api.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def serviceaccount_dir(tmp_path: Path, ca: Path | None = None) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(TOKEN + "\n")
    (sa / "namespace").write_text(NAMESPACE)
    if ca:
        (sa / "ca.crt").write_bytes(ca.read_bytes())
    return sa


@pytest.fixture
def api(tmp_path):
    server = FakeAPI(tmp_path)
    yield server
    server.stop()


def test_publisher_patches_its_pod_with_the_token_and_is_rate_limited(tmp_path, api):
    sa = serviceaccount_dir(tmp_path, tmp_path / "ca.crt")
    publisher = ProgressPublisher.from_environment(1000, in_cluster_env(sa, api.port, 3600))
    for step in range(1, 51):
        publisher.publish({**RECORD, "step": step})
    publisher.publish({**RECORD, "step": 1000}, force=True, done=True)
    publisher.close()
    # The first record, then nothing within the hour but the forced final one (the newest pending
    # record replaces an unsent one, so at most these two reach the API).
    assert 1 <= len(api.requests) <= 2 and publisher.failed == 0
    last = api.requests[-1]
    assert last["path"] == f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"
    assert last["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert last["headers"]["Content-Type"] == "application/merge-patch+json"
    assert last["body"]["metadata"]["annotations"]["fsdp-gitops/step"] == "1000/1000"
    assert last["body"]["metadata"]["annotations"]["fsdp-gitops/eta"] == "done"


@pytest.mark.slow
def test_training_finishes_when_the_api_is_unreachable(tmp_path):
    with socket.socket() as sock:  # a port that refuses connections: bound, never listening
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
        sa = serviceaccount_dir(tmp_path)  # no ca.crt either: the first request fails before any I/O
        log, records = run_trainer(tmp_path, in_cluster_env(sa, dead_port, 0))
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    warnings = [line for line in log.splitlines() if line.startswith("warning: progress annotations")]
    assert len(warnings) == 1, log[-3000:]  # once, not once per step
    assert "training continues" in warnings[0]


@pytest.mark.slow
def test_training_finishes_when_the_api_errors_and_hangs(tmp_path):
    api = FakeAPI(tmp_path, replies=[403, 500, "hang"])
    try:
        sa = serviceaccount_dir(tmp_path, tmp_path / "ca.crt")
        log, records = run_trainer(tmp_path, in_cluster_env(sa, api.port, 0))
    finally:
        api.stop()
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert "warning: progress annotations not published" in log and "HTTP 403" in log
    # It kept trying after the errors and the hung request, and the steps it sent are real ones.
    assert len(api.requests) >= 3
    sent = [int(r["body"]["metadata"]["annotations"]["fsdp-gitops/step"].split("/")[0]) for r in api.requests]
    assert sent == sorted(sent) and set(sent) <= set(range(1, STEPS + 1))
