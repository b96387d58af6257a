"""embshard <-> TorchRec: table configs, sharding plans, topology and TorchRec's cost model.

- `to_embedding_configs(specs)`: EmbeddingBagConfig (pooled) and EmbeddingConfig (sequence).
- `to_torchrec_plan(plan)`: a `torchrec.distributed.types.ShardingPlan` for
  DistributedModelParallel. Exact for every layout TorchRec can run; any other layout raises
  ValueError naming the table, the reason and the fix. Shards out of HBM export as
  FUSED_UVM_CACHING with `CacheParams(load_factor=cache rows / rows)` (uvm_cache) or FUSED_UVM
  (host); TorchRec keeps one kernel and load factor per table, so its shards must agree.
- `to_torchrec_qcomms(plan)`: the plan's wire dtypes (`topology.comms`) as a `QCommsConfig`
  for TorchRec's sharders (``qcomm_codecs_registry=get_qcomm_codecs_registry(config)``).
- `from_torchrec_plan(tr_plan, specs, topology)`: TorchRec's plan scored by embshard's model.
- `to_torchrec_topology(topology)`: the same cluster for TorchRec's planner (bytes/ms units).
- `torchrec_estimate(plan)`: per-rank step time (ms) under TorchRec's EmbeddingPerfEstimator,
  summed by rank exactly like TorchRec's NoopPerfModel (the planner's objective is the max).

What TorchRec 1.8 can run (read from its sharding code and checked with DMP on gloo):
row_wise puts block i of ceil(rows / world_size) rows on rank i of all ranks; table_row_wise
does the same with ceil(rows / local_world_size) blocks on the ranks of one host; column_wise
and table_column_wise take any column blocks on any ranks. EmbeddingCollection (sequence
tables) runs data_parallel, table_wise, column_wise and row_wise only, with one column-shard
width for all of its column-wise tables, and its data_parallel (dense kernel) fails on CPU.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig
from torchrec.distributed.planner.enumerators import get_partition_by_type
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator
from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, ParameterConstraints
from torchrec.distributed.planner.types import Shard as TrShard
from torchrec.distributed.planner.types import ShardingOption, TopologyFactory, TrainerConfig
from torchrec.distributed.planner.types import Topology as TrTopology
from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name
from torchrec.distributed.sharding_plan import placement
from torchrec.distributed.types import CacheParams, EmbeddingModuleShardingPlan, EnumerableShardingSpec, ParameterSharding
from torchrec.distributed.types import ShardingPlan as TrShardingPlan
from torchrec.distributed.types import ShardMetadata
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embshard.planner.api import evaluate
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.splits import row_splits
from embshard.planner.cost.tiers import cache_rows
from embshard.planner.types import COMPUTE_KERNEL, Location, Shard, ShardingType
from embshard.specs import TableSpec
from embshard.topology import Topology

TORCHREC_DATA_TYPE = {"fp32": DataType.FP32, "fp16": DataType.FP16, "int8": DataType.INT8}
# embshard bandwidths are GB/s = 1e9 bytes per 1e3 ms; TorchRec's are bytes/ms.
BYTES_PER_MS_PER_GB_PER_S = 1e9 / 1e3
# Layouts TorchRec's EmbeddingCollection (sequence tables) can shard.
# TorchRec's compute kernel for a sharded table's location (data-parallel tables stay "dense").
LOCATION_KERNEL = {Location.HBM: "fused", Location.UVM_CACHE: "fused_uvm_caching", Location.HOST: "fused_uvm"}
SEQUENCE_SHARDING_TYPES = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)


def to_embedding_configs(specs: Sequence[TableSpec]) -> tuple[list[EmbeddingBagConfig], list[EmbeddingConfig]]:
    """TorchRec configs: (EmbeddingBagConfig per pooled table, EmbeddingConfig per sequence table)."""
    bags = [EmbeddingBagConfig(num_embeddings=s.num_embeddings, embedding_dim=s.embedding_dim, name=s.name,
                               data_type=TORCHREC_DATA_TYPE[s.dtype], feature_names=list(s.feature_names),
                               pooling=PoolingType.SUM)
            for s in specs if s.pooled]
    sequences = [EmbeddingConfig(num_embeddings=s.num_embeddings, embedding_dim=s.embedding_dim, name=s.name,
                                 data_type=TORCHREC_DATA_TYPE[s.dtype], feature_names=list(s.feature_names))
                 for s in specs if not s.pooled]
    dims = {c.embedding_dim for c in sequences}
    if len(dims) > 1:
        by_dim = {d: [c.name for c in sequences if c.embedding_dim == d] for d in sorted(dims)}
        raise ValueError(f"sequence tables: TorchRec's EmbeddingCollection needs one embedding_dim for all of its tables, "
                         f"got {by_dim}; give the sequence tables one embedding_dim or make some of them pooled")
    return bags, sequences


def to_torchrec_topology(topology: Topology) -> TrTopology:
    """The same cluster as TorchRec's planner Topology.

    Memory per rank goes to hbm_cap (ddr_cap for device=cpu, where TorchRec keeps tables in
    DDR), and on cuda host memory for tables (`topology.ddr_gib`) to ddr_cap with
    `ddr_gb_per_s` as its HBM-to-DDR bandwidth (UVM); bandwidths convert from GB/s to TorchRec's bytes/ms; the gather bandwidth goes to
    hbm_mem_bw (ddr_mem_bw for cpu). TorchRec's Topology has no batch size: it is an argument
    of its planner and of each ShardingOption (`topology.batch_size_per_rank` here).
    """
    cap_bytes = topology.rank_memory_bytes
    gather_bytes_per_ms = topology.hbm_gb_per_s * BYTES_PER_MS_PER_GB_PER_S
    on_cpu = topology.device == "cpu"
    hardware = HardwareConfig(
        hbm_cap_bytes=None if on_cpu else cap_bytes,
        ddr_cap_bytes=cap_bytes if on_cpu else topology.host_memory_cap_bytes,
        intra_host_bw=topology.intra_host_gb_per_s * BYTES_PER_MS_PER_GB_PER_S,
        inter_host_bw=topology.inter_host_gb_per_s * BYTES_PER_MS_PER_GB_PER_S,
        hbm_mem_bw=None if on_cpu else gather_bytes_per_ms,
        ddr_mem_bw=gather_bytes_per_ms if on_cpu else None,
        hbm_to_ddr_mem_bw=None if on_cpu else topology.ddr_gb_per_s * BYTES_PER_MS_PER_GB_PER_S,
    )
    trainer = TrainerConfig(world_size=topology.world_size, local_world_size=topology.local_world_size)
    kernel = KernelConfig(compute_device=topology.device, use_hardware_based_bandwidth=True)
    return TopologyFactory.create_topology(trainer_config=trainer, hardware_config=hardware, kernel_config=kernel)


def torchrec_constraints(specs: Sequence[TableSpec], uvm: bool = False) -> dict[str, ParameterConstraints]:
    """Per-table ParameterConstraints that tell TorchRec what embshard knows: pooling factors,
    the six sharding types embshard plans, and HBM-resident kernels (fused; dense for DP), with
    `uvm` also FUSED_UVM_CACHING and FUSED_UVM (tables in host memory)."""
    types = [t.value for t in ShardingType]
    kernels = ["fused", "dense", *(["fused_uvm_caching", "fused_uvm"] if uvm else [])]
    return {
        s.name: ParameterConstraints(
            sharding_types=types if s.pooled else [t.value for t in SEQUENCE_SHARDING_TYPES],
            compute_kernels=kernels,
            pooling_factors=[s.pooling_factor] * s.num_features,
            feature_names=list(s.feature_names),
        )
        for s in specs
    }


# ---- embshard plan -> TorchRec plan --------------------------------------------------


def to_torchrec_plan(plan: ShardingPlan, module_path: str = "", *, sequence_module_path: str | None = None) -> TrShardingPlan:
    """TorchRec ShardingPlan for the plan's EmbeddingBagCollection at `module_path` and, if the
    plan has sequence tables, its EmbeddingCollection at `sequence_module_path` (defaults to
    `module_path` when there are no pooled tables)."""
    has_pooled = any(s.pooled for s in plan.specs)
    has_sequence = any(not s.pooled for s in plan.specs)
    if sequence_module_path is None:
        if has_pooled and has_sequence:
            raise ValueError("to_torchrec_plan: the plan has pooled and sequence tables, which TorchRec keeps in two modules "
                             "(EmbeddingBagCollection, EmbeddingCollection); pass sequence_module_path='...' for the second")
        sequence_module_path = module_path
    elif has_pooled and sequence_module_path == module_path:
        raise ValueError(f"to_torchrec_plan: sequence_module_path must differ from module_path {module_path!r}")
    _check_sequence_layouts(plan)
    module_plans: dict[str, EmbeddingModuleShardingPlan] = {}
    for t in plan.tables:
        spec = plan.spec(t.name)
        shards = _torchrec_shard_order(t, spec, plan.topology)
        path = module_path if spec.pooled else sequence_module_path
        module_plans.setdefault(path, EmbeddingModuleShardingPlan())[t.name] = _parameter_sharding(t, shards, plan.topology)
    return TrShardingPlan(module_plans)


def _kernel_and_cache(t: TablePlacement) -> tuple[str, CacheParams | None]:
    """TorchRec's compute kernel and cache params for a sharded table; ValueError if its shards
    differ in location or cache share (TorchRec has one kernel and load factor per table)."""
    locations = {s.location for s in t.shards}
    if len(locations) > 1:
        raise ValueError(f"table {t.name!r}: its shards are in {sorted(x.value for x in locations)}, but TorchRec runs one "
                         f"compute kernel per table; keep them in one location to export")
    location = locations.pop()
    if location is not Location.UVM_CACHE:
        return LOCATION_KERNEL[location], None
    rows = sum(s.num_rows for s in t.shards)
    load_factor = sum(s.cache_rows for s in t.shards) / rows
    if any(abs(s.cache_rows - cache_rows(s.num_rows, load_factor)) > 1 for s in t.shards):  # one share, up to rounding
        shares = sorted({round(s.cache_rows / s.num_rows, 4) for s in t.shards})
        raise ValueError(f"table {t.name!r}: its shards cache {shares} of their rows, but TorchRec takes one "
                         f"cache_load_factor per table; give its shards one cache share to export")
    return LOCATION_KERNEL[location], CacheParams(load_factor=load_factor)


def to_torchrec_qcomms(plan: ShardingPlan) -> QCommsConfig:
    """TorchRec's QCommsConfig with the plan's forward and backward wire dtypes (its output dists and their
    gradients). TorchRec trains data-parallel tables under DDP, without quantized comms: a plan with such tables
    and ``comms.dp_allreduce`` other than fp32 raises. (On gloo TorchRec itself sends bf16 as fp16.)"""
    comms = plan.topology.comms
    if comms.dp_allreduce != "fp32" and any(t.sharding_type is ShardingType.DATA_PARALLEL for t in plan.tables):
        raise ValueError(f"to_torchrec_qcomms: comms.dp_allreduce={comms.dp_allreduce}, but TorchRec all-reduces data-parallel "
                         "tables in fp32 (DDP); plan with planner.comms.dp_allreduce=fp32 to export this plan")
    return QCommsConfig(forward_precision=CommType(comms.forward), backward_precision=CommType(comms.backward))


def _parameter_sharding(t: TablePlacement, shards: Sequence[Shard], topology: Topology) -> ParameterSharding:
    if t.sharding_type is ShardingType.DATA_PARALLEL:
        return ParameterSharding(sharding_type=t.sharding_type.value, compute_kernel=COMPUTE_KERNEL[t.sharding_type],
                                 ranks=list(range(topology.world_size)), sharding_spec=None)
    metadata = [
        ShardMetadata(shard_offsets=[s.row_offset, s.col_offset], shard_sizes=[s.num_rows, s.num_cols],
                      placement=placement(topology.device, s.rank, topology.local_world_size))
        for s in shards
    ]
    kernel, cache = _kernel_and_cache(t)
    return ParameterSharding(sharding_type=t.sharding_type.value, compute_kernel=kernel,
                             ranks=[s.rank for s in shards], sharding_spec=EnumerableShardingSpec(metadata), cache_params=cache)


def _torchrec_shard_order(t: TablePlacement, spec: TableSpec, topology: Topology) -> list[Shard]:
    """The table's shards in the order TorchRec indexes them; ValueError if TorchRec cannot run them."""
    st = t.sharding_type
    where = f"table {t.name!r} ({st.value})"
    if st in (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE):
        return list(t.shards)
    if st.splits_cols:
        return sorted(t.shards, key=lambda s: s.col_offset)
    # Row splits: TorchRec bucketizes ids into ceil(rows / n) blocks, block i on the i-th rank of the group.
    if st is ShardingType.ROW_WISE:
        group, scope = list(range(topology.world_size)), f"all {topology.world_size} ranks"
    else:
        host = topology.host_of(t.shards[0].rank)
        group, scope = list(topology.host_ranks(host)), f"the {topology.local_world_size} ranks of host {host}"
    spans = row_splits(spec.num_embeddings, len(group))
    expected = None if spans is None else [Shard(r, off, n, 0, spec.embedding_dim) for r, (off, n) in zip(group, spans)]
    got = sorted(t.shards, key=lambda s: s.row_offset)
    if [Shard(s.rank, s.row_offset, s.num_rows, s.col_offset, s.num_cols) for s in got] != expected:
        layout = [(s.rank, s.row_offset, s.num_rows) for s in got]
        raise ValueError(
            f"{where}: TorchRec's {st.value} puts row block i of ceil(rows/{len(group)}) rows on the i-th of {scope}; "
            f"this plan has (rank, row_offset, num_rows) {layout}. To export it, plan this table with a layout TorchRec runs "
            f"(row_wise over all ranks, table_row_wise over a whole host, table_wise or column_wise: "
            f"constraints.tables.{t.name}.sharding_types), or run this plan with embshard's runtime")
    return got


