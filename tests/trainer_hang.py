"""The trainer with one rank that stops making progress; run under torchrun (through trainer.launch) by the tests.

    python -m trainer.launch --standalone --nproc_per_node=2 tests/trainer_hang.py --config CONFIG ...

Runs `python -m trainer.train` with the same arguments, except that on the global rank
FSDP_TEST_HANG_RANK the optimizer step numbered FSDP_TEST_HANG_AT_STEP (counted from 1 in each
process) sleeps instead of training: that rank never joins the step's collectives, and every other
rank blocks in the first of them, as behind a wedged peer.
"""

from __future__ import annotations

import os
import sys
import time

from trainer import optim, train


def main() -> int:
    hang_at = int(os.environ["FSDP_TEST_HANG_AT_STEP"])
    hangs = os.environ["FSDP_TEST_HANG_RANK"] == os.environ["RANK"]
    step = optim.train_step
    calls = 0

    def hanging_step(*args, **kwargs):
        nonlocal calls
        calls += 1
        while hangs and calls == hang_at:
            time.sleep(3600)
        return step(*args, **kwargs)

    optim.train_step = hanging_step  # train.train imports it from trainer.optim when it starts
    return train.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
