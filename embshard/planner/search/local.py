"""Local search on the slowest rank: move a shard, swap two shards (search/moves.py), or re-shard a table.

A move or swap takes the slowest rank below the old maximum without lifting any rank to
it. Re-sharding (split a hot table further, merge it back, replicate it, or switch its
type) removes the table and places another candidate greedily; it is accepted when a
smooth maximum (the 32-norm of rank times) falls and the maximum rises at most 2%, which
lets replication help several slow ranks at once, or else when the maximum falls (on many
ranks, splitting a hot table finer lifts every rank's requester side a little and the smooth
maximum with it). When re-sharding goes round in circles (KICK_AFTER, and again PATIENCE, steps
without a new best) or finds nothing, a *kick* re-shards one of the slowest rank's hottest units even though that
lifts other ranks above the maximum, and then repairs them with moves and swaps: a compound
step that single moves cannot make (a hot table split over more ranks of a busy host). A kick from a placement
kicked before gives what it gave then (a kick is a function of the placement, up to the rounding of the running
sums), without running again. The best state seen is returned.
"""

from __future__ import annotations

import time

import numpy as np

from embshard.planner.search.greedy import place_each
from embshard.planner.search.moves import EPS, move_or_swap
from embshard.planner.search.rebalance import sweep, unreplicate
from embshard.planner.search.state import RankState

MAX_RISE = 0.02  # a re-shard may lift the maximum this much if the smooth maximum falls
PATIENCE = 100  # steps without a new best maximum after which the search ends
KICK_AFTER = 20  # steps without a new best maximum before the first kick
KICK_UNITS = 6  # the slowest rank's hottest units a kick re-shards
KICK_LAYOUTS = 12  # layouts tried per unit in a kick (those that lift the fewest ranks to the maximum; tier variants once)
REPAIR_STEPS = 32  # moves and swaps a kick may take to bring every rank below the old maximum
REBALANCE_FIRST = 2.0  # a start is rebalanced before its kicks when less time is left than this many times its descent took


def _potential(costs: np.ndarray, scale: float) -> float:
    """A smooth maximum (32-norm of times relative to `scale`): it falls when several of the
    slowest ranks drop even if a re-shard adds a little to every rank (replication does)."""
    return float(_potentials(costs, scale))


def _potentials(costs: np.ndarray, scale: float) -> np.ndarray:
    """_potential of each row of `costs` (of its last axis)."""
    return np.sum((costs / scale) ** 32, axis=-1)


def _reshard_targets(state: RankState, r: int, max_units: int) -> list[int]:
    """Units worth re-sharding for rank r: its hottest shards, data-parallel units (every
    rank holds them) and the units with the largest requester-side traffic (every rank pays it)."""
    units = state.problem.units
    hot = sorted(state.held[r], key=lambda ui: -units[ui].cands[state.choice[ui][0]].shard_cost[state.held[r][ui]])[:max_units]
    offset, data_parallel, every_ms, requester_ms = state.problem.flat_cands
    assert state.chosen.min() >= 0, "every unit is placed during local search"
    rows = offset + state.chosen
    dp = np.flatnonzero(data_parallel[rows])
    dp = dp[np.argsort(-every_ms[rows[dp]], kind="stable")[:max_units]].tolist()
    # (on half-duplex topologies the requester side is folded into every_ms)
    req = np.flatnonzero(~data_parallel[rows])
    req = req[np.argsort(-requester_ms[rows[req]], kind="stable")[:max_units]].tolist()
    out, seen = [], set()
    for ui in hot + dp + req:
        if ui not in seen:
            seen.add(ui)
            out.append(ui)
    return out


def _least_with_shards(least: np.ndarray, compute_desc: np.ndarray) -> np.ndarray:
    """Per candidate, every rank's cost without its shards (`least`, a row each) sorted, with its shards' compute times
    (`Unit.compute_desc`'s rows) added, the largest to the cheapest rank: no placement on distinct ranks has a lower
    maximum or smooth maximum (a shard lifts its rank at least by its compute time; pairing the largest with the
    cheapest minimises both, the potential being convex), rounding apart (the margin of 1e-12 below)."""
    out = np.sort(least, axis=1)
    out[:, :compute_desc.shape[1]] += compute_desc
    return out * (1 - 1e-12)


