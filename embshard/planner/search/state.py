"""The search's mutable rank state: what each rank holds of a `Problem`'s units, and its predicted time.

A rank's predicted time is  sum_p max(H_p, U_p) + H_compute + E + c * K  (embshard.planner.search.problem's
docstring: H the shards it holds, U every table's requester side, E the every-rank time, K its lookup kernels).
`RankState` keeps those sums as placements are added, removed and moved, and prices candidate placements without
making them (`cost_arrays_with`, `costs_after`, `floors_ms`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from embshard.planner.search.problem import CandVec, Problem, Unit


ROW_WRITES = 16  # `RankState.add` writes Hn row by row for up to this many shards
PYTHON_RANKS = 32  # `RankState.costs` and `cheapest_first` in Python up to this many ranks (numpy is faster from about 48)


class RankState:
    """Mutable placement state used inside the search (never leaves it)."""

    def __init__(self, problem: Problem) -> None:
        W = problem.topo.world_size
        self.problem = problem
        self.H = [[0.0, 0.0, 0.0, 0.0] for _ in range(W)]
        self.mem = [0] * W
        self.host = [0] * W  # host-memory bytes of the shards kept there
        self.U = [0.0, 0.0, 0.0]
        self.E = problem.base_ms
        self.UM = problem.base_mem
        self.Hn = np.zeros((W, 4))  # H as an array, for the all-rank costs (kept equal to H)
        self.held: list[dict[int, int]] = [dict() for _ in range(W)]  # rank -> {unit: shard index}
        self.choice: list[tuple[int, tuple[int, ...]] | None] = [None] * len(problem.units)
        self.chosen = np.full(len(problem.units), -1)  # each unit's candidate in choice (-1: not placed)
        # lookup kernels (only tracked when they cost): shards per kernel on each rank, and
        # data-parallel units per kernel every rank runs; K of a rank = len(kernels[r]) + len(every_kernels)
        self.call_ms = problem.call_ms
        self.kernels: list[dict[int, int]] = [dict() for _ in range(W)]
        self.num_kernels = np.zeros(W)  # len(kernels[r]) per rank
        self.every_kernels: dict[int, int] = {}
        self.every_groups: dict[int, int] = {}  # data-parallel units per mode group; E holds each present group's cost
        self.hosts_of: tuple[list[int], list[list[int]]] | None = None  # greedy.place's per-host split of one rank order
        self.rushed = 0  # units greedy placed past its deadline (no host-bound candidates)

    def copy(self) -> "RankState":
        """An independent copy sharing the (immutable) problem."""
        new = RankState.__new__(RankState)
        new.problem = self.problem
        new.H = [list(h) for h in self.H]
        new.Hn = self.Hn.copy()
        new.num_kernels = self.num_kernels.copy()
        new.mem = list(self.mem)
        new.host = list(self.host)
        new.U = list(self.U)
        new.E, new.UM = self.E, self.UM
        new.held = [dict(h) for h in self.held]
        new.choice = list(self.choice)
        new.chosen = self.chosen.copy()
        new.call_ms = self.call_ms
        new.kernels = [dict(k) for k in self.kernels]
        new.every_kernels = dict(self.every_kernels)
        new.every_groups = dict(self.every_groups)
        new.hosts_of = None
        new.rushed = self.rushed
        return new

    def calls_ms(self, r: int) -> float:
        """Fixed cost of the lookup kernels rank r runs (0 in the datasheet model)."""
        return self.call_ms * (len(self.kernels[r]) + len(self.every_kernels)) if self.call_ms else 0.0

    def calls_delta_ms(self, r: int, removed: tuple[int, ...] = (), added: tuple[int, ...] = ()) -> float:
        """Change of calls_ms(r) if a shard running kernels `removed` left r and one running `added` came."""
        if not self.call_ms:
            return 0.0
        k = self.kernels[r]
        gone = sum(1 for g in removed if k.get(g) == 1 and g not in added)
        new = sum(1 for g in added if not k.get(g) and g not in removed)
        return self.call_ms * (new - gone)

    def cost(self, r: int) -> float:
        h, u = self.H[r], self.U
        c = max(h[0], u[0]) + max(h[1], u[1]) + max(h[2], u[2]) + h[3] + self.E
        return c + self.calls_ms(r) if self.call_ms else c

    def cost_with(self, r: int, vec: tuple[float, ...], sign: float, kernels: tuple[int, ...] = ()) -> float:
        """Rank r's cost if a shard (vector vec, running `kernels`) came (sign 1) or left (-1)."""
        h, u = self.H[r], self.U
        c = (max(h[0] + sign * vec[0], u[0]) + max(h[1] + sign * vec[1], u[1])
             + max(h[2] + sign * vec[2], u[2]) + h[3] + sign * vec[3] + self.E)
        if not self.call_ms:
            return c
        delta = self.calls_delta_ms(r, added=kernels) if sign > 0 else self.calls_delta_ms(r, removed=kernels)
        return c + self.calls_ms(r) + delta

    def costs(self) -> list[float]:
        """Every rank's cost(r): `cost_array`'s float operations, on few ranks (and no kernel calls priced) in Python,
        which there takes a quarter of numpy's time (8 ranks: 1.4 against 5.5 us; a plan asks hundreds of times)."""
        if self.call_ms or len(self.H) > PYTHON_RANKS:
            return self.cost_array().tolist()
        (u0, u1, u2), E = self.U, self.E  # max(x, u) written out: x if x >= u else u
        return [(h[0] if h[0] >= u0 else u0) + (h[1] if h[1] >= u1 else u1) + (h[2] if h[2] >= u2 else u2) + h[3] + E
                for h in self.H]

    def cost_array(self) -> np.ndarray:
        """costs() as an array."""
        h = self.Hn
        a2a = np.maximum(h[:, :3], self.U)  # each all-to-all phase: max(H_p, U_p)
        c = a2a[:, 0] + a2a[:, 1] + a2a[:, 2] + h[:, 3] + self.E
        if self.call_ms:
            c = c + self.call_ms * (self.num_kernels + len(self.every_kernels))
        return c

    def cost_array_with(self, ui: int, ci: int, ranks: tuple[int, ...]) -> np.ndarray:
        """cost_array() with unit ui (not placed) as candidate ci on `ranks`; the state is left as it was."""
        return self.cost_arrays_with(ui, [(ci, ranks)])[0]

    def cost_arrays_with(self, ui: int, picks: list[tuple[int, tuple[int, ...]]]) -> np.ndarray:
        """cost_array_with(ui, ci, ranks) for each (ci, ranks) of `picks`, one row each (computed at once)."""
        unit = self.problem.units[ui]
        if self.call_ms:  # kernel counts change too: place each and take it back
            rows = []
            for ci, ranks in picks:
                self.add(ui, ci, ranks)
                rows.append(self.cost_array())
                self.add(ui, ci, ranks, -1)
            return np.array(rows).reshape(len(picks), len(self.H))
        cands = unit.cands
        h = np.repeat(self.Hn[None], len(picks), axis=0)
        placed = [(j, ranks) for j, (_, ranks) in enumerate(picks) if ranks]
        if placed:
            h[[j for j, ranks in placed for _ in ranks], [r for _, ranks in placed for r in ranks]] += np.concatenate(
                [cands[picks[j][0]].shard_array for j, _ in placed])
        return self._priced(h, unit, [ci for ci, _ in picks])

    def costs_without_shards(self, unit: Unit, cis: list[int]) -> np.ndarray:
        """Per candidate ci of `cis` (of a unit not placed), every rank's cost with its requester side and every-rank
        part but none of its shards (kernel calls as they are): at most `cost_arrays_with`'s on any ranks, rank by
        rank (the same float operations on terms no larger), so a candidate this rules out needs no placing."""
        c = self._priced(self.Hn[None], unit, cis)
        return c + self.call_ms * (self.num_kernels + len(self.every_kernels)) if self.call_ms else c

    def shard_floors_ms(self, unit: Unit, cis: list[int]) -> np.ndarray:
        """Per candidate ci of `cis` (of a unit not placed), the least time of a rank that holds its costliest shard
        (of its distinct ones: `Unit.padded_shards`) alone, with the candidate's requester side and every-rank part
        added: sum_p max(v_p, U_p) + v_compute + E (kernel calls left out), at most the time of any rank holding that
        shard whatever else it holds. Moves and swaps keep shards whole, so a layout with this at a target or above
        cannot be repaired to it."""
        if not cis:
            return np.zeros(0)
        return self._priced(unit.padded_shards[cis], unit, cis).max(axis=1)

    def _priced(self, h: np.ndarray, unit: Unit, cis: list[int]) -> np.ndarray:
        """Per candidate ci of `cis` (of `unit`), every rank's cost (kernel calls left out) from holder sums h[j]
        ((n, W, 4), or (1, W, 4) for all alike) and the state's requester side and every-rank time with its added."""
        _, req, every = unit.sums
        whole = isinstance(cis, range) and len(cis) == len(unit.cands)  # every candidate: the arrays whole (no index array)
        u, tail = np.array(self.U) + (req if whole else req[cis]), self.E + (every if whole else every[cis])
        for j in unit.grouped if whole else [j for j, ci in enumerate(cis) if unit.cands[ci].every_groups]:
            tail[j] += self._new_groups_ms(unit.cands[cis[j]])
        a2a = np.maximum(h[:, :, :3], u[:, None, :])
        return a2a[:, :, 0] + a2a[:, :, 1] + a2a[:, :, 2] + h[:, :, 3] + tail[:, None]

    def floors_ms(self, unit: Unit) -> list[float]:
        """Per candidate of `unit`, a lower bound on the slowest rank's time with it added on any ranks: the mean
        over ranks, at least sum_p max(sum_r H_rp, W U_p) / W + sum_r H_r3 / W + E (kernel calls and new
        mode groups left out). Moves and swaps keep these sums, so no moving of shards brings every rank
        below it; a layout that lifts it above a target cannot be repaired to it. (All candidates at once.)"""
        W = len(self.H)
        s, u = self.Hn.sum(axis=0), self.U
        h, q, every = unit.sums
        a2a = np.maximum(s[:3] + h[:, :3], W * (np.array(u) + q))  # (candidates, phases)
        return ((a2a[:, 0] + a2a[:, 1] + a2a[:, 2] + s[3] + h[:, 3]) / W + self.E + every).tolist()

    def _new_groups_ms(self, cv: CandVec) -> float:
        """Fixed cost of the mode groups cv's replica would start (none of its group placed yet)."""
        return sum(self.problem.group_ms[g] for g in cv.every_groups if not self.every_groups.get(g))

    def move_destinations(self, r: int, held: Sequence[tuple[int, int]], cvs: Sequence) -> np.ndarray:
        """(shards (unit, shard index) of rank r with their units' candidates, ranks): whether each shard may move
        to the rank: not one its unit already holds, one of its unit's ranks, and in r's host if host-bound."""
        W, topo, units = len(self.H), self.problem.topo, self.problem.units
        taken = [i * W + q for i, (ui, _) in enumerate(held) for q in self.choice[ui][1]]  # a unit has one shard per rank
        out = np.ones(len(held) * W, dtype=bool)
        out[taken] = False
        out = out.reshape(len(held), W)
        for i, ((ui, _), cv) in enumerate(zip(held, cvs)):
            if len(units[ui].ranks) != W:
                out[i] &= np.isin(np.arange(W), units[ui].ranks)
            if cv.host_bound:
                out[i] &= np.arange(W) // topo.local_world_size == topo.host_of(r)
        return out

    def cheapest_first(self, ranks: Sequence[int], costs: list[float]) -> list[int]:
        """Ranks by time, ties (ranks whose all-to-all is bound by the requester side) broken
        by the work they hold, so hidden holder load stays balanced too (a stable sort; on few ranks in Python,
        the same sums and order)."""
        if len(self.H) <= PYTHON_RANKS:
            H = self.H
            return sorted(ranks, key=lambda r: (costs[r], H[r][0] + H[r][1] + H[r][2] + H[r][3]))
        h = self.Hn
        work = h[:, 0] + h[:, 1] + h[:, 2] + h[:, 3]
        c = np.asarray(costs)
        if len(ranks) == len(c):  # every rank (ranks are sorted: a unit's, or range)
            order = np.lexsort((work, c))
        else:
            idx = np.asarray(ranks if isinstance(ranks, (list, tuple)) else list(ranks), dtype=np.int64)
            order = idx[np.lexsort((work[idx], c[idx]))]
        return order.tolist()

    def costs_after(self, vec) -> np.ndarray:
        """Every rank's cost if a shard with vector vec came to it (kernel calls left out); vec (n, 4): one
        row of costs per vector, (n, W)."""
        h, u, v = self.Hn, self.U, np.asarray(vec, dtype=float)
        if v.ndim == 2:
            h, v = h[None], v[:, None, :]
        a2a = np.maximum(h[..., :3] + v[..., :3], u)
        return a2a[..., 0] + a2a[..., 1] + a2a[..., 2] + h[..., 3] + (v[..., 3] + self.E)

    def fits(self, r: int, extra_bytes: int, extra_host_bytes: int = 0) -> bool:
        return (self.mem[r] + extra_bytes + self.UM <= self.problem.cap_bytes
                and (not extra_host_bytes or self.host[r] + extra_host_bytes <= self.problem.host_cap_bytes))

    def fits_shard(self, r: int, cv: CandVec, i: int) -> bool:
        """Rank r has room (HBM and host memory) for shard i of cv."""
        return self.fits(r, cv.shard_mem[i], cv.host_mem(i))

    def add(self, ui: int, ci: int, ranks: tuple[int, ...], sign: int = 1) -> None:
        cv = self.problem.units[ui].cands[ci]
        # Hn's rows of the ranks: written from their H lists (the same sums) for a few shards, else added at once
        # (8 ranks, one shard: 0.4 against 4.6 us; 1,024 shards: 342 against 101 us)
        rows = len(ranks) <= ROW_WRITES
        if not rows and sign > 0:
            self.Hn[list(ranks)] += cv.shard_array
        elif not rows:
            self.Hn[list(ranks)] -= cv.shard_array
        Hn = self.Hn
        for i, r in enumerate(ranks):
            h, v = self.H[r], cv.shard_vec[i]
            if sign > 0:
                h[0] += v[0]
                h[1] += v[1]
                h[2] += v[2]
                h[3] += v[3]
                self.held[r][ui] = i
            else:
                h[0] -= v[0]
                h[1] -= v[1]
                h[2] -= v[2]
                h[3] -= v[3]
                del self.held[r][ui]
            if rows:
                Hn[r] = h
            self.mem[r] += sign * cv.shard_mem[i]
            if cv.shard_host_mem:
                self.host[r] += sign * cv.shard_host_mem[i]
            if cv.shard_kernels:
                self.num_kernels[r] += _count(self.kernels[r], cv.shard_kernels[i], sign)
        u, rv = self.U, cv.req_vec
        u[0] += sign * rv[0]
        u[1] += sign * rv[1]
        u[2] += sign * rv[2]
        self.E += sign * cv.every_ms
        if cv.every_kernels:
            _count(self.every_kernels, cv.every_kernels, sign)
        if cv.every_groups:  # (a group's fixed cost comes with its first unit and goes with its last)
            if sign > 0:
                self.E += self._new_groups_ms(cv)
            _count(self.every_groups, cv.every_groups, sign)
            if sign < 0:
                self.E -= self._new_groups_ms(cv)
        self.UM += sign * cv.every_mem
        self.choice[ui] = (ci, ranks) if sign > 0 else None
        self.chosen[ui] = ci if sign > 0 else -1

    def remove(self, ui: int) -> tuple[int, tuple[int, ...]]:
        choice = self.choice[ui]
        assert choice is not None
        self.add(ui, choice[0], choice[1], -1)
        return choice

    def move_shard(self, ui: int, shard: int, src: int, dst: int) -> None:
        ci, ranks = self.choice[ui]
        cv = self.problem.units[ui].cands[ci]
        v, m = cv.shard_vec[shard], cv.shard_mem[shard]
        hs, hd = self.H[src], self.H[dst]
        hs[0], hs[1], hs[2], hs[3] = hs[0] - v[0], hs[1] - v[1], hs[2] - v[2], hs[3] - v[3]
        hd[0], hd[1], hd[2], hd[3] = hd[0] + v[0], hd[1] + v[1], hd[2] + v[2], hd[3] + v[3]
        self.Hn[src], self.Hn[dst] = hs, hd
        self.mem[src] -= m
        self.mem[dst] += m
        if cv.shard_host_mem:
            self.host[src] -= cv.shard_host_mem[shard]
            self.host[dst] += cv.shard_host_mem[shard]
        if cv.shard_kernels:
            self.num_kernels[src] += _count(self.kernels[src], cv.shard_kernels[shard], -1)
            self.num_kernels[dst] += _count(self.kernels[dst], cv.shard_kernels[shard], 1)
        del self.held[src][ui]
        self.held[dst][ui] = shard
        new_ranks = list(ranks)
        new_ranks[shard] = dst
        self.choice[ui] = (ci, tuple(new_ranks))


def _count(counts: dict[int, int], keys: tuple[int, ...], sign: int) -> int:
    """Add sign to each key's count (dropping zeros); returns the change in distinct keys."""
    before = len(counts)
    for g in keys:
        n = counts.get(g, 0) + sign
        if n:
            counts[g] = n
        else:
            del counts[g]
    return len(counts) - before
