"""Target packing: binary search on the makespan T, packing every unit under T.

For a target T, units go largest first; each takes its least-work candidate whose shards
fit on the cheapest ranks without lifting any rank above T (the requester and every-rank
parts lift all ranks). When none fits, the unit takes the candidate with the lowest
resulting maximum and the target is missed. The search keeps the best real maximum seen
and narrows T between the lower bound and it.
"""

from __future__ import annotations

import math
import time

from embshard.planner.search.greedy import place
from embshard.planner.search.problem import Problem
from embshard.planner.search.state import RankState


def _least_work_first(problem: Problem) -> list[list[int]]:
    """Per unit, its candidates by the work they add to all ranks, least first (a stable sort)."""
    W = problem.topo.world_size
    return [sorted(range(len(u.cands)), key=lambda c: u.cands[c].work_ms + W * (u.cands[c].every_ms + sum(u.cands[c].req_vec)))
            for u in problem.units]


def _pack(problem: Problem, order: list[int], target: float, deadline: float, by_work: list[list[int]]) -> RankState | None:
    """One packing under `target` (by_work: `_least_work_first`); None if a unit fits nowhere or the deadline passes first."""
    state = RankState(problem)
    for ui in order:
        if time.perf_counter() > deadline:
            return None
        unit = problem.units[ui]
        costs = state.costs()
        cur_max = max(costs)
        by_cost = state.cheapest_first(unit.ranks, costs)
        fallback = None
        chosen = None
        for ci in by_work[ui]:
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


TOLERANCE = 1e-3  # the bisection stops when its interval is this share of its upper end
ROUNDS = 8  # and after this many rounds


def rounds_needed(lower: float, upper: float) -> int:
    """The rounds `target_pack` takes between lower and upper when every round halves the interval (at most ROUNDS)."""
    if upper - lower <= TOLERANCE * upper:
        return 0
    return min(ROUNDS, math.ceil(math.log2((upper - lower) / (TOLERANCE * upper))))


def target_pack(problem: Problem, order: list[int], lower: float, upper: float, deadline: float,
                rounds: int = ROUNDS) -> tuple[RankState | None, int]:
    """Best packing found by bisecting the target between lower and upper, and the rounds
    finished (a round the deadline cuts short counts as none)."""
    best, best_obj, done = None, float("inf"), 0
    lo, hi = lower, upper
    by_work = _least_work_first(problem)
    for _ in range(rounds):
        if time.perf_counter() > deadline or hi - lo <= TOLERANCE * hi:
            break
        mid = (lo + hi) / 2
        state = _pack(problem, order, mid, deadline, by_work)
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
