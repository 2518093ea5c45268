"""Runs wait only on what they need: the Flux graph of each committed cluster, and one mistake at a time.

The real bootstrap directories (overlays/clusters/<cluster>) are copied with base/ and overlays/ into a
scratch git tree and walked the way Flux walks them (generators/validation/fluxgraph.py, real
kustomize). The committed tree passes; a run chain that health-checks a GPU-node agent fails, blamed on
the file that defines the Kustomization that waits.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators.core.gotools import tool
from generators.validation.fluxgraph import check_flux
from generators.validation.index import RepoIndex, repo_files
from generators.validation.manifests import Problem

pytestmark = pytest.mark.gotools

CLUSTER = "overlays/clusters/fsdp-p5"
INFRA = f"{CLUSTER}/infrastructure.yaml"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for top in ("base", "overlays"):
        shutil.copytree(REPO_ROOT / top, root / top)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def flux_problems(root: Path) -> list[Problem]:
    repo = RepoIndex(root, repo_files(root))
    parse_problems: list[Problem] = []
    repo.parse(parse_problems)
    problems, _ = check_flux(repo, [CLUSTER], tool("kustomize"))
    return parse_problems + problems


def mutate(root: Path, name: str, change: Callable[[dict], None]) -> str:
    path = root / INFRA
    original = path.read_text()
    docs = list(yaml.safe_load_all(original))
    (doc,) = [d for d in docs if d["metadata"]["name"] == name]
    change(doc["spec"])
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return original


def prerequisite_problems(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if "holds back every new run" in p.message]


def test_the_committed_run_chain_waits_on_no_node_agent(tree):
    assert flux_problems(tree) == []


@pytest.mark.parametrize(
    ("name", "change", "agent"),
    [
        # The old chain: infra-controllers waited for everything it applies, the DaemonSets included.
        ("infra-controllers", lambda spec: spec.update(wait=True), "DaemonSet/device-plugins/"),
        # A health check that names the DCGM exporter (a HelmRelease of a GPU-node DaemonSet).
        (
            "infra-controllers",
            lambda spec: spec["healthChecks"].append(
                {
                    "apiVersion": "helm.toolkit.fluxcd.io/v2",
                    "kind": "HelmRelease",
                    "name": "dcgm-exporter",
                    "namespace": "monitoring",
                }
            ),
            "HelmRelease/monitoring/dcgm-exporter",
        ),
        # A run chain through the node tools' Kustomization, which waits for its DaemonSets.
        (
            "shared-storage",
            lambda spec: spec["dependsOn"].append({"name": "node-tools"}),
            None,
        ),
    ],
)
def test_a_run_chain_that_waits_on_a_gpu_node_agent_fails(tree, name, change, agent):
    original = mutate(tree, name, change)
    try:
        if agent is None:  # node-tools has wait: false: make it wait too, then the chain reaches its DaemonSets
            mutate(tree, "node-tools", lambda spec: spec.update(wait=True))
        found = prerequisite_problems(flux_problems(tree))
    finally:
        (tree / INFRA).write_text(original)
    assert found, "a run waiting on a node agent passed the validation"
    assert all(p.file == INFRA for p in found), [str(p) for p in found]
    if agent:
        assert any(agent in p.message for p in found), [p.message for p in found]
    assert all("run-" not in p.obj and "wait through dependsOn" in p.message for p in found)
