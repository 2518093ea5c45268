"""`expand.py MATRIX --plan` and `--plan --base REF`: the table, totals per cluster, refused runs with
their reason and cheapest fix, the difference against a commit of a git repository the test makes,
one-line bad input with exit 2, and the pull-request workflow that posts the plan."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from matrix_support import HEADER
from support import REPO_ROOT, cli_run

from generators.expand import main

SEED = REPO_ROOT / "matrix.yaml"


def invoke(*args: str):
    return cli_run(main, list(args))


def rows(output: str) -> dict[str, list[str]]:
    """The plan table's rows by run name (the first table of the output)."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{6}( REFUSED)?", cells[0]):
            out.setdefault(cells[0].split()[0], cells)
    return out


def test_the_seed_matrix_plan_has_every_run_and_totals_per_cluster():
    result = invoke(str(SEED), "--plan")
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert len(table) == 30
    run = next(cells for name, cells in table.items() if name.startswith("llama2-7b-p5-n1-fullshard-"))
    world, memory, host, tokens = run[1:5]
    hours, gpu_hours, cost = run[-3:]
    assert world == "8" and re.fullmatch(r"\d+\.\d \(80, \d+%\)", memory) and host.endswith("(2,048)")
    # H100 was never measured: the speed says so.
    assert re.fullmatch(r"[\d,]+ \(uncalibrated: H100 GPU\)", tokens), tokens
    # Cost = nodes x hours x the price table's p5 rate; GPU-hours = GPUs x hours.
    assert float(gpu_hours) == pytest.approx(8 * float(hours), abs=0.01 * 8)
    assert float(cost) == pytest.approx(float(hours) * 55.04, rel=0.05)
    cells = ([c.strip() for c in line.strip().strip("|").split("|")] for line in result.stdout.splitlines())
    totals: dict[str, list[str]] = {}
    for c in cells:  # the totals table: the first rows named by a cluster (the shared volume's come later)
        if c[0] in ("fsdp-p4de", "fsdp-p5"):
            totals.setdefault(c[0], c)
    assert set(totals) == {"fsdp-p4de", "fsdp-p5"} and totals["fsdp-p5"][1] == "15"
    p5 = [c for name, c in table.items() if "-p5-" in name]
    assert float(totals["fsdp-p5"][2]) == pytest.approx(sum(float(c[-2]) for c in p5), abs=0.1)
    assert "p5.48xlarge in us-west-2: $55.04 per hour, read 2026-11-30" in result.stdout
    assert not list((REPO_ROOT / "overlays").glob("**/*.tmp")), "--plan writes nothing"


def test_llama2_70b_on_one_node_is_refused_with_its_reason_and_the_cheapest_fix(tmp_path):
    text = SEED.read_text().replace("  - {model: llama2-70b, nodes: 1}\n", "")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    result = invoke(str(matrix), "--plan")
    assert result.exit_code == 1, result.output
    refused = [line for line in result.stdout.splitlines() if line.startswith("- llama2-70b-")]
    assert len(refused) == 2  # one per cluster
    for line in refused:
        assert re.search(r"needs about 1\d\d GiB per GPU with FULL_SHARD over 8 GPUs", line), line
        assert "80 GiB (69.6 usable: 10.4 GiB of headroom" in line
        # The fewest nodes that fit: 24 GPUs share the state to about 63 GiB each.
        assert re.search(r"Cheapest fix: nodes: 3 \(about 63 GiB per GPU, \$[\d,]+\)\.$", line), line
    assert "2 runs cannot fit" in result.stderr


