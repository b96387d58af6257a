"""Which ranks are gone when the process group breaks, and on which hosts.

A collective's error names at best one peer, often a survivor that exited first. So each
rank listens on a TCP port of its host's address (the one that routes to MASTER_ADDR) from
the start, the ranks swap these endpoints once, and a rank that loses the group connects to
every peer's, SETTLE_S after the failure (ranks killed together take a moment to die): a
killed rank's port refuses at once, a host that went down does not answer within
PROBE_TIMEOUT_S. A rank that saw the failure itself is a survivor even if it has exited
since: it first leaves a witness key in the job's rendezvous store (MASTER_ADDR:MASTER_PORT;
where that store is gone with its host, the probe alone decides, and the prober keeps its
port open until LINGER_S after the failure so that ranks probing about then see it). Host h
holds ranks h*L..h*L+L-1 (L ranks per host), as torchrun numbers them.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from embshard.launch.distributed import RankContext, all_gather

SETTLE_S = 1.0
PROBE_TIMEOUT_S = 2.0
LINGER_S = 3.0
WITNESS_KEY = "embshard/lost_ranks/witness/{}"
STORE_ERRORS = (RuntimeError, OSError, ValueError, KeyError)  # no store, or it went away (DistError is a RuntimeError)


def _rendezvous_store() -> dist.Store | None:
    """A client of the job's rendezvous store (torchrun's or rank 0's TCPStore), or None if it does not answer."""
    try:
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=timedelta(seconds=PROBE_TIMEOUT_S))
    except STORE_ERRORS:
        return None


def _witnessed(store: dist.Store | None, rank: int) -> bool:
    try:
        return store is not None and store.check([WITNESS_KEY.format(rank)])
    except STORE_ERRORS:
        return False


def _host_address() -> tuple[socket.AddressFamily, str]:
    """This host's address towards MASTER_ADDR (no packet is sent: a UDP connect only picks the route)."""
    family, _, _, _, target = socket.getaddrinfo(os.environ.get("MASTER_ADDR", "127.0.0.1"), 1, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)
        return family, s.getsockname()[0]


def _serve(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        conn.close()


def _answers(endpoint: tuple[str, int]) -> bool:
    try:
        socket.create_connection(endpoint, timeout=PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Peers:
    rank: int
    local_world_size: int
    endpoints: tuple[tuple[str, int] | None, ...]  # (address, port) of every rank's listener; None: it has none
    listener: socket.socket | None

    @classmethod
    def open(cls, ctx: RankContext) -> "Peers":
        """Listen, and swap endpoints with every rank (a collective: every rank calls it at the same point).
        A rank that cannot listen (no route to MASTER_ADDR, no port) still joins the swap, without an endpoint."""
        try:
            family, address = _host_address()
            listener = socket.create_server((address, 0), family=family, backlog=128)
        except OSError:
            listener, endpoint = None, None
        else:
            threading.Thread(target=_serve, args=(listener,), daemon=True).start()
            endpoint = (address, listener.getsockname()[1])
        endpoints = all_gather(ctx, endpoint)
        return cls(ctx.rank, ctx.local_world_size, tuple(e if e is None else tuple(e) for e in endpoints), listener)

    def gone(self) -> list[int]:
        """The ranks whose listener does not answer now."""
        others = [r for r, e in enumerate(self.endpoints) if r != self.rank and e is not None]
        with ThreadPoolExecutor(max_workers=min(32, max(1, len(others)))) as pool:
            answered = list(pool.map(lambda r: _answers(self.endpoints[r]), others))
        return [r for r, ok in zip(others, answered) if not ok]

    def report(self) -> str:
        """'no answer from host 1 (10.213.0.2): ranks 2, 3 (all of its ranks)': the ranks that neither answer
        nor left a witness key (after leaving this rank's, settling, probing; returns after lingering)."""
        started = time.monotonic()
        store = _rendezvous_store()
        try:
            if store is not None:
                store.set(WITNESS_KEY.format(self.rank), "1")
        except STORE_ERRORS:
            store = None
        time.sleep(SETTLE_S)
        gone = [r for r in self.gone() if not _witnessed(store, r)]
        L = self.local_world_size
        parts = []
        for host in sorted({r // L for r in gone}):
            ranks = [r for r in gone if r // L == host]
            whole = " (all of its ranks)" if len(ranks) == min(L, len(self.endpoints) - host * L) else ""
            parts.append(f"host {host} ({self.endpoints[ranks[0]][0]}): rank{'s' * (len(ranks) > 1)} "
                         f"{', '.join(map(str, ranks))}{whole}")
        time.sleep(max(0.0, LINGER_S - (time.monotonic() - started)))
        return "no answer from " + "; ".join(parts) if parts else "every rank still answers (a network failure?)"

    def close(self) -> None:
        if self.listener is None:
            return
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone may not)
        except OSError:
            pass
        self.listener.close()
