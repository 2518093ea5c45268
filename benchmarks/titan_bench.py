"""Throughput of torchtitan's own trainer on the project's model, sequence, batch and precision.

The reference row beside benchmarks/train_bench.py: torchtitan.train.Trainer (its FSDP2 wrapping,
per-block torch.compile, activation checkpointing, float8 converter, fused AdamW and train_step),
built from torchtitan's own command-line configuration, for the project's catalog architecture
(trainer.catalog.MODELS: Llama-2-7B is torchtitan's llama3 model with 32 query and 32 key/value
heads, SwiGLU width 11008, vocabulary 32000 and rope theta 10000; Llama-3.1-8B is its "8B" flavor).
The tokens are random, every position is trained, as in train_bench.py. The same figures as
train_bench.py: the median of the timed optimizer steps after warm-up, tokens/s per GPU, and MFU by
the catalog's FLOPs per token over the GPU's dense bf16 peak.

    torchrun --nproc_per_node=1 benchmarks/titan_bench.py --model llama2-7b --precision fp8

torchtitan (pinned in benchmarks/h200_perf.sh) is not a project requirement: the GPU machine gets it
as wheels. Its text-dataset module imports Hugging Face `datasets` at import time; the bench never
loads a dataset, so where that package cannot be imported a placeholder module stands in for it.
"""

from __future__ import annotations

import os
import sys
import types

import click

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer.catalog import MODELS  # noqa: E402

SPEC = "project_llama"  # the train spec registered below: torchtitan's llama3 with the catalog's flavors


def titan_args(
    model: str, seq_len: int, batch_size: int, precision: str, recipe: str, checkpointing: str, dump: str
) -> list[str]:
    """torchtitan's command-line configuration for the row (its ConfigManager parses it)."""
    args = [
        "--job.dump_folder", dump,
        "--model.name", SPEC,
        "--model.flavor", model,
        "--training.seq_len", str(seq_len),
        "--training.local_batch_size", str(batch_size),
        "--training.steps", "100000",
        "--training.max_norm", "1.0",
        "--training.mixed_precision_param", "bfloat16",
        "--training.mixed_precision_reduce", "float32",
        "--parallelism.data_parallel_shard_degree", "-1",
        "--optimizer.name", "AdamW",
        "--optimizer.implementation", "fused",
        "--optimizer.lr", "2e-5",
        "--optimizer.weight_decay", "0.0",
        "--lr_scheduler.warmup_steps", "1",
        "--activation_checkpoint.mode", checkpointing,
        "--compile.enable",
        "--metrics.log_freq", "100000",
    ]  # fmt: skip
    if precision == "fp8":
        # As the project: decoder linears in float8, the output layer in bf16, no float8 all-gather.
        args += [
            "--model.converters", "quantize.linear.float8",
            "--quantize.linear.float8.recipe_name", recipe,
            "--quantize.linear.float8.filter_fqns", "output",
        ]  # fmt: skip
    return args


def _datasets_placeholder() -> None:
    try:
        import datasets  # noqa: F401
        import datasets.distributed  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        placeholder = types.ModuleType("datasets")
        placeholder.Dataset = object  # type: ignore[attr-defined]
        placeholder.load_dataset = None  # type: ignore[attr-defined]
        distributed = types.ModuleType("datasets.distributed")
        distributed.split_dataset_by_node = None  # type: ignore[attr-defined]
        sys.modules["datasets"] = placeholder
        sys.modules["datasets.distributed"] = distributed


