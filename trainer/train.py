"""Fine-tune a Llama model with FSDP2: the training entry point.

Run from the repository root; torchrun starts one process per rank and sets RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which are all the trainer reads:

    # CPU, 2 ranks, gloo: the tiny model on the shipped data, in seconds
    torchrun --nproc_per_node=2 -m trainer.train --config trainer/configs/tiny.yaml

    # one node, 8 GPUs, with command-line overrides (defaults < file < overrides)
    torchrun --nproc_per_node=8 -m trainer.train --config trainer/configs/llama2-7b.yaml \\
        training.max_steps=200 parallelism.sharding_strategy=HYBRID_SHARD

    # two nodes through the cluster's etcd rendezvous, restarting failed workers from the last checkpoint
    torchrun --nnodes=2 --nproc_per_node=8 --max-restarts=3 --rdzv-backend=etcd \\
        --rdzv-endpoint=etcd.fsdp-system.svc.cluster.local:2379 --rdzv-id=llama2-7b-run \\
        -m trainer.train --config /etc/fsdp/train.yaml

    # c10d rendezvous over several nodes: give each rendezvous round a fresh store, or a restarted or
    # late-joining node can hang process-group setup on the previous round's keys (see
    # trainer/parallelize.py); the etcd rendezvous needs nothing
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=<first node>:29400 --rdzv-id=llama2-13b-run -m trainer.train --config train.yaml

    # in the cluster's pods: torchrun's arguments through trainer.launch, which waits for a rendezvous
    # host that is not up yet and exits 143 after SIGTERM so the operator restarts the job
    python -m trainer.launch --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=<job>-worker-0:29400 --rdzv-id=<job> -m trainer.train --config /etc/fsdp/train.yaml

    # one process without torchrun (debugging)
    python -m trainer.train --config trainer/configs/tiny.yaml

Exit status: 0 when done; 2 for a bad config or input, with one line `error: <key>: <message>` on
stderr from rank 0 (config, topology and file checks run before torch is imported and before any
process group exists; so does the refusal of fp8 on a GPU below SM 8.9, trainer/fp8.py, of a
checkpoint.dir too small for the checkpoints it must hold, trainer/storage.py, and of a checkpoint saved
with a configuration the run cannot continue); 202 with one line when a checkpoint cannot be written
(e.g. a full disk: restartable, the last complete checkpoint is kept, trainer/checkpoint.py); 143 after SIGTERM
(preemption, eviction, node drain): every rank finishes its step, the checkpoint is written, and
all exit 143 so that the operator restarts the job (trainer/launch.py). Any other failure is a crash
with a traceback. A restarted or re-launched job resumes from the newest loadable checkpoint in
checkpoint.dir (checkpoint.resume=true); the directory comes from the config only, never from the
job's name, so a retried job under a new name keeps its checkpoints.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainer.config import ConfigError, TrainConfig, check_topology, load_config, to_dict

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class DistEnv:
    """The launch topology, from torchrun's environment only (works for c10d and etcd rendezvous)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> DistEnv:
        values = {}
        for name, default in (
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", environ.get("WORLD_SIZE", "1")),
        ):
            raw = environ.get(name, default)
            if not raw.isdigit():
                raise ConfigError(name, f"environment variable is {raw!r}; launch with torchrun")
            values[name] = int(raw)
        return cls(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"])


def preflight(cfg: TrainConfig, env: DistEnv) -> None:
    """Checks before any process group: topology against the launch, input files, model source, and
    (fp8 only, the one check that imports torch) the GPU's float8 support."""
    from trainer.catalog import MODELS

    check_topology(cfg.parallelism, env.world_size, env.local_world_size)
    if cfg.parallelism.precision == "fp8":
        from trainer import fp8

        fp8.check_device(cfg.parallelism, *fp8.local_device(env.local_rank))
    if cfg.data.format != "synthetic" and not os.path.isfile(cfg.data.path):
        raise ConfigError(
            "data.path",
            f"file {cfg.data.path} not found; point data.path at a JSON or JSONL "
            "file (relative paths start at the working directory)",
        )
    if not cfg.model.path:
        if cfg.model.name not in MODELS:
            raise ConfigError(
                "model.name",
                f"unknown architecture {cfg.model.name!r}; use one of {', '.join(sorted(MODELS))} or set model.path",
            )
    elif os.path.isdir(cfg.model.path):
        if not os.path.isfile(os.path.join(cfg.model.path, "config.json")):
            raise ConfigError(
                "model.path", f"{cfg.model.path} has no config.json; point it at a Hugging Face checkpoint directory"
            )
    elif cfg.model.path.startswith((".", "/")) or not HUB_ID.match(cfg.model.path):
        raise ConfigError(
            "model.path",
            f"directory {cfg.model.path} not found; give a checkpoint directory "
            "or a hub id such as meta-llama/Llama-2-7b-hf",
        )


def train(cfg: TrainConfig, env: DistEnv) -> int:
    """The whole run; every rank executes it (collective). Returns the exit status (0, or 143 after SIGTERM)."""
    # Heavy imports only now, so that config errors above are reported in well under a second.
    import torch
    import torch.distributed as dist

    from trainer import model as modeling
    from trainer.catalog import MODELS, peak_flops_for
    from trainer.checkpoint import Checkpointer, StopRequest, load_scheduler_state
    from trainer.data import ShardedSampler, build_dataset, load_tokenizer
    from trainer.metrics import MetricsLogger, host_memory_probe
    from trainer.optim import build_optimizer, build_scheduler, settle_heap, total_steps, train_step
    from trainer.parallelize import build_mesh, init_distributed, parallelize, resolve_checkpointing
    from trainer.progress import ProgressPublisher
    from trainer.storage import check_checkpoint_space
    from trainer.watchdog import Heartbeat

    say = print if env.rank == 0 else (lambda *a, **k: None)
    # The hang watch of trainer.launch reads this rank's heartbeats (trainer/watchdog.py); SIGUSR1 dumps
    # every thread's stack from here on.
    heartbeat = Heartbeat.from_env(env.rank)

    # 1. Process group and device; the model source (a hub id is downloaded once per node).
    device = init_distributed(env.local_rank)
    stop = StopRequest()  # from here on, SIGTERM stops the run at the next step boundary with a checkpoint
    torch.manual_seed(cfg.training.seed + env.rank)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True) and env.world_size > env.local_world_size:
        say(
            "warning: torchrun shares its c10d store with the workers; on several nodes a restart can hang "
            "process-group setup (pytorch/pytorch#135712); launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
        )
    model_dir = modeling.resolve_model_dir(cfg.model) if env.local_rank == 0 else ""
    dist.barrier()
    if env.local_rank != 0:
        model_dir = modeling.resolve_model_dir(cfg.model, local_files_only=True)

    # 2. Model: meta device -> checkpointing/compile/FSDP -> this rank's shards -> weights.
    model = modeling.build_model(cfg.model, model_dir)
    arch = modeling.architecture(model.config, cfg.model.name)
    # Before any model memory exists: a checkpoint.dir that cannot hold keep_last + 1 checkpoints ends
    # the run here with one line and exit 2, not with a failed write hours in.
    check_checkpoint_space(cfg.checkpoint, cfg.training, arch, env.world_size)
    cfg = resolve_checkpointing(cfg, arch, env.world_size, env.local_world_size, device)
    mesh = build_mesh(cfg.parallelism, env.world_size, env.local_world_size, device.type)
    parallelize(model, cfg.parallelism, mesh)
    probe = host_memory_probe()
    t_load = time.perf_counter()
    modeling.materialize(model, device)
    if model_dir:
        modeling.load_weights(model, model_dir)
    else:
        modeling.init_random_weights(model, cfg.model.init_seed)
    load = {
        "source": model_dir or f"random init of {cfg.model.name}",
        "seconds": time.perf_counter() - t_load,
        "host_peak_delta_bytes": probe(),
    }
    stats = torch.tensor([load["host_peak_delta_bytes"]], dtype=torch.int64, device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    load["host_peak_delta_bytes_max_rank"] = int(stats.item())
    say(
        f"model: {modeling.describe(model)}; loaded from {load['source']} in {load['seconds']:.1f}s; "
        f"activation checkpointing {cfg.parallelism.activation_checkpointing}"
    )
    if model_dir and cfg.model.name in MODELS and MODELS[cfg.model.name].num_params != arch.num_params:
        say(
            f"warning: model.name {cfg.model.name} does not match the checkpoint's architecture; "
            "MFU uses the checkpoint's"
        )

    # 3. Data: tokenised rows and this rank's resumable sampler.
    tokenizer = None if cfg.data.format == "synthetic" else load_tokenizer(model_dir, model.config.vocab_size)
    dataset = build_dataset(cfg.data, tokenizer, model.config.vocab_size, cfg.training.seed)
    sampler = ShardedSampler(len(dataset), cfg.training.batch_size_per_gpu, env.rank, env.world_size, cfg.training.seed)
    steps = total_steps(cfg.training, sampler.micro_batches_per_epoch)
    say(
        f"data: {dataset.num_examples} examples -> {len(dataset)} rows of {cfg.data.seq_len} tokens, "
        f"padding {dataset.padding_fraction:.1%}; {dataset.num_truncated} over-long examples cut at the "
        f"prompt's start, {dataset.num_dropped} dropped (response longer than data.seq_len); {steps} steps"
    )

    # 4. Optimizer, schedule, checkpoints (resume from the newest complete one), metrics.
    optimizer = build_optimizer(model, cfg.training, device)
    scheduler = build_scheduler(optimizer, cfg.training, steps)
    checkpointer = Checkpointer(cfg.checkpoint, to_dict(cfg))
    peak_flops = cfg.metrics.peak_flops or (
        peak_flops_for(torch.cuda.get_device_name(device)) if device.type == "cuda" else 0.0
    )
    metrics = MetricsLogger(
        cfg.metrics,
        is_writer=env.rank == 0,
        serves=env.local_rank == 0,
        world_size=env.world_size,
        node_ranks=env.local_world_size,
        total_steps=steps,
        device=device,
        seq_len=cfg.data.seq_len,
        flops_per_token=arch.flops_per_token(cfg.data.seq_len),
        peak_flops=peak_flops,
        info={
            "model": cfg.model.name,
            "strategy": cfg.parallelism.sharding_strategy,
            "precision": cfg.parallelism.precision,
        },
    )
    metrics.set_deadline(heartbeat.deadline)

    def beat(phase: str, step: int | None = None) -> None:
        heartbeat.beat(phase, step)
        metrics.set_deadline(heartbeat.deadline)

    start_step = 0
    resumed = checkpointer.resume(model, optimizer, say)
    resume_path = resumed[0] if resumed else None
    if resumed:
        state = resumed[1]
        load_scheduler_state(scheduler, state["scheduler"], cfg.training.lr)
        sampler.load_state_dict(state["data"])
        metrics.load_state_dict(state["metrics"])
        start_step = state["step"]
        say(f"resumed from {resume_path} at step {start_step}")
    metrics.write_run_info(
        {
            "config": to_dict(cfg),
            "world_size": env.world_size,
            "local_world_size": env.local_world_size,
            "mesh": dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)),
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "num_params": arch.num_params,
            "flops_per_token": arch.flops_per_token(cfg.data.seq_len),
            "peak_flops": peak_flops,
            "load": load,
            "total_steps": steps,
            "resumed_from": resume_path,
            # seconds, whether the optimizer state was filled in place, and its dtypes after the load
            "resume_load": checkpointer.last_load,
            "restart_count": metrics.restart_count,
            "dataset": {
                "examples": dataset.num_examples,
                "rows": len(dataset),
                "padding_fraction": dataset.padding_fraction,
                "truncated": dataset.num_truncated,
                "dropped": dataset.num_dropped,
            },
            "versions": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
            },
        }
    )

    # Progress annotations on rank 0's pod (in a cluster only; failures never stop training).
    progress = ProgressPublisher.from_environment(steps) if env.rank == 0 else None

    # 5. The loop: one optimizer step per iteration, over grad_accum_steps micro-batches.
    accum = cfg.training.grad_accum_steps
    global_rows = cfg.training.batch_size_per_gpu * env.world_size * accum
    model.train()
    settle_heap()
    metrics.restart_clock()
    stopping = False
    for step in range(start_step + 1, steps + 1):
        micro_batches = [dataset.batch(sampler.next_rows()).to(device) for _ in range(accum)]
        lr = float(scheduler.get_last_lr()[0])
        result = train_step(model, optimizer, micro_batches, cfg.training, env.world_size, cfg.parallelism.grad_sync)
        scheduler.step()
        if step == start_step + 1:
            checkpointer.prepare(model, optimizer)  # the optimizer state exists now
        record = metrics.step_done(step, result, lr=lr, num_samples=global_rows, data_state=sampler.state_dict())
        beat("step", step)
        if progress:
            progress.publish(record, force=step == steps, done=step == steps)
        checkpointer.poll()  # a background write that failed stops every rank here (WriteFailed)
        stopping = stop.requested()
        if checkpointer.due(step, steps) or (stopping and checkpointer.enabled):
            beat("checkpoint")
            t_save = time.perf_counter()
            previous = checkpointer.in_flight
            path = checkpointer.save(
                step,
                model,
                optimizer,
                {"data": sampler.state_dict(), "scheduler": scheduler.state_dict(), "metrics": metrics.state_dict()},
            )
            if previous and checkpointer.last:
                say(_saved_line(checkpointer.last))
            if checkpointer.in_flight and (stopping or step == steps):
                # The last save of this launch: the process must not exit before it is complete.
                say(f"checkpoint: {path} staged in {time.perf_counter() - t_save:.1f}s, waiting for its write")
                say(_saved_line(checkpointer.wait()))
            elif checkpointer.in_flight:
                say(f"checkpoint: {path} staged in {time.perf_counter() - t_save:.1f}s, written in the background")
            else:
                say(f"checkpoint: {path} ({time.perf_counter() - t_save:.1f}s)")
            stall_s = time.perf_counter() - t_save
            metrics.exclude(stall_s)
            metrics.checkpoint_done(stall_s, checkpointer.last)
            if progress and checkpointer.last:
                progress.note_checkpoint(checkpointer.last.step)
        if stopping:
            say(
                f"stopped by SIGTERM after step {step}"
                + (f", checkpoint {path}" if checkpointer.enabled else ", no checkpoint (checkpoint.dir is empty)")
                + "; exit status 143, the restarted job resumes"
            )
            break

    # 6. Optional consolidated Hugging Face export (of a finished run), then leave the process group.
    beat("end")
    if cfg.checkpoint.export_dir and not stopping:
        dtype = torch.float32 if cfg.parallelism.precision == "fp32" else torch.bfloat16
        modeling.export_hf(model, cfg.checkpoint.export_dir, dtype=dtype, model_dir=model_dir)
        say(f"export: {cfg.checkpoint.export_dir}")
    metrics.close()
    if progress:
        progress.close()
    checkpointer.close()  # no save is in flight here; releases the host buffers and the writes' group
    # Every rank reaches the end before any tears its connections down: a rank still writing its
    # last checkpoint while a peer destroys the group can abort at exit (seen with gloo under load).
    dist.barrier()
    dist.destroy_process_group()
    # 128 + SIGTERM, what a process killed by the signal reports: the operator restarts such exits.
    return 128 + signal.SIGTERM if stopping else 0


