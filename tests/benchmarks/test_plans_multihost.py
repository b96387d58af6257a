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


def _entry(rounds_ms: list[float], predicted_ms: float = 100.0) -> dict:
    return {"measured_max_rank_ms": sorted(rounds_ms)[len(rounds_ms) // 2], "rounds_max_rank_ms": rounds_ms,
            "predicted_max_rank_ms": predicted_ms}


def test_fastest_is_measurable_only_when_it_wins_enough_paired_rounds(bench):
    # rounds overlap (102 > 101), yet embshard wins every one of 5 paired rounds: p = 1/32
    assert bench.paired_rounds([100, 102, 99, 100, 98], [101, 104, 101, 103, 101]) == (5, 5, 1 / 32)
    assert bench.paired_rounds([100, 102, 99], [101, 104, 101]) == (3, 3, 1 / 8)
    wins = bench.verdict({"embshard": _entry([100, 102, 99, 100, 98]), "greedy": _entry([101, 104, 101, 103, 101])})
    assert "rounds overlap" in wins and "greedy in 5 of 5 rounds (sign test p = 0.031)" in wins
    assert ": measurably fastest;" in wins and "+0% off measured (within" in wins
    # the same medians, but embshard loses one round: 4 of 5, p = 6/32
    one_lost = bench.verdict({"embshard": _entry([100, 102, 99, 100, 98]), "greedy": _entry([101, 101, 101, 103, 101])})
    assert "greedy in 4 of 5 rounds (sign test p = 0.188)" in one_lost and "NOT measurably fastest" in one_lost


def test_the_one_host_verdict_tests_every_other_plan_over_paired_rounds(load_benchmark):
    one_host = load_benchmark("plans_measured")
    e = {"embshard": _entry([100, 102, 99, 100, 98]), "torchrec": _entry([101, 104, 101, 103, 101]),
         "greedy": _entry([101, 101, 101, 103, 101])}  # embshard loses round 2 to greedy: 4 of 5, p = 6/32
    text = one_host.verdict(e)
    assert "torchrec in 5 of 5 rounds (sign test p = 0.031)" in text and "greedy in 4 of 5 rounds (sign test p = 0.188)" in text
    assert "NOT measurably fastest" in text
    e["greedy"] = _entry([103, 105, 104, 106, 102])
    assert ": measurably fastest" in one_host.verdict(e)
