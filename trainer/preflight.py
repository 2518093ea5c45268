"""Pre-flight check of a node group's collective network: all-reduce bus bandwidth and NCCL's transport.

    torchrun --nnodes=N --nproc_per_node=G -m trainer.preflight [--size-mib 256] [--iters 20]
        [--expect-transport {efa,nvlink,socket,any}] [--min-busbw-gbs FLOAT] [--json PATH]

Every rank all-reduces a buffer of --size-mib MiB (fp32) --iters times after a warm-up; rank 0 prints
ONE JSON line and the process exits 0 when the check passed, CHECK_FAILED (3) when it ran and failed
(any other failure, a crash or a rendezvous that never formed, is not a verdict and exits otherwise;
the pre-flight Job retries those and fails at once on 3, base/preflight/job.yaml):

    {"world_size", "size_mib", "algbw_gbs", "busbw_gbs", "transport", "expected", "min_busbw_gbs",
     "passed", "reason"}

algbw = bytes / seconds per all-reduce; busbw = algbw x 2(n-1)/n (the nccl-tests convention: the
ring's bytes on the busiest link, comparable across world sizes); GB/s are 1e9 bytes per second.

The transport is what NCCL chose, read from its own log: the program runs NCCL with NCCL_DEBUG=INFO
and NCCL_DEBUG_FILE pointing into a temporary directory, then parses rank 0's file
(`detect_transport`): efa (aws-ofi-nccl, "NET/OFI" / Libfabric), ib, socket (the TCP fallback that
makes a multi-node job several times slower), nvlink (GPU peer-to-peer within a node), shm, unknown.
On CPU (no GPU) it runs over gloo and reports transport "gloo", so the program itself can be tested.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys
import tempfile
import time

TRANSPORTS = ("efa", "ib", "socket", "nvlink", "shm", "unknown")
CHECK_FAILED = 3
EXPECTABLE = ("efa", "nvlink", "socket", "any")

# "Channel 00/0 : 0[0] -> 1[1] [send] via NET/OFI/0/GDRDMA", "... via P2P/CUMEM/read", "... via SHM/direct/direct"
_VIA = re.compile(r"\bvia (NET/[A-Za-z]+|P2P|SHM)\b")
# "NCCL INFO Using network AWS Libfabric" / "Using network Socket" / "Using network IB"
_USING = re.compile(r"Using network (.+)$", re.MULTILINE)


def _net_name(name: str) -> str:
    low = name.lower()
    if "ofi" in low or "libfabric" in low or "efa" in low or low.startswith("aws"):
        return "efa"
    if low.startswith("ib"):
        return "ib"
    if "socket" in low:
        return "socket"
    return "unknown"


def detect_transport(nccl_log: str) -> str:
    """The transport NCCL used between ranks, from an NCCL_DEBUG=INFO log.

    The channel connection lines decide: any connection through the network plugin names the
    inter-node transport (that is what limits a multi-node job), else peer-to-peer means NVLink (or
    PCIe peer access) inside one node, else shared memory. Without channel lines, the "Using network"
    line names the network plugin that was loaded. Returns one of TRANSPORTS.
    """
    vias = set(_VIA.findall(nccl_log))
    nets = sorted(v.split("/", 1)[1] for v in vias if v.startswith("NET/"))
    if nets:
        kinds = {_net_name(n) for n in nets}
        for kind in ("socket", "ib", "efa"):  # the slowest one in use is the one that matters
            if kind in kinds:
                return kind
        return "unknown"
    if "P2P" in vias:
        return "nvlink"
    if "SHM" in vias:
        return "shm"
    using = _USING.findall(nccl_log)
    if using:
        return _net_name(using[-1])
    if "NET/OFI" in nccl_log or "Libfabric" in nccl_log or "aws-ofi-nccl" in nccl_log:
        return "efa"
    return "unknown"


def judge(transport: str, expected: str, busbw_gbs: float, min_busbw_gbs: float) -> tuple[bool, str]:
    """Whether the measurement passes: the transport is the expected one (or any) and the bus
    bandwidth reaches the minimum. Returns (passed, reason); the reason names every failed check."""
    problems = []
    if expected != "any" and transport != expected:
        hint = (
            " (NCCL fell back to TCP sockets: check the EFA device plugin, the pod's "
            "vpc.amazonaws.com/efa resources and FI_PROVIDER)"
            if transport == "socket" and expected == "efa"
            else ""
        )
        problems.append(f"transport {transport}, expected {expected}{hint}")
    if busbw_gbs < min_busbw_gbs:
        problems.append(f"bus bandwidth {busbw_gbs:.1f} GB/s below the minimum {min_busbw_gbs:.1f} GB/s")
    if problems:
        return False, "; ".join(problems)
    return True, f"transport {transport}, bus bandwidth {busbw_gbs:.1f} GB/s"


def bus_bandwidth(algbw_gbs: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw x 2(n-1)/n."""
    return algbw_gbs * 2 * (world_size - 1) / world_size


