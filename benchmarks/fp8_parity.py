"""Does fp8 train as well as bf16? The same run in each precision, side by side, one GPU each.

    python benchmarks/fp8_parity.py --out DIR [--model llama2-7b] [--steps 300] [--seq-len 1024]
        [--variants bf16,fp8,fp8-rowwise]

Variants: bf16; fp8 (parallelism.fp8_recipe tensorwise, the default); fp8-rowwise (fp8_recipe rowwise).
With as many GPUs as variants they run at once, one GPU each; with fewer, one after another on GPU 0.

1. Writes samsum-format dialogues (the templates of tests/data/make_trainer_data.py, a fixed seed, and
   a random mood tag closing every summary, so the loss has a floor of about ln(16)/summary tokens) to
   DIR/samsum.jsonl and trains a byte-level BPE tokenizer on them with the `tokenizers` package
   (DIR/tokenizer/, loadable by transformers' AutoTokenizer like a checkpoint's tokenizer).
2. Starts one trainer process per variant (torchrun, one GPU each): precision bf16 on GPU 0, fp8 on
   GPU 1 (and so on), identical otherwise: random init with one seed, the same rows in the same order, the
   trainer's own model, data, optimizer and training step (trainer/). Each writes DIR/<variant>.jsonl,
   one {"step", "loss", "grad_norm", "step_time_s"} per optimizer step.
3. Prints the final losses (mean of the last 20 steps) and each one's relative difference from bf16,
   and writes DIR/loss.svg (every curve; the project's chart code, generators/results/svgchart.py) and
   DIR/parity.json.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import click

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))

MOODS = (
    "calm",
    "busy",
    "tired",
    "cheerful",
    "grumpy",
    "excited",
    "relaxed",
    "nervous",
    "curious",
    "bored",
    "hopeful",
    "sleepy",
    "proud",
    "worried",
    "playful",
    "serious",
)
TAIL = 20  # final loss: mean over the last TAIL steps (one step's loss is noisy)
# Variant name -> the trainer's parallelism settings.
VARIANTS: dict[str, dict[str, str]] = {
    "bf16": {"precision": "bf16"},
    "fp8": {"precision": "fp8", "fp8_recipe": "tensorwise"},
    "fp8-rowwise": {"precision": "fp8", "fp8_recipe": "rowwise"},
}


def make_data(out: str, examples: int, vocab: int) -> tuple[str, str]:
    """The dataset file and the tokenizer directory (written once, reused when present)."""
    from make_trainer_data import samsum
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    data = os.path.join(out, "samsum.jsonl")
    rng = random.Random(0)
    records = [samsum(rng) for _ in range(examples)]
    # The templates make a summary a function of its dialogue, so both runs would drive the loss to
    # zero and the comparison would be of rounding noise. A closing tag the dialogue does not predict
    # (uniform over MOODS) puts a floor under the loss, as real text has one.
    for r in records:
        r["summary"] += f" Mood: {rng.choice(MOODS)}."
    with open(data, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator((f"{r['dialogue']}\n{r['summary']}" for r in records), trainer=trainer)
    tok_dir = os.path.join(out, "tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(
        tok_dir
    )
    return data, tok_dir


def worker(
    variant: str,
    model_name: str,
    data: str,
    tok_dir: str,
    seq_len: int,
    batch: int,
    steps: int,
    lr: float,
    out_path: str,
) -> None:
    """One training run under torchrun (one rank): the trainer's code path, losses to out_path."""
    import time

    import torch

    from benchmarks.common import build_random_model
    from trainer.config import from_dict
    from trainer.data import HFTokenizer, ShardedSampler, build_dataset
    from trainer.optim import build_optimizer, build_scheduler, train_step
    from trainer.parallelize import init_distributed
    from trainer.train import DistEnv

    cfg = from_dict(
        {
            "model": {"name": model_name},
            "data": {"path": data, "format": "samsum", "seq_len": seq_len, "packing": True},
            "training": {
                "batch_size_per_gpu": batch,
                "max_steps": steps,
                "lr": lr,
                "warmup_steps": steps // 10,
                "seed": 0,
            },
            "parallelism": VARIANTS[variant],
        }
    )
    env = DistEnv.from_environ()
    device = init_distributed(env.local_rank)
    torch.manual_seed(0)
    model, cfg = build_random_model(cfg, model_name, env, device)
    dataset = build_dataset(cfg.data, HFTokenizer(tok_dir), model.config.vocab_size, cfg.training.seed)
    sampler = ShardedSampler(len(dataset), batch, env.rank, env.world_size, cfg.training.seed)
    optimizer = build_optimizer(model, cfg.training, device)
    scheduler = build_scheduler(optimizer, cfg.training, steps)
    model.train()
    with open(out_path, "w", encoding="utf-8") as fh:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            batches = [dataset.batch(sampler.next_rows()).to(device)]
            result = train_step(model, optimizer, batches, cfg.training, env.world_size, cfg.parallelism.grad_sync)
            scheduler.step()
            fh.write(
                json.dumps(
                    {
                        "step": step,
                        "loss": float(result.loss),
                        "grad_norm": float(result.grad_norm),
                        "step_time_s": time.perf_counter() - t0,
                        "precision": variant,
                        "rows": len(dataset),
                    }
                )
                + "\n"
            )
            fh.flush()