def register_spec() -> None:
    """torchtitan's llama3 train spec with the catalog architectures as flavors, and no tokenizer,
    dataloader or validator (the bench feeds tokens itself)."""
    import dataclasses

    from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec  # type: ignore[import-not-found]
    from torchtitan.protocols.train_spec import register_train_spec  # type: ignore[import-not-found]

    base = get_train_spec()
    flavors = {
        "llama2-7b": TransformerModelArgs(
            dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000, multiple_of=256, rope_theta=10000
        ),
        "llama3.1-8b": dataclasses.replace(base.model_args["8B"], vocab_size=128256),
    }
    for name, args in flavors.items():
        arch = MODELS[name]
        assert (args.dim, args.n_layers, args.n_heads, args.vocab_size) == (
            arch.hidden_size,
            arch.num_layers,
            arch.num_heads,
            arch.vocab_size,
        ), name
    spec = dataclasses.replace(
        base, model_args=flavors, build_tokenizer_fn=None, build_dataloader_fn=None, build_validator_fn=None
    )
    register_train_spec(SPEC, spec)


@click.command()
@click.option("--model", "model_name", default="llama2-7b", type=click.Choice(["llama2-7b", "llama3.1-8b"]))
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--batch-size", default=2, show_default=True, help="Sequences per GPU per step.")
@click.option("--precision", default="bf16", type=click.Choice(["bf16", "fp8"]), show_default=True)
@click.option("--fp8-recipe", default="tensorwise", type=click.Choice(["tensorwise", "rowwise"]), show_default=True)
@click.option(
    "--checkpointing",
    default="none",
    type=click.Choice(["none", "selective", "full"]),
    show_default=True,
    help="torchtitan's activation_checkpoint.mode (the project's resolved `auto` for the row).",
)
@click.option("--warmup", default=5, show_default=True, help="Untimed steps (compile happens here).")
@click.option("--steps", default=10, show_default=True, help="Timed steps.")
@click.option("--name", default="torchtitan", show_default=True, help="Label of this configuration.")
@click.option("--json", "json_path", default=None, help="Append the result as a JSON line here.")
def main(
    model_name: str,
    seq_len: int,
    batch_size: int,
    precision: str,
    fp8_recipe: str,
    checkpointing: str,
    warmup: int,
    steps: int,
    name: str,
    json_path: str | None,
) -> None:
    """Time torchtitan's optimizer step on random tokens."""
    import importlib.metadata

    import torch
    import torch.distributed as dist

    from benchmarks.common import emit, summarise, time_steps
    from trainer.catalog import peak_flops_for

    _datasets_placeholder()
    from torchtitan.config import ConfigManager  # type: ignore[import-not-found]
    from torchtitan.train import Trainer  # type: ignore[import-not-found]

    register_spec()
    args = titan_args(model_name, seq_len, batch_size, precision, fp8_recipe, checkpointing, "/tmp/titan-bench")
    trainer = Trainer(ConfigManager().parse_args(args))
    vocab = trainer.model_args.vocab_size
    generator = torch.Generator().manual_seed(42)

    def batches():
        while True:
            tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=generator)
            yield {"input": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()

    data = trainer.batch_generator(batches())

    def step(_: int) -> None:
        trainer.step += 1
        trainer.gc_handler.run(trainer.step)
        trainer.train_step(data)

    times = time_steps(step, warmup, steps)
    arch = MODELS[model_name]
    config = {
        "model": model_name,
        "seq_len": seq_len,
        "batch_size_per_gpu": batch_size,
        "grad_accum_steps": 1,
        "implementation": "torchtitan " + importlib.metadata.version("torchtitan"),
        "precision": precision,
        "fp8_recipe": fp8_recipe if precision == "fp8" else "",
        "activation_checkpointing": checkpointing,
        "torchao": importlib.metadata.version("torchao") if precision == "fp8" else "",
        "titan_args": " ".join(args),
    }
    result = summarise(
        name=name,
        config=config,
        step_times=times,
        tokens_per_step_per_gpu=batch_size * seq_len,
        flops_per_token=arch.flops_per_token(seq_len),
        peak_flops=peak_flops_for(torch.cuda.get_device_name()),
    )
    emit(result, json_path)
    trainer.close() if hasattr(trainer, "close") else None
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
