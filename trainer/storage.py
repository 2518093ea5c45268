"""Whether `checkpoint.dir` can hold the checkpoints a run keeps: refused at start, in one line.

Space needed: rotation (trainer/checkpoint.py) keeps the newest keep_last complete checkpoints and
writes the next one beside them; the oldest goes only once the new one is complete, so that a
process killed mid-write still has a whole checkpoint to resume from. So the volume holds at most
keep_last + 1 checkpoints at once, and that is what the run needs:

    space needed = (keep_last + 1) x checkpoint size x (1 + MARGIN)

Checkpoints already in the directory count as room: rotation removes stale `.tmp-*` directories and
complete checkpoints beyond the newest keep_last before a save writes, and replaces the kept ones one
by one, so the room is the volume's free space plus what the `step-*` and `.tmp-*` directories
there take on disk. Where those kept ones are larger than the new checkpoint (saved with fp32
moments, now bf16), the peak is the first save instead: the kept ones plus one new one. Other
content (`.corrupt-*` directories set aside by resume, anything else) stays and takes space.

Checkpoint size (`checkpoint_bytes`): the parameters and AdamW moments as the memory model counts
them (trainer.memory.state_bytes_per_param: 12 bytes a parameter with fp32 moments, 8 with bf16
ones; the parameters are saved in fp32 whatever the compute precision), plus what torch's
distributed checkpoint adds around them, measured with torch 2.11 on the tiny model (2 ranks, 8
writer threads: 2.01 MB written for 1.68 MB of state): each saved item (a rank's chunk of a
parameter or moment, one step counter per parameter, the param groups' entries) carries a
torch.save header of about 1.6 kB and a .metadata entry of about 0.3 kB (ITEM_BYTES); each file
(a shard per rank and writer thread, a RNG file per rank, four small ones) takes up to a page more on
a file system that allocates pages (FILE_BYTES); each rank's RNG file 10.5 kB (RNG_BYTES allows 16 kB). For
Llama-2-7B that is 80.9 GB with fp32 moments and 53.9 GB with bf16 ones (the estimate for 8 ranks is
15 MB above the bare state); for the tiny model 2.16 MB.

MARGIN, 2% of what the checkpoints need: what the estimate does not count, the file system's own
metadata (directories, inodes, allocation units larger than a page) and small files other writers
put on the same volume. The Hugging Face export at the end (checkpoint.export_dir, 2 or 4 bytes a
parameter) is written after the last save's rotation, so on the same volume it fits in the room the
checkpoint being written had.

Free space is measured on the file system that holds checkpoint.dir (its nearest existing ancestor
when it does not exist yet), as the space an unprivileged writer may use. Rank 0 measures; every rank
raises the same ConfigError, so the run ends with one line and exit status 2 before any model memory
is allocated.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from trainer.catalog import Architecture
from trainer.config import CheckpointConfig, ConfigError, TrainingConfig
from trainer.memory import state_bytes_per_param

ITEM_BYTES = 2000
FILE_BYTES = 4096
RNG_BYTES = 16 * 1024
# Saved items besides the tensors: the optimizer's param groups' entries (26 for the tiny model).
OTHER_ITEMS = 32
MARGIN = 0.02


def num_tensors(arch: Architecture) -> int:
    """Parameter tensors of a Llama model: per decoder layer q, k, v, o, gate, up, down and two norms;
    the input embedding, the final norm and the lm_head."""
    return 9 * arch.num_layers + 3


def checkpoint_bytes(arch: Architecture, bf16_optimizer_state: bool, world_size: int, writer_threads: int) -> int:
    """Bytes one checkpoint takes on disk (the module docstring says what is counted)."""
    state = arch.num_params * state_bytes_per_param(bf16_optimizer_state)
    # Each rank saves its chunk of every parameter and both moments; the step counters once.
    items = num_tensors(arch) * (3 * world_size + 1) + OTHER_ITEMS
    files = world_size * (writer_threads + 1) + 4
    return state + items * ITEM_BYTES + files * FILE_BYTES + world_size * RNG_BYTES


def size_text(num_bytes: float) -> str:
    """80.9 GB, 2.16 MB, 512 kB (decimal units, as the checkpoint lines of the trainer print them)."""
    if num_bytes >= 1e9:
        return f"{num_bytes / 1e9:.1f} GB"
    if num_bytes >= 1e6:
        return f"{num_bytes / 1e6:.2f} MB"
    return f"{num_bytes / 1e3:.0f} kB"


def _existing_ancestor(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def _on_disk(path: str) -> int:
    """Bytes the files under `path` occupy (allocated blocks: what deleting them gives back)."""
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
    return total


@dataclass(frozen=True)
class Space:
    """What the file system of checkpoint.dir offers: bytes free, and what the checkpoints there take."""

    free: int
    complete: tuple[int, ...] = ()  # each complete checkpoint (step-*), oldest first
    partial: int = 0  # the `.tmp-*` directories (removed before the next save writes)


def measure(directory: str) -> Space:
    """The Space of `directory` (which need not exist yet), as it is on disk now."""
    # torch only where the trainer measures: the generator's plan (generators/plan/footprint.py) sizes
    # checkpoints with checkpoint_bytes and runs with click and PyYAML alone.
    from trainer.checkpoint import TMP_PREFIX, complete_checkpoints

    free = shutil.disk_usage(_existing_ancestor(directory)).free
    if not os.path.isdir(directory):
        return Space(free)
    partial = sum(
        _on_disk(os.path.join(directory, name)) for name in os.listdir(directory) if name.startswith(TMP_PREFIX)
    )
    return Space(free, tuple(_on_disk(path) for _, path in complete_checkpoints(directory)), partial)


def space_problem(cfg: CheckpointConfig, size: int, bf16_optimizer_state: bool, space: Space) -> str | None:
    """Why `cfg.dir` with `space` cannot hold the checkpoints of `size` bytes the run keeps (the message
    of the one line, without its key), or None when it can."""
    keep = cfg.keep_last
    kept = sum(space.complete[-keep:])
    replaced = sum(space.complete) + space.partial
    needed = (keep + 1) * size
    # Kept checkpoints larger than the new one (saved with fp32 moments, say) make the first save the peak.
    limit = max(needed, kept + size) * (1 + MARGIN)
    if space.free + replaced >= limit:
        return None
    if kept + size > needed:
        n = len(space.complete[-keep:])
        what = (
            f"the {n} checkpoint{'s' if n > 1 else ''} kept there ({size_text(kept)}, keep_last {keep}) and "
            f"the one being written ({size_text(size)}) need {size_text(kept + size)}"
        )
    else:
        what = (
            f"{keep + 1} checkpoints of {size_text(size)} each (keep_last {keep}, plus the one being written) "
            f"need {size_text(needed)}"
        )
    have = f"{size_text(space.free)} free"
    if replaced:
        have += f" and {size_text(replaced)} in the checkpoints there that rotation replaces"
    fixes = ["free space", "use a larger volume"]
    if keep > 1:
        fixes.append(f"lower checkpoint.keep_last (now {keep})")
    if not bf16_optimizer_state:
        fixes.append("set training.bf16_optimizer_state: true (a third smaller)")
    fix = f"{', '.join(fixes[:-1])} or {fixes[-1]}"
    return f"{cfg.dir}: {what}, {size_text(limit)} with the {MARGIN:.0%} margin, {have}; {fix}"


def check_checkpoint_space(
    cfg: CheckpointConfig, training: TrainingConfig, arch: Architecture, world_size: int
) -> None:
    """Raise ConfigError on every rank when checkpoint.dir is too small (collective once checkpoints
    are enabled: rank 0 measures, the others take its answer over the CPU group)."""
    if not cfg.dir:
        return
    import torch
    import torch.distributed as dist

    answer: list[str | None] = [None]
    if dist.get_rank() == 0:
        size = checkpoint_bytes(arch, training.bf16_optimizer_state, world_size, cfg.writer_threads)
        answer[0] = space_problem(cfg, size, training.bf16_optimizer_state, measure(cfg.dir))
    dist.broadcast_object_list(answer, src=0, device=torch.device("cpu"))
    if answer[0] is not None:
        # Leave the group together before the error ends the processes, as a finished run does: a
        # rank that exits with it alive while a peer still holds it can abort (seen under load: exit -6).
        dist.barrier()
        dist.destroy_process_group()
        raise ConfigError("checkpoint.dir", answer[0])
