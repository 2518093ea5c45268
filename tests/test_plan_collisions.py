"""Run names are unique for different configurations: a hash collision is detected and both names get
a longer hash; runs that collide with nothing keep their short names; the same configuration twice is
an error that says so."""

from __future__ import annotations

import pytest
from matrix_support import HEADER, plans

import generators.plan as plan_mod
from generators.core.errors import InputError

SWEEP = (
    HEADER
    + """\
defaults:
  cluster: fsdp-p5
  model: tiny
  nodes: 1
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
axes:
  trainer.training.seed: [%s]
"""
)


def sweep(n: int) -> str:
    return SWEEP % ", ".join(str(i) for i in range(n))


def test_colliding_hashes_are_lengthened_and_names_stay_unique_and_stable(monkeypatch):
    # One hex digit: 40 seeds must collide many times over (with 6 digits a sweep of a few thousand
    # seeds already does).
    monkeypatch.setattr(plan_mod, "HASH_LEN", 1)
    first = [p.name for p in plans(sweep(40))]
    assert len(set(first)) == 40
    assert [p.name for p in plans(sweep(40))] == first  # stable
    lengths = {len(n.rsplit("-", 1)[1]) for n in first}
    assert max(lengths) > 1 and all(len(n) <= 50 for n in first)
    # A run that collides with nothing keeps the short hash.
    alone = plans(sweep(1))[0].name
    assert len(alone.rsplit("-", 1)[1]) == 1
    # Every name-derived field follows the name.
    for p in plans(sweep(40)):
        assert p.overlay_dir.endswith("/" + p.name) and p.rdzv_id == p.name
        assert p.trainer.metrics.output_dir.endswith("/" + p.name)


def test_the_same_configuration_twice_is_named_as_such():
    text = sweep(2) + "include:\n  - {trainer.training.seed: 1}\n"
    with pytest.raises(InputError) as info:
        plans(text)
    assert "same configuration as axes" in str(info.value)
    assert "include[0]" in str(info.value) and "bump rev" in str(info.value)
