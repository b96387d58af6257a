"""Bytes each rank sends and receives per training step in the embedding collectives, split
into intra-host and inter-host links: what the runtime's counter (`embshard.runtime.comm`)
counts, predicted from a placement.

Counted: input dist (lengths and ids), output dist (embeddings, and their gradients in
backward) and the data-parallel all-reduce; not the per-step header (batch
sizes and a failure flag, a few bytes). Assumes what the plan assumes: B = batch_size_per_rank samples
on every rank, every bag exactly pooling_factor ids long (so P must be a whole number for
the counts to be whole), and a row shard with n of N rows receiving exactly n/N of each
rank's ids of a feature, unweighted (per-id weights double the id bytes).

Row-wise partial sums (pooled row_wise / table_row_wise) are reduced inside each host
first: the row shards of one feature on one host (its *members*) all-to-all their partial
sums so that one member holds the host's sum for each sample owner, and that
member alone sends it to the owner (backward mirrors it; `reducers`). A host with one member sends
directly. With ``topology.reduce_in_host`` off, every row shard sends its own partial sums.
Across hosts the data-parallel all-reduce of the rows some rank looked up (`allreduce_rows`; ids uniform, so a
skewed batch sends fewer) follows the all-reduce of a mask of DP_ROW_MASK_BYTES per row (embshard.runtime.row_union);
each all-reduce is the one the runtime runs (`embshard.planner.cost.allreduce`): a ring over
the ranks in rank order (`ring_allreduce_sent`: the counter cannot see inside the backend's
algorithm), or hierarchical (reduce-scatter in the host as an all-to-all, rings across hosts,
all-gather in the host).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

from embshard.comms import WIRE_BYTES
from embshard.planner.cost.allreduce import hierarchical_allreduce
from embshard.planner.cost.hot_rows import hot_split

from embshard.planner.cost.units import expected_distinct_rows
from embshard.planner.types import ShardingType
from embshard.specs import (DP_ROW_MASK_BYTES, DP_SPARSE_MAX_FRACTION, ZERO_GRADIENT_MOVES, TableSpec,
                            dp_allreduce_floats_per_row, piece_rows, sharded_segment_floats, sparse_dp_allreduce,
                            sparse_dp_table)
from embshard.topology import Topology

ID_BYTES = 8  # int64 ids
LENGTH_BYTES = 8  # int64 bag lengths
OUTPUT_BYTES = WIRE_BYTES["fp32"]  # the runtime's kernels emit fp32 embeddings (and take fp32 gradients); in-host sums stay fp32
GRAD_BYTES = WIRE_BYTES["fp32"]  # dense gradients and optimizer state are fp32


def wire_bytes(topo: Topology, direction: str) -> float:
    """Bytes of one embedding (gradient) element on the wire: 'forward' (output dist), 'backward'
    (its gradients), 'dp_allreduce' (data-parallel gradients, adam's id counts); `Topology.comms`."""
    return topo.comms.bytes_per_element(direction)


@dataclass(frozen=True)
class TrafficBytes:
    """One rank's bytes per step, by direction and link class."""

    intra_host_sent: float = 0
    intra_host_received: float = 0
    inter_host_sent: float = 0
    inter_host_received: float = 0

    def __add__(self, other: "TrafficBytes") -> "TrafficBytes":
        return TrafficBytes(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, float]:
        return {f.name: _whole(getattr(self, f.name)) for f in fields(self)}


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def reducers(members: Sequence[int], world_size: int) -> np.ndarray:
    """For every sample owner w, the member of a host's row shards that sends it the host's reduced
    partial sums: w itself if it is a member, else the members in turn over the other ranks.
    members: sorted ranks; the runtime and this model share this rule."""
    mem = np.asarray(members, dtype=np.int64)
    dest = np.arange(world_size, dtype=np.int64)
    others = dest - np.searchsorted(mem, dest)  # w's position among the non-members
    return np.where(np.isin(dest, mem), dest, mem[others % len(mem)])


def host_members(ranks: Sequence[int], local_world_size: int) -> list[list[int]]:
    """Ranks holding row shards grouped by host (hosts without any left out), each sorted."""
    by_host: dict[int, list[int]] = {}
    for r in sorted(ranks):
        by_host.setdefault(r // local_world_size, []).append(r)
    return list(by_host.values())


def ring_allreduce_sent(num_elems: int, world_size: int) -> list[int]:
    """Elements each rank sends to its successor (rank + 1 mod W) in a ring all-reduce of
    num_elems: reduce-scatter and all-gather, each passing every chunk but one (chunk sizes
    as ``torch.tensor_split``; rank r skips the chunk of rank r + 1)."""
    if world_size == 1:
        return [0]
    chunks = [num_elems // world_size + (1 if i < num_elems % world_size else 0) for i in range(world_size)]
    return [2 * (num_elems - chunks[(r + 1) % world_size]) for r in range(world_size)]


class _Links:
    """Each rank's bytes sent and received, by link class (a rank's own data is free). Messages
    between one rank and every rank are summed per host, in O(1), and spread at the end."""

    def __init__(self, topo: Topology) -> None:
        self.W, self.L = topo.world_size, topo.local_world_size
        self.host = np.arange(self.W) // self.L
        self.totals = np.zeros((4, self.W))  # intra sent, intra received, inter sent, inter received
        self.to_host, self.to_self = np.zeros(topo.num_hosts), np.zeros(self.W)  # every rank -> q on host h
        self.from_host, self.from_self = np.zeros(topo.num_hosts), np.zeros(self.W)  # q on host h -> every rank

    def to_one(self, q: int, num_bytes: float) -> None:
        """Every rank sends ``num_bytes`` to rank q."""
        self.to_host[self.host[q]] += num_bytes
        self.to_self[q] += num_bytes
        self.totals[1, q] += num_bytes * (self.L - 1)
        self.totals[3, q] += num_bytes * (self.W - self.L)

    def from_one(self, q: int, num_bytes: float) -> None:
        """Rank q sends ``num_bytes`` to every rank."""
        self.from_host[self.host[q]] += num_bytes
        self.from_self[q] += num_bytes
        self.totals[0, q] += num_bytes * (self.L - 1)
        self.totals[2, q] += num_bytes * (self.W - self.L)

    def add(self, src, dst, num_bytes) -> None:
        """Messages src[i] -> dst[i] of num_bytes[i] (scalars broadcast)."""
        src, dst, n = np.broadcast_arrays(np.asarray(src), np.asarray(dst), np.asarray(num_bytes, dtype=np.float64))
        keep = src != dst
        src, dst, n = src[keep], dst[keep], n[keep]
        inter = (self.host[src] != self.host[dst]).astype(np.int64) * 2
        np.add.at(self.totals, (inter, src), n)
        np.add.at(self.totals, (inter + 1, dst), n)

    def per_rank(self) -> list[TrafficBytes]:
        t = self.totals.copy()
        t[0] += self.to_host[self.host] - self.to_self
        t[2] += self.to_host.sum() - self.to_host[self.host]
        t[1] += self.from_host[self.host] - self.from_self
        t[3] += self.from_host.sum() - self.from_host[self.host]
        return [TrafficBytes(*(float(x) for x in col)) for col in t.T]


def rank_traffic_bytes(specs: Sequence[TableSpec], topo: Topology, placements: Sequence) -> list[TrafficBytes]:
    """Every rank's embedding-collective bytes of one training step (index = rank) for
    placements (TablePlacement-like)."""
    by_name = {s.name: s for s in specs}
    links = _Links(topo)
    reduced: dict[bool, list[TableSpec]] = {True: [], False: []}  # pooled / sequence collection: one exchange each
    for t in placements:
        spec = by_name[t.name]
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            if (getattr(t, "data_parallel_mode", None) or topo.data_parallel_mode) == "replicated_lookup":
                _replicated_lookup(spec, topo, links)
            else:
                reduced[spec.pooled].append(spec)
            continue
        if getattr(t, "hot_rows", 0):  # the cold lookups travel; the hot replica joins the all-reduce (cost/hot_rows.py)
            spec, hot = hot_split(spec, t.hot_rows)
            reduced[spec.pooled].append(hot)
        _sharded(spec, topo, t.sharding_type, t.shards, links)
    out = links.per_rank()
    for tables in reduced.values():
        if tables:
            out = [a + b for a, b in zip(out, _dp_exchange_bytes(tables, topo))]
    return out


def _sharded(spec: TableSpec, topo: Topology, stype: ShardingType, shards: Sequence, links: _Links) -> None:
    B, P, F, W = topo.batch_size_per_rank, spec.pooling_factor, spec.num_features, topo.world_size
    # reduced in each host (one host, or topology.reduce_in_host off: flat)
    row_sums = spec.pooled and stype.splits_rows and topo.reduces_in_host
    for s in shards:
        ids = B * P * (s.num_rows / spec.num_embeddings if stype.splits_rows else 1)  # per rank and feature
        links.to_one(s.rank, F * (B * LENGTH_BYTES + ids * ID_BYTES))
        if not row_sums:  # outputs, and their gradients back
            out = F * (B if spec.pooled else ids) * s.num_cols
            links.from_one(s.rank, out * wire_bytes(topo, "forward"))
            links.to_one(s.rank, out * wire_bytes(topo, "backward"))
    if row_sums:
        block = B * spec.embedding_dim * F  # one sample owner's partial sums of every feature (elements)
        owners = np.arange(W)
        for members in host_members([s.rank for s in shards], topo.local_world_size):
            reducer = reducers(members, W)
            for m in members if len(members) > 1 else ():  # reduced in the host in fp32
                links.add(m, reducer, block * OUTPUT_BYTES)
                links.add(reducer, m, block * OUTPUT_BYTES)
            links.add(reducer, owners, block * wire_bytes(topo, "forward"))  # the host's sums, on the wire
            links.add(owners, reducer, block * wire_bytes(topo, "backward"))  # their gradients


def _replicated_lookup(spec: TableSpec, topo: Topology, links: _Links) -> None:
    """Ids to every replica; in backward, each rank's output gradients to every replica."""
    B, P, F = topo.batch_size_per_rank, spec.pooling_factor, spec.num_features
    ids = B * P
    rows = B if spec.pooled else ids
    for q in range(topo.world_size):
        links.to_one(q, F * (B * LENGTH_BYTES + ids * ID_BYTES) + F * rows * spec.embedding_dim * wire_bytes(topo, "backward"))


def allreduce_rows(spec: TableSpec, topo: Topology) -> float:
    """Rows of a data-parallel table trained by all-reduce whose gradient the runtime exchanges and updates per step:
    with `sparse_dp_allreduce` (embshard.runtime.row_union), for a table that is not small (`sparse_dp_table`), those
    the global batch looks up (ids uniform: the expected distinct rows, more than a skewed batch hits), or every row
    where that is DP_SPARSE_MAX_FRACTION of them or more (not for ZERO_GRADIENT_MOVES optimizers); else every row."""
    N = spec.num_embeddings
    if not masked(spec, topo):
        return N
    hit = expected_distinct_rows(topo.batch_size_per_rank * spec.pooling_factor * spec.num_features * topo.world_size, N)
    return hit if hit < DP_SPARSE_MAX_FRACTION * N or spec.optimizer in ZERO_GRADIENT_MOVES else N


def masked(spec: TableSpec, topo: Topology) -> bool:
    """Whether the rows of this data-parallel table trained by all-reduce are chosen by the mask of the rows looked up
    (and a collection with such a table all-reduces that mask)."""
    return sparse_dp_allreduce(topo.num_hosts, topo.sharded_dp_update) and sparse_dp_table(
        spec.num_embeddings, spec.embedding_dim, spec.optimizer)


def allreduce_exchange_floats(spec: TableSpec, topo: Topology) -> float:
    """Elements a data-parallel table trained by all-reduce puts in its collection's exchange per step: its
    `allreduce_rows`' gradient, and where no mask chooses them (`masked`) adam's id count per row too."""
    if not masked(spec, topo):
        return spec.num_embeddings * dp_allreduce_floats_per_row(spec.optimizer, spec.embedding_dim)
    return allreduce_rows(spec, topo) * spec.embedding_dim


def _dp_exchange_bytes(specs: Sequence[TableSpec], topo: Topology) -> list[TrafficBytes]:
    """One collection's data-parallel exchange (its tables trained by all-reduce) as the runtime runs it: with
    ``sharded_dp_update`` a reduce-scatter (on the wire) and an all-gather (fp32) of W segments as rings, each
    passing W - 1 segments to the next rank; else the all-reduce (with `sparse_dp_allreduce`: of the mask of the rows
    looked up, then of those rows' gradients: `allreduce_rows`)."""
    links = _Links(topo)
    W, e = topo.world_size, wire_bytes(topo, "dp_allreduce")
    if topo.sharded_dp_update:
        tables = [(s.num_embeddings, s.embedding_dim, s.optimizer) for s in specs]
        sent = (W - 1) * sharded_segment_floats(tables, W) * (e + GRAD_BYTES)
        links.add(np.arange(W), (np.arange(W) + 1) % W, np.full(W, sent))
        return links.per_rank()
    if any(masked(s, topo) for s in specs):  # one fp16 per row of every table of the collection's buffer
        _all_reduce(sum(s.num_embeddings for s in specs), DP_ROW_MASK_BYTES, topo, links)
    _all_reduce(round(sum(allreduce_exchange_floats(s, topo) for s in specs)), e, topo, links)
    return links.per_rank()


def _all_reduce(num_elems: int, e: int, topo: Topology, links: _Links) -> None:
    """An all-reduce of num_elems elements of e bytes as the runtime runs it (`embshard.planner.cost.allreduce`):
    a ring over all ranks, or reduce-scatter in the host, a ring across hosts, all-gather in the host."""
    W, L = topo.world_size, topo.local_world_size
    if not hierarchical_allreduce(num_elems * e, topo):
        links.add(np.arange(W), (np.arange(W) + 1) % W, np.asarray(ring_allreduce_sent(num_elems, W)) * e)
        return
    chunks = np.asarray(piece_rows(num_elems, L))
    local = np.arange(W) % L
    src, dst = np.divmod(np.arange(W * L), L)  # every rank to every rank of its host: src, dst's local index
    dst = src - local[src] + dst
    links.add(src, dst, chunks[local[dst]] * e)  # reduce-scatter: each local rank its share
    links.add(src, dst, chunks[local[src]] * e)  # all-gather: each local rank's share to the host
    H = topo.num_hosts
    for i in range(L):  # a ring over the hosts of local rank i's share, in host order
        ring = np.arange(H) * L + i
        links.add(ring, np.roll(ring, -1), np.asarray(ring_allreduce_sent(int(chunks[i]), H)) * e)
