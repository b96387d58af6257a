"""ShardingPlan: where every table's shards live, with the prediction that chose it.

The plan is the only contract between planner and runtime. It serialises to versioned
JSON (``to_json``/``from_json`` round-trip exactly) holding the tables' placements and
specs, the topology, per-rank predicted cost by phase and memory, the lower bound on the
objective, and a hash of the inputs that produced it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from embshard.fsutil import write_text_atomic
from embshard.planner.types import COMPUTE_KERNEL, Perf, Shard, ShardingType, Storage
from embshard.specs import TableSpec, tables_from_list
from embshard.topology import Topology

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TablePlacement:
    name: str
    sharding_type: ShardingType
    compute_kernel: str
    shards: tuple[Shard, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
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

    def placement(self, name: str) -> TablePlacement:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def spec(self, name: str) -> TableSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(name)

    # ---- serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "input_hash": self.input_hash,
            "topology": self.topology.to_dict(),
            "objective_ms": self.max_rank_ms,
            "lower_bound_ms": self.lower_bound_ms,
            "gap": self.gap,
            "tables": [
                {
                    "name": t.name,
                    "sharding_type": t.sharding_type.value,
                    "compute_kernel": t.compute_kernel,
                    "shards": [
                        {"rank": s.rank, "row_offset": s.row_offset, "num_rows": s.num_rows,
                         "col_offset": s.col_offset, "num_cols": s.num_cols}
                        for s in t.shards
                    ],
                }
                for t in self.tables
            ],
            "specs": [s.to_dict() for s in self.specs],
            "ranks": [
                {"rank": r.rank, "perf_ms": r.perf.to_dict(), "memory_bytes": r.storage.to_dict()}
                for r in self.ranks
            ],
            "search": dict(self.search),
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
        if version != SCHEMA_VERSION:
            raise ValueError(f"{where}.schema_version: this embshard reads version {SCHEMA_VERSION}, file has {version!r}; re-run embshard-plan")
        for key in ("input_hash", "topology", "tables", "specs", "ranks", "lower_bound_ms"):
            if key not in raw:
                raise ValueError(f"{where}.{key}: missing; the file is not an embshard plan or is truncated")
        topology = Topology.from_dict(raw["topology"], f"{where}.topology")
        specs = tables_from_list(raw["specs"], f"{where}.specs")
        try:
            tables = tuple(
                TablePlacement(
                    name=t["name"],
                    sharding_type=ShardingType.parse(t["sharding_type"], f"{where}.tables[{i}].sharding_type"),
                    compute_kernel=t["compute_kernel"],
                    shards=tuple(Shard(**{k: int(s[k]) for k in ("rank", "row_offset", "num_rows", "col_offset", "num_cols")}) for s in t["shards"]),
                )
                for i, t in enumerate(raw["tables"])
            )
            ranks = tuple(
                RankReport(int(r["rank"]), Perf.from_dict(r["perf_ms"]), Storage.from_dict(r["memory_bytes"]))
                for r in raw["ranks"]
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed table or rank entry (missing {e}); re-run embshard-plan") from None
        plan = cls(tables, specs, topology, ranks, float(raw["lower_bound_ms"]), str(raw["input_hash"]), raw.get("search", {}))
        validate_placements(plan.tables, plan.specs, plan.topology, where)
        return plan


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
        if not t.shards:
            raise ValueError(f"{w}.shards: empty")
        for j, s in enumerate(t.shards):
            if not 0 <= s.rank < topology.world_size:
                raise ValueError(f"{w}.shards[{j}].rank: {s.rank} is not a rank of a {topology.world_size}-rank topology")
            if s.num_rows <= 0 or s.num_cols <= 0 or s.row_offset < 0 or s.col_offset < 0 \
                    or s.row_offset + s.num_rows > spec.num_embeddings or s.col_offset + s.num_cols > spec.embedding_dim:
                raise ValueError(f"{w}.shards[{j}]: block rows [{s.row_offset}, +{s.num_rows}) cols [{s.col_offset}, +{s.num_cols}) "
                                 f"is outside the {spec.num_embeddings}x{spec.embedding_dim} table")
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            full = all(s.num_rows == spec.num_embeddings and s.num_cols == spec.embedding_dim for s in t.shards)
            if not full or sorted(t.ranks) != list(range(topology.world_size)):
                raise ValueError(f"{w}.shards: a data_parallel table lists one full shard on every rank")
            continue
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
