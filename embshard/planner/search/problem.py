"""The search's view of a planning problem: units, candidate vectors and the rank state.

A *unit* is what the search places: one table, or a keep_together group of tables placed
table-wise on one rank. Each candidate is flattened to plain floats for speed:
shard vector (input, output fwd, output bwd, compute) in ms, shard bytes (HBM, and host
memory for shards kept there: embshard.planner.cost.tiers), the requester
vector every rank pays on its all-to-all phases, the every-rank compute and bytes.

A rank's predicted time is  sum_p max(H_p, U_p) + H_compute + E + c * K  over the three
all-to-all phases p, where H sums the shards it holds, U the requester side of every
table, E the every-rank time (data-parallel tables, the step's fixed per-collection
costs and each data-parallel mode group's, `mode_group_perf`) and K the lookup kernels the rank runs, at c = `kernel_call_ms` each. This is
`embshard.planner.cost.perf.rank_perfs` flattened: on half-duplex topologies
(``full_duplex`` false) an all-to-all phase costs H_p + U_p, so the requester side is
folded into E and U is zero; c and the fixed costs are 0 in the datasheet model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Iterable, Sequence

import numpy as np

from embshard.planner.cost.perf import dp_mode_of, fixed_perf, kernel_call_ms, kernel_group, mode_group_perf, num_collections
from embshard.planner.cost.storage import requester_storage
from embshard.planner.enumerate import candidate, enumerate_candidates, forward_only
from embshard.planner.types import Candidate, Constraints, Perf, ShardingType
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology


def perf_vector(p: Perf) -> tuple[float, float, float, float]:
    return (p.input_dist_ms, p.output_dist_fwd_ms, p.output_dist_bwd_ms, p.lookup_fwd_ms + p.lookup_bwd_ms + p.dp_allreduce_ms)


@dataclass(frozen=True)
class CandVec:
    cand: tuple[Candidate, ...]  # one per member table of the unit (same type and count)
    shard_vec: tuple[tuple[float, float, float, float], ...]
    shard_cost: tuple[float, ...]  # sum of the shard's vector (its standalone time)
    shard_mem: tuple[int, ...]
    req_vec: tuple[float, float, float]
    every_ms: float
    every_mem: int
    host_bound: bool
    data_parallel: bool
    shard_kernels: tuple[tuple[int, ...], ...] = ()  # per shard: the lookup kernels it runs in (when they cost)
    every_kernels: tuple[int, ...] = ()  # kernels every rank runs for it (data-parallel)
    shard_host_mem: tuple[int, ...] = ()  # per shard: host-memory bytes (empty: none, every shard in HBM)
    every_groups: tuple[int, ...] = ()  # the data-parallel mode group it runs a replica in (index in DATA_PARALLEL_MODES)

    def host_mem(self, i: int) -> int:
        """Host-memory bytes of shard i."""
        return self.shard_host_mem[i] if self.shard_host_mem else 0

    @property
    def num_shards(self) -> int:
        return len(self.shard_vec)

    @cached_property
    def holder_sums(self) -> tuple[float, float, float, float]:
        """The shard vectors summed over the candidate's shards."""
        return tuple(sum(v[p] for v in self.shard_vec) for p in range(4))

    @cached_property
    def largest_mem(self) -> int:
        """The largest shard's HBM bytes (0 for a data-parallel candidate)."""
        return max(self.shard_mem, default=0)

    @cached_property
    def largest_host_mem(self) -> int:
        """The largest shard's host-memory bytes (0: every shard in HBM)."""
        return max(self.shard_host_mem, default=0)

    @cached_property
    def shard_array(self) -> np.ndarray:
        """shard_vec as a (shards, 4) array."""
        return np.asarray(self.shard_vec)

    @cached_property
    def largest_first(self) -> list[int]:
        """Shard indexes, the costliest first (a stable sort)."""
        return sorted(range(len(self.shard_cost)), key=lambda i: -self.shard_cost[i])

    @property
    def label(self) -> str:
        return self.cand[0].label

    @property
    def work_ms(self) -> float:
        """Lower bound of the total rank-time this candidate adds across all ranks (holder side)."""
        return sum(self.shard_cost)


