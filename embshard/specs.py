"""Embedding table specs: what the planner and runtime know about each table.

A table spec is a frozen value built from YAML/dicts with `TableSpec.from_dict`, which
rejects bad input with the field's path (``tables[3].num_embeddings: ...``).
`read_tables_file(path)` reads a tables file (the shipped ``embshard/configs/tables/NAME.yaml``,
or a user's, anywhere on disk; see embshard.tables_option): a top-level ``tables:`` list and
optional ``topology:`` and ``constraints:`` blocks; `load_tables_file(path)` returns its specs and
topology block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from embshard.topology import Topology

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "int8": 1}
# Bytes a row carries beyond its elements: FBGEMM's row-wise int8 keeps an fp16 scale and an
# fp16 bias per row (its DEFAULT_SCALE_BIAS_SIZE_IN_BYTES; rows unpadded on CPU).
ROW_OVERHEAD_BYTES = {"fp32": 0, "fp16": 0, "int8": 4}

# Optimizer state kept per row (bytes), as a function of the row width in elements.
# Optimizer state is always fp32, whatever the weights' dtype.
OPTIMIZER_STATE_FLOATS_PER_ROW = {
    "sgd": lambda dim: 0,
    "adagrad": lambda dim: dim,
    "rowwise_adagrad": lambda dim: 1,
    "adam": lambda dim: 2 * dim,
}

# Optimizers that move a looked-up row whose summed gradient is zero (adam's moments decay): a data-parallel
# table trained by all-reduce (embshard.runtime.dense_replicas) all-reduces a count of ids per row for them too (or
# with `sparse_dp_allreduce` updates the rows of the mask, the rows looked up anywhere).
ZERO_GRADIENT_MOVES = frozenset({"adam"})

# Across hosts the allreduce mode exchanges and updates only the rows some rank looked up (embshard.runtime.row_union:
# the ranks first sum a mask of DP_ROW_MASK_BYTES per row), a table's whole gradient where DP_SPARSE_MAX_FRACTION of
# its rows or more were looked up (as DDP; never for ZERO_GRADIENT_MOVES optimizers, which update the looked-up rows
# only).
DP_SPARSE_MAX_FRACTION = 0.5
DP_ROW_MASK_BYTES = 2
# Tables whose whole fp32 gradient is under this are exchanged whole (their saving is smaller than what the mask and
# the index work cost: DLRM batch 512's ten data-parallel tables of at most 583 rows on 2 emulated hosts, 3 paired
# repeats: CPU ratio to TorchRec 1.17x without the mask, 1.04x with it); a collection without such a table sends
# no mask at all.
DP_SPARSE_MIN_BYTES = 1 << 18


def sparse_dp_allreduce(num_hosts: int, sharded_dp_update: bool) -> bool:
    """Whether the allreduce mode exchanges only the rows looked up (embshard.runtime.dense_replicas): where its ranks
    span hosts (on one host the sum runs through shared memory: the mask and the index work cost more than the bytes
    save), without a sharded update (which reduce-scatters every row)."""
    return num_hosts > 1 and not sharded_dp_update


def sparse_dp_table(num_rows: int, dim: int, optimizer: str) -> bool:
    """Whether `sparse_dp_allreduce` exchanges only the rows looked up of this table (block): its whole gradient is
    DP_SPARSE_MIN_BYTES or more, or its optimizer moves zero-gradient rows (its rows come from the mask)."""
    return num_rows * dim * 4 >= DP_SPARSE_MIN_BYTES or optimizer in ZERO_GRADIENT_MOVES


def dp_allreduce_floats_per_row(optimizer: str, dim: int) -> int:
    """Floats a data-parallel table trained by all-reduce puts in the flat buffer per row (without
    `sparse_dp_allreduce`): its gradient, and for `ZERO_GRADIENT_MOVES` optimizers its id count."""
    return dim + (optimizer in ZERO_GRADIENT_MOVES)


def piece_rows(num_rows: int, world: int) -> list[int]:
    """Sizes of the ``world`` parts torch.tensor_split cuts num_rows into: each rank's piece of a block in a
    sharded update, each local rank's share of the buffer in a hierarchical all-reduce."""
    return [num_rows // world + (r < num_rows % world) for r in range(world)]


def sharded_segment_floats(tables: Sequence[tuple[int, int, str]], world: int) -> int:
    """Floats each rank reduce-scatters and all-gathers in a sharded update of data-parallel tables
    (rows, width, optimizer): rank 0's share of every table, to which the others are padded."""
    return sum(piece_rows(n, world)[0] * dp_allreduce_floats_per_row(opt, w) for n, w, opt in tables)


TABLE_KEYS = (
    "name",
    "num_embeddings",
    "embedding_dim",
    "pooling_factor",
    "pooled",
    "feature_names",
    "dtype",
    "optimizer",
    "hot_rows",
)


@dataclass(frozen=True)
class TableSpec:
    """One embedding table.

    pooling_factor: mean number of ids per sample for each of the table's features.
    pooled: True for a summed bag (EmbeddingBag, one vector per sample and feature),
      False for a sequence table (one vector per id, jagged output).
    feature_names: features that look up this table; defaults to ``(name,)``.
    dtype: how the weights are stored: fp32, fp16, or row-wise int8 (serving only: a uint8
      per element plus an fp16 scale and bias per row, FBGEMM's layout).
    hot_rows: the measured access-frequency curve (embshard-stats), pairs
      ``(fraction_of_rows, fraction_of_lookups)``: the hottest fraction_of_rows of the rows get
      fraction_of_lookups of the lookups. None: not measured (and absent from `to_dict`, so
      specs without it hash and serialise as before).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    pooled: bool = True
    feature_names: tuple[str, ...] = ()
    dtype: str = "fp32"
    optimizer: str = "rowwise_adagrad"
    hot_rows: tuple[tuple[float, float], ...] | None = None

    def __post_init__(self) -> None:
        if not self.feature_names:
            object.__setattr__(self, "feature_names", (self.name,))
        else:
            object.__setattr__(self, "feature_names", tuple(self.feature_names))

    @property
    def element_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def row_bytes(self, num_cols: int) -> int:
        """Bytes of one stored row of ``num_cols`` columns (a column shard has its own int8 scale and bias)."""
        return num_cols * DTYPE_BYTES[self.dtype] + ROW_OVERHEAD_BYTES[self.dtype]

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def optimizer_state_bytes_per_row(self, num_cols: int) -> int:
        return 4 * OPTIMIZER_STATE_FLOATS_PER_ROW[self.optimizer](num_cols)

    def to_dict(self) -> dict[str, Any]:
        out = {key: getattr(self, key) for key in TABLE_KEYS}  # (asdict's deep copy: a fifth of a 26-table plan's report)
        out["feature_names"] = list(self.feature_names)
        if self.hot_rows is None:
            del out["hot_rows"]
        else:
            out["hot_rows"] = [list(pair) for pair in self.hot_rows]
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "table") -> "TableSpec":
        """Validate one table mapping; errors name ``where.field`` and how to fix it."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping with keys {list(TABLE_KEYS)}, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(TABLE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {list(TABLE_KEYS)}")
        for key in ("name", "num_embeddings", "embedding_dim"):
            if key not in raw:
                raise ValueError(f"{where}.{key}: missing; every table needs name, num_embeddings and embedding_dim")
        name = raw["name"]
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"{where}.name: must be a non-empty string of letters, digits, '_', '-', '.', got {name!r}")
        where = f"{where} ({name})"
        num_embeddings = _positive_int(raw["num_embeddings"], f"{where}.num_embeddings")
        embedding_dim = _positive_int(raw["embedding_dim"], f"{where}.embedding_dim")
        pooling_factor = raw.get("pooling_factor", 1.0)
        if isinstance(pooling_factor, bool) or not isinstance(pooling_factor, (int, float)) or not math.isfinite(pooling_factor) or pooling_factor <= 0:
            raise ValueError(f"{where}.pooling_factor: must be a positive number (mean ids per sample), got {pooling_factor!r}")
        pooled = raw.get("pooled", True)
        if not isinstance(pooled, bool):
            raise ValueError(f"{where}.pooled: must be true (summed bag) or false (sequence), got {pooled!r}")
        features = raw.get("feature_names") or [name]
        if isinstance(features, str) or not isinstance(features, Sequence) or not all(isinstance(f, str) and f for f in features):
            raise ValueError(f"{where}.feature_names: must be a list of non-empty strings, got {features!r}")
        if len(set(features)) != len(features):
            raise ValueError(f"{where}.feature_names: duplicates in {list(features)}")
        dtype = raw.get("dtype", "fp32")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{where}.dtype: must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
        optimizer = raw.get("optimizer", "rowwise_adagrad")
        if optimizer not in OPTIMIZER_STATE_FLOATS_PER_ROW:
            raise ValueError(f"{where}.optimizer: must be one of {sorted(OPTIMIZER_STATE_FLOATS_PER_ROW)}, got {optimizer!r}")
        return cls(
            name=name,
            num_embeddings=num_embeddings,
            embedding_dim=embedding_dim,
            pooling_factor=float(pooling_factor),
            pooled=pooled,
            feature_names=tuple(features),
            dtype=dtype,
            optimizer=optimizer,
            hot_rows=_hot_rows(raw.get("hot_rows"), f"{where}.hot_rows"),
        )


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: must be a positive integer, got {value!r}")
    return value


