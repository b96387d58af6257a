"""Row blocks in rank order: each row-split table's blocks moved onto its ranks in rank order wherever that costs the
objective nothing (TorchRec runs only that layout), after the search (`embshard.planner.api.plan`)."""

from __future__ import annotations

import time

from embshard.planner.search.moves import EPS
from embshard.planner.search.state import RankState


def rank_order_rows(state: RankState, deadline: float = float("inf")) -> bool:
    """Put each row-split table's blocks on its ranks in rank order where that lifts no rank
    above the current maximum and fits (TorchRec runs only that layout; the blocks differ only
    in the last one, so it is usually free). `state` is modified; False if the deadline
    stopped it before every table was tried."""
    units = state.problem.units
    for ui, choice in enumerate(state.choice):
        if time.perf_counter() > deadline:
            return False
        ci, ranks = choice
        cv = units[ui].cands[ci]
        if not cv.cand[0].sharding_type.splits_rows or list(ranks) == sorted(ranks):
            continue
        cmax = max(state.costs())
        state.remove(ui)
        ordered = tuple(sorted(ranks))
        if all(state.fits_shard(r, cv, i) for i, r in enumerate(ordered)):
            state.add(ui, ci, ordered)
            if max(state.costs()) <= cmax + EPS:
                continue
            state.remove(ui)
        state.add(ui, ci, ranks)
    return True
