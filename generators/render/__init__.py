"""Plans -> {path relative to the output directory: manifest}: pure functions, no I/O.

Each renderer takes one cluster's plan (generators/plan/ ClusterPlan) and a Layout (where the output
sits in the repository), never the matrix: runs.py writes a run's overlay, flux.py a cluster's Flux
entry and infrastructure overlays, provisioning.py a cluster's eksctl (and Karpenter) definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from generators.plan import ClusterPlan
from generators.render.flux import KUEUE_QUEUE, render_cluster
from generators.render.layout import OVERLAYS, Layout, layout_for
from generators.render.runs import render_run
from generators.render.trainjob import render_trainjob_run

__all__ = ["Layout", "OVERLAYS", "layout_for", "render"]


def render(plans: Sequence[ClusterPlan], layout: Layout = OVERLAYS) -> dict[str, Any]:
    """Every file generators/expand.py writes: per cluster, its run overlays, Flux entry and
    infrastructure."""
    files: dict[str, Any] = {}
    for i, plan in enumerate(plans):
        queue = KUEUE_QUEUE if plan.cluster.kueue else ""
        render_one = render_trainjob_run if plan.cluster.job_api == "trainjob" else render_run
        for p in plan.runs:
            files.update(render_one(p, layout, queue))
        # The image automation commits to git: one cluster (the first of the matrix) runs it.
        for path, manifest in render_cluster(plan, layout, image_automation=i == 0).items():
            if path in files:
                raise ValueError(f"two renderers produce {path}")
            files[path] = manifest
    return files
