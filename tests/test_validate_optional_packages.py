"""A command run without one of its optional Python packages says which and how to install it, in one
line, instead of a traceback (a newcomer who ran only the first quick-start command meets this)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import REPO_ROOT

BLOCK = """import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "kubernetes_validate":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _Block())
"""


@pytest.mark.gotools
def test_validate_without_kubernetes_validate_names_the_package_and_the_install_command(tmp_path):
    # The prepared core schemas are cached (as on any machine that validated once): the package is
    # still required, and still named, rather than a cache hit hiding that it is missing.
    from generators.validation.schemas import K8S_VERSION, prepare_core_schemas

    assert (prepare_core_schemas(K8S_VERSION) / "SOURCE").is_file()
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    proc = subprocess.run(
        [sys.executable, "generators/validate.py"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "kubernetes-validate" in lines[0] and "bash tools/setup.sh test" in lines[0]


# Only the packages the first quick-start command installs (requirements/generator.txt) importable.
ONLY_GENERATOR_PACKAGES = """import sys, sysconfig
ALLOWED = {"click", "yaml", "_yaml"}
SITE = sysconfig.get_paths()["purelib"]
class _Block:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in ALLOWED or top in sys.stdlib_module_names:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                spec = finder.find_spec(name, path, target)
            except Exception:
                spec = None
            if spec is not None:
                if spec.origin and spec.origin.startswith(SITE):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None
        return None
sys.meta_path.insert(0, _Block())
"""


@pytest.mark.gotools
@pytest.mark.parametrize(
    "command",
    [
        ["generators/expand.py", "matrix.yaml", "--plan", "--format", "csv"],
        ["generators/cluster.py", "matrix.yaml", "--check"],
        ["generators/report.py", "benchmarks/results/h200x1-final.jsonl"],
        ["generators/validate.py"],
    ],
)
def test_every_command_with_only_the_generator_packages_works_or_names_what_to_install(tmp_path, command):
    (tmp_path / "sitecustomize.py").write_text(ONLY_GENERATOR_PACKAGES)
    proc = subprocess.run(
        [sys.executable, *command],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "bash tools/setup.sh test" in lines[0], lines
