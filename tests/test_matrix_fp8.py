"""fp8 where the GPU has no float8 tensor cores (A100: SM 8.0, below the 8.9 fp8 needs) is bad input at
the matrix line that asks for it, for overlays and for `--plan` alike, so the plan never predicts an
fp8 speed-up there; and the plan's cheapest fix for a run that does not fit never proposes fp8 there."""

from __future__ import annotations

import pytest
from matrix_support import HEADER, line_of, plans
from support import cli_run

from generators import expand
from generators.core.errors import InputError
from generators.matrix import expand as expand_runs
from generators.matrix import load
from generators.plan import plan_runs
from generators.plan.cost import load_prices
from generators.plan.estimate import estimate_matrix, fit_candidates

RUNS = """\
defaults:
  cluster: fsdp-mixed
  model: llama2-7b
  nodes: 1
  trainer:
    data: {format: synthetic}
    training: {max_steps: 100}
include:
  - {instance_type: p5en.48xlarge, trainer.parallelism.precision: fp8}
  - instance_type: p4d.24xlarge
    trainer:
      parallelism:
        precision: fp8
"""


def test_fp8_on_an_a100_is_refused_at_its_line_with_the_bf16_fix():
    text = HEADER + RUNS
    with pytest.raises(InputError) as err:
        plans(text)
    message = str(err.value)
    assert f"m.yaml:{line_of(text, 'precision: fp8', 2)}:" in message
    assert "include[1].trainer.parallelism.precision" in message
    assert "p4d.24xlarge has A100 GPUs (SM 8.0)" in message and "SM 8.9 or newer" in message
    assert "fix: set trainer.parallelism.precision: bf16 for runs on p4d.24xlarge" in message
    # The same run in bf16, and fp8 on the H200s of the same cluster, plan.
    fine = plans(text.replace("        precision: fp8\n", "        precision: bf16\n"))
    assert [p.trainer.parallelism.precision for p in fine] == ["fp8", "bf16"]


@pytest.mark.parametrize("args", [[], ["--plan"], ["--list"]])
def test_the_cli_refuses_it_in_one_line_exit_2_and_the_plan_predicts_nothing(tmp_path, args):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(HEADER + RUNS)
    out = tmp_path / "out"
    extra = ["--out", str(out)] if not args else args
    result = cli_run(expand.main, [matrix, *extra])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {matrix}:") and "fix: set trainer.parallelism.precision: bf16" in line
    assert "tokens/s" not in result.stdout and not out.exists()


def test_the_cheapest_fix_never_proposes_fp8_on_an_a100():
    # Llama 2 7B at batch 4 without checkpointing on one node fits neither the A100s of a p4de nor the
    # H100s of a p5. On the p4de fp8 with the float8 all-gather would be the cheapest fix (about 59 GiB
    # per GPU, the A100's emulated fp8 priced at the H100's speed-up); the plan picks another change.
    types = "instance_types: [p4de.24xlarge, p5.48xlarge]\n    max_nodes: 1"
    text = HEADER.replace("instance_types: [p4d.24xlarge, p5en.48xlarge]", types) + (
        "defaults:\n  cluster: fsdp-mixed\n  model: llama2-7b\n  nodes: 1\n"
        "  trainer:\n    data: {format: synthetic}\n    training: {max_steps: 10, batch_size_per_gpu: 4}\n"
        "    parallelism: {activation_checkpointing: none}\n"
        "include:\n  - {instance_type: p4de.24xlarge}\n  - {instance_type: p5.48xlarge}\n"
    )
    m = load("m.yaml", text)
    estimate = estimate_matrix(m, plan_runs(m, expand_runs(m), reject_unfit=False), load_prices())
    a100, h100 = estimate.runs
    assert a100.refusal is not None and h100.refusal is not None
    assert a100.refusal.fix and "fp8" not in a100.refusal.fix, a100.refusal.fix
    # fp8 stays a candidate where the GPU has float8 tensor cores.
    families = fit_candidates(h100.figures.cfg, 1, 8, 1)
    assert any(label.startswith("trainer.parallelism.precision: fp8") for f in families for label, _, _ in f)
    families = fit_candidates(a100.figures.cfg, 1, 8, 1, fp8_capable=False)
    assert not any("fp8" in label for f in families for label, _, _ in f)
