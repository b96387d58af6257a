"""Enumerate candidate shardings of each table: type x number of shards, with their costs.

Shard counts: powers of two up to the limit, plus the limit itself (world size for
row-wise, the host size for table_row_wise/table_column_wise, columns/4 for column splits),
restricted by pinned ranks. Small tables (see search.problem.SPLIT_SHARE and ADDED_SHARE) are offered only
data_parallel and table_wise: splitting them cannot help balance. Host-bound types are offered only on multi-host topologies
(on one host they equal row_wise/column_wise) unless they are the only allowed type.

With ``tiers`` (host memory for tables: ``topology.ddr_gib`` > 0), every sharded layout is
also offered with its shards in host memory and with an HBM cache of each of
`tiers.CACHE_FRACTIONS` of their rows (embshard.planner.cost.tiers).

Tables with a measured access curve (``TableSpec.hot_rows``) are also offered each sharded
layout with a hot set replicated (``hot_rows=True``; fractions in cost/hot_rows.py), priced as
its cold part plus a data-parallel replica of the hot rows.

``inference`` (serving): candidates cost the forward pass only (input dist, lookup forward,
output dist forward: `forward_only`) and the bytes of forward-only storage (no optimizer
state, no gradients; see cost/storage.py).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

from embshard.planner.cost.hot_rows import hot_row_counts, hot_split
from embshard.planner.cost.perf import cheaper_data_parallel_mode, data_parallel_perf, holder_perf, relocated_perfs, requester_perf
from embshard.planner.cost.storage import data_parallel_storage, holder_storage, requester_storage
from embshard.planner.cost.tiers import CACHE_FRACTIONS, cache_rows
from embshard.planner.splits import col_splits, row_splits
from embshard.planner.types import Candidate, Location, Perf, ShardCost, ShardingType, TableConstraint
from embshard.specs import TableSpec
from embshard.topology import Topology


def _counts(limit: int) -> list[int]:
    counts, k = [], 2
    while k < limit:
        counts.append(k)
        k *= 2
    if limit >= 2:
        counts.append(limit)
    return counts


def forward_only(p: Perf) -> Perf:
    """The phases a forward pass runs: no output-dist backward, lookup backward or all-reduce."""
    return Perf(input_dist_ms=p.input_dist_ms, lookup_fwd_ms=p.lookup_fwd_ms, output_dist_fwd_ms=p.output_dist_fwd_ms)


def candidate(spec: TableSpec, topo: Topology, stype: ShardingType, num_shards: int,
              inference: bool = False, hot_rows: int = 0) -> Candidate | None:
    """The candidate for one type and shard count, in HBM (with ``hot_rows`` replicated), or None if the table cannot
    be cut so; `tiered` gives its shards other locations."""
    phases = forward_only if inference else (lambda p: p)
    if hot_rows:
        cold, hot = hot_split(spec, hot_rows)
        c = candidate(cold, topo, stype, num_shards, inference)
        if c is None:
            return None
        return replace(c, every_rank=phases(data_parallel_perf(hot, topo, inference, "allreduce")),
                       every_rank_storage=c.every_rank_storage + data_parallel_storage(hot, topo, inference, "allreduce"),
                       hot_rows=hot_rows)
    if stype is ShardingType.DATA_PARALLEL:
        mode, perf = cheaper_data_parallel_mode(spec, topo, inference, with_perf=True)  # what `evaluate` records in the plan
        return Candidate(spec.name, stype, (), (), (), Perf(), phases(perf),
                         data_parallel_storage(spec, topo, inference, mode), data_parallel_mode=mode)
    full_rows, full_cols = [(0, spec.num_embeddings)], [(0, spec.embedding_dim)]
    if stype.splits_rows:
        rows, cols = row_splits(spec.num_embeddings, num_shards), full_cols
    elif stype.splits_cols:
        rows, cols = full_rows, col_splits(spec.embedding_dim, num_shards)
    else:
        assert num_shards == 1
        rows, cols = full_rows, full_cols
    if rows is None or cols is None:
        return None
    shards = _shard_costs(spec, topo, stype, tuple(rows), tuple(cols), num_shards, inference)
    return Candidate(spec.name, stype, tuple(rows), tuple(cols), shards, phases(requester_perf(spec, topo, stype, num_shards)),
                     Perf(), requester_storage(spec, topo, inference))


def _shard_costs(spec: TableSpec, topo: Topology, stype: ShardingType, rows: tuple, cols: tuple, num_shards: int,
                 inference: bool) -> tuple[ShardCost, ...]:
    """Each block's cost and storage in HBM (equal-sized blocks cost the same: computed once)."""
    phases = forward_only if inference else (lambda p: p)
    heights, widths = [n for _, n in rows], [d for _, d in cols]
    costed: dict[tuple[int, int], ShardCost] = {}
    for n in set(heights):  # a row split has at most two block heights: the per-shard work is in C (product, map)
        for d in set(widths):
            perf = holder_perf(spec, topo, stype, n, d, num_shards)
            costed[(n, d)] = ShardCost(phases(perf), holder_storage(spec, topo, stype, n, d, inference))
    return tuple(map(costed.__getitem__, product(heights, widths)))


