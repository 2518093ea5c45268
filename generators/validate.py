"""Validate the repository the way CI and the cluster see it.

    python generators/validate.py                       # the whole repository
    python generators/validate.py overlays/runs/fsdp-p5 # only what lies under the given paths
    python generators/validate.py --crd-schemas ../shared/schemas/crds --k8s-version 1.33.0

Steps, in order. Each problem is one line `<file>[:<line>]: <Kind>/<name>: <message>` on stderr, a
summary goes to stdout; exit 1 when there is any problem, 2 on a usage error.

1. Parse every YAML file git knows about (tracked, or untracked and not ignored): syntax errors and
   duplicate keys, with the line.
2. `kustomize build --load-restrictor=LoadRestrictionsNone` every kustomization, as kustomize-controller
   builds it (two at a time). Components are built through the kustomizations that use them; a
   Component nothing uses is built through an empty parent.
3. One `kubeconform -strict` over every build output and every plain manifest file (YAML outside
   kustomizations that holds objects), with core schemas prepared from the `kubernetes-validate`
   package for one pinned Kubernetes version (K8S_VERSION) and CRD schemas from --crd-schemas. A kind
   without a schema is an error. Documents that are inputs of tools rather than cluster objects (the
   matrix, kustomize's own files, eksctl's ClusterConfig) go by NON_CLUSTER_SCHEMAS instead.
4. The Flux graph of every bootstrap directory (generators/fluxgraph.py): paths exist and build,
   dependsOn and sources resolve, no cycle, no object applied by two Kustomizations.
5. Semantic checks no schema can make (generators/semantics.py): GPUs and EFA against the instance
   type, torchrun's processes per node, unique rendezvous ids and output directories, no privileged
   training pod, no `latest` or untagged image, no inline secret, no unencrypted Secret.

A problem in a build names the input file that set the offending field (the overlay's own patch
before its bases), and a mistake in a base that shows in every build using it is reported once.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Sequence

import click
import yaml

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as `python generators/validate.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generators.manifests import (  # noqa: E402
    FLUX_KUSTOMIZATION, Doc, Problem, SafeLoader, gvk, is_manifest, load_documents,
    meta, norm, obj_name, under, yaml_error)
from generators.fluxgraph import check_flux  # noqa: E402
from generators.semantics import check_jobs, check_objects  # noqa: E402
from generators.tools import REPO_ROOT, ToolNotFoundError, tool  # noqa: E402

# Kubernetes version the core schemas are prepared for (the EKS version the clusters run).
K8S_VERSION = "1.33.0"
# CRD schemas: the datreeio/CRDs-catalog layout, beside the checkout unless the environment says otherwise.
CRD_SCHEMAS_ENV = "FSDP_GITOPS_CRD_SCHEMAS"
CRD_SCHEMA_TEMPLATE = "{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"
# kubeconform's own naming of core schemas (KindSuffix is -<group prefix>-<version>, e.g. -apps-v1).
CORE_SCHEMA_TEMPLATE = "{{.ResourceKind}}{{.KindSuffix}}.json"
# Prepared core schemas are cached here, one folder per Kubernetes version.
SCHEMA_CACHE = REPO_ROOT / ".tools" / "schemas"
# The machine has two cores; kustomize builds run this many at a time.
BUILD_JOBS = 2
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
YAML_SUFFIXES = (".yaml", ".yml")

# Documents that are inputs of tools, not objects for a cluster: they never reach kubeconform with the
# core and CRD schemas. (apiVersion, kind) -> the JSON schema kubeconform checks them against instead,
# relative to the parent of the CRD schema directory (shared/schemas/, where CI assembles both), or
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


class UsageError(Exception):
    """Bad command-line input or a missing prerequisite; the CLI exits 2."""


class ToolError(RuntimeError):
    """A tool failed in a way that says nothing about the repository; the CLI exits 1."""


@dataclass
class Build:
    """The output of `kustomize build` of one directory."""

    dir: str
    file: str  # the kustomization file, for messages
    docs: list[Doc] = field(default_factory=list)
    text: str = ""
    error: str = ""


@dataclass
class Report:
    """What a validation found, and how much it looked at."""

    problems: list[Problem]
    num_yaml_files: int = 0
    num_builds: int = 0
    num_resources: int = 0
    num_flux_kustomizations: int = 0
    num_pytorchjobs: int = 0
    seconds: float = 0.0


# ------------------------------------------------------------------------------------------ 1. parsing

def repo_files(root: Path) -> list[str]:
    """Files git knows about under root: tracked (and present) or untracked and not ignored."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise UsageError(f"{root}: not a git work tree ({e}); validate a checkout of the repository") from e
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if (root / n).is_file()]


