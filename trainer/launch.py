"""torchrun, made to survive a late rendezvous host and to report preemption and a lost peer as restartable exits.

    python -m trainer.launch <torchrun arguments>     # exactly the arguments torchrun takes

1. Wait for the rendezvous endpoint. In a PyTorchJob every pod starts torchrun with
   `--rdzv-endpoint=<job>-worker-0:29400`; the name resolves only once worker 0's pod exists, and the
   operator adds no wait for Worker-only jobs. torchrun alone gives up after about 155 s, the pod exits
   1 and `restartPolicy: ExitCode` fails the whole job, although a worker 0 minutes late (image pull,
   node arrival) is normal. So this waits until the endpoint's host resolves and, for the c10d backend
   on a node that does not serve the store itself, until its port accepts connections: up to
   FSDP_RDZV_WAIT_S seconds (default 900), with a line when it starts waiting and once a minute.
   After that it exits 1 with one line: a worker 0 that never comes should fail the job, not hold GPUs.
2. Run torchrun (torch.distributed.run, the program behind the `torchrun` command) in this process,
   with the same arguments.
3. Exit with a status the Training Operator restarts after a preemption or a lost node. On SIGTERM
   torchrun forwards the signal to the trainer processes (which save a checkpoint and exit 143, see
   trainer/train.py) and then itself exits 1 with a traceback; under `restartPolicy: ExitCode` 1 is a
   permanent failure. So SIGTERM (or any signal torchrun stops on) ends this process with 128 + the
   signal number, and workers that all exited 143 (a preemption seen on another node) end it with 143.
   Workers that all exited 2 (bad input, said in one line by the trainer) end it with 2, without
   torchrun's report; likewise 3, the verdict of a pre-flight check that ran and failed (VERDICTS).
   A signal after every worker of this node finished (torchrun waiting in its exit barrier for the
   other nodes) ends it with 0: the run is done, and a re-created pod would wait for a rendezvous that
   no node joins.
   The operator restarts exactly the codes >= 128: in kubeflow/training-operator's
   release-1.9 line (v1.9.0 up to the branch head), pkg/util/train/train_util.go `IsRetryableExitCode`
   is `exitCode >= 128`, and pkg/controller.v1/common/pod.go deletes and re-creates a failed pod of an
   ExitCode replica when it holds, else fails the job. That is why torchrun runs in this process
   instead of being exec'ed.
4. A lost peer ends this process with LOST_PEER (200), a restart that resumes from the last checkpoint.
   With the c10d rendezvous the store lives in worker 0's torchrun (this process, on that pod). When
   worker 0's pod or node goes away, torchrun on every other node fails on the store: in its monitor
   loop (every --monitor-interval), in the rendezvous it starts to restart its workers, or, with no
   restart left, after its workers failed because their collectives broke (a connection closed or
   reset by the peer, a NCCL watchdog abort). It exits 1 in each case, which would fail the job. A
   lost peer and a broken trainer are told apart by what torchrun's own agent, in this process, finds:
   - torchrun raising a connection or timeout error of its rendezvous store (RendezvousConnectionError,
     DistNetworkError, DistStoreError) is a lost peer: only the agent talks to that store, and the
     trainer's code runs in the worker processes, never here.
   - torchrun giving up on failed workers (ChildFailedError) is a lost peer only if its rendezvous
     handler, asked once more, cannot reach the store either (the same errors). Otherwise it is the
     trainer's failure and stays 1 (and 2 stays 2). The workers' exit codes and error files cannot
     make that call alone: the trainer writes no error file, and a worker whose collective broke exits
     1 with a traceback (or dies by a signal) just as one with a bug in it.
   - A rendezvous that timed out (RendezvousTimeoutError: peers that never came, as in step 1) or
     that another node closed (RendezvousClosedError: that node gave up) stays 1.
   This cannot turn a broken trainer into a restart loop: the node that serves the store always
   reaches it (the store lives in its own process, kept alive here until the answer), so whatever its
   workers do, a trainer failure ends it with 1, and one permanent exit fails the job. (A node whose
   own trainer failed may still end with 200 when worker 0 stopped first; the job fails all the
   same.) Where the store outlives the lost node (a node other than worker 0, or any node with the
   etcd rendezvous, whose store is not on a training node), nothing is needed here: with
   --max-restarts > 0 (the generated jobs use 3) torchrun restarts the workers and waits in the
   rendezvous for the pod the operator re-creates. 200 because it is >= 128 and above 128 + every
   signal number (Linux signals end at 64): it does not read as a signal, and 143 keeps meaning
   preemption. After a stop that every node takes together (a drain of worker 0's node), worker 0's
   node keeps the store until the other nodes have left it (at most PEERS_LEAVE_S), so that they end
   with 143 too, not with 200 (trainer/store_peers.py).

torchrun gives its workers 30 s after forwarding SIGTERM, then kills them; a large model's checkpoint
takes longer. FSDP_TERM_GRACE_S (default 30) sets that time after a signal: keep it a little under the
pod's terminationGracePeriodSeconds (the kubelet kills the whole pod then).

Three guards of the generated jobs, each configured by environment and inert without it:
- trainer/attempts.py: every start of the pod counts on the shared volume; the start after
  FSDP_MAX_RETRIES restarts exits 1 (the operator does not bound restarts of retryable exits).
- trainer/capacity_block.py: before an EC2 Capacity Block ends, SIGTERM (the workers checkpoint), then
  exit 1 with one line.
- trainer/transport_check.py: a multi-node job whose NCCL uses another network transport than
  FSDP_EXPECT_TRANSPORT stops with one line and exit 1 (or warns).
and one on by default (FSDP_HANG_WATCHDOG=off turns it off):
- trainer/watchdog.py: workers that complete no step within a bound derived from their measured step
  time (floors for the start and for checkpoints) get their stacks dumped (SIGUSR1), and the run stops
  with exit status HUNG (201), restartable like a lost peer.
A guard stops the run through the same path as a preemption (SIGTERM to this process, which torchrun
forwards to the workers), and the run then ends with the guard's line and its exit status (1; the hang
watch's 201) instead of 143.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from trainer import attempts, capacity_block, rendezvous_env, store_peers, transport_check, watchdog

WAIT_ENV = "FSDP_RDZV_WAIT_S"
GRACE_ENV = "FSDP_TERM_GRACE_S"
LOG_EVERY_S = 60.0
POLL_S = 1.0
# After a stop, how long the node serving the rendezvous store waits for the other nodes to leave it: they
# stop at the same step and are at most moments behind; short, as the pod's grace period is running.
PEERS_LEAVE_S = 10.0
STOPPED = 128 + signal.SIGTERM
LOST_PEER = 200  # see item 4 of the module docstring
# Worker exits passed through as they are when every failed worker ended with one of them: 2, bad input
# (trainer.train), and 3, a pre-flight check that ran and failed (trainer.preflight CHECK_FAILED), which
# the pre-flight Job's podFailurePolicy tells from a crash (torchrun alone would exit 1 for both), and
# 202, a checkpoint write that failed (trainer.checkpoint.WRITE_FAILED: restartable, the last complete
# checkpoint kept).
VERDICTS = (2, 3, 202)


def _seconds(name: str, default: float) -> float:
    try:
        return watchdog.env_number(os.environ, name, default, positive=False)
    except watchdog.BadSetting:
        raw = os.environ[name]
        print(f"error: {name}={raw!r}: must be a number of seconds, e.g. {name}={int(default)}", file=sys.stderr)
        sys.exit(2)


def _resolves(host: str, port: int) -> bool:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return True


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def wait_for(what: str, ready: Callable[[], bool], deadline: float, wait_s: float) -> bool:
    """Poll `ready` until it holds or `deadline` (time.monotonic) passes; say so once a minute."""
    next_log = time.monotonic()
    while not ready():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= next_log:
            print(
                f"launch: waiting for {what} ({deadline - now:.0f} of {wait_s:.0f} s left, {WAIT_ENV})",
                file=sys.stderr,
                flush=True,
            )
            next_log = now + LOG_EVERY_S
        time.sleep(POLL_S)
    return True


def wait_for_rendezvous(argv: Sequence[str]) -> None:
    """Block until the rendezvous endpoint of this torchrun command line can be used (see step 1)."""
    from torch.distributed.elastic.rendezvous.utils import (
        _matches_machine_hostname,
        _parse_rendezvous_config,
        parse_rendezvous_endpoint,
    )
    from torch.distributed.run import parse_args

    args = parse_args(list(argv))
    if args.standalone or not args.rdzv_endpoint:
        return
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)
    wait_s = _seconds(WAIT_ENV, 900.0)
    deadline = time.monotonic() + wait_s
    if not wait_for(f"{host} to resolve", lambda: _resolves(host, port), deadline, wait_s):
        print(
            f"error: --rdzv-endpoint {args.rdzv_endpoint}: {host} did not resolve within {wait_s:.0f} s; "
            f"check that the first worker's pod runs, or raise {WAIT_ENV}",
            file=sys.stderr,
        )
        sys.exit(1)
    if args.rdzv_backend != "c10d":
        return
    # The c10d store is served by the node whose address is the endpoint's (torchrun decides the same way,
    # unless rdzv-conf says is_host); every other node can only connect to it.
    is_host = _parse_rendezvous_config(args.rdzv_conf).get("is_host")
    serves = is_host.lower() in ("1", "true", "yes") if is_host is not None else _matches_machine_hostname(host)
    if not serves and not wait_for(
        f"the rendezvous store at {host}:{port}", lambda: _accepts(host, port), deadline, wait_s
    ):
        print(
            f"error: --rdzv-endpoint {args.rdzv_endpoint}: nothing accepted connections within {wait_s:.0f} s; "
            f"check that the first worker's torchrun runs, or raise {WAIT_ENV}",
            file=sys.stderr,
        )
        sys.exit(1)


def _extend_worker_grace(grace_s: float) -> None:
    """Let torchrun wait `grace_s` (not its fixed 30 s) for workers to exit after it forwards a signal.

    Only after a signal: torchrun also stops the surviving workers when one fails (before a restart),
    and those may be stuck in a collective with the dead one; they should not hold up the restart.
    torchrun registers `_terminate_process_handler` by its module-level name when it starts workers.
    """
    from torch.distributed.elastic.multiprocessing import api

    signalled: list[int] = []
    handler = api._terminate_process_handler
    close = api.PContext.close

    def remember(signum, frame):
        signalled.append(signum)
        handler(signum, frame)

    def close_with_grace(self, death_sig=None, timeout=30):
        return close(self, death_sig, max(timeout, grace_s) if signalled else timeout)

    api._terminate_process_handler = remember
    api.PContext.close = close_with_grace  # type: ignore[method-assign]  # patched on purpose: see above


def _keep_rendezvous_handlers() -> list:
    """Keep every rendezvous handler torchrun builds, to ask it again after the workers failed.

    torchrun's launch_agent gets its handler from the registry module by its module-level name. Holding
    it also keeps the store alive on the node that serves it (the store is the handler's) until then.
    """
    from torch.distributed.elastic.rendezvous import registry

    handlers: list = []
    create = registry.get_rendezvous_handler

    def keep(params):
        handler = create(params)
        handlers.append(handler)
        return handler

    registry.get_rendezvous_handler = keep
    return handlers


def _note_finished_workers() -> list[bool]:
    """A list that holds True once this node's workers all succeeded and torchrun waits in its exit barrier.

    torchrun's agent calls `_exit_barrier` only after its worker group succeeded, and waits there (up to
    5 minutes) for the agents of the other nodes. A signal there (a pod deleted after the last step) would
    otherwise end the launcher with 128 + the signal: the operator re-creates the pod, whose new torchrun
    waits in a rendezvous no other node joins (its join_timeout), and the finished job stays Running.
    The barrier is a blocking TCPStore call, during which Python runs no signal handler: a SIGTERM would
    wait for the barrier's end, past the pod's grace period (SIGKILL, 137, the same re-created pod). So
    the barrier runs in a thread and the main thread waits for it in short steps, where the signal lands.
    """
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    finished: list[bool] = []
    barrier = SimpleElasticAgent._exit_barrier

    def note_and_wait(self):
        finished.append(True)
        done = threading.Event()
        raised: list[BaseException] = []

        def wait() -> None:
            try:
                barrier(self)
            except BaseException as err:  # handed to the main thread
                raised.append(err)
            finally:
                done.set()

        threading.Thread(target=wait, name="exit-barrier", daemon=True).start()
        while not done.wait(POLL_S):
            pass
        if raised:
            raise raised[0]

    SimpleElasticAgent._exit_barrier = note_and_wait  # type: ignore[method-assign]  # patched on purpose: see above
    return finished


def _store_error(err: BaseException) -> bool:
    """Whether `err` is the rendezvous store's connection (or timeout) failing, raised in torchrun's agent."""
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    return isinstance(err, (RendezvousConnectionError, DistNetworkError, DistStoreError))


def _store_lost(handlers: Sequence) -> BaseException | None:
    """The store error torchrun's rendezvous handler meets when it reads the rendezvous now, or None."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    for handler in handlers:
        try:
            handler.num_nodes_waiting()
        except SignalException:
            raise
        except Exception as err:  # any other answer (e.g. etcd's own errors) is not a lost store
            if _store_error(err):
                return err
    return None