TIERS = [(Location.UVM_CACHE, f) for f in CACHE_FRACTIONS] + [(Location.HOST, 0.0)]  # (location, cache fraction) offered


def _tier_shard_costs(spec: TableSpec, topo: Topology, c: Candidate, inference: bool) -> list[tuple[ShardCost, ...]]:
    """Per tier of TIERS, the blocks of c (in HBM) there: whose perf only the lookup changes (`relocated_perfs`,
    each block's once for all tiers), and their storage."""
    phases = forward_only if inference else (lambda p: p)
    heights, widths = [n for _, n in c.row_spans], [d for _, d in c.col_spans]
    blocks = list(product(heights, widths))
    in_hbm = dict(zip(blocks, c.shards))
    costed: list[dict[tuple[int, int], ShardCost]] = [{} for _ in TIERS]
    for n in set(heights):
        located = [(location, cache_rows(n, fraction) if location is Location.UVM_CACHE else 0) for location, fraction in TIERS]
        for d in set(widths):
            perfs = relocated_perfs(in_hbm[(n, d)].perf, spec, topo, n, d, located)
            for tier, perf, (location, cached) in zip(costed, perfs, located):
                tier[(n, d)] = ShardCost(phases(perf), holder_storage(spec, topo, c.sharding_type, n, d, inference, location, cached))
    return [tuple(map(tier.__getitem__, blocks)) for tier in costed]


def tiered(cands: list[Candidate], spec: TableSpec, topo: Topology, inference: bool = False) -> list[Candidate]:
    """cands, then each sharded one again with each cache size of CACHE_FRACTIONS and in host memory (TIERS; the
    same blocks and requester side: only the shards' costs and storage depend on the location)."""
    out = list(cands)
    for c in cands:
        if c.sharding_type is ShardingType.DATA_PARALLEL or c.hot_rows:  # hot replicas are offered in HBM only
            continue
        for (location, fraction), shards in zip(TIERS, _tier_shard_costs(spec, topo, c, inference)):
            out.append(replace(c, shards=shards, location=location, cache_fraction=fraction))
    return out


def enumerate_candidates(spec: TableSpec, topo: Topology, constraint: TableConstraint, splits: bool = True,
                         torchrec_compatible: bool = False, inference: bool = False,
                         max_row_shards: int | None = None, tiers: bool = False, hot_rows: bool = False,
                         table_wise: Candidate | None = None) -> list[Candidate]:
    """Candidates the constraint allows; with splits=False only data_parallel and table_wise;
    row_wise into at most max_row_shards blocks (None: up to all allowed ranks); with tiers
    each sharded layout also in host memory and cached (`tiered`); hot_rows: each
    sharded layout also with each hot set of `hot_row_counts` (not with replicated data-parallel
    look-ups in training: the runtime trains hot replicas by all-reduce only), in HBM.

    torchrec_compatible keeps to layouts TorchRec's runtime can express: row_wise over all
    ranks and table_row_wise over a whole host. table_wise: this table's `candidate` for
    table_wise in HBM when already priced (search.problem prices it first), reused as it is.
    """
    allowed = set(constraint.sharding_types)
    if not splits:
        allowed &= {ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE}
    ranks = constraint.ranks if constraint.ranks is not None else range(topo.world_size)
    if constraint.ranks is None:  # every host whole
        in_host_limit = topo.local_world_size
    else:
        per_host: dict[int, int] = {}
        for r in ranks:
            per_host[topo.host_of(r)] = per_host.get(topo.host_of(r), 0) + 1
        in_host_limit = max(per_host.values())
    multi_host = topo.num_hosts > 1
    host_types_needed = not (allowed - {ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE})
    specs: list[tuple[ShardingType, int]] = []
    for stype in ShardingType:
        if stype not in allowed:
            continue
        if stype is ShardingType.DATA_PARALLEL:
            if constraint.ranks is None:
                specs.append((stype, 1))
        elif stype is ShardingType.TABLE_WISE:
            specs.append((stype, 1))
        elif stype is ShardingType.ROW_WISE:
            specs += [(stype, k) for k in _counts(len(ranks)) if (not torchrec_compatible or k == topo.world_size)
                      and (max_row_shards is None or k <= max_row_shards)]
        elif stype is ShardingType.COLUMN_WISE:
            specs += [(stype, k) for k in _counts(min(len(ranks), spec.embedding_dim // 4))]
        elif multi_host or host_types_needed:
            limit = in_host_limit if stype is ShardingType.TABLE_ROW_WISE else min(in_host_limit, spec.embedding_dim // 4)
            whole_host_only = torchrec_compatible and stype is ShardingType.TABLE_ROW_WISE
            specs += [(stype, k) for k in _counts(limit) if not whole_host_only or k == topo.local_world_size]
    hot_counts = hot_row_counts(spec) if hot_rows and not torchrec_compatible and \
        (inference or not topo.replicated_dp_lookup) else [0]
    cands = [c for stype, k in specs for h in (hot_counts if stype is not ShardingType.DATA_PARALLEL else [0])
             if (c := table_wise if table_wise is not None and stype is ShardingType.TABLE_WISE and not h
                 else candidate(spec, topo, stype, k, inference, hot_rows=h)) is not None]
    return tiered(cands, spec, topo, inference) if tiers else cands

