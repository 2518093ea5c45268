"""Resume keeps the optimizer state as configured: bf16 moments stay bf16, and the load makes no copy.

Unit tests run trainer.checkpoint in this process (one gloo rank, a small FSDP2 model, real DCP
checkpoints in tmp_path). The optimizer state the load fills must be the very tensors the optimizer
holds, so a resume allocates no second copy of the moments (with set_state_dict's load_state_dict
every bf16 moment came back as a new fp32 tensor: on Llama-2-7B a 25 GiB transient and a 25 GiB
larger steady state). The last test resumes a real 2-rank torchrun run and reads what it reported.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from trainer_support import free_port, output_overrides, run

from trainer.checkpoint import Checkpointer, HostStaging, all_tensors, verify
from trainer.config import CheckpointConfig
from trainer.optim import AdamWBf16State


@pytest.fixture(scope="module")
def one_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def model_and_step(bf16: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    fully_shard(model)
    optimizer = fresh_optimizer(model, bf16)
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def fresh_optimizer(model: torch.nn.Module, bf16: bool) -> torch.optim.Optimizer:
    if bf16:
        return AdamWBf16State(model.parameters(), lr=1e-2)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)


def moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [s[k].to_local() for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]


@pytest.mark.parametrize("mode", ["async_with_pinned_mem", "disabled"])
def test_bf16_moments_are_loaded_in_place_and_stay_bf16(one_rank, tmp_path, mode):
    model, optimizer = model_and_step(bf16=True)
    saved = [m.clone() for m in moments(optimizer)]
    cfg = CheckpointConfig(dir=str(tmp_path), async_mode=mode, writer_threads=2)
    checkpointer = Checkpointer(cfg, {})
    path = checkpointer.save(1, model, optimizer, {"data": {}, "scheduler": {}, "metrics": {}})
    checkpointer.wait()

    resumed = fresh_optimizer(model, bf16=True)
    get_state_dict(model, resumed)  # creates the (empty) state the load is to fill
    before = [(m.data_ptr(), m.dtype) for m in moments(resumed)]
    checkpointer.load(path, model, resumed)
    checkpointer.close()
    after = moments(resumed)
    # The same storage, in the configured dtype, holding the saved values: no copy was made.
    assert [(m.data_ptr(), m.dtype) for m in after] == before
    assert all(m.dtype == torch.bfloat16 for m in after)
    assert all(torch.equal(a, b) for a, b in zip(after, saved, strict=True))
    assert checkpointer.last_load is not None and checkpointer.last_load["in_place"]
    assert checkpointer.last_load["dtypes"]["exp_avg"] == ["torch.bfloat16"]


def test_moments_take_the_configured_dtype_whatever_the_checkpoint_holds(one_rank, tmp_path):
    model, optimizer = model_and_step(bf16=False)  # fp32 moments saved
    checkpointer = Checkpointer(CheckpointConfig(dir=str(tmp_path)), {})
    path = checkpointer.save(1, model, optimizer, {"data": {}, "scheduler": {}, "metrics": {}})
    checkpointer.wait()
    resumed = fresh_optimizer(model, bf16=True)
    checkpointer.load(path, model, resumed)
    checkpointer.close()
    assert all(m.dtype == torch.bfloat16 for m in moments(resumed))
    assert all(torch.equal(a, b.to(torch.bfloat16)) for a, b in zip(moments(resumed), moments(optimizer), strict=True))


def test_load_state_dict_of_the_bf16_optimizer_keeps_bf16(one_rank):
    model, optimizer = model_and_step(bf16=True)
    other = fresh_optimizer(model, bf16=True)
    other.load_state_dict(optimizer.state_dict())  # torch casts to the parameters' fp32; the hook undoes it
    assert all(m.dtype == torch.bfloat16 for m in moments(other))


def test_host_staging_reuses_its_buffers_and_copies_the_values(one_rank):
    model, optimizer = model_and_step(bf16=True)
    staging = HostStaging(pinned=True)  # ordinary memory on CPU, so fresh buffers each time
    model_sd, optim_sd = get_state_dict(model, optimizer)
    staged = staging.stage({"model": model_sd, "optim": optim_sd})
    first = next(iter(staged["model"].values()))
    live = next(iter(model_sd.values()))
    assert first.to_local().data_ptr() != live.to_local().data_ptr()
    assert torch.equal(first.to_local(), live.to_local()) and first.placements == live.placements
    local = [t.to_local() if hasattr(t, "to_local") else t for t in all_tensors({"model": model_sd, "optim": optim_sd})]
    assert staging.bytes == sum(t.numel() * t.element_size() for t in local)
    staging.close()


@pytest.mark.slow
def test_a_resumed_run_keeps_bf16_moments_and_says_so(tmp_path):
    common = [*output_overrides(tmp_path), "training.bf16_optimizer_state=true"]
    run([*common, "training.max_steps=2"])
    log = run([*common, "training.max_steps=4"])
    assert "resumed from" in log
    info = json.loads((tmp_path / "metrics" / "run.json").read_text())
    load = info["resume_load"]
    assert load["in_place"] and load["dtypes"]["exp_avg"] == load["dtypes"]["exp_avg_sq"] == ["torch.bfloat16"]


def test_a_metadata_without_the_data_of_an_item_is_not_loadable(one_rank, tmp_path):
    # What DCP leaves when one of its extra writer threads fails: .metadata lists an item no shard holds.
    model, optimizer = model_and_step(bf16=True)
    checkpointer = Checkpointer(CheckpointConfig(dir=str(tmp_path), writer_threads=3), {})
    path = checkpointer.save(1, model, optimizer, {"data": {}, "scheduler": {}, "metrics": {}})
    checkpointer.close()
    assert verify(path) is None
    metadata_file = Path(path) / ".metadata"
    metadata = pickle.loads(metadata_file.read_bytes())
    dropped = next(key for key in metadata.storage_data if "exp_avg" in key.fqn)
    del metadata.storage_data[dropped]
    metadata_file.write_bytes(pickle.dumps(metadata))
    complete = Path(path) / "COMPLETE"  # as if written so: the sizes it lists match
    record = json.loads(complete.read_text())
    record["files"][".metadata"] = metadata_file.stat().st_size
    complete.write_text(json.dumps(record))
    assert verify(path) == f"1 saved items have no data in any shard (first: {dropped.fqn})"
