"""Moves and swaps of shards off the slowest rank: the steps local search (search/local.py) takes first, and the
repairs after a kick.

A move takes one shard of rank r to another rank, a swap exchanges one of r's largest shards with a smaller one of a
cheap rank; either is made only if it takes r below its time without lifting the other rank to it (`move_or_swap`).
Both cost every candidate step from the state's running sums (`RankState`'s float operations), and keep to the ranks a
unit may use (`_allowed`) and to every rank's HBM and host memory.
"""

from __future__ import annotations

import numpy as np

from embshard.planner.search.state import RankState

EPS = 1e-9
NEAREST_RANKS = 24  # ranks (cheapest first) tried as destinations per shard
PYTHON_MOVE_RANKS = 16  # `_try_move` in Python up to this many ranks (at most NEAREST_RANKS + 1: every destination tried)
SWAP_SHARDS = 16  # largest shards of the slowest rank tried in swaps
SWAP_RANKS = 8  # cheapest ranks tried as swap partners


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


def move_or_swap(state: RankState, r: int, costs: list[float]) -> bool:
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
    state.move_shard(held[i][0], held[i][1], r, _first_tried(state, costs, by_cost, V[i], tied, position))
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
    state.move_shard(held[best_i][0], held[best_i][1], r, _first_tried(state, costs, by_cost, rows[best_i][:4], tied))
    return True


def _first_tried(state: RankState, costs: list[float], by_cost: list[int] | None, vec, tied: list[int], position=None) -> int:
    """Of the destinations ``tied`` for the best move of the shard of vector ``vec``, the one tried first: by time with
    the shard, then in `by_cost` order (ranked here if None; ``position``: each rank's place in it, if known)."""
    if len(tied) == 1:
        return tied[0]
    after = state.costs_after(vec)
    if position is None:
        by_cost = state.cheapest_first(range(len(costs)), costs) if by_cost is None else by_cost
        position = {rank: k for k, rank in enumerate(by_cost)}
    return min(tied, key=lambda q: (after[q], position[q]))


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
