"""Memory tiers: host memory and UVM caches in the topology, cost model, search, bound and plan file."""

import itertools
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from embshard.planner import PlanInfeasibleError, ShardingPlan, evaluate, plan
from embshard.planner.plan import SCHEMA_VERSION
from embshard.planner.cost.lookup import expected_distinct_rows, row_bytes
from embshard.planner.cost.perf import ID_BYTES, OUTPUT_BYTES, holder_perf
from embshard.planner.cost.storage import holder_storage, requester_storage
from embshard.planner.cost.tiers import CACHE_FRACTIONS, CACHE_SLOT_BYTES, cache_rows, hit_rate
from embshard.planner.report import chart, rank_table, summary, tiered_tables
from embshard.planner.search.bound import lower_bound_ms
from embshard.planner.search.problem import build_problem
from embshard.planner.search.state import RankState
from embshard.planner.types import Constraints, Location, Shard, ShardingType, TableConstraint
from embshard.specs import TableSpec
from embshard.topology import GIB, Topology

TW = ShardingType.TABLE_WISE
V2_FILE = Path(__file__).parent / "data" / "plan_v2.json"  # written by main's embshard at a549129 (schema version 2)


def test_topology_takes_host_memory_and_bandwidth_and_validates_them():
    t = Topology.from_dict({"world_size": 8, "ddr_gib": 64, "ddr_gb_per_s": 32})
    assert t.host_memory_cap_bytes == 64 * GIB and t.ddr_gb_per_s == 32.0
    assert Topology(world_size=8).ddr_gb_per_s == 25.0 and Topology(world_size=2, device="cpu").ddr_gb_per_s == 10.0
    assert Topology(world_size=8).host_memory_cap_bytes == 0  # default: no host memory for tables, no tiers
    for key, bad in (("ddr_gib", -1), ("ddr_gb_per_s", "fast"), ("ddr_gib", float("nan"))):
        with pytest.raises(ValueError, match=rf"topology\.{key}: must be a number >= 0"):
            Topology.from_dict({"world_size": 8, key: bad})


def test_hit_rate_interpolates_the_hot_rows_curve_and_is_uniform_without_one():
    skewed = TableSpec("t", 1000, 16, hot_rows=((0.01, 0.4), (0.1, 0.8), (0.5, 0.95)))
    assert hit_rate(skewed, 10, 1000) == pytest.approx(0.4)
    assert hit_rate(skewed, 55, 1000) == pytest.approx(0.6)  # halfway between (0.01, 0.4) and (0.1, 0.8)
    assert hit_rate(skewed, 5, 1000) == pytest.approx(0.2)  # between (0, 0) and the first point
    assert hit_rate(skewed, 750, 1000) == pytest.approx(0.975)  # between the last point and (1, 1)
    assert hit_rate(skewed, 1000, 1000) == 1.0
    assert hit_rate(TableSpec("u", 1000, 16), 200, 1000) == pytest.approx(0.2)  # ids uniform over rows


def test_storage_counts_hbm_and_host_memory_apart():
    spec = TableSpec("t", 1_000_000, 64, optimizer="adagrad")
    topo = Topology(world_size=8, ddr_gib=64)
    hbm = holder_storage(spec, topo, TW, 1_000_000, 64)
    cached = holder_storage(spec, topo, TW, 1_000_000, 64, location=Location.UVM_CACHE, num_cache_rows=50_000)
    host = holder_storage(spec, topo, TW, 1_000_000, 64, location=Location.HOST)
    weights, opt = 1_000_000 * 64 * 4, 1_000_000 * 64 * 4
    assert (hbm.weights_bytes, hbm.optimizer_bytes, hbm.host_bytes) == (weights, opt, 0)
    # the cache's rows and slot state in HBM; weights and optimizer state in host memory
    assert cached.weights_bytes == 50_000 * (64 * 4 + CACHE_SLOT_BYTES) and cached.optimizer_bytes == 0
    assert cached.host_bytes == host.host_bytes == weights + opt
    assert host.weights_bytes == host.optimizer_bytes == 0
    assert cached.io_bytes == host.io_bytes == hbm.io_bytes  # buffers stay in HBM


