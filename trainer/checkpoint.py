"""Sharded checkpoints with torch.distributed.checkpoint (DCP), atomic and resumable.

Layout of one checkpoint (the directory must be shared by all ranks, e.g. a ReadWriteMany volume):

    <dir>/step-00000020/
        .metadata, __<rank>_0.distcp   DCP shards: model and optimizer state (DTensors, per rank)
        rng-rank00000.pt ...           each rank's torch CPU/CUDA and python RNG states
        trainer_state.json             step, data sampler position, scheduler, token and sample counts
        config.yaml                    the resolved training config
        COMPLETE                       written last

Saving writes everything into `.tmp-step-00000020`, waits for every rank, writes COMPLETE (with the
size of every file) and renames the directory, so a `step-*` directory is always whole; a crash leaves
at most a `.tmp-*` directory, which is never loaded and is removed by the next save of that step. Only
the newest `keep_last` complete checkpoints are kept. A save that fails on any rank (a full disk, an
I/O error) fails on all of them together: the partial directory is removed, the older checkpoints stay
as they were, and the run stops with one line and the restartable exit status WRITE_FAILED (202).

Rotation runs in the space of keep_last + 1 checkpoints: keep_last complete ones and the one being
written. Before a save starts writing, rank 0 removes every `.tmp-*` directory (no write of this run
is in flight then: the previous one was waited for) and every complete checkpoint beyond the newest
keep_last (left by an earlier run with a larger keep_last, or by a write that completed without
its rotation); after the save is complete, the oldest beyond keep_last goes. So keep_last: 1 on a
volume that holds two checkpoints saves for as long as the run lasts.

Resuming picks the newest complete checkpoint that passes `verify` (rank 0 decides, all follow): a
newest one with a missing or truncated file (a shard, .metadata, COMPLETE) is set aside as
`.corrupt-step-*` with one line, and the next older one is used. The saved config is compared with
the current one (`compare_configs`): changes to what the weights or the data order mean are refused
in one line, the rest is said in one line and applied.

Asynchronous saves (checkpoint.async_mode, default "async_with_pinned_mem"): training stops only while
each rank copies its model and optimizer state into host memory (page-locked buffers allocated at the
first save and reused, registered page by page so they take the state's size and no more); a
background thread then writes the shards, agrees with the other ranks, writes COMPLETE and renames,
all over a process group of its own (gloo), so its collectives never interleave with training's. A
save in flight is waited for before the next save starts, before a SIGTERM exit and before a normal
exit (`wait`, `close`). A background write that fails is seen at the next step boundary: `poll`,
called after every step, asks every rank (one all-reduce of a CPU tensor over gloo) whether its
write ended with an error, and all ranks then stop together with the same one line and WRITE_FAILED,
so a failure costs at most the steps since the last complete checkpoint and one more, never a run that
trains to its end and has nothing to resume from.
`keep_last` removes older checkpoints only after the newer one is complete, so a process killed
during a background save resumes from the previous complete checkpoint. "disabled" writes while
training waits, as before. Either way each rank writes its files with `writer_threads` threads.

Preemption: `StopRequest` turns SIGTERM into a flag that all ranks agree on after each step, so the
loop saves a checkpoint and every rank exits with 143 (see trainer/launch.py for why that status).

With checkpoint.s3_uri, rank 0 hands each checkpoint to trainer.s3_export once it is complete (after
its rotation), which copies and verifies it in the background; `close` waits for the final one.

Tests only: FSDP_CHECKPOINT_TEST_HOOK=<dir> makes each rank append its save events to
<dir>/events-rank<R>.jsonl, and a background write whose step has a file <dir>/hold-step-<N> stops
after writing its shards (before COMPLETE), creates <dir>/held-step-<N>-rank-<R> and waits until the
hold file is removed: a window, opened and closed by the test, in which a save is in flight.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from trainer.config import CheckpointConfig, ConfigError
from trainer.s3_export import S3Export

STEP_DIR = re.compile(r"^step-(\d{8})$")
COMPLETE = "COMPLETE"
CORRUPT_PREFIX = ".corrupt-"
TMP_PREFIX = ".tmp-"
TEST_HOOK_ENV = "FSDP_CHECKPOINT_TEST_HOOK"
# Exit status of a run stopped by a checkpoint write that failed (docs/trainer.md, exit statuses):
# >= 128, so the Training Operator re-creates the pod, and above 200 (lost peer) and 201 (hang), so it
# reads as neither a signal nor those. The restarted run resumes from the last complete checkpoint.
WRITE_FAILED = 202

# Resuming with one of these changed is refused: the weights were trained for that model, sequence
# length and data, and the saved data position counts rows of that dataset in that seeded order.
REFUSED_CHANGES = (
    "model.name",
    "model.path",
    "data.path",
    "data.format",
    "data.seq_len",
    "data.packing",
    "data.num_synthetic_samples",
    "training.seed",
)
# Where outputs go and how often: not part of the training state, never worth a line.
QUIET_SECTIONS = ("checkpoint.", "metrics.")


class WriteFailed(ConfigError):
    """A checkpoint that could not be written: one line, and the run stops with WRITE_FAILED."""

    status = WRITE_FAILED


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = STEP_DIR.match(name)
        path = os.path.join(directory, name)
        if match and os.path.isfile(os.path.join(path, COMPLETE)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fsync_write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _one_line(err: BaseException) -> str:
    """A failure as one line: DCP's CheckpointException carries every rank's traceback; take the cause."""
    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f" ({err.filename})" if err.filename else "")
    return " ".join(f"{type(err).__name__}: {err}".split())


def verify(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (a missing or truncated file), or None when whole.

    Checks sizes, not contents: every file COMPLETE lists has its recorded size, and every item of
    the DCP .metadata lies inside its shard file. Cheap even for terabyte checkpoints.
    """
    try:
        with open(os.path.join(path, COMPLETE), encoding="utf-8") as fh:
            complete = json.load(fh)
        for name, size in complete.get("files", {}).items():
            actual = os.path.getsize(os.path.join(path, name)) if os.path.isfile(os.path.join(path, name)) else None
            if actual != size:
                return f"{name} has {'no file' if actual is None else f'{actual} bytes'}, {size} bytes were written"
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as fh:
            json.load(fh)
        metadata = FileSystemReader(path).read_metadata()
    except FileNotFoundError as err:
        return f"{os.path.basename(err.filename or '')} is missing"
    except Exception as err:  # noqa: BLE001 - any unreadable file means "not loadable", said in one line
        return f"unreadable ({_one_line(err)})"
    missing = _unwritten_items(metadata)
    if missing:
        return f"{len(missing)} saved items have no data in any shard (first: {missing[0]})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"shard {name} is missing"
        if os.path.getsize(file) < end:
            return f"shard {name} is truncated ({os.path.getsize(file)} of {end} bytes)"
    return None