@pytest.mark.parametrize(
    "run,fix",
    [
        # Nothing else holds 13B's unsharded state on one GPU: FULL_SHARD spreads it over the node.
        (
            "{model: llama2-13b, nodes: 1, trainer.parallelism.sharding_strategy: NO_SHARD}",
            "trainer.parallelism.sharding_strategy: FULL_SHARD",
        ),
        # 70B's state needs 32 GPUs to share it (16 leave 79 GiB each).
        (
            "{model: llama2-70b, nodes: 16, trainer.parallelism.sharding_strategy: HYBRID_SHARD}",
            "trainer.parallelism.shard_group_size: 32",
        ),
        # On 2 nodes there are not 32 GPUs: more nodes, and the group grown with them.
        (
            "{model: llama2-70b, nodes: 2, trainer.parallelism.sharding_strategy: HYBRID_SHARD}",
            "nodes: 4, trainer.parallelism.shard_group_size: 32",
        ),
    ],
)
def test_the_fix_is_the_change_that_makes_the_run_fit(tmp_path, run, fix):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        HEADER + "defaults:\n  cluster: fsdp-p5\n  trainer:\n    data: {path: /shared/data/samsum/train.jsonl}\n"
        f"include:\n  - {run}\n"
    )
    result = invoke(str(matrix), "--plan")
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.stdout.splitlines() if line.startswith("- ") and "Cheapest fix" in line]
    assert line.split("Cheapest fix: ")[1].startswith(fix + " (about "), line


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_plan_base_shows_runs_added_removed_changed_and_the_cost_they_add(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    matrix = repo / "matrix.yaml"
    first = SEED.read_text()
    matrix.write_text(first)
    git(repo, "add", "matrix.yaml")
    git(repo, "commit", "-q", "-m", "seed")
    # The change: llama2-7b leaves the grid, a Llama 3.1 8B run on 4 p5 nodes joins it, and the
    # learning rate of every run changes (so the others are changed, not added and removed).
    second = (
        first.replace("model: [llama2-7b, llama2-13b, llama2-70b]", "model: [llama2-13b, llama2-70b]").replace(
            "lr: 2.0e-5", "lr: 3.0e-5"
        )
        + "  - {cluster: fsdp-p5, model: llama3.1-8b, nodes: 4}\n"
    )
    matrix.write_text(second)
    git(repo, "commit", "-q", "-am", "change")

    result = invoke(str(matrix), "--plan", "--base", "HEAD~1")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Added: 1, removed: 10, changed: 20" in out
    added = rows(out.split("Added:", 2)[2].split("Removed:")[0])
    assert list(added) and all(name.startswith("llama3-1-8b-p5-n4-fullshard-") for name in added)
    assert "trainer.training.lr: 2e-05 -> 3e-05" in out

    base = invoke(str(matrix), "--plan", "--base", "HEAD")
    assert base.exit_code == 0 and "Added: 0, removed: 0, changed: 0" in base.stdout
    # The difference row is the new totals minus the old ones.
    diff = [line for line in out.splitlines() if line.startswith("| difference")][0]
    head, this = (
        [line for line in out.splitlines() if line.startswith(f"| {label}")][0] for label in ("HEAD~1", "this change")
    )
    number = lambda cell: float(cell.replace(",", "").replace("+", ""))  # noqa: E731
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    assert number(cells(diff)[3]) == pytest.approx(number(cells(this)[3]) - number(cells(head)[3]), abs=0.02)


def test_a_matrix_that_does_not_exist_at_the_base_counts_as_no_runs(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "empty")
    (repo / "matrix.yaml").write_text(SEED.read_text())
    result = invoke(str(repo / "matrix.yaml"), "--plan", "--base", "HEAD")
    assert result.exit_code == 0, result.output
    assert "Added: 30, removed: 0, changed: 0" in result.stdout


def one_line_exit_2(result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; fix: " in lines[0], result.stderr
    assert "Traceback" not in result.output
    for part in parts:
        assert part in lines[0], lines[0]


def test_an_unknown_instance_in_the_price_table_is_one_line_and_exit_2(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "prices:\n  - {instance_type: p6.48xlarge, region: us-west-2, usd_per_hour: 9.5, "
        "read: '2026-11-30', source: x}\n"
    )
    one_line_exit_2(
        invoke(str(SEED), "--plan", "--prices", str(prices)),
        f"{prices}:2: prices[0].instance_type: unknown instance type 'p6.48xlarge'",
    )


def test_a_missing_price_is_one_line_and_exit_2(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "prices:\n  - {instance_type: p5.48xlarge, region: us-west-2, usd_per_hour: 55.04, "
        "read: '2026-11-30', source: x}\n"
    )
    one_line_exit_2(
        invoke(str(SEED), "--plan", "--prices", str(prices)),
        "no price for p4de.24xlarge in us-west-2, which cluster fsdp-p4de (",
        "add a row",
    )


def test_an_instance_without_an_on_demand_price_needs_a_reservation(tmp_path):
    text = SEED.read_text().replace("instance_types: [p5.48xlarge]", "instance_types: [p5e.48xlarge]")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(text)
    one_line_exit_2(
        invoke(str(matrix), "--plan"), "p5e.48xlarge in us-west-2 has no On-Demand price", "capacity_reservation_ids"
    )
    reserved = text.replace(
        'capacity_reservation_ids: []\n    volume_size_gib: 500\n    kubernetes_version: "1.33"\n'
        "    max_nodes: 16\n    shared_storage_gib: 7200\n\n# What every run",
        "capacity_reservation_ids: [cr-0123456789abcdef0]\n    volume_size_gib: 500\n"
        '    kubernetes_version: "1.33"\n    max_nodes: 16\n    shared_storage_gib: 7200\n\n'
        "# What every run",
    )
    assert reserved != text
    matrix.write_text(reserved)
    result = invoke(str(matrix), "--plan")
    assert result.exit_code == 0, result.output
    assert "- (reserved)" in result.stdout


@pytest.mark.parametrize(
    "args,parts",
    [
        (("--plan", "--base", "no-such-ref"), ("--base: 'no-such-ref' is not a commit",)),
        (("--plan", "--base", "--output=x"), ("--base: '--output=x' is not a commit name",)),
        (("--base", "HEAD"), ("--base", "only with --plan")),
        (("--plan", "--check"), ("choose one",)),
    ],
)
def test_bad_plan_options_are_one_line_and_exit_2(args, parts):
    one_line_exit_2(invoke(str(SEED), *args), *parts)


def test_the_pull_request_workflow_posts_one_plan_comment_with_a_least_privilege_token():
    path = REPO_ROOT / ".github" / "workflows" / "plan.yaml"
    text = path.read_text()
    workflow = yaml.safe_load(text)
    assert set(workflow[True]) == {"pull_request"}  # PyYAML reads the key `on` as True
    assert workflow["permissions"] == {"contents": "read"}
    job = workflow["jobs"]["plan"]
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert 'python generators/expand.py matrix.yaml --plan --base "origin/$BASE_REF"' in runs
    # One comment per pull request: found by its marker and edited, created only when absent.
    assert runs.count("<!-- fsdp-gitops plan -->") == 2
    assert "--method PATCH" in runs and "--method POST" in runs
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["persist-credentials"] is False and checkout["with"]["fetch-depth"] == 0


def test_the_seed_plan_document_is_the_plan_the_command_prints():
    result = invoke(str(SEED), "--plan")
    document = (REPO_ROOT / "docs" / "generated" / "seed-plan.md").read_text()
    assert document.endswith(result.stdout), (
        "docs/generated/seed-plan.md is stale: run `python generators/expand.py matrix.yaml` and commit it"
    )