def _try_reshard(state: RankState, r: int, costs: list[float], max_units: int = 8) -> bool:
    """Re-shard the first of r's target units with a candidate that lowers the smooth maximum
    (lifting the maximum at most MAX_RISE) or lowers the maximum (a finer column split of a hot
    table adds requester-side traffic to every rank: with many ranks near the top the smooth
    maximum rises, yet the objective falls); of those, the one with the lowest smooth maximum."""
    units = state.problem.units
    cmax = costs[r]
    before = _potential(np.asarray(costs), cmax)
    ceiling = cmax * (1 + MAX_RISE)
    for ui in _reshard_targets(state, r, max_units):
        old = state.remove(ui)
        # a candidate whose ranks, at their least with its shards, are as high as the maximum and too high to smooth it
        # is not accepted (nor is one above the ceiling on any ranks; the mean-based `floors_ms` is not asked first: on
        # criteo_tb_measured tiered it ruled out no other candidate and cost a fifth of this loop, and the few it rules
        # out elsewhere are placed and rejected)
        least = _least_with_shards(state.costs_without_shards(units[ui], range(len(units[ui].cands))), units[ui].compute_desc)
        top = least.max(axis=1)
        high = top >= cmax - EPS
        keep, smoothed = ~high, np.flatnonzero(high & (top <= ceiling))  # (the smooth maximum only where it decides)
        keep[smoothed] = _potentials(least[smoothed], cmax) < before * (1 - 1e-9)
        cis = np.flatnonzero(keep).tolist()
        best, placed = None, []
        if cis:
            base = state.costs()
            placed = place_each(state, ui, cis, state.cheapest_first(units[ui].ranks, base), base, ceiling=ceiling)
        if placed:
            new_costs = np.array([arr for _, _, arr in placed])
            for (ci, pick, _), after, new_max in zip(placed, _potentials(new_costs, cmax).tolist(), new_costs.max(axis=1).tolist()):
                if (after < before * (1 - 1e-9) and new_max <= ceiling or new_max < cmax - EPS) and (best is None or after < best[0]):
                    best = (after, ci, pick)
        if best is not None:
            state.add(ui, best[1], best[2])
            return True
        state.add(ui, old[0], old[1])
    return False


def _kick(state: RankState, deadline: float) -> RankState | None:
    """Re-shard one of the slowest rank's hottest units with a layout that takes that rank below the
    maximum but lifts others above it (a hot table split over more ranks of a host whose other ranks
    are busy), then move and swap shards off the ranks above it (`_repair`). Returns the repaired
    copy, or None when no layout repairs within REPAIR_STEPS (`state` is left as it was)."""
    costs = state.costs()
    r = max(range(len(costs)), key=costs.__getitem__)
    cmax, units = costs[r], state.problem.units
    hot = sorted(state.held[r], key=lambda ui: -units[ui].cands[state.choice[ui][0]].shard_cost[state.held[r][ui]])
    for ui in hot[:KICK_UNITS]:
        if time.perf_counter() > deadline:
            return None
        old = state.remove(ui)
        floors = state.floors_ms(units[ui])
        layouts = []  # (ranks it lifts to the maximum, new maximum, candidate, ranks) of those that take r below it
        # (below a floor of cmax, moves and swaps cannot bring every rank below cmax)
        cis = [ci for ci, f in enumerate(floors) if f < cmax]
        if cis:  # nor can one that holds r at the maximum before its shards come take r below it
            cis = [ci for ci, c in zip(cis, state.costs_without_shards(units[ui], cis)[:, r]) if c < cmax - EPS]
        placed = []
        if cis:
            base = state.costs()
            placed = place_each(state, ui, cis, state.cheapest_first(units[ui].ranks, base), base)
        if placed:  # (the placed layouts' costs weighed at once)
            new_costs = np.array([arr for _, _, arr in placed])
            lifted, tops = np.count_nonzero(new_costs >= cmax - EPS, axis=1).tolist(), new_costs.max(axis=1).tolist()
            layouts = [(n, top, ci, pick) for (ci, pick, _), below, n, top
                       in zip(placed, (new_costs[:, r] < cmax - EPS).tolist(), lifted, tops) if below]
        # the fewest ranks to repair first; of a layout's tier variants on the same ranks only the first in this order is
        # tried (it lifts the fewest ranks, by the least), so other layouts get the slots (criteo_tb_measured tiered: the
        # kicks repair 21 layouts instead of 35, the same plans on benchmarks/plan_check.py's 17 problems)
        first_of = {}
        for item in sorted(layouts):
            first_of.setdefault((units[ui].cands[item[2]].layout, item[3]), item)
        layouts = list(first_of.values())[:KICK_LAYOUTS]
        # a layout with a shard that alone takes its rank to the maximum cannot be repaired (criteo_tb_measured tiered:
        # 9 of the 57 repairs that fail); it keeps its place in the order, so the layouts tried are those tried without this
        cis = [ci for _, _, ci, _ in layouts]
        doomed = {ci for ci, f in zip(cis, state.shard_floors_ms(units[ui], cis).tolist()) if f >= cmax}
        state.add(ui, old[0], old[1])
        for _, _, ci, pick in layouts:
            if time.perf_counter() > deadline:
                return None
            if ci in doomed:
                continue
            trial = state.copy()
            trial.remove(ui)
            trial.add(ui, ci, pick)
            if _repair(trial, cmax, deadline):
                return trial
    return None