def _saved_line(job) -> str:
    """One line for a completed background save (a trainer.checkpoint._Save)."""
    rate = job.bytes / job.write_s / 1e9 if job.write_s else 0.0
    return (
        f"checkpoint: {job.final} complete, {job.bytes / 1e9:.2f} GB written in {job.write_s:.1f}s "
        f"in the background ({rate:.2f} GB/s)"
    )


def _single_process_defaults() -> None:
    """Let `python -m trainer.train` run as a one-rank job without torchrun."""
    if "MASTER_ADDR" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1"
    )


def _where(key: str, config_path: str, overrides: Sequence[str]) -> str:
    """Where a config key was set: the command line, or the file and line (best effort)."""
    if any(item.partition("=")[0] == key for item in overrides):
        return "command line"
    if "." not in key or not os.path.isfile(config_path):
        return ""
    import yaml

    try:
        with open(config_path, encoding="utf-8") as fh:
            node = yaml.compose(fh)
    except yaml.YAMLError:
        return config_path
    for part in key.split("."):
        match = [
            (k, v)
            for k, v in getattr(node, "value", ())
            if isinstance(node, yaml.MappingNode) and getattr(k, "value", None) == part
        ]
        if not match:
            return config_path
        key_node, node = match[0]
    return f"{config_path} line {key_node.start_mark.line + 1}"


def _fail(err: ConfigError, rank: int, config_path: str, overrides: Sequence[str]) -> int:
    """One line on stderr from rank 0 (every rank hits the same error); exit status 2, or the error's
    own (a checkpoint write that failed: trainer.checkpoint.WRITE_FAILED, restartable)."""
    if rank == 0:
        where = _where(err.key, config_path, overrides)
        print(f"error: {where + ': ' if where else ''}{err}", file=sys.stderr, flush=True)
    else:
        # torchrun stops all workers as soon as one exits: give rank 0 the moment it needs to print.
        time.sleep(1.0)
    return int(getattr(err, "status", 2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.train", description="Fine-tune a Llama model with FSDP2 (launch with torchrun)."
    )
    parser.add_argument("--config", required=True, help="YAML config file (see trainer/configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="e.g. training.max_steps=10")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0")) if os.environ.get("RANK", "0").isdigit() else 0
    try:
        env = DistEnv.from_environ()
        cfg = load_config(args.config, args.overrides)
        preflight(cfg, env)
        _single_process_defaults()
        return train(cfg, env)
    except ConfigError as err:
        return _fail(err, rank, args.config, args.overrides)


if __name__ == "__main__":
    sys.exit(main())
