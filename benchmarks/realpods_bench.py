"""Time the real-pods level (tools/cluster/realpods.py): its warm start and stop, step by step, and the
cold build of the binaries it adds to the harness.

    python benchmarks/realpods_bench.py start                 # 3 warm starts and stops, p4de node + CPU node
    python benchmarks/realpods_bench.py start --repeat 5 --gpu-nodes 2
    python benchmarks/realpods_bench.py builds                # the level's binaries, cold, in empty caches

start: `levels.start("pods", instance_type=p4de.24xlarge, gpu_nodes=N, cpu_node=True)` then `stop()`,
with the binaries, images and prepared containerd root already cached (the first start after a change
prepares them: run once before measuring). Prints each bring-up step (Cluster.timings), the start and
the stop, then the minimum and median of the starts. Target: start within 30 s on 2 cores.

builds: `python -m tools.cluster.build <binary>` for every binary the level adds (pause, the CNI
plugins, runc, containerd with its shim and ctr, CoreDNS), one after the other, into an empty binary
cache, Go module cache and Go build cache under a temporary folder (removed afterwards), so it
downloads from the Go module proxy and compiles everything they need. The kubelet comes from the
harness's Kubernetes module, which the API server's build already compiled: it is timed separately,
into an empty binary cache with the machine's warm Go caches (what it adds to the harness's builds).
Target: at most 10 minutes on 2 cores for the whole addition.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

NEW_BINARIES = (
    "pause",
    "cni-bridge",
    "cni-host-local",
    "cni-loopback",
    "runc",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "coredns",
)


def header(command: str) -> None:
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs")
    print(f"# load average before: {load}")
    print(f"# command: {command}")


def bench_start(repeat: int, gpu_nodes: int) -> None:
    from tools.cluster import levels

    starts = []
    for i in range(repeat):
        t0 = time.monotonic()
        cluster = levels.start("pods", instance_type="p4de.24xlarge", gpu_nodes=gpu_nodes, cpu_node=True)
        start = time.monotonic() - t0
        t1 = time.monotonic()
        cluster.stop()
        stop = time.monotonic() - t1
        starts.append(start)
        steps = {k: round(v, 1) for k, v in cluster.timings.items()}
        print(json.dumps({"run": i + 1, "start_s": round(start, 1), "stop_s": round(stop, 1), "steps": steps}))
    print(f"start: min {min(starts):.1f} s, median {statistics.median(starts):.1f} s over {repeat}")


def bench_builds() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="realpods-builds-"))
    env = {
        **os.environ,
        "FSDP_GITOPS_CACHE": str(tmp / "cache"),
        "GOMODCACHE": str(tmp / "mod"),
        "GOCACHE": str(tmp / "go"),
    }
    total = 0.0
    try:
        for name in NEW_BINARIES:
            t0 = time.monotonic()
            subprocess.run([sys.executable, "-m", "tools.cluster.build", name], cwd=REPO_ROOT, env=env, check=True)
            took = time.monotonic() - t0
            total += took
            print(json.dumps({"binary": name, "cold_s": round(took, 1)}))
        warm_go = {**os.environ, "FSDP_GITOPS_CACHE": str(tmp / "kubelet-cache")}
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "tools.cluster.build", "kubelet"], cwd=REPO_ROOT, env=warm_go, check=True)
        took = time.monotonic() - t0
        total += took
        print(json.dumps({"binary": "kubelet", "after_kube_apiserver_s": round(took, 1)}))
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(tmp)], check=False)  # the module cache is read-only
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"new builds: {total:.0f} s ({total / 60:.1f} min)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("start", help="warm start and stop of the level")
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--gpu-nodes", type=int, default=1)
    sub.add_parser("builds", help="the level's binaries, cold")
    args = ap.parse_args()
    header(shlex.join([sys.executable, *sys.argv]))
    if args.what == "start":
        bench_start(args.repeat, args.gpu_nodes)
    else:
        bench_builds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
