"""Initial placement: largest units first, each given the candidate and ranks that keep the
projected makespan lowest.

For a candidate, shards (largest first) go to the least-loaded ranks that fit them (for
host-bound types, every host is tried). Its score is the projected objective
max(highest rank after placing it, (all work placed so far + the least work the remaining
units need) / W): early on the average term dominates and cheap layouts (table-wise) win;
once a table alone would stick out above the average, splitting it wins.
"""

from __future__ import annotations

import time
from operator import add

import numpy as np

from embshard.planner.search.problem import CandVec, Problem, Unit
from embshard.planner.search.state import RankState


HOSTS_TRIED = 2  # host-bound layouts: hosts that fit and are compared
RETRIES = 4  # greedy passes in all when a unit fits nowhere (each puts the unit that failed first)


class Unplaceable(Exception):
    def __init__(self, unit_index: int) -> None:
        super().__init__(unit_index)
        self.unit_index = unit_index


def place(state: RankState, unit: Unit, cv: CandVec, by_cost: list[int], costs: list[float], after: bool = False,
          ceiling: float = float("inf")) -> tuple[int, ...] | None:
    """Ranks for the candidate's shards (in shard order), or None if memory or constraints forbid.

    by_cost: the unit's allowed ranks, cheapest first; costs: every rank's current time; after: rank
    them instead by their time with the candidate's largest shard added (`RankState.costs_after`); then
    also None when that time is above `ceiling` on every rank (the slowest rank with the candidate would
    be above it: local search rejects such a layout).
    """
    if not _replica_fits(cv, max(state.mem) + state.UM, state.problem.cap_bytes):
        return None
    if cv.data_parallel:
        return ()
    if after and by_cost:
        orders, after_costs = _ranked_after(state, np.array([cv.shard_vec[cv.largest_first[0]]]), by_cost)
        by_cost, costs = orders[0], after_costs[0]
        if _above(costs, ceiling):
            return None
    return _place_ranked(state, cv, by_cost, costs)


def place_each(state: RankState, ui: int, cis: list[int], by_cost: list[int], costs: list[float],
               ceiling: float = float("inf")) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    """For each candidate ci of unit ui (not placed) that fits: (ci, the ranks `place(..., after=True,
    ceiling=ceiling)` gives it, every rank's cost with it there: `RankState.cost_array_with`), the same values
    as one call each (the orderings and the cost arrays are computed for all candidates at once)."""
    if not cis:
        return []
    unit = state.problem.units[ui]
    cvs = [unit.cands[ci] for ci in cis]
    used = max(state.mem) + state.UM  # (once for all candidates)
    fits = [_replica_fits(cv, used, state.problem.cap_bytes) for cv in cvs]
    sharded = [j for j, cv in enumerate(cvs) if fits[j] and not cv.data_parallel]
    ranked, above = {}, set()
    if sharded and by_cost:
        orders, after = _ranked_after(state, unit.largest_vecs[[cis[j] for j in sharded]], by_cost)
        ranked = dict(zip(sharded, zip(orders, after)))
        if ceiling < float("inf"):  # `_above` of every candidate at once
            above = {j for j, o in zip(sharded, _above(after, ceiling).tolist()) if o}
    picks = []
    for j, cv in enumerate(cvs):
        if not fits[j]:
            continue
        if cv.data_parallel:
            picks.append((cis[j], ()))
            continue
        if j in above:
            continue
        order, after_costs = ranked.get(j, (by_cost, costs))
        pick = _place_ranked(state, cv, order, after_costs)
        if pick is not None:
            picks.append((cis[j], pick))
    arrays = state.cost_arrays_with(ui, picks)
    return [(ci, pick, arr) for (ci, pick), arr in zip(picks, arrays)]


def _replica_fits(cv: CandVec, used_bytes: float, cap_bytes: float) -> bool:
    """Every rank has room for the candidate's every-rank bytes (a replica; none: True); used_bytes: the fullest
    rank's bytes with the every-rank part (max(state.mem) + state.UM)."""
    return not (cv.every_mem and used_bytes + cv.every_mem > cap_bytes)


def _above(costs_after: np.ndarray, ceiling: float):
    """Every rank is above the ceiling with the candidate's largest shard (rounding apart: costs_after sums
    in another order than the cost functions); costs_after (candidates, ranks): one answer per candidate."""
    return costs_after.min(axis=-1) > ceiling * (1 + 1e-9)


def _ranked_after(state: RankState, largest: np.ndarray, by_cost: list[int]) -> tuple[list[list[int]], np.ndarray]:
    """Per sharded candidate (`largest`: its largest shard's vector, a row each): by_cost ordered by every rank's
    time with that shard added (a stable sort: ties keep their order), and those times (`RankState.costs_after`;
    all candidates at once)."""
    after = state.costs_after(largest)
    idx = np.asarray(by_cost, dtype=np.int64)
    return idx[np.argsort(after[:, idx], axis=1, kind="stable")].tolist(), after


