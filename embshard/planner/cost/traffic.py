"""Bytes each rank sends and receives per training step in the embedding collectives, split
into intra-host and inter-host links: what the runtime's counter (`embshard.runtime.comm`)
counts, predicted from a placement.

Counted: input dist (lengths and ids), output dist (embeddings, and their gradients in
backward) and the data-parallel all-reduce; not the per-step header all-gather (batch
sizes and a failure flag). Assumes what the plan assumes: B = batch_size_per_rank samples
on every rank, every bag exactly pooling_factor ids long (so P must be a whole number for
the counts to be whole), and a row shard with n of N rows receiving exactly n/N of each
rank's ids of a feature, unweighted (per-id weights double the id bytes).

Row-wise partial sums (pooled row_wise / table_row_wise) are reduced inside each host
first: the row shards of one feature on one host (its *members*) all-to-all their partial
sums so that one member, `reducer_of`, holds the host's sum for each sample owner, and that
member alone sends it to the owner (backward mirrors it). A host with one member sends
directly. The all-reduce is counted as a ring over the ranks in rank order
(`ring_allreduce_sent`): the counter cannot see inside the backend's algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from embshard.planner.types import ShardingType
from embshard.specs import TableSpec
from embshard.topology import Topology

ID_BYTES = 8  # int64 ids
LENGTH_BYTES = 8  # int64 bag lengths
OUTPUT_BYTES = 4  # fp32 embeddings and their gradients on the wire
GRAD_BYTES = 4  # the data-parallel all-reduce: fp32 weight gradients and id counts


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

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> "TrafficBytes":
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; expected {[f.name for f in fields(cls)]}")
        return cls(**{k: float(v) for k, v in raw.items()})


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def reducer_of(members: Sequence[int], dest: int) -> int:
    """The member of a host's row shards that sends the host's reduced partial sums to ``dest``:
    ``dest`` itself if it is a member, else the members in turn over the other ranks.
    members: sorted ranks; the runtime and this model share this rule."""
    if dest in members:
        return dest
    others = dest - sum(1 for m in members if m < dest)  # dest's position among the non-members
    return members[others % len(members)]


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
    """Bytes from rank to rank (the diagonal, a rank's own data, is free)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.sent = [[0.0] * topo.world_size for _ in range(topo.world_size)]

    def add(self, src: int, dst: int, num_bytes: float, both_ways: bool = False) -> None:
        if src != dst:
            self.sent[src][dst] += num_bytes
            if both_ways:  # a forward message whose gradient comes back in backward
                self.sent[dst][src] += num_bytes

    def per_rank(self) -> list[TrafficBytes]:
        W, host = self.topo.world_size, self.topo.host_of
        out = []
        for r in range(W):
            same = [host(w) == host(r) for w in range(W)]
            out.append(TrafficBytes(
                sum(self.sent[r][w] for w in range(W) if same[w]), sum(self.sent[w][r] for w in range(W) if same[w]),
                sum(self.sent[r][w] for w in range(W) if not same[w]), sum(self.sent[w][r] for w in range(W) if not same[w])))
        return out


def rank_traffic_bytes(specs: Sequence[TableSpec], topo: Topology, placements: Sequence) -> list[TrafficBytes]:
    """Every rank's embedding-collective bytes of one training step (index = rank) for
    placements (TablePlacement-like)."""
    by_name = {s.name: s for s in specs}
    links = _Links(topo)
    allreduce_elems = {True: 0, False: 0}  # pooled / sequence collection: one all-reduce each
    for t in placements:
        spec = by_name[t.name]
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            if topo.replicated_dp_lookup:
                _replicated_lookup(spec, topo, links)
            else:
                allreduce_elems[spec.pooled] += spec.num_embeddings * (spec.embedding_dim + 1)  # gradients, id counts
            continue
        _sharded(spec, topo, t.sharding_type, t.shards, links)
    out = links.per_rank()
    for elems in allreduce_elems.values():
        if elems:
            out = [a + b for a, b in zip(out, _ring_bytes(elems, topo))]
    return out


def _sharded(spec: TableSpec, topo: Topology, stype: ShardingType, shards: Sequence, links: _Links) -> None:
    B, P, F, W = topo.batch_size_per_rank, spec.pooling_factor, spec.num_features, topo.world_size
    for s in shards:
        ids = B * P * (s.num_rows / spec.num_embeddings if stype.splits_rows else 1)  # per rank and feature
        out_elems = (B if spec.pooled else ids) * s.num_cols
        for w in range(W):
            links.add(w, s.rank, F * (B * LENGTH_BYTES + ids * ID_BYTES))
            if not (spec.pooled and stype.splits_rows):
                links.add(s.rank, w, F * out_elems * OUTPUT_BYTES, both_ways=True)
    if spec.pooled and stype.splits_rows:
        block = B * spec.embedding_dim * OUTPUT_BYTES * F  # one sample owner's partial sums of every feature
        for members in host_members([s.rank for s in shards], topo.local_world_size):
            for w in range(W):
                reducer = reducer_of(members, w)
                if len(members) > 1:
                    for m in members:
                        links.add(m, reducer, block, both_ways=True)
                links.add(reducer, w, block, both_ways=True)


def _replicated_lookup(spec: TableSpec, topo: Topology, links: _Links) -> None:
    """Ids to every replica; in backward, each rank's output gradients to every replica."""
    B, P, F, W = topo.batch_size_per_rank, spec.pooling_factor, spec.num_features, topo.world_size
    ids = B * P
    rows = B if spec.pooled else ids
    for w in range(W):
        for q in range(W):
            links.add(w, q, F * (B * LENGTH_BYTES + ids * ID_BYTES))
            links.add(w, q, F * rows * spec.embedding_dim * OUTPUT_BYTES)


def _ring_bytes(num_elems: int, topo: Topology) -> list[TrafficBytes]:
    links = _Links(topo)
    W = topo.world_size
    for r, n in enumerate(ring_allreduce_sent(num_elems, W)):
        links.add(r, (r + 1) % W, n * GRAD_BYTES)
    return links.per_rank()
