"""trainer/configs/tiny.yaml end to end: 2 ranks on CPU through real torchrun (gloo).

One straight 40-step run (the module's reference) is scraped over HTTP while it trains, then
checked for the loss, metrics.jsonl, checkpoints and the Hugging Face export. The resume tests
train the same config again, interrupted in three ways, and require the per-step losses to equal
the straight run's bit for bit: the tiny config is fp32 on CPU with one thread per rank, where
every kernel and gloo reduction is deterministic, so any difference is a resume bug (a lost or
repeated batch, a stale optimizer moment, a wrong learning rate), not noise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families
from support import REPO_ROOT
from trainer_support import (
    finish,
    free_port,
    kill_rank_after_checkpoint,
    losses_by_step,
    output_overrides,
    read_metrics,
    run,
    start,
    trainer_env,
)

from trainer.config import from_dict, load_config

# Every test trains through real torchrun processes.
pytestmark = pytest.mark.slow

STEPS = 40
GLOBAL_BATCH = 8  # batch_size_per_gpu 4 x 2 ranks
METRIC_FIELDS = {
    "step",
    "loss",
    "lr",
    "tokens",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "step_time_s",
    "peak_mem_gib",
    "padding_fraction",
    "grad_norm",
    "samples",
    "data_epoch",
    "data_position",
    "restart_count",
    "world_size",
}
PROMETHEUS_NAMES = {
    "fsdp_step",
    "fsdp_loss",
    "fsdp_learning_rate",
    "fsdp_grad_norm",
    "fsdp_tokens",
    "fsdp_tokens_per_second",
    "fsdp_tokens_per_second_per_gpu",
    "fsdp_mfu_ratio",
    "fsdp_step_time_seconds",
    "fsdp_peak_memory_bytes",
    "fsdp_padding_ratio",
    "fsdp_world_size",
    "fsdp_run_info",
}


@dataclass
class Reference:
    out: Path
    log: str
    scrape: str
    records: list[dict]

    @property
    def losses(self) -> dict[int, float]:
        return losses_by_step(self.records)

    def by_step(self, step: int) -> dict:
        return next(r for r in self.records if r["step"] == step)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    out = tmp_path_factory.mktemp("reference")
    port = free_port()
    proc = start([*output_overrides(out), f"checkpoint.export_dir={out / 'hf'}", f"metrics.prometheus_port={port}"])
    scrape = ""
    while proc.poll() is None and not scrape:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        if any(line.startswith("fsdp_step ") and float(line.split()[1]) > 0 for line in text.splitlines()):
            scrape = text
        else:
            time.sleep(0.05)
    log = finish(proc)
    assert proc.returncode == 0, log[-4000:]
    return Reference(out, log, scrape, read_metrics(out))


def test_tiny_config_loss_falls(reference):
    losses = reference.losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = losses[1], sum(losses[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    # From ln(512) ~ 6.2 (uniform over the vocabulary) to well under half of it.
    assert first > 6.0 and last < 0.55 * first, (first, last)


def test_metrics_jsonl_carries_throughput_fields(reference):
    records = reference.records
    for r in records:
        assert METRIC_FIELDS <= set(r), METRIC_FIELDS - set(r)
        assert r["tokens_per_s"] > 0 and r["step_time_s"] > 0 and r["peak_mem_gib"] > 0
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / 2)
        assert r["mfu"] == 0.0  # no peak FLOP/s on CPU
        assert 0.0 <= r["padding_fraction"] < 0.5
        assert r["samples"] == GLOBAL_BATCH * r["step"] and r["world_size"] == 2
    tokens = [r["tokens"] for r in records]
    assert all(b > a for a, b in pairwise(tokens))
    # Real (non-padding) tokens: at most the global batch's token slots.
    assert tokens[-1] <= STEPS * GLOBAL_BATCH * 512
    run_info = json.loads((reference.out / "metrics" / "run.json").read_text())
    resolved = from_dict(run_info["config"])  # the resolved config travels with the metrics
    assert resolved.metrics.output_dir == str(reference.out / "metrics") and resolved.model.name == "tiny"
    assert run_info["world_size"] == 2 and run_info["total_steps"] == STEPS


def test_prometheus_endpoint_scraped_during_run(reference):
    assert reference.scrape, "the endpoint never answered with a completed step while training ran"
    families = {f.name: f for f in text_string_to_metric_families(reference.scrape)}
    assert PROMETHEUS_NAMES <= set(families), PROMETHEUS_NAMES - set(families)
    value = lambda name: families[name].samples[0].value  # noqa: E731
    step = int(value("fsdp_step"))
    assert 1 <= step <= STEPS
    record = reference.by_step(step)
    assert value("fsdp_loss") == record["loss"]
    assert value("fsdp_tokens_per_second") == record["tokens_per_s"]
    assert value("fsdp_world_size") == 2
    assert families["fsdp_tokens"].type == "counter"
    assert families["fsdp_run_info"].samples[0].labels["strategy"] == "FULL_SHARD"


def test_checkpoints_complete_pruned_and_carry_config(reference):
    ckpt = reference.out / "ckpt"
    # interval 20, keep_last 2: steps 20 and 40 remain, nothing temporary is left behind.
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000020", "step-00000040"]
    for step_dir in ckpt.iterdir():
        assert (step_dir / "COMPLETE").is_file()
        assert {"rng-rank00000.pt", "rng-rank00001.pt", "trainer_state.json", ".metadata"} <= {
            p.name for p in step_dir.iterdir()
        }
        saved = load_config(str(step_dir / "config.yaml"))
        assert saved.model.name == "tiny" and saved.checkpoint.dir == str(ckpt)
    state = yaml.safe_load((ckpt / "step-00000040" / "trainer_state.json").read_text())
    assert state["step"] == STEPS and state["metrics"]["samples"] == STEPS * GLOBAL_BATCH


def test_hf_export_matches_sharded_model_logits(reference, tmp_path):
    from transformers import LlamaForCausalLM

    probe = tmp_path / "logits.pt"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO_ROOT / "tests" / "trainer_checkpoint_logits.py"),
        str(reference.out / "ckpt" / "step-00000040"),
        str(probe),
    ]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=trainer_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sharded = torch.load(probe)
    exported = LlamaForCausalLM.from_pretrained(reference.out / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = exported(sharded["input_ids"]).logits
    assert logits.shape == sharded["logits"].shape == (1, sharded["input_ids"].shape[1], 512)
    torch.testing.assert_close(logits, sharded["logits"], rtol=0, atol=1e-5)


def assert_matches_reference(reference: Reference, records: list[dict]) -> None:
    for r in records:
        ref = reference.by_step(r["step"])
        assert r["loss"] == ref["loss"], f"step {r['step']}: {r['loss']!r} != {ref['loss']!r}"
        assert (r["data_epoch"], r["data_position"], r["samples"]) == (
            ref["data_epoch"],
            ref["data_position"],
            ref["samples"],
        ), r["step"]
        assert r["lr"] == ref["lr"]


def test_resume_from_step_n_checkpoint_is_exact(reference, tmp_path):
    # The straight run's step-20 checkpoint is the state of a run stopped after N=20 steps.
    shutil.copytree(reference.out / "ckpt" / "step-00000020", tmp_path / "ckpt" / "step-00000020")
    log = run(output_overrides(tmp_path))
    assert "resumed from" in log and "step-00000020" in log
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(21, STEPS + 1))
    assert_matches_reference(reference, records)


def test_sigkill_of_a_rank_then_relaunch_is_exact(reference, tmp_path):
    overrides = [*output_overrides(tmp_path), "checkpoint.interval_steps=5"]
    proc = start(overrides)
    kill_rank_after_checkpoint(proc, tmp_path / "ckpt", step=10, rank=1)
    log = finish(proc)
    assert proc.returncode != 0, "the job finished although a rank was killed"
    killed = read_metrics(tmp_path)
    assert killed and killed[-1]["step"] < STEPS, "the kill came after the run had finished"
    log = run(overrides)
    records = read_metrics(tmp_path)
    resumed = records[len(killed) :]
    resume_step = resumed[0]["step"] - 1
    assert resume_step >= 10 and resume_step % 5 == 0 and resume_step <= killed[-1]["step"]
    assert f"step-{resume_step:08d}" in log
    assert [r["step"] for r in resumed] == list(range(resume_step + 1, STEPS + 1))
    assert_matches_reference(reference, killed + resumed)


def test_max_restarts_recovers_without_lost_or_repeated_data(reference, tmp_path):
    proc = start([*output_overrides(tmp_path), "checkpoint.interval_steps=5"], torchrun_args=["--max-restarts=1"])
    kill_rank_after_checkpoint(proc, tmp_path / "ckpt", step=10, rank=1)
    log = finish(proc)
    assert proc.returncode == 0, log[-4000:]
    records = read_metrics(tmp_path)
    first = [r for r in records if r["restart_count"] == 0]
    second = [r for r in records if r["restart_count"] == 1]
    assert first and second, "torchrun did not restart the workers"
    resume_step = second[0]["step"] - 1
    assert resume_step >= 10 and resume_step % 5 == 0 and resume_step <= first[-1]["step"]
    # The run that counts: the first attempt up to the checkpoint, then the restarted one.
    effective = [r for r in first if r["step"] <= resume_step] + second
    assert [r["step"] for r in effective] == list(range(1, STEPS + 1))
    # Every step consumed exactly the next global batch of the same sampler order as the straight
    # run (positions and sample counts), and trained on the same rows (bitwise equal losses).
    assert all(r["samples"] == GLOBAL_BATCH * r["step"] for r in effective)
    assert_matches_reference(reference, effective)
