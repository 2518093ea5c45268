"""Sharded checkpoints with torch.distributed.checkpoint (DCP), atomic and resumable.

Layout of one checkpoint (the directory must be shared by all ranks, e.g. a ReadWriteMany volume):

    <dir>/step-00000020/
        .metadata, __<rank>_0.distcp   DCP shards: model and optimizer state (DTensors, per rank)
        rng-rank00000.pt ...           each rank's torch CPU/CUDA and python RNG states
        trainer_state.json             step, data sampler position, scheduler, token and sample counts
        config.yaml                    the resolved training config
        COMPLETE                       written last

Saving writes everything into `.tmp-step-00000020`, waits for every rank, writes COMPLETE and renames
the directory, so a `step-*` directory is always whole; a crash leaves at most a `.tmp-*` directory,
which is never loaded and is removed by the next save of that step. Only the newest `keep_last`
complete checkpoints are kept. Resuming picks the newest complete one (rank 0 decides, all follow).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import yaml
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict, set_model_state_dict,
                                                     set_state_dict)

from trainer.config import CheckpointConfig

STEP_DIR = re.compile(r"^step-(\d{8})$")
COMPLETE = "COMPLETE"


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


class Checkpointer:
    """Saves and restores the full training state; every method is collective (all ranks call it)."""

    def __init__(self, cfg: CheckpointConfig, resolved_config: dict[str, Any]):
        self.cfg = cfg
        self.resolved_config = resolved_config
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.dir)

    def due(self, step: int, last_step: int) -> bool:
        if not self.enabled:
            return False
        return step == last_step or (self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0)

    def latest(self) -> str | None:
        """Path of the newest complete checkpoint to resume from, or None (same answer on all ranks)."""
        if not self.enabled or not self.cfg.resume:
            return None
        choice = [None]
        if self.rank == 0:
            found = complete_checkpoints(self.cfg.dir)
            choice[0] = found[-1][1] if found else None
        dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             train_state: dict[str, Any]) -> str:
        final = os.path.join(self.cfg.dir, step_dir_name(step))
        tmp = os.path.join(self.cfg.dir, "." + "tmp-" + step_dir_name(step))
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        torch.save(rng_state(), os.path.join(tmp, f"rng-rank{self.rank:05d}.pt"))
        dist.barrier()
        if self.rank == 0:
            _fsync_write(os.path.join(tmp, "trainer_state.json"),
                         json.dumps({**train_state, "step": step, "world_size": self.world_size}, indent=2))
            _fsync_write(os.path.join(tmp, "config.yaml"), yaml.safe_dump(self.resolved_config, sort_keys=False))
            _fsync_write(os.path.join(tmp, COMPLETE),
                         json.dumps({"step": step, "world_size": self.world_size, "time": time.time()}))
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            for _, old in complete_checkpoints(self.cfg.dir)[:-self.cfg.keep_last]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def load(self, path: str, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        """Restore model, optimizer (None: model only, e.g. for evaluation) and RNG in place.

        Returns trainer_state.json's content.
        """
        if optimizer is None:
            state = {"model": get_model_state_dict(model)}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(model, state["model"])
        else:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {"model": model_sd, "optim": optim_sd}
            dcp.load(state, checkpoint_id=path)
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng_file = os.path.join(path, f"rng-rank{self.rank:05d}.pt")
        if os.path.isfile(rng_file):
            # A different world size has no state for this rank; the run then keeps its seeded RNG.
            set_rng_state(torch.load(rng_file, weights_only=True))
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as fh:
            return json.load(fh)
