"""Schema validation with kubeconform: core Kubernetes schemas prepared from the kubernetes-validate
package, CRD schemas from a folder in the datreeio/CRDs-catalog layout, and the JSON schemas of the
documents that are tools' inputs rather than cluster objects (NON_CLUSTER_SCHEMAS).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from generators.core.errors import InputError, ToolError
from generators.core.gotools import REPO_ROOT, tool
from generators.validation.index import BUILD_JOBS, Build, RepoIndex
from generators.validation.manifests import Doc, Problem, meta, obj_name

# Kubernetes version the core schemas are prepared for (the EKS version the clusters run).
K8S_VERSION = "1.33.0"
# CRD schemas: the datreeio/CRDs-catalog layout, generated from the pinned CRDs unless the environment names a folder.
CRD_SCHEMAS_ENV = "FSDP_GITOPS_CRD_SCHEMAS"
CRD_SCHEMA_TEMPLATE = "{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"
# kubeconform's own naming of core schemas (KindSuffix is -<group prefix>-<version>, e.g. -apps-v1).
CORE_SCHEMA_TEMPLATE = "{{.ResourceKind}}{{.KindSuffix}}.json"
# Prepared core schemas are cached here, one folder per Kubernetes version.
SCHEMA_CACHE = REPO_ROOT / ".tools" / "schemas"

# Documents that are inputs of tools, not objects for a cluster: they never reach kubeconform with the
# core and CRD schemas. (apiVersion, kind) -> the JSON schema kubeconform checks them against instead,
# relative to the parent of the CRD schema directory (.tools/schemas/, where tools/cluster/schemas.py writes both), or
# None when another step checks them.
NON_CLUSTER_SCHEMAS: dict[tuple[str, str], str | None] = {
    # kustomize's own inputs: checked by building them.
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): None,
    ("kustomize.config.k8s.io/v1alpha1", "Component"): None,
    # The experiment matrix: checked by `python generators/expand.py matrix.yaml --check`.
    ("fsdp-gitops/v1", "ExperimentMatrix"): None,
    # eksctl's input (overlays/provisioning/<cluster>/eksctl.yaml, written by generators/cluster.py):
    # the schema eksctl publishes with its release.
    ("eksctl.io/v1alpha5", "ClusterConfig"): "eksctl/clusterconfig_v1alpha5.json",
}


def cluster_tools(module: str):
    """tools.cluster.<module> of this checkout (tools/ is one of the repository's packages in
    pyproject.toml, installed in editable mode by tools/setup.sh)."""
    import importlib

    return importlib.import_module(f"tools.cluster.{module}")


def default_crd_dir(root: Path = REPO_ROOT) -> Path:
    """$FSDP_GITOPS_CRD_SCHEMAS, else the schemas tools/cluster/schemas.py converts from the pinned CRD
    sources into .tools/schemas/crds (made on first use, then reused until a pin changes)."""
    env = os.environ.get(CRD_SCHEMAS_ENV)
    if env:
        return Path(env)
    pinned = cluster_tools("schemas")  # the same CRDs the cluster harness installs
    try:
        return pinned.generate()
    except pinned.SchemaError as e:
        raise ToolError(f"CRD schemas from the pinned sources: {e}") from None


def kubernetes_validate_stamp() -> str:
    """The installed kubernetes-validate's version line, or a one-line ToolError when it is missing
    (checked on every run, also when the prepared schemas are cached, so a checkout whose cache was made
    by another environment answers the same as a fresh one)."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        if importlib.util.find_spec("kubernetes_validate") is None:
            raise ModuleNotFoundError("kubernetes_validate")
        return f"kubernetes-validate {package_version('kubernetes-validate')}\n"
    except (ImportError, PackageNotFoundError):
        raise ToolError(
            "the Python package kubernetes-validate is not installed (it ships the Kubernetes schemas"
            " validation checks against): install it with `bash tools/setup.sh test`"
        ) from None


def kubernetes_validate_dir(version: str) -> Path:
    kubernetes_validate_stamp()
    import kubernetes_validate  # the package ships the OpenAPI schemas of each Kubernetes minor

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    src = base / f"v{version}-local-strict"
    if not src.is_dir():
        have = sorted(p.name.removesuffix("-local-strict") for p in base.glob("v*-local-strict"))
        raise InputError(
            f"--k8s-version {version}: kubernetes-validate has no schemas for it; use one of {', '.join(have)}"
        )
    return src


_DEF_REF = re.compile(r'"\$ref": ?"(?:/api/_definitions\.json)?#/\$defs/([^"]+)"')


