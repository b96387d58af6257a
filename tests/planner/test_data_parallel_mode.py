"""The planner prices both data-parallel modes per table and records the cheaper one in the plan."""

from dataclasses import replace

from embshard.planner import ShardingPlan, evaluate, manual_plan, plan
from embshard.planner.cost.perf import data_parallel_perf
from embshard.planner.types import ShardingType
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology

TOPO = Topology(world_size=2, local_world_size=2, hbm_gib=4, device="cpu", batch_size_per_rank=2048)
# A large table: its whole-table gradient all-reduce costs more than shipping ids; a tiny one: the reverse.
BIG, TINY = TableSpec("big", 200_000, 64, 20.0), TableSpec("tiny", 100, 16, 2.0)
DP = {"big": ("data_parallel", ()), "tiny": ("data_parallel", ())}


def _ms(spec: TableSpec, mode: str) -> float:
    return data_parallel_perf(spec, TOPO, False, mode).total_ms


def test_each_table_gets_its_cheaper_mode_and_is_priced_so():
    assert _ms(BIG, "replicated_lookup") < _ms(BIG, "allreduce") and _ms(TINY, "allreduce") < _ms(TINY, "replicated_lookup")
    p = manual_plan([BIG, TINY], TOPO, DP)
    assert {t.name: t.data_parallel_mode for t in p.tables} == {"big": "replicated_lookup", "tiny": "allreduce"}
    cheapest = sum(min(_ms(s, m) for m in DATA_PARALLEL_MODES) for s in (BIG, TINY))
    assert abs(p.ranks[0].perf.total_ms - cheapest) < 1e-9
    assert ShardingPlan.from_json(p.to_json()) == p


def test_a_recorded_mode_is_kept_and_priced():
    p = manual_plan([BIG, TINY], TOPO, DP)
    forced = [replace(t, data_parallel_mode="allreduce") for t in p.tables]
    q = evaluate([BIG, TINY], TOPO, forced)
    assert [t.data_parallel_mode for t in q.tables] == ["allreduce", "allreduce"]
    assert abs(q.ranks[0].perf.total_ms - _ms(BIG, "allreduce") - _ms(TINY, "allreduce")) < 1e-9


def test_the_search_records_the_mode_it_priced():
    tables = [replace(TINY, name=f"tiny{i}", feature_names=(f"f{i}",)) for i in range(3)]
    p = plan(tables, TOPO, time_budget_s=1)
    dp = [t for t in p.tables if t.sharding_type is ShardingType.DATA_PARALLEL]
    assert dp and all(t.data_parallel_mode == "allreduce" for t in dp)
