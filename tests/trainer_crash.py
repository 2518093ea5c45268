"""The trainer with a bug in its training code; run under torchrun (through trainer.launch) by the tests.

    python -m trainer.launch --standalone --nproc_per_node=2 tests/trainer_crash.py --config CONFIG ...

Runs `python -m trainer.train` with the same arguments, except that the optimizer step numbered
FSDP_TEST_CRASH_AT_STEP (counted from 1 in each process) raises, after the process group, the
sharded model and the data are up: a failure of the trainer itself, as opposed to a peer that went
away. It raises on the global rank FSDP_TEST_CRASH_RANK, or on every rank this torchrun starts
without it; the other ranks then fail in their next collective.
"""

from __future__ import annotations

import os
import sys

from trainer import optim, train


def main() -> int:
    crash_at = int(os.environ["FSDP_TEST_CRASH_AT_STEP"])
    crashes = os.environ.get("FSDP_TEST_CRASH_RANK", os.environ["RANK"]) == os.environ["RANK"]
    step = optim.train_step
    calls = 0

    def failing_step(*args, **kwargs):
        nonlocal calls
        calls += 1
        if crashes and calls == crash_at:
            raise RuntimeError(f"injected bug in the training step (step {calls} of this process)")
        return step(*args, **kwargs)

    optim.train_step = failing_step  # train.train imports it from trainer.optim when it starts
    return train.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
