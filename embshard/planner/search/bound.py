"""Lower bound on the objective (slowest rank's predicted time) from an LP relaxation.

Variables y[u,c] in [0,1] pick candidate c for unit u (sum_c y[u,c] = 1), m_p bounds each
all-to-all phase p, z is the bound. Any feasible plan satisfies:
- z >= sum_p m_p + (compute of all shards)/W + every-rank time (with the fixed base_ms), with m_p >= U_p (the
  requester side, the same on every rank) and m_p >= (holder side summed over ranks)/W:
  the slowest rank is at least the average rank, and max(H, U) is convex (Jensen);
- z >= the largest shard of u's candidate plus its every-rank time and base_ms, for every u;
- sum of all candidates' bytes <= W * per-rank cap, and the data-parallel replicas
  (held by every rank) <= one rank's cap.
Candidates whose largest shard cannot fit any rank are excluded. Solved with HiGHS.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from embshard.planner.search.problem import Problem


def lower_bound_ms(problem: Problem) -> float:
    W, cap = problem.topo.world_size, problem.free_bytes
    cols = []  # (unit, candvec) per y column
    for ui, unit in enumerate(problem.units):
        for cv in unit.cands:
            if max(cv.shard_mem, default=0) + cv.every_mem <= cap:
                cols.append((ui, cv))
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
        add(row, j, sum(v[3] for v in cv.shard_vec) / W + cv.every_ms)
    for p in range(3):
        add(row, M0 + p, 1.0)
    add(row, Z, -1.0)
    b_ub.append(0.0 - problem.base_ms)
    row += 1
    # m_p >= requester side and >= average holder side
    for p in range(3):
        for j, (_, cv) in enumerate(cols):
            add(row, j, cv.req_vec[p])
            add(row + 1, j, sum(v[p] for v in cv.shard_vec) / W)
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

    n = n_y + 4
    A_ub = coo_matrix((vals, (rows, cidx)), shape=(row, n)).tocsr()
    eq_rows = [ui for ui, _ in cols]
    A_eq = coo_matrix((np.ones(n_y), (eq_rows, np.arange(n_y))), shape=(len(problem.units), n)).tocsr()
    c = np.zeros(n)
    c[Z] = 1.0
    res = linprog(c, A_ub=A_ub, b_ub=np.array(b_ub), A_eq=A_eq, b_eq=np.ones(len(problem.units)),
                  bounds=[(0, 1)] * n_y + [(0, None)] * 4, method="highs")
    assert res.status == 0, f"lower-bound LP failed: {res.message}"
    return float(res.fun)