# --------------------------------------------------------------------------------------- 2. kustomize

def kustomization_refs(k: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(resources and bases, components and every other path a kustomization reads), as written in it."""
    def strings(v: Any) -> list[str]:
        return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []

    resources = strings(k.get("resources")) + strings(k.get("bases"))
    components = strings(k.get("components"))
    files: list[str] = strings(k.get("crds")) + strings(k.get("configurations")) + strings(k.get("transformers")) \
        + strings(k.get("generators")) + strings(k.get("validators")) + strings(k.get("patchesStrategicMerge"))
    for key in ("patches", "patchesJson6902", "replacements"):
        for p in k.get(key) or []:
            if isinstance(p, dict) and isinstance(p.get("path"), str):
                files.append(p["path"])
    for key in ("configMapGenerator", "secretGenerator"):
        for g in k.get(key) or []:
            if isinstance(g, dict):
                files += [f.split("=", 1)[-1] for f in strings(g.get("files"))] + strings(g.get("envs"))
                if isinstance(g.get("env"), str):
                    files.append(g["env"])
    return resources, components + files


def is_remote(ref: str) -> bool:
    """A kustomize reference to a remote repository (never used here: Flux sources pin upstream)."""
    return "://" in ref or ref.startswith(("github.com/", "git@")) or "?ref=" in ref


class Repo:
    """What validation knows about a checkout: its files, parsed YAML, kustomizations and builds."""

    def __init__(self, root: Path, files: Sequence[str]):
        self.root = root
        self.files = list(files)
        self.yaml_files = [f for f in self.files
                           if f.endswith(YAML_SUFFIXES) or PurePosixPath(f).name == "Kustomization"]
        self.docs: dict[str, list[Doc]] = {}
        self.kfiles: dict[str, str] = {}  # kustomization dir -> its kustomization file
        self.builds: dict[str, Build] = {}
        # Indexes built once: lookups by folder run per kustomization, per problem and per Flux path.
        self.files_under: dict[str, list[str]] = {}  # folder -> every file below it
        for f in self.files:
            for parent in PurePosixPath(f).parents:
                self.files_under.setdefault(norm(str(parent)), []).append(f)
        self.dirs = set(self.files_under)
        self.yaml_in_dir: dict[str, list[str]] = {}  # folder -> the YAML files directly in it
        for f in self.yaml_files:
            self.yaml_in_dir.setdefault(norm(str(PurePosixPath(f).parent)), []).append(f)
        self._refs: dict[str, tuple[list[str], list[str]]] = {}

    def parse(self, problems: list[Problem]) -> None:
        for f in self.yaml_files:
            try:
                text = (self.root / f).read_text(encoding="utf-8")
                self.docs[f] = load_documents(text, f)
            except yaml.YAMLError as e:
                problems.append(yaml_error(f, e))
                self.docs[f] = []
            except UnicodeDecodeError as e:
                problems.append(Problem(f, 0, "", f"not UTF-8 text: {e}"))
                self.docs[f] = []
            if PurePosixPath(f).name in KUSTOMIZATION_FILES:
                self.kfiles.setdefault(norm(str(PurePosixPath(f).parent)), f)

    def kustomization(self, d: str) -> dict:
        docs = self.docs.get(self.kfiles[d], [])
        return docs[0].data if docs and isinstance(docs[0].data, dict) else {}

    def is_component(self, d: str) -> bool:
        return self.kustomization(d).get("kind") == "Component"

    def local_refs(self, d: str) -> tuple[list[str], list[str]]:
        """(kustomization dirs this one builds on, files it reads), repository-relative."""
        if d not in self._refs:
            self._refs[d] = self._local_refs(d)
        return self._refs[d]

    def _local_refs(self, d: str) -> tuple[list[str], list[str]]:
        dirs, files = [], []
        resources, others = kustomization_refs(self.kustomization(d))
        for ref in resources + others:
            if is_remote(ref):
                continue
            p = norm(os.path.join(d, ref))
            if p.startswith("../"):
                continue  # outside the repository: kustomize reports it if it is missing
            (dirs if p in self.kfiles else files).append(p)
        return dirs, files

    def input_files(self) -> set[str]:
        """Files that are inputs of some kustomization (not manifests on their own)."""
        out: set[str] = set()
        for d in self.kfiles:
            out.update(self.files_under.get(d, ()))
            out.update(self.local_refs(d)[1])
        return out

    def build(self, d: str, kustomize: str) -> Build:
        b = Build(d, self.kfiles.get(d, d))
        if self.is_component(d):
            # A Component cannot be built alone; build it through an empty parent, as a user would.
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, "kustomization.yaml").write_text(
                    f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n"
                    f"  - {json.dumps(os.path.relpath(self.root / d, tmp))}\n")  # kustomize wants it relative
                proc = _kustomize(kustomize, tmp)
        else:
            proc = _kustomize(kustomize, str(self.root / d))
        if proc.returncode != 0:
            err = proc.stderr.replace(str(self.root) + "/", "").strip()
            b.error = " ".join((err.splitlines() or ["kustomize failed"])[0].removeprefix("Error: ").split())
            return b
        b.text = proc.stdout
        try:
            b.docs = [Doc(x.data, b.file) for x in load_documents(proc.stdout, b.file, SafeLoader)]
        except yaml.YAMLError as e:
            b.error = f"kustomize printed unparsable YAML: {e}"
        return b

    def build_all(self, dirs: Iterable[str], kustomize: str) -> None:
        todo = [d for d in dict.fromkeys(dirs) if d not in self.builds]
        with concurrent.futures.ThreadPoolExecutor(BUILD_JOBS) as pool:
            for b in pool.map(lambda d: self.build(d, kustomize), todo):
                self.builds[b.dir] = b

    def get_build(self, d: str, kustomize: str) -> Build:
        if d not in self.builds:
            self.builds[d] = self.build(d, kustomize)
        return self.builds[d]

    def plain_dir_docs(self, d: str, kustomize: str) -> list[Doc]:
        """What kustomize-controller applies from a directory without a kustomization file: the objects
        of every YAML file in it and, recursively, of its subdirectories (built where they are
        kustomizations)."""
        out: list[Doc] = []
        for f in self.yaml_in_dir.get(d, ()):
            out += [x for x in self.docs.get(f, []) if is_manifest(x.data)]
        for sub in sorted(x for x in self.dirs if x != d and norm(str(PurePosixPath(x).parent)) == d):
            out += self.get_build(sub, kustomize).docs if sub in self.kfiles else self.plain_dir_docs(sub, kustomize)
        return out

    def origin(self, build: Build, kind: str, name: str, paths: Sequence[Sequence[str]] = ()) -> str:
        """The input file an object of a build most likely comes from.

        Candidates are the documents of that kind in the build's inputs, the overlay's own first, then
        its bases. The first one that holds the offending field (`paths`, JSON pointers split into
        keys) wins; else the first one with the object's name; else the kustomization file.
        """
        seen: set[str] = set()
        queue = [build.dir]
        candidates: list[Doc] = []
        while queue:
            d = queue.pop(0)
            if d in seen or d not in self.kfiles:
                continue
            seen.add(d)
            dirs, files = self.local_refs(d)
            own = self.yaml_in_dir.get(d, []) + files
            candidates += [x for f in own for x in self.docs.get(f, [])
                           if (isinstance(x.data, dict) and x.data.get("kind") == kind) or _is_json_patch(x.data)]
            queue.extend(dirs)
        for x in candidates:
            if any(_holds(x.data, p) for p in paths):
                return x.file
        return next((x.file for x in candidates if isinstance(x.data, dict) and meta(x.data, "name") == name),
                    build.file)


def _is_json_patch(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(op, dict) and "op" in op for op in data)


def _holds(data: Any, keys: Sequence[str]) -> bool:
    """Whether a manifest (or the values of a JSON patch) holds the field at `keys`."""
    if _is_json_patch(data):
        for op in data:
            at = [k.replace("~1", "/").replace("~0", "~") for k in str(op.get("path", "")).split("/")[1:]]
            if "value" in op and len(at) <= len(keys) and all(a in (k, "-") for a, k in zip(at, keys)) \
                    and _holds(op["value"], keys[len(at):]):
                return True
        return False
    for k in keys:
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and k.isdigit() and int(k) < len(data):
            data = data[int(k)]
        else:
            return False
    return True


def _kustomize(kustomize: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([kustomize, "build", "--load-restrictor=LoadRestrictionsNone", path],
                          capture_output=True, text=True)


# -------------------------------------------------------------------------------------- 3. kubeconform

def default_crd_dir(root: Path = REPO_ROOT) -> Path:
    """$FSDP_GITOPS_CRD_SCHEMAS, else ../shared/schemas/crds beside the repository."""
    env = os.environ.get(CRD_SCHEMAS_ENV)
    return Path(env) if env else (root / ".." / "shared" / "schemas" / "crds").resolve()


def kubernetes_validate_dir(version: str) -> Path:
    import kubernetes_validate  # the package ships the OpenAPI schemas of each Kubernetes minor

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    src = base / f"v{version}-local-strict"
    if not src.is_dir():
        have = sorted(p.name.removesuffix("-local-strict") for p in base.glob("v*-local-strict"))
        raise UsageError(f"--k8s-version {version}: kubernetes-validate has no schemas for it; "
                         f"use one of {', '.join(have)}")
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
    from importlib.metadata import version as package_version

    stamp = f"kubernetes-validate {package_version('kubernetes-validate')}\n"
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


def kubeconform_units(units: Sequence[Unit], locations: Sequence[str], k8s_version: str, repo: Repo,
                      ) -> tuple[list[Problem], int]:
    """Run one kubeconform over all units; (problems, number of resources checked)."""
    if not units:
        return [], 0
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="validate-") as tmp:
        paths = []
        for i, u in enumerate(units):
            p = Path(tmp, f"{i:05d}.yaml")
            p.write_text(u.raw or "".join(f"---\n{json.dumps(_for_schema(d.data), default=str)}\n" for d in u.docs))
            paths.append(str(p))
        args = [tool("kubeconform"), "-strict", "-summary", "-output", "json", "-n", str(BUILD_JOBS),
                "-kubernetes-version", k8s_version]
        for loc in locations:
            args += ["-schema-location", loc]
        proc = subprocess.run(args + paths, capture_output=True, text=True)
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ToolError(f"kubeconform failed: {' '.join((proc.stderr or proc.stdout).split())}") from None
    index = {p: u for p, u in zip(paths, units)}
    for r in out.get("resources") or []:
        if r.get("status") not in ("statusInvalid", "statusError"):
            continue
        u = index.get(r.get("filename", ""))
        kind, name = r.get("kind") or "?", r.get("name") or "?"
        msg = _kubeconform_message(r.get("msg") or "")
        if u is None:
            problems.append(Problem(r.get("filename", "?"), 0, f"{kind}/{name}", msg))
            continue
        doc = next((d for d in u.docs if isinstance(d.data, dict) and d.data.get("kind") == kind
                    and meta(d.data, "name") == (r.get("name") or "")), None)
        if u.build is not None:
            file = repo.origin(u.build, kind, r.get("name") or "", _error_paths(msg))
            problems.append(Problem(file, 0, obj_name(doc.data) if doc else f"{kind}/{name}",
                                    f"{msg} (in the build of {u.build.dir})"))
        else:
            problems.append(Problem(doc.file if doc else u.label, doc.line if doc else 0,
                                    obj_name(doc.data) if doc else f"{kind}/{name}", msg))
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


# ------------------------------------------------------------------------------------------- pipeline

def validate(root: Path, paths: Sequence[str] = (), *, crd_dir: Path, k8s_version: str = K8S_VERSION,
             non_cluster: Mapping[tuple[str, str], str | None] = NON_CLUSTER_SCHEMAS,
             schema_cache: Path = SCHEMA_CACHE) -> Report:
    """Validate the checkout at `root`, or what lies under `paths` (relative to root)."""
    start = time.monotonic()
    if not crd_dir.is_dir():
        raise UsageError(f"--crd-schemas {crd_dir}: not a directory; point it at a CRD schema folder in the "
                         f"{{group}}/{{kind}}_{{version}}.json layout (or set {CRD_SCHEMAS_ENV})")
    kustomize = tool("kustomize")
    core = prepare_core_schemas(k8s_version, schema_cache)
    scope = [norm(p) for p in paths] or [""]

    def in_scope(f: str) -> bool:
        return any(under(f, s) for s in scope)

    # 1. Parse.
    problems: list[Problem] = []
    repo = Repo(root, repo_files(root))
    repo.parse(problems)

    # 2. Build every kustomization in scope (Components only where nothing uses them).
    used_as_base = {r for d in repo.kfiles for r in repo.local_refs(d)[0]}
    to_build = sorted(d for d in repo.kfiles if in_scope(repo.kfiles[d])
                      and not (repo.is_component(d) and d in used_as_base))
    repo.build_all(to_build, kustomize)
    for d in to_build:
        b = repo.builds[d]
        if b.error:
            problems.append(Problem(b.file, 0, f"{repo.kustomization(d).get('kind', 'Kustomization')}/{d}",
                                    f"kustomize build failed: {b.error}"))

    # 3. Schemas: builds as kustomize printed them, plain manifest files as written.
    inputs = repo.input_files()
    plain = [f for f in repo.yaml_files if f not in inputs and in_scope(f)
             and any(is_manifest(x.data) for x in repo.docs.get(f, []))]
    units = [Unit(d, repo.builds[d].docs, repo.builds[d], repo.builds[d].text) for d in to_build
             if not repo.builds[d].error]
    by_schema: dict[Path, list[Doc]] = {}
    for f in plain:
        docs = repo.docs[f]
        cluster_docs = []
        for x in docs:
            key = (str(x.data.get("apiVersion")), str(x.data.get("kind"))) if isinstance(x.data, dict) else ("", "")
            if key not in non_cluster:
                cluster_docs.append(x)
            elif non_cluster[key]:
                by_schema.setdefault(crd_dir.parent / str(non_cluster[key]), []).append(x)
        if cluster_docs:
            whole = len(cluster_docs) == len(docs)
            units.append(Unit(f, cluster_docs, None, (root / f).read_text() if whole else ""))
    for u in units:
        if any(isinstance(x.data, dict) and "sops" in x.data for x in u.docs):
            u.raw = ""  # sent without the sops block (see _for_schema)
    p, num_resources = kubeconform_units(units, [f"{core}/{CORE_SCHEMA_TEMPLATE}", f"{crd_dir}/{CRD_SCHEMA_TEMPLATE}"],
                                         k8s_version, repo)
    problems += p
    for schema, docs in sorted(by_schema.items()):
        if not schema.is_file():
            problems += [Problem(x.file, x.line, obj_name(x.data), f"no schema {schema} for {x.data.get('apiVersion')} "
                                 f"{x.data.get('kind')}; it belongs beside the CRD schema folder") for x in docs]
            continue
        p, n = kubeconform_units([Unit(x.file, [x]) for x in docs], [str(schema)], k8s_version, repo)
        problems += p
        num_resources += n

    # 4. Flux graph of each bootstrap directory in scope.
    roots = sorted({norm(str(PurePosixPath(f).parent)) for f in plain
                    if any(gvk(x.data) == FLUX_KUSTOMIZATION for x in repo.docs[f])})
    p, num_flux = check_flux(repo, roots, kustomize)
    problems += p

    # 5. Semantics: objects in every unit (blaming the input file that set a field), PyTorchJobs as
    # applied (builds nothing else builds on, and plain manifest files).
    blames = [_blame(repo, u.build) if u.build else lambda doc, keys: doc.file for u in units]
    for u, blame in zip(units, blames):
        problems += check_objects(u.docs, blame)
    p, num_jobs = check_jobs([(u.docs, blame) for u, blame in zip(units, blames)
                              if u.build is None or u.build.dir not in used_as_base])
    problems += p

    return Report(collapse(problems),
                  num_yaml_files=sum(1 for f in repo.yaml_files if in_scope(f)), num_builds=len(to_build),
                  num_resources=num_resources, num_flux_kustomizations=num_flux, num_pytorchjobs=num_jobs,
                  seconds=time.monotonic() - start)


def _blame(repo: Repo, build: Build) -> Callable[[Doc, tuple[str, ...]], str]:
    def blame(doc: Doc, keys: tuple[str, ...]) -> str:
        return repo.origin(build, str(doc.data.get("kind")), meta(doc.data, "name"), [list(keys)] if keys else [])
    return blame


_BUILD_NOTE = re.compile(r" \(in the build of [^)]*\)$")


def collapse(problems: Iterable[Problem]) -> list[Problem]:
    """One line per mistake. A mistake in a base shows in every build that uses it: problems with the same
    file, line and message (less the build it showed in) become the first of them, with a count."""
    groups: dict[tuple[str, int, str], list[Problem]] = {}
    for p in sorted(set(problems), key=lambda x: (x.file, x.line, x.obj, x.message)):
        groups.setdefault((p.file, p.line, _BUILD_NOTE.sub("", p.message)), []).append(p)
    return [ps[0] if len(ps) == 1 else replace(ps[0], message=f"{ps[0].message} (and {len(ps) - 1} more like it)")
            for ps in groups.values()]


def repository_root(paths: Sequence[Path]) -> Path:
    """The git work tree holding all of `paths` (this repository when none is given)."""
    if not paths:
        return REPO_ROOT
    roots = set()
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory")
        d = p if p.is_dir() else p.parent
        proc = subprocess.run(["git", "-C", str(d), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise UsageError(f"{p}: not inside a git work tree; validate files of a checkout")
        roots.add(Path(proc.stdout.strip()).resolve())
    if len(roots) > 1:
        raise UsageError(f"paths span several repositories ({', '.join(map(str, sorted(roots)))}); "
                         "validate one at a time")
    return roots.pop()


# ------------------------------------------------------------------------------------------------ CLI

@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--crd-schemas", "crd_schemas", type=click.Path(path_type=Path), default=None,
              help=f"CRD JSON schemas in the {{group}}/{{kind}}_{{version}}.json layout "
                   f"[default: ${CRD_SCHEMAS_ENV}, else ../shared/schemas/crds beside the repository]")
@click.option("--k8s-version", default=K8S_VERSION, show_default=True,
              help="Kubernetes version of the core schemas (from the kubernetes-validate package).")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
def main(crd_schemas: Path | None, k8s_version: str, paths: tuple[Path, ...]) -> None:
    """Validate the repository (or PATHS in it): YAML, kustomize builds, schemas, Flux graph, semantics."""
    try:
        root = repository_root(paths)
        rel = [os.path.relpath(p.resolve(), root) for p in paths]
        report = validate(root, rel, crd_dir=(crd_schemas or default_crd_dir(root)).resolve(), k8s_version=k8s_version)
    except UsageError as e:
        raise click.UsageError(str(e)) from None
    except (ToolNotFoundError, ToolError) as e:
        raise click.ClickException(str(e)) from None
    for p in report.problems:
        click.echo(str(p), err=True)
    status = f"{len(report.problems)} problem(s)" if report.problems else "OK"
    click.echo(f"validated {report.num_yaml_files} YAML files, {report.num_builds} kustomize builds, "
               f"{report.num_resources} resources, {report.num_flux_kustomizations} Flux Kustomizations, "
               f"{report.num_pytorchjobs} PyTorchJobs "
               f"in {report.seconds:.1f}s: {status}")
    if report.problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