def _hot_rows(value: Any, where: str) -> tuple[tuple[float, float], ...] | None:
    """Validate an access-frequency curve: [fraction_of_rows, fraction_of_lookups] pairs (None: not measured)."""
    if value is None:
        return None
    how = ("give [fraction_of_rows, fraction_of_lookups] pairs in [0, 1], fraction_of_rows strictly increasing, "
           "fraction_of_lookups non-decreasing and >= fraction_of_rows (e.g. [[0.01, 0.4], [0.1, 0.8]], as "
           "embshard-stats writes), or drop the field")
    if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"{where}: expected a non-empty list of pairs, got {value!r}; {how}")
    pairs = []
    for i, pair in enumerate(value):
        if (isinstance(pair, (str, Mapping)) or not isinstance(pair, Sequence) or len(pair) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in pair)):
            raise ValueError(f"{where}[{i}]: expected a pair of numbers, got {pair!r}; {how}")
        rows, lookups = float(pair[0]), float(pair[1])
        if not (0 <= rows <= 1 and 0 <= lookups <= 1):
            raise ValueError(f"{where}[{i}]: {list(pair)} leaves [0, 1]; {how}")
        if lookups < rows:
            raise ValueError(f"{where}[{i}]: {list(pair)} sends fewer lookups than its share of the rows "
                             f"({lookups:g} < {rows:g}); the hottest rows get at least a uniform share; {how}")
        if pairs and rows <= pairs[-1][0]:
            raise ValueError(f"{where}[{i}]: fraction_of_rows {rows:g} does not increase (previous {pairs[-1][0]:g}); {how}")
        if pairs and lookups < pairs[-1][1]:
            raise ValueError(f"{where}[{i}]: fraction_of_lookups {lookups:g} decreases (previous {pairs[-1][1]:g}); {how}")
        pairs.append((rows, lookups))
    return tuple(pairs)


