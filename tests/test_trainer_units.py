"""Trainer building blocks in one process: data, sampler, loss, schedule, optimizer, checkpoints, metrics."""

from __future__ import annotations

import json
import math
import os
from itertools import pairwise

import pytest
import torch
from support import REPO_ROOT
from trainer_support import TINY

from trainer.catalog import MODELS
from trainer.checkpoint import COMPLETE, complete_checkpoints
from trainer.config import ConfigError, DataConfig, MetricsConfig, TrainingConfig, load_config
from trainer.data import (
    IGNORE_INDEX,
    ByteTokenizer,
    ShardedSampler,
    build_dataset,
    format_example,
    pack,
    tokenize_example,
)
from trainer.loss import linear_cross_entropy
from trainer.metrics import MetricsLogger
from trainer.optim import AdamWBf16State, StepResult, clip_coefficient, lr_factor, step_clipped, total_steps
from trainer.train import DistEnv

SAMSUM = str(REPO_ROOT / "tests" / "data" / "samsum_tiny.jsonl")
ALPACA = str(REPO_ROOT / "tests" / "data" / "alpaca_tiny.jsonl")


# --- data -------------------------------------------------------------------------------------------


def test_loss_covers_the_response_only():
    tok = ByteTokenizer()
    prompt, response = format_example("samsum", {"dialogue": "A: hi\nB: yo", "summary": "They greet."}, "x")
    assert prompt == "Summarize this dialog:\nA: hi\nB: yo\n---\nSummary:\n" and response == "They greet."
    inputs, targets = tokenize_example(tok, prompt, response)
    assert len(inputs) == len(targets) == 1 + len(prompt) + len(response)
    assert inputs[0] == tok.bos_token_id
    trained = [t for t in targets if t != IGNORE_INDEX]
    # Targets are the next tokens: exactly the response and EOS, and every one of them.
    assert tok.decode(trained[:-1]) == response and trained[-1] == tok.eos_token_id
    assert targets[: len(prompt)] == [IGNORE_INDEX] * len(prompt)
    assert all(targets[i] == inputs[i + 1] for i in range(len(inputs) - 1) if targets[i] != IGNORE_INDEX)


def test_alpaca_prompt_with_and_without_input():
    with_input, out = format_example("alpaca", {"instruction": "Sort.", "input": "3, 1", "output": "1, 3"}, "x")
    assert "### Input:\n3, 1" in with_input and with_input.endswith("### Response:\n") and out == "1, 3"
    without, _ = format_example("alpaca", {"instruction": "Say hi.", "output": "hi"}, "x")
    assert "### Input" not in without and "### Instruction:\nSay hi." in without


