"""Static routing of one sharded collection, derived from the plan (pure, no tensors).

A *slot* is one feature's view of one shard: the ids a rank sends to the shard's rank.
The sharding types differ only in how a table's shards turn into slots:
table_wise gives one slot per feature, column_wise/table_column_wise one per column shard
(each receives every id), row_wise/table_row_wise one per row block (each receives the
ids in its rows, re-based to the block). data_parallel features get a second routing,
`Routing.replicas`, with one slot per feature on every rank; its slots are grouped by the
tables' data-parallel mode (`Routing.replica_groups`, one routing per mode, in
`DATA_PARALLEL_MODES` order): "allreduce" replicas look up their own rank's samples,
"replicated_lookup" ones the global batch (keeping their own rows); either way every replica
applies the same update.
On its destination, a slot belongs to one rank-local kernel (grouped by implementation,
optimizer, weight dtype and, except for FBGEMM's pooled kernels, width; any width trains: the
torch kernel runs those FBGEMM's training kernel rejects); slots are ordered
by kernel so that every kernel reads a contiguous range. Serving collections (``inference``)
group by dtype alone: their forward-only kernels have no optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from embshard.planner.plan import ShardingPlan, validate_placements
from embshard.planner.splits import COL_ALIGN
from embshard.planner.types import Location, ShardingType
from embshard.runtime.optim import OPTIMIZERS
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES

POOLING_MODES = ("sum", "mean")


@dataclass(frozen=True)
class FeatureInfo:
    name: str
    table: str
    num_embeddings: int
    dim: int
    col_offset: int  # first column of this feature in the pooled output [B, sum of dims]
    data_parallel: bool
    mean: bool


@dataclass(frozen=True)
class Slot:
    feature: int  # index into Routing.features
    table: str
    rank: int
    bucket: int  # row block of a row-wise table (0 otherwise)
    row_offset: int
    num_rows: int
    col_offset: int
    num_cols: int
    location: Location = Location.HBM  # where the shard's rows live (a kernel may mix locations)
    cache_rows: int = 0  # its planned HBM cache (uvm_cache)


@dataclass(frozen=True)
class KernelSpec:
    """A rank-local fused kernel over blocks (one per table) serving a range of slots."""

    impl: str  # "fbgemm" or "torch" (training), "quant" (forward-only serving)
    optimizer: str  # "" for forward-only kernels
    dtype: str  # weight dtype of every block
    slots: tuple[Slot, ...]  # served slots, in order
    blocks: tuple[Slot, ...]  # one representative slot per table block, in kernel order
    slot_block: tuple[int, ...]  # for each served slot, its block index
    slot_start: int  # first served slot in the rank's slot list (sharded or data-parallel)

    @property
    def slot_end(self) -> int:
        return self.slot_start + len(self.slots)

    @property
    def dim(self) -> int:
        """Output width per slot; only meaningful for kernels of one width."""
        return self.slots[0].num_cols


@dataclass(frozen=True)
class Routing:
    rank: int
    world_size: int
    pooled: bool
    features: tuple[FeatureInfo, ...]
    slots_by_rank: tuple[tuple[Slot, ...], ...]  # slots each rank looks up, in kernel order
    kernels: tuple[KernelSpec, ...]  # this rank's kernels
    replicas: "Routing | None"  # data-parallel features, every one on every rank (slots and kernels by mode group)
    num_buckets: int  # row blocks of the most split row-wise table (1 when none)
    bucket_bounds: tuple[tuple[int, ...], ...]  # per feature: num_buckets + 1 row boundaries
    # (mode, routing of that mode's data-parallel features), in the order of `replicas`' slots and kernels
    replica_groups: tuple[tuple[str, "Routing"], ...] = ()

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    @property
    def send_slots(self) -> tuple[Slot, ...]:
        return tuple(s for slots in self.slots_by_rank for s in slots)

    @property
    def output_dim(self) -> int:
        return sum(f.dim for f in self.features)

    def slot_width(self, rank: int) -> int:
        return sum(s.num_cols for s in self.slots_by_rank[rank])

    @property
    def has_row_wise(self) -> bool:
        return self.num_buckets > 1


def check_plan(specs: Sequence[TableSpec], plan: ShardingPlan, world_size: int, pooled: bool, where: str,
               inference: bool = False) -> None:
    """ValueError unless ``plan`` places exactly these tables, as they are, on ``world_size`` ranks
    (int8 tables only in forward-only ``inference`` collections)."""
    if not specs:
        raise ValueError(f"{where}: no tables; give at least one {'pooled' if pooled else 'sequence'} table spec")
    if plan.topology.world_size != world_size:
        raise ValueError(f"{where}: the plan is for {plan.topology.world_size} ranks but the process group has "
                         f"{world_size}; plan again with topology.world_size={world_size}")
    planned = {t.name for t in plan.tables}
    for spec in specs:
        kind = "pooled" if spec.pooled else "sequence"
        if spec.pooled != pooled:
            raise ValueError(f"{where}: table {spec.name!r} is a {kind} table; put it in the "
                             f"{'ShardedEmbeddingBagCollection' if spec.pooled else 'ShardedEmbeddingCollection'}")
        if spec.name not in planned:
            raise ValueError(f"{where}: table {spec.name!r} is not in the plan (plan has {sorted(planned)}); re-run the planner")
        ps = plan.spec(spec.name)
        for field in ("num_embeddings", "embedding_dim", "feature_names"):
            if getattr(ps, field) != getattr(spec, field):
                raise ValueError(f"{where}: table {spec.name!r}.{field} is {getattr(spec, field)!r} but the plan has "
                                 f"{getattr(ps, field)!r}; re-run the planner for these tables")
        if spec.dtype == "int8" and not inference:
            raise ValueError(f"{where}: table {spec.name!r} is int8, which serves (embshard-export dtype=int8) but does "
                             "not train; train it in fp32 or fp16")
        if spec.optimizer not in OPTIMIZERS:
            raise ValueError(f"{where}: table {spec.name!r}.optimizer {spec.optimizer!r} is not one of {OPTIMIZERS}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: duplicate table names in {names}")
    placements = [plan.placement(n) for n in names]
    validate_placements(placements, specs, plan.topology, where)


def build_routing(
    specs: Sequence[TableSpec],
    plan: ShardingPlan,
    rank: int,
    world_size: int,
    pooled: bool,
    pooling: Mapping[str, str],
    fbgemm_optimizers: frozenset[str],
    inference: bool = False,
    data_parallel_modes: Mapping[str, str] | None = None,
) -> Routing:
    """Slots, kernels and row-bucket boundaries of one collection on ``rank``.

    fbgemm_optimizers: optimizers FBGEMM runs on this device; tables with others use the torch kernel.
    inference: forward-only serving kernels, one per weight dtype (and width, for sequence kernels).
    data_parallel_modes: data-parallel table -> its mode (`DATA_PARALLEL_MODES`; missing: the first).
    """
    features: list[FeatureInfo] = []
    slots: list[Slot] = []
    bounds: list[list[int]] = []
    col = 0
    for spec in specs:
        placement = plan.placement(spec.name)
        dp = placement.sharding_type is ShardingType.DATA_PARALLEL
        for name in spec.feature_names:
            fi = len(features)
            features.append(FeatureInfo(name, spec.name, spec.num_embeddings, spec.embedding_dim, col, dp,
                                        pooling.get(spec.name, "sum") == "mean"))
            col += spec.embedding_dim
            row_blocks = sorted(placement.shards, key=lambda s: s.row_offset) if placement.sharding_type.splits_rows else []
            bounds.append([s.row_offset for s in row_blocks] or [0])
            if dp:
                continue
            for shard in placement.shards:
                bucket = row_blocks.index(shard) if row_blocks else 0
                slots.append(Slot(fi, spec.name, shard.rank, bucket, shard.row_offset, shard.num_rows,
                                  shard.col_offset, shard.num_cols, shard.location, shard.cache_rows))
    num_buckets = max(len(b) for b in bounds)
    bucket_bounds = tuple(tuple(b + [f.num_embeddings] * (num_buckets + 1 - len(b))) for b, f in zip(bounds, features))
    by_name = {s.name: s for s in specs}

    def kernel_key(slot: Slot) -> tuple[str, str, str, int]:
        spec = by_name[slot.table]
        if inference:
            return "quant", "", spec.dtype, 0 if pooled else slot.num_cols
        # FBGEMM's training kernel needs widths that are multiples of 4; the torch kernel runs any width.
        impl = "fbgemm" if spec.optimizer in fbgemm_optimizers and slot.num_cols % COL_ALIGN == 0 else "torch"
        # FBGEMM's pooled kernel mixes widths; sequence kernels and the torch kernel do not.
        return impl, spec.optimizer, spec.dtype, (0 if impl == "fbgemm" and pooled else slot.num_cols)

    slots_by_rank, kernels = _order_by_kernel(slots, rank, world_size, kernel_key)
    dp_features = [i for i, f in enumerate(features) if f.data_parallel]
    modes = data_parallel_modes or {}
    groups = []
    for mode in DATA_PARALLEL_MODES:
        group = [i for i in dp_features if modes.get(features[i].table, DATA_PARALLEL_MODES[0]) == mode]
        if not group:
            continue
        # One slot per (rank, feature): each replica may look up every rank's ids.
        copies = [Slot(i, features[i].table, r, 0, 0, features[i].num_embeddings, 0, features[i].dim)
                  for r in range(world_size) for i in group]
        replica_slots, replica_kernels = _order_by_kernel(copies, rank, world_size, kernel_key)
        groups.append((mode, Routing(rank, world_size, pooled, tuple(features), replica_slots, replica_kernels, None, 1,
                                     tuple((0, f.num_embeddings) for f in features))))
    replicas = _joined(groups, rank) if groups else None
    return Routing(rank, world_size, pooled, tuple(features), slots_by_rank, kernels, replicas, num_buckets, bucket_bounds,
                   tuple(groups))


def _joined(groups: list[tuple[str, Routing]], rank: int) -> Routing:
    """The routings of several groups as one: each rank's slots one group after another, kernels likewise."""
    first = groups[0][1]
    kernels, start = [], 0
    for _, g in groups:
        kernels.extend(replace(k, slot_start=k.slot_start + start) for k in g.kernels)
        start += len(g.slots_by_rank[rank])
    slots = tuple(tuple(s for _, g in groups for s in g.slots_by_rank[r]) for r in range(first.world_size))
    return replace(first, slots_by_rank=slots, kernels=tuple(kernels))


def _order_by_kernel(slots: list[Slot], rank: int, world_size: int, kernel_key) -> tuple[tuple[tuple[Slot, ...], ...], tuple[KernelSpec, ...]]:
    """Each rank's slots ordered by kernel, and this rank's kernels."""
    slots_by_rank = []
    kernels: list[KernelSpec] = []
    for r in range(world_size):
        mine = [s for s in slots if s.rank == r]
        ordered: list[Slot] = []
        for key in sorted({kernel_key(s) for s in mine}):
            served = [s for s in mine if kernel_key(s) == key]
            if r == rank:
                kernels.append(_kernel(key, served, len(ordered)))
            ordered.extend(served)
        slots_by_rank.append(tuple(ordered))
    return tuple(slots_by_rank), tuple(kernels)


def _kernel(key: tuple[str, str, str, int], served: list[Slot], slot_start: int) -> KernelSpec:
    tables = list(dict.fromkeys(s.table for s in served))
    blocks = tuple(next(s for s in served if s.table == t) for t in tables)
    return KernelSpec(key[0], key[1], key[2], tuple(served), blocks, tuple(tables.index(s.table) for s in served),
                      slot_start)
