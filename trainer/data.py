"""Datasets, prompt formatting, packing and the resumable data-parallel sampler.

Formats (one JSON object per example, from a JSON list or a JSONL file):
- samsum: {"dialogue", "summary"}; the prompt is the dialogue, the response the summary.
- alpaca: {"instruction", "input" (may be empty or absent), "output"}.
- synthetic: random tokens, every position trained (benchmarks); no file.

Every example becomes `[BOS] prompt response [EOS]`. Rows hold inputs and targets already shifted by
one (target[t] is the token after input[t]); targets are -100 on prompt tokens, so the loss covers the
response only. With packing, examples are placed greedily, in file order, into seq_len windows
(an example that does not fit starts a new window); the model attends across example boundaries inside
a window, as llama-recipes' packing does. The fraction of padding is reported. Without packing every
example is one row, padded to seq_len.

An example longer than seq_len keeps its end: the beginning of its prompt is cut (BOS stays), so the
whole response and its EOS target are trained and the model still learns where a response stops.
An example whose response alone does not fit is dropped: cutting the response would teach answers
that never end, and a response without its prompt teaches nothing useful. Both counts are reported.

The sampler shuffles rows once per epoch with a seed and hands each data-parallel rank its slice of
every global micro-batch. Its whole state is (epoch, position), position counting global rows
consumed in the epoch, so a resumed run (even with another world size) continues with exactly the
rows it has not seen.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainer.config import ConfigError, DataConfig

IGNORE_INDEX = -100

SAMSUM_PROMPT = "Summarize this dialog:\n{dialogue}\n---\nSummary:\n"
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
FIELDS = {"samsum": ("dialogue", "summary"), "alpaca": ("instruction", "output")}


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 plus BOS/EOS/PAD: the tokenizer of random-init architectures."""

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A Hugging Face tokenizer behind the same small interface as ByteTokenizer."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise ConfigError(
                "model.path",
                f"no tokenizer could be loaded from {path} ({err}); ship tokenizer files with the checkpoint",
            ) from None
        self.bos_token_id = self._tok.bos_token_id
        self.eos_token_id = self._tok.eos_token_id
        if self.eos_token_id is None:
            raise ConfigError("model.path", f"the tokenizer in {path} defines no EOS token")
        # Llama tokenizers have no pad token; padded positions are never trained, so any id works.
        self.pad_token_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_token_id
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tok.decode(list(ids))
        assert isinstance(text, str), type(text)  # one sequence of ids decodes to one string
        return text


def read_records(path: str) -> list[tuple[int, dict]]:
    """(line number, object) pairs from a JSON list or a JSONL file."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError("data.path", f"{path} line {err.lineno}: not valid JSON ({err.msg})") from None
        records = [(0, item) for item in items]
    else:
        records = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ConfigError(
                    "data.path", f"{path} line {lineno}: not valid JSON ({err.msg}); write one object per line"
                ) from None
    for lineno, item in records:
        if not isinstance(item, dict):
            where = f" line {lineno}" if lineno else ""
            raise ConfigError("data.path", f"{path}{where}: each example must be a JSON object")
    return records


def format_example(fmt: str, item: dict, where: str) -> tuple[str, str]:
    """(prompt, response) text of one example."""
    for name in FIELDS[fmt]:
        if not isinstance(item.get(name), str):
            raise ConfigError(
                "data.path",
                f"{where}: field {name!r} missing or not a string; format {fmt} needs {', '.join(FIELDS[fmt])}",
            )
    if fmt == "samsum":
        return SAMSUM_PROMPT.format(dialogue=item["dialogue"]), item["summary"]
    extra = item.get("input") or ""
    if not isinstance(extra, str):
        raise ConfigError("data.path", f"{where}: field 'input' must be a string")
    prompt = (
        ALPACA_PROMPT.format(instruction=item["instruction"], input=extra)
        if extra
        else ALPACA_PROMPT_NO_INPUT.format(instruction=item["instruction"])
    )
    return prompt, item["output"]


def tokenize_example(tok: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Shifted (inputs, targets) of one example; targets are IGNORE_INDEX on the prompt."""
    head = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(prompt)
    tokens = head + tok.encode(response) + [tok.eos_token_id]
    inputs = tokens[:-1]
    targets = [IGNORE_INDEX] * (len(head) - 1) + tokens[len(head) :]
    return inputs, targets


