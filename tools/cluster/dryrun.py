"""Level 1: every overlay Flux applies is accepted by a real API server with the real CRDs.

    problems = server_dry_run(cluster, REPO_ROOT)          # [] when every overlay is accepted
    python -m tools.cluster.dryrun [PATH ...]               # start an API server, check, stop
    python generators/validate.py --server                  # the same after the static validation

The overlays are the ones the clusters' Flux entry points name: overlays/clusters/<cluster> itself
and every path of its Flux Kustomizations that read this repository (runs, infrastructure,
secrets, image automation). Each is rendered as kustomize-controller renders it (kustomize build
with LoadRestrictionsNone; a folder without a kustomization file as its YAML files; the `sops`
metadata of an encrypted Secret removed, as Flux's decryption does) and sent with
`kubectl apply --dry-run=server --server-side`, which runs the API server's schema validation
(strict field validation: unknown fields are errors), CEL rules and defaulting without storing
anything. The namespaces the overlays use are created first: a dry-run does not create a Namespace
from the same request. A problem is one line: `<overlay path>: <the API server's message>`.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build, levels
from tools.cluster.cluster import Cluster

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
REPO_SOURCE = "fsdp-gitops"  # the GitRepository every cluster's Flux syncs (overlays/clusters/<c>/sources.yaml)


def overlay_paths(root: Path) -> list[str]:
    """Repository-relative folders Flux applies, for every cluster under overlays/clusters/."""
    paths = set()
    for cluster_dir in sorted((root / "overlays" / "clusters").iterdir()):
        if not cluster_dir.is_dir():
            continue
        paths.add(str(cluster_dir.relative_to(root)))
        for doc in _plain_docs(cluster_dir):
            spec = doc.get("spec") or {}
            if doc.get("kind") == "Kustomization" and spec.get("sourceRef", {}).get("name") == REPO_SOURCE:
                paths.add(spec["path"].removeprefix("./").rstrip("/"))
    return sorted(paths)


def _plain_docs(folder: Path) -> list[dict[str, Any]]:
    docs = []
    for f in sorted(folder.rglob("*.y*ml")):
        if f.suffix in (".yaml", ".yml"):
            docs += [d for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)]
    return docs


def render(root: Path, path: str) -> list[dict[str, Any]]:
    """The objects kustomize-controller would apply for one overlay folder."""
    folder = root / path
    if any((folder / k).is_file() for k in KUSTOMIZATION_FILES):
        res = subprocess.run(
            [build.tool_path("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(folder)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise ValueError(f"kustomize build failed: {res.stderr.strip()}")
        docs = [d for d in yaml.safe_load_all(res.stdout) if isinstance(d, dict)]
    else:
        docs = _plain_docs(folder)
    for doc in docs:
        doc.pop("sops", None)  # kustomize-controller decrypts and drops the metadata before applying
    return docs


def ensure_namespaces(cluster: Cluster, rendered: dict[str, list[dict[str, Any]]]) -> None:
    names = {
        d["metadata"]["namespace"] for docs in rendered.values() for d in docs if d.get("metadata", {}).get("namespace")
    }
    names |= {d["metadata"]["name"] for docs in rendered.values() for d in docs if d.get("kind") == "Namespace"}
    cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in sorted(names)])


def server_dry_run(cluster: Cluster, root: Path, paths: list[str] | None = None) -> list[str]:
    """Problems (`<path>: <message>`) of a server-side dry-run of each overlay; [] when all are accepted."""
    paths = paths if paths is not None else overlay_paths(root)
    problems: list[str] = []
    rendered: dict[str, list[dict[str, Any]]] = {}
    for path in paths:
        try:
            rendered[path] = render(root, path)
        except (ValueError, yaml.YAMLError) as e:
            problems.append(f"{path}: {e}")
    ensure_namespaces(cluster, rendered)

    def check(item: tuple[str, list[dict[str, Any]]]) -> list[str]:
        path, docs = item
        res = cluster.kubectl_result(
            "apply",
            "--dry-run=server",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(docs, sort_keys=False),
        )
        if res.returncode == 0:
            return []
        lines = [line for line in res.stderr.splitlines() if line.strip() and not line.lower().startswith("warning")]
        return [f"{path}: {line}" for line in lines] or [f"{path}: kubectl exited with {res.returncode}"]

    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores
        for found in pool.map(check, sorted(rendered.items())):
            problems += found
    return problems


def server_problems(root: Path, under: list[str] | None = None) -> tuple[int, list[str]]:
    """Start an API server with the pinned CRDs, dry-run the overlays (those under `under`, if given),
    stop it; (number of overlays checked, problems)."""
    paths = [
        p
        for p in overlay_paths(root)
        if not under or any(p == u or p.startswith(u.rstrip("/") + "/") or u in (".", "") for u in under)
    ]
    if not paths:
        return 0, []
    cluster = levels.start("api")
    try:
        return len(paths), server_dry_run(cluster, root, paths)
    finally:
        cluster.stop()


def main(argv: list[str]) -> int:
    root = build.HERE.parent.parent
    checked, problems = server_problems(root, [str(Path(p).resolve().relative_to(root)) for p in argv] or None)
    for p in problems:
        print(p)
    print(
        f"server-side dry-run of {checked} overlays: {'OK' if not problems else f'{len(problems)} problem(s)'}",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