def _unwritten_items(metadata: Metadata) -> list[str]:
    """Items the DCP .metadata declares but whose data no shard holds (a writer thread that failed)."""
    stored = metadata.storage_data or {}
    missing = []
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            keys = [MetadataIndex(fqn, chunk.offsets) for chunk in item.chunks]
        else:
            keys = [MetadataIndex(fqn)]
        missing += [fqn for key in keys if key not in stored]
    return missing


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def compare_configs(
    saved: Mapping[str, Any], current: Mapping[str, Any], saved_world_size: int, world_size: int
) -> tuple[list[str], list[str]]:
    """(refused, accepted) changes between a checkpoint's resolved config and the current one.

    Each entry reads `key old -> new`. A changed world size is accepted: DCP reshards the model and
    optimizer state, and the sampler's position counts global rows, not per-rank ones.
    """
    old, new = _flatten(saved), _flatten(current)
    refused: list[str] = []
    accepted: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key.startswith(QUIET_SECTIONS) or key == "model.init_seed" or old.get(key) == new.get(key):
            continue
        change = f"{key} {old.get(key, '(unset)')} -> {new.get(key, '(unset)')}"
        (refused if key in REFUSED_CHANGES else accepted).append(change)
    if saved_world_size != world_size:
        accepted.append(f"world size {saved_world_size} -> {world_size} (resharded)")
    return refused, accepted