TEXT_COLUMNS = ("name", "num_embeddings", "embedding_dim", "pooling_factor", "pooled", "dtype", "optimizer")


def _table_rows(text: str, where: str) -> list[dict[str, Any]]:
    """Tables as text, a header of column names (TEXT_COLUMNS, name first) then one table per line.

    Large generated sets use it: Hydra loads one string 100x faster than thousands of mappings."""
    lines = [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{where}: the table text is empty; give a header line ({' '.join(TEXT_COLUMNS)}) and a line per table")
    header = lines[0]
    bad = sorted(set(header) - set(TEXT_COLUMNS))
    if bad or header[:1] != ["name"] or len(set(header)) != len(header):
        raise ValueError(f"{where}: the first line must name the columns, 'name' first, from {list(TEXT_COLUMNS)}; got {header}")
    rows = []
    for i, values in enumerate(lines[1:], start=1):
        if len(values) != len(header):
            raise ValueError(f"{where}: table line {i} has {len(values)} values for the {len(header)} columns {header}")
        rows.append({k: v if k in ("name", "dtype", "optimizer") else _scalar(v) for k, v in zip(header, values)})
    return rows


def _scalar(text: str) -> Any:
    """'12' -> 12, '1.5' -> 1.5, 'true'/'false' -> bool; anything else stays text (validation names it)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def tables_from_list(raw: Any, where: str = "tables") -> tuple[TableSpec, ...]:
    """Validate a list of table mappings (or the same as text: `_table_rows`): each table, then
    unique names and feature names."""
    if isinstance(raw, str):
        raw = _table_rows(raw, where)
    if isinstance(raw, Mapping) or not isinstance(raw, Sequence):
        raise ValueError(f"{where}: expected a list of tables, got {type(raw).__name__}")
    if not raw:
        raise ValueError(f"{where}: the list is empty; give at least one table")
    tables = tuple(TableSpec.from_dict(t, f"{where}[{i}]") for i, t in enumerate(raw))
    seen: dict[str, int] = {}
    for i, t in enumerate(tables):
        if t.name in seen:
            raise ValueError(f"{where}[{i}].name: duplicate table name {t.name!r} (also {where}[{seen[t.name]}]); names must be unique")
        seen[t.name] = i
    owner: dict[str, str] = {}
    for i, t in enumerate(tables):
        for f in t.feature_names:
            if f in owner:
                raise ValueError(f"{where}[{i}].feature_names: feature {f!r} already looks up table {owner[f]!r}; a feature reads one table")
            owner[f] = t.name
    return tables


TABLES_FILE_KEYS = ("tables", "topology", "constraints")


def read_tables_file(path: str | Path) -> dict[str, Any]:
    """Read and check a tables YAML file; errors name the file and the field (``FILE: tables[3].dim: ...``).

    Its ``topology:`` block merges over a topology option and its ``constraints:`` may name ranks
    of that topology, so here each key they set is checked; the merged whole is checked at plan time.
    """
    from embshard.planner.types import Constraints  # not at the top: the planner package imports this module

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read tables file ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); a tables file is YAML text") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(raw, Mapping) or "tables" not in raw:
        raise ValueError(f"{path}: expected a top-level 'tables:' list (and optionally 'topology:' and 'constraints:')")
    extra = sorted(set(raw) - set(TABLES_FILE_KEYS))
    if extra:
        raise ValueError(f"{path}: unknown top-level key(s) {extra}; a tables file holds 'tables:' and optionally 'topology:' "
                         "and 'constraints:'")
    specs = tables_from_list(raw["tables"], f"{path}: tables")
    topology = raw.get("topology")
    if topology is not None:
        if not isinstance(topology, Mapping):
            raise ValueError(f"{path}: topology: expected a mapping of topology keys, got {type(topology).__name__}")
        world = topology.get("world_size", topology.get("local_world_size", 1))
        Topology.from_dict({"world_size": world, "local_world_size": world, **topology}, f"{path}: topology")
    if raw.get("constraints") is not None:
        world_size = topology.get("world_size") if topology else None
        Constraints.from_dict(raw["constraints"], [s.name for s in specs], world_size if isinstance(world_size, int) else 1 << 30,
                              f"{path}: constraints")
    return dict(raw)


def load_tables_file(path: str | Path) -> tuple[tuple[TableSpec, ...], dict[str, Any] | None]:
    """Read a tables YAML file: returns the tables and its ``topology:`` block (or None)."""
    raw = read_tables_file(path)
    return tables_from_list(raw["tables"], f"{path}: tables"), raw.get("topology")
