"""Target packing: binary search on the makespan T, packing every unit under T.

For a target T, units go largest first; each takes its least-work candidate whose shards
fit on the cheapest ranks without lifting any rank above T (the requester and every-rank
parts lift all ranks). When none fits, the unit takes the candidate with the lowest
resulting maximum and the target is missed. The search keeps the best real maximum seen
and narrows T between the lower bound and it.
"""

from __future__ import annotations

import time

from embshard.planner.search.greedy import place
from embshard.planner.search.problem import Problem, RankState


def _pack(problem: Problem, order: list[int], target: float, deadline: float = float("inf")) -> RankState | None:
    """One packing under `target`; None if a unit fits nowhere or the deadline passes first."""
    state = RankState(problem)
    W = problem.topo.world_size
    for ui in order:
        if time.perf_counter() > deadline:
            return None
        unit = problem.units[ui]
        costs = state.costs()
        cur_max = max(costs)
        by_cost = state.cheapest_first(unit.ranks, costs)
        fallback = None
        chosen = None
        for ci in sorted(range(len(unit.cands)), key=lambda c: unit.cands[c].work_ms + W * (unit.cands[c].every_ms + sum(unit.cands[c].req_vec))):
            cv = unit.cands[ci]
            pick = place(state, unit, cv, by_cost, costs)
            if pick is None:
                continue
            shift = sum(cv.req_vec) + cv.every_ms
            top = max(max((costs[r] + cv.shard_cost[i] for i, r in enumerate(pick)), default=0.0), cur_max) + shift
            if top <= target:
                chosen = (ci, pick)
                break
            if fallback is None or top < fallback[0]:
                fallback = (top, ci, pick)
        if chosen is None:
            if fallback is None:
                return None  # memory: nowhere to put this unit
            chosen = fallback[1:]
        state.add(ui, *chosen)
    return state


def target_pack(problem: Problem, order: list[int], lower: float, upper: float, deadline: float,
                rounds: int = 8) -> tuple[RankState | None, int]:
    """Best packing found by bisecting the target between lower and upper, and the rounds
    finished (a round the deadline cuts short counts as none)."""
    best, best_obj, done = None, float("inf"), 0
    lo, hi = lower, upper
    for _ in range(rounds):
        if time.perf_counter() > deadline or hi - lo <= 1e-3 * hi:
            break
        mid = (lo + hi) / 2
        state = _pack(problem, order, mid, deadline)
        if state is None and time.perf_counter() > deadline:
            break
        done += 1
        obj = max(state.costs()) if state is not None else float("inf")
        if obj < best_obj:
            best, best_obj = state, obj
        if obj <= mid:
            hi = obj
        else:
            lo = mid
    return best, done
