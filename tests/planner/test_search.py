"""Planner search: exact placements on tiny topologies, memory caps, constraints, bounds."""

import time

import pytest

from embshard.planner import Constraints, ShardingType, TableConstraint, manual_plan, plan
from embshard.planner.search.bound import lower_bound_ms
from embshard.planner.search.greedy import default_order, greedy
from embshard.planner.search.ilp import improve_with_ilp
from embshard.planner.search.problem import build_problem
from embshard.specs import TableSpec
from embshard.topology import GIB, Topology
from embshard.workloads import generate_tables

TW_ONLY = TableConstraint(sharding_types=(ShardingType.TABLE_WISE,))


def _tw_only(specs):
    return Constraints(tables={s.name: TW_ONLY for s in specs})


def test_lpt_placement_exact_on_two_ranks():
    # lookup cost is proportional to the pooling factor: 4+1 | 3+2 is the only balanced split
    specs = [TableSpec(f"t{p}", 1000, 64, pooling_factor=float(p) * 10) for p in (4, 3, 2, 1)]
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=8)
    p = plan(specs, topo, _tw_only(specs), time_budget_s=5)
    rank = {t.name: t.shards[0].rank for t in p.tables}
    assert rank["t4"] == rank["t1"] and rank["t3"] == rank["t2"] and rank["t4"] != rank["t3"]
    assert all(t.sharding_type is ShardingType.TABLE_WISE for t in p.tables)


def test_table_larger_than_a_rank_is_split_and_every_rank_fits():
    big = TableSpec("big", 6_000_000, 128)  # ~2.9 GiB of fp32 weights
    small = [TableSpec(f"s{i}", 10_000, 64) for i in range(6)]
    topo = Topology(world_size=4, local_world_size=4, hbm_gib=2.0)
    p = plan([big, *small], topo, time_budget_s=5)
    placement = p.placement("big")
    assert placement.sharding_type in (ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE)
    assert len(placement.shards) >= 2
    assert sum(s.num_rows * s.num_cols for s in placement.shards) == 6_000_000 * 128
    for r in p.ranks:
        assert r.storage.total_bytes <= topo.shard_memory_cap_bytes


def test_lower_bound_below_objective_and_ilp_closes_small_gap():
    specs = [TableSpec(f"t{i}", 50_000 * (i + 1), 64, pooling_factor=2.0 + i) for i in range(6)]
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=16)
    p = plan(specs, topo, time_budget_s=10, use_ilp=True)
    assert 0 < p.lower_bound_ms <= p.max_rank_ms * (1 + 1e-9)
    assert p.gap < 0.05


def test_ilp_improves_a_poor_plan_and_bounds_it():
    specs = tuple(TableSpec(f"t{i}", 50_000 * (i + 1), 64, pooling_factor=2.0 + 3 * i) for i in range(6))
    problem = build_problem(specs, Topology(world_size=2, local_world_size=2, hbm_gib=16), _tw_only(specs))
    poor = greedy(problem, list(range(len(specs))))  # smallest first: a bad order for LPT
    poor_max = max(poor.costs())
    improved, bound, note = improve_with_ilp(problem, poor, time.perf_counter() + 20)
    assert improved is not None and "improved" in note
    best = max(improved.costs())
    assert best < poor_max
    assert lower_bound_ms(problem) - 1e-9 <= bound <= best * (1 + 1e-6)


def test_search_beats_greedy_bin_packing():
    specs = generate_tables(150, seed=3)
    sizes = [s.num_embeddings * s.embedding_dim * s.element_bytes for s in specs]
    topo = Topology(world_size=16, local_world_size=8, hbm_gib=round(max(sum(sizes) * 2.5 / 16, max(sizes) * 2) / GIB, 1))
    ours = plan(specs, topo, time_budget_s=5, use_ilp=False)
    # the classic baseline: table-wise, largest table first onto the least-loaded rank
    baseline_problem = build_problem(tuple(specs), topo, _tw_only(specs))
    base_state = greedy(baseline_problem, default_order(baseline_problem))
    assert ours.max_rank_ms < max(base_state.costs()) * 0.95


def test_objective_is_the_slowest_rank_of_the_report():
    specs = generate_tables(40, seed=1)
    topo = Topology(world_size=8, local_world_size=4, hbm_gib=64)
    p = plan(specs, topo, time_budget_s=3)
    assert p.max_rank_ms == max(r.perf.total_ms for r in p.ranks)
    phases = p.ranks[0].perf.to_dict()
    assert phases["total_ms"] == pytest.approx(sum(v for k, v in phases.items() if k != "total_ms"))


def test_constraints_are_respected():
    specs = [TableSpec(f"t{i}", 20_000, 32, pooling_factor=5.0) for i in range(8)]
    topo = Topology(world_size=4, local_world_size=2, hbm_gib=8)
    constraints = Constraints(
        tables={"t0": TableConstraint(sharding_types=(ShardingType.ROW_WISE,)), "t1": TableConstraint(ranks=(3,))},
        keep_together=(("t2", "t3"),),
    )
    p = plan(specs, topo, constraints, time_budget_s=3)
    assert p.placement("t0").sharding_type is ShardingType.ROW_WISE
    assert set(p.placement("t1").ranks) <= {3}
    assert p.placement("t2").sharding_type is ShardingType.TABLE_WISE
    assert p.placement("t2").ranks == p.placement("t3").ranks