def test_a_cached_lookup_costs_its_misses_at_host_bandwidth():
    spec = TableSpec("t", 1_000_000, 64, pooling_factor=4.0, hot_rows=((0.05, 0.9),))
    topo = Topology(world_size=1, local_world_size=1, ddr_gib=64)
    N, D = 1_000_000, 64
    hbm = holder_perf(spec, topo, TW, N, D, 1)
    cached = holder_perf(spec, topo, TW, N, D, 1, Location.UVM_CACHE, 50_000)
    host = holder_perf(spec, topo, TW, N, D, 1, Location.HOST)
    assert hbm.lookup_fwd_ms < cached.lookup_fwd_ms < host.lookup_fwd_ms
    assert hbm.lookup_bwd_ms < cached.lookup_bwd_ms < host.lookup_bwd_ms
    # forward by hand: the HBM lookup plus each missed distinct row read over the host link and written into the cache
    ids = topo.global_batch_size * 4.0
    misses = 0.1 * expected_distinct_rows(ids, N)
    rb = row_bytes(spec, D)
    assert cached.lookup_fwd_ms == pytest.approx(hbm.lookup_fwd_ms + misses * rb / (topo.hbm_gb_per_s * 1e6)
                                                 + misses * rb / (topo.ddr_gb_per_s * 1e6))
    # host: every looked-up row crosses the host link
    out = topo.global_batch_size * D * OUTPUT_BYTES
    assert host.lookup_fwd_ms == pytest.approx((ids * ID_BYTES + out) / (topo.hbm_gb_per_s * 1e6) + ids * rb / (topo.ddr_gb_per_s * 1e6))
    # a hotter curve at the same cache: fewer misses, cheaper
    hotter = holder_perf(replace(spec, hot_rows=((0.05, 0.99),)), topo, TW, N, D, 1, Location.UVM_CACHE, 50_000)
    assert hotter.lookup_fwd_ms < cached.lookup_fwd_ms and hotter.lookup_bwd_ms < cached.lookup_bwd_ms


def _over_hbm():
    """Four 512 MiB tables on two ranks with 0.9 GiB for shards each: they fit only with host memory."""
    specs = [TableSpec(f"t{i}", 2_000_000, 64, pooling_factor=2.0 + i, hot_rows=((0.01, 0.5), (0.05, 0.8), (0.2, 0.95)))
             for i in range(4)]
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=1.0, batch_size_per_rank=256, ddr_gib=2.0)
    return specs, topo, Constraints(tables={s.name: TableConstraint((TW,)) for s in specs})


def test_tables_over_hbm_plan_with_host_memory_within_both_caps():
    specs, topo, constraints = _over_hbm()
    with pytest.raises(PlanInfeasibleError, match="infeasible"):
        plan(specs, replace(topo, ddr_gib=0.0), constraints, time_budget_s=2)
    p = plan(specs, topo, constraints, time_budget_s=2)
    assert 0 < p.lower_bound_ms <= p.max_rank_ms * (1 + 1e-9)
    for r in p.ranks:
        assert r.storage.total_bytes <= topo.shard_memory_cap_bytes and r.storage.host_bytes <= topo.host_memory_cap_bytes
    tiered = tiered_tables(p)
    assert tiered and sum(r.storage.host_bytes for r in p.ranks) > 0
    for name, where, rows, hit in tiered:
        if where == "uvm_cache":
            assert rows > 0 and hit == pytest.approx(hit_rate(p.spec(name), rows, 2_000_000))
    assert ShardingPlan.from_json(p.to_json()) == p


def test_lower_bound_covers_locations_and_cache_sizes():
    """Brute force over every candidate (location, cache size) and rank of four tables: the LP
    bound is at most the true optimum, and the search reaches it."""
    specs, topo, constraints = _over_hbm()
    problem = build_problem(tuple(specs), topo, constraints)
    assert all(len(u.cands) == 6 for u in problem.units)  # hbm, four cache sizes, host
    best = math.inf
    choices = [[(ci, (r,)) for ci in range(len(u.cands)) for r in range(2)] for u in problem.units]
    for combo in itertools.product(*choices):
        state = RankState(problem)
        for ui, (ci, ranks) in enumerate(combo):
            state.add(ui, ci, ranks)
        if all(state.mem[r] + state.UM <= problem.cap_bytes and state.host[r] <= problem.host_cap_bytes for r in range(2)):
            best = min(best, max(state.costs()))
    bound, exact = lower_bound_ms(problem)
    assert exact and 0 < bound <= best * (1 + 1e-9)
    assert plan(specs, topo, constraints, time_budget_s=5).max_rank_ms == pytest.approx(best, rel=0.02)


