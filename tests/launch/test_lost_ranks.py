"""Peers.report names the ranks (and whole hosts) whose listener no longer answers."""

from __future__ import annotations

import socket
import time

import torch.distributed as dist

from embshard.launch import lost_ranks
from embshard.launch.lost_ranks import Peers


def listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


def test_report_names_the_silent_host_and_ranks_but_not_witnesses(monkeypatch) -> None:
    store = dist.HashStore()
    monkeypatch.setattr(lost_ranks, "SETTLE_S", 0.0)
    monkeypatch.setattr(lost_ranks, "LINGER_S", 0.0)
    monkeypatch.setattr(lost_ranks, "_rendezvous_store", lambda: store)
    alive = [listener() for _ in range(3)]  # ranks 0 (this one), 1, 4
    dead = [listener() for _ in range(4)]  # ranks 2, 3 (host 1), 5 (host 2), 7 (host 3; saw the failure, exited)
    ports = [s.getsockname() for s in (alive[0], alive[1], dead[0], dead[1], alive[2], dead[2])] + [None] + \
        [dead[3].getsockname()]  # rank 6 could not listen
    for s in dead:
        s.close()
    store.set(lost_ranks.WITNESS_KEY.format(7), "1")
    peers = Peers(rank=0, local_world_size=2, endpoints=tuple(ports), listener=alive[0])
    assert peers.gone() == [2, 3, 5, 7]
    assert peers.report() == ("no answer from host 1 (127.0.0.1): ranks 2, 3 (all of its ranks); "
                              "host 2 (127.0.0.1): rank 5")
    assert store.check([lost_ranks.WITNESS_KEY.format(0)])  # this rank left its own
    peers.close()
    for s in alive[1:]:
        s.close()


def test_report_lingers_so_concurrent_probers_see_this_rank(monkeypatch) -> None:
    monkeypatch.setattr(lost_ranks, "_rendezvous_store", lambda: None)  # no store: the probe alone decides
    monkeypatch.setattr(lost_ranks, "SETTLE_S", 0.1)
    monkeypatch.setattr(lost_ranks, "LINGER_S", 0.5)
    me = listener()
    peers = Peers(rank=0, local_world_size=1, endpoints=(me.getsockname(),), listener=me)
    t0 = time.monotonic()
    assert peers.report() == "every rank still answers (a network failure?)"
    assert time.monotonic() - t0 >= lost_ranks.LINGER_S
    peers.close()