def read_losses(path: str) -> list[tuple[int, float]]:
    with open(path, encoding="utf-8") as fh:
        return [(r["step"], r["loss"]) for r in map(json.loads, fh)]


def compare(curves: dict[str, list[tuple[int, float]]]) -> dict:
    """Final losses (mean of the last TAIL steps) and the relative difference of each variant against
    bf16 (relative_difference: fp8's, as before; relative_differences: every variant's)."""
    final = {name: sum(v for _, v in pts[-TAIL:]) / len(pts[-TAIL:]) for name, pts in curves.items()}
    rels = {name: abs(v - final["bf16"]) / final["bf16"] for name, v in final.items() if name != "bf16"}
    return {
        "final_loss": final,
        "relative_difference": rels.get("fp8", max(rels.values())),
        "relative_differences": rels,
        "within_2_percent": all(r <= 0.02 for r in rels.values()),
        "steps": {name: len(pts) for name, pts in curves.items()},
        "tail_steps": TAIL,
    }


def chart(curves: dict[str, list[tuple[int, float]]], every: int) -> str:
    from generators.results.svgchart import Series, line_chart

    series = [
        Series(name=name, points=tuple((s, v) for s, v in pts if s == 1 or s % every == 0))
        for name, pts in curves.items()
    ]
    return line_chart(
        series,
        title="Training loss, " + ", ".join(curves) + " (same seed and data)",
        x_label="optimizer step (log scale)",
        y_label="loss",
        y_tick=lambda v: f"{v:.1f}",
    )


@click.command()
@click.option("--out", required=True, help="Directory for the data, the tokenizer, losses and chart.")
@click.option("--model", "model_name", default="llama2-7b", show_default=True)
@click.option("--steps", default=300, show_default=True)
@click.option("--seq-len", default=1024, show_default=True)
@click.option("--batch-size", default=4, show_default=True)
@click.option("--lr", default=1e-4, show_default=True)
@click.option("--examples", default=40000, show_default=True, help="samsum-format dialogues generated")
@click.option("--vocab", default=4096, show_default=True, help="BPE vocabulary size")
@click.option(
    "--variants", default="bf16,fp8", show_default=True, help="Comma-separated, bf16 first: " + ", ".join(VARIANTS)
)
@click.option("--worker", "worker_variant", type=click.Choice(sorted(VARIANTS)), default=None, hidden=True)
def main(
    out: str,
    model_name: str,
    steps: int,
    seq_len: int,
    batch_size: int,
    lr: float,
    examples: int,
    vocab: int,
    variants: str,
    worker_variant: str | None,
) -> None:
    """Train bf16 and fp8 side by side and compare the loss curves."""
    data, tok_dir = os.path.join(out, "samsum.jsonl"), os.path.join(out, "tokenizer")
    if worker_variant:
        worker(
            worker_variant,
            model_name,
            data,
            tok_dir,
            seq_len,
            batch_size,
            steps,
            lr,
            os.path.join(out, f"{worker_variant}.jsonl"),
        )
        return
    names = [v.strip() for v in variants.split(",") if v.strip()]
    if names[:1] != ["bf16"] or len(names) < 2 or any(n not in VARIANTS for n in names) or len(set(names)) < len(names):
        click.echo(f"error: --variants {variants!r}: bf16 first, then one or more of {', '.join(VARIANTS)}", err=True)
        sys.exit(2)
    import torch

    side_by_side = torch.cuda.device_count() >= len(names)
    os.makedirs(out, exist_ok=True)
    make_data(out, examples, vocab)
    codes = []
    procs = []
    for gpu, variant in enumerate(names):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            os.path.abspath(__file__),
            "--out",
            out,
            "--model",
            model_name,
            "--steps",
            str(steps),
            "--seq-len",
            str(seq_len),
            "--batch-size",
            str(batch_size),
            "--lr",
            str(lr),
            "--worker",
            variant,
        ]
        device = gpu if side_by_side else 0
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(device), NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
        click.echo(f"--- {variant} on GPU {device}: {' '.join(cmd[2:])}", err=True)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
        if side_by_side:
            procs.append(proc)
        else:
            codes.append(proc.wait())
    codes += [p.wait() for p in procs]
    if any(codes):
        click.echo(f"error: a training run failed (exit codes {codes})", err=True)
        sys.exit(1)
    curves = {p: read_losses(os.path.join(out, f"{p}.jsonl")) for p in names}
    result = compare(curves)
    with open(os.path.join(out, "parity.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    with open(os.path.join(out, "loss.svg"), "w", encoding="ascii") as fh:
        fh.write(chart(curves, max(1, steps // 12)))
    click.echo(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