def test_skewed_tables_cost_less_out_of_hbm_than_uniform_ones():
    specs, topo, constraints = _over_hbm()
    uniform = plan([replace(s, hot_rows=None) for s in specs], topo, constraints, time_budget_s=2)
    skewed = plan([replace(s, hot_rows=((0.01, 0.97), (0.05, 0.99))) for s in specs], topo, constraints, time_budget_s=2)
    assert skewed.max_rank_ms < uniform.max_rank_ms
    rates = {name: hit for name, where, _, hit in tiered_tables(skewed) if where == "uvm_cache"}
    assert rates and all(hit >= 0.97 for hit in rates.values())
    assert all(hit <= 0.5 + 1e-9 for name, where, _, hit in tiered_tables(uniform) if where == "uvm_cache")


def test_host_and_hbm_shortfalls_are_named_separately():
    specs, topo, _ = _over_hbm()
    six = [replace(specs[0], name=f"t{i}") for i in range(6)]  # 6 x 0.48 GiB on 2 ranks: 1.8 GiB of HBM, 1 GiB of host memory
    with pytest.raises(PlanInfeasibleError) as e:
        plan(six, replace(topo, ddr_gib=0.5), Constraints(tables={s.name: TableConstraint((TW,)) for s in six}), time_budget_s=2)
    text = str(e.value)
    # host memory holds two tables, so HBM must hold the rest (1.9 GiB); HBM holds 3.7 (fractionally), host memory the rest
    assert re.search(r"HBM at least 0\.1 GiB short \(with host memory used to the full they need 1\.9 GiB of it, 2 ranks x 0\.90 GiB = "
                     r"1\.8 GiB left for shards; .*\); host memory at least 0\.1 GiB short \(with HBM used to the full they need 1\.1 GiB "
                     r"of it, 2 ranks x topology\.ddr_gib=0\.5 = 1\.0 GiB\)", text), text
    big = [TableSpec("huge", 50_000_000, 64)]
    with pytest.raises(PlanInfeasibleError, match=r"huge needs 12\.11 GiB on one rank even as TW .*, and kept in host memory 12\.11 GiB of host memory on one rank \(topology\.ddr_gib=1\)"):
        plan(big, Topology(world_size=2, local_world_size=2, hbm_gib=1.0, ddr_gib=1.0),
             Constraints(tables={"huge": TableConstraint((TW,))}), time_budget_s=2)


def _tiered_plan():
    specs, topo, constraints = _over_hbm()
    return plan(specs, topo, constraints, time_budget_s=2)


def test_plan_json_carries_location_and_cache_rows_and_rejects_bad_ones():
    p = _tiered_plan()
    raw = json.loads(p.to_json())
    assert raw["schema_version"] == SCHEMA_VERSION
    shards = [s for t in raw["tables"] for s in t["shards"]]
    assert any(s.get("location") in ("uvm_cache", "host") for s in shards)
    assert all("location" not in s for s in shards if s.get("location", "hbm") == "hbm")
    assert all("host_bytes" in r["memory_bytes"] for r in raw["ranks"])
    cached = next(s for t in raw["tables"] for s in t["shards"] if s.get("location") == "uvm_cache") if any(
        s.get("location") == "uvm_cache" for s in shards) else None
    bad = json.loads(p.to_json())
    entry = next(s for t in bad["tables"] for s in t["shards"])
    entry.update(location="uvm_cache", cache_rows=entry["num_rows"] + 1)
    with pytest.raises(ValueError, match=r"\(t\d\)\.shards\[0\]\.cache_rows: \d+ for a uvm_cache shard of 2000000 rows of table 't\d'"):
        ShardingPlan.from_dict(bad)
    entry.update(location="ssd")
    with pytest.raises(ValueError, match=r"shards\[0\]\.location: unknown location 'ssd'"):
        ShardingPlan.from_dict(bad)
    entry.update(location="host", cache_rows=0)
    bad["topology"]["ddr_gib"] = 0.0
    with pytest.raises(ValueError, match=r"location: host, but topology\.ddr_gib is 0"):
        ShardingPlan.from_dict(bad)
    assert cached is None or cached["cache_rows"] > 0


