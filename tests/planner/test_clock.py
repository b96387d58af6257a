"""The planner's clock: how the budget is split between the LP bound, the greedy pass and the report."""

import pytest

from embshard.planner.search import clock as clock_module
from embshard.planner.search.clock import GREEDY_SHARE, REPORT_SHARE, RUSH_SHARE, Clock


@pytest.fixture
def now(monkeypatch):
    """A settable perf_counter for the clock module."""
    t = [100.0]
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: t[0])
    return t


def test_bound_limit_leaves_a_whole_greedy_pass_its_time(now):
    # 10 s budget, enumeration took 3.5 s (5,000 x 1,024 on a loaded machine): the report keeps 0.875 s back, a
    # greedy pass is rushed 1.4 s before the search deadline (7.725 s after the start), so the LP may run until a
    # whole greedy pass (2.1 s) still ends by then: 2.125 s, not half the time left (2.8125 s)
    c = Clock(10.0)
    now[0] += 3.5
    c.reserve_report(3.5)
    assert c.search_deadline - c.start == pytest.approx(10.0 - REPORT_SHARE * 3.5)
    assert c.greedy_deadline - c.start == pytest.approx(10.0 - REPORT_SHARE * 3.5 - RUSH_SHARE * 3.5)
    assert c.bound_limit_s(0.5) == pytest.approx(10.0 - 3.5 - (REPORT_SHARE + RUSH_SHARE + GREEDY_SHARE) * 3.5)
    assert c.bound_limit_s(0.5) == pytest.approx(2.125)
    now[0] += 2.125  # the LP took all of it: a whole greedy pass still ends by the greedy deadline
    assert c.greedy_deadline - now[0] == pytest.approx(GREEDY_SHARE * 3.5)


def test_bound_limit_is_half_the_time_left_when_enumeration_was_quick(now):
    c = Clock(10.0)
    now[0] += 1.0
    c.reserve_report(1.0)
    assert c.bound_limit_s(0.5) == pytest.approx(0.5 * (10.0 - 1.0 - REPORT_SHARE * 1.0))


def test_no_bound_when_a_greedy_pass_would_not_fit(now):
    # enumeration took half the budget: the LP would rush the greedy pass, so it gets no time (the quick bound)
    c = Clock(10.0)
    now[0] += 5.0
    c.reserve_report(5.0)
    assert c.bound_limit_s(0.5) < 0


def test_a_plan_without_time_for_the_lp_reports_the_quick_bound(monkeypatch):
    # as when enumeration took too much of the budget for the LP (5,000 x 1,024 on a loaded machine): the search
    # runs, says it skipped the LP, and its bound is the quick one, within 10% of the LP's here (it was 22% of it)
    from embshard.planner import api
    from embshard.planner.search.bound import lower_bound_ms
    from embshard.planner.search.problem import build_problem
    from embshard.planner.types import Constraints
    from embshard.topology import Topology
    from embshard.workloads import generate_tables

    specs = generate_tables(300, seed=0, sequence_fraction=0.1)
    topo = Topology(world_size=128, local_world_size=8, hbm_gib=16, batch_size_per_rank=128, device="cuda")
    lp = lower_bound_ms(build_problem(specs, topo, Constraints()))[0]
    monkeypatch.setattr(api, "BOUND_MIN_SHARE", 1e9)
    p = api.plan(specs, topo, time_budget_s=2)
    assert "LP bound (out of time; the quick bound is reported)" in p.search["skipped"]
    assert 0.9 * lp < p.lower_bound_ms <= lp
    assert p.gap < 0.2


def test_a_rushed_greedy_pass_still_splits_big_tables():
    # past its deadline a greedy pass skips host-bound layouts only (their per-host placement is most of its time):
    # with one-shard layouts only, big tables stayed whole (5,000 x 1,024: 233 ms against 45 unrushed)
    from embshard.planner.search.greedy import default_order, greedy, replication_prepass
    from embshard.planner.search.problem import build_problem
    from embshard.planner.types import Constraints
    from embshard.topology import Topology
    from embshard.workloads import generate_tables

    specs = generate_tables(300, seed=0, sequence_fraction=0.1)
    problem = build_problem(specs, Topology(world_size=128, local_world_size=8, hbm_gib=16, batch_size_per_rank=128, device="cuda"),
                            Constraints())
    full = greedy(problem, default_order(problem), replication_prepass(problem))
    rushed = greedy(problem, default_order(problem), replication_prepass(problem), deadline=0.0)
    assert rushed.rushed == sum(1 for c in rushed.choice if c is not None) - len(replication_prepass(problem))
    chosen = [problem.units[ui].cands[ci] for ui, (ci, _) in enumerate(rushed.choice)]
    assert not any(cv.host_bound for cv in chosen)
    assert sum(cv.num_shards > 1 for cv in chosen) >= 10  # big tables split row- or column-wise
    assert any(problem.units[ui].cands[ci].host_bound for ui, (ci, _) in enumerate(full.choice))
    assert max(rushed.costs()) < 1.3 * max(full.costs())
