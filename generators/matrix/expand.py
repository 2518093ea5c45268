"""Expand a loaded matrix into runs: the axes product minus exclusions, then the include runs.

The rules (generators/matrix/load.py states the format): every combination of one value per axis,
laid over `defaults` (later axes win on a shared leaf); a product run is dropped when every leaf of an
exclude entry equals its leaf as written; an exclude entry that matches nothing is an error; each
include entry laid over `defaults` is one more run. Fields no entry sets take the defaults of the
schema (generators/matrix/schema.py). The order is the matrix's, and deterministic.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from generators.core.errors import InputError
from generators.matrix.load import Leaf, Matrix
from generators.matrix.schema import DEFAULT_IMAGE, REQUIRED, RUN_FIELDS, Run, cluster_image


def expand(matrix: Matrix) -> list[Run]:
    """Axes product minus exclusions, then the include runs; in matrix order, deterministic."""
    runs: list[Run] = []
    matched = [0] * len(matrix.exclude)
    base = matrix.defaults.leaves
    if matrix.axes:
        excludes = [tuple(e.leaves.items()) for e in matrix.exclude]
        for combo in itertools.product(*(axis.values for axis in matrix.axes)):
            leaves = dict(base)
            for value in combo:
                leaves.update(value.leaves)
            dropped = False
            for i, conditions in enumerate(excludes):
                if all(p in leaves and _same(leaves[p].value, leaf.value) for p, leaf in conditions):
                    matched[i] += 1
                    dropped = True
            if not dropped:
                runs.append(_run(matrix, leaves, "axes", matrix.axes_line))
    for i, count in enumerate(matched):
        if count == 0:
            e = matrix.exclude[i]
            raise InputError(
                "matches no run of the axes product",
                file=matrix.file,
                line=e.line,
                key=e.key,
                fix="correct the values (they must equal the axes values exactly) or remove the entry",
            )
    for entry in matrix.include:
        leaves = dict(base)
        leaves.update(entry.leaves)
        runs.append(_run(matrix, leaves, entry.key, entry.line))
    return runs


def _same(a: Any, b: Any) -> bool:
    """Equal as written: 1, 1.0 and true are three different values."""
    return type(a) is type(b) and a == b


def _run(matrix: Matrix, leaves: Mapping[str, Leaf], entry_key: str, entry_line: int) -> Run:
    fields: dict[str, Any] = {}
    for name, spec in RUN_FIELDS.items():
        leaf = leaves.get(name)
        if leaf is not None:
            fields[name] = leaf.value
        elif spec.default is REQUIRED:
            raise InputError(
                "is required for every run",
                file=matrix.file,
                line=entry_line,
                key=f"{entry_key}.{name}",
                fix=f"set {name} in defaults, in an axis or in this entry",
            )
    cluster = matrix.clusters.get(fields.get("cluster", ""))
    if cluster is not None:
        # The image from the cluster's registry (its region's by default), resolved before the run's
        # name is hashed: a cluster in another region runs (and names) the image it pulls.
        fields["image"] = cluster_image(fields.get("image", DEFAULT_IMAGE), cluster.region, cluster.registry)
    trainer: dict[str, Any] = {}
    for path, leaf in leaves.items():
        if path.startswith("trainer."):
            parts = path.split(".")
            node = trainer
            for part in parts[1:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = leaf.value
    sources = {path: (leaf.line, leaf.key) for path, leaf in leaves.items()}
    return Run(**fields, trainer=trainer, entry_key=entry_key, entry_line=entry_line, sources=sources)