def _kick_once(state: RankState, deadline: float, kicked: dict) -> RankState | None:
    """`_kick`, where a kick started from this placement before: what it gave then (a copy; a kick is a function of
    the placement, up to the rounding of the state's running sums, and the search from there may come back to a
    placement with other placements seen). kicked: placement -> the kicked state or None, filled here."""
    key = tuple(state.choice)
    if key in kicked:
        return None if kicked[key] is None else kicked[key].copy()
    out = _kick(state, deadline)
    kicked[key] = None if out is None else out.copy()
    return out


def _repair(state: RankState, target: float, deadline: float) -> bool:
    """Moves and swaps on the slowest rank (at most REPAIR_STEPS) until every rank is below target."""
    for _ in range(REPAIR_STEPS):
        costs = state.costs()
        r = max(range(len(costs)), key=costs.__getitem__)
        if costs[r] < target - EPS:
            return True
        if time.perf_counter() > deadline or not move_or_swap(state, r, costs):
            return False
    return max(state.costs()) < target - EPS


def local_search(state: RankState, deadline: float, max_steps: int = 100_000, kicks: bool = True,
                 kick_first: bool = False) -> tuple[RankState, int]:
    """Improve from `state` (modified) until no step helps, PATIENCE steps have not lowered
    the best maximum seen (re-shards may go round in circles), or the deadline.

    Moves and swaps never lift the maximum; a re-shard may, a little, so the best state is
    snapshotted before re-sharding from it; a kick (`_kick`, counted as a step) starts from the best
    state and returns a copy below its maximum, which the search goes on from (so the returned state
    may be a new object). kicks=False: a descent, which ends where a kick would start; kick_first: `state` is
    where one ended (its moves, swaps and re-shards were tried), so the search starts with a kick. Returns the
    best state seen and the steps taken.
    """
    steps, best_seen, stalled = 0, float("inf"), 0
    snapshot, snapshot_max = None, float("inf")
    visited = {tuple(state.choice)}  # a re-shard back to a state seen goes round in circles (A -> B lowers the
    # maximum, B -> A the smooth maximum): stop there, as when no re-shard helps
    kicks_done: dict = {}  # what a kick from a placement gave (dlrm_150 on 64 ranks kicked one placement 115 times)
    while steps < max_steps and time.perf_counter() < deadline:
        costs = state.costs()
        r = max(range(len(costs)), key=costs.__getitem__)
        if costs[r] < best_seen - EPS:
            best_seen, stalled = costs[r], 0
        elif stalled in (KICK_AFTER, PATIENCE):  # going round in circles: kick the best state seen
            kicked = _kick_once(snapshot if snapshot_max < costs[r] - EPS else state, deadline, kicks_done) if kicks else None
            if kicked is not None:
                state, stalled, steps = kicked, 0, steps + 1
                continue
            if stalled == PATIENCE:
                break
            stalled += 1
        else:
            stalled += 1
        if not kick_first and move_or_swap(state, r, costs):
            steps += 1
            continue
        if costs[r] < snapshot_max - EPS:
            snapshot, snapshot_max = state.copy(), costs[r]
        if kick_first or not _try_reshard(state, r, costs) or _revisits(state, visited):
            kick_first = False
            kicked = _kick_once(state, deadline, kicks_done) if kicks else None
            if kicked is None:
                break
            state = kicked
        steps += 1
    if snapshot is not None and snapshot_max < max(state.costs()) - EPS:
        return snapshot, steps
    return state, steps