def test_host_bound_types_stay_in_one_host():
    spec = TableSpec("t", 1_000_003, 64, pooling_factor=20.0)
    topo = Topology(world_size=8, local_world_size=4, hbm_gib=8)
    for stype in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
        p = plan([spec], topo, Constraints(tables={"t": TableConstraint(sharding_types=(stype,))}), time_budget_s=2)
        hosts = {topo.host_of(r) for r in p.placement("t").ranks}
        assert len(hosts) == 1 and len(p.placement("t").shards) >= 2


def test_manual_plan_uneven_rows_and_column_widths():
    specs = [TableSpec("rows", 10, 8), TableSpec("cols", 7, 100)]
    topo = Topology(world_size=3, local_world_size=3, hbm_gib=1)
    p = manual_plan(specs, topo, {"rows": ("row_wise", [2, 0, 1]), "cols": (ShardingType.COLUMN_WISE, [0, 1, 2])})
    rows = p.placement("rows").shards
    assert [(s.rank, s.row_offset, s.num_rows) for s in rows] == [(2, 0, 4), (0, 4, 4), (1, 8, 2)]
    widths = [s.num_cols for s in p.placement("cols").shards]
    assert widths == [36, 32, 32] and all(w % 4 == 0 for w in widths)
    with pytest.raises(ValueError, match="rows: 5 rows cannot be cut into 4"):
        manual_plan([TableSpec("rows", 5, 8)], Topology(world_size=4, local_world_size=4, hbm_gib=1), {"rows": ("row_wise", [0, 1, 2, 3])})


def test_data_parallel_lists_a_full_shard_per_rank():
    specs = [TableSpec("tiny", 16, 8, pooling_factor=30.0)]
    topo = Topology(world_size=4, local_world_size=2, hbm_gib=4)
    p = manual_plan(specs, topo, {"tiny": ("data_parallel", [])})
    t = p.placement("tiny")
    assert sorted(t.ranks) == [0, 1, 2, 3] and all(s.num_rows == 16 and s.num_cols == 8 for s in t.shards)
    assert t.compute_kernel == "dense"


def test_856_tables_on_128_ranks_plans_within_budget():
    specs = generate_tables(856, seed=0)
    total = sum(s.num_embeddings * s.embedding_dim * s.element_bytes for s in specs)
    topo = Topology(world_size=128, local_world_size=8, hbm_gib=round(total * 1.6 / 128 / GIB, 1))
    p = plan(specs, topo, time_budget_s=10)
    assert p.search["wall_s"] < 60
    assert len(p.tables) == 856
    assert all(r.storage.total_bytes <= topo.shard_memory_cap_bytes for r in p.ranks)
    assert p.lower_bound_ms <= p.max_rank_ms


def test_torchrec_compatible_layouts_export():
    pytest.importorskip("torchrec", reason="TorchRec export needs the torch layer (the core's wheel test runs without it)")
    from embshard.interop.torchrec import to_torchrec_plan

    specs = generate_tables(60, seed=5)
    sizes = [s.num_embeddings * s.embedding_dim * s.element_bytes for s in specs]
    topo = Topology(world_size=16, local_world_size=8, hbm_gib=round(sum(sizes) * 1.6 / 16 / GIB, 1))
    p = plan(specs, topo, time_budget_s=3, torchrec_compatible=True)
    for t in p.tables:
        if t.sharding_type is ShardingType.ROW_WISE:
            assert len(t.shards) == 16
        if t.sharding_type is ShardingType.TABLE_ROW_WISE:
            assert len(t.shards) == 8
    assert set(to_torchrec_plan(p, "ebc").plan["ebc"]) == {s.name for s in specs}


def test_row_wise_partial_sums_are_reduced_inside_a_host_first():
    from embshard.planner.cost.perf import holder_perf

    spec = TableSpec("t", 1_000_000, 128, pooling_factor=4.0)
    topo = Topology(world_size=16, local_world_size=8, hbm_gib=8)
    rows = 1_000_000 // 16
    rw_all = holder_perf(spec, topo, ShardingType.ROW_WISE, rows, 128, 16)  # 8 shards per host
    rw_spread = holder_perf(spec, topo, ShardingType.ROW_WISE, rows, 128, 2)  # one per host
    twrw = holder_perf(spec, topo, ShardingType.TABLE_ROW_WISE, rows, 128, 8)
    assert rw_all.output_dist_fwd_ms == pytest.approx(twrw.output_dist_fwd_ms)
    assert rw_all.output_dist_fwd_ms < rw_spread.output_dist_fwd_ms / 2
    seq = TableSpec("s", 1_000_000, 128, pooling_factor=4.0, pooled=False)
    # sequence rows are not summed: nothing to reduce, each id's row travels once
    assert holder_perf(seq, topo, ShardingType.ROW_WISE, rows, 128, 16).output_dist_fwd_ms < rw_all.output_dist_fwd_ms
