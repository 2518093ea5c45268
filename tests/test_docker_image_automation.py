"""Flux image automation for the trainer image: the objects pass their schemas, they agree with the
marked image lines (the data staging and pre-flight Jobs) and with the workflow that pushes the image,
and a tag written the way image-automation-controller writes it survives the generator without a diff
and without touching any run: a run's image is part of its name (the `image` run field), so a release
never rewrites a running PyTorchJob."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO_ROOT

from generators.core.gotools import tool
from generators.matrix.schema import DEFAULT_IMAGE
from generators.render.flux import FLUX_NAMESPACE, SOURCE_NAME
from generators.validation.schemas import default_crd_dir

AUTOMATION = REPO_ROOT / "base" / "image-automation"
JOB = REPO_ROOT / "base" / "data-staging" / "job.yaml"
RUN_JOB = REPO_ROOT / "base" / "pytorchjob" / "pytorchjob.yaml"
RUN_TEMPLATES = (RUN_JOB, REPO_ROOT / "base" / "trainjob" / "runtime.yaml")
POLICY_REF = "flux-system:fsdp-trainer"
# A line that image-automation-controller's Setters strategy updates: a YAML scalar followed by the
# marker comment; with no ":tag"/":name" suffix in the marker the whole image reference is replaced.
MARKED = re.compile(
    r'^(?P<head>\s*(?:-\s+)?image:\s*)(?P<image>\S+)(?P<marker>\s+# \{"\$imagepolicy": "(?P<ref>[^"]+)"\})\s*$'
)


def set_image(text: str, policy_ref: str, image: str) -> tuple[str, int]:
    """Replace the value of every line marked for `policy_ref`, as the Setters strategy does."""
    out, count = [], 0
    for line in text.splitlines(keepends=True):
        m = MARKED.match(line.rstrip("\n"))
        if m and m.group("ref") == policy_ref:
            line = f"{m.group('head')}{image}{m.group('marker')}\n"
            count += 1
        out.append(line)
    return "".join(out), count


def build(path: Path) -> list[dict]:
    proc = subprocess.run(
        [tool("kustomize"), "build", "--load-restrictor=LoadRestrictionsNone", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def kubeconform_crds(text: str) -> dict:
    location = f"{default_crd_dir()}/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json"
    proc = subprocess.run(
        [tool("kubeconform"), "-strict", "-summary", "-output", "json", "-schema-location", location, "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    return {d["kind"]: d for d in build(AUTOMATION)}


def job_image() -> str:
    matches = [m for line in JOB.read_text().splitlines() if (m := MARKED.match(line))]
    assert len(matches) == 1, "base/data-staging must carry exactly one marked image line"
    assert matches[0].group("ref") == POLICY_REF
    return matches[0].group("image")


@pytest.mark.gotools
def test_the_image_automation_objects_pass_the_flux_image_schemas(objects):
    assert set(objects) == {"ImageRepository", "ImagePolicy", "ImageUpdateAutomation"}
    text = "---\n".join(yaml.safe_dump(d) for d in objects.values())
    report = kubeconform_crds(text)
    assert report["summary"] == {"valid": 3, "invalid": 0, "errors": 0, "skipped": 0}, report


@pytest.mark.gotools
def test_an_unknown_field_fails_the_flux_image_schemas(objects):
    policy = json.loads(json.dumps(objects["ImagePolicy"]))
    policy["spec"]["policy"]["semver"]["rnage"] = ">=0.1.0"
    report = kubeconform_crds(yaml.safe_dump(policy))
    assert report["summary"]["invalid"] == 1 and "rnage" in report["resources"][0]["msg"], report


@pytest.mark.gotools
def test_the_objects_agree_with_the_marked_image_line_and_the_flux_source(objects):
    repo_, policy, automation = objects["ImageRepository"], objects["ImagePolicy"], objects["ImageUpdateAutomation"]
    namespace, name = POLICY_REF.split(":")
    assert {o["metadata"]["namespace"] for o in objects.values()} == {namespace, FLUX_NAMESPACE}
    assert policy["metadata"]["name"] == name
    assert policy["spec"]["imageRepositoryRef"]["name"] == repo_["metadata"]["name"]
    repository, _, tag = job_image().rpartition(":")
    assert repo_["spec"]["image"] == repository and repo_["spec"]["provider"] == "aws"
    assert automation["spec"]["sourceRef"] == {
        "kind": "GitRepository",
        "name": SOURCE_NAME,
        "namespace": FLUX_NAMESPACE,
    }
    assert automation["spec"]["update"] == {"path": "./base", "strategy": "Setters"}
    assert (
        automation["spec"]["git"]["push"]["branch"] == automation["spec"]["git"]["checkout"]["ref"]["branch"] == "main"
    )
    # The committed tag is one the policy can select, and per-commit tags are not.
    pattern = re.compile(policy["spec"]["filterTags"]["pattern"])
    assert pattern.match(tag) and not pattern.match("sha-" + "0" * 40)
    assert all(re.match(p, "sha-" + "0" * 40) for p in repo_["spec"]["exclusionList"][:1])


@pytest.mark.gotools
def test_every_trainer_image_in_git_is_marked_and_inside_the_automation_path(objects):
    """The data staging Job runs the trainer image too: an unmarked copy would stay on an old tag."""
    path = objects["ImageUpdateAutomation"]["spec"]["update"]["path"]
    repository = job_image().rpartition(":")[0]
    users = [f for f in sorted((REPO_ROOT / "base").rglob("*.yaml")) if repository + ":" in f.read_text()]
    assert {f.relative_to(REPO_ROOT).as_posix() for f in users} >= {
        "base/pytorchjob/pytorchjob.yaml",
        "base/data-staging/job.yaml",
        "base/preflight/job.yaml",
    }
    # The run templates' images (the PyTorchJob's and the TrainJob runtime's) are the runs' default and
    # never marked: each run pins its own image.
    for template in RUN_TEMPLATES:
        run_lines = [line for line in template.read_text().splitlines() if repository + ":" in line]
        assert run_lines and not any(MARKED.match(line) for line in run_lines), (template, run_lines)
        assert all(line.split("image:", 1)[1].strip() == DEFAULT_IMAGE for line in run_lines if "image:" in line)
    for f in users:
        if f in RUN_TEMPLATES:
            continue
        assert (REPO_ROOT / path).resolve() in f.resolve().parents, f"{f} is outside the automation path {path}"
        lines = [line for line in f.read_text().splitlines() if repository + ":" in line]
        assert all((m := MARKED.match(line)) and m.group("ref") == POLICY_REF for line in lines), (f, lines)


def test_the_workflow_pushes_to_the_repository_flux_scans():
    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "image.yaml").read_text())
    ecr_repository = workflow["jobs"]["push"]["env"]["ECR_REPOSITORY"]
    assert job_image().rpartition(":")[0].endswith(".amazonaws.com/" + ecr_repository)


@pytest.mark.gotools
def test_a_new_tag_round_trips_through_the_generator_without_a_diff(tmp_path):
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "repo"
    for rel in filter(None, files):
        if (REPO_ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, copy / rel)
    expand = [sys.executable, str(copy / "generators" / "expand.py"), str(copy / "matrix.yaml"), "--check"]
    before = subprocess.run(expand, cwd=copy, capture_output=True, text=True, check=False)
    assert before.returncode == 0, "overlays/ is stale before any tag change:\n" + before.stdout + before.stderr
    job = copy / "base" / "data-staging" / "job.yaml"
    repository = job_image().rpartition(":")[0]
    new_image = f"{repository}:9.8.7"
    text, count = set_image(job.read_text(), POLICY_REF, new_image)
    assert count == 1
    job.write_text(text)

    # The marker stays on the image line, and the file is still the same YAML but for the image.
    after = [m for line in text.splitlines() if (m := MARKED.match(line))]
    assert [(m.group("image"), m.group("ref")) for m in after] == [(new_image, POLICY_REF)]
    before_doc, after_doc = yaml.safe_load(JOB.read_text()), yaml.safe_load(text)
    container = after_doc["spec"]["template"]["spec"]["containers"][0]
    assert container.pop("image") == new_image
    before_doc["spec"]["template"]["spec"]["containers"][0].pop("image")
    assert after_doc == before_doc

    # Regenerating the overlays changes nothing ...
    check = subprocess.run(expand, cwd=copy, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # ... and no run changes: each keeps the image it names (a running job is never rewritten).
    run_dir = next(p.parent for p in sorted((copy / "overlays" / "runs").rglob("kustomization.yaml")))
    jobs = [d for d in build(run_dir) if d["kind"] == "PyTorchJob"]
    images = [j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"] for j in jobs]
    assert images == [DEFAULT_IMAGE] and new_image not in images
