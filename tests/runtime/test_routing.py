"""Single-process checks of the runtime's pure parts: routing from a plan, plan checks, assembly."""

from __future__ import annotations

import pytest
import torch

from embshard.planner import plan
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.types import COMPUTE_KERNEL, Shard, ShardingType
from embshard.runtime.routing import build_routing, check_plan
from embshard.runtime.state import TableShard, assemble
from embshard.specs import TableSpec
from embshard.topology import Topology

ST = ShardingType
TOPO = Topology(world_size=3, local_world_size=3, device="cpu")
SPECS = (
    TableSpec("rw", 100, 8, feature_names=("f1", "f2"), optimizer="sgd"),
    TableSpec("tw", 30, 12, feature_names=("g",), optimizer="sgd"),
    TableSpec("dp", 10, 6, feature_names=("h",), optimizer="adagrad"),
)


def plan_of(tables: list[tuple[str, ShardingType, list[Shard]]], specs=SPECS) -> ShardingPlan:
    placements = tuple(TablePlacement(n, t, COMPUTE_KERNEL[t], tuple(s)) for n, t, s in tables)
    return ShardingPlan(tables=placements, specs=tuple(specs), topology=TOPO, ranks=(), lower_bound_ms=0.0, input_hash="")


PLAN = plan_of([
    ("rw", ST.ROW_WISE, [Shard(2, 0, 13, 0, 8), Shard(0, 13, 60, 0, 8), Shard(1, 73, 27, 0, 8)]),
    ("tw", ST.TABLE_WISE, [Shard(1, 0, 30, 0, 12)]),
    ("dp", ST.DATA_PARALLEL, [Shard(r, 0, 10, 0, 6) for r in range(3)]),
])


def test_row_blocks_bucketize_by_offset_not_rank() -> None:
    routing = build_routing(SPECS, PLAN, 1, 3, True, {}, frozenset({"sgd", "adagrad", "rowwise_adagrad"}))
    assert routing.num_buckets == 3
    assert routing.bucket_bounds[0] == (0, 13, 73, 100)  # f1: blocks sorted by row offset
    assert routing.bucket_bounds[2] == (0, 30, 30, 30)  # g (table-wise): one bucket
    by_rank = {r: [(s.feature, s.bucket, s.row_offset) for s in slots] for r, slots in enumerate(routing.slots_by_rank)}
    assert by_rank[2] == [(0, 0, 0), (1, 0, 0)]
    assert by_rank[0] == [(0, 1, 13), (1, 1, 13)]
    assert sorted(by_rank[1]) == [(0, 2, 73), (1, 2, 73), (2, 0, 0)]
    # One FBGEMM kernel on rank 1 serves both tables (same optimizer), both of f1/f2's slots read block 0.
    (kernel,) = routing.kernels
    assert [b.table for b in kernel.blocks] == ["rw", "tw"] and kernel.slot_block == (0, 0, 1)
    # The 6-wide data-parallel table is replicated: one slot per rank, looked up by the torch kernel.
    assert [len(s) for s in routing.replicas.slots_by_rank] == [1, 1, 1]
    assert [k.impl for k in routing.replicas.kernels] == ["torch"]


def test_any_width_runs_fbgemm_where_it_can_and_the_torch_kernel_elsewhere() -> None:
    """Column blocks of 6 + 6 and of 4 + 8 (tw, 12 wide), a 6-wide replica: every width has a kernel."""
    for cuts, impls in (([(0, 6), (6, 6)], {1: ["torch"], 2: ["torch"]}), ([(0, 4), (4, 8)], {1: ["fbgemm"], 2: ["fbgemm"]})):
        plan = plan_of([
            ("rw", ST.ROW_WISE, [Shard(2, 0, 13, 0, 8), Shard(0, 13, 60, 0, 8), Shard(1, 73, 27, 0, 8)]),
            ("tw", ST.COLUMN_WISE, [Shard(r, 0, 30, co, n) for r, (co, n) in zip((1, 2), cuts)]),
            ("dp", ST.DATA_PARALLEL, [Shard(r, 0, 10, 0, 6) for r in range(3)]),
        ])
        check_plan(SPECS, plan, 3, True, "test")
        for rank, expected in impls.items():
            routing = build_routing(SPECS, plan, rank, 3, True, {}, frozenset({"sgd", "adagrad", "rowwise_adagrad"}))
            tw_kernels = [k.impl for k in routing.kernels if any(b.table == "tw" for b in k.blocks)]
            assert tw_kernels == expected


def test_the_planner_never_plans_a_width_the_runtime_refuses() -> None:
    """The issue's 10M x 3 table (and a 6-wide one), too big for one rank: planned row-wise, and accepted."""
    topo = Topology(world_size=2, local_world_size=2, device="cpu", hbm_gib=0.12, batch_size_per_rank=64)
    specs = [TableSpec("big", 10_000_000, 3, feature_names=("f",)), TableSpec("six", 1000, 6, feature_names=("g",))]
    planned = plan(specs, topo, time_budget_s=1.0)
    assert planned.placement("big").sharding_type is ST.ROW_WISE
    check_plan(specs, planned, 2, True, "test")
    for rank in range(2):
        routing = build_routing(specs, planned, rank, 2, True, {}, frozenset({"sgd", "adagrad", "rowwise_adagrad"}))
        assert {k.impl for k in routing.kernels} == {"torch"}


def test_check_plan_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="'tw'.num_embeddings is 31 but the plan has 30"):
        check_plan([SPECS[0], TableSpec("tw", 31, 12, feature_names=("g",)), SPECS[2]], PLAN, 3, True, "test")
    with pytest.raises(ValueError, match="plan is for 3 ranks but the process group has 2"):
        check_plan(SPECS, PLAN, 2, True, "test")
    with pytest.raises(ValueError, match="'rw' is a pooled table"):
        check_plan(SPECS, PLAN, 3, False, "test")


def test_assemble_reassembles_and_rejects_gaps() -> None:
    full = torch.arange(40.0).view(10, 4)
    shards = [TableShard("t", full[r:r + 5].clone(), r, 0, (10, 4), "sgd") for r in (0, 5)]
    assert torch.equal(assemble(shards), full)
    with pytest.raises(ValueError, match="do not cover"):
        assemble(shards[:1])
