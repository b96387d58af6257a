"""Exact mixed-integer model of the placement, solved by HiGHS when it is small enough.

Binary y[u,c] picks candidate c for unit u; binary a[u,c,r] puts one of its shards on rank
r (sum_r a = k*y); host-bound candidates pick one host h[u,c,H] and keep their shards on
it. Rank r's time is sum_p m[r,p] + compute + every-rank time <= z with m[r,p] >= its
holder side and >= the requester side U_p; HBM and host memory per rank <= their caps. Shards of one candidate
are modelled with their component-wise smallest cost and bytes, which makes the model a
relaxation: its dual bound is a valid lower bound, and its solution is re-costed exactly
and polished by local search before it may replace the heuristic plan.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from embshard.planner.search.local import local_search
from embshard.planner.search.problem import Problem
from embshard.planner.search.state import RankState

MAX_BINARIES = 6000


def _objective(state: RankState) -> float:
    return max(state.costs())


def improve_with_ilp(problem: Problem, state: RankState, deadline: float) -> tuple[RankState | None, float, str]:
    """(better state or None, lower bound from the MILP or 0, a note on what happened)."""
    W, topo = problem.topo.world_size, problem.topo
    n_a = sum(len(u.ranks) for u in problem.units for cv in u.cands if not cv.data_parallel)
    if n_a > MAX_BINARIES:
        return None, 0.0, f"ilp skipped ({n_a} binaries > {MAX_BINARIES})"
    time_left = deadline - time.perf_counter()
    if time_left < 0.5:
        return None, 0.0, "ilp skipped (no time left)"

    cols: list[tuple] = []  # ("y", u, c) | ("a", u, c, r) | ("h", u, c, host)
    index = {}

    def col(key) -> int:
        if key not in index:
            index[key] = len(cols)
            cols.append(key)
        return index[key]

    for ui, unit in enumerate(problem.units):
        for ci, cv in enumerate(unit.cands):
            col(("y", ui, ci))
            if cv.data_parallel:
                continue
            for r in unit.ranks:
                col(("a", ui, ci, r))
            if cv.host_bound:
                for host in sorted({topo.host_of(r) for r in unit.ranks}):
                    col(("h", ui, ci, host))
    n_bin = len(cols)
    M = n_bin  # m[r,p] at M + 3*r + p
    Z = M + 3 * W
    n = Z + 1
    rows, cidx, vals, lo, hi = [], [], [], [], []
    row = 0

    def add(c: int, v: float) -> None:
        rows.append(row)
        cidx.append(c)
        vals.append(v)

    def close(lower: float, upper: float) -> None:
        nonlocal row
        lo.append(lower)
        hi.append(upper)
        row += 1

    def vec_min(cv, p: int) -> float:
        return min(v[p] for v in cv.shard_vec)

    for ui, unit in enumerate(problem.units):  # one candidate per unit
        for ci in range(len(unit.cands)):
            add(index[("y", ui, ci)], 1.0)
        close(1.0, 1.0)
        for ci, cv in enumerate(unit.cands):
            if cv.data_parallel:
                continue
            for r in unit.ranks:  # sum_r a = k y
                add(index[("a", ui, ci, r)], 1.0)
            add(index[("y", ui, ci)], -float(cv.num_shards))
            close(0.0, 0.0)
            if cv.host_bound:
                hosts = sorted({topo.host_of(r) for r in unit.ranks})
                for host in hosts:
                    add(index[("h", ui, ci, host)], 1.0)
                add(index[("y", ui, ci)], -1.0)
                close(0.0, 0.0)
                for r in unit.ranks:  # a <= h[host(r)]
                    add(index[("a", ui, ci, r)], 1.0)
                    add(index[("h", ui, ci, topo.host_of(r))], -1.0)
                    close(-np.inf, 0.0)
    for r in range(W):
        for p in range(3):
            # m[r,p] >= holder side; m[r,p] >= requester side
            for key, j in index.items():
                if key[0] == "a" and key[3] == r:
                    add(j, vec_min(problem.units[key[1]].cands[key[2]], p))
            add(M + 3 * r + p, -1.0)
            close(-np.inf, 0.0)
            for key, j in index.items():
                if key[0] == "y":
                    add(j, problem.units[key[1]].cands[key[2]].req_vec[p])
            add(M + 3 * r + p, -1.0)
            close(-np.inf, 0.0)
        # time: sum_p m + compute + every-rank <= z ; memory <= cap
        mem_row_terms, host_row_terms = [], []
        for key, j in index.items():
            cv = problem.units[key[1]].cands[key[2]]
            if key[0] == "a" and key[3] == r:
                add(j, vec_min(cv, 3))
                mem_row_terms.append((j, float(min(cv.shard_mem))))
                if cv.shard_host_mem:
                    host_row_terms.append((j, float(min(cv.shard_host_mem))))
            elif key[0] == "y" and cv.every_ms:
                add(j, cv.every_ms)
            if key[0] == "y" and cv.every_mem:
                mem_row_terms.append((j, float(cv.every_mem)))
        for p in range(3):
            add(M + 3 * r + p, 1.0)
        add(Z, -1.0)
        close(-np.inf, 0.0)
        for j, v in mem_row_terms:
            add(j, v)
        close(-np.inf, float(problem.free_bytes))
        if host_row_terms:
            for j, v in host_row_terms:
                add(j, v)
            close(-np.inf, float(problem.host_cap_bytes))

    A = coo_matrix((vals, (rows, cidx)), shape=(row, n)).tocsr()
    c = np.zeros(n)
    c[Z] = 1.0
    integrality = np.zeros(n)
    integrality[:n_bin] = 1
    upper = np.full(n, np.inf)
    upper[:n_bin] = 1.0
    # an upper bound on z from the heuristic's plan keeps the search to better solutions
    heuristic = _objective(state)
    upper[Z] = heuristic
    res = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=integrality, bounds=Bounds(np.zeros(n), upper),
               options={"time_limit": max(0.5, deadline - time.perf_counter()), "disp": False, "mip_rel_gap": 1e-4})
    bound = float(getattr(res, "mip_dual_bound", 0.0) or 0.0)
    if res.status == 0 and bound == 0.0:
        bound = float(res.fun)
    if res.x is None:
        # no solution better than the heuristic's found in time (or proven none exists)
        proven = res.status == 0 or "infeasible" in str(res.message).lower()
        return None, (heuristic if proven else bound), f"ilp({'heuristic optimal' if proven else 'no better solution in time'})"
    new = RankState(problem)
    x = res.x
    for ui, unit in enumerate(problem.units):
        ci = next(ci for ci in range(len(unit.cands)) if x[index[("y", ui, ci)]] > 0.5)
        cv = unit.cands[ci]
        ranks = () if cv.data_parallel else tuple(r for r in unit.ranks if x[index[("a", ui, ci, r)]] > 0.5)
        assert len(ranks) == (0 if cv.data_parallel else cv.num_shards)
        new.add(ui, ci, ranks)
    new, _ = local_search(new, deadline + 1.0)
    status = "optimal" if res.status == 0 else "time limit"
    if _objective(new) < heuristic - 1e-9 and all(new.mem[r] + new.UM <= problem.cap_bytes
                                                          and new.host[r] <= problem.host_cap_bytes for r in range(W)):
        return new, bound, f"ilp({status}, improved)"
    return None, bound, f"ilp({status}, no improvement)"
