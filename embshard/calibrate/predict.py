"""Per-rank predicted time of a plan's placements, with every calibrated term.

`predict_ranks` scores placements exactly as `embshard.planner.evaluate` does (same
holder_perf / requester_perf / data_parallel_perf per shard and table), and then combines
them with `embshard.planner.cost.perf.rank_perf` and `fixed_perf`: half-duplex all-to-all
phases (``topology.full_duplex`` false) add the holder and requester sides instead of taking
their max, and each rank pays its fixed per-step costs. For a full-duplex topology without
fixed costs the result equals evaluate()'s per-rank perf (tests/calibrate check it).
"""

from __future__ import annotations

from typing import Sequence

from embshard.planner.cost.perf import data_parallel_perf, fixed_perf, holder_perf, num_kernel_calls, rank_perf, requester_perf
from embshard.planner.plan import TablePlacement
from embshard.planner.types import Perf, ShardingType
from embshard.specs import TableSpec
from embshard.topology import Topology


def predict_ranks(specs: Sequence[TableSpec], topology: Topology, placements: Sequence[TablePlacement]) -> list[Perf]:
    """Predicted Perf of every rank (index = rank)."""
    by_name = {s.name: s for s in specs}
    W = topology.world_size
    held, requester, every = [Perf()] * W, Perf(), Perf()
    for t in placements:
        spec = by_name[t.name]
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            every = every + data_parallel_perf(spec, topology)
            continue
        k = len(t.shards)
        requester = requester + requester_perf(spec, topology, t.sharding_type, k)
        for s in t.shards:
            held[s.rank] = held[s.rank] + holder_perf(spec, topology, t.sharding_type, s.num_rows, s.num_cols, k)
    num_collections = len({s.pooled for s in specs})
    return [rank_perf(held[r], requester, every, fixed_perf(topology, num_collections, num_kernel_calls(specs, placements, r)), topology)
            for r in range(W)]
