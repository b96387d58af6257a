"""ShardingPlan: where every table's shards live, with the prediction that chose it.

The plan is the only contract between planner and runtime. It serialises to versioned
JSON (``to_json``/``from_json`` round-trip exactly) holding the tables' placements and
specs, the topology, per-rank predicted cost by phase and memory, the lower bound on the
objective, and a hash of the inputs that produced it.

Schema versions: 13 (written) adds the backward terms of a pooled table several features look up to the topology
(``lookup_bwd_shared_ns_per_row``, ``lookup_bwd_shared_ns_per_row_byte``; absent when they price such a table as older
files did, as one of one feature); 12 adds the hierarchical all-reduce's calibrated CPU terms to the topology
(``dp_hier_ns_per_byte``, ``dp_hier_call_ms``; absent when 0, as older files priced it); 11 adds ``topology.dp_dense_gb_per_s`` (the rate of the all-reduce mode's
dense full-table work, as a calibrated profile measured it; absent: the device default; older files
priced that work at ``hbm_gb_per_s``); 10 adds the in-host reduction's calibrated terms to the topology
(``host_reduce_fwd_ns_per_byte``, ``host_reduce_bwd_ns_per_byte``, ``host_reduce_call_ms``; absent when 0,
as older files priced it) and may record ``topology.reduce_in_host: false`` chosen by the planner (flat
collectives where the reduction costs more than it saves); 9 adds ``topology.sharded_dp_update`` (sharded weight updates of
data-parallel tables, their optimizer state counted / W; absent when false); 8 adds
``topology.reduce_in_host`` (false: flat collectives across hosts, no in-host reduction; absent
when true, as older files ran); 7 adds hot-row replication: a table's ``hot_rows`` (its hottest
rows replicated on every rank, see embshard/runtime/hot_rows.py) and the plan's ``hot_ids_file``
(the .npz of hottest ids per table that embshard-stats wrote), both absent when unused;
6 records the wire dtypes in ``topology.comms`` when any is not fp32
(absent: fp32, as in older files); 5 adds each rank's predicted embedding-collective bytes per
training step (``ranks[i].traffic_bytes``: intra/inter-host, sent/received;
`embshard.planner.cost.traffic`; derived from the placement, so older files get them too,
and serving plans none); 4 records each data-parallel table's mode (``data_parallel_mode``,
the cheaper of the two the runtime runs, as the planner priced it; older files load with their
topology's, `Topology.data_parallel_mode`, as they ran); 3 adds each shard's ``location`` (hbm,
uvm_cache, host) and ``cache_rows``, listed only for shards not in HBM, and per rank
``memory_bytes.host_bytes``; 2 stores a data-parallel table once, without shards (its ranks
are all ranks); 1 listed its full shard on every rank. All load to the same plan: in
memory a data-parallel table's shards are `Replicas`, a sequence of W full shards that
holds three integers, so a plan grows with the shards that exist, not tables x ranks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from embshard.fsutil import write_text_atomic
from embshard.planner.cost.tiers import check_cache_rows
from embshard.planner.cost.traffic import TrafficBytes, rank_traffic_bytes
from embshard.planner.types import COMPUTE_KERNEL, Location, Perf, Shard, ShardingType, Storage
from embshard.specs import TableSpec, tables_from_list
from embshard.topology import DATA_PARALLEL_MODES, Topology

SCHEMA_VERSION = 13
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)


@dataclass(frozen=True)
class Replicas(Sequence[Shard]):
    """The shards of a data-parallel table: one full num_rows x num_cols block on each of
    world_size ranks, in rank order, made on demand."""

    world_size: int
    num_rows: int
    num_cols: int

    def __len__(self) -> int:
        return self.world_size

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self.world_size)))
        if i < 0:
            i += self.world_size
        if not 0 <= i < self.world_size:
            raise IndexError(i)
        return Shard(i, 0, self.num_rows, 0, self.num_cols)

    def __iter__(self) -> Iterator[Shard]:
        return (Shard(r, 0, self.num_rows, 0, self.num_cols) for r in range(self.world_size))

    @classmethod
    def of(cls, shards: Sequence[Shard]) -> "Replicas | None":
        """The Replicas equal to `shards` (in any rank order), or None if they are not W full copies."""
        if isinstance(shards, Replicas):
            return shards
        if not shards:
            return None
        n, d = shards[0].num_rows, shards[0].num_cols
        if any(s.row_offset or s.col_offset or s.num_rows != n or s.num_cols != d for s in shards) \
                or sorted(s.rank for s in shards) != list(range(len(shards))):
            return None
        return cls(len(shards), n, d)


@dataclass(frozen=True)
class TablePlacement:
    """A table's layout. A data-parallel table's shards are normalised to `Replicas` (when
    they are one full copy per rank; anything else is left for validation to reject).
    data_parallel_mode: how a data-parallel table trains (`DATA_PARALLEL_MODES`); None: as its
    topology says (`evaluate` records the cheaper mode; other types have None)."""

    name: str
    sharding_type: ShardingType
    compute_kernel: str
    shards: Sequence[Shard]
    data_parallel_mode: str | None = None
    hot_rows: int = 0  # hottest rows replicated on every rank (the plan's hot_ids_file names them); the rest as shards say

    def __post_init__(self) -> None:
        if self.sharding_type is ShardingType.DATA_PARALLEL:
            replicas = Replicas.of(self.shards)
            if replicas is not None:
                object.__setattr__(self, "shards", replicas)
        elif not isinstance(self.shards, tuple):
            object.__setattr__(self, "shards", tuple(self.shards))

    @property
    def ranks(self) -> tuple[int, ...]:
        if isinstance(self.shards, Replicas):
            return tuple(range(self.shards.world_size))
        return tuple(s.rank for s in self.shards)


@dataclass(frozen=True)
class RankReport:
    rank: int
    perf: Perf
    storage: Storage


@dataclass(frozen=True)
class ShardingPlan:
    tables: tuple[TablePlacement, ...]
    specs: tuple[TableSpec, ...]
    topology: Topology
    ranks: tuple[RankReport, ...]
    lower_bound_ms: float
    input_hash: str
    search: Mapping[str, Any] = field(default_factory=dict)
    hot_ids_file: str = ""  # .npz, one array per table: its ids hottest first (embshard-stats hot_ids=)

    @property
    def max_rank_ms(self) -> float:
        """The objective: predicted step time of the slowest rank."""
        return max(r.perf.total_ms for r in self.ranks)

    @property
    def gap(self) -> float:
        """Relative gap of the objective to the lower bound (0.05 = within 5%)."""
        return self.max_rank_ms / self.lower_bound_ms - 1.0 if self.lower_bound_ms > 0 else 0.0

    @property
    def imbalance(self) -> float:
        """max / mean of per-rank predicted time."""
        totals = [r.perf.total_ms for r in self.ranks]
        return max(totals) / (sum(totals) / len(totals)) if sum(totals) > 0 else 1.0

    @cached_property
    def traffic(self) -> list[TrafficBytes] | None:
        """Each rank's predicted embedding-collective bytes per training step (derived, like the
        objective: written to plan.json, recomputed on load); None for serving plans."""
        if self.search.get("inference", False):
            return None
        return rank_traffic_bytes(self.specs, self.topology, self.tables)

    def placement(self, name: str) -> TablePlacement:
        return self._placements[name]

    def spec(self, name: str) -> TableSpec:
        return self._specs[name]

    @cached_property
    def _placements(self) -> dict[str, TablePlacement]:
        return {t.name: t for t in self.tables}

    @cached_property
    def _specs(self) -> dict[str, TableSpec]:
        return {s.name: s for s in self.specs}

    # ---- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "input_hash": self.input_hash,
            "topology": self.topology.to_dict(),
            "objective_ms": self.max_rank_ms,
            "lower_bound_ms": self.lower_bound_ms,
            "gap": self.gap,
            "tables": [_table_dict(t) for t in self.tables],
            "specs": [s.to_dict() for s in self.specs],
            "ranks": [
                {"rank": r.rank, "perf_ms": r.perf.to_dict(), "memory_bytes": r.storage.to_dict(),
                 **({"traffic_bytes": self.traffic[r.rank].to_dict()} if self.traffic is not None else {})}
                for r in self.ranks
            ],
            "search": dict(self.search),
            **({"hot_ids_file": self.hot_ids_file} if self.hot_ids_file else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str, where: str = "plan") -> "ShardingPlan":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e})") from None
        return cls.from_dict(raw, where)

    @classmethod
    def load(cls, path: str | Path) -> "ShardingPlan":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"{path}: cannot read plan file ({e.strerror})") from None
        return cls.from_json(text, str(path))

    @classmethod
    def from_dict(cls, raw: Any, where: str = "plan") -> "ShardingPlan":
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a JSON object")
        version = raw.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"{where}.schema_version: this embshard reads versions {list(READABLE_VERSIONS)}, file has {version!r}; re-run embshard-plan")
        for key in ("input_hash", "topology", "tables", "specs", "ranks", "lower_bound_ms"):
            if key not in raw:
                raise ValueError(f"{where}.{key}: missing; the file is not an embshard plan or is truncated")
        topology = Topology.from_dict(raw["topology"], f"{where}.topology")
        specs = tables_from_list(raw["specs"], f"{where}.specs")
        by_name = {s.name: s for s in specs}
        try:
            tables = tuple(_table_from_dict(t, version, by_name, topology, f"{where}.tables[{i}]") for i, t in enumerate(raw["tables"]))
            ranks = tuple(
                RankReport(int(r["rank"]), Perf.from_dict(r["perf_ms"]), Storage.from_dict(r["memory_bytes"]))
                for r in raw["ranks"]
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed table or rank entry (missing {e}); re-run embshard-plan") from None
        plan = cls(tables, specs, topology, ranks, float(raw["lower_bound_ms"]), str(raw["input_hash"]), raw.get("search", {}),
                   str(raw.get("hot_ids_file", "")))
        validate_placements(plan.tables, plan.specs, plan.topology, where)
        return plan


SHARD_KEYS = ("rank", "row_offset", "num_rows", "col_offset", "num_cols")


def _table_dict(t: TablePlacement) -> dict[str, Any]:
    out = {"name": t.name, "sharding_type": t.sharding_type.value, "compute_kernel": t.compute_kernel}
    if not isinstance(t.shards, Replicas):  # a data-parallel table is on every rank: no shards listed
        out["shards"] = [_shard_dict(s) for s in t.shards]
    if t.data_parallel_mode is not None:
        out["data_parallel_mode"] = t.data_parallel_mode
    if t.hot_rows:
        out["hot_rows"] = t.hot_rows
    return out


def _shard_dict(s: Shard) -> dict[str, Any]:
    out = {k: getattr(s, k) for k in SHARD_KEYS}
    if s.location is not Location.HBM:
        out["location"] = s.location.value
        out["cache_rows"] = s.cache_rows
    return out


def _shard_from_dict(s: Mapping[str, Any], where: str) -> Shard:
    """A shard entry; location and cache_rows are optional (hbm, 0: plans before tiers)."""
    location = Location.parse(s.get("location", "hbm"), f"{where}.location")
    rows = s.get("cache_rows", 0)
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise ValueError(f"{where}.cache_rows: must be a whole number of rows, got {rows!r}")
    return Shard(**{k: int(s[k]) for k in SHARD_KEYS}, location=location, cache_rows=rows)


def _table_from_dict(t: Mapping[str, Any], version: int, specs: Mapping[str, TableSpec], topology: Topology,
                     where: str) -> TablePlacement:
    stype = ShardingType.parse(t["sharding_type"], f"{where}.sharding_type")
    if version >= 2 and stype is ShardingType.DATA_PARALLEL:
        if "shards" in t:
            raise ValueError(f"{where}.shards: a data_parallel table lists no shards in schema version {version} (it is on every rank)")
        spec = specs.get(t["name"])
        if spec is None:  # left for validate_placements to report with the other names
            return TablePlacement(t["name"], stype, t["compute_kernel"], ())
        shards: Sequence[Shard] = Replicas(topology.world_size, spec.num_embeddings, spec.embedding_dim)
    else:
        shards = tuple(_shard_from_dict(s, f"{where}.shards[{j}]") for j, s in enumerate(t["shards"]))
    mode = t.get("data_parallel_mode") if version >= 4 else None
    if mode is None and stype is ShardingType.DATA_PARALLEL:
        mode = topology.data_parallel_mode  # how plans without a mode ran
    return TablePlacement(t["name"], stype, t["compute_kernel"], shards, mode, int(t.get("hot_rows", 0)))


def validate_placements(tables: Sequence[TablePlacement], specs: Sequence[TableSpec], topology: Topology, where: str = "plan") -> None:
    """Check that placements cover every table exactly once and tile it with shards on real ranks."""
    by_name = {s.name: s for s in specs}
    names = [t.name for t in tables]
    if sorted(names) != sorted(by_name):
        missing, extra = sorted(set(by_name) - set(names)), sorted(set(names) - set(by_name))
        raise ValueError(f"{where}.tables: placements do not match the table specs (missing {missing}, unexpected {extra})")
    for i, t in enumerate(tables):
        w = f"{where}.tables[{i}] ({t.name})"
        spec = by_name[t.name]
        if t.compute_kernel != COMPUTE_KERNEL[t.sharding_type]:
            raise ValueError(f"{w}.compute_kernel: {t.sharding_type.value} uses {COMPUTE_KERNEL[t.sharding_type]!r}, got {t.compute_kernel!r}")
        if not 0 <= t.hot_rows < spec.num_embeddings or (t.hot_rows and t.sharding_type is ShardingType.DATA_PARALLEL):
            raise ValueError(f"{w}.hot_rows: {t.hot_rows} hot rows of a {spec.num_embeddings}-row "
                             f"{t.sharding_type.value} table; give 0 <= hot_rows < num_embeddings, and 0 for data_parallel "
                             "tables (every row is on every rank already)")
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            if t.shards != Replicas(topology.world_size, spec.num_embeddings, spec.embedding_dim):
                raise ValueError(f"{w}.shards: a data_parallel table lists one full shard on every rank")
            if t.data_parallel_mode not in (None, *DATA_PARALLEL_MODES):
                raise ValueError(f"{w}.data_parallel_mode: {t.data_parallel_mode!r}; give one of {list(DATA_PARALLEL_MODES)}")
            continue
        if t.data_parallel_mode is not None:
            raise ValueError(f"{w}.data_parallel_mode: only data_parallel tables have one ({t.sharding_type.value} given "
                             f"{t.data_parallel_mode!r}); remove it")
        if not t.shards:
            raise ValueError(f"{w}.shards: empty")
        for j, s in enumerate(t.shards):
            if not 0 <= s.rank < topology.world_size:
                raise ValueError(f"{w}.shards[{j}].rank: {s.rank} is not a rank of a {topology.world_size}-rank topology")
            if s.num_rows <= 0 or s.num_cols <= 0 or s.row_offset < 0 or s.col_offset < 0 \
                    or s.row_offset + s.num_rows > spec.num_embeddings or s.col_offset + s.num_cols > spec.embedding_dim:
                raise ValueError(f"{w}.shards[{j}]: block rows [{s.row_offset}, +{s.num_rows}) cols [{s.col_offset}, +{s.num_cols}) "
                                 f"is outside the {spec.num_embeddings}x{spec.embedding_dim} table")
            check_cache_rows(spec, s.location, s.cache_rows, s.num_rows, f"{w}.shards[{j}]")
            if s.location is not Location.HBM and topology.ddr_gib == 0:
                raise ValueError(f"{w}.shards[{j}].location: {s.location.value}, but topology.ddr_gib is 0 (no host memory "
                                 f"for tables); set topology.ddr_gib or keep the shard in hbm")
        if len(set(t.ranks)) != len(t.ranks):
            raise ValueError(f"{w}.shards: two shards of one table on the same rank {sorted(t.ranks)}")
        if t.sharding_type.within_one_host and len({topology.host_of(r) for r in t.ranks}) != 1:
            raise ValueError(f"{w}.shards: {t.sharding_type.value} keeps all shards on one host, got ranks {list(t.ranks)}")
        cells = sum(s.num_rows * s.num_cols for s in t.shards)
        if t.sharding_type.splits_rows:
            ok = all(s.num_cols == spec.embedding_dim for s in t.shards) and _tiles([(s.row_offset, s.num_rows) for s in t.shards], spec.num_embeddings)
        elif t.sharding_type.splits_cols:
            ok = all(s.num_rows == spec.num_embeddings for s in t.shards) and _tiles([(s.col_offset, s.num_cols) for s in t.shards], spec.embedding_dim)
        else:
            ok = len(t.shards) == 1 and cells == spec.num_embeddings * spec.embedding_dim
        if not ok:
            raise ValueError(f"{w}.shards: shards do not tile the {spec.num_embeddings}x{spec.embedding_dim} table as {t.sharding_type.value} requires")


def _tiles(spans: list[tuple[int, int]], total: int) -> bool:
    pos = 0
    for offset, size in sorted(spans):
        if offset != pos:
            return False
        pos += size
    return pos == total


def input_hash(specs: Sequence[TableSpec], topology: Topology, constraints_repr: str) -> str:
    """sha256 over the canonical JSON of everything a plan depends on."""
    payload = json.dumps(
        {"specs": [s.to_dict() for s in specs], "topology": topology.to_dict(), "constraints": constraints_repr},
        sort_keys=True,
    )
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()
