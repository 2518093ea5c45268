"""Rules of one cluster entry that depend on more than one of its fields, or on a format of their own
(generators/matrix/load.py parses the entry and calls these)."""

from __future__ import annotations

import re

from generators.core.yamlio import LineDict
from generators.matrix.fields import field_error
from generators.matrix.schema import JOB_APIS

# A registry host (with an optional port), as the first part of an image reference.
_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"
REGISTRY = re.compile(rf"({_LABEL}(\.{_LABEL})+|localhost)(:[0-9]{{1,5}})?")


def job_api_and_kueue(file: str, data: LineDict, prefix: str, job_api: str, kueue: bool) -> bool:
    """The job API is known, and whether the cluster queues with Kueue: never on a trainjob cluster,
    where `kueue: true` is refused (the pinned Kueue admits a TrainJob with Kubeflow Trainer v2.1 types,
    which drop its runtimePatches, so its JobSet never starts: docs/job-api.md)."""
    if job_api not in JOB_APIS:
        raise field_error(
            file,
            data.key_lines["job_api"],
            f"{prefix}.job_api",
            f"unknown job API {job_api!r}",
            f"use one of {', '.join(JOB_APIS)} (docs/job-api.md says which to choose)",
        )
    if job_api != "trainjob":
        return kueue
    if kueue and "kueue" in data.key_lines:
        raise field_error(
            file,
            data.key_lines["kueue"],
            f"{prefix}.kueue",
            "the pinned Kueue cannot start a TrainJob: it admits it with Kubeflow Trainer v2.1 types,"
            " which drop the TrainJob's runtimePatches, so its JobSet stays suspended",
            "set kueue: false on this cluster, or job_api: pytorchjob to queue its runs (docs/job-api.md)",
        )
    return False


def check_registry(file: str, data: LineDict, prefix: str, registry: str) -> None:
    """`registry`, where set, is a registry host alone."""
    if registry and not REGISTRY.fullmatch(registry):
        raise field_error(
            file,
            data.key_lines["registry"],
            f"{prefix}.registry",
            f"{registry!r} is not a registry host",
            "write the host alone, without scheme or path, e.g. 111122223333.dkr.ecr.eu-west-1.amazonaws.com",
        )
