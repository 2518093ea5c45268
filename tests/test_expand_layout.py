"""The shape of generators/: imports run one way (commands -> jobs -> shared core -> the trainer's pure
modules) without a circle, no module is over 600 lines, nothing below the commands exits, nothing
edits sys.path but the commands (run as `python generators/<command>.py` they put their own checkout
first), no name directly in generators/ hides an installed module (`python generators/expand.py` puts
that folder on sys.path too), and expand's command reads as its data flow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from support import REPO_ROOT

GENERATORS = REPO_ROOT / "generators"
COMMANDS = {"generators.expand", "generators.cluster", "generators.validate", "generators.report", "generators.status"}
JOBS = ("generators.matrix", "generators.plan", "generators.render", "generators.validation", "generators.results")
CORE = "generators.core"
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(GENERATORS.rglob("*.py"))}


def imports(path: Path) -> set[str]:
    """Project modules (generators.*, trainer.*) a module imports, at any level of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("generators", "trainer"))
    return found


def layer(name: str) -> int:
    """0: a command, 1: a job, 2: the shared core, 3: the trainer."""
    if name in COMMANDS:
        return 0
    if name.startswith(JOBS):
        return 1
    if name.startswith(CORE) or name == "generators":
        return 2
    assert name.startswith("trainer"), name
    return 3


def resolve(name: str, known: dict[str, Path]) -> str:
    """`generators.core.writer.JsonPatch` -> `generators.core.writer` (the module part of an import)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def test_imports_run_one_way_without_a_circle():
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        raw = imports(path)
        targets = {resolve(t, known) if t.startswith("generators") else t for t in raw}
        graph[name] = {t for t in targets if t in known and t != name}
        for target in targets:
            assert layer(target) >= layer(name), f"{name} imports {target}: imports run commands -> jobs -> core"
            if layer(target) == layer(name) == 0:
                raise AssertionError(f"{name} imports the command {target}")
        trainer_imports = {t for t in targets if t.startswith("trainer")}
        for t in trainer_imports:
            # storage: the checkpoint size (torch only inside the trainer's measuring functions).
            pure = ("catalog", "config", "memory", "capacity_block", "storage")
            assert t.split(".")[:2] in (["trainer", m] for m in pure), (
                f"{name} imports {t}, not one of the trainer's pure modules"
            )
    # No circle between modules (a package's __init__ counts as a module).
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in graph.get(n, ()):
            assert state.get(m) != 1, "import circle: " + " -> ".join(path + [n, m])
            if m not in state:
                visit(m, path + [n])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])


def test_the_trainer_never_imports_the_generators():
    for path in (REPO_ROOT / "trainer").rglob("*.py"):
        assert not any(t.startswith("generators") for t in imports(path)), path


def test_no_module_is_long_no_exit_below_the_commands_and_no_sys_path_edit():
    for name, path in modules().items():
        text = path.read_text()
        assert len(text.splitlines()) <= MAX_LINES, f"{path} has more than {MAX_LINES} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                used = f"{node.value.id}.{node.attr}"
                # Only a command, run as a script, puts its own checkout first (tests/test_checkouts.py).
                assert used != "sys.path" or name in COMMANDS, f"{path} uses sys.path: declare packages instead"
                assert used not in ("sys.exit", "os._exit"), f"{path} calls {used}; raise an error instead"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("exit", "quit"), f"{path} calls {node.func.id}; raise an error instead"


def test_no_name_directly_in_generators_hides_an_installed_module(tmp_path):
    names = sorted(
        {p.stem for p in GENERATORS.glob("*.py") if p.stem != "__init__"}
        | {p.name for p in GENERATORS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    )
    code = f"import importlib.util, sys\nprint([n for n in {names!r} if importlib.util.find_spec(n) is not None])"
    # From an empty directory, so only installed modules can be found.
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"these names would hide installed modules: {out.stdout}"


def test_expand_reads_as_its_data_flow():
    """load -> expand -> plan -> render -> serialize -> sync, each a call whose result is typed."""
    tree = ast.parse((GENERATORS / "expand.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    typed_calls = [
        n.value.func.id if isinstance(n.value.func, ast.Name) else n.value.func.attr
        for n in main.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.value, ast.Call)
    ]
    assert [c for c in typed_calls if c in ("load", "expand", "plan", "render", "serialize")] == [
        "load",
        "expand",
        "plan",
        "render",
        "serialize",
    ]
