"""Level 3 set-up: a throw-away clone of the repository whose every Flux source points at loopback.

    clone = prepare(work, server_url, oci_host, webhook_port)   # files, git repos, charts, age key

What the clone changes, and nothing else:
- the repository URL in the generated sources.yaml -> the local git server (matrix.yaml keeps its
  https URL, which the generator requires; Clone.localize() rewrites again after each expand.py);
- base/training-operator's GitRepository -> a local repository tagged as upstream, holding the
  operator's standalone manifests from the pinned module with the webhooks called by URL on loopback
  (tools/cluster/steps/training_operator.py says why);
- every HelmRepository -> a local Helm repository, every OCIRepository -> the local OCI registry
  (plain HTTP, so `insecure: true`), each serving stub charts (one ConfigMap) under the chart names
  and versions the HelmReleases pin;
- the SOPS-encrypted Secrets -> the same Secrets encrypted for a test age key, which the test gives
  Flux as Secret flux-system/sops-age.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.cluster import build
from tools.cluster.cluster import Cluster
from tools.cluster.steps import training_operator

REPO_ROOT = build.HERE.parent.parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "harness",
    "GIT_AUTHOR_EMAIL": "harness@example.invalid",
    "GIT_COMMITTER_NAME": "harness",
    "GIT_COMMITTER_EMAIL": "harness@example.invalid",
}


@dataclass
class Clone:
    repo: Path  # the work tree pushed to <server>/git/fsdp-gitops.git
    bare: Path
    url: str
    age_key: str
    upstream: str = ""  # matrix.yaml's repository URL, which the generator requires to be https or ssh
    branch: str = "main"

    def localize(self) -> None:
        """Point the generated GitRepository of every cluster at the loopback copy (again after expand.py)."""
        for f in sorted((self.repo / "overlays" / "clusters").glob("*/sources.yaml")):
            f.write_text(f.read_text().replace(self.upstream, self.url))

    def git(self, *args: str) -> str:
        return _git(self.repo, *args)

    def commit_and_push(self, message: str) -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        self.git("push", "-q", str(self.bare), f"HEAD:{self.branch}")
        return self.git("rev-parse", "HEAD").strip()


def _git(cwd: Path, *args: str) -> str:
    import os

    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout


def _publish(src: Path, bare: Path, branch: str = "main", tag: str | None = None) -> None:
    _git(src, "init", "-q", "-b", branch)
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "initial")
    if tag:
        _git(src, "tag", tag)
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    _git(src, "push", "-q", str(bare), f"HEAD:{branch}", *([f"refs/tags/{tag}"] if tag else []))


def stub_chart(name: str, version: str) -> bytes:
    """A Helm chart that installs one ConfigMap: helm-controller's install, test and upgrade work on it."""
    files = {
        f"{name}/Chart.yaml": f"apiVersion: v2\nname: {name}\nversion: {version}\n",
        f"{name}/templates/configmap.yaml": (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-stub\n"
            "data:\n  chart: " + name + "\n"
        ),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _oci_push(root: Path, name: str, tag: str, chart: bytes, layer_type: str) -> None:
    config = b"{}"
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.cncf.helm.config.v1+json",
                "digest": _sha(config),
                "size": len(config),
            },
            "layers": [{"mediaType": layer_type, "digest": _sha(chart), "size": len(chart)}],
        }
    ).encode()
    base = root / "oci" / name
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    (base / "manifests").mkdir(parents=True, exist_ok=True)
    for blob in (config, chart):
        (base / "blobs" / _sha(blob).replace(":", "_")).write_bytes(blob)
    (base / "manifests" / tag).write_bytes(manifest)
    (base / "manifests" / _sha(manifest).replace(":", "_")).write_bytes(manifest)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def prepare(work: Path, server: str, webhook_port: int, real_charts: dict[str, bytes] | None = None) -> Clone:
    """Build the served tree under work/serve and the clone under work/repo (see the module docstring).
    `webhook_port` 0: the operator's manifests as upstream has them (webhooks by Service, for the operator
    as a real pod); `real_charts`: chart name -> a real packaged chart served instead of the stub."""
    charts_given = real_charts or {}
    serve, repo = work / "serve", work / "repo"
    for sub in ("git", "static", "oci"):
        (serve / sub).mkdir(parents=True, exist_ok=True)
    files = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO_ROOT / rel
        if src.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    host = server.removeprefix("http://")
    repo_url = f"{server}/git/fsdp-gitops.git"
    upstream = yaml.safe_load((repo / "matrix.yaml").read_text())["repository"]["url"]
    replacements: dict[str, str] = {}
    charts: dict[str, list[tuple[str, str]]] = {}
    oci: list[tuple[Path, str, str, str]] = []
    for f in sorted((repo / "base").rglob("*.yaml")):
        for d in _docs(f):
            kind, spec = d.get("kind"), d.get("spec") or {}
            if kind == "GitRepository" and d["metadata"]["name"] == "training-operator":
                _operator_repo(work / "trainer", serve / "git" / "trainer.git", spec["ref"]["tag"], webhook_port)
                replacements[spec["url"]] = f"{server}/git/trainer.git"
            elif kind == "HelmRepository":
                replacements[spec["url"]] = f"{server}/helm/{d['metadata']['name']}/"
                charts.setdefault(d["metadata"]["name"], [])
            elif kind == "OCIRepository":
                oci.append(
                    (
                        f,
                        spec["url"],
                        spec["ref"]["tag"],
                        spec.get("layerSelector", {}).get(
                            "mediaType", "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
                        ),
                    )
                )
            elif kind == "HelmRelease" and "chart" in spec:
                cs = spec["chart"]["spec"]
                charts.setdefault(cs["sourceRef"]["name"], []).append((cs["chart"], str(cs["version"])))
    for f in [*sorted((repo / "base").rglob("*.yaml")), *sorted((repo / "overlays").rglob("*.yaml"))]:
        text = f.read_text()
        new = text
        for old, url in replacements.items():
            new = new.replace(old, url)
        if new != text:
            f.write_text(new)
    for f, url, tag, layer_type in oci:
        path = url.removeprefix("oci://").split("/", 1)[1]
        text = f.read_text()
        f.write_text(re.sub(rf"(\n(\s+)url: ){re.escape(url)}\n", rf"\1oci://{host}/{path}\n\2insecure: true\n", text))
        chart_name = path.rsplit("/", 1)[1]
        _oci_push(serve, path, tag, charts_given.get(chart_name) or stub_chart(chart_name, tag), layer_type)
    for repo_name, entries in charts.items():
        folder = serve / "static" / "helm" / repo_name
        folder.mkdir(parents=True, exist_ok=True)
        index: dict[str, list[dict[str, Any]]] = {}
        for chart, version in entries:
            tgz = charts_given.get(chart) or stub_chart(chart, version)
            (folder / f"{chart}-{version}.tgz").write_bytes(tgz)
            index.setdefault(chart, []).append(
                {
                    "apiVersion": "v2",
                    "name": chart,
                    "version": version,
                    "urls": [f"{server}/helm/{repo_name}/{chart}-{version}.tgz"],
                    "digest": hashlib.sha256(tgz).hexdigest(),
                    "created": "2026-11-30T00:00:00Z",
                }
            )
        (folder / "index.yaml").write_text(
            yaml.safe_dump({"apiVersion": "v1", "entries": index, "generated": "2026-11-30T00:00:00Z"})
        )
    age_key = _reencrypt_secrets(work, repo)
    clone = Clone(repo, serve / "git" / "fsdp-gitops.git", repo_url, age_key, upstream)
    clone.localize()
    _publish(repo, clone.bare)
    return clone