def _check_sequence_layouts(plan: ShardingPlan) -> None:
    """ValueError for sequence-table layouts TorchRec's EmbeddingCollection cannot run."""
    cw_widths: dict[int, str] = {}
    for t in plan.tables:
        if plan.spec(t.name).pooled:
            continue
        where = f"sequence table {t.name!r} ({t.sharding_type.value})"
        if t.sharding_type not in SEQUENCE_SHARDING_TYPES:
            raise ValueError(f"{where}: TorchRec's EmbeddingCollection shards sequence tables only as "
                             f"{[s.value for s in SEQUENCE_SHARDING_TYPES]}; constrain constraints.tables.{t.name}.sharding_types to those")
        if t.sharding_type is ShardingType.DATA_PARALLEL and plan.topology.device == "cpu":
            raise ValueError(f"{where}: TorchRec's EmbeddingCollection cannot run data_parallel (dense kernel) on CPU; "
                             f"use table_wise for it on CPU (constraints.tables.{t.name}.sharding_types)")
        if t.sharding_type is ShardingType.COLUMN_WISE:
            for s in t.shards:
                cw_widths.setdefault(s.num_cols, t.name)
            if len(cw_widths) > 1:
                raise ValueError(f"{where}: TorchRec's EmbeddingCollection needs one column-shard width for all column-wise "
                                 f"sequence shards, got {{width: first table}} {cw_widths}; split those tables "
                                 f"into equal column blocks or use row_wise")