def parse_args(argv):
    """The preflight's command-line arguments from `argv` (sys.argv[1:] when None), their ranges checked."""
    parser = argparse.ArgumentParser(
        prog="torchrun ... -m trainer.preflight", description="Measure all-reduce bus bandwidth and NCCL's transport."
    )
    parser.add_argument("--size-mib", type=float, default=256.0, help="all-reduce buffer size (MiB)")
    parser.add_argument("--iters", type=int, default=20, help="timed all-reduces")
    parser.add_argument("--warmup", type=int, default=5, help="untimed all-reduces first")
    parser.add_argument("--expect-transport", choices=EXPECTABLE, default="any")
    parser.add_argument("--min-busbw-gbs", type=float, default=0.0)
    parser.add_argument("--json", dest="json_path", default="", help="also write the JSON line here")
    parser.add_argument(
        "--keep-nccl-log",
        default="",
        metavar="PATH",
        help="copy rank 0's NCCL log here (for a bug report or new test data)",
    )
    args = parser.parse_args(argv)
    if args.size_mib <= 0 or args.iters < 1 or args.warmup < 0 or args.min_busbw_gbs < 0:
        parser.error("--size-mib must be positive, --iters at least 1, --warmup and --min-busbw-gbs not negative")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    log_dir = tempfile.mkdtemp(prefix="nccl-preflight-")
    if cuda:
        # Must be set before NCCL initialises; %p keeps the ranks' files apart.
        os.environ["NCCL_DEBUG"] = "INFO"
        os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(log_dir, "nccl.%h.%p.log")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    numel = int(args.size_mib * 2**20) // 4
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(buf)
    sync()
    seconds = (time.perf_counter() - t0) / args.iters
    # The slowest rank's time is the collective's time.
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    seconds = float(t.item())
    algbw = numel * 4 / seconds / 1e9
    busbw = bus_bandwidth(algbw, world)
    dist.barrier()
    dist.destroy_process_group()  # flushes and closes NCCL's log
    if cuda:
        text = ""
        for path in glob.glob(os.path.join(log_dir, f"nccl.*.{os.getpid()}.log")):
            with open(path, encoding="utf-8", errors="replace") as fh:
                text += fh.read()
        transport = detect_transport(text)
        if args.keep_nccl_log and rank == 0:
            with open(args.keep_nccl_log, "w", encoding="utf-8") as fh:
                fh.write(text)
        shutil.rmtree(log_dir, ignore_errors=True)
    else:
        transport = "gloo"
    passed, reason = judge(transport, args.expect_transport, busbw, args.min_busbw_gbs)
    result = {
        "world_size": world,
        "size_mib": args.size_mib,
        "algbw_gbs": round(algbw, 3),
        "busbw_gbs": round(busbw, 3),
        "transport": transport,
        "expected": args.expect_transport,
        "min_busbw_gbs": args.min_busbw_gbs,
        "passed": passed,
        "reason": reason,
    }
    if rank == 0:
        line = json.dumps(result, sort_keys=False)
        print(line, flush=True)
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as fh:
                fh.write(line + "\n")
    return 0 if passed else CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
