"""Peers still connected to the rendezvous store this process serves (trainer/launch.py, item 4).

With the c10d rendezvous the store lives in worker 0's torchrun. When a drain or preemption stops the
run, every rank saves the same last checkpoint and exits 143, but the nodes do not end at the same
instant: worker 0's launcher leaving first takes the store with it, and a peer's torchrun, whose
monitor loop reads the store every --monitor-interval, then reports a lost peer (200) although its own
workers were stopping just as cleanly. So after a stop, the node that serves the store waits, up to a
bound, until no other process is connected to it.

Connections are read from /proc (Linux; elsewhere nothing is found and nothing waits): a socket this
process owns whose local port is the store's is the server's side of a connection; it belongs to a
peer unless its other end is also a socket of this process (torchrun's own client of its store).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_LISTEN = "0A"
_ESTABLISHED = "01"


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir() if Path("/proc/self/fd").is_dir() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _tcp_sockets() -> list[tuple[str, int, str, int, str, str]]:
    """(local address, local port, remote address, remote port, state, inode) of every TCP socket."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            (laddr, lport), (raddr, rport) = (f.rsplit(":", 1) for f in fields[1:3])
            rows.append((laddr, int(lport, 16), raddr, int(rport, 16), fields[3], fields[9]))
    return rows


def connected_peers(port: int) -> int | None:
    """How many connections other processes hold to the store on `port`, or None when this process does
    not serve it (no listening socket of its own there)."""
    own = _own_socket_inodes()
    rows = [r for r in _tcp_sockets() if r[5] in own]
    if not any(r[1] == port and r[4] == _LISTEN for r in rows):
        return None
    own_clients = {(r[0], r[1]) for r in rows if r[3] == port and r[4] == _ESTABLISHED}
    return sum(1 for r in rows if r[1] == port and r[4] == _ESTABLISHED and (r[2], r[3]) not in own_clients)


def wait_for_peers_to_leave(port: int, bound_s: float, poll_s: float = 0.05) -> int:
    """Wait until no other process is connected to the store on `port` (if this process serves it), at
    most `bound_s`; the connections still open at the end (0 when all left or nothing is served)."""
    deadline = time.monotonic() + bound_s
    while True:
        peers = connected_peers(port)
        if not peers:
            return 0
        if time.monotonic() >= deadline:
            return peers
        time.sleep(poll_s)
