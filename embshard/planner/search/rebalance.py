"""Rebalance a converged plan: take holder-side time that no rank hides off the ranks that pay it, then
turn replicas back into shards where that lowers the slowest rank.

Local search works on the slowest rank only, so where it converges other ranks may pay all-to-all holder
time above the requester side (H_p > U_p: it counts) while others hold less than the requester side
(it is hidden, free): at 5,000 tables x 1,024 ranks 1.0 ms of the mean rank's 31.1. `sweep` moves each shard
whose holder side counts on its rank to the rank where it adds the least, when that lowers the sum of rank
times and no rank reaches the maximum (the maximum never rises; the mean fell to 30.8 there). The room it makes
lets `unreplicate` place data-parallel tables (every rank pays their replica) as shards: one is accepted when the
slowest rank falls (there, from the converged 32.81 ms plan: 32.52, and 32.38 after local search; in a 10 s plan on
2 cores, where it runs before the kicks, 32.66 against 32.81).
"""

from __future__ import annotations

import time

import numpy as np

from embshard.planner.search.greedy import place_each
from embshard.planner.search.state import RankState

EPS = 1e-9


def sweep(state: RankState, deadline: float) -> int:
    """Move shards off ranks where part of their all-to-all holder side counts, to the rank where they add
    the least time, when the move lowers the sum of rank times and leaves every rank below the maximum;
    returns the moves made (`state` is modified). Not where lookup kernels cost (kernel_call_ms): it prices
    shards without them."""
    problem = state.problem
    if state.call_ms:
        return 0
    units = problem.units
    costs = state.cost_array()
    cmax = float(costs.max())
    mem, host = np.array(state.mem), np.array(state.host)
    moves = 0
    for ui, choice in enumerate(state.choice):
        ci, ranks = choice
        cv = units[ui].cands[ci]
        if cv.data_parallel or cv.host_bound:
            continue
        if time.perf_counter() > deadline:
            break
        for si in range(len(ranks)):
            src, v = state.choice[ui][1][si], cv.shard_vec[si]
            saved = costs[src] - state.cost_with(src, v, -1)
            if saved <= v[3] + EPS:  # only its compute counts there: it adds at least that anywhere
                continue
            after = state.costs_after(v)
            ok = (after < cmax - EPS) & (mem + cv.shard_mem[si] + state.UM <= problem.cap_bytes)
            if cv.shard_host_mem:
                ok &= host + cv.shard_host_mem[si] <= problem.host_cap_bytes
            ok &= state.move_destinations(src, [(ui, si)], [cv])[0]
            added = np.where(ok, after - costs, np.inf)
            q = int(np.argmin(added))
            if added[q] < saved - EPS:
                state.move_shard(ui, si, src, q)
                costs[src], costs[q] = state.cost(src), state.cost(q)
                mem[src], mem[q] = state.mem[src], state.mem[q]
                host[src], host[q] = state.host[src], state.host[q]
                moves += 1
    return moves


def unreplicate(state: RankState, deadline: float) -> int:
    """Re-place data-parallel units (the costliest replicas first) as the sharded layout that gives the lowest
    maximum, when that maximum is below the current one; returns how many (`state` is modified)."""
    units = state.problem.units
    dp = [ui for ui, (ci, _) in enumerate(state.choice) if units[ui].cands[ci].data_parallel]
    dp.sort(key=lambda ui: -units[ui].cands[state.choice[ui][0]].every_ms)
    done = 0
    for ui in dp:
        if time.perf_counter() > deadline:
            break
        cmax = float(state.cost_array().max())
        old = state.remove(ui)
        cis = [ci for ci, cv in enumerate(units[ui].cands) if not cv.data_parallel]
        if cis:  # those that hold a rank at the maximum with their requester side alone cannot take it below
            least = state.costs_without_shards(units[ui], cis).max(axis=1)
            cis = [ci for ci, m in zip(cis, least.tolist()) if m < cmax - EPS]
        best = None
        if cis:
            base = state.costs()
            for ci, pick, costs in place_each(state, ui, cis, state.cheapest_first(units[ui].ranks, base), base, ceiling=cmax):
                new_max = float(costs.max())
                if new_max < cmax - EPS and (best is None or new_max < best[0]):
                    best = (new_max, ci, pick)
        if best is None:
            state.add(ui, old[0], old[1])
        else:
            state.add(ui, best[1], best[2])
            done += 1
    return done
