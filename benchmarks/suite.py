"""Run named benchmark configurations side by side and print one table (plus the ratio to FSDP1).

Each configuration runs in its own torchrun process (a clean GPU each time), appending one JSON
line to --out; the table at the end is read back from that file, so figures and commands travel
together. A configuration that fails is reported and the suite goes on.

    python benchmarks/suite.py --gpus 1 --out /tmp/h200.jsonl                 # every configuration
    python benchmarks/suite.py --gpus 2 --only baseline-fsdp1,default --out /tmp/h200x2.jsonl
    python benchmarks/suite.py --gpus 2 --nodes 2 --only default,default-hybrid-shard --out /tmp/n2.jsonl
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import click

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Ablations switch one setting of the default configuration back; "fsdp2-eager-fullac" is the plain
# FSDP2 port of the seed's run (full checkpointing, no compile, full logits).
CONFIGS: dict[str, list[str]] = {
    "baseline-fsdp1": ["baseline_fsdp1.py"],
    "fsdp2-eager-fullac": [
        "train_bench.py",
        "--set",
        "parallelism.activation_checkpointing=full",
        "--set",
        "parallelism.compile=false",
        "--set",
        "training.loss_impl=full",
    ],
    "default": ["train_bench.py"],
    "default-no-compile": ["train_bench.py", "--set", "parallelism.compile=false"],
    "default-ac-full": ["train_bench.py", "--set", "parallelism.activation_checkpointing=full"],
    "default-ac-selective": ["train_bench.py", "--set", "parallelism.activation_checkpointing=selective"],
    "default-ac-none": ["train_bench.py", "--set", "parallelism.activation_checkpointing=none"],
    "default-loss-full": ["train_bench.py", "--set", "training.loss_impl=full"],
    "default-fp32-optimizer-state": ["train_bench.py", "--set", "training.bf16_optimizer_state=false"],
    "default-bf16-optimizer-state": ["train_bench.py", "--set", "training.bf16_optimizer_state=true"],
    "default-no-prefetch": ["train_bench.py", "--set", "parallelism.prefetch=false"],
    "default-reshard-last-layer": ["train_bench.py", "--set", "parallelism.reshard_last_layer=true"],
    "default-attn-eager": ["train_bench.py", "--set", "model.attn_implementation=eager"],
    # Sharding strategies named explicitly (the default is FULL_SHARD).
    "default-shard-grad-op": ["train_bench.py", "--set", "parallelism.sharding_strategy=SHARD_GRAD_OP"],
    "default-hybrid-shard": ["train_bench.py", "--set", "parallelism.sharding_strategy=HYBRID_SHARD"],
    # fp8: torchao float8 decoder linears; with and without FSDP's float8 all-gather.
    "default-fp8": ["train_bench.py", "--set", "parallelism.precision=fp8"],
    "default-fp8-all-gather": [
        "train_bench.py",
        "--set",
        "parallelism.precision=fp8",
        "--set",
        "parallelism.fp8_all_gather=true",
    ],
    "default-fp8-shard-grad-op": [
        "train_bench.py",
        "--set",
        "parallelism.precision=fp8",
        "--set",
        "parallelism.sharding_strategy=SHARD_GRAD_OP",
    ],
    "default-fp8-hybrid-shard": [
        "train_bench.py",
        "--set",
        "parallelism.precision=fp8",
        "--set",
        "parallelism.sharding_strategy=HYBRID_SHARD",
    ],
    # Gradient accumulation over 4 micro-batches: one reduce-scatter per step or one per micro-batch.
    "default-accum4-sync-last": [
        "train_bench.py",
        "--set",
        "training.grad_accum_steps=4",
        "--set",
        "parallelism.grad_sync=last",
    ],
    "default-accum4-sync-every": [
        "train_bench.py",
        "--set",
        "training.grad_accum_steps=4",
        "--set",
        "parallelism.grad_sync=every",
    ],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_one(
    name: str,
    gpus: int,
    model: str,
    seq_len: int,
    batch_size: int,
    warmup: int,
    steps: int,
    out: str,
    extra: tuple[str, ...],
    nodes: int = 1,
) -> int:
    """One configuration in fresh processes. nodes > 1 starts that many torchrun agents on this host
    (--nnodes=N, c10d rendezvous on loopback, gpus/N GPUs each), the launch path of a multi-node job."""
    script, *args = CONFIGS[name]
    bench = [
        os.path.join("benchmarks", script),
        "--model",
        model,
        "--seq-len",
        str(seq_len),
        "--batch-size",
        str(batch_size),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--json",
        out,
    ]
    if script == "train_bench.py":
        bench += ["--name", name, *args, *[a for item in extra for a in ("--set", item)]]
    per_node = gpus // nodes
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", PYTHONUNBUFFERED="1")
    t0 = time.time()
    if nodes == 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}", *bench]
        click.echo(f"--- {name}: {' '.join(cmd[2:])}", err=True)
        code = subprocess.run(
            cmd, cwd=ROOT, env=dict(env, BENCH_LAUNCHER=f"torchrun --nproc_per_node={gpus}")
        ).returncode
    else:
        launch = [
            f"--nnodes={nodes}",
            f"--nproc_per_node={per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
            f"--rdzv-id=suite-{name}",
        ]
        agents = []
        for node in range(nodes):
            visible = ",".join(str(node * per_node + i) for i in range(per_node))
            cmd = [sys.executable, "-m", "torch.distributed.run", *launch, *bench]
            click.echo(f"--- {name} agent {node} (CUDA_VISIBLE_DEVICES={visible}): {' '.join(cmd[2:])}", err=True)
            agents.append(
                subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=dict(
                        env,
                        CUDA_VISIBLE_DEVICES=visible,
                        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
                        BENCH_LAUNCHER=f"torchrun {' '.join(launch)}",
                    ),
                )
            )
        code = max(agent.wait() for agent in agents)
    click.echo(f"--- {name}: exit {code} after {time.time() - t0:.0f}s", err=True)
    return code


@click.command()
@click.option("--gpus", default=1, show_default=True)
@click.option(
    "--nodes",
    default=1,
    show_default=True,
    help="torchrun agents on this host (--nnodes, c10d rendezvous), each with gpus/nodes GPUs.",
)
@click.option("--model", default="llama2-7b", show_default=True)
@click.option("--seq-len", default=4096, show_default=True)
@click.option("--batch-size", default=2, show_default=True)
@click.option("--warmup", default=5, show_default=True)
@click.option("--steps", default=10, show_default=True)
@click.option("--only", default="", help="Comma-separated configuration names (default: all).")
@click.option("--set", "extra", multiple=True, help="Override added to every trainer configuration.")
@click.option("--out", required=True, help="JSON lines file the results are appended to.")
def main(
    gpus: int,
    nodes: int,
    model: str,
    seq_len: int,
    batch_size: int,
    warmup: int,
    steps: int,
    only: str,
    extra: tuple[str, ...],
    out: str,
) -> None:
    """Run benchmark configurations one after another and print a comparison table."""
    if nodes < 1 or gpus % nodes:
        raise click.BadParameter(f"{nodes} does not divide --gpus {gpus}; use a divisor", param_hint="--nodes")
    names = [n for n in only.split(",") if n] or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise click.BadParameter(
            f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}", param_hint="--only"
        )
    failed = [n for n in names if run_one(n, gpus, model, seq_len, batch_size, warmup, steps, out, extra, nodes)]
    rows = {}
    if os.path.exists(out):
        with open(out, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                if (r["world_size"], r.get("nodes", 1), r["config"]["model"], r["config"]["seq_len"]) == (
                    gpus,
                    nodes,
                    model,
                    seq_len,
                ):
                    rows[r["name"]] = r
    click.echo(
        f"\n{'configuration':<30} {'tokens/s/GPU':>12} {'MFU':>6} {'step s':>7} {'alloc GiB':>9} {'resv GiB':>8}"
    )
    for name in names:
        r = rows.get(name)
        if r is None:
            click.echo(f"{name:<30} {'failed':>12}")
            continue
        click.echo(
            f"{name:<30} {r['tokens_per_s_per_gpu']:>12,.0f} {100 * r['mfu']:>5.1f}% "
            f"{r['median_step_time_s']:>7.3f} {r.get('peak_allocated_gib', 0):>9.1f} "
            f"{r.get('peak_reserved_gib', 0):>8.1f}"
        )
    for name in ("default", "default-fp8"):
        if "baseline-fsdp1" in rows and name in rows:
            ratio = rows[name]["tokens_per_s_per_gpu"] / rows["baseline-fsdp1"]["tokens_per_s_per_gpu"]
            click.echo(f"{name} / baseline-fsdp1 throughput ratio on {gpus} GPU(s): {ratio:.2f}x")
    if failed:
        click.echo(f"failed: {', '.join(failed)}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
