"""Training metrics from rank 0: JSON lines, Prometheus gauges and a short console line.

`<output_dir>/metrics.jsonl`, one object per logged step (figures cover the steps since the last
logged one; times are wall-clock between synchronised points, so they include data loading):

    step                 optimizer step (1-based)
    loss                 mean loss per trained token of the step's global batch
    lr                   learning rate used by the step
    grad_norm            global gradient norm before clipping
    tokens               non-padding input tokens processed so far (all ranks, carried over resumes)
    tokens_per_s         non-padding tokens per second, all ranks
    tokens_per_s_per_gpu tokens_per_s / world size
    mfu                  model FLOPs utilisation, a fraction: tokens_per_s_per_gpu x flops_per_token /
                         peak; flops_per_token = 6 x params other than the input embedding (the lm_head
                         counts) + 12 x layers x heads x head_dim x seq_len (trainer.catalog); fp8 runs
                         use the same bf16 peak, so their MFU compares with bf16's; peak = metrics.peak_flops
                         or the GPU's dense bf16 peak (trainer.catalog.GPU_PEAK_FLOPS); 0 on CPU
    step_time_s          seconds per optimizer step
    peak_mem_gib         peak memory: CUDA max allocated (GPU) or peak resident set size (CPU), rank 0
    peak_mem_reserved_gib CUDA max reserved by the caching allocator (GPU); same as peak_mem_gib on CPU
    padding_fraction     padding share of the input tokens
    loss_tokens          trained (response) tokens of the step, all ranks
    samples              sequences consumed so far (all ranks)
    data_epoch, data_position  sampler state after the step (position = global rows into the epoch)
    restart_count        torchrun's restart counter of this process (TORCHELASTIC_RESTART_COUNT)
    world_size, time     ranks; unix time of the log

Prometheus (text format at http://<pod>:<metrics.prometheus_port>/metrics), served by local rank 0 of
every node, so every pod the PodMonitor selects answers (a pod without an endpoint would be a down
target). Each figure is served exactly once per job, so summing a run's series over its pods is
correct (`sum by (run) (rate(fsdp_tokens_total[5m]))` is the job's throughput):

    the job's figures, only from the pod of global rank 0 (rendezvous decides which one):
    fsdp_step, fsdp_total_steps, fsdp_epoch, fsdp_loss, fsdp_learning_rate, fsdp_grad_norm,
    fsdp_tokens_total (counter: this job's tokens since this launch; no _created series),
    fsdp_tokens_per_second, fsdp_tokens_per_second_per_gpu, fsdp_mfu_ratio, fsdp_step_time_seconds,
    fsdp_padding_ratio, fsdp_world_size, fsdp_run_info{model, strategy, precision},
    fsdp_progress_deadline_timestamp_seconds (when the next step is due at the latest; the hang watch's
    bound, trainer/watchdog.py; served from the start, before the first step),
    after the first checkpoint: fsdp_last_checkpoint_step (of the last complete one),
    fsdp_checkpoint_stall_seconds (how long the last save held up training: staging, or the whole save
    when synchronous), fsdp_checkpoint_write_seconds (how long the last complete save took to write)

    each node's own figures, from every pod: fsdp_peak_memory_bytes and fsdp_peak_memory_reserved_bytes
    (that node's local rank 0: allocated by tensors, reserved by the caching allocator), fsdp_node_ranks
    (ranks on that node), and where the node has EFA devices, fsdp_efa_transmit_bytes_total and
    fsdp_efa_receive_bytes_total{device, port} (the EFA driver's port counters tx_bytes and rx_bytes
    under /sys/class/infiniband/<device>/ports/<port>/hw_counters, read at each scrape; the DCGM
    exporter has no EFA figures)

The figures of a logged step come from one snapshot, so a scrape never mixes two steps.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import torch

from trainer.config import MetricsConfig


def peak_memory_bytes(device: torch.device) -> tuple[int, int]:
    """(peak allocated, peak reserved) on the GPU, or the peak resident set size twice on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return rss, rss


