"""Initial placement: largest units first, each given the candidate and ranks that keep the
projected makespan lowest.

For a candidate, shards (largest first) go to the least-loaded ranks that fit them (for
host-bound types, every host is tried). Its score is the projected objective
max(highest rank after placing it, (all work placed so far + the least work the remaining
units need) / W): early on the average term dominates and cheap layouts (table-wise) win;
once a table alone would stick out above the average, splitting it wins.
"""

from __future__ import annotations

from embshard.planner.search.problem import CandVec, Problem, RankState, Unit


class Unplaceable(Exception):
    def __init__(self, unit_index: int) -> None:
        super().__init__(unit_index)
        self.unit_index = unit_index


def place(state: RankState, unit: Unit, cv: CandVec, by_cost: list[int], exclude: frozenset[int] = frozenset()) -> tuple[int, ...] | None:
    """Ranks for the candidate's shards (in shard order), or None if memory or constraints forbid.

    by_cost: the unit's allowed ranks, cheapest first.
    """
    cap = state.problem.cap_bytes
    if cv.every_mem and max(state.mem) + state.UM + cv.every_mem > cap:
        return None
    if cv.data_parallel:
        return ()
    order = sorted(range(cv.num_shards), key=lambda i: -cv.shard_cost[i])
    topo = state.problem.topo
    if not cv.host_bound:
        return _assign(state, cv, order, [r for r in by_cost if r not in exclude])
    best, best_val = None, float("inf")
    for host in sorted({topo.host_of(r) for r in by_cost}):
        pick = _assign(state, cv, order, [r for r in by_cost if topo.host_of(r) == host and r not in exclude])
        if pick is not None:
            val = max(state.cost_with(r, cv.shard_vec[i], 1) for i, r in enumerate(pick))
            if val < best_val:
                best, best_val = pick, val
    return best


def _assign(state: RankState, cv: CandVec, order: list[int], ranks: list[int]) -> tuple[int, ...] | None:
    if len(ranks) < cv.num_shards:
        return None
    out = [-1] * cv.num_shards
    used: set[int] = set()
    for i in order:
        need = cv.shard_mem[i] + cv.every_mem
        for r in ranks:
            if r not in used and state.fits(r, need):
                out[i] = r
                used.add(r)
                break
        else:
            return None
    return tuple(out)


def greedy(problem: Problem, order: list[int]) -> RankState:
    """Place units in the given order; raises Unplaceable with the first unit that fits nowhere."""
    state = RankState(problem)
    W = problem.topo.world_size
    min_work = [min(cv.work_ms + W * cv.every_ms for cv in problem.units[u].cands) for u in range(len(problem.units))]
    remaining = sum(min_work)
    total = 0.0
    for ui in order:
        unit = problem.units[ui]
        remaining -= min_work[ui]
        costs = state.costs()
        cur_max = max(costs)
        by_cost = sorted(unit.ranks, key=costs.__getitem__)
        best = None
        for ci, cv in enumerate(unit.cands):
            pick = place(state, unit, cv, by_cost)
            if pick is None:
                continue
            shift = sum(cv.req_vec) + cv.every_ms  # upper bound of what every rank gains
            touched = max((state.cost_with(r, cv.shard_vec[i], 1) for i, r in enumerate(pick)), default=0.0)
            work = cv.work_ms + W * shift
            score = max(touched + shift, cur_max + shift, (total + work + remaining) / W)
            key = (score, work)
            if best is None or key < best[0]:
                best = (key, ci, pick, work)
        if best is None:
            raise Unplaceable(ui)
        _, ci, pick, work = best
        state.add(ui, ci, pick)
        total += work
    return state


def default_order(problem: Problem) -> list[int]:
    """Units by the larger of their share of the average rank load and of one rank's memory cap."""
    W = problem.topo.world_size
    works = [min(cv.work_ms + W * cv.every_ms for cv in u.cands) for u in problem.units]
    avg = max(sum(works) / W, 1e-12)
    mems = [min(sum(cv.shard_mem) + W * cv.every_mem for cv in u.cands) for u in problem.units]
    key = [max(w / avg, m / problem.cap_bytes) for w, m in zip(works, mems)]
    return sorted(range(len(problem.units)), key=lambda i: -key[i])
