"""How pytest-xdist shares the tests out (tests/conftest.py): the unit of work each test belongs to, and
the units that take minutes, handed out first.

A unit runs on one worker, its tests in collection order. Outside tests/cluster/ a unit is a test
module, so that its expensive module fixtures (trained tiny models, started servers) are set up once.
Under tests/cluster/ the unit follows what the module uses, read from its source (the xdist controller
that asks has node ids only, no imported modules):

- a module that takes the real-pods level (`pods` of tests/cluster/conftest.py) is in "realpods", one
  unit for all of them, so that each level is started once and stopped after its last module;
- a module that takes the shared control plane (`cluster` of tests/cluster/conftest.py) is in "cluster";
- a module parametrized by the clusters of matrix.yaml (test_cluster_flux.py: one Flux environment per
  cluster) is one unit per cluster, `<module>[<cluster>]`;
- any other module (its own control plane, real processes or mounts, or nothing started) is its own unit.

A fixture of the module's own (defined or imported) by one of those names is not the shared one.
The cluster names come from matrix.yaml, so a renamed or added cluster keeps its scheduling.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import yaml
from support import REPO_ROOT

CLUSTER_TESTS = "tests/cluster/"
# The shared fixtures of tests/cluster/conftest.py and the unit of the modules that take them, in the
# order they are looked for (a module that takes the real-pods level is in its chain whatever else it takes).
SHARED_FIXTURES = {
    "pods": "realpods",
    "realpods_levels": "realpods",
    "cluster": "cluster",
    "operator_cluster": "cluster",
}
FLUX = "tests/cluster/test_cluster_flux.py"
FLUX_TRAINJOB = "tests/cluster/test_cluster_flux_trainjob.py"
KUEUE = "tests/cluster/test_cluster_kueue.py"


@functools.cache
def matrix_clusters(matrix: Path = REPO_ROOT / "matrix.yaml") -> tuple[str, ...]:
    """The clusters of matrix.yaml, sorted (as test_cluster_flux.py parametrizes its environments)."""
    return tuple(sorted(yaml.safe_load(matrix.read_text())["clusters"]))


def long_units(clusters: tuple[str, ...]) -> tuple[str, ...]:
    """The units that take minutes, in the order they are handed out: the real-pods chain (the longest),
    the first cluster's Flux environment, the shared control plane, the TrainJob Flux environment, the
    Kueue control plane, then the other clusters' Flux environments. xdist's own order (by number of
    tests) put the Flux units last, where they ran side by side while the workers' other work had ended:
    the Flux broken-commit test took 134-144 s there against 15 s alone."""
    flux = [f"{FLUX}[{name}]" for name in clusters]
    return ("realpods", *flux[:1], "cluster", FLUX_TRAINJOB, KUEUE, *flux[1:])


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
        isinstance(target, ast.Name) and target.id == "fixture"
    )


def _arguments(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = node.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@functools.cache
def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _support_file(name: str, folder: Path, root: Path) -> Path | None:
    """The file of an imported module that lives beside the tests (tests/cluster/ or tests/ is on the path)."""
    for base in (folder, root / "tests"):
        candidate = base / f"{name}.py"
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _taken(path: Path, root: Path, only: frozenset[str] | None = None) -> frozenset[str]:
    """What the tests and fixtures of the module at `path` take from outside it; with `only`, what the
    functions of those names take (the fixtures another module imports from it)."""
    tree = _module(path)
    taken: set[str] = set()
    for node in _functions(tree):
        fixture = any(_is_fixture(d) for d in node.decorator_list)
        if only is None and (fixture or node.name.startswith("test")) or only is not None and node.name in only:
            taken |= _arguments(node)
    if only is None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "usefixtures":
                taken |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    own: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Assign):
            own |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import):
            own |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported = frozenset(a.asname or a.name for a in node.names)
            own |= imported
            source = _support_file(node.module or "", path.parent, root) if node.level == 0 else None
            if source is not None:  # fixtures imported from a support module: what they take counts too
                taken |= _taken(source, root, imported & (taken | (only or frozenset())))
    return frozenset(taken - own)


def fixtures_taken(path: str, root: Path = REPO_ROOT) -> frozenset[str]:
    """The fixtures a test module (`path` from the repository root) takes from outside itself: the
    arguments of its tests and fixtures, of the fixtures it imports, and its usefixtures marks, less the
    names it defines or imports (test_cluster_trainjob.py's own `cluster` is not the shared one)."""
    return _taken(root / path, root)


def unit_of(nodeid: str, root: Path = REPO_ROOT) -> str:
    """The unit of work a test belongs to (see the module's docstring)."""
    path, _, rest = nodeid.partition("::")
    if not path.startswith(CLUSTER_TESTS):
        return path
    try:
        taken = fixtures_taken(path, root)
    except (OSError, SyntaxError):  # pytest reports the module's own error; it is a unit of its own
        return path
    for fixture, unit in SHARED_FIXTURES.items():
        if fixture in taken:
            return unit
    param = re.search(r"\[([^\]]+)\]$", rest)
    if param and param.group(1) in matrix_clusters(root / "matrix.yaml"):
        return f"{path}[{param.group(1)}]"
    return path


LONG_UNITS = long_units(matrix_clusters())
