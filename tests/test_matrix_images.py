"""A run's image and its cluster's Capacity Block, checked at the matrix line: the image is a well-formed
reference pinned by tag or digest (never `latest`, never empty); a `capacity_block_end` in the past is
refused; a run predicted to outlast its block is warned about (generators/plan/window.py says why a
warning). The clock is injected (load(..., now=...), or generators.matrix.load.utc_now for the CLI), so
every case is the same on any day."""

from __future__ import annotations

import datetime as dt
import sys

import pytest
from matrix_support import HEADER, line_of
from support import cli_run

from generators import expand
from generators.core.errors import InputError
from generators.matrix import expand as expand_runs
from generators.matrix import images
from generators.matrix.load import load
from generators.matrix.schema import DEFAULT_IMAGE
from generators.plan import plan_runs
from generators.plan.window import block_overruns

# The module (the package re-exports its function `load` under the same name).
load_mod = sys.modules["generators.matrix.load"]

RUNS = """\
defaults:
  cluster: fsdp-p5
  model: llama2-7b
  nodes: 1
  trainer:
    data: {format: synthetic}
    training: {max_steps: 100}
include:
  - {image: "IMAGE"}
"""
DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "image",
    [
        DEFAULT_IMAGE,
        "registry.example/trainer:0.2.0",
        "localhost:5000/fsdp/trainer:v1_rc.2",
        "public.ecr.aws/example/fsdp-trainer@" + DIGEST,
        "ghcr.io/org/trainer:0.3.1@" + DIGEST,
        "trainer:1",
    ],
)
def test_a_pinned_well_formed_image_is_accepted(image):
    (run,) = expand_runs(load("m.yaml", HEADER + RUNS.replace("IMAGE", image)))
    assert run.image == image


@pytest.mark.parametrize(
    ("image", "message", "fix"),
    [
        ("", "is empty", "name the image"),
        ("registry.example/trainer", "has no tag", "pin it by tag or digest"),
        ("registry.example/trainer:latest", "uses the moving tag latest", "pin it by tag or digest"),
        ("registry.example/Trainer:1.0", "is not a well-formed image reference", "write registry/repository:1.2.0"),
        ("registry.example/trainer:1.0 ", "is not a well-formed image reference", "write registry/repository"),
        ("registry.example//trainer:1.0", "is not a well-formed image reference", "write registry/repository"),
        ("registry.example/trainer:", "is not a well-formed image reference", "write registry/repository"),
        ("https://registry.example/trainer:1.0", "is not a well-formed image reference", "write"),
        ("registry.example/trainer@sha256:abc", "is not a well-formed image reference", "write"),
        ("registry.example/trainer@sha256:" + "a" * 40, "sha256 digest of 40 hex digits", "copy the whole digest"),
        ("registry.example/trainer:" + "v" * 129, "is not a well-formed image reference", "write"),
    ],
)
def test_a_bad_image_is_refused_at_its_line(image, message, fix):
    text = HEADER + RUNS.replace("IMAGE", image)
    with pytest.raises(InputError) as err:
        load("m.yaml", text)
    text_of = str(err.value)
    assert text_of.startswith(f"m.yaml:{line_of(text, 'image:')}: include[0].image: "), text_of
    assert message in text_of and f"fix: {fix}" in text_of


def test_the_validator_and_the_matrix_share_the_rule():
    assert (
        images.image_problem("ghcr.io/org/trainer") == "image ghcr.io/org/trainer has no tag; pin it by tag or digest"
    )
    assert images.image_problem("Bad Image:1").startswith("image 'Bad Image:1' is not a well-formed image reference")
    assert images.image_problem(None) == "has no image"


BLOCK = HEADER.replace(
    "    instance_types: [p5.48xlarge]\n",
    "    instance_types: [p5.48xlarge]\n    capacity_reservation_ids: [cr-0123456789abcdef0]\n"
    '    capacity_blocks: true\n    capacity_block_end: "2026-12-10T11:30:00Z"\n',
    1,
)
NOW = dt.datetime(2026, 12, 3, 9, 0, tzinfo=dt.UTC)


