"""Run names: DNS-1035 labels of at most 50 characters, readable, unique, stable, new on any config change."""

from __future__ import annotations

import re

import pytest
from matrix_support import GOOD, HEADER, plans

from generators.plan import slug

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

DEFAULTS = """\
defaults:
  cluster: fsdp-p5
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
"""


def name_of(include: str, defaults: str = DEFAULTS, header: str = HEADER) -> str:
    return plans(header + defaults + "include:\n  - " + include + "\n")[0].name


def test_names_are_readable_dns_labels_with_a_config_hash():
    for p in plans(GOOD):
        assert DNS1035.match(p.name) and len(p.name) <= 50
        assert re.fullmatch(rf"{p.model}-p5-n{p.nodes}-fullshard-[0-9a-f]{{6}}", p.name)


def test_names_are_stable_across_runs_of_the_generator():
    # A fixed configuration has a fixed name: this literal only changes when the config it stands
    # for changes (including trainer defaults in trainer/config.py), which is the point of the hash.
    first = [p.name for p in plans(GOOD)]
    assert first == [p.name for p in plans(GOOD)]
    assert len(set(first)) == 4


def test_optional_parts_appear_only_when_they_differ_from_the_default():
    assert name_of("{model: llama2-7b, nodes: 2, gpus_per_node: 4}").startswith("llama2-7b-p5-n2-g4-fullshard-")
    assert name_of("{model: llama2-7b, nodes: 2, rdzv_backend: etcd}").startswith("llama2-7b-p5-n2-fullshard-etcd-")
    assert name_of("{model: llama2-7b, nodes: 2, rev: 3}").startswith("llama2-7b-p5-n2-fullshard-r3-")
    hybrid = name_of("{model: llama2-7b, nodes: 2, trainer.parallelism.sharding_strategy: HYBRID_SHARD}")
    assert hybrid.startswith("llama2-7b-p5-n2-hybridshard-")
    assert name_of("{model: llama3.1-8b, nodes: 2}").startswith("llama3-1-8b-p5-n2-")


@pytest.mark.parametrize(
    "change",
    [
        "trainer.training.lr: 3.0e-5",  # a trainer value
        "trainer.data.seq_len: 2048",
        "active_deadline_s: 3600",  # a job value
        "shm_size_gib: 32",
        "rev: 1",
    ],
)
def test_any_configuration_change_gives_a_new_name(change):
    base = name_of("{model: llama2-7b, nodes: 2}")
    assert name_of("{model: llama2-7b, nodes: 2, " + change + "}") != base


def test_setting_a_value_to_its_default_keeps_the_name():
    # The hash covers the resolved config, so spelling out a default changes nothing.
    assert name_of("{model: llama2-7b, nodes: 2}") == name_of(
        "{model: llama2-7b, nodes: 2, trainer.training.lr: 2.0e-5}"
    )


def test_same_run_on_two_clusters_with_one_instance_type_gets_two_names():
    twin = HEADER.replace(
        "  fsdp-mixed:",
        "  fsdp-p5-east:\n    region: us-east-1\n    availability_zones: [us-east-1a]\n"
        "    instance_types: [p5.48xlarge]\n  fsdp-mixed:",
    )
    runs = plans(twin + DEFAULTS + "axes:\n  model: [llama2-7b]\n  nodes: [2]\n  cluster: [fsdp-p5, fsdp-p5-east]\n")
    a, b = (p.name for p in runs)
    assert a != b and a[:-7] == b[:-7] == "llama2-7b-p5-n2-fullshard"


def test_user_name_replaces_the_readable_part():
    name = name_of("{model: llama2-7b, nodes: 2, name: baseline}")
    assert re.fullmatch(r"baseline-[0-9a-f]{6}", name)


def test_long_readable_part_is_cut_to_fit_50_characters():
    name = name_of(
        "{model: llama3.1-8b, nodes: 16, gpus_per_node: 4, rev: 12, rdzv_backend: etcd, "
        "instance_type: p5en.48xlarge, cluster: fsdp-mixed, "
        "trainer.parallelism.sharding_strategy: SHARD_GRAD_OP}"
    )
    assert len(name) <= 50 and DNS1035.match(name)
    # "-r12" does not fit: it is dropped whole (a cut "-r1" would read as rev 1); the hash covers it.
    assert re.fullmatch(r"llama3-1-8b-p5en-n16-g4-shardgradop-etcd-[0-9a-f]{6}", name)
    long_user = name_of("{model: llama2-7b, nodes: 1, name: " + "a" * 43 + "}")
    assert len(long_user) == 50


def test_slug():
    assert slug("llama3.1-8b") == "llama3-1-8b"
    assert slug("HYBRID_SHARD") == "hybrid-shard"
