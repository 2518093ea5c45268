"""The c10d rendezvous from the environment a job API injects, for a torchrun command that leaves it out.

torch.distributed.run reads PET_<FLAG> as the default of each flag, so PET_NNODES and
PET_NPROC_PER_NODE need nothing here. The endpoint does: with `--rdzv-backend=c10d` and no endpoint,
torchrun would serve a store on every node. The two job APIs of the repository (docs/job-api.md) say
where the store is in different ways:

- Kubeflow Trainer v2, torch plugin (pkg/runtime/framework/plugins/torch/torch.go, v2.3.0): PET_NNODES,
  PET_NPROC_PER_NODE, PET_NODE_RANK (the Job's completion index), PET_MASTER_ADDR
  (<job>-node-0-0.<job>, node 0's pod in the JobSet's headless Service) and PET_MASTER_PORT (29500);
- the Training Operator v1 for a Worker-only PyTorchJob (pkg/controller.v1/pytorch/envvar.go, v1.9.4):
  PET_NNODES and PET_NPROC_PER_NODE only, with pods named <job>-worker-<index> (their HOSTNAME), so
  the store is worker 0's, <job>-worker-0:29400 as the generated commands say.

`fill` adds the endpoint, the rendezvous id (the job's name) and which node serves the store
(`is_host` in --rdzv-conf: node rank 0, or worker 0). A command that names its endpoint (the
generated jobs of both APIs do) comes back unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

OPERATOR_POD = re.compile(r"^(?P<job>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-worker-(?P<index>\d+)$")
C10D_PORT = 29400
# torchrun's flags that take no value (torch.distributed.run.get_args_parser).
SWITCHES = frozenset({"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "--module", "-m"})


def _flag(argv: Sequence[str], *names: str) -> tuple[int, str, int] | None:
    """(index, value, number of words) of the first `--name=value` or `--name value` among torchrun's
    own flags (those before the training script or module)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "--module") or not a.startswith("-"):
            return None
        for n in names:
            if a.startswith(n + "="):
                return i, a[len(n) + 1 :], 1
            if a == n and i + 1 < len(argv):
                return i, argv[i + 1], 2
        # `--flag value`: skip the value (torchrun's flags without a value are the switches below).
        i += 2 if "=" not in a and a not in SWITCHES and i + 1 < len(argv) else 1
    return None


def rendezvous(environ: Mapping[str, str]) -> tuple[str, str, bool] | None:
    """(endpoint, job name, this node serves the store) from either job API's environment, or None."""
    master = environ.get("PET_MASTER_ADDR", "")
    if master:  # Kubeflow Trainer v2
        job = master.split(".", 1)[1] if "." in master else master
        return f"{master}:{environ.get('PET_MASTER_PORT') or C10D_PORT}", job, environ.get("PET_NODE_RANK") == "0"
    pod = OPERATOR_POD.match(environ.get("HOSTNAME", ""))
    if pod:  # Training Operator v1
        return f"{pod['job']}-worker-0:{C10D_PORT}", pod["job"], pod["index"] == "0"
    return None


def fill(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """torchrun's argv with the c10d rendezvous it lacks taken from the job API's environment."""
    argv = list(argv)
    backend = _flag(argv, "--rdzv-backend", "--rdzv_backend")
    if (backend[1] if backend else environ.get("PET_RDZV_BACKEND", "")) != "c10d":
        return argv
    if _flag(argv, "--rdzv-endpoint", "--rdzv_endpoint") or environ.get("PET_RDZV_ENDPOINT"):
        return argv
    found = rendezvous(environ)
    if found is None:
        return argv
    endpoint, job, is_host = found
    extra = [f"--rdzv-endpoint={endpoint}"]
    if not _flag(argv, "--rdzv-id", "--rdzv_id") and not environ.get("PET_RDZV_ID"):
        extra.append(f"--rdzv-id={job}")
    host = f"is_host={str(is_host).lower()}"
    conf = _flag(argv, "--rdzv-conf", "--rdzv_conf")
    if conf is None:
        extra.append(f"--rdzv-conf={host}")
    elif "is_host" not in {kv.split("=", 1)[0].strip() for kv in conf[1].split(",")}:
        del argv[conf[0] : conf[0] + conf[2]]
        extra.append(f"--rdzv-conf={conf[1]},{host}" if conf[1] else f"--rdzv-conf={host}")
    return extra + argv