def prepare_core_schemas(version: str, cache: Path = SCHEMA_CACHE) -> Path:
    """Core schemas for `version` in kubeconform's layout, prepared once into cache/v<version>/.

    kubernetes-validate's strict schemas carry an `$id` under https://kubernetes.io/ and reference
    definitions in one shared `/api/_definitions.json` (1.4 MB) that kubeconform cannot resolve. Each
    copy drops `$id` and carries the definitions it needs under its own `$defs`, with local references:
    kubeconform then compiles a kind in milliseconds instead of parsing the shared file per kind.
    Only kinds are written (schemas with x-kubernetes-group-version-kind), so a document whose kind is a
    sub-structure such as PodSpec finds no schema. A stamp names the package version they came from,
    so upgrading the pin prepares them again.
    """
    stamp = kubernetes_validate_stamp()
    dst = cache / f"v{version}"
    if (dst / "SOURCE").is_file() and (dst / "SOURCE").read_text() == stamp:
        return dst
    src = kubernetes_validate_dir(version)
    definitions = json.loads((src / "_definitions.json").read_text())["$defs"]
    deps = {name: set(_DEF_REF.findall(json.dumps(d))) for name, d in definitions.items()}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=cache))
    for f in sorted(src.glob("*.json")):
        schema = json.loads(f.read_text())
        if "x-kubernetes-group-version-kind" not in schema:
            continue
        schema.pop("$id", None)
        need = set(_DEF_REF.findall(json.dumps(schema)))
        todo = list(need)
        while todo:
            for d in deps[todo.pop()] - need:
                need.add(d)
                todo.append(d)
        schema["$defs"] = {name: definitions[name] for name in sorted(need)}
        text = json.dumps(schema, separators=(",", ":")).replace('"/api/_definitions.json#/$defs/', '"#/$defs/')
        (tmp / f.name).write_text(text)
    (tmp / "SOURCE").write_text(stamp)
    if dst.exists():  # prepared from another package version
        old = Path(tempfile.mkdtemp(prefix=f".old-v{version}-", dir=cache))
        dst.rename(old / "schemas")
        shutil.rmtree(old)
    try:
        tmp.rename(dst)  # atomic: a concurrent validation sees all files or none
    except OSError:  # another validation prepared them first
        shutil.rmtree(tmp)
    return dst


@dataclass
class Unit:
    """One kubeconform input file: the documents of a build or of a plain manifest file."""

    label: str  # build dir or file, for messages
    docs: list[Doc]
    build: Build | None = None
    raw: str = ""  # the text as-is, when every document of it is sent unchanged


def kubeconform_units(
    units: Sequence[Unit],
    locations: Sequence[str],
    k8s_version: str,
    repo: RepoIndex,
) -> tuple[list[Problem], int]:
    """Run one kubeconform over all units; (problems, number of resources checked)."""
    if not units:
        return [], 0
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        paths = []
        for i, unit in enumerate(units):
            p = Path(tmp, f"{i:05d}.yaml")
            p.write_text(
                unit.raw or "".join(f"---\n{json.dumps(_for_schema(d.data), default=str)}\n" for d in unit.docs)
            )
            paths.append(str(p))
        args = [
            tool("kubeconform"),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-n",
            str(BUILD_JOBS),
            "-kubernetes-version",
            k8s_version,
        ]
        for loc in locations:
            args += ["-schema-location", loc]
        proc = subprocess.run(args + paths, capture_output=True, text=True)
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ToolError(f"kubeconform failed: {' '.join((proc.stderr or proc.stdout).split())}") from None
    index = dict(zip(paths, units, strict=True))
    for r in out.get("resources") or []:
        if r.get("status") not in ("statusInvalid", "statusError"):
            continue
        u = index.get(r.get("filename", ""))
        kind, name = r.get("kind") or "?", r.get("name") or "?"
        msg = _kubeconform_message(r.get("msg") or "")
        if u is None:
            problems.append(Problem(r.get("filename", "?"), 0, f"{kind}/{name}", msg))
            continue
        doc = next(
            (
                d
                for d in u.docs
                if isinstance(d.data, dict)
                and d.data.get("kind") == kind
                and meta(d.data, "name") == (r.get("name") or "")
            ),
            None,
        )
        if u.build is not None:
            file = repo.origin(u.build, kind, r.get("name") or "", _error_paths(msg))
            problems.append(
                Problem(
                    file, 0, obj_name(doc.data) if doc else f"{kind}/{name}", f"{msg} (in the build of {u.build.dir})"
                )
            )
        else:
            problems.append(
                Problem(
                    doc.file if doc else u.label,
                    doc.line if doc else 0,
                    obj_name(doc.data) if doc else f"{kind}/{name}",
                    msg,
                )
            )
    summary = out.get("summary") or {}
    return problems, sum(int(summary.get(k, 0)) for k in ("valid", "invalid", "errors"))


def _for_schema(data: Any) -> Any:
    """The object as the cluster receives it: Flux decrypts SOPS files and drops their `sops` block."""
    if isinstance(data, dict) and "sops" in data:
        return {k: v for k, v in data.items() if k != "sops"}
    return data


def _error_paths(msg: str) -> list[list[str]]:
    """JSON pointers a kubeconform message blames, as key lists (with the unknown property, if any)."""
    out = []
    for m in re.finditer(r"at '(/[^']*)': (?:additional properties? '([^']+)')?", msg):
        keys = [k.replace("~1", "/").replace("~0", "~") for k in m.group(1).split("/")[1:]]
        out.append(keys + [m.group(2)] if m.group(2) else keys)
    return out


def _kubeconform_message(msg: str) -> str:
    # "problem validating schema. Check JSON formatting: jsonschema validation failed with 'file:///...#' - at ..."
    m = re.search(r"validation failed with '[^']*' - (.*)$", msg, re.S)
    text = m.group(1) if m else msg
    if text.startswith("could not find schema for"):
        text += " (no core or CRD schema for this apiVersion/kind: check the apiVersion, or add the CRD schema)"
    return "kubeconform: " + " ".join(text.split())
