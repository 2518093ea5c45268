"""Many short two-rank CPU runs of trainer.train (gloo) under CPU load: does any rank die by a signal?

Each iteration is two launches of the tiny config through torchrun, the shapes in which ranks were
seen to end with SIGABRT: a run with gradient accumulation over unpacked, skewed example lengths and
asynchronous checkpoints every 2 steps, then a resume of it with a changed learning rate. --load N
keeps N busy processes spinning beside them (the runs then contend for the cores, which is what
widens teardown races). Every launch's exit status and, for a failure, its output tail go to --json;
a summary line ends the output:

    python benchmarks/trainer_exit_stress.py --iterations 50 --load 2 --json stress.jsonl
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import click

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNALLED = re.compile(r"exitcode\s*:\s*-(\d+)|Signal (\d+) \(SIG\w+\) received|Fatal Python error|terminate called")


def _spin() -> None:
    while True:
        pass


def launch(out: str, overrides: list[str]) -> tuple[int, str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "trainer.train",
        "--config",
        "trainer/configs/tiny.yaml",
        f"checkpoint.dir={out}/ckpt",
        f"metrics.output_dir={out}/metrics",
        "checkpoint.export_dir=",
        *overrides,
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


@click.command()
@click.option("--iterations", default=50, show_default=True, help="Iterations of two launches each.")
@click.option("--load", default=2, show_default=True, help="Busy processes beside the runs.")
@click.option("--json", "json_path", required=True, help="Append one JSON line per launch here.")
@click.option("--deadline", default=0.0, help="Start no iteration after this many seconds (0: no limit).")
def main(iterations: int, load: int, json_path: str, deadline: float) -> None:
    """Run the launches and count the ones that failed or had a rank killed by a signal."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(load)]
    for p in spinners:
        p.start()
    failed = signalled = launches = 0
    try:
        start = time.monotonic()
        for i in range(iterations):
            if deadline and time.monotonic() - start > deadline:
                break
            out = tempfile.mkdtemp(prefix="exit-stress-")
            try:
                first = [
                    "training.max_steps=6",
                    "training.grad_accum_steps=2",
                    "data.packing=false",
                    "checkpoint.interval_steps=2",
                ]
                second = [
                    "training.max_steps=8",
                    "training.grad_accum_steps=2",
                    "data.packing=false",
                    "training.lr=1e-3",
                ]
                for name, overrides in (("accum-async-ckpt", first), ("resume-changed-lr", second)):
                    rc, text, seconds = launch(out, overrides)
                    launches += 1
                    hit = SIGNALLED.search(text)
                    record = {"iteration": i, "launch": name, "rc": rc, "seconds": round(seconds, 1)}
                    if rc != 0 or hit:
                        failed += rc != 0
                        signalled += bool(hit)
                        record["signal_match"] = hit.group(0) if hit else None
                        record["tail"] = text[-6000:]
                    with open(json_path, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps(record) + "\n")
                    print(json.dumps({k: v for k, v in record.items() if k != "tail"}), flush=True)
                    if rc != 0:
                        break
            finally:
                shutil.rmtree(out, ignore_errors=True)
    finally:
        for p in spinners:
            p.terminate()
    print(
        json.dumps(
            {"launches": launches, "failed": failed, "signalled": signalled, "load": load, "cpus": os.cpu_count()}
        ),
        flush=True,
    )
    sys.exit(1 if failed or signalled else 0)


if __name__ == "__main__":
    main()