class Polisher:
    """Local search for each start of a plan: a descent (moves, swaps, re-shards), then kicks from where it ends,
    for the starts where kicks may pay. Kicks cost several times a descent (criteo_tb_measured tiered on 8 ranks:
    0.007 CPU s a descent, 0.02 to 0.04 its kicks, most of it in the last kick, which finds nothing), and only the
    best start's plan is kept: a start's kicks run when its descent, lowered by the least ratio of kicked to
    descended maximum seen so far (`gain`), would beat the best plan polished so far (the first start's always run).
    A start is rebalanced (`rebalance`: embshard.planner.search.rebalance) before its kicks when less time is left
    than REBALANCE_FIRST times its descent took; plan() rebalances the best plan where its kicks ended."""

    def __init__(self) -> None:
        self.best_ms, self.gain = float("inf"), 1.0
        self.skipped = 0  # starts whose kicks did not run
        self.moved, self.unreplicated = 0, 0  # by `rebalance` (over all starts)

    def __call__(self, state: RankState, deadline: float) -> tuple[RankState, int]:
        start = time.perf_counter()
        descended, steps = local_search(state, deadline, kicks=False)
        # kicks that would not end in the time left (less than REBALANCE_FIRST times the descent took) come after
        # the surer gain of rebalancing; else plan() rebalances its best plan where its kicks ended (rebalancing
        # every start before its kicks: 200 x 64 ended at 1.2843 ms against 1.2667, 2,000 x 512 10.78 against 10.74).
        # At 5,000 x 1,024 (10 s budget) the first start's descent takes 1.1 CPU s to 33.38 ms and its share of the time
        # is then a little more than that: kicks first (a factor 1) stop at 33.04, rebalancing first (0.8 s with a short
        # descent after it) reaches 32.69, and kicks from there 32.42
        now = time.perf_counter()
        if deadline - now < REBALANCE_FIRST * (now - start):
            descended, steps = self.rebalance(descended, deadline, steps)
        ms = max(descended.costs())
        if ms * self.gain >= self.best_ms:
            self.skipped += 1
            return descended, steps
        kicked, more = local_search(descended, deadline, kick_first=True)
        self.gain = min(self.gain, max(kicked.costs()) / ms) if ms > 0 else self.gain
        self.best_ms = min(self.best_ms, max(kicked.costs()))
        return kicked, steps + more

    def rebalance(self, state: RankState, deadline: float, steps: int) -> tuple[RankState, int]:
        """Where the search converged: `rebalance.sweep` and `rebalance.unreplicate` (neither lifts the maximum),
        then a descent from there when that took the maximum down (steps: the start's so far, returned with the
        descent's added)."""
        ms = max(state.costs())
        self.moved += sweep(state, deadline)
        done = unreplicate(state, deadline)
        self.unreplicated += done
        if done and max(state.costs()) < ms:
            state, more = local_search(state, deadline, kicks=False)
            steps += more
        return state, steps


def _revisits(state: RankState, visited: set) -> bool:
    """Whether the state's placement was seen before (else it is remembered)."""
    key = tuple(state.choice)
    if key in visited:
        return True
    visited.add(key)
    return False
