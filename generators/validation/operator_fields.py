"""Fields the Training Operator interprets, held to the values it accepts.

The PyTorchJob CRD of kubeflow/training-operator v1.9 declares most of its fields as plain strings (no
enum in the OpenAPI schema), so kubeconform and the API server accept `restartPolicy: Exitcode` or
`cleanPodPolicy: Succeeded`, and the job then behaves differently from what the file says: the operator
compares those strings with its constants and treats anything else as none of them (a typo in
restartPolicy never restarts a pod). The values below are the constants of v1.9
(pkg/apis/kubeflow.org/v1/common_types.go, pytorch_types.go), and the structure rules are its admission
webhook's (pkg/webhooks/pytorch/pytorchjob_webhook.go, validatePyTorchReplicaSpecs), checked here so
that a pull request fails before a cluster refuses it:

- replica types Master and Worker only; Master has exactly 1 replica, Worker at least 1;
- every replica has a container named `pytorch` with an image (the operator's default container: its
  exit code decides restarts, it gets the rendezvous environment);
- replica `restartPolicy`: Always, OnFailure, Never or ExitCode;
- `runPolicy.cleanPodPolicy`: All, Running or None;
- `elasticPolicy.rdzvBackend`: c10d, etcd or etcd-v2; torchrun's `--rdzv-backend` in a container's
  command (torchrun, python -m torch.distributed.run, python -m trainer.launch): those or static;
- `nprocPerNode`: auto, cpu, gpu or a whole number.
Each problem is blamed on the file that set the field (the run's patch, the base).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from generators.validation.manifests import PYTORCHJOB, Doc, Problem, gvk
from generators.validation.semantics import Blame, reporter

REPLICA_TYPES = ("Master", "Worker")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
# torchrun accepts the operator's backends and its own static rendezvous.
TORCHRUN_RDZV_BACKENDS = (*RDZV_BACKENDS, "static")
NPROC_WORDS = ("auto", "cpu", "gpu")
DEFAULT_CONTAINER = "pytorch"
_TORCHRUN_MODULES = ("torch.distributed.run", "trainer.launch")


def _one_of(value: Any, allowed: Sequence[str]) -> bool:
    return isinstance(value, str) and value in allowed


def _launches_torchrun(command: Sequence[str]) -> bool:
    if not command:
        return False
    if command[0].rsplit("/", 1)[-1] == "torchrun":
        return True
    return any(command[i] == "-m" and command[i + 1] in _TORCHRUN_MODULES for i in range(len(command) - 1))


def _rdzv_backends(command: Sequence[str]) -> list[tuple[int, str]]:
    """(index in the command, value) of torchrun's --rdzv-backend / --rdzv_backend."""
    out = []
    for i, token in enumerate(command):
        for flag in ("--rdzv-backend", "--rdzv_backend"):
            if token == flag and i + 1 < len(command):
                out.append((i + 1, command[i + 1]))
            elif token.startswith(flag + "="):
                out.append((i, token.split("=", 1)[1]))
    return out


def check_operator_fields(docs: Sequence[Doc], blame: Blame = lambda doc, keys: doc.file) -> list[Problem]:
    """The values and structure the Training Operator accepts, on every PyTorchJob."""
    problems: list[Problem] = []
    for d in docs:
        if not isinstance(d.data, dict) or gvk(d.data) != PYTORCHJOB:
            continue
        bad = reporter(problems, d, blame)
        spec = d.data.get("spec") or {}
        policy = (spec.get("runPolicy") or {}).get("cleanPodPolicy")
        if policy is not None and not _one_of(policy, CLEAN_POD_POLICIES):
            bad(
                ("spec", "runPolicy", "cleanPodPolicy"),
                f"cleanPodPolicy {policy!r} is not one the operator knows; use one of {', '.join(CLEAN_POD_POLICIES)}",
            )
        backend = (spec.get("elasticPolicy") or {}).get("rdzvBackend")
        if backend is not None and not _one_of(backend, RDZV_BACKENDS):
            bad(
                ("spec", "elasticPolicy", "rdzvBackend"),
                f"elasticPolicy.rdzvBackend {backend!r} is not one the operator knows; use one of "
                f"{', '.join(RDZV_BACKENDS)}",
            )
        nproc = spec.get("nprocPerNode")
        if nproc is not None and not (str(nproc) in NPROC_WORDS or str(nproc).isdigit()):
            bad(("spec", "nprocPerNode"), f"nprocPerNode {nproc!r}: use auto, cpu, gpu or a whole number")
        replicas = spec.get("pytorchReplicaSpecs")
        if not isinstance(replicas, dict) or not replicas:
            bad(("spec",), "no pytorchReplicaSpecs: give the job a Worker (and at most one Master)")
            continue
        for role, replica in replicas.items():
            at = ("spec", "pytorchReplicaSpecs", str(role))
            if role not in REPLICA_TYPES:
                bad(at, f"replica type {role!r} is not one the operator knows; use {' or '.join(REPLICA_TYPES)}")
            replica = replica if isinstance(replica, dict) else {}
            restart = replica.get("restartPolicy")
            if restart is not None and not _one_of(restart, RESTART_POLICIES):
                bad(
                    at + ("restartPolicy",),
                    f"{role}: restartPolicy {restart!r} is not one the operator knows; use one of "
                    f"{', '.join(RESTART_POLICIES)}",
                )
            count = replica.get("replicas")
            if role == "Master" and count != 1:
                bad(at + ("replicas",), f"Master: replicas is {count}; the operator requires exactly 1")
            elif role != "Master" and count is not None and not (isinstance(count, int) and count >= 1):
                bad(at + ("replicas",), f"{role}: replicas is {count}; use at least 1")
            pod = (replica.get("template") or {}).get("spec") or {}
            containers = [c for c in pod.get("containers") or [] if isinstance(c, dict)]
            main = [i for i, c in enumerate(containers) if c.get("name") == DEFAULT_CONTAINER]
            if not main:
                bad(
                    at + ("template", "spec", "containers"),
                    f"{role}: no container named {DEFAULT_CONTAINER}; the operator reads that container's exit "
                    "code and gives it the rendezvous environment",
                )
            for i, c in enumerate(containers):
                c_at = at + ("template", "spec", "containers", str(i))
                if not c.get("image"):
                    bad(c_at, f"{role}: container {c.get('name')} has no image")
                for key in ("command", "args"):
                    tokens = [str(t) for t in c.get(key) or []]
                    if key == "args" or _launches_torchrun(tokens):
                        for j, value in _rdzv_backends(tokens):
                            if value not in TORCHRUN_RDZV_BACKENDS:
                                bad(
                                    c_at + (key, str(j)),
                                    f"{role}: torchrun --rdzv-backend {value!r} is not a rendezvous backend; use one "
                                    f"of {', '.join(TORCHRUN_RDZV_BACKENDS)}",
                                )
    return problems
