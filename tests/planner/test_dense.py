"""The dense layers' memory per rank (embshard/planner/cost/dense.py): optimizer state divided over
the ranks under a sharded update, ZeroRedundancyOptimizer's partition, and the reservation the
planner keeps (a plan that fits only when the update is sharded)."""

from __future__ import annotations

import pytest

from embshard import planner
from embshard.planner import PlanInfeasibleError
from embshard.planner.cost.dense import dense_bytes_per_rank, reserve_dense, state_floats, zero_shares
from embshard.planner.types import Constraints, ShardingType, TableConstraint
from embshard.specs import TableSpec
from embshard.topology import GIB, Topology


def test_zero_partition_assigns_largest_first_to_the_emptiest_rank() -> None:
    assert zero_shares([3, 10, 1, 7, 5], 2) == [13, 13]  # 10 -> r0, 7 -> r1, 5 -> r1, 3 -> r0, 1 -> r1
    assert zero_shares([4, 4, 4, 4, 4, 4, 4, 4], 4) == [8, 8, 8, 8]
    assert zero_shares([9, 1, 1], 2) == [9, 2]  # whole parameters: a big one is one rank's alone


def test_sharded_update_divides_the_optimizer_state_by_the_ranks() -> None:
    numels = [1000] * 8
    assert state_floats("adam") == 2 and state_floats("adagrad") == 1
    assert state_floats("sgd") == 0 and state_floats("sgd", momentum=0.9) == 1
    # weights and gradients on every rank; adam's two moments whole, or a quarter of them on 4 ranks
    assert dense_bytes_per_rank(numels, 2, 4, sharded_update=False) == 4 * (8000 + 8000 + 16000)
    assert dense_bytes_per_rank(numels, 2, 4, sharded_update=True) == 4 * (8000 + 8000 + 4000)
    assert dense_bytes_per_rank(numels, 2, 1, sharded_update=True) == dense_bytes_per_rank(numels, 2, 1, False)
    with pytest.raises(ValueError, match="one of"):
        state_floats("lamb")


def test_a_plan_fits_beside_the_dense_layers_only_with_a_sharded_update() -> None:
    topo = Topology(world_size=4, local_world_size=4, hbm_gib=1.0, device="cpu", batch_size_per_rank=64,
                    reserved_fraction=0.05)
    specs = [TableSpec(f"t{i}", 3_200_000, 64, 1.0, optimizer="sgd") for i in range(4)]  # 781 MiB each
    only_tw = Constraints(tables={s.name: TableConstraint((ShardingType.TABLE_WISE,)) for s in specs})
    numels = [2 ** 22] * 4  # 16M dense parameters under adam: 256 MiB per rank, 160 MiB with a sharded update
    unsharded = dense_bytes_per_rank(numels, 2, 4, sharded_update=False)
    sharded = dense_bytes_per_rank(numels, 2, 4, sharded_update=True)
    assert (unsharded, sharded) == (256 * 2 ** 20, 160 * 2 ** 20)
    assert reserve_dense(topo, 1000) == topo  # the fraction's share already covers it
    for dense_bytes in (unsharded, sharded):
        assert reserve_dense(topo, dense_bytes).reserved_bytes >= dense_bytes > topo.reserved_bytes
    with pytest.raises(PlanInfeasibleError):
        planner.plan(specs, reserve_dense(topo, unsharded), only_tw, time_budget_s=0.2)
    plan = planner.plan(specs, reserve_dense(topo, sharded), only_tw, time_budget_s=0.2)
    assert sorted(s.rank for t in plan.tables for s in t.shards) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="optim.sharded_update=true"):
        reserve_dense(topo, GIB)  # the whole rank