def _place_ranked(state: RankState, cv: CandVec, by_cost: list[int], costs) -> tuple[int, ...] | None:
    """place's ranks for a sharded candidate from by_cost (cheapest first by `costs`)."""
    order = cv.largest_first
    if not cv.host_bound:
        return _assign(state, cv, order, by_cost)
    # try the hosts whose k-th cheapest rank is cheapest; the first two that fit compete
    k = cv.num_shards
    ranked = sorted((ranks for ranks in _hosts(state, by_cost) if len(ranks) >= k), key=lambda rs: costs[rs[k - 1]])
    best, best_val, fitted = None, float("inf"), 0
    for ranks in ranked:
        pick = _assign(state, cv, order, ranks)
        if pick is None:
            continue
        val = max(map(add, map(costs.__getitem__, pick), cv.shard_cost))
        if val < best_val:
            best, best_val = pick, val
        fitted += 1
        if fitted == HOSTS_TRIED:
            break
    return best


def _hosts(state: RankState, by_cost: list[int]) -> list[list[int]]:
    """by_cost split by host (each host's ranks cheapest first), remembered for the same list."""
    cached = state.hosts_of
    if cached is not None and cached[0] is by_cost:
        return cached[1]
    if not by_cost:
        return []
    ranks = np.asarray(by_cost)
    host = ranks // state.problem.topo.local_world_size
    grouped = np.argsort(host, kind="stable")  # by host, each host's ranks in by_cost's order
    host = host[grouped]
    starts = np.flatnonzero(np.r_[True, host[1:] != host[:-1]])
    bounds = np.r_[starts, len(host)].tolist()
    ranks = ranks[grouped].tolist()
    # hosts in the order their cheapest rank comes in by_cost (that rank is the first of its group)
    state.hosts_of = (by_cost, [ranks[bounds[i]:bounds[i + 1]] for i in np.argsort(grouped[starts]).tolist()])
    return state.hosts_of[1]


def _assign(state: RankState, cv: CandVec, order: list[int], ranks: list[int]) -> tuple[int, ...] | None:
    """Largest shard first onto the cheapest rank with room (ranks are cheapest first); with the
    problem's rank_ordered_rows, row blocks then go to those ranks in rank order."""
    if len(ranks) < cv.num_shards:
        return None
    room = state.problem.cap_bytes - state.UM - cv.every_mem
    mem, host, host_room = state.mem, state.host, state.problem.host_cap_bytes
    hm = cv.shard_host_mem

    def fits(r: int, i: int) -> bool:
        return mem[r] + cv.shard_mem[i] <= room and (not hm or host[r] + hm[i] <= host_room)

    k = cv.num_shards
    out = [-1] * k
    if max(map(mem.__getitem__, ranks[:k])) + cv.largest_mem <= room and (
            not hm or max(map(host.__getitem__, ranks[:k])) + cv.largest_host_mem <= host_room):  # the k cheapest have room for any shard
        if k == 1:
            out[0] = ranks[0]
        else:
            for i, r in zip(order, ranks):
                out[i] = r
        order = ()
    pos, skipped = 0, []  # ranks too full for a shard stay candidates for smaller ones
    for i in order:
        for j, r in enumerate(skipped):
            if fits(r, i):
                out[i] = skipped.pop(j)
                break
        else:
            while pos < len(ranks) and not fits(ranks[pos], i):
                skipped.append(ranks[pos])
                pos += 1
            if pos == len(ranks):
                return None
            out[i] = ranks[pos]
            pos += 1
    if state.problem.rank_ordered_rows and cv.cand[0].sharding_type.splits_rows:
        # row block i on the i-th of the chosen ranks (TorchRec's layout); blocks differ only in the last
        out = sorted(out)
        if not all(fits(r, i) for i, r in enumerate(out)):
            return None
    return tuple(out)


def largest_shard_needs(problem: Problem) -> list[int]:
    """Per unit, the bytes one rank must have free for it at the least: its smallest largest shard
    (a replica needs that much on every rank, so it counts too)."""
    return [min(cv.largest_mem + cv.every_mem for cv in u.cands) for u in problem.units]