def _combine(cands: list[Candidate], specs: tuple[TableSpec, ...], topo: Topology, kernel_index: Callable[[tuple], int] | None,
             requester_bytes: tuple[int, ...]) -> CandVec:
    """Flatten one candidate per member table (members of a unit are placed shard-aligned).

    kernel_index: kernel group -> int, or None when kernel calls cost nothing; requester_bytes: per member, its
    requester buffers (`requester_storage`, reserved up front in Problem.base_mem)."""
    assert all(c.num_shards == cands[0].num_shards and c.sharding_type is cands[0].sharding_type for c in cands)
    # equal blocks share one ShardCost object: flatten each distinct one once
    if len(cands) == 1:  # a table alone: its ShardCost objects are the keys
        keys = list(map(id, cands[0].shards))
        columns = {k: (sc,) for k, sc in zip(keys, cands[0].shards)}
    else:
        parts_of = list(zip(*(c.shards for c in cands)))  # per shard: one ShardCost per member
        keys = [tuple(map(id, parts)) for parts in parts_of]
        columns = dict(zip(keys, parts_of))
    flat = {}
    for key, parts in columns.items():
        vec = tuple(map(sum, zip(*(perf_vector(sc.perf) for sc in parts))))
        flat[key] = (vec, sum(vec), sum(sc.storage.total_bytes for sc in parts), sum(sc.storage.host_bytes for sc in parts))
    # per shard (the per-shard work in C); none for a data-parallel candidate
    vecs, shard_cost, shard_mem, shard_host = tuple(zip(*map(flat.__getitem__, keys))) or ((), (), (), ())
    req = [0.0, 0.0, 0.0]
    every_ms, every_mem = 0.0, 0
    for c, req_bytes in zip(cands, requester_bytes):
        rv = perf_vector(c.requester)
        if topo.full_duplex:
            req = [a + b for a, b in zip(req, rv[:3])]
        else:  # half duplex: every rank pays its requester side on top of what it holds
            every_ms += sum(rv[:3])
        every_ms += c.every_rank.total_ms
        # every layout pays the requester buffers; they are reserved up front (Problem.base_mem)
        every_mem += c.every_rank_storage.total_bytes - req_bytes
    st = cands[0].sharding_type
    shard_kernels, every_kernels = (), ()
    mode = dp_mode_of(cands[0])  # hot rows: a replica on every rank too
    if kernel_index is not None:
        if mode:
            dp = ShardingType.DATA_PARALLEL
            every_kernels = tuple(sorted({kernel_index(kernel_group(s, dp, s.embedding_dim, mode)) for s in specs}))
        if st is not ShardingType.DATA_PARALLEL:
            blocks = [c.blocks for c in cands]
            shard_kernels = tuple(tuple(sorted({kernel_index(kernel_group(s, st, b[i].num_cols)) for s, b in zip(specs, blocks)}))
                                  for i in range(len(vecs)))
    host_mem = shard_host if any(shard_host) else ()
    return CandVec(tuple(cands), vecs, shard_cost, shard_mem, tuple(req),
                   every_ms, every_mem, st.within_one_host, st is ShardingType.DATA_PARALLEL, shard_kernels, every_kernels,
                   host_mem, (DATA_PARALLEL_MODES.index(mode),) if mode else ())


@dataclass(frozen=True)
class Unit:
    tables: tuple[TableSpec, ...]
    cands: tuple[CandVec, ...]
    ranks: tuple[int, ...]  # ranks its shards may use

    @cached_property
    def rank_set(self) -> frozenset[int]:
        """ranks as a set (membership tests in the search)."""
        return frozenset(self.ranks)

    @cached_property
    def sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per candidate, as arrays: its holder_sums (C, 4), req_vec (C, 3) and every_ms (C,)."""
        return (np.array([cv.holder_sums for cv in self.cands]).reshape(-1, 4), np.array([cv.req_vec for cv in self.cands]).reshape(-1, 3),
                np.array([cv.every_ms for cv in self.cands]))

    @property
    def name(self) -> str:
        return "+".join(t.name for t in self.tables)


@dataclass(frozen=True)
class Problem:
    topo: Topology
    units: tuple[Unit, ...]
    cap_bytes: int
    base_mem: int  # bytes every rank holds whatever the layout (its own samples' output buffers)
    base_ms: float = 0.0  # time every rank spends whatever the layout (fixed per-collection costs)
    call_ms: float = 0.0  # fixed cost of each lookup kernel a rank runs
    inference: bool = False  # forward-only costs and storage (serving)
    rank_ordered_rows: bool = False  # row blocks go to their ranks in rank order (TorchRec's layout: torchrec_compatible)
    unsplit_for_time: int = 0  # tables offered no splits because enumeration ran past its deadline
    host_cap_bytes: int = 0  # host memory per rank for shards kept there (topology.ddr_gib)
    group_ms: tuple[float, ...] = ()  # per data-parallel mode (DATA_PARALLEL_MODES order): its group's fixed cost

    @cached_property
    def flat_cands(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every unit's candidates in one row each: (first row of each unit, data-parallel,
        every-rank ms, requester-side ms summed plus every-rank ms); rows of unit u at offset[u] + c."""
        cands = [cv for u in self.units for cv in u.cands]
        offset = np.cumsum([0] + [len(u.cands) for u in self.units[:-1]])
        return (offset, np.array([cv.data_parallel for cv in cands], dtype=bool), np.array([cv.every_ms for cv in cands]),
                np.array([sum(cv.req_vec) + cv.every_ms for cv in cands]))

    @property
    def free_bytes(self) -> int:
        """Per-rank bytes left for shards and replicas once the fixed buffers are reserved."""
        return self.cap_bytes - self.base_mem


