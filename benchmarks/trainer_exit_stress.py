"""Many short two-rank CPU runs of trainer.train (gloo) under CPU load: does any rank die by a signal?

Each iteration is two launches of the tiny config through torchrun, the shapes in which ranks were
seen to end with SIGABRT: a run with gradient accumulation over unpacked, skewed example lengths and
asynchronous checkpoints every 2 steps, then a resume of it with a changed learning rate. --load N
keeps N busy processes spinning beside them (the runs then contend for the cores, which is what
widens teardown races). Every launch's exit status and, for a failure, its output tail go to --json;
a summary line ends the output:

    python benchmarks/trainer_exit_stress.py --iterations 50 --load 2 --json stress.jsonl

--mode sigterm drives the path of a preemption instead, where a launcher was seen to abort: each
iteration is one job of two `python -m trainer.launch` nodes as in the pods (--nnodes=2, one CPU rank
each, c10d rendezvous on 127.0.0.1 served by node 0's agent, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1),
SIGTERM to one node's launcher once the first checkpoint is complete (node 0 and node 1 in turn, as a
node drain does), and every launcher must exit 143 with no 'terminate called' or other fatal line in its
output. After the signal torchrun keeps the signalled node's rendezvous handler open, so its keep-alive
daemon thread is still calling the TCPStore when the launcher leaves. --topology standalone runs one
`--standalone --nproc_per_node=2` launcher instead (the same c10d handler, store in the same process):

    python benchmarks/trainer_exit_stress.py --mode sigterm --iterations 100 --load 0 --json sigterm.jsonl
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNALLED = re.compile(r"exitcode\s*:\s*-(\d+)|Signal (\d+) \(SIG\w+\) received|Fatal Python error|terminate called")


FATAL = re.compile(r"terminate called|Fatal Python error|core dumped|Segmentation fault")
STOPPED = 128 + signal.SIGTERM


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launcher(out: Path, name: str, torchrun_args: list[str]) -> tuple[subprocess.Popen, Path]:
    """One `python -m trainer.launch` of the tiny config until step 400, a checkpoint every step."""
    (out / name).mkdir(parents=True, exist_ok=True)
    log = out / name / "launch.log"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as the generated jobs set it
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "trainer.launch",
        *torchrun_args,
        "-m",
        "trainer.train",
        "--config",
        "trainer/configs/tiny.yaml",
        f"checkpoint.dir={out}/ckpt",
        "checkpoint.interval_steps=1",
        "checkpoint.export_dir=",
        "training.max_steps=400",
        f"metrics.output_dir={out}/{name}",
    ]
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def sigterm_job(out: Path, topology: str, target: int, timeout: float) -> dict:
    """Start one job, SIGTERM launcher `target` after the first complete checkpoint, collect every status."""
    if topology == "standalone":
        nodes = [_launcher(out, "node-0", ["--standalone", "--nproc_per_node=2"])]
        target = 0
    else:
        port = _free_port()
        nodes = [
            _launcher(
                out,
                f"node-{i}",
                [
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=exit-stress",
                    f"--rdzv-conf=is_host={str(i == 0).lower()}",
                ],
            )
            for i in (0, 1)
        ]
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    record: dict = {"started": started, "topology": topology, "signalled_node": target}
    try:
        while not any((out / "ckpt").glob("step-*/COMPLETE")):
            if any(proc.poll() is not None for proc, _ in nodes):
                record["error"] = "a launcher exited before the first checkpoint"
                break
            if time.monotonic() - t0 > timeout:
                record["error"] = "no checkpoint in time"
                break
            time.sleep(0.05)
        else:
            record["checkpoint_s"] = round(time.monotonic() - t0, 1)
            os.kill(nodes[target][0].pid, signal.SIGTERM)  # what the kubelet does to the pod's first process
        for proc, _ in nodes:
            try:
                proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                record["error"] = record.get("error", "a launcher did not exit in time")
    finally:
        for proc, _ in nodes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    record["seconds"] = round(time.monotonic() - t0, 1)
    record["rcs"] = [proc.returncode for proc, _ in nodes]
    fatal = []
    for (_, log), rc in zip(nodes, record["rcs"], strict=True):
        text = log.read_text(errors="replace")
        hit = FATAL.search(text)
        fatal.append(hit.group(0) if hit else None)
        if rc != STOPPED or hit:
            record.setdefault("tails", []).append(text[-6000:])
    record["fatal"] = fatal
    record["ok"] = "error" not in record and record["rcs"] == [STOPPED] * len(nodes) and not any(fatal)
    return record


def run_sigterm(iterations: int, topology: str, json_path: str, deadline: float, timeout: float) -> dict:
    """The --mode sigterm loop: one job an iteration; a failed job does not stop the loop."""
    launches = failed = signal_deaths = fatal_lines = jobs = 0
    start = time.monotonic()
    for i in range(iterations):
        if deadline and time.monotonic() - start > deadline:
            break
        out = Path(tempfile.mkdtemp(prefix="exit-stress-"))
        try:
            record = {"iteration": i, **sigterm_job(out, topology, i % 2, timeout)}
        finally:
            shutil.rmtree(out, ignore_errors=True)
        jobs += 1
        launches += len(record["rcs"])
        failed += not record["ok"]
        signal_deaths += sum(1 for rc in record["rcs"] if rc is not None and rc < 0)
        fatal_lines += sum(1 for hit in record["fatal"] if hit)
        with open(json_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        print(json.dumps({k: v for k, v in record.items() if k != "tails"}), flush=True)
    return {
        "mode": "sigterm",
        "topology": topology,
        "jobs": jobs,
        "launches": launches,
        "failed_jobs": failed,
        "signal_deaths": signal_deaths,
        "fatal_lines": fatal_lines,
    }


@click.command()
@click.option("--iterations", default=50, show_default=True, help="Iterations of two launches each.")
@click.option("--load", default=2, show_default=True, help="Busy processes beside the runs.")
@click.option("--json", "json_path", required=True, help="Append one JSON line per launch here.")
@click.option("--deadline", default=0.0, help="Start no iteration after this many seconds (0: no limit).")
@click.option(
    "--mode",
    type=click.Choice(["resume", "sigterm"]),
    default="resume",
    show_default=True,
    help="resume: a run and its resume an iteration; sigterm: one job stopped by SIGTERM an iteration.",
)
@click.option(
    "--topology",
    type=click.Choice(["two-node", "standalone"]),
    default="two-node",
    show_default=True,
    help="--mode sigterm: two one-rank launchers on a c10d rendezvous, or one --standalone launcher of two.",
)
@click.option("--timeout", default=300.0, show_default=True, help="--mode sigterm: seconds a job may take.")
def main(iterations: int, load: int, json_path: str, deadline: float, mode: str, topology: str, timeout: float) -> None:
    """Run the launches and count the ones that failed or had a rank killed by a signal."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(load)]
    for p in spinners:
        p.start()
    if mode == "sigterm":
        try:
            summary = run_sigterm(iterations, topology, json_path, deadline, timeout)
        finally:
            for p in spinners:
                p.terminate()
        summary.update(load=load, cpus=os.cpu_count(), loadavg=[round(x, 2) for x in os.getloadavg()])
        print(json.dumps(summary), flush=True)
        sys.exit(1 if summary["failed_jobs"] else 0)
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
