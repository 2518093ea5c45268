"""Data staging of each cluster: one Job per dataset its runs read (pure: ClusterPlan -> manifests).

For cluster `<c>` and each dataset `<d>` (the directory of a run's `trainer.data.path` under
/shared/data/), paths relative to the output directory:

    infrastructure/<c>/data/kustomization.yaml       lists the datasets below
    infrastructure/<c>/data/<d>/kustomization.yaml   base/data-staging in the run namespace + the patch
    infrastructure/<c>/data/<d>/job.data.yaml        Job stage-<d>: trainer.prepare_data for <d>

Flux applies infrastructure/<c>/data as Kustomization `data-staging` (generators/render/flux.py:
wait, so it is Ready once every Job completed; force, so a Job whose template changed is replaced),
and every run of the cluster depends on it: no PyTorchJob, so no GPU node, before its data exists.
A dataset is staged when the run reads /shared/data/<d>/train.jsonl and <d> is a public dataset this
module knows (PUBLIC_DATASETS); a run reading any other directory under /shared/data still waits for
its marker, which whoever puts the data there writes with the same command
(base/data-staging/README.md).
"""

from __future__ import annotations

import posixpath
from typing import Any

from generators.core.writer import JsonPatch
from generators.matrix.schema import base_image_override
from generators.plan import ClusterPlan
from generators.render.layout import Layout
from generators.render.runs import SHARED_DATA_ROOT, data_marker

DATA_BASE = "base/data-staging"
BASE_JOB_NAME = "stage-data"
KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
# Directory name under /shared/data -> the Hugging Face hub dataset trainer.prepare_data downloads.
# samsum: the parquet copy (the original repository needs a loading script that `datasets` no
# longer runs); alpaca: the Stanford Alpaca instruction data.
PUBLIC_DATASETS = {"samsum": "knkarthick/samsum", "alpaca": "tatsu-lab/alpaca"}
_CONTAINER = "/spec/template/spec/containers/0"
TRAIN_FILE = "train.jsonl"


def staged_datasets(plan: ClusterPlan) -> dict[str, tuple[str, str]]:
    """Dataset directory name -> (hub dataset, format) for every staged dataset the cluster's runs read."""
    out: dict[str, tuple[str, str]] = {}
    for p in plan.runs:
        if not data_marker(p):
            continue
        name = posixpath.basename(posixpath.dirname(p.trainer.data.path))
        # prepare_data writes the train split as train.jsonl; other files of the directory are not staged.
        if name in PUBLIC_DATASETS and p.trainer.data.path == f"{SHARED_DATA_ROOT}{name}/{TRAIN_FILE}":
            out.setdefault(name, (PUBLIC_DATASETS[name], p.trainer.data.format))
    return dict(sorted(out.items()))


def job_patch(name: str, dataset: str, fmt: str) -> JsonPatch:
    return JsonPatch(
        ops=(
            {"op": "test", "path": f"{_CONTAINER}/name", "value": "prepare"},
            {"op": "test", "path": "/spec/template/spec/volumes/0/name", "value": "shared"},
            {"op": "replace", "path": "/metadata/name", "value": f"stage-{name}"},
            {
                "op": "replace",
                "path": f"{_CONTAINER}/command",
                "value": [
                    "python",
                    "-m",
                    "trainer.prepare_data",
                    "--dataset",
                    dataset,
                    "--format",
                    fmt,
                    "--out",
                    SHARED_DATA_ROOT + name,
                ],
            },
        )
    )


def render_data(plan: ClusterPlan, layout: Layout) -> dict[str, Any]:
    """The data overlay of one cluster; empty when its runs read no staged dataset."""
    datasets = staged_datasets(plan)
    if not datasets:
        return {}
    c = plan.cluster.name
    top = f"infrastructure/{c}/data"
    out: dict[str, Any] = {
        f"{top}/kustomization.yaml": {
            "apiVersion": KUSTOMIZE_API,
            "kind": "Kustomization",
            "resources": list(datasets),
            # The staging Jobs' trainer image from the cluster's registry.
            **({"images": moved} if (moved := base_image_override(plan.cluster)) else {}),
        },
    }
    for name, (dataset, fmt) in datasets.items():
        out[f"{top}/{name}/kustomization.yaml"] = {
            "apiVersion": KUSTOMIZE_API,
            "kind": "Kustomization",
            "namespace": plan.cluster.namespace,
            "resources": [layout.to_repo(f"{top}/{name}", DATA_BASE)],
            "patches": [
                {
                    "path": "job.data.yaml",
                    "target": {"group": "batch", "version": "v1", "kind": "Job", "name": BASE_JOB_NAME},
                }
            ],
        }
        out[f"{top}/{name}/job.data.yaml"] = job_patch(name, dataset, fmt)
    return out