def test_a_block_end_in_the_past_is_refused_with_the_value_and_the_fix():
    text = BLOCK + RUNS.replace("IMAGE", DEFAULT_IMAGE)
    assert load("m.yaml", text, now=NOW).clusters["fsdp-p5"].capacity_block_end == "2026-12-10T11:30:00Z"
    for later in (dt.datetime(2026, 12, 10, 11, 30, tzinfo=dt.UTC), dt.datetime(2027, 1, 1, tzinfo=dt.UTC)):
        with pytest.raises(InputError) as err:
            load("m.yaml", text, now=later)
        message = str(err.value)
        assert message.startswith(
            f"m.yaml:{line_of(text, 'capacity_block_end')}: clusters.fsdp-p5.capacity_block_end: "
        )
        assert "2026-12-10T11:30:00Z is past (now " + later.strftime("%Y-%m-%dT%H:%M:%SZ") in message
        assert "fix: set the end of the cluster's next Capacity Block" in message


def test_the_cli_reads_the_injected_clock_refuses_a_past_end_and_writes_nothing(tmp_path, monkeypatch):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(BLOCK + RUNS.replace("IMAGE", DEFAULT_IMAGE))
    out = tmp_path / "out"
    monkeypatch.setattr(load_mod, "utc_now", lambda: dt.datetime(2026, 12, 11, tzinfo=dt.UTC))
    result = cli_run(expand.main, [matrix, "--out", out])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "capacity_block_end: 2026-12-10T11:30:00Z is past (now 2026-12-11T00:00:00Z)" in line
    assert not out.exists()


def steps_text(max_steps: int) -> str:
    return BLOCK + RUNS.replace("IMAGE", DEFAULT_IMAGE).replace("max_steps: 100", f"max_steps: {max_steps}")


def test_a_run_that_outlasts_its_block_is_warned_about_with_both_figures():
    # 100 steps of Llama 2 7B on one p5 node take minutes; 3,000,000 about 13 days, more than the week left.
    short = load("m.yaml", steps_text(100), now=NOW)
    assert block_overruns(short, plan_runs(short, expand_runs(short))) == []
    long = load("m.yaml", steps_text(3_000_000), now=NOW)
    (warning,) = block_overruns(long, plan_runs(long, expand_runs(long)))
    assert warning.startswith(f"m.yaml:{line_of(steps_text(1), 'capacity_block_end')}: clusters.fsdp-p5.")
    hours = float(warning.split("needs about ")[1].split(" hours")[0].replace(",", ""))
    left = float(warning.split("the block leaves ")[1].split(" ")[0].replace(",", ""))
    assert hours > left and left == pytest.approx(
        (dt.datetime(2026, 12, 10, 11, 30, tzinfo=dt.UTC) - NOW).total_seconds() / 3600 - 0.5, abs=0.3
    )
    assert "fix: resume it in the next block" in warning
    # The same run with the block far away is not warned about.
    far = load("m.yaml", steps_text(3_000_000).replace("2026-12-10", "2099-12-10"), now=NOW)
    assert block_overruns(far, plan_runs(far, expand_runs(far))) == []


def test_the_cli_warns_on_stderr_and_still_writes_the_overlays(tmp_path, monkeypatch):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(steps_text(3_000_000))
    monkeypatch.setattr(load_mod, "utc_now", lambda: NOW)
    result = cli_run(expand.main, [matrix, "--out", tmp_path / "out"])
    assert result.exit_code == 0, result.output
    (warning,) = [x for x in result.stderr.splitlines() if x.startswith("warning: ")]
    assert "will checkpoint and stop unfinished" in warning
    assert list((tmp_path / "out" / "runs" / "fsdp-p5").iterdir())
