"""Logits of the sharded model restored from a trainer checkpoint; run under torchrun by the tests.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/trainer_checkpoint_logits.py \
        CHECKPOINT_DIR OUT_FILE

Builds the model exactly as the trainer does (the checkpoint's own resolved config.yaml), restores
the model state with the trainer's Checkpointer and writes rank 0's logits for a fixed byte prompt.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from trainer import model as modeling
from trainer.checkpoint import Checkpointer
from trainer.config import load_config
from trainer.parallelize import build_mesh, init_distributed, parallelize
from trainer.train import DistEnv

PROMPT = b"Summarize this dialog:\nAnna: Lunch at noon?\nBen: Yes.\n---\nSummary:\n"


def main(checkpoint: str, out_file: str) -> None:
    env = DistEnv.from_environ()
    cfg = load_config(f"{checkpoint}/config.yaml")
    device = init_distributed(env.local_rank)
    model = modeling.build_model(cfg.model)
    parallelize(model, cfg.parallelism, build_mesh(cfg.parallelism, env.world_size, env.local_world_size, device.type))
    modeling.materialize(model, device)
    Checkpointer(cfg.checkpoint, {}).load(checkpoint, model, None)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([list(PROMPT)], device=device))
    if env.rank == 0:
        torch.save({"input_ids": torch.tensor([list(PROMPT)]), "logits": logits.cpu()}, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