def test_bad_example_names_file_line_and_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"dialogue": "a", "summary": "b"}\n{"dialogue": "a"}\n')
    with pytest.raises(ConfigError) as err:
        build_dataset(DataConfig(path=str(path), format="samsum", seq_len=64), ByteTokenizer(), 512, 0)
    assert err.value.key == "data.path" and f"{path} line 2" in err.value.message and "'summary'" in err.value.message
    path.write_text('{"dialogue": "a", "summary": "b"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        build_dataset(DataConfig(path=str(path), format="samsum", seq_len=64), ByteTokenizer(), 512, 0)


def test_json_list_and_jsonl_give_the_same_rows(tmp_path):
    records = [json.loads(line) for line in open(ALPACA)]
    as_list = tmp_path / "alpaca.json"
    as_list.write_text(json.dumps(records))
    a = build_dataset(DataConfig(path=ALPACA, format="alpaca", seq_len=512), ByteTokenizer(), 512, 0)
    b = build_dataset(DataConfig(path=str(as_list), format="alpaca", seq_len=512), ByteTokenizer(), 512, 0)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_packing_fills_windows_without_splitting_examples():
    tok = ByteTokenizer()
    # The last example's prompt is too long: it is cut (tests/test_trainer_robustness.py covers how).
    examples = [tokenize_example(tok, "p" * n, "r" * min(n, 40)) for n in (10, 20, 30, 40, 200)]
    packed = pack(examples, seq_len=128, packing=True, pad_id=tok.pad_token_id)
    unpacked = pack(examples, seq_len=128, packing=False, pad_id=tok.pad_token_id)
    assert len(unpacked) == 5 and len(packed) == 3  # 10+20+30+40 -> 2 rows of <= 128, then the long one
    assert packed.num_truncated == unpacked.num_truncated == 1
    assert packed.padding_fraction < unpacked.padding_fraction
    # Each example starts with BOS: count examples per row, none lost.
    assert int((packed.inputs == tok.bos_token_id).sum()) == 5
    batch = packed.batch([0, 1])
    assert batch.num_real_tokens == int(packed.lengths[:2].sum())
    flat = packed.targets[:2].reshape(-1).long()
    assert torch.equal(batch.targets, flat[flat != IGNORE_INDEX])
    assert torch.equal(batch.loss_index, (flat != IGNORE_INDEX).nonzero().view(-1))


def test_shipped_data_packs_tightly():
    ds = build_dataset(DataConfig(path=SAMSUM, format="samsum", seq_len=512), ByteTokenizer(), 512, 0)
    assert ds.num_examples == 320 and ds.num_truncated == 0 and ds.padding_fraction < 0.15


def test_synthetic_rows_are_deterministic_and_fully_trained():
    ds = build_dataset(DataConfig(format="synthetic", seq_len=16, num_synthetic_samples=8), None, 100, seed=3)
    a, b = ds.batch([5, 2]), ds.batch([5, 2])
    assert torch.equal(a.input_ids, b.input_ids) and a.input_ids.shape == (2, 16)
    assert a.loss_index is None and a.num_loss_tokens == 32 and int(a.input_ids.max()) < 100
    assert torch.equal(a.input_ids[0, 1:], a.targets[:15])


# --- sampler ----------------------------------------------------------------------------------------


def test_sampler_shards_each_global_batch_across_ranks():
    samplers = [ShardedSampler(50, batch_size=3, dp_rank=r, dp_size=4, seed=7) for r in range(4)]
    assert samplers[0].micro_batches_per_epoch == 4
    seen = []
    for _ in range(4):
        rows = [s.next_rows() for s in samplers]
        flat = [i for r in rows for i in r]
        assert len(set(flat)) == 12
        seen += flat
    assert len(set(seen)) == 48  # one epoch: no row twice
    assert samplers[0].next_rows() != [] and samplers[0].state_dict()["epoch"] == 1  # the 2-row tail is skipped


def test_sampler_resumes_exactly_and_reshuffles_per_epoch():
    straight = ShardedSampler(20, 2, 1, 2, seed=1)
    order = [straight.next_rows() for _ in range(12)]
    resumed = ShardedSampler(20, 2, 1, 2, seed=1)
    first = [resumed.next_rows() for _ in range(7)]
    state = resumed.state_dict()
    again = ShardedSampler(20, 2, 1, 2, seed=1)
    again.load_state_dict(state)
    assert first + [again.next_rows() for _ in range(5)] == order
    assert order[:5] != order[5:10]  # epoch 1 is shuffled differently from epoch 0


def test_sampler_resumed_with_another_world_size_continues_the_global_order():
    old = [ShardedSampler(40, 2, r, 2, seed=5) for r in range(2)]
    consumed = [i for _ in range(3) for s in old for i in s.next_rows()]
    new = [ShardedSampler(40, 1, r, 4, seed=5) for r in range(4)]
    for s in new:
        s.load_state_dict(old[0].state_dict())
    following = [i for _ in range(3) for s in new for i in s.next_rows()]
    reference = ShardedSampler(40, 1, 0, 1, seed=5)
    assert [reference.next_rows()[0] for _ in range(24)] == consumed + following


def test_sampler_needs_one_global_batch():
    with pytest.raises(ConfigError) as err:
        ShardedSampler(5, batch_size=4, dp_rank=0, dp_size=2, seed=0)
    assert err.value.key == "training.batch_size_per_gpu"


# --- loss -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, chunk", [(37, 8), (37, 37), (37, 4096), (1, 8)])
def test_chunked_loss_matches_full_in_value_and_gradients(rows, chunk):
    torch.manual_seed(0)
    hidden = torch.randn(rows, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (rows,))
    full = linear_cross_entropy(hidden, weight, targets, impl="full")
    (full * 0.7).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    chunked = linear_cross_entropy(hidden, weight, targets, impl="chunked", chunk_size=chunk)
    (chunked * 0.7).backward()
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(hidden.grad, grads[0])
    torch.testing.assert_close(weight.grad, grads[1])


def test_chunked_loss_without_trained_rows_still_reaches_the_weights():
    hidden = torch.randn(0, 8, requires_grad=True)
    weight = torch.randn(10, 8, requires_grad=True)
    loss = linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long), impl="chunked")
    loss.backward()
    assert loss.item() == 0.0 and weight.grad is not None and not weight.grad.any()


