"""The in-host reduction's CPU work priced (calibrated terms), against flat collectives, and the planner's choice."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from embshard.planner import evaluate, manual_plan, plan
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import Constraints, ShardingType, TableConstraint
from embshard.specs import TableSpec

# The cpu_gloo_measured profile on 2 hosts x 2 ranks, inter-host 0.5 GB/s (as benchmarks/plans_multihost.py plans
# for a 2 Gbit/s link): the topology of the schema-9 fixture, written by main's embshard from that profile.
PROFILE_2X2 = ShardingPlan.load(Path(__file__).parent / "data" / "plan_v9.json").topology
# Fitted (embshard.calibrate.fit.host_reduce_fit) to the CPU time of big_pooled's row-wise-heavy layout below,
# run on 4 local ranks as 2 hosts x 2 with and without the reduction (2026-12-01, 2-core Xeon, load ~0.5): output
# dist per rank 44 / 71 ms (forward / backward) with it, 19 / 26 ms flat.
MEASURED = dict(host_reduce_fwd_ns_per_byte=0.899, host_reduce_bwd_ns_per_byte=1.483, host_reduce_call_ms=0.0)
WIDE = tuple(f"f{j}" for j in range(4))
SPECS = tuple([TableSpec(f"big{i}", 250_000, 256, 4.0, feature_names=tuple(f"big{i}_{f}" for f in WIDE)) for i in range(2)]
              + [TableSpec(f"small{i}", 5_000, 32, 2.0) for i in range(6)])
LAYOUT = {s.name: ("row_wise" if s.name.startswith("big") else "data_parallel", [0, 1, 2, 3]) for s in SPECS}


def _in_host_over_flat(topo) -> float:
    p = manual_plan(SPECS, topo, LAYOUT)
    tables = [replace(t, data_parallel_mode="allreduce") if t.sharding_type is ShardingType.DATA_PARALLEL else t for t in p.tables]
    return evaluate(SPECS, topo, tables).max_rank_ms / evaluate(SPECS, replace(topo, reduce_in_host=False), tables).max_rank_ms


def test_row_wise_heavy_plan_over_two_hosts_is_priced_above_flat_with_the_reduction_s_cpu_work():
    """Measured on 2 emulated hosts (benchmarks/results/multihost.md): 1.58x flat's step with in-host reduction, for
    1.9x fewer inter-host bytes. Without the reduction's CPU work the model said 0.69x (0.79x with link time unfactored);
    with it, 1.30x."""
    assert _in_host_over_flat(PROFILE_2X2) < 0.85  # the old model: bytes only
    assert _in_host_over_flat(replace(PROFILE_2X2, **MEASURED)) > 1.2


def test_planner_keeps_collectives_flat_where_the_reduction_costs_more():
    """One wide table that must be cut into row blocks over all 4 ranks (0.35 GiB each), the rest replicated: with the
    reduction's CPU work as measured the planner records flat collectives (reduce_in_host false) for the plan."""
    specs = (TableSpec("huge", 1_000_000, 256, 4.0, feature_names=tuple(f"huge_{f}" for f in WIDE)), *SPECS[2:])
    constraints = Constraints({s.name: TableConstraint((ShardingType.ROW_WISE,) if s.name == "huge" else (ShardingType.DATA_PARALLEL,))
                               for s in specs})
    topo = replace(PROFILE_2X2, hbm_gib=0.35)
    chosen = plan(specs, replace(topo, **MEASURED), constraints, time_budget_s=1.0)
    assert [s.rank for s in chosen.tables[0].shards] == [0, 1, 2, 3]
    assert not chosen.topology.reduce_in_host and chosen.search["reduce_in_host"] is False
    assert chosen.max_rank_ms == evaluate(specs, chosen.topology, chosen.tables).max_rank_ms
    assert chosen.max_rank_ms < evaluate(specs, replace(chosen.topology, reduce_in_host=True), chosen.tables).max_rank_ms
    assert ShardingPlan.from_json(chosen.to_json()).topology.reduce_in_host is False  # recorded in the plan
    kept = plan(specs, topo, constraints, time_budget_s=1.0)  # bytes only (the older model): the reduction pays
    assert kept.topology.reduce_in_host and "reduce_in_host" not in kept.search
