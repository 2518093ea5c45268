"""The GitHub workflows pass actionlint (with shellcheck), pin every action by commit, and keep
AWS access to a short-lived OIDC role session."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators.core.gotools import tool

WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yaml"))
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", re.M)


def actionlint(*paths: Path) -> subprocess.CompletedProcess:
    # shellcheck is passed explicitly: actionlint silently skips script checks when it is absent.
    return subprocess.run(
        [tool("actionlint"), "-no-color", "-shellcheck", tool("shellcheck"), *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
    )


def unpinned_actions(text: str) -> list[str]:
    """Every `uses:` that is not owner/repo@<40-hex commit> followed by a `# vX.Y.Z` comment."""
    bad = []
    for ref, rest in USES.findall(text):
        if ref.startswith("./"):
            continue
        if not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref) or not re.fullmatch(r"\s*# v\d+\.\d+\.\d+", rest):
            bad.append(f"{ref}{rest}")
    return bad


def test_there_are_the_ci_and_image_workflows():
    assert {path.name for path in WORKFLOWS} >= {"ci.yaml", "image.yaml"}


@pytest.mark.gotools
def test_actionlint_passes_on_every_workflow():
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.gotools
def test_actionlint_reports_a_broken_workflow(tmp_path):
    broken = tmp_path / ".github" / "workflows" / "ci.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text((REPO_ROOT / ".github/workflows/ci.yaml").read_text().replace("runs-on:", "runs_on:", 1))
    result = actionlint(broken)
    assert result.returncode != 0 and "runs_on" in result.stdout, result.stdout


@pytest.mark.gotools
def test_actionlint_runs_shellcheck_on_run_scripts(tmp_path):
    broken = tmp_path / "wf.yaml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo $UNQUOTED_VAR\n")
    result = actionlint(broken)
    assert result.returncode != 0 and "shellcheck" in result.stdout, result.stdout


def test_every_action_is_pinned_by_commit_with_its_version():
    for path in WORKFLOWS:
        text = path.read_text()
        assert USES.search(text), f"{path.name} uses no action: the pin check would check nothing"
        assert unpinned_actions(text) == [], path.name


def test_the_pin_check_rejects_a_tag_and_a_missing_version_comment():
    text = (
        "      - uses: actions/checkout@v5\n"
        "      - uses: actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8\n"
        "      - uses: actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8 # v5.0.0\n"
    )
    assert unpinned_actions(text) == [
        "actions/checkout@v5",
        "actions/checkout@08c6903cd8c0fde910a37f88322edcfb5dd907a8",
    ]


def test_one_action_is_pinned_to_one_commit_everywhere():
    commits: dict[str, set[str]] = {}
    for path in WORKFLOWS:
        for ref, _ in USES.findall(path.read_text()):
            action, _, commit = ref.partition("@")
            commits.setdefault(action, set()).add(commit)
    assert {a: c for a, c in commits.items() if len(c) > 1} == {}


def test_the_image_is_pushed_with_an_oidc_role_and_no_stored_keys():
    text = (REPO_ROOT / ".github/workflows/image.yaml").read_text()
    workflow = yaml.safe_load(text)
    push = workflow["jobs"]["push"]
    assert push["permissions"] == {"contents": "read", "id-token": "write"}
    assert workflow["permissions"] == {"contents": "read"}
    assert "id-token" not in workflow["jobs"]["build"].get("permissions", {})
    aws = next(s for s in push["steps"] if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@"))
    assert aws["with"]["role-to-assume"] == "${{ vars.AWS_ECR_PUSH_ROLE_ARN }}"
    for forbidden in ("aws-access-key-id", "aws-secret-access-key", "AWS_SECRET_ACCESS_KEY"):
        assert forbidden not in text
    build = next(s for s in push["steps"] if s.get("uses", "").startswith("docker/build-push-action@"))
    assert build["with"]["push"] is True and build["with"]["file"] == "docker/Dockerfile"
    assert "sha-$GITHUB_SHA" in text and "$image:$VERSION" in text


def test_the_test_command_runs_the_regenerate_validate_and_test_stages_with_the_pinned_tools():
    """CI runs tools/test.sh (tests/test_quickstart.py): every stage of the gate is in it."""
    script = (REPO_ROOT / "tools/test.sh").read_text()
    for command in (
        'PYTHON="$python" bash tools/setup.sh test',
        '"$python" -m ruff check .',
        '"$python" -m ruff format --check .',
        '"$python" -m mypy',
        '"$python" generators/expand.py matrix.yaml --check',
        '"$python" generators/cluster.py matrix.yaml --check',
        '"$python" generators/validate.py --crd-schemas "$FSDP_GITOPS_CRD_SCHEMAS"',
        '"$python" -m pytest',
    ):
        assert command in script, command
