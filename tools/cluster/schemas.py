"""CRDs and kubeconform schemas from pinned sources only.

Every CustomResourceDefinition the repository's manifests use comes from a pinned Go module zip
(downloaded with `go mod download`, checked against the go.sum beside its pin) or from a vendored
copy with its source and tag (tools/cluster/go/crds/vendor/SOURCES.md):

    kubeflow.org                        tools/cluster/go/training-operator   manifests/base/crds/
    trainer.kubeflow.org, jobset.x-k8s.io  tools/cluster/go/kubeflow-trainer  manifests/base/crds/,
                                                                          config/components/crd/bases/
    source/kustomize/helm.toolkit...    tools/cluster/<flux controller>   config/crd/bases/
    monitoring.coreos.com, kueue...,    tools/cluster/go/crds                example/prometheus-operator-crd/,
    karpenter.sh, karpenter.k8s.aws                                       config/components/crd/bases/, pkg/apis/crds/
    image.toolkit.fluxcd.io             tools/cluster/go/crds/vendor/

The harness installs these CRDs into the API server; the kubeconform JSON schemas are converted from
the same files with the semantics of kubeconform's scripts/openapi2jsonschema.py (as the
datreeio/CRDs-catalog runs it): every object with `properties` below the root gets
`additionalProperties: false`, `format: int-or-string` becomes a string-or-integer `oneOf`, one file
per served version at `{group}/{kind}_{version}.json` (lower case). eksctl's ClusterConfig schema is
copied from its module (pkg/apis/eksctl.io/v1alpha5/assets/schema.json) to eksctl/.

    python -m tools.cluster.schemas [--out DIR]   # default .tools/schemas; prints DIR/crds

The output is regenerated only when a pin, a vendored file or this script changes (a stamp file
holds the hash of all inputs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
DEFAULT_OUT = REPO_ROOT / ".tools" / "schemas"
GO_MODULES = HERE / "go"  # build.GO_MODULES: one Go module per pinned project
VENDOR = GO_MODULES / "crds" / "vendor"
EKSCTL_SCHEMA = "eksctl/clusterconfig_v1alpha5.json"


@dataclass(frozen=True)
class Source:
    pin: str  # folder under tools/cluster/ whose go.mod requires the module and whose go.sum hashes it
    module: str
    globs: tuple[str, ...]  # CRD YAML inside the module zip


CRD_SOURCES = (
    Source("training-operator", "github.com/kubeflow/training-operator", ("manifests/base/crds/kubeflow.org_*.yaml",)),
    Source("source-controller", "github.com/fluxcd/source-controller", ("config/crd/bases/*.yaml",)),
    Source("kustomize-controller", "github.com/fluxcd/kustomize-controller", ("config/crd/bases/*.yaml",)),
    Source("helm-controller", "github.com/fluxcd/helm-controller", ("config/crd/bases/*.yaml",)),
    Source("crds", "github.com/prometheus-operator/prometheus-operator", ("example/prometheus-operator-crd/*.yaml",)),
    # Kubeflow Trainer v2 (TrainJob, ClusterTrainingRuntime) and the JobSet it runs on: job_api trainjob.
    Source("kubeflow-trainer", "github.com/kubeflow/trainer/v2", ("manifests/base/crds/trainer.kubeflow.org_*.yaml",)),
    Source("kubeflow-trainer", "sigs.k8s.io/jobset", ("config/components/crd/bases/*.yaml",)),
    Source("crds", "sigs.k8s.io/kueue", ("config/components/crd/bases/*.yaml",)),
    Source(
        "crds",
        "github.com/aws/karpenter-provider-aws",
        ("pkg/apis/crds/karpenter.sh_*.yaml", "pkg/apis/crds/karpenter.k8s.aws_*.yaml"),
    ),
)
EKSCTL = Source("crds", "github.com/weaveworks/eksctl", ("pkg/apis/eksctl.io/v1alpha5/assets/schema.json",))


class SchemaError(RuntimeError):
    """A pinned source could not be found, downloaded or verified."""


def pinned_version(src: Source) -> tuple[str, str]:
    """(version, h1 hash of the module zip) of src.module as its pin folder's go.mod and go.sum say."""
    gomod = (GO_MODULES / src.pin / "go.mod").read_text()
    version = ""
    for line in gomod.splitlines():
        words = line.split("//")[0].split()
        if words[:1] == ["require"]:
            words = words[1:]
        if len(words) == 2 and words[0] == src.module:
            version = words[1]
    if not version:
        raise SchemaError(f"tools/cluster/{src.pin}/go.mod: no require line for {src.module}")
    for line in (GO_MODULES / src.pin / "go.sum").read_text().splitlines():
        words = line.split()
        if words[:2] == [src.module, version]:
            return version, words[2]
    raise SchemaError(
        f"tools/cluster/{src.pin}/go.sum: no hash for {src.module} {version}; "
        f"fix: run `go mod download {src.module}@{version}` and add its h1: line"
    )


_MODULE_DIRS: dict[Source, Path] = {}


def module_dir(src: Source) -> Path:
    """The extracted module zip in the Go module cache, downloaded if needed and checked against go.sum
    (once per process: `go mod download` costs a Go start each time, and the tests ask many times)."""
    known = _MODULE_DIRS.get(src)
    if known is not None and known.is_dir():
        return known
    _MODULE_DIRS[src] = found = _module_dir(src)
    return found


