"""Step `crds`: every CRD of tools/cluster/schemas.py, applied server-side (several exceed the
client-side annotation); on an etcd started from the CRD seed (steps/seed.py), only the check that each
is there and that discovery lists their groups."""

from __future__ import annotations

import json

from tools.cluster import schemas
from tools.cluster.cluster import Cluster
from tools.cluster.processes import StartError

CRD_NAMES_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"  # names, not 13 MB of schemas


def start(c: Cluster) -> None:
    if c.seed is not None:
        # The API server is ready only after its CRD informer synced, so the stored CRDs are served;
        # what is left to wait for is discovery listing their groups (kubectl resolves kinds there).
        want = set((c.seed / "crds.txt").read_text().split())  # the seed's own list
        # One read of every stored CRD: under a loaded machine it can take longer than a poll.
        listed = json.loads(c.api_get(CRD_NAMES_PATH, PARTIAL_METADATA, timeout_s=30) or "{}")
        missing = want - {i["metadata"]["name"] for i in listed.get("items", [])}
        if missing:
            raise StartError(f"the seeded etcd lacks CRDs {sorted(missing)}; remove {c.seed}")
        groups = {n.split(".", 1)[1] for n in want}

        def discovered() -> bool:
            found = json.loads(c.api_get("/apis") or "{}")
            return groups <= {g["name"] for g in found.get("groups", [])}

        c.wait_for(discovered, 120, f"discovery listing the CRD groups {sorted(groups)}")
        return
    args = ["apply", "--server-side", "--force-conflicts"]
    for f in schemas.crd_files():
        args += ["-f", str(f)]
    c.kubectl(*args)
    c.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=180s")
