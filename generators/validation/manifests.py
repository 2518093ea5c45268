"""Manifests as validation sees them: YAML documents with their origin, and problems found in them.

Shared by the validation pipeline (generators/validate.py) and its semantic checks
(generators/semantics.py). YAML is loaded strictly: a duplicate key is an error, as it is for kustomize
and the API server.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import yaml

from trainer.config import NoDuplicateKeys

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


@dataclass(frozen=True)
class Doc:
    """A YAML document and where it comes from (a file, or the kustomization that built it)."""

    data: Any
    file: str
    line: int = 0


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


# libyaml's loader when PyYAML has it (several times faster on build outputs), else the pure-Python one.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StrictLoader(NoDuplicateKeys, SafeLoader):  # type: ignore[misc, valid-type]
    """Safe loader that rejects duplicate keys (kustomize and the API server reject them too)."""


def load_documents(text: str, file: str, loader: type = StrictLoader) -> list[Doc]:
    """The non-empty documents of a YAML text, each with its first line. Raises yaml.YAMLError."""
    ld = loader(text)
    try:
        docs = []
        while ld.check_node():
            node = ld.get_node()
            data = ld.construct_document(node)
            if data is not None:
                docs.append(Doc(data, file, node.start_mark.line + 1))
        return docs
    finally:
        ld.dispose()


def yaml_error(file: str, err: yaml.YAMLError) -> Problem:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = mark.line + 1 if mark is not None else 0
    what = " ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x) or str(err)
    return Problem(file, line, "", f"YAML: {what}")