# --- schedule and optimizer -------------------------------------------------------------------------


def test_lr_schedule_shapes():
    cfg = TrainingConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.1, lr_schedule="cosine")
    factors = [lr_factor(s, cfg, 20) for s in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and factors[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in pairwise(factors[3:]))
    linear = TrainingConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0, lr_schedule="linear")
    assert [lr_factor(s, linear, 5) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    constant = TrainingConfig(lr=1.0, warmup_steps=2, lr_schedule="constant")
    assert [lr_factor(s, constant, 5) for s in range(5)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_total_steps_from_epochs_or_max_steps():
    assert total_steps(TrainingConfig(num_epochs=3, grad_accum_steps=2), micro_batches_per_epoch=10) == 15
    assert total_steps(TrainingConfig(max_steps=7), micro_batches_per_epoch=10) == 7


def test_bf16_state_adamw_tracks_torch_adamw():
    torch.manual_seed(0)
    start = torch.randn(64, 32)
    ours_p = torch.nn.Parameter(start.clone())
    ref_p = torch.nn.Parameter(start.clone())
    ours = AdamWBf16State([ours_p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW([ref_p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(10):
        grad = torch.randn(64, 32)
        ours_p.grad, ref_p.grad = grad.clone(), grad.clone()
        ours.step()
        ref.step()
    assert ours.state[ours_p]["exp_avg"].dtype == torch.bfloat16
    moved = (ref_p - start).abs().mean()
    assert (ours_p - ref_p).abs().mean() < 0.02 * moved


@pytest.mark.parametrize("kind", ["fused", "foreach", "bf16-moments"])
def test_clipping_inside_the_update_matches_clip_grad_norm(kind):
    """step_clipped applies the clipping coefficient in the optimizer's own pass; the parameters and
    moments it leaves are clip_grad_norm_ + step()'s, for a clipped and an unclipped step."""

    def make(p):
        if kind == "bf16-moments":
            return AdamWBf16State([p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        return torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, **{kind: True})

    torch.manual_seed(0)
    start = torch.randn(64, 32)
    ours_p, ref_p = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours, ref = make(ours_p), make(ref_p)
    for max_norm in (0.5, 1e6, 0.5):
        grad = torch.randn(64, 32)
        ours_p.grad, ref_p.grad = grad.clone(), grad.clone()
        norm, coef = clip_coefficient([ours_p.grad], max_norm)
        step_clipped(ours, [ours_p.grad], coef)
        ref_norm = torch.nn.utils.clip_grad_norm_([ref_p], max_norm)
        ref.step()
        assert torch.allclose(norm, ref_norm)
        assert coef.item() == pytest.approx(min(1.0, max_norm / ref_norm.item()), rel=1e-5)
    assert not hasattr(ours, "grad_scale")
    assert (ours_p - start).abs().mean() > 1e-3
    torch.testing.assert_close(ours_p, ref_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.state[ours_p]["exp_avg"], ref.state[ref_p]["exp_avg"], rtol=1e-3, atol=1e-6)


# --- config and launch environment ------------------------------------------------------------------


def test_exponent_notation_is_a_number():
    cfg = load_config(str(TINY), ["training.lr=3e-4", "metrics.peak_flops=989e12"])
    assert cfg.training.lr == 3e-4 and cfg.metrics.peak_flops == 989e12
    with pytest.raises(ConfigError, match="training.max_steps"):
        load_config(str(TINY), ["training.max_steps=1e3"])


def test_dist_env_reads_torchrun_variables_only():
    env = DistEnv.from_environ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert env == DistEnv(rank=3, world_size=8, local_rank=1, local_world_size=4)
    assert DistEnv.from_environ({}) == DistEnv(0, 1, 0, 1)
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        DistEnv.from_environ({"WORLD_SIZE": "two"})


# --- checkpoints and metrics ------------------------------------------------------------------------


def test_only_complete_checkpoints_are_candidates(tmp_path):
    for name, complete in (
        ("step-00000010", True),
        ("step-00000030", False),
        (".tmp-step-00000040", True),
        ("step-00000020", True),
        ("notes", True),
    ):
        (tmp_path / name).mkdir()
        if complete:
            (tmp_path / name / COMPLETE).write_text("{}")
    assert [step for step, _ in complete_checkpoints(str(tmp_path))] == [10, 20]
    assert complete_checkpoints(str(tmp_path / "missing")) == []


def test_metrics_record_and_mfu(tmp_path):
    arch = MODELS["llama2-7b"]
    logger = MetricsLogger(
        MetricsConfig(output_dir=str(tmp_path), log_interval_steps=2),
        is_writer=True,
        world_size=8,
        device=torch.device("cpu"),
        seq_len=4096,
        flops_per_token=arch.flops_per_token(4096),
        peak_flops=989e12,
        info={},
    )
    result = StepResult(
        loss=torch.tensor(2.5),
        grad_norm=torch.tensor(0.5),
        num_loss_tokens=torch.tensor(1000),
        num_real_tokens=torch.tensor(60000),
    )
    assert logger.step_done(1, result, lr=1e-5, num_samples=16, data_state={"epoch": 0, "position": 16}) is None
    record = logger.step_done(2, result, lr=1e-5, num_samples=16, data_state={"epoch": 0, "position": 32})
    logger.close()
    assert record["tokens"] == 120000 and record["samples"] == 32
    assert record["padding_fraction"] == pytest.approx(1 - 120000 / (32 * 4096))
    expected = record["tokens_per_s_per_gpu"] * arch.flops_per_token(4096) / 989e12
    assert record["mfu"] == pytest.approx(expected) and record["mfu"] > 0
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["step"] == 2
    assert logger.state_dict() == {"tokens": 120000, "samples": 32}
    assert math.isclose(arch.flops_per_token(4096) / 1e9, 46.09, rel_tol=0.001)


@pytest.mark.slow
def test_safetensors_slices_read_into_shards(tmp_path):
    from safetensors.torch import save_file

    from trainer.model import SafetensorsReader

    full = torch.randn(10, 6).to(torch.bfloat16)
    save_file({"w": full, "b": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    reader = SafetensorsReader(str(tmp_path))
    out = torch.empty(4, 6, dtype=torch.float32)
    reader.read_into("w", out, (5, 0))
    assert torch.equal(out, full[5:9].float())
    empty = torch.empty(0, 6)
    reader.read_into("w", empty, (10, 0))
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match="model.safetensors"):
        SafetensorsReader(str(tmp_path))


def test_checkpoint_tokenizer_path(tmp_path):
    # A real Hugging Face tokenizer directory, trained here (no download): the path models take.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.data import load_tokenizer

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [json.loads(line)["dialogue"] for line in open(SAMSUM)]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        tmp_path
    )
    hf = load_tokenizer(str(tmp_path), vocab_size=32000)
    assert hf.bos_token_id == 1 and hf.eos_token_id == 2 and hf.pad_token_id == 2
    ds = build_dataset(DataConfig(path=SAMSUM, format="samsum", seq_len=256), hf, 32000, 0)
    assert ds.num_examples == 320 and int(ds.inputs.max()) < 400
    # Subword tokens: far fewer than bytes, and each example still ends in EOS with a trained target.
    assert int(ds.lengths.sum()) < 0.6 * sum(len(line) for line in open(SAMSUM))
    assert int((ds.targets == hf.eos_token_id).sum()) == 320
    with pytest.raises(ConfigError) as err:
        load_tokenizer(str(tmp_path / "missing"), vocab_size=32000)
    assert err.value.key == "model.path"
