"""Spare HBM to caches: after the search, move each table kept out of HBM (``uvm_cache`` or
``host``) to the best tier the HBM left allows: whole into HBM, else the largest offered cache
share (`tiers.CACHE_FRACTIONS`), in the same layout on its own ranks or others, as long as no
rank's time goes above the plan's maximum.

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

from embshard.planner.search.greedy import place
from embshard.planner.search.problem import CandVec, RankState
from embshard.planner.types import Location

EPS = 1e-9


def _layout(cv: CandVec) -> tuple:
    """What a tier change keeps: each member's type, blocks and hot set (the ranks may change)."""
    return tuple((c.sharding_type, c.row_spans, c.col_spans, c.hot_rows) for c in cv.cand)


def _tier(cv: CandVec) -> tuple[int, float]:
    """Order of tiers, best last: host, caches by share, HBM."""
    c = cv.cand[0]
    return {Location.HOST: (0, 0.0), Location.UVM_CACHE: (1, c.cache_fraction), Location.HBM: (2, 0.0)}[c.location]


def grow_caches(state: RankState, deadline: float = float("inf")) -> tuple[int, bool]:
    """Move tables out of HBM to better tiers where some ranks have the HBM (`state` is modified),
    pass after pass while one moves (a move may free HBM for another). Returns how many moves were
    made, and False if the deadline stopped it before every table was tried."""
    moved = 0
    while True:
        more, finished = _grow_pass(state, deadline)
        moved += more
        if not more or not finished:
            return moved, finished


def _grow_pass(state: RankState, deadline: float) -> tuple[int, bool]:
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
        layout = _layout(unit.cands[ci])
        better = [cj for cj, cv in enumerate(unit.cands) if _tier(cv) > here and _layout(cv) == layout]
        if not better:
            continue
        ceiling = max(state.costs()) + EPS
        state.remove(ui)
        base = state.costs()
        by_cost = state.cheapest_first(unit.ranks, base)
        best = None  # (tier, -total ms, candidate, ranks)
        for cj in better:
            pick = place(state, unit, unit.cands[cj], by_cost, base, after=True)
            if pick is None:
                continue
            new_costs = state.cost_array_with(ui, cj, pick)
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
