"""The repository's house rules, checked on its sources (ast, no imports run):

- no import circle anywhere, function-local imports included (an import inside a function is still a
  dependency; hiding a circle there only moves the failure to run time);
- no import of another module's private (`_name`) names, by `from x import _y` or `x._y`;
- no module under tools/ over 600 lines, and no `.py` there sharing its name with a folder beside it
  (the Go modules live under tools/cluster/go/);
- one webhook-certificate helper (tools/cluster/certs.py) for every controller the harness runs;
- tests: no test module imports another (shared fixtures and helpers live in conftest.py or
  `*_support.py`), and only tests/cluster/ starts the harness's levels.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

from support import REPO_ROOT

PACKAGES = ("generators", "trainer", "tools", "benchmarks", "docker", "tests")
TOOLS_MAX_LINES = 600
# tests/ and tests/cluster/ are on the tests' import path (rootdir conftest), as tests/data is for some.
TEST_PATHS = ("tests", "tests/cluster", "tests/data")


def sources() -> Iterator[Path]:
    for top in PACKAGES:
        yield from sorted(p for p in (REPO_ROOT / top).rglob("*.py") if "go" not in p.relative_to(REPO_ROOT).parts)


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO_ROOT).with_suffix("")
    for base in sorted(TEST_PATHS, key=len, reverse=True):  # test modules import each other by bare name
        if rel.parts[: len(Path(base).parts)] == Path(base).parts and rel.parent == Path(base):
            return rel.name
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {module_name(p): p for p in sources()}


def resolve(name: str) -> str | None:
    """The repository module `name` is, or lies in (a name imported from a module), or None."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imports(path: Path) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import in the file, nested ones included."""
    tree = parsed(path)
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name, node.lineno


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for base, name, _ in imports(path):
            target = resolve(f"{base}.{name}" if name and f"{base}.{name}" in MODULES else base)
            if target and target != mod and not mod.startswith(target + "."):  # a package's own __init__
                edges[mod].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere_function_local_imports_included() -> None:
    assert cycles(graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for mod, path in MODULES.items():
        aliases: dict[str, str] = {}
        for base, name, line in imports(path):
            target = resolve(base)
            if target is None:
                continue
            if name.startswith("_") and not name.startswith("__") and resolve(f"{base}.{name}") != f"{base}.{name}":
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: from {base} import {name}")
            if name and f"{base}.{name}" in MODULES:
                aliases[name] = f"{base}.{name}"
        tree = parsed(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and resolve(alias.name) == alias.name:
                        aliases[alias.asname] = alias.name
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != mod
            ):
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert found == []


def test_no_module_under_tools_is_over_600_lines_or_named_like_a_folder() -> None:
    long = {
        str(p.relative_to(REPO_ROOT)): n
        for p in (REPO_ROOT / "tools").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > TOOLS_MAX_LINES
    }
    assert long == {}
    clashes = [str(p) for p in (REPO_ROOT / "tools").rglob("*.py") if p.with_suffix("").is_dir()]
    assert clashes == []


def test_one_webhook_certificate_helper() -> None:
    """Only tools/cluster/certs.py reads a serving certificate out of a Secret."""
    holders = sorted(
        str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "tools").rglob("*.py") if '"tls.crt"' in p.read_text()
    )
    assert holders == ["tools/cluster/certs.py"]


def test_no_test_module_imports_another_test_module() -> None:
    found = []
    for mod, path in MODULES.items():
        if not path.is_relative_to(REPO_ROOT / "tests"):
            continue
        for base, name, line in imports(path):
            target = resolve(f"{base}.{name}" if name else base) or ""
            if target.rpartition(".")[2].startswith("test_") and target != mod:
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: {target}")
    assert found == []


def test_only_the_cluster_tier_starts_levels() -> None:
    """Outside tests/cluster/ nothing starts a level or uses a started cluster's parts."""
    harness = ("tools.cluster.cluster", "tools.cluster.steps")
    found = []
    for path in (REPO_ROOT / "tests").rglob("*.py"):
        if path.is_relative_to(REPO_ROOT / "tests" / "cluster"):
            continue
        for base, name, line in imports(path):
            full = f"{base}.{name}" if name else base
            if any(full == h or full.startswith(h + ".") for h in harness):
                found.append(f"{path.relative_to(REPO_ROOT)}:{line}: {full}")
        for node in ast.walk(parsed(path)):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr == "start" and getattr(func.value, "id", "") == "levels":
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: levels.start(...)")
    assert found == []


def test_every_module_that_needs_root_lives_in_the_cluster_tier() -> None:
    """A module marked realpods (root, namespaces, cgroups) runs under tests/cluster/ with the real-pods level."""
    found = []
    for path in (REPO_ROOT / "tests").rglob("*.py"):
        if path.is_relative_to(REPO_ROOT / "tests" / "cluster"):
            continue
        for node in ast.walk(parsed(path)):
            mark = node if isinstance(node, ast.Attribute) and node.attr == "realpods" else None
            if mark is not None and isinstance(mark.value, ast.Attribute) and mark.value.attr == "mark":
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: pytest.mark.realpods")
    assert found == []