class MemoryAhead:
    """The HBM the units still to place need, for a pass placing `order` one unit after another: a replica (and with
    host memory for tables, any layout) must leave room for their least bytes in all, with tiers also for the largest
    shard some later unit needs on one rank, and a replica the emptiest rank room for that shard (`largest_shard_needs`)
    -- else HBM filled to the byte strands small tables that fit no rank (`greedy`, `pack._pack`)."""

    def __init__(self, problem: Problem, order: list[int]) -> None:
        W = problem.topo.world_size
        self.problem, self.tiers = problem, problem.host_cap_bytes > 0
        self.min_mem = {u: min(sum(cv.shard_mem) + W * cv.every_mem for cv in problem.units[u].cands) for u in order}
        self.remaining = sum(self.min_mem.values())
        needs = largest_shard_needs(problem)
        later = [0] * (len(order) + 1)  # later[i]: the largest need of the units after order[i]
        for i in range(len(order) - 1, -1, -1):
            later[i] = max(later[i + 1], needs[order[i]])
        self.later_need = dict(zip(order, later[1:]))

    def next(self, ui: int) -> None:
        """Unit ui is the next to place (its own bytes leave the remaining); `leaves_room` asks for it."""
        self.remaining -= self.min_mem[ui]
        self.need, self.used = self.later_need[ui], None

    def leaves_room(self, state: RankState, cv: CandVec) -> bool:
        """Whether candidate cv of the unit `next` named leaves room for the units after it in `state` (as it was when
        `next` named the unit: its bytes summed once per unit, where a candidate first asks)."""
        if not (cv.every_mem or self.tiers):
            return True
        if self.used is None:
            self.used, self.least = sum(state.mem), min(state.mem)
        W, cap, need = len(state.mem), self.problem.cap_bytes, self.need
        return not (W * (state.UM + cv.every_mem) + self.used + sum(cv.shard_mem) + self.remaining + (W * need if self.tiers else 0)
                    > W * cap or (cv.every_mem and state.UM + cv.every_mem + self.least + need > cap))


def greedy(problem: Problem, order: list[int], replicate: dict[int, int] | None = None,
           deadline: float = float("inf"), requester_floor_ms: tuple[float, ...] = ()) -> RankState:
    """Place units in the given order; raises Unplaceable with the first unit that fits nowhere.

    replicate: units to make data-parallel first (unit -> its data-parallel candidate).
    A replica must leave the emptiest rank room for the largest shard some unit still to place
    needs (`largest_shard_needs`): replicas shrink every rank, and a table too big to split
    (small tables are offered table-wise only) would fit nowhere.
    Past `deadline` each remaining unit compares only its candidates that are not host-bound (all when none
    fits): placing table_row_wise and table_column_wise layouts (every host tried) is most of a pass's time
    (5,000 x 1,024: a pass 1.4-1.6 s of CPU, 0.9 without them, the plan 45.28 ms against 45.27; with
    one-shard layouts only, as before, 1.2-1.3 s and 233 ms: big tables whole); ``state.rushed`` counts those units.
    requester_floor_ms (per all-to-all phase; empty: none): the pass prices every rank as if its requester side
    were at least this much, as it will be once every unit is placed (the bound's LP solution projects it,
    `Bound.requester_ms`). Without it the requester side starts near 0, so early on a shard's all-to-all holder
    side looks as costly as it is alone, though at the end a rank holding less than the requester side
    pays nothing for it: the pass then balances holder sides that do not count and leaves the ones that do uneven
    (5,000 tables on 1,024 ranks, the same planning time: local search from such a start ended 12.0% above the
    bound, from the projected one 8.6%; not always lower though: on 400 tables on 256 ranks it ended higher).
    """
    state = RankState(problem)
    for ui, ci in (replicate or {}).items():
        if place(state, problem.units[ui], problem.units[ui].cands[ci], [], []) is not None:
            state.add(ui, ci, ())
    order = [ui for ui in order if state.choice[ui] is None]
    W = problem.topo.world_size
    min_work = [min(cv.work_ms + W * cv.every_ms for cv in problem.units[u].cands) for u in range(len(problem.units))]
    remaining = sum(min_work)
    ahead = MemoryAhead(problem, order)
    total = 0.0
    placed_u = state.U  # the requester side placed so far; state.U is what the pass prices (floored)
    state.U = _floored(placed_u, requester_floor_ms)
    for ui in order:
        unit = problem.units[ui]
        remaining -= min_work[ui]
        ahead.next(ui)
        costs = state.costs()
        cur_max = max(costs)
        by_cost = state.cheapest_first(unit.ranks, costs)
        rushed = time.perf_counter() > deadline
        best = None
        for no_host_bound in ((True, False) if rushed else (False,)):
            for ci, cv in enumerate(unit.cands):
                if no_host_bound and cv.host_bound:
                    continue
                shift = sum(cv.req_vec) + cv.every_ms  # upper bound of what every rank gains
                work = cv.work_ms + W * shift
                floor = max(cur_max + shift, (total + work + remaining) / W)  # its score whatever ranks it takes
                if best is not None and (floor, work) >= best[0]:  # its key is no lower: placing it cannot win
                    continue
                if not ahead.leaves_room(state, cv):
                    continue
                pick = place(state, unit, cv, by_cost, costs)
                if pick is None:
                    continue
                touched = max(map(add, map(costs.__getitem__, pick), cv.shard_cost), default=0.0)
                key = (max(touched + shift, floor), work)
                if best is None or key < best[0]:
                    best = (key, ci, pick, work)
            if best is not None:
                break
        state.rushed += rushed
        if best is None:
            raise Unplaceable(ui)
        _, ci, pick, work = best
        state.U = placed_u
        state.add(ui, ci, pick)
        placed_u = state.U
        state.U = _floored(placed_u, requester_floor_ms)
        total += work
    state.U = placed_u
    return state