SPLIT_SHARE = 0.2  # a table is split only if whole it takes this share of a rank's average load or memory
FINEST_BLOCK = 1 / 64  # row blocks are offered down to about this share of the average load or memory


def _split_worthy(specs: tuple[TableSpec, ...], topo: Topology, constraints: Constraints,
                  inference: bool) -> tuple[set[str], set[str], dict[str, int], set[str], dict[str, Candidate]]:
    """Tables big enough (in predicted time or bytes, whole) for splitting to matter, the
    subset too big in bytes to be left whole, per table the most row blocks worth offering,
    and the tables offered host memory and caches (with topology.ddr_gib: those whose bytes
    whole take FINEST_BLOCK of a rank's memory or more; smaller ones free too little HBM),
    and the table_wise candidates it priced (enumeration reuses them). Row blocks:
    twice the count whose blocks take FINEST_BLOCK of the average rank load or of a rank's memory
    (finer blocks cannot balance anything; without it 1,024 ranks offer 1,024-way splits of
    every big table, most of the candidates' shards)."""
    whole, table_wise = {}, {}
    for s in specs:
        if ShardingType.TABLE_WISE in constraints.for_table(s.name).sharding_types:
            c = table_wise[s.name] = candidate(s, topo, ShardingType.TABLE_WISE, 1, inference)
            whole[s.name] = (c.shards[0].perf.total_ms, c.shards[0].storage.total_bytes)
    avg_ms = sum(ms for ms, _ in whole.values()) / topo.world_size
    limit_bytes = SPLIT_SHARE * topo.shard_memory_cap_bytes
    must = {s.name for s in specs if s.name not in whole or whole[s.name][1] > limit_bytes}
    worthy = {s.name for s in specs if s.name in must or whole[s.name][0] > SPLIT_SHARE * avg_ms}
    cap = topo.shard_memory_cap_bytes
    row_limit = {n: 2 * math.ceil(max(ms / max(FINEST_BLOCK * avg_ms, 1e-300), b / (FINEST_BLOCK * cap)))
                 for n, (ms, b) in whole.items() if n in worthy}
    tierable = {s.name for s in specs if s.name not in whole or whole[s.name][1] >= FINEST_BLOCK * cap} if topo.ddr_gib else set()
    return worthy, must, row_limit, tierable, table_wise


