"""The trainer under preemption, broken checkpoints, changed configurations, over-long data, full disks.

Unit tests call trainer.data and trainer.checkpoint directly (a real single-process DCP checkpoint);
the slow ones run trainer/configs/tiny.yaml on 2 CPU ranks through `python -m trainer.launch`
(real torchrun underneath) and break things the way a cluster does: SIGTERM to the launcher, a
truncated shard. A tmpfs that fills up during a checkpoint (a mount namespace, as root):
tests/cluster/test_trainer_full_disk.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from support import REPO_ROOT
from trainer_support import (
    LAUNCH_TIMEOUT_S,
    TINY,
    finish,
    free_port,
    output_overrides,
    read_metrics,
    run_launcher,
    start_launcher,
    trainer_env,
    wait_for,
)

from trainer.checkpoint import COMPLETE, compare_configs, load_scheduler_state, verify
from trainer.config import TrainingConfig, from_dict, to_dict
from trainer.data import IGNORE_INDEX, ByteTokenizer, fit_example, pack, tokenize_example
from trainer.optim import build_scheduler, lr_factor

# --- over-long examples -----------------------------------------------------------------------------


def test_over_long_prompt_is_cut_at_its_start_and_keeps_the_eos_target():
    tok = ByteTokenizer()
    inputs, targets = tokenize_example(tok, "p" * 100, "summary")
    cut = fit_example(inputs, targets, 32)
    assert cut is not None
    cut_in, cut_tg = cut
    assert len(cut_in) == len(cut_tg) == 32
    assert cut_in[0] == tok.bos_token_id  # BOS stays
    assert cut_tg[-1] == tok.eos_token_id  # the row still teaches where the response ends
    trained = [t for t in cut_tg if t != IGNORE_INDEX]
    assert trained == tok.encode("summary") + [tok.eos_token_id]
    # The kept inputs are the tail of the original ones.
    assert cut_in[1:] == inputs[-31:] and cut_tg[1:] == targets[-31:]


def test_response_longer_than_the_window_is_dropped_and_counted():
    tok = ByteTokenizer()
    examples = [
        tokenize_example(tok, "p" * 10, "r" * 10),  # fits
        tokenize_example(tok, "p" * 100, "r" * 10),  # prompt cut
        tokenize_example(tok, "p" * 5, "r" * 40),  # response alone does not fit: dropped
        tokenize_example(tok, "p" * 200, "r" * 200),
    ]  # dropped (it used to train prompt only)
    for packing in (True, False):
        ds = pack(examples, seq_len=32, packing=packing, pad_id=tok.pad_token_id)
        assert (ds.num_examples, ds.num_truncated, ds.num_dropped) == (4, 1, 2)
        # Every row trains something and every example in it ends with its EOS target.
        for row in range(len(ds)):
            trained = ds.targets[row][ds.targets[row] != IGNORE_INDEX].tolist()
            assert trained and trained.count(tok.eos_token_id) == int((ds.inputs[row] == tok.bos_token_id).sum())


# --- configuration changes on resume ----------------------------------------------------------------


def tiny_dict(**sections) -> dict:
    import yaml

    data = yaml.safe_load(TINY.read_text())
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return to_dict(from_dict(data))


def test_resume_refuses_what_the_weights_or_data_order_depend_on_and_accepts_the_rest():
    saved = tiny_dict()
    refused, accepted = compare_configs(saved, tiny_dict(data={"seq_len": 256}, model={"name": "llama2-7b"}), 2, 2)
    assert refused == ["data.seq_len 512 -> 256", "model.name tiny -> llama2-7b"] and accepted == []
    refused, accepted = compare_configs(saved, tiny_dict(training={"lr": 1e-3}, checkpoint={"interval_steps": 7}), 2, 4)
    assert refused == []
    assert accepted == ["training.lr 0.003 -> 0.001", "world size 2 -> 4 (resharded)"]
    assert compare_configs(saved, tiny_dict(), 2, 2) == ([], [])


def test_resumed_schedule_follows_the_current_lr_and_is_unchanged_otherwise():
    param = torch.nn.Parameter(torch.zeros(1))
    cfg = TrainingConfig(lr=3e-3, warmup_steps=4, max_steps=40)
    first = torch.optim.AdamW([param], lr=cfg.lr)
    sched = build_scheduler(first, cfg, 40)
    for _ in range(10):
        first.step()
        sched.step()
    state = sched.state_dict()
    same = build_scheduler(torch.optim.AdamW([param], lr=cfg.lr), cfg, 40)
    load_scheduler_state(same, dict(state), cfg.lr)
    assert same.get_last_lr() == sched.get_last_lr()  # bit for bit: resumed runs stay exact
    lower = TrainingConfig(lr=1e-3, warmup_steps=4, max_steps=40)
    changed = build_scheduler(torch.optim.AdamW([param], lr=lower.lr), lower, 40)
    load_scheduler_state(changed, dict(state), lower.lr)
    assert changed.get_last_lr() == [1e-3 * lr_factor(10, lower, 40)]
    assert changed.optimizer.param_groups[0]["lr"] == changed.get_last_lr()[0]


# --- checkpoint verification ------------------------------------------------------------------------


def write_checkpoint(path: Path, manifest: bool = True) -> None:
    """A real DCP checkpoint written by one process, with the trainer's files around it."""
    dcp.save({"model": {"w": torch.arange(4096, dtype=torch.float32)}}, checkpoint_id=str(path), no_dist=True)
    (path / "trainer_state.json").write_text(json.dumps({"step": 5}))
    files = {p.name: p.stat().st_size for p in path.iterdir()}
    (path / COMPLETE).write_text(json.dumps({"step": 5, "world_size": 1, **({"files": files} if manifest else {})}))