def test_version_2_file_loads_with_every_shard_in_hbm():
    raw = json.loads(V2_FILE.read_text())
    assert raw["schema_version"] == 2
    p = ShardingPlan.load(V2_FILE)
    assert all(s.location is Location.HBM and s.cache_rows == 0 for t in p.tables for s in t.shards)
    assert all(r.storage.host_bytes == 0 for r in p.ranks) and p.max_rank_ms == raw["objective_ms"]
    again = json.loads(p.to_json())
    assert again["schema_version"] == SCHEMA_VERSION and [t.get("shards") for t in again["tables"]] == [t.get("shards") for t in raw["tables"]]
    # (not re-priced against the file: since schema 5 the model sends int64 lengths, 8 bytes, as the runtime does)


def test_report_shows_host_memory_and_hit_rates():
    p = _tiered_plan()
    text = summary(p)
    assert "host memory: max" in text and "of 2 GiB" in text and "table(s) out of HBM" in text
    if any(rows for _, _, rows, _ in tiered_tables(p)):
        assert "hit rate" in text
    headers = [c.header for c in rank_table(p).columns]
    assert "host GiB / 2.0" in headers
    fig = chart(p)  # a third panel: host memory per rank against its cap, hit rates in its title
    assert len(fig.axes) == 3 and fig.axes[2].get_title().startswith("host memory")
    assert [round(b.get_height(), 6) for b in fig.axes[2].patches] == [round(r.storage.host_bytes / GIB, 6) for r in p.ranks]
    assert len(chart(ShardingPlan.load(V2_FILE)).axes) == 2  # no host memory for tables: no third panel


def test_evaluate_refuses_host_memory_over_the_cap():
    specs, topo, _ = _over_hbm()
    shards = {s.name: (Shard(0, 0, s.num_embeddings, 0, s.embedding_dim, Location.HOST),) for s in specs}
    from embshard.planner.plan import TablePlacement
    placements = [TablePlacement(n, TW, "fused", sh) for n, sh in shards.items()]
    with pytest.raises(PlanInfeasibleError, match=r"topology\.ddr_gib=1\.5\): rank 0 keeps 1\.94 GiB in host memory"):
        evaluate(specs, replace(topo, ddr_gib=1.5), placements)


@pytest.mark.parametrize("seed", range(12))
def test_tiered_plans_are_what_the_search_scored_and_the_bound_holds(seed):
    """Random problems (tests/planner/test_search.py's) with HBM for about half the tables and host memory for the rest."""
    from tests.planner.test_search import _random_problem
    specs, topo, constraints = _random_problem(seed)
    state_bytes = sum(s.num_embeddings * (s.row_bytes(s.embedding_dim) + s.optimizer_state_bytes_per_row(s.embedding_dim)) for s in specs)
    W = topo.world_size  # HBM for three times every rank's buffers (sequence tables' dominate) and half of the tables' bytes
    buffers = sum(holder_storage(s, topo, TW, s.num_embeddings, s.embedding_dim).io_bytes + W * requester_storage(s, topo).io_bytes
                  for s in specs) / W
    topo = replace(topo, hbm_gib=(0.5 * state_bytes / W + 3 * buffers) / (1 - topo.reserved_fraction) / GIB,
                   ddr_gib=2 * state_bytes / W / GIB)
    p = plan(specs, topo, constraints, time_budget_s=0.5)
    assert p.max_rank_ms == pytest.approx(p.search["scored_ms"], rel=1e-9)
    assert p.lower_bound_ms <= p.max_rank_ms * (1 + 1e-9)
    for r in p.ranks:
        assert r.storage.total_bytes <= topo.shard_memory_cap_bytes and r.storage.host_bytes <= topo.host_memory_cap_bytes
    problem = build_problem(specs, topo, constraints)
    assert lower_bound_ms(problem)[0] <= p.max_rank_ms * (1 + 1e-9)


