"""The validation pipeline: the steps of generators/validate.py, in order, over one checkout.

Each step appends Problems. The semantic checks on objects are a list of functions (OBJECT_CHECKS): a
new rule is a function `check(docs, blame) -> list[Problem]` added to that list, in its own module.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from generators.core.errors import InputError
from generators.core.gotools import REPO_ROOT, tool
from generators.validation.device_plugins import check_device_plugins
from generators.validation.fluxgraph import check_flux
from generators.validation.index import Build, RepoIndex, repo_files
from generators.validation.jobs import check_job_templates
from generators.validation.kueue import check_kueue_references, check_kueue_scope, check_kueue_values
from generators.validation.manifests import (
    FLUX_KUSTOMIZATION,
    Doc,
    Problem,
    gvk,
    is_manifest,
    meta,
    norm,
    obj_name,
    under,
)
from generators.validation.operator_fields import check_operator_fields
from generators.validation.podsecurity import check_pod_security
from generators.validation.readability import check_readability
from generators.validation.schemas import (
    CORE_SCHEMA_TEMPLATE,
    CRD_SCHEMA_TEMPLATE,
    CRD_SCHEMAS_ENV,
    K8S_VERSION,
    NON_CLUSTER_SCHEMAS,
    SCHEMA_CACHE,
    Unit,
    kubeconform_units,
    prepare_core_schemas,
)
from generators.validation.semantics import Blame, check_jobs, check_objects
from generators.validation.trainjob import (
    as_trainjob,
    check_trainer_installed,
    compose_trainjobs,
    object_problems,
    with_composed,
)

# Checks run on the documents of every unit (one kustomize build, or one plain manifest file); `blame`
# names the input file that set a field of a document.
ObjectCheck = Callable[[Sequence[Doc], Blame], list[Problem]]
OBJECT_CHECKS: list[ObjectCheck] = [
    check_objects,
    check_pod_security,
    check_readability,
    check_kueue_values,
    check_operator_fields,
    check_job_templates,
]


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


def validate(
    root: Path,
    paths: Sequence[str] = (),
    *,
    crd_dir: Path,
    k8s_version: str = K8S_VERSION,
    non_cluster: Mapping[tuple[str, str], str | None] = NON_CLUSTER_SCHEMAS,
    schema_cache: Path = SCHEMA_CACHE,
) -> Report:
    """Validate the checkout at `root`, or what lies under `paths` (relative to root)."""
    start = time.monotonic()
    if not crd_dir.is_dir():
        raise InputError(
            f"--crd-schemas {crd_dir}: not a directory; point it at a CRD schema folder in the "
            f"{{group}}/{{kind}}_{{version}}.json layout (or set {CRD_SCHEMAS_ENV})"
        )
    kustomize = tool("kustomize")
    core = prepare_core_schemas(k8s_version, schema_cache)
    scope = [norm(p) for p in paths] or [""]

    def in_scope(f: str) -> bool:
        return any(under(f, s) for s in scope)

    # 1. Parse.
    problems: list[Problem] = []
    repo = RepoIndex(root, repo_files(root))
    repo.parse(problems)

    # 2. Build every kustomization in scope (Components only where nothing uses them).
    used_as_base = {r for d in repo.kfiles for r in repo.local_refs(d)[0]}
    to_build = sorted(
        d for d in repo.kfiles if in_scope(repo.kfiles[d]) and not (repo.is_component(d) and d in used_as_base)
    )
    repo.build_all(to_build, kustomize)
    for d in to_build:
        b = repo.builds[d]
        if b.error:
            problems.append(
                Problem(
                    b.file,
                    0,
                    f"{repo.kustomization(d).get('kind', 'Kustomization')}/{d}",
                    f"kustomize build failed: {b.error}",
                )
            )

    # 3. Schemas: builds as kustomize printed them, plain manifest files as written.
    inputs = repo.input_files()
    plain = [
        f
        for f in repo.yaml_files
        if f not in inputs and in_scope(f) and any(is_manifest(x.data) for x in repo.docs.get(f, []))
    ]
    units = [
        Unit(d, repo.builds[d].docs, repo.builds[d], repo.builds[d].text) for d in to_build if not repo.builds[d].error
    ]
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
    p, num_resources = kubeconform_units(
        units, [f"{core}/{CORE_SCHEMA_TEMPLATE}", f"{crd_dir}/{CRD_SCHEMA_TEMPLATE}"], k8s_version, repo
    )
    problems += p
    for schema, docs in sorted(by_schema.items()):
        if not schema.is_file():
            problems += [
                Problem(
                    x.file,
                    x.line,
                    obj_name(x.data),
                    f"no schema {schema} for {x.data.get('apiVersion')} "
                    f"{x.data.get('kind')}; it belongs beside the CRD schema folder",
                )
                for x in docs
            ]
            continue
        p, n = kubeconform_units([Unit(x.file, [x]) for x in docs], [str(schema)], k8s_version, repo)
        problems += p
        num_resources += n

    # 4. Flux graph of each bootstrap directory in scope.
    roots = sorted(
        {
            norm(str(PurePosixPath(f).parent))
            for f in plain
            if any(gvk(x.data) == FLUX_KUSTOMIZATION for x in repo.docs[f])
        }
    )
    p, num_flux = check_flux(repo, roots, kustomize)
    problems += p

    # 5. Semantics: objects in every unit (blaming the input file that set a field), PyTorchJobs as
    # applied (builds nothing else builds on, and plain manifest files).
    blames = [_blame(repo, u.build) if u.build else lambda doc, keys: doc.file for u in units]
    for u, blame in zip(units, blames, strict=True):
        for check in OBJECT_CHECKS:
            problems += check(u.docs, blame)
    # TrainJobs as the pods they make with their runtime, held to the PyTorchJob rules (trainjob.py).
    composed, p = compose_trainjobs([(u.label, u.docs, b) for u, b in zip(units, blames, strict=True)])
    problems += p + object_problems(OBJECT_CHECKS, [c for cs in composed for c in cs])
    jobs = [with_composed(u.docs, blame, cs) for u, blame, cs in zip(units, blames, composed, strict=True)]
    p, num_jobs = check_jobs(
        [job for u, job in zip(units, jobs, strict=True) if u.build is None or u.build.dir not in used_as_base]
    )
    problems += as_trainjob(p, [c for cs in composed for c in cs])
    # Across the units of each cluster: runs against its device plugins and its provisioned nodes.
    p = check_device_plugins(
        [(u.label, docs) for u, (docs, _) in zip(units, jobs, strict=True)], {f: repo.docs[f] for f in repo.yaml_files}
    )
    problems += as_trainjob(p, [c for cs in composed for c in cs])
    # Per cluster: Kueue selects exactly the namespaces that hold its LocalQueues.
    problems += check_kueue_scope([(u.label, u.docs, b) for u, b in zip(units, blames, strict=True)])
    # Per trainjob cluster: its controllers install the Trainer with its CRDs and JobSet.
    problems += check_trainer_installed([(u.label, u.docs, b) for u, b in zip(units, blames, strict=True)])
    # Per cluster: every queue label, LocalQueue and ClusterQueue resolves, and Kueue queues each kind.
    problems += check_kueue_references([(u.label, u.docs, b) for u, b in zip(units, blames, strict=True)])

    return Report(
        collapse(problems),
        num_yaml_files=sum(1 for f in repo.yaml_files if in_scope(f)),
        num_builds=len(to_build),
        num_resources=num_resources,
        num_flux_kustomizations=num_flux,
        num_pytorchjobs=num_jobs,
        seconds=time.monotonic() - start,
    )


def _blame(repo: RepoIndex, build: Build) -> Callable[[Doc, tuple[str, ...]], str]:
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
    return [
        ps[0] if len(ps) == 1 else replace(ps[0], message=f"{ps[0].message} (and {len(ps) - 1} more like it)")
        for ps in groups.values()
    ]


def repository_root(paths: Sequence[Path], default: Path = REPO_ROOT) -> Path:
    """The git work tree holding all of `paths` (`default` when none is given)."""
    if not paths:
        return default
    roots = set()
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or directory")
        d = p if p.is_dir() else p.parent
        proc = subprocess.run(["git", "-C", str(d), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise InputError(f"{p}: not inside a git work tree; validate files of a checkout")
        roots.add(Path(proc.stdout.strip()).resolve())
    if len(roots) > 1:
        raise InputError(
            f"paths span several repositories ({', '.join(map(str, sorted(roots)))}); validate one at a time"
        )
    return roots.pop()