def shard_of(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def test_verify_finds_truncated_and_missing_files(tmp_path):
    whole = tmp_path / "whole"
    write_checkpoint(whole)
    assert verify(str(whole)) is None

    cases = {}
    for name, manifest in (
        ("truncated", True),
        ("truncated-old-format", False),
        ("no-metadata", True),
        ("bad-state", True),
    ):
        path = tmp_path / name
        if manifest:
            shutil.copytree(whole, path)
        else:
            write_checkpoint(path, manifest=False)
        cases[name] = path
    for name in ("truncated", "truncated-old-format"):
        shard = shard_of(cases[name])
        shard.write_bytes(shard.read_bytes()[:1000])
    (cases["no-metadata"] / ".metadata").unlink()
    # Same size as written (so only parsing can tell): '{"step": 5}' with its brace overwritten.
    (cases["bad-state"] / "trainer_state.json").write_text('{"step": 5 ')

    assert "has 1000 bytes" in verify(str(cases["truncated"]))
    # Without COMPLETE's list of sizes, the DCP metadata still tells where each item ends.
    assert "is truncated (1000 of" in verify(str(cases["truncated-old-format"]))
    assert ".metadata has no file" in verify(str(cases["no-metadata"]))
    assert "unreadable" in verify(str(cases["bad-state"]))


# --- real runs (torchrun through trainer.launch) ----------------------------------------------------


def tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory) -> Path:
    """A 2-rank run of 10 steps with checkpoints at steps 5 and 10."""
    out = tmp_path_factory.mktemp("ten")
    run_launcher([*output_overrides(out), "training.max_steps=10", "checkpoint.interval_steps=5"])
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == ["step-00000005", "step-00000010"]
    return out


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_exits_143_and_the_restart_resumes(tmp_path):
    overrides = [*output_overrides(tmp_path), "training.max_steps=400", "checkpoint.interval_steps=0"]
    proc = start_launcher(overrides)
    metrics = tmp_path / "metrics" / "metrics.jsonl"
    wait_for(
        lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3,
        proc,
        LAUNCH_TIMEOUT_S,
        "three logged steps",
    )
    os.kill(proc.pid, signal.SIGTERM)  # what the kubelet does to the container's first process
    log = finish(proc)
    assert proc.returncode == 143, log[-4000:]
    records = read_metrics(tmp_path)
    step = records[-1]["step"]
    assert step < 400, "the run finished before the signal"
    # The step under way was finished and saved; nothing after it ran.
    ckpt = tmp_path / "ckpt" / f"step-{step:08d}"
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [ckpt.name] and verify(str(ckpt)) is None
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step
    assert log.count(f"stopped by SIGTERM after step {step}") == 1 and "exit status 143" in log
    assert "Traceback" not in log

    # The restarted job resumes there; a changed lr and length are said in one line and applied.
    log = run_launcher([*output_overrides(tmp_path), f"training.max_steps={step + 3}", "training.lr=1e-3"])
    assert f"resumed from {ckpt} at step {step}" in log
    assert f"training.lr 0.003 -> 0.001; training.max_steps 400 -> {step + 3}" in log
    resumed = read_metrics(tmp_path)[len(records) :]
    assert [r["step"] for r in resumed] == [step + 1, step + 2, step + 3]
    cfg = TrainingConfig(lr=1e-3, warmup_steps=4, max_steps=step + 3, min_lr_ratio=0.1)
    assert resumed[0]["lr"] == pytest.approx(1e-3 * lr_factor(step, cfg, step + 3), rel=1e-12)


