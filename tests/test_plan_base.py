"""`expand.py MATRIX --plan --base REF` against a real git repository: a changed run shows its
tokens/s per GPU, hours and cost before and after, and a change that makes a run impossible to fit
is an error row with the refusal whose former cost is not counted as a saving."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from matrix_support import HEADER
from support import cli_run

from generators.expand import main

BEFORE = (
    HEADER
    + """\
defaults:
  cluster: fsdp-p5
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
    training: {lr: 2.0e-5}
include:
  - {model: llama2-7b, nodes: 1}
  - {model: llama2-13b, nodes: 1, trainer.training.batch_size_per_gpu: 2}
"""
)
# The learning rate changes every run; 13B's batch of 16 without checkpointing cannot fit 80 GB GPUs.
AFTER = BEFORE.replace("lr: 2.0e-5", "lr: 3.0e-5").replace(
    "trainer.training.batch_size_per_gpu: 2}",
    "trainer.training.batch_size_per_gpu: 16, trainer.parallelism.activation_checkpointing: none}",
)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def number(cell: str) -> float:
    return float(cell.replace(",", "").replace("+", ""))


def plan_diff(tmp_path: Path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    matrix = repo / "matrix.yaml"
    matrix.write_text(BEFORE)
    git(repo, "add", "matrix.yaml")
    git(repo, "commit", "-q", "-m", "before")
    before = cli_run(main, [str(matrix), "--plan"])
    matrix.write_text(AFTER)
    git(repo, "commit", "-q", "-am", "after")
    return before, cli_run(main, [str(matrix), "--plan", "--base", "HEAD~1"])


def plan_table(output: str) -> dict[str, list[str]]:
    header = next(cells(line) for line in output.splitlines() if line.startswith("| run "))
    out = {}
    for line in output.splitlines():
        row = cells(line)
        # The plan table's rows (the shared volume's table of the runs has other columns).
        if re.fullmatch(r"llama[a-z0-9-]+-[0-9a-f]{6}( REFUSED)?", row[0]) and len(row) == len(header):
            out[row[0].split()[0].rsplit("-", 1)[0]] = dict(zip(header, row, strict=True))
    return out


def test_a_changed_run_shows_tokens_hours_and_cost_before_and_after(tmp_path):
    before, result = plan_diff(tmp_path)
    assert before.exit_code == 0, before.output
    assert result.exit_code == 1, result.output  # a refused run fails the plan
    out = result.stdout
    assert "Added: 0, removed: 0, changed: 2" in out
    old = plan_table(before.stdout)["llama2-7b-p5-n1-fullshard"]
    [row] = [
        cells(line) for line in out.splitlines() if line.startswith("| llama2-7b-p5-n1-fullshard-") and " -> " in line
    ]
    name, tokens, hours, cost, error = row
    assert re.fullmatch(r"llama2-7b-p5-n1-fullshard-[0-9a-f]{6} -> llama2-7b-p5-n1-fullshard-[0-9a-f]{6}", name)
    # The learning rate changes nothing the plan predicts: the figures stand as they were.
    assert tokens == old["tokens/s per GPU"].split(" (")[0]
    assert hours == old["hours"] and cost == old["cost, USD"] and error == ""
    assert "trainer.training.lr: 2e-05 -> 3e-05" in out


def test_a_change_that_makes_a_run_unfit_is_an_error_row_and_not_a_saving(tmp_path):
    before, result = plan_diff(tmp_path)
    out = result.stdout
    old = plan_table(before.stdout)["llama2-13b-p5-n1-fullshard"]
    [row] = [
        cells(line) for line in out.splitlines() if line.startswith("| llama2-13b-p5-n1-fullshard-") and " -> " in line
    ]
    _, tokens, hours, cost, error = row
    assert tokens == f"{old['tokens/s per GPU'].split(' (')[0]} -> REFUSED"
    assert hours == f"{old['hours']} -> REFUSED" and cost == f"{old['cost, USD']} -> REFUSED"
    assert error.startswith("ERROR: llama2-13b needs about ") and "GiB per GPU" in error and "Cheapest fix: " in error
    assert "ERROR: this change makes 1 run(s) impossible to fit; they are not savings" in out
    # The difference counts the 7B run only (unchanged): the refused run's former cost is no saving.
    diff = cells(next(line for line in out.splitlines() if line.startswith("| difference")))
    assert number(diff[3]) == 0.0 and diff[1] == "+0"
    head = cells(next(line for line in out.splitlines() if line.startswith("| HEAD~1")))
    this = cells(next(line for line in out.splitlines() if line.startswith("| this change")))
    assert (
        number(head[3])
        == number(this[3])
        == number(plan_table(before.stdout)["llama2-7b-p5-n1-fullshard"]["cost, USD"])
    )
