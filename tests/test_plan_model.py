"""The plan's models against what was measured: peak GPU memory (trainer/memory.py) within 10% and
tokens/s per GPU (generators/plan/speed.py) within 15% of every trainer configuration measured on
H200 (benchmarks/results/*.jsonl, each record with the command that measured it), the 2-GPU/1-GPU
ratio within 5 points; and the parts of the speed and cost models that need no GPU."""

from __future__ import annotations

import json
import math
import re

import pytest
from matrix_support import HEADER
from support import REPO_ROOT

from generators.core.errors import InputError
from generators.matrix import expand, load
from generators.plan import plan_runs, speed
from generators.plan.cost import load_prices
from generators.plan.estimate import estimate_matrix
from generators.plan.table import plan_rows
from trainer.catalog import INSTANCE_TYPES, MODELS
from trainer.config import check_topology, from_dict, to_dict
from trainer.memory import estimate_peak_gib

RESULTS = REPO_ROOT / "benchmarks" / "results"
MEMORY_BOUND = 0.10
SPEED_BOUND = 0.15
RATIO_BOUND = 0.05

# Measured configurations the models are known to miss, each with why; a test below keeps each one
# outside its bound, so a model that learns them fails until it is moved back into the fixtures.
# trainer/memory.py holds every measured configuration to 10% (within -7% and +2%).
MEMORY_OUTSIDE: dict[tuple[str, str], str] = {}
SPEED_OUTSIDE = {
    (
        "h200x1-suite2.jsonl",
        "default-bf16-optimizer-state",
    ): "the per-parameter eager bf16-moment update, replaced since by one compiled kernel (benchmarks/reports/)",
    # The allocator near the GPU's capacity (138.4-138.5 of 140 GiB reserved, against 124-127 for the
    # rows beside them): 12-16% slower than their batch predicts; the model sees allocated memory only.
    ("h200x1-perf-llama2-7b.jsonl", "batch4-bf16-moments"): "the allocator near capacity (138.4 GiB reserved)",
    ("h200x1-perf-llama3.1-8b.jsonl", "fp8-batch4-bf16-moments"): "the allocator near capacity (138.5 GiB reserved)",
    ("h200x1-perf2-llama2-7b.jsonl", "batch4-bf16-moments-cudnn"): "the allocator near capacity (138.4 GiB reserved)",
    ("h200x1-perf2-llama3.1-8b.jsonl", "fp8-batch4-bf16-moments-cudnn"): "the allocator near capacity (138.5 GiB)",
    ("h200x1-perf3-llama2-7b.jsonl", "batch3-bf16-moments-shard-grad-op"): "the allocator near capacity (138.1 GiB)",
}


