"""Planning: catalog lookups, GPU/EFA resolution, topology and memory checks, resolved trainer config."""

from __future__ import annotations

import re

import pytest
from matrix_support import GOOD, HEADER, line_of, plans

from generators.core.errors import InputError
from trainer.catalog import INSTANCE_TYPES, MODELS, efa_for
from trainer.config import from_dict
from trainer.memory import estimate_peak_gib as estimate_gpu_memory_gib

DEFAULTS = """\
defaults:
  cluster: fsdp-p5
  trainer:
    data: {path: /shared/data/samsum/train.jsonl}
    training: {batch_size_per_gpu: 3}
"""


def one(include: str, defaults: str = DEFAULTS):
    return plans(HEADER + defaults + "include:\n  - " + include + "\n")[0]


def fails(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        plans(text)
    assert info.value.fix and info.value.file == "m.yaml"
    return info.value


def test_instance_catalog_figures():
    expected = {  # GPUs, GPU model, GPU GiB, EFA, vCPUs, host GiB
        "p4d.24xlarge": (8, "A100", 40, 4, 96, 1152),
        "p4de.24xlarge": (8, "A100", 80, 4, 96, 1152),
        "p5.48xlarge": (8, "H100", 80, 32, 192, 2048),
        "p5e.48xlarge": (8, "H200", 141, 32, 192, 2048),
        "p5en.48xlarge": (8, "H200", 141, 16, 192, 2048),
    }
    got = {
        n: (t.num_gpus, t.gpu_model, t.gpu_memory_gib, t.num_efa, t.num_vcpus, t.host_memory_gib)
        for n, t in INSTANCE_TYPES.items()
    }
    assert got == expected
    assert all(t.efa_rdma for t in INSTANCE_TYPES.values())


@pytest.mark.parametrize(
    "itype, gpus, efa",
    [
        ("p5.48xlarge", 8, 32),
        ("p5.48xlarge", 4, 16),
        ("p5.48xlarge", 1, 4),
        ("p4de.24xlarge", 8, 4),
        ("p4de.24xlarge", 2, 1),
        ("p4de.24xlarge", 1, 1),
        ("p5en.48xlarge", 3, 6),
    ],
)
def test_efa_share_follows_the_gpu_share(itype, gpus, efa):
    assert efa_for(INSTANCE_TYPES[itype], gpus) == efa


def test_plan_of_a_full_node_run():
    p = one("{model: llama2-13b, nodes: 2}")
    assert (p.cluster, p.namespace, p.instance_type, p.gpu_model, p.gpu_memory_gib) == (
        "fsdp-p5",
        "fsdp",
        "p5.48xlarge",
        "H100",
        80,
    )
    assert (p.nodes, p.gpus_per_node, p.world_size, p.efa_per_node, p.efa_rdma) == (2, 8, 16, 32, True)
    assert (p.sharding, p.shard_group_size, p.hf_id) == ("FULL_SHARD", 16, "meta-llama/Llama-2-13b-hf")
    assert p.overlay_dir == f"runs/fsdp-p5/{p.name}"
    assert (p.rdzv_backend, p.rdzv_endpoint, p.rdzv_id) == ("c10d", f"{p.name}-worker-0:29400", p.name)


def test_resolved_trainer_config_carries_model_and_per_run_paths():
    p = one("{model: llama2-7b, nodes: 1}")
    cfg = p.trainer
    assert (cfg.model.name, cfg.model.path) == ("llama2-7b", "meta-llama/Llama-2-7b-hf")
    assert cfg.checkpoint.dir == f"/shared/checkpoints/{p.name}"
    assert cfg.metrics.output_dir == f"/shared/runs/{p.name}"
    assert cfg.training.batch_size_per_gpu == 3


def test_trainer_model_path_can_be_overridden():
    p = one("{model: tiny, nodes: 1, trainer.model.path: ''}")
    assert p.trainer.model.path == ""
    assert (
        one("{model: llama2-7b, nodes: 1, trainer.model.path: /shared/models/l7}").trainer.model.path
        == "/shared/models/l7"
    )


def test_etcd_rendezvous_uses_the_shared_server():
    p = one("{model: llama2-7b, nodes: 2, rdzv_backend: etcd}")
    assert p.rdzv_endpoint == "etcd.fsdp-system.svc.cluster.local:2379"
    assert p.rdzv_id == p.name


def test_instance_type_defaults_to_the_only_one_and_must_be_named_otherwise():
    text = HEADER + DEFAULTS.replace("fsdp-p5", "fsdp-mixed") + "include:\n  - {model: llama2-7b, nodes: 1}\n"
    err = fails(text)
    assert err.key == "include[0].instance_type"
    assert "p4d.24xlarge, p5en.48xlarge" in err.fix
    p = plans(text.replace("nodes: 1}", "nodes: 1, instance_type: p5en.48xlarge}"))[0]
    assert (p.instance_type, p.namespace, p.efa_per_node) == ("p5en.48xlarge", "research", 16)


def test_instance_type_the_cluster_does_not_offer():
    text = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b, nodes: 1, instance_type: p4de.24xlarge}\n"
    err = fails(text)
    assert (err.key, err.line) == ("include[0].instance_type", line_of(text, "p4de.24xlarge}"))
    assert "does not offer" in err.message