def _operator_repo(src: Path, bare: Path, tag: str, webhook_port: int) -> None:
    """The operator's standalone overlay, rendered once with its webhooks on loopback, as its own repo."""
    docs = training_operator.standalone()
    keep = [d for d in docs if d["kind"] == "Deployment"]  # Flux runs it as upstream does; kwok runs its pod
    out = src / "manifests" / "overlays" / "standalone"
    out.mkdir(parents=True)
    served = training_operator.for_process(docs, webhook_port) + keep if webhook_port else docs
    (out / "all.yaml").write_text(yaml.safe_dump_all(served))
    (out / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - all.yaml\n"
    )
    _publish(src, bare, branch="master", tag=tag)


def _reencrypt_secrets(work: Path, repo: Path) -> str:
    """Encrypt every *.sops.yaml Secret again, for a fresh age key; returns the private key."""
    keyfile = work / "age.key"
    subprocess.run([build.tool_path("age-keygen"), "-o", str(keyfile)], check=True, capture_output=True)
    key = keyfile.read_text()
    recipient = next(line.split(": ", 1)[1] for line in key.splitlines() if line.startswith("# public key: "))
    for f in sorted((repo / "base" / "secrets").rglob("*.sops.yaml")):
        plain = []
        for d in _docs(f):
            d.pop("sops", None)
            for field in ("data", "stringData"):
                if field in d:
                    d[field] = {k: ("dGVzdA==" if field == "data" else "test") for k in d[field]}
            plain.append(d)
        tmp = work / "plain.yaml"
        tmp.write_text(yaml.safe_dump_all(plain))
        enc = subprocess.run(
            [
                build.tool_path("sops"),
                "--encrypt",
                "--age",
                recipient,
                "--encrypted-regex",
                "^(data|stringData)$",
                "--input-type",
                "yaml",
                "--output-type",
                "yaml",
                str(tmp),
            ],
            cwd=work,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        f.write_text(enc)
    return key


def bootstrap(cluster: Cluster, clone: Clone, name: str) -> None:
    """What `flux bootstrap` leaves behind for cluster `name`: the age key, the repository's own
    GitRepository (exactly as overlays/clusters/<name>/sources.yaml has it, so Flux does not rebuild the
    artifact under kustomize-controller when it applies that file) and a Kustomization of the entry point."""
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "flux-system"}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "sops-age", "namespace": "flux-system"},
                "stringData": {"age.agekey": clone.age_key},
            },
        ]
    )
    sources = _docs(clone.repo / "overlays" / "clusters" / name / "sources.yaml")
    own = [d for d in sources if d["kind"] == "GitRepository" and d["spec"]["url"] == clone.url]
    cluster.apply(
        own
        + [
            {
                "apiVersion": "kustomize.toolkit.fluxcd.io/v1",
                "kind": "Kustomization",
                "metadata": {"name": "flux-system", "namespace": "flux-system"},
                "spec": {
                    "interval": "10m",
                    "path": f"./overlays/clusters/{name}",
                    "prune": True,
                    "sourceRef": {"kind": "GitRepository", "name": own[0]["metadata"]["name"]},
                },
            }
        ]
    )


def reconcile_now(cluster: Cluster) -> None:
    """`flux reconcile source git`: ask for a fetch now instead of waiting for the interval."""
    stamp = str(time.time())
    for kind in ("gitrepository", "kustomization"):
        cluster.kubectl(
            "annotate", "--overwrite", "-n", "flux-system", kind, "--all", f"reconcile.fluxcd.io/requestedAt={stamp}"
        )


def not_ready(cluster: Cluster) -> dict[str, str]:
    """Every Kustomization and HelmRelease that is not Ready=True -> its Ready message."""
    out = {}
    for kind in ("kustomizations.kustomize.toolkit.fluxcd.io", "helmreleases.helm.toolkit.fluxcd.io"):
        for item in cluster.get(kind)["items"]:
            ready: dict[str, Any] = next(
                (c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {}
            )
            if ready.get("status") != "True":
                out[f"{item['kind']}/{item['metadata']['namespace']}/{item['metadata']['name']}"] = ready.get(
                    "message", "no status yet"
                )
    return out
