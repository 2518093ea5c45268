"""Training progress as annotations on the run's API object, through the in-cluster API.

Global rank 0 writes, at most every FSDP_PROGRESS_INTERVAL_S seconds (default 30) and once at the
end, these annotations on the pod it runs in (a PyTorchJob's pods: `kubectl describe pod`, or
`kubectl get pods -l training.kubeflow.org/job-name=<run> -o custom-columns=...`), or on the TrainJob
itself (`kubectl get trainjob <run> -o yaml`); `python generators/status.py` lists them for every run:

    fsdp-gitops/step               "120/1000"  last logged optimizer step / total steps
    fsdp-gitops/epoch              "0"         data epoch (0-based)
    fsdp-gitops/loss               "1.2345"
    fsdp-gitops/tokens-per-second  "45210"     the whole job's non-padding tokens per second
    fsdp-gitops/eta                "1h02m"     remaining steps x the last step time ("done" at the end)
    fsdp-gitops/updated            RFC 3339 UTC time of the record
    fsdp-gitops/checkpoint         step of the last complete checkpoint of this launch ("" before one)
    fsdp-gitops/restarts           restarts of this run: the pod's (FSDP_RESTARTS, counted by
                                   trainer.attempts) plus torchrun's worker restarts in this pod

It is a JSON merge patch of the object's metadata, sent with the standard in-cluster credentials: the
service-account token and CA under /var/run/secrets/kubernetes.io/serviceaccount and the API address in
KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT. Which object:
- FSDP_TRAINJOB_NAME set (a TrainJob run: the generated TrainJob sets it to its own name): PATCH
  /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>. Kubeflow Trainer 2.3.0 also has
  a status of its own for this (status.trainerStatus: progressPercentage, estimatedRemainingSeconds,
  metrics), written by a status server in the controller that the trainer POSTs to; it is alpha, behind
  the TrainJobStatus feature gate (off by default), so the runs use annotations, which need nothing but
  RBAC and read the same way for both job APIs.
- else FSDP_POD_NAME set (a PyTorchJob run: the pod template sets it from the downward API,
  metadata.name): PATCH /api/v1/namespaces/<ns>/pods/<pod>.
Neither set: nothing is written, so a trainer started in some other pod, a CI runner for example, never
writes anywhere. Each run has its own ServiceAccount whose Role allows only `patch` on that run's pods
by name, or on its TrainJob by name (generated with the run's overlay).

Publishing never stops or slows training: requests run on one background thread that sends only
the newest record (older ones are dropped), each with a short timeout; a failure (no API, refused,
403, timeout) is printed as one warning line, then again at most every 10 minutes, and training
goes on. Without FSDP_POD_NAME, an API address or a token nothing is published.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PREFIX = "fsdp-gitops/"
TRAINJOB_ENV = "FSDP_TRAINJOB_NAME"
RESTARTS_ENV = "FSDP_RESTARTS"  # set by trainer.attempts in the launcher
TRAINJOBS_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
WARN_EVERY_S = 600.0


def format_eta(seconds: float) -> str:
    """'45s', '12m05s', '3h07m': minutes and seconds are enough to plan around."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def pod_annotations(
    record: Mapping[str, Any], total_steps: int, *, done: bool = False, checkpoint: int | None = None, restarts: int = 0
) -> dict[str, str]:
    """The annotations for one metrics record (trainer.metrics.MetricsLogger.step_done)."""
    remaining = max(0, total_steps - record["step"])
    when = dt.datetime.fromtimestamp(record["time"], dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        PREFIX + "step": f"{record['step']}/{total_steps}",
        PREFIX + "epoch": str(record["data_epoch"]),
        PREFIX + "loss": f"{record['loss']:.4f}",
        PREFIX + "tokens-per-second": f"{record['tokens_per_s']:.0f}",
        PREFIX + "eta": "done" if done or not remaining else format_eta(remaining * record["step_time_s"]),
        PREFIX + "updated": when,
        PREFIX + "checkpoint": "" if checkpoint is None else str(checkpoint),
        PREFIX + "restarts": str(restarts + int(record.get("restart_count", 0))),
    }


def _restarts(environ: Mapping[str, str]) -> int:
    raw = environ.get(RESTARTS_ENV, "")
    return int(raw) if raw.isdigit() else 0


