"""Expansion: axes product over defaults, exclude by partial match, include on top, in a fixed order."""

from __future__ import annotations

import pytest
from matrix_support import GOOD, HEADER, line_of, load

from generators.core.errors import InputError
from generators.matrix import expand

DEFAULTS = """\
defaults:
  cluster: fsdp-p5
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
    training: {num_epochs: 5}
"""


def runs_of(text: str):
    return expand(load(text))


def test_product_is_in_axis_order_with_the_last_axis_fastest():
    runs = runs_of(GOOD)
    assert [(r.model, r.nodes) for r in runs] == [
        ("llama2-7b", 1),
        ("llama2-7b", 2),
        ("llama2-13b", 1),
        ("llama2-13b", 2),
    ]
    assert all(r.cluster == "fsdp-p5" and r.entry_key == "axes" for r in runs)


def test_defaults_fill_every_run_and_code_defaults_fill_the_rest():
    run = runs_of(GOOD)[0]
    assert run.trainer == {"data": {"path": "/shared/data/samsum/train.jsonl"}}
    # Documented run-field defaults (generators/matrix/schema.py).
    assert (run.instance_type, run.gpus_per_node, run.rdzv_backend, run.rev, run.name) == ("", 0, "c10d", 0, "")
    assert (run.active_deadline_s, run.shm_size_gib) == (86400, 64)


def test_axis_over_a_nested_trainer_key_with_a_dotted_path():
    text = (
        HEADER + DEFAULTS + "axes:\n  model: [llama2-7b]\n  nodes: [2]\n"
        "  trainer.parallelism.sharding_strategy: [FULL_SHARD, SHARD_GRAD_OP]\n"
    )
    runs = runs_of(text)
    assert [r.trainer["parallelism"]["sharding_strategy"] for r in runs] == ["FULL_SHARD", "SHARD_GRAD_OP"]
    # Defaults under the same section survive: axes lay values over them.
    assert all(r.trainer["training"] == {"num_epochs": 5} for r in runs)
    line, key = runs[1].sources["trainer.parallelism.sharding_strategy"]
    assert (line, key) == (line_of(text, "sharding_strategy: [FULL"), "axes.trainer.parallelism.sharding_strategy[1]")


def test_axis_over_a_section_varies_settings_together():
    text = (
        HEADER + DEFAULTS + "axes:\n  model: [llama2-7b]\n  nodes: [2]\n  trainer.parallelism:\n"
        "    - {sharding_strategy: FULL_SHARD}\n    - {sharding_strategy: HYBRID_SHARD, shard_group_size: 4}\n"
    )
    runs = runs_of(text)
    assert [r.trainer["parallelism"] for r in runs] == [
        {"sharding_strategy": "FULL_SHARD"},
        {"sharding_strategy": "HYBRID_SHARD", "shard_group_size": 4},
    ]


def test_axis_values_override_defaults():
    text = (
        HEADER
        + DEFAULTS.replace("num_epochs: 5", "num_epochs: 5, lr: 1.0e-5")
        + "axes:\n  model: [llama2-7b]\n  nodes: [1]\n  trainer.training.lr: [2.0e-5, 3.0e-5]\n"
    )
    assert [r.trainer["training"]["lr"] for r in runs_of(text)] == [2.0e-5, 3.0e-5]


def test_nested_and_dotted_keys_are_the_same_leaf():
    nested = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b, nodes: 1, trainer: {training: {lr: 3.0e-5}}}\n"
    dotted = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b, nodes: 1, trainer.training.lr: 3.0e-5}\n"
    a, b = runs_of(nested)[0], runs_of(dotted)[0]
    assert (
        a.trainer
        == b.trainer
        == {"data": {"path": "/shared/data/samsum/train.jsonl"}, "training": {"num_epochs": 5, "lr": 3.0e-5}}
    )


def test_exclude_removes_partial_matches_only():
    text = GOOD + "exclude:\n  - {model: llama2-13b, nodes: 1}\n"
    assert [(r.model, r.nodes) for r in runs_of(text)] == [("llama2-7b", 1), ("llama2-7b", 2), ("llama2-13b", 2)]
    text = GOOD + "exclude:\n  - {nodes: 2}\n"
    assert [(r.model, r.nodes) for r in runs_of(text)] == [("llama2-7b", 1), ("llama2-13b", 1)]


def test_exclude_matches_trainer_keys_and_types_strictly():
    text = (
        HEADER + DEFAULTS + "axes:\n  model: [llama2-7b]\n  nodes: [1, 2]\n"
        "  trainer.parallelism.sharding_strategy: [FULL_SHARD, HYBRID_SHARD]\n"
        "exclude:\n  - {nodes: 1, trainer.parallelism.sharding_strategy: HYBRID_SHARD}\n"
    )
    assert len(runs_of(text)) == 3
    # 10.0 is not 10: the exclude entry matches nothing, which is an error.
    text = GOOD.replace("nodes: [1, 2]", "nodes: [1, 2]\n  trainer.training.max_steps: [10]")
    assert runs_of(text + "exclude:\n  - {trainer.training.max_steps: 10, nodes: 1}\n")[0].nodes == 2
    with pytest.raises(InputError) as info:
        runs_of(text + "exclude:\n  - {trainer.training.max_steps: 10.0}\n")
    assert "matches no run" in info.value.message
    assert info.value.key == "exclude[0]"


def test_exclude_matching_nothing_names_its_line():
    text = GOOD + "exclude:\n  - {model: llama2-70b}\n"
    with pytest.raises(InputError) as info:
        runs_of(text)
    assert info.value.line == line_of(text, "llama2-70b}")


def test_include_adds_runs_on_top_of_defaults_after_the_product():
    text = GOOD + "exclude:\n  - {nodes: 2}\ninclude:\n  - {model: llama2-7b, nodes: 2, rdzv_backend: etcd}\n"
    runs = runs_of(text)
    assert [(r.model, r.nodes, r.rdzv_backend, r.entry_key) for r in runs] == [
        ("llama2-7b", 1, "c10d", "axes"),
        ("llama2-13b", 1, "c10d", "axes"),
        ("llama2-7b", 2, "etcd", "include[0]"),
    ]
    assert runs[2].entry_line == line_of(text, "rdzv_backend: etcd")


def test_without_axes_only_include_runs_exist():
    text = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b, nodes: 1}\n"
    assert [(r.model, r.nodes) for r in runs_of(text)] == [("llama2-7b", 1)]


def test_a_run_without_a_required_field_points_at_its_entry():
    text = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b}\n"
    with pytest.raises(InputError) as info:
        runs_of(text)
    assert (info.value.key, info.value.line) == ("include[0].nodes", line_of(text, "- {model: llama2-7b}"))


def test_expansion_is_deterministic():
    assert runs_of(GOOD) == runs_of(GOOD)
