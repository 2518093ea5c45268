"""Hold a cluster's Kueue ClusterQueue before its EC2 Capacity Block ends, so no run starts that could
not finish.

Each run stops itself with a checkpoint at its stop time (trainer/capacity_block.py: the block's end,
minus AWS's 30-minute termination lead, the run's checkpoint grace and a margin). A run that Kueue
admits after that moment would fail at once (a permanent exit), and one admitted after the end would
hold quota for nodes that never come. So this process, one small Deployment per Capacity Block cluster
(base/capacity-block), sets the ClusterQueue's `spec.stopPolicy` to `Hold` from the earliest stop
time of the cluster's runs (FSDP_TERM_GRACE_S: the longest grace of its runs) on: Kueue admits nothing
more, queued runs stay queued without holding quota, and runs already admitted run to their own stop.
A later end in the ConfigMap (an extended or a new block) lifts the hold again (`stopPolicy: None`). With
no queued or running pods left, the cluster autoscaler scales the GPU node group (minSize 0) to zero
after its scale-down-unneeded-time (with --karpenter, Karpenter removes the empty nodes after the
NodePools' consolidateAfter: tests/cluster/test_cluster_block_end_nodes.py).

It reads the same file the runs read (FSDP_CAPACITY_BLOCK_FILE, the mounted ConfigMap
fsdp-capacity-block) every FSDP_CAPACITY_BLOCK_POLL_S seconds, and talks to the API server with the
pod's service-account credentials (FSDP_SERVICEACCOUNT_DIR, default the standard mount; the address in
KUBERNETES_SERVICE_HOST/PORT): GET, then a JSON merge patch of the ClusterQueue only when the policy
differs. Each change is one line on stdout; an API failure is one line on stderr and is retried at the
next poll. Run it as `python -m trainer.block_queue`.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from trainer import capacity_block

QUEUE_ENV = "FSDP_CLUSTER_QUEUE"
SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CLUSTER_QUEUES = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
HOLD, NONE = "Hold", "None"


def desired_policy(end_text: str, now: float, grace_s: float) -> str:
    """`Hold` from the runs' stop time of the block that ends at `end_text` on, else `None`."""
    end = capacity_block.parse_end(end_text)
    if end is None:
        return NONE
    return HOLD if now >= capacity_block.stop_time(end, grace_s) else NONE


class Api:
    """GET and merge-PATCH of one ClusterQueue with in-cluster credentials."""

    def __init__(self, environ: Mapping[str, str], queue: str):
        sa_dir = environ.get("FSDP_SERVICEACCOUNT_DIR", SERVICEACCOUNT_DIR)
        host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SystemExit("error: KUBERNETES_SERVICE_HOST is not set: run this in a pod of the cluster")
        host = f"[{host}]" if ":" in host else host
        self.url = f"https://{host}:{port}{CLUSTER_QUEUES}/{queue}"
        self.token_path = os.path.join(sa_dir, "token")
        self.context = ssl.create_default_context(cafile=os.path.join(sa_dir, "ca.crt"))

    def request(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with open(self.token_path, encoding="utf-8") as fh:
            token = fh.read().strip()  # re-read: projected tokens are rotated
        req = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                **({"Content-Type": "application/merge-patch+json"} if body is not None else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=10, context=self.context) as resp:
            return dict(json.loads(resp.read()))


def reconcile(api: Api, end_text: str, now: float, grace_s: float) -> str | None:
    """Set the ClusterQueue's stopPolicy to the desired one; the new policy when it changed, else None."""
    want = desired_policy(end_text, now, grace_s)
    have = (api.request("GET").get("spec") or {}).get("stopPolicy") or NONE
    if have == want:
        return None
    api.request("PATCH", {"spec": {"stopPolicy": want}})
    return want


def main(environ: Mapping[str, str] = os.environ) -> int:
    queue = environ.get(QUEUE_ENV, "fsdp")
    path = environ.get(capacity_block.FILE_ENV, "")
    if not path:
        print(
            f"error: {capacity_block.FILE_ENV} is not set (the mounted ConfigMap fsdp-capacity-block)", file=sys.stderr
        )
        return 2
    try:
        grace_s = float(environ.get(capacity_block.GRACE_ENV, "30"))
        poll_s = float(environ.get(capacity_block.POLL_ENV, str(capacity_block.POLL_S)))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    api = Api(environ, queue)
    print(f"block-queue: holding ClusterQueue {queue} from the runs' stop time of the block in {path}", flush=True)
    while True:
        try:
            with open(path, encoding="utf-8") as fh:
                end_text = fh.read()
            changed = reconcile(api, end_text, time.time(), grace_s)
            if changed:
                why = "the block's runs stop now" if changed == HOLD else "no block ends soon"
                print(
                    f"block-queue: ClusterQueue {queue} stopPolicy {changed} ({why}; end {end_text.strip() or 'none'})",
                    flush=True,
                )
        except capacity_block.BadEndTime as e:
            print(f"error: {path}: {e}", file=sys.stderr, flush=True)
        except (OSError, urllib.error.URLError, ValueError) as e:
            reason = f"HTTP {e.code}" if isinstance(e, urllib.error.HTTPError) else f"{type(e).__name__}: {e}"
            print(
                f"warning: ClusterQueue {queue} not reconciled ({reason}); retrying in {poll_s:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(poll_s)


if __name__ == "__main__":
    sys.exit(main())