def build_problem(specs: tuple[TableSpec, ...], topo: Topology, constraints: Constraints, torchrec_compatible: bool = False,
                  inference: bool = False, deadline: float = float("inf"), hot_rows: bool = False) -> Problem:
    """inference: forward-only costs and storage (serving; see embshard.planner.enumerate); hot_rows:
    offer hot-row replication to tables with a measured access curve.

    Once the tables still to enumerate would end past `deadline` (at the time tables offered no
    splits took so far), they are offered splits only if too big to keep whole
    (``Problem.unsplit_for_time`` counts the others)."""
    by_name = {s.name: s for s in specs}
    worthy, must_split, row_limit, tierable, table_wise = _split_worthy(specs, topo, constraints, inference)
    if torchrec_compatible:  # row_wise only over all ranks
        row_limit = {}
    unsplit_for_time = 0
    grouped = {n for g in constraints.keep_together for n in g}
    members = [tuple(by_name[n] for n in g) for g in constraints.keep_together] + [(s,) for s in specs if s.name not in grouped]
    units = []
    call_ms = forward_only(fixed_perf(topo, 0, 1)).total_ms if inference else kernel_call_ms(topo)
    kernels: dict[tuple, int] = {}
    kernel_index = (lambda key: kernels.setdefault(key, len(kernels))) if call_ms else None
    all_ranks = set(range(topo.world_size))
    requester_bytes = {s.name: requester_storage(s, topo, inference).total_bytes for s in specs}
    unsplit_s, num_unsplit = 0.0, 0  # time enumerating tables offered no splits, and their count
    for i, tables in enumerate(members):
        ranks = set(all_ranks)
        for t in tables:
            pinned = constraints.for_table(t.name).ranks
            if pinned is not None:
                ranks &= set(pinned)
        if not ranks:
            raise ValueError(f"constraints: tables {[t.name for t in tables]} are kept together but their pinned ranks do not overlap")
        if len(tables) == 1:
            splits = tables[0].name in worthy
            start = time.perf_counter()
            # the tables still to enumerate take at least what unsplit ones took so far: splits stop when those would end late
            rest_s = (len(members) - i) * unsplit_s / max(num_unsplit, 1)
            if splits and tables[0].name not in must_split and start + rest_s > deadline:
                splits, unsplit_for_time = False, unsplit_for_time + 1
            cands = tuple(_combine([c], tables, topo, kernel_index, (requester_bytes[tables[0].name],)) for c in enumerate_candidates(
                tables[0], topo, constraints.for_table(tables[0].name), splits, torchrec_compatible, inference,
                row_limit.get(tables[0].name), tables[0].name in tierable, hot_rows, table_wise.get(tables[0].name)))
            if not splits:
                unsplit_s, num_unsplit = unsplit_s + time.perf_counter() - start, num_unsplit + 1
        else:
            for t in tables:
                if ShardingType.TABLE_WISE not in constraints.for_table(t.name).sharding_types:
                    raise ValueError(f"constraints.keep_together: {t.name!r} is kept together with others (placed table_wise on one rank) but its sharding_types exclude table_wise")
            cands = (_combine([candidate(t, topo, ShardingType.TABLE_WISE, 1, inference) for t in tables], tables, topo,
                              kernel_index, tuple(requester_bytes[t.name] for t in tables)),)
        if not cands:
            raise ValueError(f"constraints.tables.{tables[0].name}: no sharding of this table satisfies its constraints "
                             f"(allowed types {[s.value for s in constraints.for_table(tables[0].name).sharding_types]}); allow more types or ranks")
        units.append(Unit(tables, cands, tuple(sorted(ranks))))
    base_mem = sum(requester_bytes[s.name] for s in specs)
    fixed = fixed_perf(topo, num_collections(specs), 0)
    base_ms = (forward_only(fixed) if inference else fixed).total_ms
    group_ms = tuple(mode_group_perf(topo, m, inference).total_ms for m in DATA_PARALLEL_MODES)
    return Problem(topo, tuple(units), topo.shard_memory_cap_bytes, base_mem, base_ms, call_ms, inference, torchrec_compatible,
                   unsplit_for_time, topo.host_memory_cap_bytes, group_ms)


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
        """Every rank's cost(r), computed over all ranks at once (the same float operations)."""
        return self.cost_array().tolist()

    def cost_array(self) -> np.ndarray:
        """costs() as an array."""
        h, u = self.Hn, self.U
        c = np.maximum(h[:, 0], u[0]) + np.maximum(h[:, 1], u[1]) + np.maximum(h[:, 2], u[2]) + h[:, 3] + self.E
        if self.call_ms:
            c = c + self.call_ms * (self.num_kernels + len(self.every_kernels))
        return c

    def cost_array_with(self, ui: int, ci: int, ranks: tuple[int, ...]) -> np.ndarray:
        """cost_array() with unit ui (not placed) as candidate ci on `ranks`; the state is left as it was."""
        return self.cost_arrays_with(ui, [(ci, ranks)])[0]

    def cost_arrays_with(self, ui: int, picks: list[tuple[int, tuple[int, ...]]]) -> np.ndarray:
        """cost_array_with(ui, ci, ranks) for each (ci, ranks) of `picks`, one row each (computed at once)."""
        cands = self.problem.units[ui].cands
        if self.call_ms:  # kernel counts change too: place each and take it back
            rows = []
            for ci, ranks in picks:
                self.add(ui, ci, ranks)
                rows.append(self.cost_array())
                self.add(ui, ci, ranks, -1)
            return np.array(rows).reshape(len(picks), len(self.H))
        cvs = [cands[ci] for ci, _ in picks]
        h = np.repeat(self.Hn[None], len(picks), axis=0)
        placed = [(j, ranks) for j, (_, ranks) in enumerate(picks) if ranks]
        if placed:
            h[[j for j, ranks in placed for _ in ranks], [r for _, ranks in placed for r in ranks]] += np.concatenate(
                [cvs[j].shard_array for j, _ in placed])
        u = np.array(self.U) + np.array([cv.req_vec for cv in cvs]).reshape(len(picks), 3)
        tail = np.array([self.E + cv.every_ms + self._new_groups_ms(cv) for cv in cvs])
        return (np.maximum(h[:, :, 0], u[:, 0:1]) + np.maximum(h[:, :, 1], u[:, 1:2]) + np.maximum(h[:, :, 2], u[:, 2:3])
                + h[:, :, 3] + tail[:, None])

    def costs_without_shards(self, cands: list[CandVec]) -> np.ndarray:
        """Per candidate (of a unit not placed), every rank's cost with its requester side and every-rank part
        but none of its shards (kernel calls as they are): at most `cost_arrays_with`'s on any ranks, rank by
        rank (the same float operations on terms no larger), so a candidate this rules out needs no placing."""
        u = np.array(self.U) + np.array([cv.req_vec for cv in cands]).reshape(len(cands), 3)
        tail = np.array([self.E + cv.every_ms + self._new_groups_ms(cv) for cv in cands])
        h = self.Hn
        c = (np.maximum(h[None, :, 0], u[:, 0:1]) + np.maximum(h[None, :, 1], u[:, 1:2]) + np.maximum(h[None, :, 2], u[:, 2:3])
             + h[None, :, 3] + tail[:, None])
        return c + self.call_ms * (self.num_kernels + len(self.every_kernels)) if self.call_ms else c

    def floors_ms(self, unit: Unit) -> list[float]:
        """Per candidate of `unit`, a lower bound on the slowest rank's time with it added on any ranks: the mean
        over ranks, at least sum_p max(sum_r H_rp, W U_p) / W + sum_r H_r3 / W + E (kernel calls and new
        mode groups left out). Moves and swaps keep these sums, so no moving of shards brings every rank
        below it; a layout that lifts it above a target cannot be repaired to it. (All candidates at once.)"""
        W = len(self.H)
        s, u = self.Hn.sum(axis=0), self.U
        h, q, every = unit.sums
        return ((np.maximum(s[0] + h[:, 0], W * (u[0] + q[:, 0])) + np.maximum(s[1] + h[:, 1], W * (u[1] + q[:, 1]))
                 + np.maximum(s[2] + h[:, 2], W * (u[2] + q[:, 2])) + s[3] + h[:, 3]) / W + self.E + every).tolist()

    def _new_groups_ms(self, cv: CandVec) -> float:
        """Fixed cost of the mode groups cv's replica would start (none of its group placed yet)."""
        return sum(self.problem.group_ms[g] for g in cv.every_groups if not self.every_groups.get(g))

    def cheapest_first(self, ranks: Sequence[int], costs: list[float]) -> list[int]:
        """Ranks by time, ties (ranks whose all-to-all is bound by the requester side) broken
        by the work they hold, so hidden holder load stays balanced too (a stable sort)."""
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
        return (np.maximum(h[..., 0] + v[..., 0], u[0]) + np.maximum(h[..., 1] + v[..., 1], u[1])
                + np.maximum(h[..., 2] + v[..., 2], u[2]) + h[..., 3] + (v[..., 3] + self.E))

    def fits(self, r: int, extra_bytes: int, extra_host_bytes: int = 0) -> bool:
        return (self.mem[r] + extra_bytes + self.UM <= self.problem.cap_bytes
                and (not extra_host_bytes or self.host[r] + extra_host_bytes <= self.problem.host_cap_bytes))

    def fits_shard(self, r: int, cv: CandVec, i: int) -> bool:
        """Rank r has room (HBM and host memory) for shard i of cv."""
        return self.fits(r, cv.shard_mem[i], cv.host_mem(i))

    def add(self, ui: int, ci: int, ranks: tuple[int, ...], sign: int = 1) -> None:
        cv = self.problem.units[ui].cands[ci]
        if ranks:
            self.Hn[list(ranks)] += sign * cv.shard_array
        for i, r in enumerate(ranks):
            h, v = self.H[r], cv.shard_vec[i]
            for p in range(4):
                h[p] += sign * v[p]
            self.mem[r] += sign * cv.shard_mem[i]
            if cv.shard_host_mem:
                self.host[r] += sign * cv.shard_host_mem[i]
            if sign > 0:
                self.held[r][ui] = i
            else:
                del self.held[r][ui]
            if cv.shard_kernels:
                self.num_kernels[r] += _count(self.kernels[r], cv.shard_kernels[i], sign)
        for p in range(3):
            self.U[p] += sign * cv.req_vec[p]
        self.E += sign * cv.every_ms
        if sign > 0:
            self.E += self._new_groups_ms(cv)
        _count(self.every_kernels, cv.every_kernels, sign)
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
        for p in range(4):
            self.H[src][p] -= v[p]
            self.H[dst][p] += v[p]
        self.Hn[src] -= v
        self.Hn[dst] += v
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
