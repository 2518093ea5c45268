"""What validation knows about a checkout: its files, their parsed YAML, its kustomizations and their
builds (`RepoIndex`), indexed once so that every check looks things up by folder.

Files are the ones git knows about (tracked, or untracked and not ignored). A kustomization is built
with `kustomize build --load-restrictor=LoadRestrictionsNone`, as kustomize-controller builds it
(BUILD_JOBS at a time); a Component is built through an empty parent, as a user would.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from generators.core.errors import InputError
from generators.core.yamlio import SafeLoader, load_documents
from generators.validation.manifests import Doc, Problem, is_manifest, meta, norm, yaml_error

# The machine has two cores; kustomize builds run this many at a time.
BUILD_JOBS = 2
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
YAML_SUFFIXES = (".yaml", ".yml")


@dataclass
class Build:
    """The output of `kustomize build` of one directory."""

    dir: str
    file: str  # the kustomization file, for messages
    docs: list[Doc] = field(default_factory=list)
    text: str = ""
    error: str = ""


def repo_files(root: Path) -> list[str]:
    """Files git knows about under root: tracked (and present) or untracked and not ignored."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise InputError(
            f"not a git work tree ({e})", file=str(root), fix="validate a checkout of the repository"
        ) from e
    names = sorted({n for n in out.decode().split("\0") if n})
    return [n for n in names if (root / n).is_file()]


def kustomization_refs(k: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(resources and bases, components and every other path a kustomization reads), as written in it."""

    def strings(v: Any) -> list[str]:
        return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []

    resources = strings(k.get("resources")) + strings(k.get("bases"))
    components = strings(k.get("components"))
    files: list[str] = (
        strings(k.get("crds"))
        + strings(k.get("configurations"))
        + strings(k.get("transformers"))
        + strings(k.get("generators"))
        + strings(k.get("validators"))
        + strings(k.get("patchesStrategicMerge"))
    )
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


class RepoIndex:
    """What validation knows about a checkout: its files, parsed YAML, kustomizations and builds."""

    def __init__(self, root: Path, files: Sequence[str]):
        self.root = root
        self.files = list(files)
        self.yaml_files = [
            f for f in self.files if f.endswith(YAML_SUFFIXES) or PurePosixPath(f).name == "Kustomization"
        ]
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
        dirs: list[str] = []
        files: list[str] = []
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
                    f"  - {json.dumps(os.path.relpath(self.root / d, tmp))}\n"
                )  # kustomize wants it relative
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
            candidates += [
                x
                for f in own
                for x in self.docs.get(f, [])
                if (isinstance(x.data, dict) and x.data.get("kind") == kind) or _is_json_patch(x.data)
            ]
            queue.extend(dirs)
        for x in candidates:
            if any(_holds(x.data, p) for p in paths):
                return x.file
        return next(
            (x.file for x in candidates if isinstance(x.data, dict) and meta(x.data, "name") == name), build.file
        )


def _is_json_patch(data: Any) -> bool:
    return isinstance(data, list) and bool(data) and all(isinstance(op, dict) and "op" in op for op in data)


def _holds(data: Any, keys: Sequence[str]) -> bool:
    """Whether a manifest (or the values of a JSON patch) holds the field at `keys`."""
    if _is_json_patch(data):
        for op in data:
            at = [k.replace("~1", "/").replace("~0", "~") for k in str(op.get("path", "")).split("/")[1:]]
            if (
                "value" in op
                and len(at) <= len(keys)
                and all(a in (k, "-") for a, k in zip(at, keys, strict=False))
                and _holds(op["value"], keys[len(at) :])
            ):
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
    return subprocess.run(
        [kustomize, "build", "--load-restrictor=LoadRestrictionsNone", path], capture_output=True, text=True
    )
