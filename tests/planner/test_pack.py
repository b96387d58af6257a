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