@dataclass
class Batch:
    """One micro-batch of one rank. `loss_index` lists the flat positions with a target (None: all)."""

    input_ids: torch.Tensor  # [batch, seq_len] int64
    targets: torch.Tensor  # [num_loss_tokens] int64, the targets at loss_index
    loss_index: torch.Tensor | None  # [num_loss_tokens] int64 flat positions, or None for every position
    num_loss_tokens: int
    num_real_tokens: int  # non-padding input tokens

    def to(self, device: torch.device) -> Batch:
        if device.type == "cpu":
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            # Pinned host memory lets the copy overlap with the previous step's kernels.
            return t.pin_memory().to(device, non_blocking=True)

        return Batch(
            move(self.input_ids),
            move(self.targets),
            None if self.loss_index is None else move(self.loss_index),
            self.num_loss_tokens,
            self.num_real_tokens,
        )


class PackedDataset:
    """Tokenised rows of seq_len tokens (int32 to halve host memory), with padding statistics."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        lengths: torch.Tensor,
        num_examples: int,
        num_truncated: int,
        num_dropped: int = 0,
    ):
        self.inputs, self.targets, self.lengths = inputs, targets, lengths
        # num_examples counts every example read; num_dropped of them are in no row.
        self.num_examples, self.num_truncated, self.num_dropped = num_examples, num_truncated, num_dropped

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def padding_fraction(self) -> float:
        return 1.0 - float(self.lengths.sum()) / float(self.inputs.numel())

    def batch(self, rows: Sequence[int]) -> Batch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        input_ids = self.inputs[idx].long()
        flat = self.targets[idx].long().view(-1)
        loss_index = (flat != IGNORE_INDEX).nonzero().view(-1)
        return Batch(input_ids, flat[loss_index], loss_index, int(loss_index.numel()), int(self.lengths[idx].sum()))


class SyntheticDataset:
    """Random tokens generated per row from (seed, row), every position trained: no padding."""

    padding_fraction = 0.0
    num_truncated = 0
    num_dropped = 0

    def __init__(self, num_rows: int, seq_len: int, vocab_size: int, seed: int):
        self.num_rows, self.seq_len, self.vocab_size, self.seed = num_rows, seq_len, vocab_size, seed
        self.num_examples = num_rows

    def __len__(self) -> int:
        return self.num_rows

    def batch(self, rows: Sequence[int]) -> Batch:
        gen = torch.Generator()
        out = torch.empty(len(rows), self.seq_len + 1, dtype=torch.long)
        for i, row in enumerate(rows):
            gen.manual_seed(self.seed * 1_000_003 + row)
            out[i] = torch.randint(0, self.vocab_size, (self.seq_len + 1,), generator=gen)
        targets = out[:, 1:].reshape(-1)
        return Batch(out[:, :-1].contiguous(), targets, None, targets.numel(), targets.numel())


def fit_example(inputs: list[int], targets: list[int], seq_len: int) -> tuple[list[int], list[int]] | None:
    """The example cut to at most seq_len positions keeping its end, or None when its response cannot fit.

    Positions 1.. of the prompt are cut (position 0, BOS, stays); every cut position has no target, so
    the whole response and its EOS target remain. The response needs the position of the last prompt
    token (it predicts the first response token) plus one per response token, and position 0 stays.
    """
    if len(inputs) <= seq_len:
        return inputs, targets
    first_trained = next(i for i, t in enumerate(targets) if t != IGNORE_INDEX)
    if len(inputs) - first_trained > seq_len - 1:
        return None
    cut = len(inputs) - seq_len
    return inputs[:1] + inputs[1 + cut :], targets[:1] + targets[1 + cut :]


def pack(examples: list[tuple[list[int], list[int]]], seq_len: int, packing: bool, pad_id: int) -> PackedDataset:
    rows_in: list[list[int]] = []
    rows_tg: list[list[int]] = []
    cur_in: list[int] = []
    cur_tg: list[int] = []
    truncated = dropped = 0
    for example in examples:
        fitted = fit_example(*example, seq_len)
        if fitted is None:
            dropped += 1
            continue
        truncated += fitted[0] is not example[0]
        inputs, targets = fitted
        if cur_in and (not packing or len(cur_in) + len(inputs) > seq_len):
            rows_in.append(cur_in)
            rows_tg.append(cur_tg)
            cur_in, cur_tg = [], []
        cur_in.extend(inputs)
        cur_tg.extend(targets)
    if cur_in:
        rows_in.append(cur_in)
        rows_tg.append(cur_tg)
    n = len(rows_in)
    inputs_t = torch.full((n, seq_len), pad_id, dtype=torch.int32)
    targets_t = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.int32)
    lengths = torch.empty(n, dtype=torch.long)
    for i, (ri, rt) in enumerate(zip(rows_in, rows_tg, strict=True)):
        inputs_t[i, : len(ri)] = torch.tensor(ri, dtype=torch.int32)
        targets_t[i, : len(rt)] = torch.tensor(rt, dtype=torch.int32)
        lengths[i] = len(ri)
    return PackedDataset(inputs_t, targets_t, lengths, len(examples), truncated, dropped)


def load_tokenizer(model_path: str, vocab_size: int) -> Any:
    """The checkpoint's tokenizer, or the byte-level one for random-init architectures."""
    if model_path:
        return HFTokenizer(model_path)
    if vocab_size < ByteTokenizer.vocab_size:
        raise ConfigError(
            "model.name",
            f"vocabulary of {vocab_size} is smaller than the byte-level "
            f"tokenizer's {ByteTokenizer.vocab_size}; use an architecture with a larger vocab",
        )
    return ByteTokenizer()