@pytest.mark.slow
def test_sigterm_on_one_node_stops_every_node_with_a_checkpoint_and_143(tmp_path):
    # Two torchrun agents (one rank each) on one c10d rendezvous, as two pods of a job; a node drain
    # signals only one of them.
    port = free_port()
    procs = []
    for node, is_host in (("a", "true"), ("b", "false")):
        cmd = [
            sys.executable,
            "-m",
            "trainer.launch",
            "--nnodes=2",
            "--nproc_per_node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=drain-test",
            f"--rdzv-conf=is_host={is_host}",
            "-m",
            "trainer.train",
            "--config",
            str(TINY),
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.interval_steps=0",
            "checkpoint.export_dir=",
            "training.max_steps=400",
            f"metrics.output_dir={tmp_path / node}",
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                env=trainer_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )

    def logged() -> list[Path]:
        return [
            p
            for p in (tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl")
            if p.is_file() and len(p.read_text().splitlines()) >= 3
        ]

    wait_for(lambda: bool(logged()), procs[1], LAUNCH_TIMEOUT_S, "three logged steps")
    os.kill(procs[1].pid, signal.SIGTERM)
    logs = [finish(proc) for proc in procs]
    assert [proc.returncode for proc in procs] == [143, 143], "\n".join(log[-2500:] for log in logs)
    step = json.loads(logged()[0].read_text().splitlines()[-1])["step"]  # the metrics of global rank 0
    ckpt = tmp_path / "ckpt" / f"step-{step:08d}"
    assert verify(str(ckpt)) is None and {"rng-rank00000.pt", "rng-rank00001.pt"} <= {p.name for p in ckpt.iterdir()}
    assert "every worker stopped after SIGTERM; exit status 143" in logs[0]  # the node that got no signal
    assert "stopped by SIGTERM; exit status 143" in logs[1]


@pytest.mark.slow
def test_truncated_newest_checkpoint_falls_back_and_another_world_size_reshards(ten_steps, tmp_path):
    shutil.copytree(ten_steps / "ckpt", tmp_path / "ckpt")
    shard = tmp_path / "ckpt" / "step-00000010" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    # One rank with twice the batch: the same global batch of 8 rows, so the losses are comparable.
    log = run_launcher([*output_overrides(tmp_path), "training.max_steps=10", "training.batch_size_per_gpu=8"], nproc=1)
    lines = [line for line in log.splitlines() if "cannot be loaded" in line]
    assert len(lines) == 1 and "step-00000010" in lines[0] and "__1_0.distcp" in lines[0], log[-3000:]
    assert (tmp_path / "ckpt" / ".corrupt-step-00000010").is_dir()
    assert f"resumed from {tmp_path / 'ckpt' / 'step-00000005'} at step 5" in log
    assert "world size 2 -> 1 (resharded)" in log and "training.batch_size_per_gpu 4 -> 8" in log
    records = read_metrics(tmp_path)
    reference = {r["step"]: r for r in read_metrics(ten_steps)}
    assert [r["step"] for r in records] == [6, 7, 8, 9, 10]
    for r in records:
        # Same rows, same resharded weights and optimizer moments: equal up to the order of float sums.
        assert r["loss"] == pytest.approx(reference[r["step"]]["loss"], rel=1e-4), r["step"]
        assert r["samples"] == reference[r["step"]]["samples"]


@pytest.mark.slow
def test_resume_with_another_sequence_length_is_refused_in_one_line(ten_steps, tmp_path):
    shutil.copytree(ten_steps / "ckpt", tmp_path / "ckpt")
    before = tree_hash(tmp_path / "ckpt")
    log = run_launcher([*output_overrides(tmp_path), "data.seq_len=256"], expect_rc=2)
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "data.seq_len 512 -> 256" in errors[0] and "step-00000010" in errors[0], log[-3000:]
    assert "Traceback" not in log
    assert tree_hash(tmp_path / "ckpt") == before