def _floored(u: list[float], floor: tuple[float, ...]) -> list[float]:
    """u raised to floor per phase (u itself when there is no floor)."""
    return [max(a, f) for a, f in zip(u, floor)] if floor else u


def greedy_retrying(problem: Problem, order: list[int], replicate: dict[int, int] | None = None,
                    deadline: float = float("inf"), tries: int = RETRIES, requester_floor_ms: tuple[float, ...] = ()) -> RankState:
    """`greedy` (requester_floor_ms passed on), and when a unit fits nowhere, again with that unit first (the units placed before it
    filled the room it needed), up to `tries` passes in all while before `deadline`; raises the last
    Unplaceable."""
    for _ in range(tries - 1):
        try:
            return greedy(problem, order, replicate, deadline, requester_floor_ms)
        except Unplaceable as e:
            if time.perf_counter() > deadline:
                raise
            order = unit_first(order, e)
    return greedy(problem, order, replicate, deadline, requester_floor_ms)


def unit_first(order: list[int], failed: Unplaceable) -> list[int]:
    """order with the unit that fit nowhere first (the units before it filled the room it needed)."""
    return [failed.unit_index] + [u for u in order if u != failed.unit_index]


def default_order(problem: Problem) -> list[int]:
    """Units by the larger of their share of the average rank load and of one rank's memory cap."""
    W = problem.topo.world_size
    works = [min(cv.work_ms + W * cv.every_ms for cv in u.cands) for u in problem.units]
    avg = max(sum(works) / W, 1e-12)
    mems = [min(sum(cv.shard_mem) + W * cv.every_mem for cv in u.cands) for u in problem.units]
    key = [max(w / avg, m / problem.cap_bytes) for w, m in zip(works, mems)]
    return sorted(range(len(problem.units)), key=lambda i: -key[i])


def replication_prepass(problem: Problem, headroom: float = 1.1) -> dict[int, int]:
    """Pick units to replicate (data-parallel) before anything is placed.

    Replicating a table saves every rank its requester traffic for it and costs every rank
    a local lookup, a dense update and an all-reduce, plus a replica's bytes. Units with a
    net saving go in by saving per replica byte while the replicas leave room for the rest
    (their smallest total bytes over W, times `headroom`); a data-parallel mode group's only where
    they save more than its fixed cost (`Problem.group_ms`).
    """
    W = problem.topo.world_size
    options = []
    rest_bytes = 0.0
    for ui, unit in enumerate(problem.units):
        sharded = [cv for cv in unit.cands if not cv.data_parallel]
        rest = min((sum(cv.shard_mem) for cv in sharded), default=0)
        rest_bytes += rest
        for ci, cv in enumerate(unit.cands):
            if cv.data_parallel and sharded:
                saving = min(sum(s.req_vec) + s.every_ms for s in sharded) - cv.every_ms  # (half duplex: requester side in every_ms)
                if saving > 0:
                    options.append((saving / max(cv.every_mem, 1), ui, ci, cv.every_mem, rest, saving))
    budget = problem.free_bytes - headroom * rest_bytes / W
    needs = largest_shard_needs(problem)
    by_need = sorted(range(len(needs)), key=lambda u: -needs[u])  # the largest need of the units not chosen: the first of these not chosen
    replicas_bytes, first = 0, 0
    chosen: dict[int, int] = {}
    saved: dict[int, float] = {}  # per data-parallel mode group: what its chosen units save
    for _, ui, ci, mem, rest, saving in sorted(options, reverse=True):
        while first < len(by_need) and by_need[first] in chosen:
            first += 1
        other = next((u for u in by_need[first:] if u != ui and u not in chosen), None)
        if mem - headroom * rest / W <= budget and replicas_bytes + mem + (needs[other] if other is not None else 0) <= problem.free_bytes:
            chosen[ui] = ci
            budget -= mem - headroom * rest / W
            replicas_bytes += mem
            for g in problem.units[ui].cands[ci].every_groups:
                saved[g] = saved.get(g, 0.0) + saving
    # a group that saves less than its own fixed cost (`Problem.group_ms`) is not worth starting
    losing = {g for g, ms in saved.items() if problem.group_ms and ms <= problem.group_ms[g]}
    return {ui: ci for ui, ci in chosen.items() if not losing & set(problem.units[ui].cands[ci].every_groups)}
