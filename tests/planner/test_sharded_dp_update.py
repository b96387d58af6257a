"""Sharded weight updates of data-parallel tables (``topology.sharded_dp_update``) in the planner: each rank
counts the optimizer state of its piece of an all-reduce table's rows, and plan files carry the flag."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from embshard.planner import evaluate, manual_plan
from embshard.planner.plan import SCHEMA_VERSION, ShardingPlan
from embshard.specs import TableSpec
from embshard.topology import Topology

SPECS = [TableSpec("adam_dp", 1000, 16, optimizer="adam"), TableSpec("row_dp", 301, 8, optimizer="rowwise_adagrad"),
         TableSpec("sharded", 500, 8, optimizer="adam")]
LAYOUT = {"adam_dp": ("data_parallel", ()), "row_dp": ("data_parallel", ()), "sharded": ("table_wise", (0,))}
V7_FILE = Path(__file__).parent / "data" / "plan_v7_dp.json"  # written by main's embshard at 2f330bc (schema 7)


def _plans(mode: str) -> tuple[ShardingPlan, ShardingPlan]:
    """The same placements with every data-parallel table in ``mode``: without and with sharded updates."""
    topo = Topology(world_size=3, local_world_size=3, hbm_gib=1, batch_size_per_rank=8, device="cpu")
    placements = [dataclasses.replace(t, data_parallel_mode=mode if t.data_parallel_mode else None)
                  for t in manual_plan(SPECS, topo, LAYOUT).tables]
    return tuple(evaluate(SPECS, dataclasses.replace(topo, sharded_dp_update=s), placements) for s in (False, True))


def test_each_rank_counts_its_piece_of_an_allreduce_tables_optimizer_state():
    plain, sharded = _plans("allreduce")
    # adam: 2 x 16 floats per row, 1000 rows -> rank 0's piece 334; rowwise_adagrad: 1 float, 301 rows -> 101
    for r in range(3):
        saved = plain.ranks[r].storage.optimizer_bytes - sharded.ranks[r].storage.optimizer_bytes
        assert saved == 4 * (2 * 16 * (1000 - 334) + (301 - 101))
        # the reduce-scatter's second gradient buffer: N x D fp32 of every all-reduce table
        assert sharded.ranks[r].storage.io_bytes - plain.ranks[r].storage.io_bytes == 4 * (1000 * 16 + 301 * 8)
        # each rank updates 1/W of the rows (the same bytes on the wire in fp32: a reduce-scatter and an all-gather)
        assert sharded.ranks[r].perf.lookup_bwd_ms < plain.ranks[r].perf.lookup_bwd_ms
        assert sharded.ranks[r].perf.dp_allreduce_ms == plain.ranks[r].perf.dp_allreduce_ms


def test_replicated_lookup_tables_keep_their_whole_state():
    plain, sharded = _plans("replicated_lookup")  # the fused kernel updates every row on every rank
    assert [r.storage for r in sharded.ranks] == [r.storage for r in plain.ranks]


def test_plan_files_carry_the_flag_and_version_7_loads_without_it():
    plain, sharded = _plans("allreduce")
    raw = json.loads(sharded.to_json())
    assert raw["schema_version"] == SCHEMA_VERSION == 13 and raw["topology"]["sharded_dp_update"] is True
    assert ShardingPlan.from_json(sharded.to_json()) == sharded
    plain_raw = json.loads(plain.to_json())
    assert "sharded_dp_update" not in plain_raw["topology"]  # absent when false: topologies hash as before
    v7 = json.loads(V7_FILE.read_text())
    assert v7["schema_version"] == 7
    p = ShardingPlan.load(V7_FILE)
    assert p.topology.sharded_dp_update is False and p.input_hash == v7["input_hash"]
    assert {t.name: t.data_parallel_mode for t in p.tables} == {t["name"]: t.get("data_parallel_mode") for t in v7["tables"]}