# ---- TorchRec plan -> embshard plan --------------------------------------------------


def from_torchrec_plan(tr_plan: TrShardingPlan, specs: Sequence[TableSpec], topology: Topology) -> ShardingPlan:
    """TorchRec's plan as embshard placements, scored by `embshard.planner.evaluate`.

    Empty row blocks (TorchRec's row_wise of a table with fewer rows than ranks) are dropped;
    column blocks of one table on one rank are merged when adjacent (embshard keeps one shard
    per table and rank).
    """
    by_table: dict[str, ParameterSharding] = {}
    for module_plan in tr_plan.plan.values():
        for name, ps in module_plan.items():
            by_table[name] = ps
    names = {s.name for s in specs}
    missing, extra = sorted(names - set(by_table)), sorted(set(by_table) - names)
    if missing or extra:
        raise ValueError(f"from_torchrec_plan: the TorchRec plan does not cover the specs (missing {missing}, unexpected {extra})")
    placements = [_placement_from_torchrec(s, by_table[s.name], topology) for s in specs]
    return evaluate(specs, topology, placements)


def _placement_from_torchrec(spec: TableSpec, ps: ParameterSharding, topology: Topology) -> TablePlacement:
    where = f"TorchRec plan, table {spec.name!r}"
    st = ShardingType.parse(ps.sharding_type, f"{where}.sharding_type")
    kernels = {v: k for k, v in LOCATION_KERNEL.items()}
    if st is ShardingType.DATA_PARALLEL and ps.compute_kernel != COMPUTE_KERNEL[st] or \
            st is not ShardingType.DATA_PARALLEL and ps.compute_kernel not in kernels:
        raise ValueError(f"{where}: compute kernel {ps.compute_kernel!r}; embshard models {COMPUTE_KERNEL[st]!r} for "
                         f"{st.value}{'' if st is ShardingType.DATA_PARALLEL else ' and ' + ', '.join(list(kernels)[1:])} "
                         f"(tables in host memory); plan TorchRec with compute_kernels among those")
    location = kernels.get(ps.compute_kernel, Location.HBM)
    load_factor = ps.cache_params.load_factor if ps.cache_params is not None else None
    if location is Location.UVM_CACHE and not load_factor:
        raise ValueError(f"{where}: fused_uvm_caching without cache_params.load_factor; give it the cache share")

    def tier(num_rows: int) -> dict:
        rows = cache_rows(num_rows, load_factor) if location is Location.UVM_CACHE else 0
        return {"location": location, "cache_rows": rows}
    if st is ShardingType.DATA_PARALLEL:
        shards = [Shard(r, 0, spec.num_embeddings, 0, spec.embedding_dim) for r in range(topology.world_size)]
        return TablePlacement(spec.name, st, COMPUTE_KERNEL[st], tuple(shards))
    blocks = sorted(
        (Shard(ps.ranks[i], m.shard_offsets[0], m.shard_sizes[0], m.shard_offsets[1], m.shard_sizes[1], **tier(m.shard_sizes[0]))
         for i, m in enumerate(ps.sharding_spec.shards) if m.shard_sizes[0] > 0 and m.shard_sizes[1] > 0),
        key=lambda s: (s.col_offset, s.row_offset))
    merged: list[Shard] = []
    for s in blocks:
        same_rank = [i for i, m in enumerate(merged) if m.rank == s.rank]
        if not same_rank:
            merged.append(s)
            continue
        prev = merged[same_rank[0]]
        if st.splits_cols and prev.col_offset + prev.num_cols == s.col_offset:
            merged[same_rank[0]] = Shard(prev.rank, 0, prev.num_rows, prev.col_offset, prev.num_cols + s.num_cols, **tier(prev.num_rows))
        else:
            raise ValueError(f"{where}: two non-adjacent blocks on rank {s.rank}, which an embshard plan cannot express "
                             f"(one shard per table and rank)")
    return TablePlacement(spec.name, st, COMPUTE_KERNEL[st], tuple(merged))  # embshard names the kernel by type


