"""Time the whole `generators/expand.py` process on generated matrices of 1,000 and 10,000 runs.

    python benchmarks/expand_bench.py                       # 1,000 and 10,000 runs, output under $TMPDIR
    python benchmarks/expand_bench.py --runs 1000 --repeat 7 --out-root /dev/shm

Each measurement is a fresh `python generators/expand.py MATRIX --out DIR` process (interpreter
start, imports, load, expand, plan, render, serialize, write), timed from outside:
- cold: DIR does not exist (every overlay written);
- rewrite: DIR already up to date (everything compared, nothing written);
- check: `--check` on the up-to-date DIR.
Wall time is the median (and the minimum) over --repeat runs; CPU is the child's user + system time,
which other load on the machine disturbs less than wall time. The matrix varies the learning rate so
every run has its own trainer config (no validation is shared between runs): the slow case.
Target: 1,000 runs in under 2 s on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPAND = REPO_ROOT / "generators" / "expand.py"
MODELS = ("llama2-7b", "llama2-13b")
NODES = (1, 2, 4, 8, 16)


def matrix_text(num_runs: int) -> str:
    """A valid matrix of exactly num_runs runs: models x nodes x distinct learning rates."""
    per_combo = len(MODELS) * len(NODES)
    if num_runs % per_combo:
        raise SystemExit(f"--runs must be a multiple of {per_combo}")
    # 1.0e-06, 2.0e-06, ...: written with a decimal point so YAML reads numbers, not strings.
    lrs = ", ".join(f"{(i + 1) * 1e-6:.6e}" for i in range(num_runs // per_combo))
    return f"""apiVersion: fsdp-gitops/v1
kind: ExperimentMatrix
repository: {{url: https://github.com/example-org/fsdp-gitops, branch: main}}
clusters:
  bench-p5: {{region: us-west-2, availability_zones: [us-west-2a], instance_types: [p5.48xlarge]}}
defaults:
  cluster: bench-p5
  trainer:
    data: {{path: /shared/data/samsum/train.jsonl}}
    training: {{num_epochs: 5, batch_size_per_gpu: 3}}
axes:
  model: [{", ".join(MODELS)}]
  nodes: [{", ".join(map(str, NODES))}]
  trainer.training.lr: [{lrs}]
"""


def timed(cmd: list[str]) -> tuple[float, float, int]:
    """Run cmd; return (wall seconds, child CPU seconds, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return wall, cpu, proc.returncode


def summary(samples: list[tuple[float, float, int]]) -> str:
    walls = [s[0] for s in samples]
    cpus = [s[1] for s in samples]
    return f"{statistics.median(walls):6.2f} s (min {min(walls):5.2f})  cpu {statistics.median(cpus):5.2f} s"


def describe_environment(out_root: Path) -> list[str]:
    fs = subprocess.run(["df", "-T", str(out_root)], capture_output=True, text=True, check=False).stdout.split("\n")
    fs_type = fs[1].split()[1] if len(fs) > 1 and fs[1].split() else "unknown"
    commit = (
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        or "unknown"
    )
    return [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"commit: {commit}",
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        f"python {platform.python_version()}, click {version('click')}, pyyaml {version('pyyaml')}",
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"output directory: {out_root} ({fs_type})",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=5, help="processes timed per mode (10,000 runs: at most 3)")
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="expand-bench-", dir=args.out_root))
    print("\n".join(describe_environment(work)))
    print(f"command: python {' '.join(shlex.quote(a) for a in sys.argv)}")
    print()
    print(f"{'runs':>6}  {'files':>6}  {'cold (write all)':<34}  {'rewrite (no change)':<34}  {'--check':<34}")
    try:
        for num_runs in args.runs:
            matrix = work / f"matrix-{num_runs}.yaml"
            matrix.write_text(matrix_text(num_runs))
            out = work / f"out-{num_runs}"
            base = [sys.executable, str(EXPAND), str(matrix), "--out", str(out)]
            repeat = args.repeat if num_runs <= 1000 else min(args.repeat, 3)
            cold, rewrite, check = [], [], []
            for _ in range(repeat):
                shutil.rmtree(out, ignore_errors=True)
                cold.append(timed(base))
                rewrite.append(timed(base))
                check.append(timed(base + ["--check"]))
            if any(code for *_, code in check):
                raise SystemExit("--check found differences right after a write")
            files = sum(1 for p in out.rglob("*") if p.is_file())
            print(f"{num_runs:>6}  {files:>6}  {summary(cold):<34}  {summary(rewrite):<34}  {summary(check):<34}")
            print(f"        e.g.: {shlex.join(base)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