def _one_line(err: BaseException) -> str:
    """`Type: message`, with the inner exception torchrun chains to it (the socket's own error)."""
    text = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    cause = err.__cause__
    return f"{text} <- {_one_line(cause)}" if cause is not None else text


def _lost_peer(what: str, err: BaseException) -> int:
    print(
        f"launch: {what}; the rendezvous store is gone ({_one_line(err)}): a peer node was lost, "
        f"exit status {LOST_PEER}, the restarted job resumes from its last checkpoint",
        file=sys.stderr,
        flush=True,
    )
    return LOST_PEER


class GuardStop:
    """The first guard's reason to stop the run; asking for a stop sends this process SIGTERM."""

    def __init__(self) -> None:
        self.reason = ""
        self.status = 1
        self._lock = threading.Lock()

    def __call__(self, reason: str, status: int = 1) -> None:
        with self._lock:
            if self.reason:
                return
            self.reason, self.status = reason, status
        print(f"launch: stopping the run: {reason}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    def note(self, reason: str) -> None:
        """A guard's reason found after torchrun ended (nothing left to stop)."""
        with self._lock:
            self.reason = self.reason or reason

    def exit_status(self, status: int) -> int:
        """The guard's status (1, or the hang watch's restartable one) with its line when a guard
        stopped the run, else `status`."""
        if not self.reason:
            return status
        print(f"error: {self.reason}", file=sys.stderr, flush=True)
        return self.status


def _max_nodes(argv: Sequence[str]) -> int:
    from torch.distributed.run import parse_args, parse_min_max_nnodes

    args = parse_args(list(argv))
    return 1 if args.standalone else parse_min_max_nnodes(args.nnodes)[1]


def _store_port(argv: Sequence[str]) -> int | None:
    """The port of the c10d rendezvous store of the command, or None with another backend or alone."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    from torch.distributed.run import parse_args

    args = parse_args(list(argv))
    if args.standalone or args.rdzv_backend != "c10d" or not args.rdzv_endpoint:
        return None
    return parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)[1]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # As a container's first process, a signal without a handler is ignored: make SIGTERM end the wait
    # (torchrun installs its own handler once it starts the workers).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    attempts.count_this_start()
    block = capacity_block.BlockWatch.from_env()
    if block is not None:
        block.check_at_start()
    argv = rendezvous_env.fill(argv)  # a command without its endpoint: from either job API's env
    wait_for_rendezvous(argv)
    _extend_worker_grace(_seconds(GRACE_ENV, 30.0))
    handlers = _keep_rendezvous_handlers()
    finished = _note_finished_workers()
    stop = GuardStop()
    watches: list[capacity_block.BlockWatch | transport_check.TransportWatch | watchdog.HangWatch] = []
    transport = transport_check.TransportWatch.from_env(_max_nodes(argv))
    hang = watchdog.HangWatch.from_env()
    for watch in (block, transport, hang):
        if watch is not None:
            watch.start(stop)
            watches.append(watch)
    try:
        status = _run_torchrun(argv, handlers, finished)
    except Exception:
        if not stop.reason:
            raise
        status = 1  # the workers failed while stopping for a guard: the guard's line says why
    finally:
        for watch in watches:
            watch.close()
    if transport is not None and not stop.reason and (reason := transport.failure()):
        # The peer node's check stopped its run first, and this node saw that as a lost peer before its
        # own check ran; its logs (read to the end by close) name the same wrong transport, which a
        # restart would not fix: the run fails with that line, not as a retryable lost peer.
        stop.note(reason)
    if status == STOPPED and (port := _store_port(argv)) is not None:
        # Every node is stopping with the same checkpoint: the store stays until the peers have left, so
        # that none of them reads its going as a lost peer (trainer/store_peers.py).
        store_peers.wait_for_peers_to_leave(port, PEERS_LEAVE_S)
    return stop.exit_status(status)


def _run_torchrun(argv: list[str], handlers: list, finished: Sequence[bool] = ()) -> int:
    """torchrun in this process; its end as an exit status (module docstring, steps 2-4)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:  # the outer try: a signal can also arrive while a failure is looked at
        try:
            torchrun(argv)
        except ChildFailedError as err:
            codes = {STOPPED if f.exitcode == -signal.SIGTERM else f.exitcode for f in err.failures.values()}
            if codes == {STOPPED}:
                print(f"launch: every worker stopped after SIGTERM; exit status {STOPPED}", file=sys.stderr, flush=True)
                return STOPPED
            for verdict in VERDICTS:
                if verdict in codes and codes <= {verdict, STOPPED}:
                    # The program's own verdict (torchrun stops the other workers with SIGTERM): its one
                    # line is already on stderr, and torchrun's report would only bury it.
                    return verdict
            lost = None if codes & set(VERDICTS) else _store_lost(handlers)
            if lost is None:
                raise  # the trainer failed on this node: permanent
            failed = ", ".join(
                f"rank {rank} {f.signal_name() if f.exitcode < 0 else f'exit {f.exitcode}'}"
                for rank, f in sorted(err.failures.items())
            )
            return _lost_peer(f"the workers failed ({failed})", lost)
        except Exception as err:
            if not _store_error(err):
                raise
            return _lost_peer("torchrun failed", err)
    except SignalException as err:
        if finished:
            print(
                f"launch: stopped by {signal.Signals(err.sigval).name} after every worker of this node finished "
                "(in torchrun's exit barrier); exit status 0",
                file=sys.stderr,
                flush=True,
            )
            return 0
        print(
            f"launch: stopped by {signal.Signals(err.sigval).name}; exit status {128 + err.sigval}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + err.sigval
    return 0


def exit_now(run: Callable[[], int]) -> NoReturn:
    """Run `run` and leave the process with its status through os._exit, after flushing.

    After a signal torchrun leaves its rendezvous handler open, and the handler's keep-alive timer is a
    daemon thread that calls the TCPStore every few seconds. At interpreter shutdown Python ends such a
    thread with pthread_exit if it returns from the store call then, and the C++ unwind through the call
    ends in std::terminate: SIGABRT ("terminate called without an active exception") instead of the
    launcher's status. Nothing remains to be cleaned up once torchrun has returned, so the launcher
    skips interpreter shutdown.
    """
    try:
        status = run()
    except SystemExit as err:
        if err.code is None or isinstance(err.code, int):
            status = err.code or 0
        else:
            print(err.code, file=sys.stderr)
            status = 1
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main)