def _module_dir(src: Source) -> Path:
    version, want = pinned_version(src)
    if shutil.which("go") is None:
        raise SchemaError(
            "go not found on PATH (the schemas are converted from pinned Go modules); fix: install the Go of "
            "tools/go.mod, or set FSDP_GITOPS_CRD_SCHEMAS to a schema folder"
        )
    with tempfile.TemporaryDirectory() as tmp:  # outside any module: go.mod of the repo is not touched
        proc = subprocess.run(
            ["go", "mod", "download", "-json", f"{src.module}@{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"},
        )
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SchemaError(f"go mod download {src.module}@{version} failed: {proc.stderr.strip()}") from None
    if info.get("Error"):
        raise SchemaError(f"go mod download {src.module}@{version}: {info['Error']}")
    if info.get("Sum") != want:
        raise SchemaError(
            f"{src.module}@{version}: downloaded zip hashes to {info.get('Sum')}, "
            f"tools/cluster/{src.pin}/go.sum says {want}"
        )
    return Path(info["Dir"])


def _files(src: Source) -> list[Path]:
    root = module_dir(src)
    found = sorted(p for g in src.globs for p in root.glob(g))
    if not found:
        raise SchemaError(f"{src.module}: nothing matches {', '.join(src.globs)} in its module zip")
    return found


def crd_origins() -> list[tuple[Path, str, str]]:
    """(CRD YAML file, where it comes from, tag) for every CRD the harness installs, in a fixed order."""
    out = []
    for src in CRD_SOURCES:
        root, version = module_dir(src), pinned_version(src)[0]
        out += [(p, f"{src.module} `{p.relative_to(root)}`", version) for p in _files(src)]
    vendored = (VENDOR / "SOURCES.md").read_text()
    for p in sorted(VENDOR.glob("*/*.yaml")):
        (row,) = [line for line in vendored.splitlines() if line.startswith(f"| `{p.parent.name}/{p.name}`")]
        out.append((p, f"vendored `{p.relative_to(REPO_ROOT)}`", row.split("|")[3].split()[0]))
    return out


def crd_files() -> list[Path]:
    """Every CRD YAML file the harness installs and the schemas are made from, in a fixed order."""
    return [p for p, _, _ in crd_origins()]


# ------------------------------------------------------------------- openapi2jsonschema semantics


def _additional_properties(data, skip: bool = False):
    # kubectl's old client-side validation: an object that lists its properties allows no others.
    if isinstance(data, dict):
        if "properties" in data and not skip and "additionalProperties" not in data:
            data["additionalProperties"] = False
        for v in data.values():
            _additional_properties(v)
    elif isinstance(data, list):
        for v in data:
            _additional_properties(v)
    return data


def _int_or_string(data):
    if isinstance(data, dict):
        if data.get("format") == "int-or-string":
            return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        return {k: _int_or_string(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_int_or_string(v) for v in data]
    return data


def crd_schemas(crd: dict) -> dict[str, dict]:
    """{group}/{kind}_{version}.json -> JSON schema, for every version of one CRD that has a schema."""
    out = {}
    spec = crd["spec"]
    for version in spec.get("versions") or []:
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            continue
        name = f"{spec['group']}/{spec['names']['kind']}_{version['name']}.json".lower()
        out[name] = _int_or_string(_additional_properties(json.loads(json.dumps(schema)), skip=True))
    return out


class _CRDLoader(yaml.SafeLoader):
    """YAML 1.1 reads a bare `=` as the value tag; CRDs use it as a string (enum of operators)."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: str(node.value))


def _load_crds(path: Path) -> list[dict]:
    with open(path) as f:
        return [
            d
            for d in yaml.load_all(f, Loader=_CRDLoader)
            if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"
        ]


def _inputs_hash(files: list[Path], eksctl: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    for p in [*files, eksctl]:
        h.update(str(p).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def generate(out: Path = DEFAULT_OUT) -> Path:
    """Write the CRD schemas to out/crds and eksctl's schema to out/eksctl; returns out/crds.

    out/crds/SOURCES.md names the module (or vendored file) and tag of every schema."""
    origins = crd_origins()
    eksctl = _files(EKSCTL)[0]
    stamp = out / ".crd-schemas.stamp"
    key = _inputs_hash([p for p, _, _ in origins], eksctl)
    if stamp.is_file() and stamp.read_text() == key and (out / "crds").is_dir():
        return out / "crds"
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".new-"))
    rows = []
    try:
        for path, origin, tag in origins:
            for crd in _load_crds(path):
                for name, schema in crd_schemas(crd).items():
                    target = tmp / "crds" / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(json.dumps(schema, indent=2) + "\n")
                    rows.append(f"| {name} | {origin} | {tag} |")
        (tmp / EKSCTL_SCHEMA).parent.mkdir(parents=True)
        shutil.copyfile(eksctl, tmp / EKSCTL_SCHEMA)
        rows.append(f"| ../{EKSCTL_SCHEMA} | {EKSCTL.module} `{EKSCTL.globs[0]}` | {pinned_version(EKSCTL)[0]} |")
        (tmp / "crds" / "SOURCES.md").write_text(
            "# Generated by `python -m tools.cluster.schemas`; do not edit\n\n"
            "| schema | source | tag |\n|---|---|---|\n" + "\n".join(rows) + "\n"
        )
        for sub in ("crds", "eksctl"):  # replace whole folders so a dropped CRD leaves no stale schema
            shutil.rmtree(out / sub, ignore_errors=True)
            os.replace(tmp / sub, out / sub)
        stamp.write_text(key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out / "crds"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster.schemas", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder [default: .tools/schemas]")
    args = parser.parse_args(argv)
    try:
        print(generate(args.out.resolve()))
    except SchemaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