def load_scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any], lr: float) -> None:
    """Restore the schedule's position, with the current config's peak lr and shape.

    The saved state holds the old peak (base_lrs) and the lr of the next step, and the optimizer's
    param groups hold it too: without this a changed training.lr (or warmup or max_steps) would be
    said and then silently ignored. Unchanged settings give the very same numbers (the product below
    is the one LambdaLR computes).
    """
    scheduler.load_state_dict(state)
    scheduler.base_lrs = [lr] * len(scheduler.optimizer.param_groups)
    for group, fn in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


class StopRequest:
    """SIGTERM (preemption, eviction, node drain) as a flag that every rank sees after the same step.

    torchrun forwards SIGTERM to its workers, but on several nodes only some ranks may get it, so
    `requested` is a collective: an all-reduce of a CPU tensor, which the process group runs on gloo
    (trainer.parallelize.init_distributed), so it never waits for the GPU.
    """

    def __init__(self) -> None:
        self.received = False
        self._hook = _TestHook(dist.get_rank() if dist.is_initialized() else 0)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True
        self._hook.event("sigterm", 0)

    def requested(self) -> bool:
        flag = torch.tensor([int(self.received)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _libcudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded, called through ctypes, which lets go of the GIL during the call."""
    global _CUDART
    if _CUDART is None:
        try:
            with open("/proc/self/maps", encoding="utf-8") as fh:
                path = next((line.split()[-1] for line in fh if "libcudart.so" in line), "")
            _CUDART = ctypes.CDLL(path) if path else False
        except OSError:
            _CUDART = False
    return _CUDART if isinstance(_CUDART, ctypes.CDLL) else None


_CUDART: ctypes.CDLL | bool | None = None


def _host_register(ptr: int, nbytes: int) -> int:
    """cudaHostRegister(ptr, nbytes, portable); torch's own binding holds the GIL while the pages are
    faulted in and locked (seconds per GiB on a fresh VM), which would stop the training thread too."""
    lib = _libcudart()
    if lib is None:
        return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 1))
    return int(lib.cudaHostRegister(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes), ctypes.c_uint(1)))


class HostStaging:
    """A copy of a state dict in host memory that a background thread can write while training goes on.

    `pinned` (CUDA only): the buffers are allocated once, registered with CUDA page by page
    (cudaHostRegister: torch's pinned allocator would round each tensor up to a power of two, a third
    more for Llama's MLP weights) and reused by every later save, so a save costs one device-to-host
    copy at page-locked speed. Otherwise fresh ordinary buffers each time, freed after the write.
    DTensors keep their sharding spec around a host-side local tensor, which is all DCP needs.
    """

    def __init__(self, pinned: bool):
        self.pinned = pinned and torch.cuda.is_available()
        self._cache: dict[str, Any] | None = None
        self._registered: list[torch.Tensor] = []
        self._preparing: threading.Thread | None = None
        self._prepared: dict[str, Any] | None = None
        self._prepare_error: BaseException | None = None
        self.bytes = 0  # host memory of one staged copy

    def prepare(self, state: dict[str, Any]) -> None:
        """Allocate and register the page-locked buffers for `state`'s layout in a background thread.

        Only shapes, dtypes and shardings are read, never the data, so training goes on meanwhile;
        the first save then costs a copy like every later one instead of also the allocation
        (measured on one H200 for Llama-2-7B: 23 s with bf16 moments, 48 s with fp32 ones).
        """
        if not self.pinned or self._cache is not None or self._preparing is not None:
            return

        device = torch.cuda.current_device()

        def run() -> None:
            try:
                torch.cuda.set_device(device)  # a new thread's current device is 0
                self._prepared = self._empty_like(state)
            except BaseException as err:  # noqa: BLE001 - raised by the save that needs the buffers
                self._prepare_error = err

        self._preparing = threading.Thread(target=run, name="checkpoint-staging", daemon=True)
        self._preparing.start()

    @property
    def preparing(self) -> bool:
        return self._preparing is not None and self._preparing.is_alive()

    def _take_prepared(self) -> None:
        if self._preparing is None:
            return
        self._preparing.join()
        self._preparing = None
        error, self._prepare_error = self._prepare_error, None
        if error is not None:
            raise RuntimeError(f"allocating the host buffers for checkpoints failed: {_one_line(error)}")
        self._cache, self._prepared = self._prepared, None

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype)
        self.bytes += host.numel() * host.element_size()
        if self.pinned and host.numel():
            # Fault the pages in first, outside the driver: cudaHostRegister holds a lock that stops the
            # training thread's CUDA calls, for seconds per GiB if it has to bring the pages in itself.
            host.zero_()
            rc = _host_register(host.data_ptr(), host.numel() * host.element_size())
            if rc != 0:
                raise RuntimeError(f"cudaHostRegister of {host.numel() * host.element_size()} bytes failed ({rc})")
            self._registered.append(host)
        return host

    def _empty_like(self, obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: self._empty_like(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._empty_like(v) for v in obj)
        if isinstance(obj, DTensor):
            return DTensor(self._host(obj._local_tensor), obj._spec, requires_grad=False)
        if isinstance(obj, torch.Tensor):
            return self._host(obj)
        return None  # plain values are taken from the live state at each save

    def _copy(self, obj: Any, host: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: self._copy(v, host[k]) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, h) for v, h in zip(obj, host, strict=True))
        if isinstance(obj, DTensor):
            host._local_tensor.copy_(obj._local_tensor, non_blocking=self.pinned)
            return host
        if isinstance(obj, torch.Tensor):
            host.copy_(obj, non_blocking=self.pinned)
            return host
        return obj

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """The host copy of `state` (same structure); returns once the copy is complete."""
        self._take_prepared()
        if self._cache is None or not self.pinned:
            self.bytes = 0
            self._cache = self._empty_like(state)
        staged = self._copy(state, self._cache)
        if self.pinned:
            torch.cuda.synchronize()
        if not self.pinned:
            self._cache = None
        return staged

    def close(self) -> None:
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = self._prepared = None
        for host in self._registered:
            torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
        self._registered, self._cache = [], None


class _TestHook:
    """Events and an in-flight window for the tests (FSDP_CHECKPOINT_TEST_HOOK, see the module docstring)."""

    def __init__(self, rank: int):
        self.dir = os.environ.get(TEST_HOOK_ENV, "")
        self.rank = rank

    def event(self, name: str, step: int, **extra: Any) -> None:
        if self.dir:
            with open(os.path.join(self.dir, f"events-rank{self.rank}.jsonl"), "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"event": name, "step": step, "time": time.time(), **extra}) + "\n")

    def hold(self, step: int) -> None:
        hold = os.path.join(self.dir, f"hold-step-{step}") if self.dir else ""
        if hold and os.path.exists(hold):
            self.event("held", step)
            with open(os.path.join(self.dir, f"held-step-{step}-rank-{self.rank}"), "w", encoding="utf-8"):
                pass
            while os.path.exists(hold):
                time.sleep(0.02)


class _WriterThreadErrors:
    """Failures of DCP's extra writer threads (FileSystemWriter with thread_count > 1).

    Those threads let an exception escape: Python prints its traceback, and DCP goes on without the
    results of that thread's files, so the save could end with a .metadata that lacks those items.
    While installed, such failures are kept here (the save then fails with one line) and not printed.
    """

    def __init__(self) -> None:
        self.errors: list[BaseException] = []
        self._previous = threading.excepthook
        threading.excepthook = self._hook

    def _hook(self, args: Any) -> None:
        if args.thread is not None and "_write_files_from_queue" in args.thread.name and args.exc_value:
            self.errors.append(args.exc_value)
            return
        self._previous(args)

    def close(self) -> None:
        if threading.excepthook == self._hook:
            threading.excepthook = self._previous


@dataclass
class _Save:
    """One save on its way to disk; the figures are filled in as it goes."""

    step: int
    tmp: str
    final: str
    state: dict[str, Any] | None
    rng: dict[str, Any]
    trainer_state: str
    config: str
    blocking_s: float = 0.0
    write_s: float = 0.0
    bytes: int = 0
    error: str | None = None
    crash: BaseException | None = field(default=None, repr=False)


class Checkpointer:
    """Saves and restores the full training state; every method is collective (all ranks call it)."""

    def __init__(self, cfg: CheckpointConfig, resolved_config: dict[str, Any]):
        self.cfg = cfg
        self.resolved_config = resolved_config
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._rejected: set[str] = set()  # checkpoints found unloadable (rank 0), even if not set aside
        # The writes' own process group (collective to create: every rank builds a Checkpointer). A
        # background write runs DCP's plan exchange and the completion barriers on it; on the default
        # group they could interleave with the training step's collectives in another order on each rank.
        self._pg = dist.new_group(backend="gloo") if self.enabled else None
        self._staging = HostStaging(pinned=cfg.async_mode == "async_with_pinned_mem")
        self._thread: threading.Thread | None = None
        self._pending: _Save | None = None
        self._hook = _TestHook(self.rank)
        self._writer_errors = _WriterThreadErrors()
        self.last: _Save | None = None  # the last save waited for (figures for logs and benchmarks)
        self.last_load: dict[str, Any] | None = None  # the last load: path, seconds, in place, state dtypes
        self._last_step = 0  # the run's last step (from `due`): its checkpoint is the final one
        self._export = (
            S3Export(cfg.s3_uri, cfg.prune_after_export, self._hook.event, self._hook.dir)
            if self.enabled and cfg.s3_uri and self.rank == 0
            else None
        )

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.dir)

    def due(self, step: int, last_step: int) -> bool:
        self._last_step = last_step
        if not self.enabled:
            return False
        return step == last_step or (self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0)

    def _agree(self, error: str | None, group: dist.ProcessGroup | None = None) -> str | None:
        """The first rank's error, on every rank (collective), so all ranks fail or succeed together."""
        errors: list[str | None] = [None] * self.world_size
        dist.all_gather_object(errors, error, group=group)
        return next((e for e in errors if e), None)

    def _newest(self) -> tuple[str | None, list[str]]:
        """(newest loadable checkpoint, lines saying which newer ones were set aside); rank 0 only."""
        notes: list[str] = []
        for _, path in reversed(complete_checkpoints(self.cfg.dir)):
            if path in self._rejected:
                continue
            problem = verify(path)
            if problem is None:
                return path, notes
            notes.append(self._set_aside(path, problem))
        return None, notes

    def _set_aside(self, path: str, problem: str) -> str:
        """Move an unloadable checkpoint out of the way (kept for inspection); returns the line saying so."""
        self._rejected.add(path)
        aside = os.path.join(os.path.dirname(path), CORRUPT_PREFIX + os.path.basename(path))
        try:
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(path, aside)
            where = f"set aside as {aside}"
        except OSError as err:
            where = f"left in place ({_one_line(err)})"
        return f"warning: checkpoint {path} cannot be loaded: {problem}; {where}"

    def _refuse_earlier_checkpoints(self) -> None:
        """A fresh start (checkpoint.resume=false) in a folder holding complete checkpoints is refused on
        every rank: this run's checkpoints would be numbered below the earlier ones, and rotation (oldest
        step first) would remove each of them as soon as it completed, leaving nothing of this run."""
        found: list[Any] = [[]]
        if self.rank == 0:
            try:
                found = [[os.path.basename(path) for _, path in complete_checkpoints(self.cfg.dir)]]
            except OSError:
                found = [[]]  # an unreadable folder fails at the first save, with its own line
        if dist.is_initialized():
            dist.broadcast_object_list(found, src=0)
        names = found[0]
        if names:
            raise ConfigError(
                "checkpoint.resume",
                f"is false, but checkpoint.dir {self.cfg.dir} holds {len(names)} checkpoint(s) of an earlier run "
                f"(newest {names[-1]}), among which this run's would be rotated away as the oldest; "
                "choose a new checkpoint.dir (or empty this one) to start afresh, or set checkpoint.resume: true "
                "to continue from them",
            )

    def resume(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, say: Any = print
    ) -> tuple[str, dict[str, Any]] | None:
        """Load the newest loadable checkpoint: (its path, trainer_state.json), or None to start afresh.

        Falls back to older checkpoints, one line each; refuses (ConfigError) a checkpoint saved with a
        configuration whose weights or data order the current one cannot continue.
        """
        if not self.enabled:
            return None
        if not self.cfg.resume:
            self._refuse_earlier_checkpoints()
            return None
        while True:
            choice: list[Any] = [None, [], None, None]
            if self.rank == 0:
                try:
                    path, notes = self._newest()
                    choice = [path, notes, self._config_changes(path) if path else None, None]
                except OSError as err:  # e.g. an unreadable directory: every rank must hear of it, not wait
                    choice[3] = _one_line(err)
            dist.broadcast_object_list(choice, src=0)
            path, notes, changes, error = choice
            if error:
                raise ConfigError("checkpoint.dir", f"cannot read the checkpoints in {self.cfg.dir}: {error}")
            for note in notes:
                say(note)
            if path is None:
                if notes:
                    say(f"warning: no loadable checkpoint left in {self.cfg.dir}; starting from step 0")
                return None
            refused, accepted = changes
            if refused:
                raise ConfigError(
                    refused[0].split()[0],
                    f"differs from checkpoint {path} ({'; '.join(refused)}); "
                    "keep the saved value, or start afresh with a new checkpoint.dir",
                )
            try:
                state = self.load(path, model, optimizer)
            except CheckpointException as err:  # raised on every rank together by DCP
                if self.rank == 0:
                    say(self._set_aside(path, _one_line(err)))
                dist.barrier()
                continue
            if accepted:
                say(
                    f"resume: {os.path.basename(path)} was saved with another configuration, continuing with "
                    f"the new values: {'; '.join(accepted)}"
                )
            return path, state

    def _config_changes(self, path: str) -> tuple[list[str], list[str]]:
        with open(os.path.join(path, COMPLETE), encoding="utf-8") as fh:
            saved_world = int(json.load(fh).get("world_size", self.world_size))
        try:
            with open(os.path.join(path, "config.yaml"), encoding="utf-8") as fh:
                saved = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError) as err:
            saved = err
        if not isinstance(saved, dict):
            # The weights and optimizer state are whole (verified); only the record of the config is not.
            return [], [
                f"its config.yaml is unreadable, so nothing was compared ({_one_line(saved)})"
                if isinstance(saved, BaseException)
                else "its config.yaml is empty, so nothing was compared"
            ]
        return compare_configs(saved, self.resolved_config, saved_world, self.world_size)

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def poll(self) -> None:
        """After every step: raise WriteFailed on every rank once any rank's background write failed.

        Collective (all ranks call it after the same step). A write's ranks agree on its outcome among
        themselves before it ends (`_write`), but each rank's thread ends at its own moment, so the
        ranks agree here on whether any has ended with an error; a finished write that succeeded is
        left for `wait` to collect at the next save.
        """
        if not self.enabled or self.cfg.async_mode == "disabled":
            return
        job, thread = self._pending, self._thread
        done = job is not None and thread is not None and not thread.is_alive()
        failed = done and job is not None and (job.error or job.crash) is not None
        flag = torch.tensor([int(failed)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            self.wait()  # every rank's write failed together; this raises its line

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Start allocating the host buffers of async_with_pinned_mem saves in the background.

        Call once the optimizer state exists (after the first step, or after a resume); a no-op
        otherwise, with the other modes, and on CPU.
        """
        if self.enabled and self._staging.pinned and optimizer.state:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            self._staging.prepare({"model": model_sd, "optim": optim_sd})

    def save(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_state: dict[str, Any]
    ) -> str:
        """Save the state after `step`; returns the checkpoint's path (complete once `wait` returns).

        Waits for the previous save first. With async_mode "disabled" the checkpoint is complete on
        return; otherwise only the copy to host memory happened and a background thread writes it.
        """
        t0 = time.perf_counter()
        self.wait()
        self._hook.event("stage", step)
        final = os.path.join(self.cfg.dir, step_dir_name(step))
        tmp = os.path.join(self.cfg.dir, TMP_PREFIX + step_dir_name(step))
        error = None
        if self.rank == 0:
            try:
                self._make_room()
                os.makedirs(tmp)
            except OSError as err:
                error = _one_line(err)
        error = self._agree(error)
        if error is not None:
            raise self._failure(final, tmp, self._explain(error))
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        job = _Save(
            step=step,
            tmp=tmp,
            final=final,
            state=state,
            rng=rng_state(),
            trainer_state=json.dumps({**train_state, "step": step, "world_size": self.world_size}, indent=2),
            config=yaml.safe_dump(self.resolved_config, sort_keys=False),
        )
        self._pending = job
        if self.cfg.async_mode == "disabled":
            self._write(job)
            job.blocking_s = time.perf_counter() - t0
            self.wait()
            return final
        try:
            job.state = self._staging.stage(state)
        except RuntimeError as err:  # e.g. host memory exhausted: every rank stops with the same line
            job.error = _one_line(err)
        error = self._agree(job.error)
        if error is not None:
            self._pending = None
            raise self._failure(final, tmp, error)
        job.bytes = self._staging.bytes
        job.blocking_s = time.perf_counter() - t0
        self._hook.event("staged", step, seconds=job.blocking_s)
        self._thread = threading.Thread(target=self._write, args=(job,), name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        return final

    def _make_room(self) -> None:
        """Rank 0, before a save writes: leave at most keep_last complete checkpoints and no partial one
        (the module docstring: rotation in the space of keep_last + 1)."""
        if os.path.isdir(self.cfg.dir):
            for name in sorted(os.listdir(self.cfg.dir)):
                if name.startswith(TMP_PREFIX):
                    shutil.rmtree(os.path.join(self.cfg.dir, name), ignore_errors=True)
                    self._hook.event("removed", 0, path=name)
        for _, old in complete_checkpoints(self.cfg.dir)[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
            self._hook.event("removed", 0, path=os.path.basename(old))

    def wait(self) -> _Save | None:
        """Wait for the save in flight, if any; its figures, or ConfigError (every rank) if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        job, self._pending = self._pending, None
        if job is None:
            return None
        self.last = job
        if job.crash is not None:
            raise job.crash
        if job.error is not None:
            raise self._failure(job.final, job.tmp, job.error)
        return job

    def close(self) -> None:
        """Wait for the save in flight and release the host buffers and the writes' process group."""
        try:
            self.wait()
            self._wait_for_export()
        finally:
            self._staging.close()
            self._writer_errors.close()
            if self._pg is not None:
                dist.destroy_process_group(self._pg)
                self._pg = None

    def _wait_for_export(self) -> None:
        """Rank 0 finishes the final checkpoint's S3 export (if one was submitted) while the others wait
        in short all-reduces over the writes' gloo group, so no collective's timeout runs out meanwhile."""
        if self._pg is None or not self.cfg.s3_uri:
            return
        while True:
            busy = self._export is not None and self._export.final_submitted and not self._export.done(5.0)
            flag = torch.tensor([int(busy)], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._pg)
            if not flag.item():
                return

    def _write(self, job: _Save) -> None:
        """Write `job` to its temporary directory and make it complete (collective over the writes' group).

        Runs in the background thread (or in the caller with async_mode "disabled"); never raises:
        the outcome is left in `job` for `wait`.
        """
        try:
            t0 = time.perf_counter()
            error = None
            self._writer_errors.errors.clear()
            try:
                writer = FileSystemWriter(job.tmp, thread_count=self.cfg.writer_threads)
                dcp.save(job.state, storage_writer=writer, process_group=self._pg)
                if self._writer_errors.errors:
                    raise self._writer_errors.errors[0]
                torch.save(job.rng, os.path.join(job.tmp, f"rng-rank{self.rank:05d}.pt"))
            except (CheckpointException, OSError, RuntimeError) as err:
                error = _one_line(err)
            job.state = None  # the staged copy is no longer needed (unpinned buffers are freed here)
            self._hook.event("written", job.step)
            self._hook.hold(job.step)
            error = self._agree(error, self._pg)
            if error is None and self.rank == 0:
                try:
                    missing = _unwritten_items(FileSystemReader(job.tmp).read_metadata())
                    if missing:
                        raise OSError(f"{len(missing)} items were not written (first: {missing[0]})")
                    _fsync_write(os.path.join(job.tmp, "trainer_state.json"), job.trainer_state)
                    _fsync_write(os.path.join(job.tmp, "config.yaml"), job.config)
                    files = {name: os.path.getsize(os.path.join(job.tmp, name)) for name in sorted(os.listdir(job.tmp))}
                    job.bytes = sum(files.values())
                    _fsync_write(
                        os.path.join(job.tmp, COMPLETE),
                        json.dumps(
                            {"step": job.step, "world_size": self.world_size, "time": time.time(), "files": files}
                        ),
                    )
                    shutil.rmtree(job.final, ignore_errors=True)
                    os.rename(job.tmp, job.final)
                except OSError as err:
                    error = _one_line(err)
            error = self._agree(error, self._pg)
            if error is not None:
                job.error = self._explain(error)
                if self.rank == 0:
                    shutil.rmtree(job.tmp, ignore_errors=True)
            else:
                self._hook.event("complete", job.step)
                if self.rank == 0:
                    # Only now that a newer checkpoint is complete may the oldest go.
                    for _, old in complete_checkpoints(self.cfg.dir)[: -self.cfg.keep_last]:
                        shutil.rmtree(old, ignore_errors=True)
                        self._hook.event("removed", job.step, path=os.path.basename(old))
                    if self._export is not None:
                        self._export.submit(job.step, job.final, final=job.step == self._last_step)
            dist.barrier(group=self._pg)
            job.write_s = time.perf_counter() - t0
        except BaseException as err:  # noqa: BLE001 - handed to the training thread by wait()
            job.crash = err

    def _explain(self, error: str) -> str:
        """A full volume surfaces as whatever write hit it first (an OSError, or torch.save's RuntimeError
        without errno): say what it is, measured before the partial files go."""
        try:
            usage = shutil.disk_usage(self.cfg.dir)
        except OSError:
            return error
        if usage.free < max(64 * 2**20, usage.total // 100):
            return f"No space left on device ({usage.free / 2**20:.1f} of {usage.total / 2**20:.1f} MiB free)"
        return error

    def _failure(self, final: str, tmp: str, error: str) -> WriteFailed:
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        found = complete_checkpoints(self.cfg.dir)
        kept = f"{found[-1][1]} is intact, a restart resumes from it" if found else "no earlier checkpoint exists"
        return WriteFailed(
            "checkpoint.dir",
            f"writing checkpoint {final} failed: {error}; {kept}; stopping with exit status {WRITE_FAILED} "
            "(restartable); if the volume is full, free space on it or point checkpoint.dir at a larger one",
        )

    def load(self, path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        """Restore model, optimizer (None: model only, e.g. for evaluation) and RNG in place.

        DCP reads into the tensors it is given, and get_state_dict hands out the parameters and the
        optimizer's own state tensors, so the load fills them where they are: the optimizer state
        keeps the dtype this run configured (bf16 moments stay bf16 whatever the checkpoint holds),
        and no second copy of it is made (set_state_dict's load_state_dict would cast every moment
        to the parameters' dtype in new tensors). Only where a tensor was not filled in place (a
        layout DCP had to rebuild) does it fall back to set_state_dict. Returns trainer_state.json's content.
        """
        t0 = time.perf_counter()
        in_place = True
        state: dict[str, Any]
        if optimizer is None:
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(model, state["model"])
        else:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            live = {id(t) for per_param in optimizer.state.values() for t in per_param.values()}
            live |= {id(p) for p in model.parameters()}
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=path)
            loaded = [t for t in all_tensors(state["optim"].get("state", {}))]
            if not all(id(t) in live for t in loaded):
                in_place = False
                set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
            elif not all(id(t) in live for t in all_tensors(state["model"])):
                set_model_state_dict(model, state["model"])
        rng_file = os.path.join(path, f"rng-rank{self.rank:05d}.pt")
        if os.path.isfile(rng_file):
            # A different world size has no state for this rank; the run then keeps its seeded RNG.
            set_rng_state(torch.load(rng_file, weights_only=True))
        dtypes: dict[str, set[str]] = {}
        for per_param in optimizer.state.values() if optimizer else ():
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    dtypes.setdefault(key, set()).add(str(value.dtype))
        self.last_load = {
            "path": path,
            "seconds": time.perf_counter() - t0,
            "in_place": in_place,
            "dtypes": {key: sorted(found) for key, found in sorted(dtypes.items())},
        }
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as fh:
            return json.load(fh)


def all_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested state dict."""
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in all_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in all_tensors(v)]
    return [obj] if isinstance(obj, torch.Tensor) else []