INFINIBAND_ENV = "FSDP_SYSFS_INFINIBAND"  # the sysfs class folder, /sys/class/infiniband unless set
EFA_COUNTERS = (("tx_bytes", "fsdp_efa_transmit_bytes", "sent"), ("rx_bytes", "fsdp_efa_receive_bytes", "received"))


def efa_counters(root: Path) -> Iterator[tuple[str, str, str, int]]:
    """(counter file, device, port, value) of every EFA port under `root` (devices whose hw_counters
    have no tx_bytes, such as other RDMA NICs, are left out)."""
    for counters in sorted(root.glob("*/ports/*/hw_counters")):
        device, port = counters.parent.parent.parent.name, counters.parent.name
        for name, _, _ in EFA_COUNTERS:
            try:
                value = int((counters / name).read_text().strip())
            except (OSError, ValueError):
                continue
            yield name, device, port, value


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def host_memory_probe() -> Callable[[], int]:
    """Start a measurement; the returned function gives the peak resident-set growth since (bytes).

    Writing 5 to /proc/self/clear_refs resets the kernel's peak (VmHWM) to the current size; where
    that is refused the lifetime peak is used, which can only overstate the growth.
    """
    before = _proc_status_kib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass
    return lambda: max(0, _proc_status_kib("VmHWM") - before) * 1024


class TrainerCollector:
    """The trainer's Prometheus series, built from the latest logged record.

    `job_wide` is true on global rank 0 only: job-wide figures are served once, so sums over pods
    are right. Every sample of a scrape comes from one immutable snapshot (replaced whole at each
    logged step), and the counter family is emitted without a `_created` sample.
    """

    # Record key -> (metric name, help). Served by global rank 0 only.
    JOB_GAUGES = {
        "step": ("fsdp_step", "Last completed optimizer step of the job"),
        "total_steps": ("fsdp_total_steps", "Optimizer steps the job will run in total"),
        "data_epoch": ("fsdp_epoch", "Data epoch of the last logged step (0-based)"),
        "loss": ("fsdp_loss", "Mean loss per trained token of the last logged step"),
        "lr": ("fsdp_learning_rate", "Learning rate of the last logged step"),
        "grad_norm": ("fsdp_grad_norm", "Global gradient norm before clipping"),
        "tokens_per_s": ("fsdp_tokens_per_second", "Non-padding tokens per second of the whole job (all ranks)"),
        "tokens_per_s_per_gpu": ("fsdp_tokens_per_second_per_gpu", "Non-padding tokens per second per rank"),
        "mfu": ("fsdp_mfu_ratio", "Model FLOPs utilisation (0-1)"),
        "step_time_s": ("fsdp_step_time_seconds", "Seconds per optimizer step"),
        "padding_fraction": ("fsdp_padding_ratio", "Padding share of the input tokens (0-1)"),
        "world_size": ("fsdp_world_size", "Number of ranks of the job"),
    }

    # Checkpoint figures (MetricsLogger.checkpoint_done) -> (metric name, help). Global rank 0 only.
    CHECKPOINT_GAUGES = {
        "step": ("fsdp_last_checkpoint_step", "Step of the last complete checkpoint"),
        "stall_s": ("fsdp_checkpoint_stall_seconds", "Seconds the last checkpoint save held up training"),
        "write_s": ("fsdp_checkpoint_write_seconds", "Seconds the last complete checkpoint took to write"),
    }

    def __init__(self, info: dict[str, str], *, job_wide: bool, node_ranks: int, infiniband: Path | None = None):
        self.info, self.job_wide, self.node_ranks = dict(info), job_wide, node_ranks
        self.infiniband = infiniband or Path(os.environ.get(INFINIBAND_ENV, "") or "/sys/class/infiniband")
        self._snapshot: tuple[dict[str, Any], int] | None = None  # (record, tokens since launch)
        self._tokens = 0
        self.deadline: float | None = None  # trainer.watchdog.Heartbeat.deadline
        self.checkpoint: dict[str, float] = {}  # CHECKPOINT_GAUGES keys; replaced whole

    def update(self, record: dict[str, Any], new_tokens: int) -> None:
        self._tokens += new_tokens
        self._snapshot = (dict(record), self._tokens)  # one assignment: scrapes see old or new, never half

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        node = GaugeMetricFamily("fsdp_node_ranks", "Ranks on this node (pod)")
        node.add_metric([], self.node_ranks)
        yield node
        yield from self._efa()
        deadline, checkpoint = self.deadline, self.checkpoint
        if self.job_wide and deadline is not None:
            yield GaugeMetricFamily(
                "fsdp_progress_deadline_timestamp_seconds",
                "Unix time by which the next step must complete, else the run counts as hung",
                value=deadline,
            )
        if self._snapshot is None:
            return
        record, tokens = self._snapshot
        yield GaugeMetricFamily(
            "fsdp_peak_memory_bytes",
            "Peak accelerator (or host) memory allocated by tensors on this node's local rank 0",
            value=record["peak_mem_gib"] * 2**30,
        )
        yield GaugeMetricFamily(
            "fsdp_peak_memory_reserved_bytes",
            "Peak accelerator memory reserved by the caching allocator on this node's local rank 0 (host: RSS)",
            value=record.get("peak_mem_reserved_gib", record["peak_mem_gib"]) * 2**30,
        )
        if not self.job_wide:
            return
        for key, (name, doc) in self.CHECKPOINT_GAUGES.items():
            if key in checkpoint:
                yield GaugeMetricFamily(name, doc, value=checkpoint[key])
        for key, (name, doc) in self.JOB_GAUGES.items():
            if key in record:
                yield GaugeMetricFamily(name, doc, value=record[key])
        yield CounterMetricFamily(
            "fsdp_tokens",
            "Non-padding tokens processed by all ranks of the job since this launch (served by one pod per job)",
            value=tokens,
        )
        yield InfoMetricFamily("fsdp_run", "Run description", value=self.info)

    def _efa(self):
        from prometheus_client.core import CounterMetricFamily

        families = {
            name: CounterMetricFamily(metric, f"Bytes {verb} by this node's EFA port", labels=["device", "port"])
            for name, metric, verb in EFA_COUNTERS
        }
        found = False
        for name, device, port, value in efa_counters(self.infiniband):
            families[name].add_metric([device, port], value)
            found = True
        if found:
            yield from families.values()


