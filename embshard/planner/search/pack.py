"""Target packing: binary search on the makespan T, packing every unit under T.

For a target T, units go largest first; each takes its least-work candidate whose shards
fit on the cheapest ranks without lifting any rank above T (the requester and every-rank
parts lift all ranks), and that leaves HBM for the units after it as the greedy pass's do
(`greedy.MemoryAhead`: else the least-work layouts, in HBM, fill it and strand small
tables). When none fits, the unit takes the candidate with the lowest resulting maximum
and the target is missed. The search keeps the best real maximum seen and narrows T
between the lower bound and it.
"""

from __future__ import annotations

import math
import time

from embshard.planner.search.greedy import RETRIES, MemoryAhead, Unplaceable, place, unit_first
from embshard.planner.search.problem import Problem
from embshard.planner.search.state import RankState


def _least_work_first(problem: Problem) -> list[list[int]]:
    """Per unit, its candidates by the work they add to all ranks, least first (a stable sort)."""
    W = problem.topo.world_size
    return [sorted(range(len(u.cands)), key=lambda c: u.cands[c].work_ms + W * (u.cands[c].every_ms + sum(u.cands[c].req_vec)))
            for u in problem.units]


def _pack(problem: Problem, order: list[int], target: float, deadline: float, by_work: list[list[int]]) -> RankState | None:
    """One packing under `target` (by_work: `_least_work_first`); None if the deadline passes first, Unplaceable if a
    unit fits nowhere."""
    state = RankState(problem)
    ahead = MemoryAhead(problem, order)
    for ui in order:
        if time.perf_counter() > deadline:
            return None
        unit = problem.units[ui]
        costs = state.costs()
        cur_max = max(costs)
        by_cost = state.cheapest_first(unit.ranks, costs)
        ahead.next(ui)
        fallback = None
        chosen = None
        least = costs[by_cost[0]] if by_cost else 0.0
        for ci in by_work[ui]:
            cv = unit.cands[ci]
            shift = sum(cv.req_vec) + cv.every_ms
            if fallback is not None:
                # no ranks take it lower than this (its largest shard on the cheapest rank allowed: `top`'s float operations
                # on terms no larger); no lower than the fallback (above the target), it can be neither chosen nor that
                floor = max(least + cv.shard_cost[cv.largest_first[0]] if cv.shard_cost else 0.0, cur_max) + shift
                if floor >= fallback[0]:
                    continue
            pick = place(state, unit, cv, by_cost, costs) if ahead.leaves_room(state, cv) else None
            if pick is None:
                continue
            top = max(max((costs[r] + cv.shard_cost[i] for i, r in enumerate(pick)), default=0.0), cur_max) + shift
            if top <= target:
                chosen = (ci, pick)
                break
            if fallback is None or top < fallback[0]:
                fallback = (top, ci, pick)
        if chosen is None:
            if fallback is None:
                raise Unplaceable(ui)  # memory: the units packed before it took the room it needs
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


def _pack_retrying(problem: Problem, order: list[int], target: float, deadline: float,
                   by_work: list[list[int]]) -> tuple[RankState | None, list[int]]:
    """`_pack`, and when a unit fits nowhere, again with that unit first (as `greedy.greedy_retrying`), up to RETRIES
    packings in all: the packing (None: past the deadline, or no order of these fitted) and the order it took."""
    for _ in range(RETRIES):
        try:
            return _pack(problem, order, target, deadline, by_work), order
        except Unplaceable as e:
            order = unit_first(order, e)
    return None, order


def target_pack(problem: Problem, order: list[int], lower: float, upper: float, deadline: float,
                rounds: int = ROUNDS) -> tuple[RankState | None, int]:
    """Best packing found by bisecting the target between lower and upper, and the rounds
    finished (a round the deadline cuts short counts as none; one whose packings fit no order counts, missing
    its target, and ends the search when it is the first). A round starts from the order that packed last
    (`_pack_retrying`)."""
    best, best_obj, done = None, float("inf"), 0
    lo, hi = lower, upper
    by_work = _least_work_first(problem)
    for _ in range(rounds):
        if time.perf_counter() > deadline or hi - lo <= TOLERANCE * hi:
            break
        mid = (lo + hi) / 2
        state, order = _pack_retrying(problem, order, mid, deadline, by_work)
        if state is None and time.perf_counter() > deadline:
            break
        done += 1
        # no order fitted the first target: higher ones take more of the least-work (HBM) layouts, so later rounds would
        # fail too (a generated tiered 300-table set on 8 x 7.13 GiB ran 7 rounds of 4 packings)
        if state is None and best is None:
            break
        obj = max(state.costs()) if state is not None else float("inf")
        if obj < best_obj:
            best, best_obj = state, obj
        if obj <= mid:
            hi = obj
        else:
            lo = mid
    return best, done
