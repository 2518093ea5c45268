"""Manifests as validation sees them: YAML documents with their origin, and problems found in them.

Shared by every step of the validation (generators/validation/). The documents come from the one
strict YAML reader, generators/core/yamlio.py (a duplicate key is an error, as it is for kustomize and
the API server).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from generators.core.yamlio import Doc as Doc  # re-exported: the validation steps import it from here
from generators.core.yamlio import error_position

# (group, kind) of the objects the checks look into.
FLUX_KUSTOMIZATION = ("kustomize.toolkit.fluxcd.io", "Kustomization")
HELM_RELEASE = ("helm.toolkit.fluxcd.io", "HelmRelease")
FLUX_SOURCE_GROUP = "source.toolkit.fluxcd.io"
PYTORCHJOB = ("kubeflow.org", "PyTorchJob")


@dataclass(frozen=True, order=True)
class Problem:
    """One finding: `<file>[:<line>]: [<Kind>/<name>: ]<message>`."""

    file: str
    line: int
    obj: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        parts = [where, self.obj, self.message] if self.obj else [where, self.message]
        return " ".join(": ".join(parts).split())


def gvk(data: Any) -> tuple[str, str]:
    """(group, kind) of a manifest; the core group is ""."""
    if not isinstance(data, dict):
        return "", ""
    api = str(data.get("apiVersion") or "")
    return (api.rsplit("/", 1)[0] if "/" in api else ""), str(data.get("kind") or "")


def meta(data: Any, key: str) -> str:
    m = data.get("metadata") if isinstance(data, dict) else None
    return str(m.get(key) or "") if isinstance(m, dict) else ""


def obj_name(data: Any) -> str:
    """`Kind/name` (or `Kind/namespace/name`), as problems name objects."""
    kind = str(data.get("kind") or "?") if isinstance(data, dict) else "?"
    ns, name = meta(data, "namespace"), meta(data, "name") or "?"
    return f"{kind}/{ns}/{name}" if ns else f"{kind}/{name}"


def is_manifest(data: Any) -> bool:
    return isinstance(data, dict) and ("apiVersion" in data or "kind" in data)


def under(path: str, prefix: str) -> bool:
    return prefix in ("", ".") or path == prefix or path.startswith(prefix.rstrip("/") + "/")


def norm(path: str) -> str:
    out = os.path.normpath(path).replace(os.sep, "/")
    return "" if out == "." else out


def walk(value: Any, keys: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(keys, node) for every dict and list inside value, value first; keys is the JSON path."""
    stack = [(keys, value)]
    while stack:
        at, v = stack.pop()
        if isinstance(v, dict):
            yield at, v
            stack.extend((at + (str(k),), x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            yield at, v
            stack.extend((at + (str(i),), x) for i, x in reversed(list(enumerate(v))))


def yaml_error(file: str, err: yaml.YAMLError) -> Problem:
    line, what = error_position(err)
    return Problem(file, line, "", f"YAML: {what}")