def build_dataset(cfg: DataConfig, tokenizer: Any, vocab_size: int, seed: int) -> PackedDataset | SyntheticDataset:
    """The training rows for `cfg` (the tokenizer is unused for the synthetic format)."""
    if cfg.format == "synthetic":
        return SyntheticDataset(cfg.num_synthetic_samples, cfg.seq_len, vocab_size, seed)
    examples: list[tuple[list[int], list[int]]] = []
    for lineno, item in read_records(cfg.path):
        where = f"{cfg.path} line {lineno}" if lineno else f"{cfg.path} example {len(examples) + 1}"
        prompt, response = format_example(cfg.format, item, where)
        examples.append(tokenize_example(tokenizer, prompt, response))
    if not examples:
        raise ConfigError("data.path", f"{cfg.path} holds no examples")
    dataset = pack(examples, cfg.seq_len, cfg.packing, tokenizer.pad_token_id)
    if not len(dataset):
        raise ConfigError(
            "data.seq_len",
            f"all {len(examples)} examples of {cfg.path} have a response longer "
            f"than {cfg.seq_len} tokens; raise data.seq_len",
        )
    return dataset


class ShardedSampler:
    """Deterministic, resumable row order; each call hands this rank its rows of one global micro-batch.

    A global micro-batch is `batch_size * dp_size` consecutive rows of the epoch's permutation;
    rank r takes the r-th slice. The tail of an epoch smaller than one global micro-batch is skipped
    so every rank always gets a full batch.
    """

    def __init__(self, num_rows: int, batch_size: int, dp_rank: int, dp_size: int, seed: int):
        self.num_rows, self.batch_size = num_rows, batch_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.global_batch = batch_size * dp_size
        if num_rows < self.global_batch:
            raise ConfigError(
                "training.batch_size_per_gpu",
                f"the dataset has {num_rows} rows, fewer than one global micro-batch of "
                f"{self.global_batch} (batch_size_per_gpu x world size); lower the batch "
                "size or add data",
            )
        self.epoch, self.position = 0, 0
        self._perm_epoch = -1
        self._perm: list[int] = []

    @property
    def micro_batches_per_epoch(self) -> int:
        return self.num_rows // self.global_batch

    def _permutation(self) -> list[int]:
        if self._perm_epoch != self.epoch:
            self._perm = list(range(self.num_rows))
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(self._perm)
            self._perm_epoch = self.epoch
        return self._perm

    def next_rows(self) -> list[int]:
        if self.position + self.global_batch > self.num_rows:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position + self.dp_rank * self.batch_size
        rows = self._permutation()[start : start + self.batch_size]
        self.position += self.global_batch
        return rows

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
