"""Target packing (embshard/planner/search/pack.py) under tight HBM: it leaves room for the tables after each one,
puts a table that fits nowhere first, and a plan says why packing did not run."""

import time

import pytest

from embshard.planner import plan
from embshard.planner.search import pack
from embshard.planner.search.greedy import Unplaceable, default_order
from embshard.planner.search.problem import build_problem
from embshard.planner.types import Constraints
from embshard.topology import Topology
from embshard.workloads import generate_tables


def _problem(n: int, seed: int, world: int, hbm_gib: float):
    topo = Topology(world_size=world, local_world_size=world, hbm_gib=hbm_gib, ddr_gib=64.0, batch_size_per_rank=512)
    specs = generate_tables(n, seed=seed)
    return specs, topo, build_problem(specs, topo, Constraints(), False, False, time.perf_counter() + 10)


def _fits(state, problem) -> bool:
    return (all(c is not None for c in state.choice) and max(state.mem) + state.UM <= problem.cap_bytes
            and max(state.host) <= problem.host_cap_bytes)


def test_packing_leaves_hbm_for_the_tables_after_it():
    # 20 tables on 4 x 0.99 GiB of HBM (+ 64 GiB host): the least-work layouts (in HBM) of the big tables filled HBM and
    # t0004 (table_wise or replicated only) fit no rank, so every round failed, and the plan said "out of time"
    specs, topo, problem = _problem(20, 2, 4, 0.99)
    packed, rounds = pack.target_pack(problem, default_order(problem), 0.0, 1e9, float("inf"), rounds=2)
    assert rounds == 2 and packed is not None and _fits(packed, problem)
    p = plan(specs, topo, time_budget_s=10.0)
    assert not [s for s in p.search.get("skipped", []) if "packing" in s], p.search


def test_packing_puts_a_table_that_fits_nowhere_first():
    # 10 tables on 4 x 0.01 GiB: in the default order one table finds no room even with the look-ahead (it counts
    # bytes over all ranks, not one rank's); first in the order, it does
    _, _, problem = _problem(10, 2, 4, 0.01)
    order, by_work = default_order(problem), pack._least_work_first(problem)
    with pytest.raises(Unplaceable) as failed:
        pack._pack(problem, order, 1e9, float("inf"), by_work)
    state, tried = pack._pack_retrying(problem, order, 1e9, float("inf"), by_work)
    assert state is not None and _fits(state, problem)
    assert tried[0] == failed.value.unit_index and sorted(tried) == sorted(order)


def test_a_plan_says_when_no_order_packed(monkeypatch):
    # one packing per round (no retry): the first round's fails, packing ends there and the plan says so (not
    # "out of time": the whole plan takes a fraction of its budget)
    specs, topo, problem = _problem(10, 2, 4, 0.01)
    monkeypatch.setattr(pack, "RETRIES", 1)
    assert pack.target_pack(problem, default_order(problem), 0.0, 1e9, float("inf")) == (None, 1)
    p = plan(specs, topo, time_budget_s=10.0)
    assert "target packing (no order of the tables packed into memory)" in p.search["skipped"], p.search



def _pack_weighing_all(problem, order, target, by_work):
    """`pack._pack` as it was before it skipped candidates (no deadline): every candidate that leaves room placed.
    Returns the packing and how many candidates it placed."""
    from embshard.planner.search.greedy import MemoryAhead, place
    from embshard.planner.search.state import RankState
    state, ahead, placed = RankState(problem), MemoryAhead(problem, order), 0
    for ui in order:
        unit, costs = problem.units[ui], state.costs()
        cur_max, by_cost = max(costs), state.cheapest_first(problem.units[ui].ranks, costs)
        ahead.next(ui)
        chosen = fallback = None
        for ci in by_work[ui]:
            cv = unit.cands[ci]
            pick = place(state, unit, cv, by_cost, costs) if ahead.leaves_room(state, cv) else None
            placed += ahead.leaves_room(state, cv)
            if pick is None:
                continue
            top = max(max((costs[r] + cv.shard_cost[i] for i, r in enumerate(pick)), default=0.0), cur_max) + (sum(cv.req_vec) + cv.every_ms)
            if top <= target:
                chosen = (ci, pick)
                break
            if fallback is None or top < fallback[0]:
                fallback = (top, ci, pick)
        state.add(ui, *(chosen or fallback[1:]))
    return state, placed


@pytest.mark.parametrize("n,seed,world,hbm_gib", [(60, 1, 8, 4.0), (120, 3, 16, 2.0)])
def test_packing_skips_only_candidates_no_lower_than_the_fallback(n, seed, world, hbm_gib, monkeypatch):
    """A candidate whose cheapest placement (its largest shard on the cheapest rank) is no lower than the unit's fallback
    so far (above the target) is not placed: the packings are those of weighing every candidate, with fewer placed."""
    _, _, problem = _problem(n, seed, world, hbm_gib)
    order, by_work = default_order(problem), pack._least_work_first(problem)
    placed = []
    place = pack.place
    monkeypatch.setattr(pack, "place", lambda *a, **k: placed.append(1) or place(*a, **k))
    ceiling = max(_pack_weighing_all(problem, order, 1e9, by_work)[0].costs())
    fewer = 0
    for share in (0.0, 0.5, 0.8, 0.9, 1.0, 1e9):
        reference, weighed = _pack_weighing_all(problem, order, share * ceiling, by_work)
        placed.clear()
        state = pack._pack(problem, order, share * ceiling, float("inf"), by_work)
        assert state.choice == reference.choice
        assert len(placed) <= weighed
        fewer += weighed - len(placed)
    assert fewer > 0
