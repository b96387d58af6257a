"""Local search on the slowest rank: move a shard, swap two shards, or re-shard a table.

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
from embshard.planner.search.rebalance import sweep, unreplicate
from embshard.planner.search.state import RankState

EPS = 1e-9
NEAREST_RANKS = 24  # ranks (cheapest first) tried as destinations per shard
PYTHON_MOVE_RANKS = 16  # `_try_move` in Python up to this many ranks (at most NEAREST_RANKS + 1: every destination tried)
SWAP_SHARDS = 16  # largest shards of the slowest rank tried in swaps
SWAP_RANKS = 8  # cheapest ranks tried as swap partners
MAX_RISE = 0.02  # a re-shard may lift the maximum this much if the smooth maximum falls
PATIENCE = 100  # steps without a new best maximum after which the search ends
KICK_AFTER = 20  # steps without a new best maximum before the first kick
KICK_UNITS = 6  # the slowest rank's hottest units a kick re-shards
KICK_LAYOUTS = 12  # layouts tried per unit in a kick (those that lift the fewest ranks to the maximum; tier variants once)
REPAIR_STEPS = 32  # moves and swaps a kick may take to bring every rank below the old maximum
REBALANCE_FIRST = 2.0  # a start is rebalanced before its kicks when less time is left than this many times its descent took


def _restricted(unit, cv, world_size: int) -> bool:
    """Does `_allowed` test more than "not a rank the unit holds" for a shard of candidate cv of unit: the unit is
    limited to some ranks, or cv to the host it is on?"""
    return cv.host_bound or len(unit.ranks) != world_size


def _allowed(state: RankState, ui: int, si: int, src: int, dst: int) -> bool:
    """May shard si of unit ui live on dst instead of src?"""
    if ui in state.held[dst]:
        return False
    unit = state.problem.units[ui]
    if dst not in unit.rank_set:
        return False
    ci, _ = state.choice[ui]
    if unit.cands[ci].host_bound:
        topo = state.problem.topo
        return topo.host_of(src) == topo.host_of(dst)
    return True


def _move_or_swap(state: RankState, r: int, costs: list[float]) -> bool:
    """`_try_move`, else `_try_swap`, on rank r; the ranks cheapest first (`RankState.cheapest_first`) are ranked only
    where a step needs them (a swap, or a move with tied destinations): most moves do not."""
    return _try_move(state, r, costs) or _try_swap(state, r, costs, state.cheapest_first(range(len(costs)), costs))


def _try_move(state: RankState, r: int, costs: list[float], by_cost: list[int] | None = None) -> bool:
    """Move the shard of r that gives the lowest max(r's time, its destination's time), if below r's time: of
    each shard, the first NEAREST_RANKS allowed destinations below it by their time with the shard (ties in
    `by_cost` order) are tried; ties between moves go to the first shard held, then the first destination tried.
    The destinations of every shard are costed at once (the same float operations as `RankState.cost_with`; on up to
    PYTHON_MOVE_RANKS ranks without kernel calls priced, in Python: `_try_move_few`).
    by_cost: `RankState.cheapest_first` of every rank (None: ranked here where needed)."""
    cmax, units, W = costs[r], state.problem.units, len(costs)
    call_ms, (u0, u1, u2), E, h = state.call_ms, state.U, state.E, state.H[r]
    h0, h1, h2, h3 = h
    held, cvs, kernels, rows, mem, host = [], [], [], [], [], []
    for ui, si in state.held[r].items():  # the shards whose leaving takes r below cmax
        cv = units[ui].cands[state.choice[ui][0]]
        _, v0, v1, v2, v3, m, hm, v, k = cv.shard_rows[si]
        if call_ms:
            c = state.cost_with(r, v, -1, k)
        else:  # cost_with's float operations (max(x, u) written out: x if x >= u else u)
            t0, t1, t2 = h0 - v0, h1 - v1, h2 - v2
            c = (t0 if t0 >= u0 else u0) + (t1 if t1 >= u1 else u1) + (t2 if t2 >= u2 else u2) + h3 - v3 + E
        if c < cmax - EPS:
            held.append((ui, si))
            cvs.append(cv)
            kernels.append(k)
            rows.append((v0, v1, v2, v3, c))
            mem.append(m)
            host.append(hm)
    if not held:
        return False
    if not call_ms and W <= PYTHON_MOVE_RANKS:
        return _try_move_few(state, r, costs, held, rows, mem, host, by_cost)
    X = np.array(rows)  # (shards, 4 + r's time without it)
    V = X[:, :4]
    Hn = state.Hn
    a2a = np.maximum(Hn[None, :, :3] + V[:, None, :3], np.array(state.U))  # (shards, ranks, phases)
    to = a2a[:, :, 0] + a2a[:, :, 1] + a2a[:, :, 2] + Hn[None, :, 3] + V[:, None, 3] + E
    if call_ms:
        to = to + call_ms * (state.num_kernels + len(state.every_kernels)) + np.array(
            [[state.calls_delta_ms(q, added=k) for q in range(W)] for k in kernels])
    val = np.maximum(X[:, 4:5], to)
    # the moves below cmax that fit (most calls have none: the destinations allowed are then not asked)
    fit = val < cmax - EPS
    fit &= np.asarray(state.mem) + np.array(mem)[:, None] + state.UM <= state.problem.cap_bytes  # (shards, ranks): HBM
    if any(host):
        hb = np.array(host)[:, None]
        fit &= (hb == 0) | (np.asarray(state.host) + hb <= state.problem.host_cap_bytes)
    if not fit.any():
        return False
    ok = state.move_destinations(r, held, cvs)
    ok &= np.asarray(costs) < cmax - EPS
    position = None
    if W - 1 > NEAREST_RANKS and ok.sum(axis=1).max() > NEAREST_RANKS:  # only the first NEAREST_RANKS allowed are tried
        by_cost = state.cheapest_first(range(W), costs) if by_cost is None else by_cost
        after, position = state.costs_after(V), np.empty(W, dtype=np.int64)
        position[by_cost] = np.arange(W)
        order = np.lexsort((np.broadcast_to(position, after.shape), after), axis=1)
        rows_i = np.arange(len(held))[:, None]
        tried = np.zeros_like(ok)
        tried[rows_i, order] = np.cumsum(ok[rows_i, order], axis=1) <= NEAREST_RANKS
        ok &= tried
    ok &= fit
    if not ok.any():
        return False
    val = np.where(ok, val, np.inf)
    low = val.min()
    i = int(np.flatnonzero((val == low).any(axis=1))[0])
    tied = np.flatnonzero(val[i] == low).tolist()
    q = tied[0]
    if len(tied) > 1:  # the first tried: by time with the shard, then in by_cost order
        after = state.costs_after(V[i])
        if position is None:
            by_cost = state.cheapest_first(range(W), costs) if by_cost is None else by_cost
            position = np.empty(W, dtype=np.int64)
            position[by_cost] = np.arange(W)
        q = min(tied, key=lambda q: (after[q], position[q]))
    state.move_shard(held[i][0], held[i][1], r, q)
    return True


def _try_move_few(state: RankState, r: int, costs: list[float], held: list[tuple[int, int]], rows: list[tuple],
                  mem: list[int], host: list[int], by_cost: list[int] | None) -> bool:
    """`_try_move` on few ranks (every destination is tried: at most NEAREST_RANKS others) without kernel calls priced,
    in Python: the same float operations, checks and ties as its arrays (8 ranks: about half their time)."""
    cmax, W = costs[r], len(costs)
    limit, (u0, u1, u2), E, H = cmax - EPS, state.U, state.E, state.H
    cap, UM, host_cap, used, host_used = state.problem.cap_bytes, state.UM, state.problem.host_cap_bytes, state.mem, state.host
    below = [q for q in range(W) if costs[q] < limit]
    low, best_i, tied = float("inf"), -1, []
    for i, ((ui, si), (v0, v1, v2, v3, c), m, hm) in enumerate(zip(held, rows, mem, host)):
        for q in below:
            h = H[q]
            t0, t1, t2 = h[0] + v0, h[1] + v1, h[2] + v2  # (max(x, u) written out: x if x >= u else u)
            to = (t0 if t0 >= u0 else u0) + (t1 if t1 >= u1 else u1) + (t2 if t2 >= u2 else u2) + h[3] + v3 + E
            val = to if to > c else c
            if val > low or val >= limit or used[q] + m + UM > cap or (hm and host_used[q] + hm > host_cap):
                continue
            if not _allowed(state, ui, si, r, q):  # (`RankState.move_destinations`' tests, asked only here)
                continue
            if val < low:
                low, best_i, tied = val, i, [q]
            elif i == best_i:  # (a tie in a later shard: the first shard's move wins)
                tied.append(q)
    if best_i < 0:
        return False
    q = tied[0]
    if len(tied) > 1:  # the first tried: by time with the shard, then in by_cost order
        after = state.costs_after(rows[best_i][:4])
        by_cost = state.cheapest_first(range(W), costs) if by_cost is None else by_cost
        position = {rank: k for k, rank in enumerate(by_cost)}
        q = min(tied, key=lambda q: (after[q], position[q]))
    state.move_shard(held[best_i][0], held[best_i][1], r, q)
    return True


def _try_swap(state: RankState, r: int, costs: list[float], by_cost: list[int]) -> bool:
    """Swap one of r's largest shards with a smaller shard of a cheap rank.

    Pairs that cannot fit under the destination's slack are skipped without costing them; r's time with a
    pair is costed first, and q's only where r's does not already rule the pair out (the same values as
    `_cost_delta` for both, and the same pair wins).
    """
    cmax = costs[r]
    units, W = state.problem.units, len(costs)
    cap = state.problem.cap_bytes - state.UM
    host_cap = state.problem.host_cap_bytes
    choice, held_r = state.choice, state.held[r]
    held = [(ui, si, units[ui].cands[choice[ui][0]]) for ui, si in held_r.items()]
    mine = sorted(held, key=lambda it: -it[2].shard_cost[it[1]])[:SWAP_SHARDS]
    call_ms = state.call_ms
    u0, u1, u2 = state.U
    E = state.E
    hr = state.H[r]
    hr3, limit = hr[3], cmax - EPS
    mem_r, host_r = state.mem[r], state.host[r]
    # per shard of r: its unit, index, cost, vector parts, bytes, host bytes, r's all-to-all holder sums without it,
    # whether `_allowed` must be asked (beyond "not a rank its unit holds"), its vector and kernels
    hr0, hr1, hr2 = hr[0], hr[1], hr[2]
    mine = [(ui, si, c, v0, v1, v2, v3, m, hm, hr0 - v0, hr1 - v1, hr2 - v2, _restricted(units[ui], cv, W), v, k)
            for ui, si, cv in mine for c, v0, v1, v2, v3, m, hm, v, k in (cv.shard_rows[si],)]
    if not mine:
        return False
    costliest, least_compute = max(m[2] for m in mine), min(m[6] for m in mine)
    best = None
    for q in by_cost[:SWAP_RANKS]:
        slack = cmax - costs[q]
        if q == r or slack <= EPS:
            continue
        hq, held_q = state.H[q], state.held[q]
        hq0, hq1, hq2, hq3 = hq
        mem_q, host_q = state.mem[q], state.host[q]
        # the shards of q some shard of r may swap with: cheaper than the costliest, above the least compute less the slack
        theirs = []
        for uj, sj in held_q.items():
            if uj in held_r:  # (`_allowed`'s first test, to r)
                continue
            unit_j = units[uj]
            cw = unit_j.cands[choice[uj][0]]
            c_j, w0, w1, w2, w3, mw, hj, w, k_j = cw.shard_rows[sj]
            if c_j < costliest and least_compute - c_j < slack and (
                    not _restricted(unit_j, cw, W) or _allowed(state, uj, sj, q, r)):
                theirs.append((uj, sj, c_j, w0, w1, w2, w3, mw, hj, hq0 - w0, hq1 - w1, hq2 - w2, w, k_j))
        if not theirs:
            continue
        for ui, si, c_i, v0, v1, v2, v3, m, hi, a0, a1, a2, ask, v, k_i in mine:
            if ui in held_q or (ask and not _allowed(state, ui, si, r, q)):
                continue
            for uj, sj, c_j, w0, w1, w2, w3, mw, hj, b0, b1, b2, w, k_j in theirs:
                # q's time grows by at least v's compute minus all of w (necessary condition)
                if c_j >= c_i or v3 - c_j >= slack:
                    continue
                if mem_q - mw + m > cap or mem_r - m + mw > cap:
                    continue
                if (hi or hj) and (host_q - hj + hi > host_cap or host_r - hi + hj > host_cap):
                    continue
                if call_ms:
                    val = max(_cost_delta(state, r, v, w, k_i, k_j), _cost_delta(state, q, w, v, k_j, k_i))
                else:  # _cost_delta's float operations, r's side first (max(x, u) written out: x if x >= u else u)
                    t0, t1, t2 = a0 + w0, a1 + w1, a2 + w2
                    val = (t0 if t0 >= u0 else u0) + (t1 if t1 >= u1 else u1) + (t2 if t2 >= u2 else u2) + hr3 - v3 + w3 + E
                    if val >= limit or (best is not None and val >= best[0]):
                        continue
                    t0, t1, t2 = b0 + v0, b1 + v1, b2 + v2
                    other = (t0 if t0 >= u0 else u0) + (t1 if t1 >= u1 else u1) + (t2 if t2 >= u2 else u2) + hq3 - w3 + v3 + E
                    if other > val:
                        val = other
                if val < limit and (best is None or val < best[0]):
                    best = (val, ui, si, q, uj, sj)
    if best is None:
        return False
    _, ui, si, q, uj, sj = best
    state.move_shard(ui, si, r, q)
    state.move_shard(uj, sj, q, r)
    return True


def _cost_delta(state: RankState, r: int, out_vec, in_vec, out_kernels: tuple[int, ...] = (), in_kernels: tuple[int, ...] = ()) -> float:
    """Rank r's cost if the shard out_vec (running out_kernels) left it and in_vec (in_kernels) came."""
    h, u = state.H[r], state.U
    c = (max(h[0] - out_vec[0] + in_vec[0], u[0]) + max(h[1] - out_vec[1] + in_vec[1], u[1])
         + max(h[2] - out_vec[2] + in_vec[2], u[2]) + h[3] - out_vec[3] + in_vec[3] + state.E)
    return c + state.calls_ms(r) + state.calls_delta_ms(r, out_kernels, in_kernels) if state.call_ms else c


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
        if time.perf_counter() > deadline or not _move_or_swap(state, r, costs):
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
        if not kick_first and _move_or_swap(state, r, costs):
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