def test_gpus_per_node_defaults_to_all_and_may_be_fewer():
    assert one("{model: llama2-7b, nodes: 1}").gpus_per_node == 8
    p = one("{model: llama2-7b, nodes: 2, gpus_per_node: 4}")
    assert (p.gpus_per_node, p.world_size, p.efa_per_node) == (4, 8, 16)


def test_gpus_per_node_above_the_instance():
    text = HEADER + DEFAULTS + "axes:\n  model: [llama2-7b]\n  nodes: [1]\n  gpus_per_node: [8, 16]\n"
    err = fails(text)
    assert (err.key, err.line) == ("axes.gpus_per_node[1]", line_of(text, "gpus_per_node: [8, 16]"))
    assert "16 GPUs per node, but p5.48xlarge has 8" in err.message


def test_nodes_above_the_cluster_maximum():
    text = HEADER + DEFAULTS + "include:\n  - {model: llama2-7b, nodes: 32}\n"
    err = fails(text)
    assert err.key == "include[0].nodes"
    assert "scales to 16" in err.message


def test_hybrid_shard_group_must_divide_the_world_size():
    text = (
        HEADER + DEFAULTS + "include:\n  - model: llama2-7b\n    nodes: 2\n"
        "    trainer.parallelism: {sharding_strategy: HYBRID_SHARD, shard_group_size: 3}\n"
    )
    err = fails(text)
    assert (err.key, err.line) == (
        "include[0].trainer.parallelism.shard_group_size",
        line_of(text, "shard_group_size: 3"),
    )
    assert "does not divide the world size 16" in err.message
    ok = plans(text.replace("shard_group_size: 3", "shard_group_size: 4"))[0]
    assert (ok.sharding, ok.shard_group_size) == ("HYBRID_SHARD", 4)
    default_group = plans(text.replace(", shard_group_size: 3", ""))[0]
    assert default_group.shard_group_size == 8  # one node


def test_trainer_value_errors_point_at_the_line_that_set_them():
    text = GOOD.replace(
        "      path: /shared/data/samsum/train.jsonl",
        "      path: /shared/data/samsum/train.jsonl\n    training:\n      lr: -1.0",
    )
    err = fails(text)
    assert (err.key, err.line) == ("defaults.trainer.training.lr", line_of(text, "lr: -1.0"))
    assert err.message == "must be a positive number"


def test_exponent_without_decimal_point_is_a_number():
    # YAML 1.1 reads 1e-5 as a string; the trainer config takes it as the number users mean.
    text = GOOD.replace("nodes: [1, 2]", "nodes: [1, 2]\n  trainer.training.lr: [1e-5]")
    assert {p.trainer.training.lr for p in plans(text)} == {1e-5}


def test_wrong_trainer_type_and_literal():
    text = GOOD.replace("nodes: [1, 2]", "nodes: [1, 2]\n  trainer.parallelism.sharding_strategy: [FULL_SHARD, FSDP]")
    err = fails(text)
    assert err.key == "axes.trainer.parallelism.sharding_strategy[1]"
    assert "'FSDP'" in err.message


