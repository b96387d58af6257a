"""Peers.report names the ranks (and whole hosts) whose listener no longer answers."""

from __future__ import annotations

import socket
import time

from embshard.train import lost_ranks
from embshard.train.lost_ranks import Peers


def listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def test_report_names_the_silent_host_and_ranks(monkeypatch) -> None:
    monkeypatch.setattr(lost_ranks, "SETTLE_S", 0.0)
    monkeypatch.setattr(lost_ranks, "LINGER_S", 0.0)
    alive = [listener() for _ in range(3)]  # ranks 0 (this one), 1, 4
    dead = [listener() for _ in range(3)]  # ranks 2, 3 (host 1), 5 (host 2); rank 6 could not listen
    ports = [s.getsockname() for s in (alive[0], alive[1], dead[0], dead[1], alive[2], dead[2])] + [None]
    for s in dead:
        s.close()
    peers = Peers(rank=0, local_world_size=2, endpoints=tuple(ports), listener=alive[0])
    assert peers.gone() == [2, 3, 5]
    assert peers.report() == ("no answer from host 1 (127.0.0.1): ranks 2, 3 (all of its ranks); "
                              "host 2 (127.0.0.1): rank 5")
    peers.close()
    for s in alive[1:]:
        s.close()


def test_report_lingers_so_concurrent_probers_see_this_rank(monkeypatch) -> None:
    monkeypatch.setattr(lost_ranks, "SETTLE_S", 0.1)
    monkeypatch.setattr(lost_ranks, "LINGER_S", 0.5)
    me = listener()
    peers = Peers(rank=0, local_world_size=1, endpoints=(me.getsockname(),), listener=me)
    t0 = time.monotonic()
    assert peers.report() == "every rank still answers (a network failure?)"
    assert time.monotonic() - t0 >= lost_ranks.LINGER_S
    peers.close()
