"""Per-cluster Flux entry and infrastructure overlays.

Placeholder: `render_cluster` returns nothing yet; the real renderer builds overlays/clusters/<cluster>/
and overlays/infrastructure/<cluster>/ from the cluster and its runs.
"""
from __future__ import annotations

from typing import Any, Sequence

from generators.model import Cluster, Plan, Repository


def render_cluster(cluster: Cluster, plans: Sequence[Plan], repository: Repository) -> dict[str, Any]:
    """{path relative to the output directory: manifest dict or list of manifest dicts}; no I/O."""
    return {}
