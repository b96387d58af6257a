"""Lower bound on the objective (slowest rank's predicted time) from an LP relaxation.

Variables y[u,c] in [0,1] pick candidate c for unit u (sum_c y[u,c] = 1), m_p bounds each
all-to-all phase p, z is the bound. Any feasible plan satisfies:
- z >= sum_p m_p + (compute of all shards)/W + every-rank time (with the fixed base_ms), with m_p >= U_p (the
  requester side, the same on every rank) and m_p >= (holder side summed over ranks)/W:
  the slowest rank is at least the average rank, and max(H, U) is convex (Jensen);
- z >= the largest shard of u's candidate plus its every-rank time and base_ms, for every u;
- sum of all candidates' bytes <= W * per-rank cap, and the data-parallel replicas
  (held by every rank) <= one rank's cap; likewise the host-memory bytes of shards kept in
  host memory (tiers) <= W * per-rank host cap.
Candidates whose largest shard cannot fit any rank (HBM or host memory) are excluded. A
shard's location and cache size are part of its candidate, so the bound covers them. Solved with HiGHS within a
time limit; when it runs out, `quick_bound_ms` (each unit's cheapest candidate per term,
no memory rows: a relaxation of the same LP, so also a valid bound) is used instead.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from embshard.planner.search.problem import CandVec, Problem


def fitting_columns(problem: Problem) -> list[tuple[int, CandVec]]:
    """(unit, candidate) for every candidate whose largest shard fits a rank."""
    cap, host_cap = problem.free_bytes, problem.host_cap_bytes
    return [(ui, cv) for ui, unit in enumerate(problem.units) for cv in unit.cands
            if max(cv.shard_mem, default=0) + cv.every_mem <= cap and max(cv.shard_host_mem, default=0) <= host_cap]


def quick_bound_ms(problem: Problem) -> float:
    """The LP's average-rank and largest-shard rows with each term at its unit's cheapest candidate."""
    W = problem.topo.world_size
    best: dict[int, list[float]] = {}  # unit -> least (compute/W + every, req_0..2, holder_0..2 / W, largest shard + every)
    for ui, cv in fitting_columns(problem):
        h = cv.holder_sums
        terms = [h[3] / W + cv.every_ms, *cv.req_vec, *(x / W for x in h[:3]), max(cv.shard_cost, default=0.0) + cv.every_ms]
        old = best.get(ui)
        best[ui] = terms if old is None else [min(a, b) for a, b in zip(old, terms)]
    sums = [sum(col) for col in zip(*best.values())]
    average = sums[0] + sum(max(sums[1 + p], sums[4 + p]) for p in range(3))
    return problem.base_ms + max(average, max(t[7] for t in best.values()))


def lower_bound_ms(problem: Problem, time_limit_s: float = float("inf")) -> tuple[float, bool]:
    """The LP bound, and True; or the quick bound and False when building and solving it runs past time_limit_s
    (the limit covers building the LP too: on large problems that is a good part of it)."""
    start = time.perf_counter()
    W, cap = problem.topo.world_size, problem.free_bytes
    cols = fitting_columns(problem)
    n_y = len(cols)
    M0, Z = n_y, n_y + 3  # column indexes of m_0..m_2 and z
    rows, cidx, vals, b_ub = [], [], [], []
    row = 0

    def add(r: int, c: int, v: float) -> None:
        if v:
            rows.append(r)
            cidx.append(c)
            vals.append(v)

    # average rank: sum_p m_p + sum y * (compute/W + every) - z <= 0
    for j, (_, cv) in enumerate(cols):
        add(row, j, cv.holder_sums[3] / W + cv.every_ms)
    for p in range(3):
        add(row, M0 + p, 1.0)
    add(row, Z, -1.0)
    b_ub.append(0.0 - problem.base_ms)
    row += 1
    # m_p >= requester side and >= average holder side
    for p in range(3):
        for j, (_, cv) in enumerate(cols):
            add(row, j, cv.req_vec[p])
            add(row + 1, j, cv.holder_sums[p] / W)
        add(row, M0 + p, -1.0)
        add(row + 1, M0 + p, -1.0)
        b_ub += [0.0, 0.0]
        row += 2
    # per unit: z >= its largest shard (+ its every-rank time)
    first_row_of_unit = {}
    for j, (ui, cv) in enumerate(cols):
        if ui not in first_row_of_unit:
            first_row_of_unit[ui] = row
            add(row, Z, -1.0)
            b_ub.append(0.0 - problem.base_ms)
            row += 1
        add(first_row_of_unit[ui], j, max(cv.shard_cost, default=0.0) + cv.every_ms)
    # memory of the whole cluster
    for j, (_, cv) in enumerate(cols):
        add(row, j, float(sum(cv.shard_mem) + W * cv.every_mem))
    b_ub.append(float(W) * cap)
    row += 1
    # every rank holds all data-parallel replicas
    for j, (_, cv) in enumerate(cols):
        add(row, j, float(cv.every_mem))
    b_ub.append(float(cap))
    row += 1
    if any(cv.shard_host_mem for _, cv in cols):  # host memory of the whole cluster
        for j, (_, cv) in enumerate(cols):
            add(row, j, float(sum(cv.shard_host_mem)))
        b_ub.append(float(W) * problem.host_cap_bytes)
        row += 1

    n = n_y + 4
    A_ub = coo_matrix((vals, (rows, cidx)), shape=(row, n)).tocsr()
    eq_rows = [ui for ui, _ in cols]
    A_eq = coo_matrix((np.ones(n_y), (eq_rows, np.arange(n_y))), shape=(len(problem.units), n)).tocsr()
    c = np.zeros(n)
    c[Z] = 1.0
    solve_s = time_limit_s - (time.perf_counter() - start)
    if solve_s <= 0:
        return quick_bound_ms(problem), False
    res = linprog(c, A_ub=A_ub, b_ub=np.array(b_ub), A_eq=A_eq, b_eq=np.ones(len(problem.units)),
                  bounds=[(0, 1)] * n_y + [(0, None)] * 4, method="highs",
                  options={"time_limit": solve_s} if solve_s < float("inf") else None)
    if res.status == 1:  # time limit
        return quick_bound_ms(problem), False
    assert res.status == 0, f"lower-bound LP failed: {res.message}"
    return float(res.fun), True