def test_criteo_tb_plans_on_8_ranks_of_8_gib_with_measured_curves_and_host_memory():
    """README's dry run: 86 GiB of tables, 8 x 7.1 GiB of HBM for shards, 8 x 64 GiB of host memory."""
    from embshard.cli import CONFIG_DIR
    from embshard.specs import load_tables_file
    specs, _ = load_tables_file(Path(CONFIG_DIR) / "tables" / "criteo_tb_measured.yaml")
    assert all(s.hot_rows for s in specs)
    topo = Topology(world_size=8, local_world_size=8, hbm_gib=8.0, batch_size_per_rank=4096)
    with pytest.raises(PlanInfeasibleError, match="GiB short"):
        plan(specs, topo, time_budget_s=2)
    p = plan(specs, replace(topo, ddr_gib=64.0), time_budget_s=2)
    assert all(r.storage.total_bytes <= topo.shard_memory_cap_bytes for r in p.ranks)
    assert 28 * GIB < sum(r.storage.host_bytes for r in p.ranks) <= 8 * 64 * GIB  # 86 GiB less 8 x 7.2 GiB of HBM at least
    for name, where, rows, hit in tiered_tables(p):
        spec = p.spec(name)
        if where == "uvm_cache":
            shards = p.placement(name).shards
            # weighted by the ids each shard holds (column shards hold all rows)
            assert hit == pytest.approx(sum(s.num_rows * s.num_cols * hit_rate(spec, s.cache_rows, s.num_rows) for s in shards)
                                        / sum(s.num_rows * s.num_cols for s in shards))


def test_a_topology_without_host_memory_serialises_and_hashes_as_before():
    plain = Topology(world_size=8)
    assert "ddr_gib" not in plain.to_dict() and Topology.from_dict(plain.to_dict()) == plain
    tiered = Topology(world_size=8, ddr_gib=64, ddr_gb_per_s=32)
    assert Topology.from_dict(tiered.to_dict()) == tiered and tiered.to_dict()["ddr_gb_per_s"] == 32.0
    raw = json.loads(V2_FILE.read_text())  # main's plan, before tiers: its input hash is reproduced
    p = ShardingPlan.load(V2_FILE)
    assert evaluate(p.specs, p.topology, p.tables).input_hash == raw["input_hash"]


def test_spare_hbm_goes_to_the_caches_at_no_cost_in_time():
    """Curves that reach 1 at 1% of rows: every cache share from 1% up costs the same time, so the
    search alone leaves HBM idle; the caches then grow into it (embshard/planner/search/caches.py),
    each as far as its rank's HBM allows, and the plan costs what it did."""
    specs, topo, constraints = _over_hbm()
    specs = [replace(s, hot_rows=((0.001, 0.9), (0.01, 1.0))) for s in specs]
    p = plan(specs, topo, constraints, time_budget_s=2)
    assert "grow_caches" in p.search["method"] and p.max_rank_ms == pytest.approx(p.search["scored_ms"], rel=1e-9)
    out = [t for t in p.tables if t.shards[0].location is not Location.HBM]
    assert out and all(t.shards[0].location is Location.UVM_CACHE for t in out)
    assert any(t.shards[0].cache_rows > cache_rows(t.shards[0].num_rows, CACHE_FRACTIONS[0]) for t in out)
    at_smallest = [replace(t, shards=tuple(replace(s, cache_rows=cache_rows(s.num_rows, CACHE_FRACTIONS[0])) for s in t.shards))
                   if t in out else t for t in p.tables]
    assert evaluate(specs, topo, at_smallest).max_rank_ms == pytest.approx(p.max_rank_ms, rel=1e-9)
    for t in out:  # the next tier up (a larger offered share, or HBM whole) does not fit its rank
        s = t.shards[0]
        share = s.cache_rows / s.num_rows
        larger = [replace(s, cache_rows=cache_rows(s.num_rows, f)) for f in CACHE_FRACTIONS if f > share + 1e-9]
        for bigger in larger + [replace(s, location=Location.HBM, cache_rows=0)]:
            grown = [replace(u, shards=(bigger,)) if u is t else u for u in p.tables]
            with pytest.raises(PlanInfeasibleError, match="exceed"):
                evaluate(specs, topo, grown)


