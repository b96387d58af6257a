"""benchmarks/plans_multihost.py prices the emulated cluster as it is: ranks sharing the machine's cores take that much
longer for their CPU work, never for the time their bytes spend on inter-host links."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from embshard.planner import evaluate, manual_plan
from embshard.planner.plan import ShardingPlan
from embshard.specs import TableSpec
from embshard.topology import PHASE_FACTORS

PROFILE = ShardingPlan.load(Path(__file__).resolve().parents[1] / "planner" / "data" / "plan_v9.json").topology  # cpu_gloo_measured, 2 x 2


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("plans_multihost")


def test_half_a_core_per_rank_doubles_the_cpu_phases_not_the_inter_host_link(bench):
    own_core = bench.emulated_topology(PROFILE, 2, 2, 0.5, 1.0)
    shared = bench.emulated_topology(PROFILE, 2, 2, 0.5, 0.5)  # 4 ranks on 2 cores
    assert (own_core.world_size, own_core.local_world_size, own_core.inter_host_gb_per_s) == (4, 2, 0.5)
    assert all(getattr(shared, f) == 2 * getattr(PROFILE, f) for f in PHASE_FACTORS) and own_core == replace(PROFILE, inter_host_gb_per_s=0.5)
    specs = [TableSpec(f"t{i}", 10_000, 64, 4.0) for i in range(4)]
    layout = {s.name: ("table_wise", [i]) for i, s in enumerate(specs)}  # no data-parallel all-reduce: link time apart
    one, two = (evaluate(specs, t, manual_plan(specs, t, layout).tables).ranks[0].perf for t in (own_core, shared))
    link = replace(own_core, **dict.fromkeys(PHASE_FACTORS, 0.0))  # the factors off: only the inter-host link time is left
    link_ms = evaluate(specs, link, manual_plan(specs, link, layout).tables).ranks[0].perf
    assert link_ms.total_ms > 0.1 * one.total_ms
    assert two.total_ms == pytest.approx(2 * one.total_ms - link_ms.total_ms, rel=1e-9)
    with pytest.raises(AssertionError):
        bench.emulated_topology(PROFILE, 2, 2, 0.5, 2.0)
