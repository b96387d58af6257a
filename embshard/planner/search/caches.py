"""Spare HBM to caches: after the search, move each table kept out of HBM (``uvm_cache`` or
``host``) to the best tier the HBM left allows: whole into HBM, else the largest offered cache
share (`tiers.CACHE_FRACTIONS`), on its own ranks or others, in its layout (passes while one
moves) and then in any layout it is offered, as long as no rank's time goes above the plan's maximum.

The search minimises the slowest rank's time and stops at its cheapest plan; what the tables
out of HBM get off the slowest rank is whatever the greedy placement left them, and ranks with
idle HBM sit beside full ones holding 1% caches. A larger cache never costs the table more time
in embshard's model (its hit rate only rises, fewer rows are fetched), so using that HBM is a
secondary objective at no cost to the first: fewer misses (the sum of the ranks' times falls)
with the maximum where it was. TorchRec's cost model prices a cached lookup by its cache share
alone (its load factor, as if ids were uniform) at a tenth of the bandwidth, so small caches
cost it most. Tables go in order of their lookup time (largest first); of the moves that keep
every rank at or below the maximum, the best tier wins, ties by the least total time.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from embshard.planner.search.greedy import Unplaceable, default_order, greedy_retrying, place_each, replication_prepass
from embshard.planner.search.local import local_search
from embshard.planner.search.problem import CandVec, Problem, Unit
from embshard.planner.search.state import RankState
from embshard.planner.types import Location

EPS = 1e-9


_TIER_ORDER = {Location.HOST: 0, Location.UVM_CACHE: 1, Location.HBM: 2}


def _tier(cv: CandVec) -> tuple[int, float]:
    """Order of tiers, best last: host, caches by share, HBM."""
    c = cv.cand[0]
    return _TIER_ORDER[c.location], c.cache_fraction if c.location is Location.UVM_CACHE else 0.0


def grow_caches(state: RankState, deadline: float = float("inf")) -> tuple[int, bool]:
    """Move tables out of HBM to better tiers where some ranks have the HBM (`state` is modified),
    pass after pass while one moves (a move may free HBM for another). Returns how many moves were
    made, and False if the deadline stopped it before every table was tried."""
    moved = 0
    for any_layout in (False, True):  # each table's own layout first (cheap), then every layout it is offered
        while True:
            more, finished = _grow_pass(state, deadline, any_layout)
            moved += more
            if not finished:
                return moved, False
            if not more:
                break
    return moved, True


def _grow_pass(state: RankState, deadline: float, any_layout: bool) -> tuple[int, bool]:
    units = state.problem.units
    out_of_hbm = [ui for ui, choice in enumerate(state.choice)
                  if choice is not None and units[ui].cands[choice[0]].cand[0].location is not Location.HBM]
    moved = 0
    for ui in sorted(out_of_hbm, key=lambda ui: (-units[ui].cands[state.choice[ui][0]].work_ms, ui)):
        if time.perf_counter() > deadline:
            return moved, False
        ci, ranks = state.choice[ui]
        unit = units[ui]
        here = _tier(unit.cands[ci])
        layout = unit.cands[ci].layout  # (the ranks may change)
        better = [cj for cj, cv in enumerate(unit.cands) if _tier(cv) > here and (any_layout or cv.layout == layout)]
        if not better:
            continue
        ceiling = max(state.costs()) + EPS
        state.remove(ui)
        base = state.costs()
        by_cost = state.cheapest_first(unit.ranks, base)
        best = None  # (tier, -total ms, candidate, ranks)
        for cj, pick, new_costs in place_each(state, ui, better, by_cost, base, ceiling=ceiling):
            if new_costs.max() <= ceiling:
                key = (_tier(unit.cands[cj]), -float(new_costs.sum()))
                if best is None or key > best[0]:
                    best = (key, cj, pick)
        if best is None:
            state.add(ui, ci, ranks)
        else:
            state.add(ui, best[1], best[2])
            moved += 1
    return moved, True


def tiers_first(problem: Problem, deadline: float, polish: Callable = local_search) -> tuple[RankState, int] | None:
    """A start from the other side: a greedy pass with the tables that may leave HBM offered their cached
    and host layouts only, then every layout again (`grow_caches`, local search on the whole problem,
    `grow_caches`). With true hit-rate curves the plain greedy start puts the big tables in HBM first and
    polishes into a local minimum (criteo_tb_measured on 8 x 8 GiB: 0.675 ms; this start 0.641, in about
    the same time). polish: the local search (`local.Polisher` in plan()). Returns the state and its local search
    steps, or None if a table fits nowhere."""
    def out_of_hbm(unit: Unit) -> list[int]:  # the unit's candidates the pass is offered
        return [ci for ci, cv in enumerate(unit.cands) if cv.cand[0].location is not Location.HBM] or list(range(len(unit.cands)))

    offered = [out_of_hbm(u) for u in problem.units]
    narrow = replace(problem, units=tuple(replace(u, cands=tuple(u.cands[ci] for ci in cis)) for u, cis in zip(problem.units, offered)))
    try:
        state = greedy_retrying(narrow, default_order(narrow), replication_prepass(narrow), deadline)
    except Unplaceable:
        return None
    whole = RankState(problem)
    for ui, (ci, ranks) in enumerate(state.choice):
        whole.add(ui, offered[ui][ci], ranks)
    grow_caches(whole, deadline)
    whole, steps = polish(whole, deadline)
    grow_caches(whole, deadline)
    return whole, steps