# ---- TorchRec's cost model on an embshard plan -------------------------------------------


def torchrec_estimate(plan: ShardingPlan) -> list[float]:
    """Per-rank step time (ms) that TorchRec's EmbeddingPerfEstimator predicts for this placement.

    Builds one ShardingOption per table with the plan's shards and ranks, runs TorchRec's
    default estimator (pooling factors and kernels as in `torchrec_constraints`, batch size
    `topology.batch_size_per_rank`) and sums `perf.total` per rank, as TorchRec's NoopPerfModel
    does; its planner minimises the max of this list. The layout must be one TorchRec can run
    (see `to_torchrec_plan`).
    """
    tr_plan = to_torchrec_plan(plan, "ebc", sequence_module_path="ec")
    topology = plan.topology
    bags, sequences = to_embedding_configs(plan.specs)
    modules = {}
    if bags:
        modules["ebc"] = EmbeddingBagCollection(tables=bags, device=torch.device("meta"))
    if sequences:
        modules["ec"] = EmbeddingCollection(tables=sequences, device=torch.device("meta"))
    sharders = {sharder_name(EmbeddingBagCollection): EmbeddingBagCollectionSharder(),
                sharder_name(EmbeddingCollection): EmbeddingCollectionSharder()}
    params = {path: sharders[sharder_name(type(m))].shardable_parameters(m) for path, m in modules.items()}
    options = []
    for spec in plan.specs:
        path = "ebc" if spec.pooled else "ec"
        ps = tr_plan.plan[path][spec.name]
        options.append(ShardingOption(
            name=spec.name, tensor=params[path][spec.name], module=(path, modules[path]),
            input_lengths=[spec.pooling_factor] * spec.num_features, batch_size=topology.batch_size_per_rank,
            sharding_type=ps.sharding_type, partition_by=get_partition_by_type(ps.sharding_type),
            compute_kernel=ps.compute_kernel, shards=_torchrec_option_shards(ps, spec), is_pooled=spec.pooled,
            feature_names=list(spec.feature_names), cache_params=ps.cache_params))
    estimator = EmbeddingPerfEstimator(topology=to_torchrec_topology(topology),
                                       constraints=torchrec_constraints(plan.specs, uvm=topology.host_memory_cap_bytes > 0))
    estimator.estimate(options, sharder_data_map=build_sharder_data_map(sharders))
    per_rank_ms = [0.0] * topology.world_size
    for option in options:
        for shard in option.shards:
            per_rank_ms[shard.rank] += shard.perf.total
    return per_rank_ms


def _torchrec_option_shards(ps: ParameterSharding, spec: TableSpec) -> list[TrShard]:
    if ps.sharding_spec is None:  # data parallel: a full replica per rank
        return [TrShard(size=[spec.num_embeddings, spec.embedding_dim], offset=[0, 0], rank=r) for r in ps.ranks]
    return [TrShard(size=list(m.shard_sizes), offset=list(m.shard_offsets), rank=r)
            for m, r in zip(ps.sharding_spec.shards, ps.ranks)]
