"""Value types of the planner: sharding types, shards, costs, storage and constraints.

All frozen; `Perf` and `Storage` add up with ``+`` so a rank's load is ``sum(shards)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Mapping, Sequence


class ShardingType(str, Enum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"

    @property
    def splits_rows(self) -> bool:
        return self in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)

    @property
    def splits_cols(self) -> bool:
        return self in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)

    @property
    def within_one_host(self) -> bool:
        return self in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE)

    @classmethod
    def parse(cls, value: Any, where: str) -> "ShardingType":
        return _parse(cls, value, where, "sharding type")


class Location(str, Enum):
    """Where a shard's weights live: in HBM; in host memory with an HBM cache of its hottest
    rows (FBGEMM's managed caching, TorchRec's FUSED_UVM_CACHING); or in host memory only
    (managed, FUSED_UVM). On CPU all three are host memory."""

    HBM = "hbm"
    UVM_CACHE = "uvm_cache"
    HOST = "host"

    @classmethod
    def parse(cls, value: Any, where: str) -> "Location":
        return _parse(cls, value, where, "location")


def _parse(cls: type[Enum], value: Any, where: str, what: str) -> Any:
    """The member of ``cls`` named by ``value``, or a ValueError naming ``where`` and the choices."""
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{where}: unknown {what} {value!r}; choose from {[t.value for t in cls]}") from None


# FBGEMM's table-batched kernel with the optimizer fused into backward; data-parallel
# tables use plain dense weights whose gradients are all-reduced.
COMPUTE_KERNEL = {t: ("dense" if t is ShardingType.DATA_PARALLEL else "fused") for t in ShardingType}


@dataclass(frozen=True)
class Shard:
    """A block of a table on one rank: rows [row_offset, +num_rows), cols [col_offset, +num_cols),
    kept at `location` (with an HBM cache of cache_rows rows for ``uvm_cache``; 0 otherwise)."""

    rank: int
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    location: Location = Location.HBM
    cache_rows: int = 0


@dataclass(frozen=True)
class Perf:
    """Predicted time of one shard (or a whole rank) per phase of a training step, in ms.

    input_dist: ids and lengths all-to-all; lookup_fwd/lookup_bwd: FBGEMM kernels (bwd
    includes the fused optimizer update); output_dist_fwd: embeddings (pooled sums,
    row-wise partial sums, or per-id rows) back to the sample owners; output_dist_bwd: their
    gradients the other way; dp_allreduce: gradient all-reduce of data-parallel tables.
    """

    input_dist_ms: float = 0.0
    lookup_fwd_ms: float = 0.0
    output_dist_fwd_ms: float = 0.0
    output_dist_bwd_ms: float = 0.0
    lookup_bwd_ms: float = 0.0
    dp_allreduce_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return (
            self.input_dist_ms + self.lookup_fwd_ms + self.output_dist_fwd_ms
            + self.output_dist_bwd_ms + self.lookup_bwd_ms + self.dp_allreduce_ms
        )

    def __add__(self, other: "Perf") -> "Perf":  # spelled out: the enumeration adds Perfs ~10^5 times at scale
        return Perf(self.input_dist_ms + other.input_dist_ms, self.lookup_fwd_ms + other.lookup_fwd_ms,
                    self.output_dist_fwd_ms + other.output_dist_fwd_ms, self.output_dist_bwd_ms + other.output_dist_bwd_ms,
                    self.lookup_bwd_ms + other.lookup_bwd_ms, self.dp_allreduce_ms + other.dp_allreduce_ms)

    def to_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total_ms"] = self.total_ms
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, float]) -> "Perf":
        return cls(**{f.name: float(raw[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class Storage:
    """Bytes one shard (or a whole rank) holds: in HBM its weights (or their cache), optimizer
    state and I/O buffers (`total_bytes`); in host memory `host_bytes` (weights and optimizer
    state of shards kept there, see embshard.planner.cost.storage)."""

    weights_bytes: int = 0
    optimizer_bytes: int = 0
    io_bytes: int = 0
    host_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        """HBM bytes (host_bytes apart)."""
        return self.weights_bytes + self.optimizer_bytes + self.io_bytes

    def __add__(self, other: "Storage") -> "Storage":
        return Storage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def fits_in(self, cap_bytes: int) -> bool:
        return self.total_bytes <= cap_bytes

    def to_dict(self) -> dict[str, int]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total_bytes"] = self.total_bytes
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, int]) -> "Storage":
        """host_bytes may be absent (plans before tiers: 0)."""
        return cls(**{f.name: int(raw[f.name]) for f in fields(cls) if f.name != "host_bytes"}, host_bytes=int(raw.get("host_bytes", 0)))


@dataclass(frozen=True)
class ShardCost:
    """Cost of one block of a candidate layout (placement-independent; equal blocks share one)."""

    perf: Perf
    storage: Storage


@dataclass(frozen=True)
class Block:
    """Rows [row_offset, +num_rows) and columns [col_offset, +num_cols) of a table."""

    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int


@dataclass(frozen=True)
class Candidate:
    """One way to shard a table, not yet on ranks.

    row_spans x col_spans: the shards' blocks of the table; shards: what each block's holder
      rank pays for it (all empty for data_parallel).
    requester: all-to-all time every rank pays as the owner of its own samples.
    every_rank / every_rank_storage: what every rank pays regardless of placement
      (a data-parallel replica, or the buffers for its own samples' outputs).
    location / cache_fraction: where every shard's weights live, and for ``uvm_cache`` the
      share of each shard's rows its HBM cache holds (embshard.planner.cost.tiers.cache_rows).
    """

    table: str
    sharding_type: ShardingType
    row_spans: tuple[tuple[int, int], ...]  # (row_offset, num_rows) per row block
    col_spans: tuple[tuple[int, int], ...]  # (col_offset, num_cols) per column block
    shards: tuple[ShardCost, ...]  # one per (row block, column block), rows outer
    requester: Perf
    every_rank: Perf
    every_rank_storage: Storage
    location: Location = Location.HBM
    cache_fraction: float = 0.0
    hot_rows: int = 0  # hottest rows replicated on every rank (their replica is in every_rank*)
    data_parallel_mode: str | None = None  # data_parallel: the mode every_rank prices

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(Block(ro, n, co, d) for ro, n in self.row_spans for co, d in self.col_spans)

    @property
    def label(self) -> str:
        short = {"data_parallel": "DP", "table_wise": "TW", "row_wise": "RW", "column_wise": "CW",
                 "table_row_wise": "TWRW", "table_column_wise": "TWCW"}[self.sharding_type.value]
        base = short if self.num_shards <= 1 else f"{short}{self.num_shards}"
        if self.hot_rows:
            base = f"{base}+hot{self.hot_rows}"
        if self.location is Location.UVM_CACHE:
            return f"{base}@cache{self.cache_fraction:.0%}"
        return f"{base}@host" if self.location is Location.HOST else base


@dataclass(frozen=True)
class TableConstraint:
    """Per-table restrictions: allowed sharding types and the ranks its shards may use."""

    sharding_types: tuple[ShardingType, ...] = tuple(ShardingType)
    ranks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Constraints:
    """Per-table constraints and groups of tables to keep together (table-wise on one rank)."""

    tables: Mapping[str, TableConstraint] = field(default_factory=dict)
    keep_together: tuple[tuple[str, ...], ...] = ()

    def for_table(self, name: str) -> TableConstraint:
        return self.tables.get(name, TableConstraint())

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, table_names: Sequence[str], world_size: int,
                  where: str = "constraints") -> "Constraints":
        """Parse ``{tables: {NAME: {sharding_types: [...], ranks: [...]}}, keep_together: [[A, B]]}``."""
        if not raw:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping with 'tables' and/or 'keep_together'")
        unknown = sorted(set(raw) - {"tables", "keep_together"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: 'tables', 'keep_together'")
        known = set(table_names)
        per_table: dict[str, TableConstraint] = {}
        for name, c in (raw.get("tables") or {}).items():
            w = f"{where}.tables.{name}"
            if name not in known:
                raise ValueError(f"{w}: no table named {name!r}; constraints must name tables from the tables list")
            c = c or {}
            bad = sorted(set(c) - {"sharding_types", "ranks"})
            if bad:
                raise ValueError(f"{w}: unknown key(s) {bad}; allowed: 'sharding_types', 'ranks'")
            types = tuple(ShardingType.parse(t, f"{w}.sharding_types[{i}]") for i, t in enumerate(c.get("sharding_types") or [t.value for t in ShardingType]))
            ranks = c.get("ranks")
            if ranks is not None:
                ranks = tuple(ranks)
                for i, r in enumerate(ranks):
                    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < world_size:
                        raise ValueError(f"{w}.ranks[{i}]: rank {r!r} does not exist; ranks are 0..{world_size - 1}")
                if not ranks:
                    raise ValueError(f"{w}.ranks: empty; list at least one rank or drop the key")
            per_table[name] = TableConstraint(types, ranks)
        groups = []
        for i, group in enumerate(raw.get("keep_together") or []):
            group = tuple(group)
            for name in group:
                if name not in known:
                    raise ValueError(f"{where}.keep_together[{i}]: no table named {name!r}")
            if len(group) < 2:
                raise ValueError(f"{where}.keep_together[{i}]: a group needs at least two tables, got {list(group)}")
            groups.append(group)
        seen: dict[str, int] = {}
        for i, group in enumerate(groups):
            for name in group:
                if name in seen:
                    raise ValueError(f"{where}.keep_together[{i}]: table {name!r} is already in group {seen[name]}; merge the groups")
                seen[name] = i
        return cls(per_table, tuple(groups))
