"""The start check of checkpoint.dir's space (trainer/storage.py): the size estimate held to the memory
model and the one line to its figures. The real trainer on a volume that is too small or just big
enough (a size-limited tmpfs, as root): tests/cluster/test_trainer_storage_tmpfs.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.catalog import MODELS
from trainer.config import CheckpointConfig, TrainingConfig
from trainer.memory import state_bytes_per_param
from trainer.storage import MARGIN, Space, check_checkpoint_space, checkpoint_bytes, measure, space_problem

GB = 10**9

# --- the size of a checkpoint -------------------------------------------------------------------------


def test_checkpoint_size_is_the_memory_models_state_and_a_little_metadata():
    arch = MODELS["llama2-7b"]
    fp32 = checkpoint_bytes(arch, False, world_size=8, writer_threads=8)
    bf16 = checkpoint_bytes(arch, True, world_size=8, writer_threads=8)
    # The measured checkpoints of Llama-2-7B: 80.9 GB with fp32 moments, 53.9 GB with bf16 ones.
    assert round(fp32 / GB, 1) == 80.9 and round(bf16 / GB, 1) == 53.9
    # Both moments' bytes as the memory model counts them, the rest the same for both.
    assert fp32 - bf16 == arch.num_params * (state_bytes_per_param(False) - state_bytes_per_param(True))
    assert 0 < fp32 - arch.num_params * state_bytes_per_param(False) < fp32 / 1000


def test_more_ranks_and_writer_threads_add_their_files_and_chunks():
    arch = MODELS["tiny"]
    one = checkpoint_bytes(arch, False, world_size=1, writer_threads=8)
    assert checkpoint_bytes(arch, False, world_size=2, writer_threads=8) > one
    assert checkpoint_bytes(arch, False, world_size=1, writer_threads=16) > one


# --- the one line ---------------------------------------------------------------------------------------


def cfg(keep_last: int, directory: str = "/x") -> CheckpointConfig:
    return CheckpointConfig(dir=directory, keep_last=keep_last)


def test_refusal_names_the_folder_the_sizes_the_free_space_and_the_fixes():
    size = checkpoint_bytes(MODELS["llama2-7b"], False, world_size=8, writer_threads=8)
    line = space_problem(cfg(1), size, False, Space(free=64 * GB))
    assert line == (
        "/x: 2 checkpoints of 80.9 GB each (keep_last 1, plus the one being written) need 161.8 GB, "
        "165.0 GB with the 2% margin, 64.0 GB free; free space, use a larger volume or set "
        "training.bf16_optimizer_state: true (a third smaller)"
    )


def test_fixes_offered_are_the_ones_that_would_help():
    line = space_problem(cfg(3), 10 * GB, True, Space(free=GB))
    assert line is not None
    assert "4 checkpoints of 10.0 GB each (keep_last 3, plus the one being written) need 40.0 GB" in line
    assert line.endswith("; free space, use a larger volume or lower checkpoint.keep_last (now 3)")
    assert "bf16_optimizer_state" not in line


def test_the_margin_is_needed_on_top_of_keep_last_plus_one_checkpoints():
    size = 10 * GB
    assert space_problem(cfg(2), size, False, Space(free=3 * size)) is not None
    assert space_problem(cfg(2), size, False, Space(free=int(3 * size * (1 + MARGIN)))) is None


def test_checkpoints_already_there_count_as_room_since_rotation_replaces_them():
    size = 10 * GB
    # keep_last 1 resumed beside its checkpoint: 1.5 checkpoints free are enough with the kept one.
    assert space_problem(cfg(1), size, False, Space(free=15 * GB, complete=(size,))) is None
    # So are ones beyond keep_last and a partial one: removed before the next save writes.
    assert space_problem(cfg(1), size, False, Space(free=5 * GB, complete=(size, size), partial=6 * GB)) is None
    line = space_problem(cfg(1), size, False, Space(free=5 * GB, complete=(size,), partial=GB))
    assert line is not None and "5.0 GB free and 11.0 GB in the checkpoints there that rotation replaces" in line


def test_larger_checkpoints_kept_there_make_the_first_save_the_peak():
    # Saved with fp32 moments (12 GB), resumed with bf16 ones (8 GB), keep_last 2: the first save
    # writes beside both old ones.
    old, new = 12 * GB, 8 * GB
    line = space_problem(cfg(2), new, True, Space(free=8 * GB, complete=(old, old)))
    assert line is not None
    assert "the 2 checkpoints kept there (24.0 GB, keep_last 2) and the one being written (8.0 GB) need 32.0 GB" in line
    # 9 GB free and the 24 GB they take: the 32 GB and the margin fit, though three new ones need only 24.
    assert space_problem(cfg(2), new, True, Space(free=9 * GB, complete=(old, old))) is None


# --- measuring a real directory ---------------------------------------------------------------------------


def test_measure_counts_complete_and_partial_checkpoints_and_nothing_else(tmp_path):
    def folder(name: str, complete: bool) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "__0_0.distcp").write_bytes(b"x" * 100_000)
        if complete:
            (path / "COMPLETE").write_text("{}")
        return path

    folder("step-00000002", True)
    folder("step-00000004", True)
    folder("step-00000006", False)  # no COMPLETE: never loaded, never removed by rotation
    folder(".tmp-step-00000008", False)
    folder(".corrupt-step-00000001", True)  # set aside by resume, kept
    space = measure(str(tmp_path))
    assert len(space.complete) == 2
    assert all(100_000 <= size < 120_000 for size in space.complete)
    assert 100_000 <= space.partial < 110_000
    assert space.free > 0


def test_a_directory_not_made_yet_is_measured_on_its_nearest_existing_folder(tmp_path):
    space = measure(str(tmp_path / "a" / "b" / "ckpt"))
    assert space.complete == () and space.partial == 0
    assert abs(space.free - os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize) < 100 * 2**20


def test_no_checkpoint_dir_is_not_checked():
    # Checkpoints disabled: returns before any collective (no process group exists here).
    check_checkpoint_space(CheckpointConfig(dir=""), TrainingConfig(), MODELS["tiny"], 2)
