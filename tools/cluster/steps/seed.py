"""Step `crd-seed`: etcd starts from a copy of a data folder that already holds every CRD.

The seed is etcd's data folder after a bare control plane applied every CRD of schemas.crd_files() and
they were Established, made once per set of CRDs (and etcd, API server) and cached: a level then starts
etcd from a copy, and its API server serves the CRDs as soon as it is ready, instead of taking each CRD
in (schema conversion, OpenAPI) at every start. Only CRDs and the API server's own bootstrap objects
are in it; the API server reconciles those (the `kubernetes` Service's endpoints, RBAC) at start.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from tools.cluster import build, processes, schemas
from tools.cluster.cluster import Cluster
from tools.cluster.steps import apiserver, crds, etcd, hosts, pki


def start(c: Cluster) -> None:
    data = crd_seed()
    shutil.copytree(data, c.work / "etcd")
    c.seed = data.parent


def crd_seed() -> Path:
    """The seed's data folder (its parent holds crds.txt, the CRDs in it), made first when missing."""
    h = hashlib.sha256()
    for f in schemas.crd_files():
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(str(build.cached_path("kube-apiserver")).encode() + build.etcd_path().encode())
    base = build.cache_root() / "etcd-seed" / h.hexdigest()[:16]
    data = base / "data"
    if (base / "ready").exists():
        return data
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be making the same seed
        if (base / "ready").exists():
            return data
        maker = Cluster(Path(tempfile.mkdtemp(prefix="seed-", dir=base)))
        try:
            for step in (pki, hosts, etcd, apiserver, crds):  # the api level without a seed
                step.start(maker)
            names = maker.kubectl("get", "crd", "-o", "jsonpath={.items[*].metadata.name}").split()
            (base / "crds.txt").write_text("\n".join(sorted(names)) + "\n")
            for proc_name in ("kube-apiserver", "etcd"):  # etcd last, and cleanly: its data is the seed
                processes.stop(maker.procs.pop(proc_name))
            shutil.rmtree(data, ignore_errors=True)
            os.replace(maker.work / "etcd", data)
            (base / "ready").touch()
        finally:
            maker.stop()
    return data