def test_a_cache_on_a_full_rank_moves_to_idle_hbm_elsewhere_without_lifting_the_maximum():
    """A 1% cache of t0 sits with t1 (in HBM) on rank 0, whose HBM is full; rank 1 is empty. The old pass grew
    caches on their own ranks only and left t0 at 1%; t0 now moves to rank 1 at a better tier (HBM or the
    largest cache that fits), and no rank ends above the maximum it had."""
    from embshard.planner.search.caches import grow_caches
    from embshard.planner.search.problem import build_problem
    from embshard.planner.search.state import RankState
    specs, topo, constraints = _over_hbm()
    specs = specs[:2]
    problem = build_problem(tuple(specs), topo, constraints)
    state = RankState(problem)

    def pick(ui: int, location: Location, fraction: float = 0.0) -> int:
        return next(ci for ci, cv in enumerate(problem.units[ui].cands)
                    if cv.cand[0].location is location and cv.cand[0].cache_fraction == fraction)

    state.add(0, pick(0, Location.UVM_CACHE, CACHE_FRACTIONS[0]), (0,))
    state.add(1, pick(1, Location.HBM), (0,))
    before = max(state.costs())
    moved, finished = grow_caches(state)
    assert finished and moved >= 1
    ci, ranks = state.choice[0]
    cand = problem.units[0].cands[ci].cand[0]
    assert ranks == (1,) and (cand.location is Location.HBM or cand.cache_fraction > CACHE_FRACTIONS[0])
    assert max(state.costs()) <= before + 1e-9
    assert state.choice[1] == (pick(1, Location.HBM), (0,))


def test_greedy_keeps_hbm_for_the_small_tables_a_full_rank_would_strand():
    """Two tables that may go to host memory, each just fitting one rank's HBM, then three small ones that may
    not (under FINEST_BLOCK of a rank). In all, both big ones in HBM leave room for the small ones, but only
    1.5 small tables' worth per rank: the old pass put both in HBM and found no rank for the third small table
    (Unplaceable); with host memory the pass now keeps a largest later shard per rank free, and caches one."""
    from embshard.planner.search.greedy import default_order, greedy
    from embshard.planner.search.problem import build_problem
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=1.0, batch_size_per_rank=256, ddr_gib=2.0)

    def problem(big_rows: int):
        specs = ([TableSpec(f"big{i}", big_rows, 64, pooling_factor=4.0, hot_rows=((0.01, 0.5), (0.05, 0.8), (0.2, 0.95)))
                  for i in range(2)] + [TableSpec(f"small{i}", 50_000, 64) for i in range(3)])
        return build_problem(tuple(specs), topo, Constraints(tables={s.name: TableConstraint((TW,)) for s in specs}))

    sizing = problem(1_000_000)
    small = min(sum(cv.shard_mem) for cv in sizing.units[2].cands)
    per_row = max(cv.shard_mem[0] for cv in sizing.units[0].cands if cv.cand[0].location is Location.HBM) / 1_000_000
    p = problem(int((sizing.cap_bytes - 1.5 * small) / per_row))
    state = greedy(p, default_order(p))
    locations = sorted(p.units[ui].cands[ci].cand[0].location.value for ui, (ci, _) in enumerate(state.choice))
    assert locations == ["hbm"] * 4 + ["uvm_cache"]


def test_the_tiers_first_start_escapes_the_greedy_starts_local_minimum(monkeypatch):
    """criteo_tb_measured on 8 x 8 GiB + 64 GiB host: without local search's kicks, the greedy start (big tables
    into HBM first) polishes to 0.675 ms; placing the tables that may leave HBM out of it first, then every layout
    again, reaches 0.641. (With kicks the greedy start itself reaches 0.634 here; on the benchmark's generated
    sets tiers-first is still the start that wins.) plan() returns the best of them."""
    import embshard.planner.search.local as local
    from embshard.cli import CONFIG_DIR
    from embshard.planner.search.caches import tiers_first
    from embshard.planner.search.greedy import default_order, greedy_retrying, replication_prepass
    from embshard.planner.search.problem import build_problem
    from embshard.specs import load_tables_file
    specs, _ = load_tables_file(Path(CONFIG_DIR) / "tables" / "criteo_tb_measured.yaml")
    topo = Topology(world_size=8, local_world_size=8, hbm_gib=8.0, ddr_gib=64.0, batch_size_per_rank=4096)
    problem = build_problem(specs, topo, Constraints())
    start = lambda: greedy_retrying(problem, default_order(problem), replication_prepass(problem))
    kicked, _ = local.local_search(start(), float("inf"))
    with monkeypatch.context() as m:
        m.setattr(local, "_kick", lambda state, deadline: None)
        standard, _ = local.local_search(start(), float("inf"))
        tiered, _ = tiers_first(problem, float("inf"))
    assert max(tiered.costs()) < 0.97 * max(standard.costs())
    p = plan(specs, topo, time_budget_s=10)
    assert p.max_rank_ms <= min(max(tiered.costs()), max(kicked.costs())) * (1 + 1e-9)