def trainer_records() -> list[tuple[str, int, dict]]:
    """(file, line, record) of every measured configuration of the trainer (the FSDP1 baseline is
    another program; its records have no parallelism settings)."""
    out = []
    for path in sorted(RESULTS.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            record = json.loads(line)
            if "parallelism.sharding_strategy" in record["config"] and "NVIDIA" in record["versions"]["gpu"]:
                out.append((path.name, number, record))
    return out


RECORDS = trainer_records()


def train_config(record: dict):
    c = record["config"]
    nested = {
        "model": {"name": c["model"]},
        "data": {"format": "synthetic", "seq_len": c["seq_len"]},
        "training": {"batch_size_per_gpu": c["batch_size_per_gpu"], "grad_accum_steps": c.get("grad_accum_steps", 1)},
        "parallelism": {},
    }
    for key, value in c.items():
        section, _, leaf = key.partition(".")
        if section in ("parallelism", "training") and leaf:
            nested[section][leaf] = value
    return from_dict(nested)


def local_world(record: dict) -> int:
    # Several launch agents on one host (benchmarks/suite.py --nodes) split the GPUs between them.
    return record["world_size"] // record.get("nodes", 1)


def predicted_memory(record: dict) -> float:
    cfg = train_config(record)
    shard = check_topology(cfg.parallelism, record["world_size"], local_world(record))
    return estimate_peak_gib(MODELS[record["config"]["model"]], cfg, shard)


def label(name: str, number: int, record: dict) -> str:
    return f"{name}:{number} {record['name']} ({record['world_size']} GPUs)"


def test_the_fixtures_cover_models_checkpointing_strategies_and_two_gpus():
    def configuration(r: dict) -> tuple:
        c = r["config"]
        return (
            c["model"],
            c["seq_len"],
            c["batch_size_per_gpu"],
            c["parallelism.activation_checkpointing"],
            c["parallelism.sharding_strategy"],
            c["parallelism.precision"],
            c["parallelism.compile"],
            r["world_size"],
        )

    within = {configuration(r) for name, _, r in RECORDS if (name, r["name"]) not in MEMORY_OUTSIDE}
    # At least 8 configurations the memory model must hold to 10%, over models, sequence lengths,
    # checkpointing modes, strategies, compiled and eager layers, and 1 and 2 GPUs.
    assert len(within) >= 8, within
    assert {c[0] for c in within} >= {"llama2-7b", "llama2-13b", "llama3.1-8b"}
    # Activations grow with the tokens of a micro-batch: more than one sequence length is held to it.
    assert len({c[1] for c in within}) >= 2, within
    assert {c[3] for c in within} == {"none", "selective", "full"}
    assert {c[4] for c in within} >= {"FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"}
    assert {c[6] for c in within} == {True, False} and {c[7] for c in within} == {1, 2}
    # Both precisions are held to the bound by at least one configuration each.
    assert {c[5] for c in within} == {"bf16", "fp8"}
    for _, _, r in RECORDS:
        assert r["command"].strip(), "every fixture carries the command that measured it"


@pytest.mark.parametrize("name,number,record", RECORDS, ids=[label(*r) for r in RECORDS])
def test_predicted_peak_memory_is_within_10_percent(name, number, record):
    error = predicted_memory(record) / record["peak_allocated_gib"] - 1
    if (name, record["name"]) in MEMORY_OUTSIDE:
        assert abs(error) > MEMORY_BOUND, f"now within the bound: move it back into the fixtures ({error:+.1%})"
    else:
        assert abs(error) <= MEMORY_BOUND, f"{error:+.1%}: {record['command']}"


def predicted_speed(record: dict) -> float:
    return speed.predict_measured(
        record["config"], record["world_size"], local_world(record), record["versions"]["gpu"], one_host=True
    )


@pytest.mark.parametrize("name,number,record", RECORDS, ids=[label(*r) for r in RECORDS])
def test_predicted_tokens_per_second_is_within_15_percent(name, number, record):
    error = predicted_speed(record) / record["tokens_per_s_per_gpu"] - 1
    if (name, record["name"]) in SPEED_OUTSIDE:
        assert abs(error) > SPEED_BOUND, f"now within the bound: move it back into the fixtures ({error:+.1%})"
    else:
        assert abs(error) <= SPEED_BOUND, f"{error:+.1%}: {record['command']}"


# 1-GPU and 2-GPU measurements of one configuration in one lease (benchmarks/h200x2.sh measures the
# one-GPU runs beside the two-GPU ones, so the spread between leases does not enter the ratio).
RATIO_PAIRS = [
    (("h200x1-fp8.jsonl", "default"), ("h200x2-llama2-7b.jsonl", "default")),
    (("h200x1-fp8.jsonl", "default-fp8"), ("h200x2-llama2-7b.jsonl", "default-fp8")),
    (("h200x1-fp8.jsonl", "default"), ("h200x2-nodes2.jsonl", "default")),
]


@pytest.mark.parametrize("one,two", RATIO_PAIRS, ids=[f"{b[0]}:{b[1]}" for _, b in RATIO_PAIRS])
def test_the_two_gpu_over_one_gpu_ratio_is_within_5_points(one, two):
    by = {(name, r["name"]): r for name, _, r in RECORDS}
    r1, r2 = by[one], by[two]
    assert r1["world_size"] == 1 and r2["world_size"] == 2
    measured = r2["tokens_per_s_per_gpu"] / r1["tokens_per_s_per_gpu"]
    predicted = predicted_speed(r2) / predicted_speed(r1)
    assert abs(predicted - measured) <= RATIO_BOUND, (predicted, measured)


def test_the_calibration_runs_are_the_measurements_they_name():
    for cal in speed.CALIBRATION:
        file, _, number = cal.source.rpartition(":")
        record = json.loads((REPO_ROOT / file).read_text().splitlines()[int(number) - 1])
        c = record["config"]
        assert record["tokens_per_s_per_gpu"] == pytest.approx(cal.tokens_per_s_per_gpu, abs=0.5), cal.source
        assert (
            c["model"],
            c["seq_len"],
            c["batch_size_per_gpu"],
            c["parallelism.precision"],
            c["parallelism.compile"],
            c["parallelism.activation_checkpointing"],
            record["world_size"],
        ) == (cal.model, cal.seq_len, cal.batch_size_per_gpu, cal.precision, cal.compile, cal.checkpointing, 1)
        # The model reproduces its own calibration run.
        assert predicted_speed(record) == pytest.approx(cal.tokens_per_s_per_gpu, rel=1e-9)


def test_every_instance_type_of_the_catalog_has_hardware_figures():
    for instance in INSTANCE_TYPES.values():
        hw = speed.hardware(instance)
        assert hw.gpu_model == instance.gpu_model and hw.hbm_bytes_s > 0 and hw.nvlink_bytes_s > 0
        assert hw.network_bytes_s == instance.network_gbps * 1e9 / 8


def seed_config(**parallelism):
    return from_dict(
        {
            "model": {"name": "llama2-13b"},
            "data": {"format": "synthetic", "seq_len": 4096},
            "training": {"batch_size_per_gpu": 3},
            "parallelism": {"activation_checkpointing": "full", **parallelism},
        }
    )


def per_gpu(instance: str, nodes: int, batch: int = 3, **parallelism) -> float:
    cfg = seed_config(**parallelism)
    cfg = from_dict({**to_dict(cfg), "training": {**to_dict(cfg)["training"], "batch_size_per_gpu": batch}})
    shard = check_topology(cfg.parallelism, nodes * 8, 8)
    topo = speed.Topology(nodes=nodes, gpus_per_node=8, shard=shard)
    return speed.predict(MODELS["llama2-13b"], cfg, topo, speed.hardware(INSTANCE_TYPES[instance])).tokens_per_s_per_gpu


def test_one_gpu_sends_nothing_and_full_shard_traffic_is_hand_computed():
    arch = MODELS["llama2-7b"]
    cfg = seed_config()
    one = speed.Topology(nodes=1, gpus_per_node=1, shard=1)
    t1 = speed.traffic_bytes(arch, cfg, one)
    assert (t1.gather_forward, t1.gather_backward, t1.reduce, t1.across) == (0.0, 0.0, 0.0, 0.0)
    two = speed.traffic_bytes(arch, cfg, speed.Topology(nodes=1, gpus_per_node=2, shard=2))
    # bf16 all-gathers in forward and backward and an fp32 reduce-scatter, each of half the parameters.
    assert (two.gather_forward, two.gather_backward, two.reduce, two.across) == pytest.approx(
        (2 * arch.num_params / 2, 2 * arch.num_params / 2, 4 * arch.num_params / 2, 0.0)
    )


def test_scaling_across_nodes_is_predicted_from_the_network_not_assumed_linear():
    # FULL_SHARD over nodes: p4de's 400 Gbps per node hides less of the traffic than p5's 3,200.
    p4de = [per_gpu("p4de.24xlarge", n) for n in (1, 2, 16)]
    p5 = [per_gpu("p5.48xlarge", n) for n in (1, 2, 16)]
    assert p4de[2] / p4de[0] < p5[2] / p5[0]
    # At batch 1 NO_SHARD's all-reduce of every fp32 gradient over 400 Gbps outlasts the backward.
    assert per_gpu("p4de.24xlarge", 2, 1, sharding_strategy="NO_SHARD") < 0.8 * per_gpu("p4de.24xlarge", 1, 1)


def test_hybrid_shard_moves_less_across_nodes_than_full_shard():
    arch = MODELS["llama2-13b"]
    topo = speed.Topology(nodes=4, gpus_per_node=8, shard=8)
    hybrid = speed.traffic_bytes(arch, seed_config(sharding_strategy="HYBRID_SHARD"), topo)
    assert hybrid.across == pytest.approx(2 * 3 / 4 * 4 * arch.num_params / 8)
    full = speed.traffic_bytes(arch, seed_config(), speed.Topology(nodes=4, gpus_per_node=8, shard=32))
    # What crosses a node's network: the G replica all-reduces against the one ring of FULL_SHARD.
    assert hybrid.across * 8 < full.gather_forward + full.gather_backward + full.reduce


def test_the_price_table_has_every_matrix_region_and_a_date_and_source_per_row():
    table = load_prices()
    for row in table.rows.values():
        assert row.read and row.source
    assert table.lookup("p5.48xlarge", "us-west-2").usd_per_hour > 0
    assert table.lookup("p5e.48xlarge", "us-west-2").usd_per_hour is None


@pytest.mark.parametrize(
    "row,message",
    [
        (
            "{instance_type: p9.48xlarge, region: us-west-2, usd_per_hour: 1.0, read: '2026-11-30', source: x}",
            "unknown instance type 'p9.48xlarge'",
        ),
        (
            "{instance_type: p5.48xlarge, region: us-west-2, usd_per_hour: -1, read: '2026-11-30', source: x}",
            "must be a positive number",
        ),
        (
            "{instance_type: p5.48xlarge, region: us-west-2, usd_per_hour: 5, read: yesterday, source: x}",
            "must be a quoted date",
        ),
        ("{instance_type: p5.48xlarge, region: us-west-2, usd_per_hour: 5, read: '2026-11-30'}", "missing"),
    ],
)
def test_a_bad_price_row_names_file_line_and_key(tmp_path, row, message):
    path = tmp_path / "prices.yaml"
    path.write_text(
        f"prices:\n  - {{instance_type: p4d.24xlarge, region: us-east-1, usd_per_hour: 2.0, "
        f"read: '2026-11-30', source: x}}\n  - {row}\n"
    )
    with pytest.raises(InputError) as err:
        load_prices(path, "prices.yaml")
    text = str(err.value)
    assert text.startswith("prices.yaml:3: prices[1]") and message in text and "; fix: " in text


def test_hours_follow_the_dataset_tokens():
    cfg = seed_config()
    assert speed.steps_per_epoch(8 * 3 * 4096 * 10, cfg, 8) == 10
    assert speed.steps_per_epoch(8 * 3 * 4096 * 10 + 1, cfg, 8) == 11
    assert math.isfinite(per_gpu("p5.48xlarge", 1))


def seqlen_records() -> list[tuple[str, int, dict]]:
    """bf16 measurements at other sequence lengths than the calibration's 4096."""
    return [
        (name, number, r)
        for name, number, r in RECORDS
        if r["config"]["seq_len"] != 4096 and r["config"]["parallelism.precision"] == "bf16"
    ]


def test_causal_attention_is_counted_as_the_kernels_compute_it():
    # Of n tiles of 128 rows a causal kernel computes n (n + 1) / 2 of n^2: 33/64 at 4096.
    assert speed.causal_share(4096) == pytest.approx(33 / 64)
    assert speed.causal_share(16384) == pytest.approx(129 / 256)
    arch = MODELS["llama2-7b"]
    mfu_attention = 12.0 * arch.num_layers * arch.hidden_size * 16384
    assert speed.attention_flops_per_token(arch, 16384, "none", 2) == pytest.approx(mfu_attention * 129 / 256)
    # A recomputed layer runs its causal forward attention once more.
    extra = speed.attention_flops_per_token(arch, 16384, "full", 2) - speed.attention_flops_per_token(
        arch, 16384, "none", 2
    )
    assert extra == pytest.approx(mfu_attention / 3 * 129 / 256)


def test_the_speed_at_sequence_16384_is_within_5_percent_of_the_measurement():
    [(name, number, record)] = [(n, i, r) for n, i, r in RECORDS if r["config"]["seq_len"] == 16384]
    error = predicted_speed(record) / record["tokens_per_s_per_gpu"] - 1
    assert abs(error) <= 0.05, f"{name}:{number} {error:+.1%}"


@pytest.mark.parametrize("name,number,record", seqlen_records(), ids=[label(*r) for r in seqlen_records()])
def test_bf16_speed_at_every_measured_sequence_length_is_within_5_percent(name, number, record):
    assert {r["config"]["seq_len"] for _, _, r in seqlen_records()} >= {2048, 8192, 16384}
    error = predicted_speed(record) / record["tokens_per_s_per_gpu"] - 1
    assert abs(error) <= 0.05, f"{error:+.1%}: {record['command']}"


def predict_on(instance: str, nodes: int, gpus: int, **parallelism) -> speed.Speed:
    cfg = from_dict(
        {
            "model": {"name": "llama2-7b"},
            "data": {"format": "synthetic", "seq_len": 4096},
            "training": {"batch_size_per_gpu": 2},
            "parallelism": parallelism,
        }
    )
    shard = check_topology(cfg.parallelism, nodes * gpus, gpus)
    topo = speed.Topology(nodes=nodes, gpus_per_node=gpus, shard=shard)
    return speed.predict(MODELS["llama2-7b"], cfg, topo, speed.hardware(INSTANCE_TYPES[instance]))


def test_a_prediction_outside_the_calibration_says_what_was_never_measured():
    measured = predict_on("p5en.48xlarge", 1, 8, activation_checkpointing="none")
    assert measured.uncalibrated == () and measured.basis.startswith("measured")
    assert predict_on("p5en.48xlarge", 1, 8, activation_checkpointing="full", compile=False).uncalibrated == ()
    assert predict_on("p5en.48xlarge", 1, 8, activation_checkpointing="full", precision="fp8").uncalibrated == (
        "fp8 with full checkpointing",
    )
    assert predict_on("p5.48xlarge", 1, 8, activation_checkpointing="none").uncalibrated == ("H100 GPU",)
    assert predict_on("p5en.48xlarge", 2, 8, activation_checkpointing="none").uncalibrated == ("EFA network",)
    assert predict_on("p4de.24xlarge", 4, 8, activation_checkpointing="selective", precision="fp8").uncalibrated == (
        "A100 GPU",
        "fp8 with selective checkpointing",
        "EFA network",
    )


def test_the_plan_marks_an_uncalibrated_run_and_not_a_calibrated_one(tmp_path):
    matrix_file = tmp_path / "m.yaml"
    matrix_file.write_text(
        HEADER + "defaults:\n  cluster: fsdp-mixed\n  instance_type: p5en.48xlarge\n  model: llama2-7b\n"
        "  trainer:\n    data: {format: synthetic}\n    training: {max_steps: 100}\n"
        "include:\n  - {nodes: 1, trainer.parallelism.activation_checkpointing: none}\n"
        "  - {nodes: 1, trainer.parallelism.activation_checkpointing: full, trainer.parallelism.precision: fp8}\n"
    )
    matrix = load(str(matrix_file))
    est = estimate_matrix(matrix, plan_runs(matrix, expand(matrix), reject_unfit=False), load_prices())
    calibrated, uncalibrated = (row[4] for row in plan_rows(est.runs))
    assert re.fullmatch(r"[\d,]+", calibrated), calibrated
    assert re.fullmatch(r"[\d,]+ \(uncalibrated: fp8 with full checkpointing\)", uncalibrated), uncalibrated
