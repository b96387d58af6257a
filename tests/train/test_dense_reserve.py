"""The train app plans with its dense layers' memory reserved on every rank (train/planning.py,
embshard/planner/cost/dense.py): adam's state whole, or divided over the ranks with
``optim.sharded_update=true``."""

from __future__ import annotations

from embshard.train.planning import planning_topology
from test_config import settings

BIG_MLP = ["model.bottom_mlp=[2048,2048,16]", "model.top_mlp=[2048,2048,1]", "optim=adam", "launcher.nproc=4",
           "topology.hbm_gib=0.25"]


def test_the_plan_reserves_the_dense_layers_and_a_sharded_update_divides_their_state() -> None:
    plain, sharded = settings(BIG_MLP), settings([*BIG_MLP, "optim.sharded_update=true"])
    assert plain.topology.world_size == 4
    reserved = planning_topology(plain).reserved_bytes
    reserved_sharded = planning_topology(sharded).reserved_bytes
    # 9.2M dense parameters: weights + gradients 73.7 MB on every rank, adam's two moments 73.7 MB more; sharded,
    # the fullest rank keeps the moments of one 2048 x 2048 matrix (33.6 MB: ZeroRedundancyOptimizer splits whole
    # parameters), not a quarter of all
    assert plain.topology.reserved_bytes < reserved_sharded < reserved
    assert 145e6 < reserved < 150e6 and 105e6 < reserved_sharded < 110e6, (reserved, reserved_sharded)
    small = settings(["launcher.nproc=4"])  # the default model: the reserved fraction's share already covers it
    assert planning_topology(small) == small.topology