class ProgressPublisher:
    """Patches annotations onto one API object from a background thread; see the module docstring."""

    def __init__(
        self,
        *,
        url: str,
        token_path: str,
        ca_path: str,
        total_steps: int,
        interval_s: float = 30.0,
        timeout_s: float = 5.0,
        restarts: int = 0,
    ):
        self.url, self.token_path, self.ca_path, self.total_steps = url, token_path, ca_path, total_steps
        self.interval_s, self.timeout_s, self.restarts = interval_s, timeout_s, restarts
        self.checkpoint: int | None = None  # step of the last complete checkpoint
        self._context: ssl.SSLContext | None = None  # made on first use, where a missing CA is just a failure
        self.sent = 0  # successful patches
        self.failed = 0  # failed patches
        self._last_submit = -float("inf")
        self._last_warning = -float("inf")
        self._pending: dict[str, str] | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="progress-publisher", daemon=True)
        self._thread.start()

    @classmethod
    def from_environment(cls, total_steps: int, environ: Mapping[str, str] = os.environ) -> ProgressPublisher | None:
        """The publisher for this run, or None when the pod does not ask for it (neither
        FSDP_TRAINJOB_NAME nor FSDP_POD_NAME) or is not in a cluster (no API address or token)."""
        sa_dir = environ.get("FSDP_SERVICEACCOUNT_DIR", SERVICEACCOUNT_DIR)
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
        trainjob, pod = environ.get(TRAINJOB_ENV), environ.get("FSDP_POD_NAME")
        token_path = os.path.join(sa_dir, "token")
        if not host or not (trainjob or pod) or not os.path.isfile(token_path):
            return None
        try:
            with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as fh:
                namespace = fh.read().strip()
        except OSError:
            return None
        host = f"[{host}]" if ":" in host else host  # IPv6 service address
        base = f"https://{host}:{port}"
        if trainjob:
            url = f"{base}{TRAINJOBS_PATH}/namespaces/{namespace}/trainjobs/{trainjob}"
        else:
            url = f"{base}/api/v1/namespaces/{namespace}/pods/{pod}"
        try:
            interval_s = float(environ.get("FSDP_PROGRESS_INTERVAL_S", "30"))
        except ValueError:
            interval_s = 30.0
        return cls(
            url=url,
            token_path=token_path,
            ca_path=os.path.join(sa_dir, "ca.crt"),
            total_steps=total_steps,
            interval_s=interval_s,
            restarts=_restarts(environ),
        )

    def note_checkpoint(self, step: int) -> None:
        """The last complete checkpoint, named in the next record's annotations."""
        self.checkpoint = step

    def publish(self, record: Mapping[str, Any] | None, *, force: bool = False, done: bool = False) -> None:
        """Queue `record` if the interval has passed (or force); never blocks on the network."""
        if record is None:
            return
        now = time.monotonic()
        if not force and now - self._last_submit < self.interval_s:
            return
        self._last_submit = now
        with self._cond:
            self._pending = pod_annotations(
                record, self.total_steps, done=done, checkpoint=self.checkpoint, restarts=self.restarts
            )
            self._cond.notify()

    def close(self, wait_s: float = 5.0) -> None:
        """Send what is queued (waiting at most wait_s), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(wait_s)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closing:
                    self._cond.wait()
                body, self._pending = self._pending, None
                closing = self._closing
            if body is not None:
                self._send(body)
            if closing and body is None:
                return

    def _send(self, body: dict[str, str]) -> None:
        try:
            if self._context is None:
                self._context = ssl.create_default_context(cafile=self.ca_path)
            with open(self.token_path, encoding="utf-8") as fh:
                token = fh.read().strip()  # re-read: projected tokens are rotated by the kubelet
            data = json.dumps({"metadata": {"annotations": body}}).encode()
            req = urllib.request.Request(
                self.url,
                data=data,
                method="PATCH",
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/merge-patch+json",
                    "Accept": "application/json",
                },
            )
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._context) as resp:
                resp.read()
            self.sent += 1
        except Exception as e:  # noqa: BLE001 - any failure here must leave training running
            self.failed += 1
            now = time.monotonic()
            if now - self._last_warning >= WARN_EVERY_S:
                self._last_warning = now
                reason = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else f"{type(e).__name__}: {e}"
                print(
                    f"warning: progress annotations not published to {self.url} ({reason}); training continues",
                    file=sys.stderr,
                    flush=True,
                )