@pytest.mark.parametrize("key", ["model.name", "checkpoint.dir", "metrics.output_dir"])
def test_keys_the_planner_owns_cannot_be_set(key):
    text = GOOD.replace(
        "      path: /shared/data/samsum/train.jsonl", f"      path: /shared/data/samsum/train.jsonl\n    {key}: x"
    )
    err = fails(text)
    assert err.key == f"defaults.trainer.{key}"
    assert "set by the generator" in err.message


def test_memory_fit_rejects_70b_on_one_node_and_accepts_four():
    text = HEADER + DEFAULTS + "axes:\n  model: [llama2-70b]\n  nodes: [4, 1]\n"
    err = fails(text)
    assert (err.key, err.line) == ("axes.nodes[1]", line_of(text, "nodes: [4, 1]"))
    assert re.search(r"needs about \d+ GiB per GPU", err.message)
    assert "--plan names the cheapest change that fits" in err.fix
    ok = plans(text.replace("nodes: [4, 1]", "nodes: [4]"))[0]
    assert ok.est_gpu_memory_gib < 80


def test_memory_estimate_orders_strategies_and_scales_with_sharding():
    arch = MODELS["llama2-13b"]
    cfg = from_dict({"model": {"name": "llama2-13b"}, "data": {"path": "x"}, "training": {"batch_size_per_gpu": 3}})
    full8, full16 = estimate_gpu_memory_gib(arch, cfg, 8, "full"), estimate_gpu_memory_gib(arch, cfg, 16, "full")
    assert full16 < full8
    grad_op = from_dict(
        {
            **{"model": {"name": "llama2-13b"}, "data": {"path": "x"}},
            "training": {"batch_size_per_gpu": 3},
            "parallelism": {"sharding_strategy": "SHARD_GRAD_OP"},
        }
    )
    assert estimate_gpu_memory_gib(arch, grad_op, 16, "full") > full16  # keeps every parameter gathered
    no_ac = from_dict(
        {
            "model": {"name": "llama2-13b"},
            "data": {"path": "x"},
            "training": {"batch_size_per_gpu": 3},
            "parallelism": {"activation_checkpointing": "none"},
        }
    )
    assert estimate_gpu_memory_gib(arch, no_ac, 16) > full16 + 20


def test_shm_cannot_exceed_half_the_host_memory_share():
    err = fails(HEADER + DEFAULTS + "include:\n  - {model: tiny, nodes: 1, gpus_per_node: 1, shm_size_gib: 200}\n")
    assert err.key == "include[0].shm_size_gib"
    assert "at most 128" in err.fix


def test_same_run_twice_is_an_error():
    text = GOOD + "include:\n  - {model: llama2-7b, nodes: 2}\n"
    err = fails(text)
    assert (err.key, err.line) == ("include[0]", line_of(text, "- {model: llama2-7b, nodes: 2}"))
    assert "same configuration as axes" in err.message and "bump rev" in err.fix
    assert len(plans(text.replace("nodes: 2}", "nodes: 2, rev: 1}"))) == 5


def test_the_seed_matrix_plans_thirty_runs_without_70b_below_four_nodes():
    from support import REPO_ROOT

    from generators.matrix import expand, load
    from generators.plan import plan_runs

    m = load(str(REPO_ROOT / "matrix.yaml"))
    seed = plan_runs(m, expand(m))
    assert len(seed) == 30
    assert {p.cluster for p in seed} == {"fsdp-p4de", "fsdp-p5"}
    assert min(p.nodes for p in seed if p.model == "llama2-70b") == 4
    two_node_13b = {(p.cluster, p.sharding) for p in seed if p.model == "llama2-13b" and p.nodes == 2}
    assert two_node_13b == {
        (c, s) for c in ("fsdp-p4de", "fsdp-p5") for s in ("FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP")
    }
    assert all(p.trainer.training.num_epochs == 5 and p.trainer.training.batch_size_per_gpu == 3 for p in seed)
    assert all(p.trainer.parallelism.precision == "bf16" for p in seed)
