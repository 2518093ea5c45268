"""Only what Flux applies reaches the cluster: each cluster's GitRepository (overlays/clusters/<c>/sources.yaml,
rendered by generators/render/flux.py) ignores everything but base/ and overlays/, and the eksctl and
CloudFormation definitions under overlays/provisioning/ too, while every path a Flux Kustomization of
the cluster builds stays in.

The ignore rules are applied to the repository's tracked files with gitignore semantics (pathspec's
GitIgnoreSpec, the rules source-controller applies to spec.ignore).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pathspec
import pytest
import yaml
from support import REPO_ROOT

from generators.matrix import load
from generators.render import layout_for
from generators.render.flux import git_repository

CLUSTERS = sorted(p.name for p in (REPO_ROOT / "overlays" / "clusters").iterdir() if p.is_dir())


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


def synced(ignore: str, files: list[str]) -> list[str]:
    """The files of `files` that a GitRepository with spec.ignore = `ignore` puts in its artifact."""
    spec = pathspec.GitIgnoreSpec.from_lines(ignore.splitlines())
    return [f for f in files if not spec.match_file(f)]


def source_of(cluster: str) -> dict:
    (source,) = [
        d
        for d in yaml.safe_load_all((REPO_ROOT / "overlays" / "clusters" / cluster / "sources.yaml").read_text())
        if d and d.get("kind") == "GitRepository"
    ]
    return source


def test_the_committed_sources_are_what_the_generator_renders() -> None:
    m = load(str(REPO_ROOT / "matrix.yaml"))
    rendered = git_repository(m.repository, layout_for(REPO_ROOT / "overlays", REPO_ROOT))
    for cluster in CLUSTERS:
        assert source_of(cluster)["spec"]["ignore"] == rendered["spec"]["ignore"]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_synced_tree_holds_no_eksctl_or_cloudformation_definition(cluster: str) -> None:
    files = tracked_files()
    provisioning = [f for f in files if f.startswith("overlays/provisioning/")]
    assert f"overlays/provisioning/{cluster}/eksctl.yaml" in provisioning  # the premise: they are tracked
    kept = synced(source_of(cluster)["spec"]["ignore"], files)
    assert not set(kept) & set(provisioning), sorted(set(kept) & set(provisioning))
    for f in kept:
        if f.endswith((".yaml", ".yml")):
            text = (REPO_ROOT / f).read_text()
            assert not re.search(r"^kind: ClusterConfig\b", text, re.M), f"{f}: an eksctl ClusterConfig is synced"
            assert "AWSTemplateFormatVersion" not in text, f"{f}: a CloudFormation template is synced"


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_every_path_flux_builds_is_synced(cluster: str) -> None:
    files = tracked_files()
    kept = set(synced(source_of(cluster)["spec"]["ignore"], files))
    paths = [
        d["spec"]["path"]
        for f in sorted((REPO_ROOT / "overlays" / "clusters" / cluster).glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and d.get("kind") == "Kustomization" and d.get("apiVersion", "").startswith("kustomize.toolkit.fluxcd.io/")
    ]
    assert paths
    for path in paths:
        folder = Path(path).as_posix().removeprefix("./")
        assert f"{folder}/kustomization.yaml" in kept, f"{path}: Flux builds it but the GitRepository ignores it"
    # base/ is what the overlays build on.
    assert all(f in kept for f in files if f.startswith("base/"))


def test_the_rules_would_catch_a_definition_in_the_synced_tree() -> None:
    """The check above can fail: without the provisioning rule, the eksctl files are synced."""
    ignore = source_of(CLUSTERS[0])["spec"]["ignore"]
    loose = "\n".join(line for line in ignore.splitlines() if "provisioning" not in line)
    assert any(f.startswith("overlays/provisioning/") for f in synced(loose, tracked_files()))
