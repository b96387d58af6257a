"""The planner's choice of hot-row replication: priced per table and hot fraction, kept at 0 where it does not pay."""

import dataclasses
import json

import pytest

from embshard.planner import ShardingPlan, plan
from embshard.planner.api import evaluate
from embshard.planner.cost.hot_rows import hot_row_counts, hot_split, lookup_share
from embshard.planner.cost.traffic import allreduce_exchange_floats
from embshard.specs import TableSpec
from embshard.topology import Topology

SKEWED = ((0.001, 0.3), (0.01, 0.6), (0.1, 0.9), (0.5, 0.99))
UNIFORM = ((0.001, 0.001), (0.01, 0.01), (0.1, 0.1), (0.5, 0.5))
SPECS = [TableSpec("skewed", 1_000_000, 64, pooled=False, pooling_factor=20, hot_rows=SKEWED),
         TableSpec("uniform", 1_000_000, 64, pooled=False, pooling_factor=20, hot_rows=UNIFORM)]
TOPO = Topology(world_size=8, local_world_size=4, hbm_gib=16)


def test_lookup_share_follows_the_measured_curve():
    spec = SPECS[0]
    assert lookup_share(spec, 1000) == pytest.approx(0.3)
    assert lookup_share(spec, 5000) == pytest.approx(0.3 + 0.3 * 4 / 9)  # linear between 0.1% and 1%
    assert lookup_share(spec, 500) == pytest.approx(0.15)  # from (0, 0)
    assert lookup_share(dataclasses.replace(spec, hot_rows=None), 1000) == pytest.approx(0.001)  # no curve: uniform
    cold, hot = hot_split(spec, 1000)
    assert (cold.pooling_factor, hot.pooling_factor, hot.num_embeddings) == pytest.approx((14.0, 6.0, 1000))
    assert allreduce_exchange_floats(hot, TOPO) == 1000 * 64  # every hot row looked up: the whole gradient
    sharded = dataclasses.replace(TOPO, sharded_dp_update=True)
    assert allreduce_exchange_floats(dataclasses.replace(hot, optimizer="adam"), sharded) == 1000 * 65  # and adam's counts
    assert hot_row_counts(spec) == [0, 1000, 10_000, 50_000] and hot_row_counts(dataclasses.replace(spec, hot_rows=None)) == [0]


@pytest.mark.parametrize("calibrated", [False, True])
def test_planner_replicates_hot_rows_of_the_skewed_table_only(calibrated):
    topo = dataclasses.replace(TOPO, lookup_fwd_call_ms=0.01, collective_ms=0.001) if calibrated else TOPO
    hot = plan(SPECS, topo, time_budget_s=2, hot_ids_file="/data/hot_ids.npz")
    chosen = {t.name: t.hot_rows for t in hot.tables}
    assert chosen["skewed"] > 0 and chosen["uniform"] == 0
    without = plan(SPECS, topo, time_budget_s=2)
    assert all(t.hot_rows == 0 for t in without.tables) and without.hot_ids_file == ""
    assert hot.max_rank_ms < without.max_rank_ms
    assert ShardingPlan.from_json(hot.to_json()) == hot and json.loads(hot.to_json())["hot_ids_file"] == "/data/hot_ids.npz"


def test_replication_is_priced_against_the_gradient_exchange():
    """On a slow interconnect the all-reduce of the replica outweighs the traffic it saves for a pooled table."""
    pooled = [dataclasses.replace(SPECS[0], name="pooled", pooled=True, pooling_factor=1)]
    p = plan(pooled, TOPO, time_budget_s=1, hot_ids_file="/data/hot_ids.npz")
    assert p.tables[0].hot_rows == 0


def test_hot_rows_without_a_hot_ids_file_are_rejected():
    hot = plan(SPECS, TOPO, time_budget_s=1, hot_ids_file="/data/hot_ids.npz")
    with pytest.raises(ValueError, match="no hot_ids_file names their hot ids"):
        evaluate(SPECS, TOPO, hot.tables)