class PrometheusExporter:
    """Serves a TrainerCollector over HTTP (a private registry, nothing else in it)."""

    def __init__(self, port: int, info: dict[str, str], *, job_wide: bool, node_ranks: int):
        from prometheus_client import CollectorRegistry, start_http_server

        self.collector = TrainerCollector(info, job_wide=job_wide, node_ranks=node_ranks)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self.server, self.thread = start_http_server(port, registry=self.registry)

    def update(self, record: dict[str, Any], new_tokens: int) -> None:
        self.collector.update(record, new_tokens)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MetricsLogger:
    """Accumulates per-step figures and logs every cfg.log_interval_steps steps.

    Every rank calls it (the counts go into checkpoints); only the writer (rank 0) writes files and
    prints, and `serves` (local rank 0 of each node) exposes the Prometheus endpoint.
    Token counts stay device tensors between logged steps, so unlogged steps never wait for the GPU.
    """

    def __init__(
        self,
        cfg: MetricsConfig,
        *,
        is_writer: bool,
        serves: bool = False,
        world_size: int,
        node_ranks: int = 1,
        total_steps: int = 0,
        device: torch.device,
        seq_len: int,
        flops_per_token: float,
        peak_flops: float,
        info: dict[str, str],
    ):
        self.cfg, self.is_writer, self.world_size, self.device = cfg, is_writer, world_size, device
        self.seq_len, self.flops_per_token, self.peak_flops = seq_len, flops_per_token, peak_flops
        self.tokens = 0  # non-padding tokens so far, all ranks
        self.samples = 0  # sequences so far, all ranks
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.prometheus = None
        self._file: TextIO | None = None
        self._start_interval()
        if is_writer:
            os.makedirs(cfg.output_dir, exist_ok=True)
            self._file = open(os.path.join(cfg.output_dir, "metrics.jsonl"), "a", encoding="utf-8")
        if serves and cfg.prometheus_port:
            self.prometheus = PrometheusExporter(cfg.prometheus_port, info, job_wide=is_writer, node_ranks=node_ranks)
        self.total_steps = total_steps

    def _start_interval(self) -> None:
        self._t0 = time.perf_counter()
        self._steps = self._samples = 0
        self._real = torch.zeros((), dtype=torch.int64, device=self.device)

    def state_dict(self) -> dict[str, int]:
        """Counters carried across resumes (synchronises pending counts)."""
        return {"tokens": self.tokens + int(self._real.item()), "samples": self.samples + self._samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.tokens, self.samples = int(state["tokens"]), int(state["samples"])

    def restart_clock(self) -> None:
        """Start timing the next interval now (before the first step)."""
        self._t0 = time.perf_counter()

    def exclude(self, seconds: float) -> None:
        """Leave time spent outside training steps (checkpoint saves) out of the throughput."""
        self._t0 += seconds

    def set_deadline(self, deadline: float) -> None:
        """The hang bound's deadline after the latest heartbeat (trainer.watchdog), for the alert."""
        if self.prometheus:
            self.prometheus.collector.deadline = deadline

    def checkpoint_done(self, stall_s: float, last: Any) -> None:
        """A save just returned after holding up training `stall_s` seconds; `last` is the last complete
        save (trainer.checkpoint._Save: step, write_s) or None while none has completed."""
        if not self.prometheus:
            return
        figures = {"stall_s": stall_s}
        if last is not None:
            figures.update(step=last.step, write_s=last.write_s)
        self.prometheus.collector.checkpoint = figures  # one assignment, as the snapshot

    def write_run_info(self, info: dict[str, Any]) -> None:
        """<output_dir>/run.json: resolved config, topology, model and data facts of this launch."""
        if self.is_writer:
            with open(os.path.join(self.cfg.output_dir, "run.json"), "w", encoding="utf-8") as fh:
                json.dump(info, fh, indent=2, default=str)

    def step_done(
        self, step: int, result: Any, *, lr: float, num_samples: int, data_state: dict[str, int]
    ) -> dict[str, Any] | None:
        """Account one step (`result` is an optim.StepResult, num_samples the global sequences).

        Returns the logged record on logging steps, else None.
        """
        self._steps += 1
        self._samples += num_samples
        self._real += result.num_real_tokens
        if step % self.cfg.log_interval_steps != 0:
            return None
        loss = result.loss.item()  # synchronises with the device, so the wall time below is real
        elapsed = time.perf_counter() - self._t0
        real = int(self._real.item())
        self.tokens += real
        self.samples += self._samples
        tokens_per_s = real / elapsed
        per_gpu = tokens_per_s / self.world_size
        peak, reserved = peak_memory_bytes(self.device)
        record = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": result.grad_norm.item(),
            "tokens": self.tokens,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_gpu": per_gpu,
            "mfu": per_gpu * self.flops_per_token / self.peak_flops if self.peak_flops else 0.0,
            "step_time_s": elapsed / self._steps,
            "peak_mem_gib": peak / 2**30,
            "peak_mem_reserved_gib": reserved / 2**30,
            "padding_fraction": 1.0 - real / (self._samples * self.seq_len),
            "loss_tokens": int(result.num_loss_tokens.item()),
            "samples": self.samples,
            "data_epoch": data_state["epoch"],
            "data_position": data_state["position"],
            "restart_count": self.restart_count,
            "world_size": self.world_size,
            "time": time.time(),
        }
        self._start_interval()
        if self.prometheus:
            self.prometheus.update({**record, "total_steps": self.total_steps}, real)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
            print(
                f"step {step} loss {loss:.4f} lr {lr:.3g} tok/s/gpu {per_gpu:,.0f} mfu {record['mfu']:.1%} "
                f"{record['step_time_s']:.3f}s/step mem {record['peak_mem_gib']:.2f}GiB",
                flush=True,
            )
        return record

    def close(self) -> None:
        if self._file:
            self._file.close()
        if self.prometheus:
            self.prometheus.close()
