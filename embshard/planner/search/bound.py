"""Lower bound on the objective (slowest rank's predicted time) from an LP relaxation.

Variables y[u,c] in [0,1] pick candidate c for unit u (sum_c y[u,c] = 1); u_p >= the
requester side of all-to-all phase p (sum y * req_p, the same on every rank), e >= the
every-rank time (sum y * every-rank ms + the fixed base_ms), m_p bounds phase p on the
average rank, z is the bound. Any feasible plan satisfies:
- z >= sum_p m_p + (compute of all shards)/W + e, with m_p >= u_p and m_p >= (holder side
  summed over ranks)/W: the slowest rank is at least the average rank, and max(H, U) is
  convex (Jensen);
- for every unit u and set S of all-to-all phases: z >= sum_y y[u,c] * L[c,S] + sum_{p in S} u_p + e,
  where L[c,S] is the largest over c's shards of (its holder side of the phases not in S + its
  compute): the rank holding that shard pays max(H_p, U_p) >= U_p on the phases in S and >= the
  shard's own h_p on the others (S empty: the largest shard plus the every-rank time). With a large
  requester side (many ranks) this row, not the average, is what a big shard's rank must exceed.
  Rows with S non-empty are kept for the units whose cheapest L is largest and for those whose cheapest
  L over sharded (not data-parallel) candidates is largest (PHASE_ROW_UNITS and SHARDED_ROW_UNITS per S);
  any subset of valid rows gives a valid bound;
- sum of all candidates' bytes <= W * per-rank cap, and the data-parallel replicas
  (held by every rank) <= one rank's cap; likewise the host-memory bytes of shards kept in
  host memory (tiers) <= W * per-rank host cap.
Candidates whose largest shard cannot fit any rank (HBM or host memory) are excluded. A
shard's location and cache size are part of its candidate, so the bound covers them. Solved with HiGHS within a
time limit; when it runs out, `quick_bound_ms` (each unit's cheapest candidate per term,
no memory rows, S empty only: a relaxation of the same LP, so also a valid bound; and the average
rank's holder work, which the LP's m_p >= average holder side rows imply) is used instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from embshard.planner.search.problem import CandVec, Problem

PHASE_ROW_UNITS = 512  # per non-empty phase set S, the units with the largest least L given a largest-shard row with S
SHARDED_ROW_UNITS = 256  # and those with the largest least L over their sharded candidates
# phase sets S as bitmasks over the three all-to-all phases; column k of SUBSET_WEIGHTS weighs a shard vector's
# (input, output fwd, output bwd, compute) parts that count in L[c, S_k] (the phases not in S_k, and compute)
SUBSETS = tuple(range(8))
SUBSET_WEIGHTS = np.array([[0.0 if s >> p & 1 else 1.0 for s in SUBSETS] for p in range(3)] + [[1.0] * len(SUBSETS)])


def fitting_columns(problem: Problem) -> list[tuple[int, CandVec]]:
    """(unit, candidate) for every candidate whose largest shard fits a rank."""
    cap, host_cap = problem.free_bytes, problem.host_cap_bytes
    return [(ui, cv) for ui, unit in enumerate(problem.units) for cv in unit.cands
            if cv.largest_mem + cv.every_mem <= cap and cv.largest_host_mem <= host_cap]


def quick_bound_ms(problem: Problem) -> float:
    """The LP's average-rank and largest-shard rows with each term at its unit's cheapest candidate, and the
    average rank's work: max(H_p, U_p) >= H_p, so the slowest rank takes at least every unit's least
    (holder work summed over its shards) / W + every-rank time, summed (5,000 x 1,024: 29.35 ms against the
    LP's 30.21, where the terms' minima apart give 7.51: a replica's zero requester and holder sides)."""
    W = problem.topo.world_size
    cols = fitting_columns(problem)
    unit = np.array([ui for ui, _ in cols], dtype=np.int64)
    hold = np.array([cv.holder_sums for _, cv in cols]).reshape(len(cols), 4)
    every = np.array([cv.every_ms for _, cv in cols])
    # per column: compute/W + every, req_0..2, holder_0..2 / W, largest shard + every, holder work / W + every
    terms = np.column_stack([hold[:, 3] / W + every, np.array([cv.req_vec for _, cv in cols]).reshape(len(cols), 3), hold[:, :3] / W,
                             np.array([max(cv.shard_cost, default=0.0) for _, cv in cols]) + every, hold.sum(axis=1) / W + every])
    least = np.full((len(problem.units), terms.shape[1]), np.inf)
    np.minimum.at(least, unit, terms)
    least = least[np.isfinite(least[:, 0])]  # units with a column
    sums = least.sum(axis=0).tolist()
    average = max(sums[0] + sum(max(sums[1 + p], sums[4 + p]) for p in range(3)), sums[8])
    return problem.base_ms + max(average, float(least[:, 7].max()))


def _largest_shard_terms(cols: list[tuple[int, CandVec]]) -> np.ndarray:
    """L[j, k]: column j's largest shard under phase set SUBSETS[k] (0 for data-parallel candidates)."""
    L = np.zeros((len(cols), len(SUBSETS)))
    sharded = [j for j, (_, cv) in enumerate(cols) if cv.shard_vec]
    if not sharded:
        return L
    distinct = [tuple(dict.fromkeys(cols[j][1].shard_vec)) for j in sharded]  # shards of a candidate mostly repeat
    starts = np.cumsum([0] + [len(d) for d in distinct[:-1]])
    vecs = np.array([v for d in distinct for v in d])
    L[sharded] = np.maximum.reduceat(vecs @ SUBSET_WEIGHTS, starts, axis=0)
    return L


@dataclass(frozen=True)
class Bound:
    ms: float
    exact: bool  # the LP's bound (False: the quick bound, the LP ran out of time)
    requester_ms: tuple[float, ...] = ()  # the LP solution's requester side per all-to-all phase (empty: no LP solution)


def lower_bound_ms(problem: Problem, time_limit_s: float = float("inf")) -> tuple[float, bool]:
    """The LP bound, and True; or the quick bound and False when building and solving it runs past time_limit_s
    (the limit covers building the LP too: on large problems that is a good part of it)."""
    bound = solve_bound(problem, time_limit_s)
    return bound.ms, bound.exact


def solve_bound(problem: Problem, time_limit_s: float = float("inf")) -> Bound:
    """`lower_bound_ms` with the LP solution's requester side (what a plan choosing the LP's candidates
    would have every rank pay on its all-to-all phases: the greedy start prices ranks with it)."""
    start = time.perf_counter()
    W, cap = problem.topo.world_size, problem.free_bytes
    cols = fitting_columns(problem)
    n_y = len(cols)
    M0, U0, E, Z = n_y, n_y + 3, n_y + 6, n_y + 7  # column indexes of m_0..m_2, u_0..u_2, e and z
    n = n_y + 8
    unit = np.array([ui for ui, _ in cols])
    req = np.array([cv.req_vec for _, cv in cols]).reshape(n_y, 3)
    hold = np.array([cv.holder_sums for _, cv in cols]).reshape(n_y, 4) / W
    every = np.array([cv.every_ms for _, cv in cols])
    mem = np.array([float(sum(cv.shard_mem) + W * cv.every_mem) for _, cv in cols])
    every_mem = np.array([float(cv.every_mem) for _, cv in cols])
    L = _largest_shard_terms(cols)
    j_all = np.arange(n_y)
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (rows, columns, values), rows counted from `row`
    b_ub: list[float] = []

    def dense_row(values: np.ndarray, extra: dict[int, float], bound: float) -> None:
        """One row: values over the y columns, plus the named other columns, <= bound."""
        r = len(b_ub)
        keys = np.array(list(extra), dtype=np.int64)
        blocks.append((np.full(n_y + len(keys), r), np.concatenate([j_all, keys]), np.concatenate([values, list(extra.values())])))
        b_ub.append(bound)

    dense_row(every, {E: -1.0}, -problem.base_ms)  # e >= base + every-rank time
    dense_row(hold[:, 3], {M0: 1.0, M0 + 1: 1.0, M0 + 2: 1.0, E: 1.0, Z: -1.0}, 0.0)  # the average rank
    for p in range(3):
        dense_row(req[:, p], {U0 + p: -1.0}, 0.0)  # u_p >= requester side
        dense_row(np.zeros(n_y), {U0 + p: 1.0, M0 + p: -1.0}, 0.0)  # m_p >= u_p
        dense_row(hold[:, p], {M0 + p: -1.0}, 0.0)  # m_p >= average holder side
    dense_row(mem, {}, float(W) * cap)  # memory of the whole cluster
    dense_row(every_mem, {}, float(cap))  # every rank holds all data-parallel replicas
    host = np.array([float(sum(cv.shard_host_mem)) for _, cv in cols])
    if host.any():  # host memory of the whole cluster (tiers)
        dense_row(host, {}, float(W) * problem.host_cap_bytes)
    # largest-shard rows: unit u, phase set S: sum_c y L[c,S] + sum_{p in S} u_p + e - z <= 0
    num_units = len(problem.units)
    least = np.full((num_units, len(SUBSETS)), np.inf)
    np.minimum.at(least, unit, L)
    # rows with S non-empty go to the units with the largest least L, and to those with the largest least L over
    # their sharded candidates (a replica's L is 0, yet the LP may replicate a small hot table only in part and
    # keep the rest of it table-wise on one rank: at 5,000 x 1,024 such rows lift the bound 2.6%)
    sharded = np.array([not cv.data_parallel for _, cv in cols], dtype=bool)
    least_sharded = np.full((num_units, len(SUBSETS)), np.inf)
    np.minimum.at(least_sharded, unit[sharded], L[sharded])
    least_sharded[~np.isfinite(least_sharded)] = 0.0
    for k, s in enumerate(SUBSETS):
        chosen = np.flatnonzero(np.isfinite(least[:, k]))
        if s and len(chosen) > PHASE_ROW_UNITS:
            chosen = np.union1d(*(chosen[np.argsort(-key[chosen, k], kind="stable")[:n]]
                                  for key, n in ((least, PHASE_ROW_UNITS), (least_sharded, SHARDED_ROW_UNITS))))
        row_of = np.full(num_units, -1)
        row_of[chosen] = np.arange(len(chosen)) + len(b_ub)
        j = np.flatnonzero(row_of[unit] >= 0)
        others = [Z, E] + [U0 + p for p in range(3) if s >> p & 1]
        rows_k = row_of[chosen]
        blocks.append((np.concatenate([row_of[unit[j]], np.repeat(rows_k, len(others))]),
                       np.concatenate([j, np.tile(others, len(chosen))]),
                       np.concatenate([L[j, k], np.tile([-1.0] + [1.0] * (len(others) - 1), len(chosen))])))
        b_ub += [0.0] * len(chosen)
    rows, cidx, vals = (np.concatenate(x) for x in zip(*blocks))
    keep = vals != 0
    A_ub = coo_matrix((vals[keep], (rows[keep], cidx[keep])), shape=(len(b_ub), n)).tocsr()
    A_eq = coo_matrix((np.ones(n_y), (unit, j_all)), shape=(num_units, n)).tocsr()
    c = np.zeros(n)
    c[Z] = 1.0
    solve_s = time_limit_s - (time.perf_counter() - start)
    if solve_s <= 0:
        return Bound(quick_bound_ms(problem), False)
    # presolve off: on these LPs HiGHS's presolve costs about what it saves the simplex (criteo_tb_measured tiered:
    # linprog 13 -> 7 CPU ms, the same optimum to 1e-15 relative; its requester side may differ on sets with many optima)
    res = linprog(c, A_ub=A_ub, b_ub=np.array(b_ub), A_eq=A_eq, b_eq=np.ones(num_units),
                  bounds=[(0, 1)] * n_y + [(0, None)] * 8, method="highs",
                  options={"presolve": False, **({"time_limit": solve_s} if solve_s < float("inf") else {})})
    if res.status == 1:  # time limit
        return Bound(quick_bound_ms(problem), False)
    assert res.status == 0, f"lower-bound LP failed: {res.message}"
    return Bound(float(res.fun), True, tuple(float(v) for v in res.x[:n_y] @ req))
