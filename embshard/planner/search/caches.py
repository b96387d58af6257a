"""Spare HBM to caches: after the search, move each table kept out of HBM (``uvm_cache`` or
``host``) to the best tier the HBM left on its ranks allows: whole into HBM, else the largest
offered cache share (`tiers.CACHE_FRACTIONS`), same layout, ranks and shards.

A larger cache never costs more time in embshard's model (the hit rate only rises, fewer rows
are fetched), so the search, which stops at its cheapest plan, leaves a cache at the smallest
share that reaches the top of the table's ``hot_rows`` curve even while HBM stays idle. That
curve comes from a sample: for a table with more rows than the sample had lookups it reaches 1
at the share of rows the sample touched and overstates the hit rate of a larger cache's real
stream; and TorchRec's cost model prices a cached lookup by the cache share alone (its load
factor, as if ids were uniform). So spare HBM goes to caches: tables in order of their
lookup time (largest first), a move kept only if no rank's predicted time rises.
"""

from __future__ import annotations

import time

from embshard.planner.search.problem import CandVec, RankState
from embshard.planner.types import Location

EPS = 1e-9


def _layout(cv: CandVec) -> tuple:
    """What a tier change keeps: each member's type, blocks and hot set."""
    return tuple((c.sharding_type, c.row_spans, c.col_spans, c.hot_rows) for c in cv.cand)


def _tier(cv: CandVec) -> tuple[int, float]:
    """Order of tiers, best last: host, caches by share, HBM."""
    c = cv.cand[0]
    return {Location.HOST: (0, 0.0), Location.UVM_CACHE: (1, c.cache_fraction), Location.HBM: (2, 0.0)}[c.location]


def grow_caches(state: RankState, deadline: float = float("inf")) -> tuple[int, bool]:
    """Move tables out of HBM to better tiers where their ranks have the HBM (`state` is modified).
    Returns how many tables moved, and False if the deadline stopped it before every one was tried."""
    units = state.problem.units
    out_of_hbm = [ui for ui, choice in enumerate(state.choice)
                  if choice is not None and units[ui].cands[choice[0]].cand[0].location is not Location.HBM]
    moved = 0
    for ui in sorted(out_of_hbm, key=lambda ui: (-units[ui].cands[state.choice[ui][0]].work_ms, ui)):
        if time.perf_counter() > deadline:
            return moved, False
        ci, ranks = state.choice[ui]
        cands = units[ui].cands
        here = _tier(cands[ci])
        better = sorted((cj for cj, cv in enumerate(cands) if _layout(cv) == _layout(cands[ci]) and _tier(cv) > here),
                        key=lambda cj: _tier(cands[cj]), reverse=True)
        if not better:
            continue
        before = state.cost_array()
        state.remove(ui)
        for cj in better:
            if all(state.fits_shard(r, cands[cj], i) for i, r in enumerate(ranks)):
                state.add(ui, cj, ranks)
                if (state.cost_array() <= before + EPS).all():
                    moved += 1
                    break
                state.remove(ui)
        else:
            state.add(ui, ci, ranks)
    return moved, True
