"""The search's view of a planning problem: units and candidate vectors (the rank state: search/state.py).

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
from typing import Callable

import numpy as np

from embshard.planner.cost.perf import dp_mode_of, fixed_perf, kernel_call_ms, kernel_group, mode_group_perf, num_collections
from embshard.planner.cost.storage import requester_storage
from embshard.planner.enumerate import candidate, enumerate_candidates, forward_only
from embshard.planner.types import Candidate, Constraints, Perf, ShardingType
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology


class cached_property:
    """functools.cached_property without its lock: Python 3.11's takes an RLock on each first access (0.6 of its
    0.9 us; a criteo_tb_measured tiered plan makes 2,500 of them). The search runs in one thread, and a value
    computed twice would be the same. As functools', it stores the value in the instance's __dict__ (frozen
    dataclasses too), where later lookups find it first."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


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
        return tuple(map(sum, zip(*self.shard_vec))) if self.shard_vec else (0, 0, 0, 0)  # (each part summed in shard order)

    @cached_property
    def largest_mem(self) -> int:
        """The largest shard's HBM bytes (0 for a data-parallel candidate)."""
        return max(self.shard_mem, default=0)

    @cached_property
    def largest_host_mem(self) -> int:
        """The largest shard's host-memory bytes (0: every shard in HBM)."""
        return max(self.shard_host_mem, default=0)

    @cached_property
    def shard_rows(self) -> tuple[tuple, ...]:
        """Per shard, what a swap weighs (search/moves.py): its cost, vector parts, bytes, host bytes, vector and kernels."""
        return tuple((self.shard_cost[i], *v, self.shard_mem[i], self.host_mem(i), v, self.shard_kernels[i] if self.shard_kernels else ())
                     for i, v in enumerate(self.shard_vec))

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

    @cached_property
    def layout(self) -> tuple:
        """What a change of tier keeps: each member's type, blocks and hot set (its tier variants share it)."""
        return tuple((c.sharding_type, c.row_spans, c.col_spans, c.hot_rows) for c in self.cand)

    @cached_property
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
        if len(parts) == 1:  # (the sums below of one part)
            vec, storage = perf_vector(parts[0].perf), parts[0].storage
            flat[key] = (vec, sum(vec), storage.total_bytes, storage.host_bytes)
            continue
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

    @cached_property
    def largest_vecs(self) -> np.ndarray:
        """Per candidate, its costliest shard's vector (`CandVec.largest_first`; zeros for a data-parallel one): (C, 4)."""
        return np.array([cv.shard_vec[cv.largest_first[0]] if cv.shard_vec else (0.0,) * 4 for cv in self.cands]).reshape(-1, 4)

    @cached_property
    def padded_shards(self) -> np.ndarray:
        """Per candidate, its distinct shard vectors (a split's blocks mostly repeat: a row split has at most two
        heights), padded with zero rows to the most of any candidate, at least one (a data-parallel candidate's is
        zero): (C, vectors, 4)."""
        distinct = [tuple(dict.fromkeys(cv.shard_vec)) for cv in self.cands]
        out = np.zeros((len(self.cands), max(1, max(map(len, distinct))), 4))
        for row, vecs in zip(out, distinct):
            if vecs:
                row[:len(vecs)] = vecs
        return out

    @cached_property
    def grouped(self) -> list[int]:
        """The candidates whose replica runs in a data-parallel mode group (`CandVec.every_groups`)."""
        return [ci for ci, cv in enumerate(self.cands) if cv.every_groups]

    @cached_property
    def compute_desc(self) -> np.ndarray:
        """Per candidate, its shards' compute times (their vectors' last part), largest first, padded with zeros
        to the most shards of any candidate: (C, shards)."""
        out = np.zeros((len(self.cands), max(cv.num_shards for cv in self.cands)))
        for row, cv in zip(out, self.cands):
            row[:cv.num_shards] = sorted((v[3] for v in cv.shard_vec), reverse=True)
        return out

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
# or if whole it adds more than this share of what the average rank adds above the requester side (`_added_ms`): on
# many ranks the requester side hides most of a shard's all-to-all time, and a table with many ids per sample adds far
# more than its share of the total (5,000 x 1,024: t2650, 8.46 ms whole, under SPLIT_SHARE of the average 42.4 ms, adds
# 4.48 ms where the average rank adds 4.38, and alone on its rank it was the slowest, 33.02 ms). 0.8 splits 5 more
# tables of 5,000 there (33.03 -> 31.41-31.65 ms with plan()'s packing rule and kicks after rebalancing), 3 of 1,000 at
# 1,000 x 256 (5.6181 -> 5.5020 ms; the LP bound 5.4255 -> 5.1943: it was the largest-shard row of t0672 whole, so
# the old plan's 3.6% gap was to a bound of the layouts then enumerated, which the new plan beats) and 1 of 2,000 at
# 2,000 x 512 (same plan), none at 150 x 8, 500 x 64 or on the shipped tables; 1.0 (3 more at 5,000 only) stopped at
# 31.75 ms, 0.9 at 31.49 (but 1,000 x 256 5.6331), 0.5 and 0.6 (48 and 24 more) at 31.43-32.54 with the bound 29.40
ADDED_SHARE = 0.8
FINEST_BLOCK = 1 / 64  # row blocks are offered down to about this share of the average load or memory


def _split_worthy(specs: tuple[TableSpec, ...], topo: Topology, constraints: Constraints,
                  inference: bool) -> tuple[set[str], set[str], dict[str, int], set[str], dict[str, Candidate]]:
    """Tables big enough (in predicted time or bytes, whole, or in what they add above the requester side:
    ADDED_SHARE) for splitting to matter, the
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
    added, avg_added_ms = _added_ms(table_wise, topo)
    worthy = {s.name for s in specs if s.name in must or whole[s.name][0] > SPLIT_SHARE * avg_ms
              or added[s.name] > ADDED_SHARE * avg_added_ms}
    cap = topo.shard_memory_cap_bytes
    row_limit = {n: 2 * math.ceil(max(ms / max(FINEST_BLOCK * avg_ms, 1e-300), b / (FINEST_BLOCK * cap)))
                 for n, (ms, b) in whole.items() if n in worthy}
    tierable = {s.name for s in specs if s.name not in whole or whole[s.name][1] >= FINEST_BLOCK * cap} if topo.ddr_gib else set()
    return worthy, must, row_limit, tierable, table_wise


def _added_ms(table_wise: dict[str, Candidate], topo: Topology) -> tuple[dict[str, float], float]:
    """Per table, what its table_wise shard alone adds to a rank above the requester side of every table whole (its
    compute, and its all-to-all phases above that requester side: max(H_p, U_p) hides the rest; half duplex: all of
    it), and what the average rank adds so (its compute, and its average holder side above the requester side)."""
    holder = {n: perf_vector(c.shards[0].perf) for n, c in table_wise.items()}
    requester, total = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]
    for n, c in table_wise.items():
        total = [a + b for a, b in zip(total, holder[n])]
        if topo.full_duplex:
            requester = [a + b for a, b in zip(requester, perf_vector(c.requester))]
    W = topo.world_size
    average = sum(max(total[p] / W - requester[p], 0.0) for p in range(3)) + total[3] / W
    return {n: sum(max(h[p] - requester[p], 0.0) for p in range(3)) + h[3] for n, h in holder.items()}, average


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
