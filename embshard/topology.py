"""Cluster topology: ranks, hosts, memory per rank and bandwidths (with units).

Bandwidths are in GB/s (10^9 bytes per second), named ``*_gb_per_s``. Defaults describe an
8-GPU H100/H200-class host: effective HBM bandwidth for random row gathers, NVLink between
ranks of a host, and one 400 Gb/s NIC per rank across hosts. ``device: cpu`` defaults
describe gloo over loopback/TCP on host memory.

Calibrated terms (`CALIBRATED_TERMS`) refine that bandwidth model with what a machine was
measured to cost per unit of work: fixed costs per collective and per lookup call, per-id
and per-row lookup work, per-id/bag/byte routing work, and whether a rank's all-to-all
send and receive overlap (``full_duplex``). They default to 0 (factors to 1), which
is the datasheet model; ``embshard-calibrate`` fits them and writes a profile
(configs/topology/<profile>.yaml). embshard.planner.cost.perf documents where each applies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from embshard.comms import CommsPrecision

GIB = 1024**3

# How data-parallel tables train (embshard.runtime.collection): each rank looks up its own samples and the
# replicas' weight gradients are all-reduced; or every replica looks up the global batch.
DATA_PARALLEL_MODES = ("allreduce", "replicated_lookup")

# Calibrated cost terms: per-unit costs added to the bandwidth model (0 = not modelled).
CALIBRATED_TERMS = (
    "collective_ms",            # fixed cost of a collective per peer rank (latency; an all-reduce has two steps per peer)
    "inter_host_collective_ms", # extra fixed cost per peer rank on another host (inter-host latency = collective_ms + this)
    "input_dist_call_ms",       # fixed cost of one collection's input dist (validation, headers, bookkeeping)
    "output_dist_call_ms",      # fixed cost of one collection's output dist, forward and backward each
    "lookup_fwd_call_ms",       # fixed cost of one lookup kernel call, forward
    "lookup_bwd_call_ms",       # fixed cost of one lookup kernel call, backward (with the optimizer)
    "lookup_fwd_ns_per_id",     # forward work per id looked up (decode, accumulate)
    "lookup_bwd_ns_per_id",     # backward work per id (sort, gradient accumulation)
    "lookup_bwd_ns_per_row",    # optimizer update per distinct row touched
    "lookup_bwd_shared_ns_per_row",       # the same for a pooled table looked up by several features (its own kernel path)
    "lookup_bwd_shared_ns_per_row_byte",  # and per byte of such a row and its optimizer state
    "lookup_ns_per_row_byte",   # fetching a distinct row's bytes (cache misses), forward and backward
    "lookup_ns_per_out_byte",   # writing outputs (forward) and reading their gradients (backward)
    "sequence_bwd_ns_per_row",  # extra backward work per distinct row of sequence (unpooled) lookups
    "dist_ns_per_id",           # routing work per id (validate, bucketize, permute), sender and receiver
    "dist_ns_per_bag",          # routing work per bag length, sender and receiver
    "dist_ns_per_byte",         # local copy and assembly of embeddings / their gradients in output dist
    "sequence_dist_ns_per_id",  # extra input- and output-dist work per id of sequence tables (positions, placing rows)
    "dp_fwd_ns_per_id",         # data-parallel replica lookup: forward work per id
    "dp_bwd_ns_per_id_byte",    # replica backward: per byte of the per-id gradient rows
    "dp_bwd_ns_per_row",        # replica backward: per distinct row (deduplicate, exchange, update)
    "host_reduce_fwd_ns_per_byte",  # in-host reduction, forward: per byte of a row shard's partial sums (permutation gathers, sums)
    "host_reduce_bwd_ns_per_byte",  # in-host reduction, backward: per byte of their gradients (the same gathers, fanned out)
    "host_reduce_call_ms",      # fixed cost of the in-host reduction's sub-group all-to-all, forward and backward each
    "dp_hier_ns_per_byte",      # hierarchical all-reduce of data-parallel gradients: its own CPU work per byte of the buffer
    "dp_hier_call_ms",          # hierarchical all-reduce: fixed cost per call beyond collective_ms per peer
)
# The in-host reduction's terms (plan schema 10), fitted on layouts run with and without it (embshard.calibrate.fit).
HOST_REDUCE_TERMS = ("host_reduce_fwd_ns_per_byte", "host_reduce_bwd_ns_per_byte", "host_reduce_call_ms")
# A pooled table that several features look up is updated by FBGEMM's generic CPU backward loop, not by the
# fast path it takes for a table of one feature (plan schema 13): files without these terms priced its rows alike
# (`Topology.from_dict` reads them as lookup_bwd_ns_per_row and 0).
SHARED_TABLE_TERMS = ("lookup_bwd_shared_ns_per_row", "lookup_bwd_shared_ns_per_row_byte")
# The hierarchical all-reduce's terms (plan schema 11), fitted on data-parallel layouts run hierarchically and flat.
DP_HIER_TERMS = ("dp_hier_ns_per_byte", "dp_hier_call_ms")
# Per-phase efficiency factors (1 = off): what a phase costs when ranks run a whole step
# together, relative to the terms above measured one kernel or collective at a time.
PHASE_FACTORS = ("input_dist_factor", "lookup_fwd_factor", "output_dist_factor", "lookup_bwd_factor", "dp_allreduce_factor")

# Defaults by device. Effective numbers, not datasheet peaks: a row gather reaches well
# under peak HBM bandwidth, and all-to-all reaches well under NVLink/IB line rate.
DEVICE_DEFAULTS: dict[str, dict[str, float]] = {
    "cuda": {"hbm_gb_per_s": 1500.0, "intra_host_gb_per_s": 150.0, "inter_host_gb_per_s": 25.0, "ddr_gb_per_s": 25.0,
             "dp_dense_gb_per_s": 1500.0},
    "cpu": {"hbm_gb_per_s": 10.0, "intra_host_gb_per_s": 2.0, "inter_host_gb_per_s": 1.0, "ddr_gb_per_s": 10.0,
            "dp_dense_gb_per_s": 3.0},
}


@dataclass(frozen=True)
class Topology:
    """What the planner needs to know about the cluster.

    world_size: number of ranks; local_world_size: ranks per host (world_size must be a
    multiple). hbm_gib: memory per rank in GiB (host memory for device=cpu).
    ddr_gib: host memory per rank that tables may use beyond HBM (0 = none: every shard in
    HBM); with it the planner may keep a shard in host memory (``host``) or there with an
    HBM cache of its hottest rows (``uvm_cache``); ddr_gb_per_s: the bandwidth between HBM
    and that host memory (PCIe / C2C; on CPU the same memory).
    reserved_fraction: share of each rank's memory kept for dense parameters, their
    optimizer state and activations; embedding shards may use the rest.
    batch_size_per_rank: training samples per rank per step.
    Bandwidths left at 0 take the device's defaults (see DEVICE_DEFAULTS).
    dp_dense_gb_per_s: the rate of the dense full-table work of data-parallel tables trained by all-reduce
    (zero and scatter-add the whole gradient, copy it into the all-reduce's buffer, update every row and its
    state; `embshard.planner.cost.perf.allreduce_perf`): streaming torch ops over the whole table, which on
    a CPU run far below a lookup kernel's rate (hbm_gb_per_s); fitted by embshard-calibrate on allreduce-mode
    replica kernels; plan schema 11, absent at the device default.
    full_duplex: a rank's all-to-all sends and receives at once (max of the two; GPUs over
    NVLink/IB); False: one after the other (their sum; gloo on CPU, where one core copies
    both ways). replicated_dp_lookup: data-parallel tables are looked up for the global batch
    on every replica, which receives every rank's ids and, in backward, every rank's pooled
    gradients; False: each rank looks up its own samples and the gradient of the whole
    table is all-reduced (TorchRec's DDP). embshard's runtime trains a plan's data-parallel
    tables in the mode each placement records (the planner picks the cheaper per table,
    `embshard.planner.cost.perf.cheaper_data_parallel_mode`); this flag is the mode of placements that
    record none (plans of schema version 2 and older, hand-built placements).
    sharded_dp_update: data-parallel tables trained by all-reduce shard their weight update across the
    ranks (reduce-scatter of the gradients, each rank updates 1/W of the rows and keeps only their
    optimizer state, all-gather of the rows; embshard.runtime.dense_replicas): the memory model counts
    their optimizer state / W. Set by training's ``optim.sharded_update``; plan schema 9, absent when false.
    comms: the dtypes of embeddings, their gradients and data-parallel gradients on the wire
    (embshard.comms; set by ``planner.comms``, priced and run as the plan records it).
    reduce_in_host: when ranks span hosts, pooled row-wise partial sums are summed among each
    host's row shards before they cross hosts (embshard.runtime.host_reduce) and data-parallel
    gradients are all-reduced hierarchically where the cost model says it pays
    (`embshard.planner.cost.perf.hierarchical_allreduce`); False: flat collectives over all ranks
    (every row shard's partial sums to the sample owners, one ring all-reduce), priced and counted
    as such, to compare against. The remaining
    fields are calibrated terms (CALIBRATED_TERMS, 0 = off) and per-phase factors (PHASE_FACTORS, 1 = off).
    """

    world_size: int
    local_world_size: int = 8
    hbm_gib: float = 80.0
    batch_size_per_rank: int = 512
    device: str = "cuda"
    reserved_fraction: float = 0.1
    hbm_gb_per_s: float = 0.0
    intra_host_gb_per_s: float = 0.0
    inter_host_gb_per_s: float = 0.0
    ddr_gib: float = 0.0
    ddr_gb_per_s: float = 0.0
    dp_dense_gb_per_s: float = 0.0
    full_duplex: bool = True
    replicated_dp_lookup: bool = False
    sharded_dp_update: bool = False
    comms: CommsPrecision = CommsPrecision()
    reduce_in_host: bool = True
    collective_ms: float = 0.0
    inter_host_collective_ms: float = 0.0
    input_dist_call_ms: float = 0.0
    output_dist_call_ms: float = 0.0
    lookup_fwd_call_ms: float = 0.0
    lookup_bwd_call_ms: float = 0.0
    lookup_fwd_ns_per_id: float = 0.0
    lookup_bwd_ns_per_id: float = 0.0
    lookup_bwd_ns_per_row: float = 0.0
    lookup_bwd_shared_ns_per_row: float = 0.0
    lookup_bwd_shared_ns_per_row_byte: float = 0.0
    lookup_ns_per_row_byte: float = 0.0
    lookup_ns_per_out_byte: float = 0.0
    sequence_bwd_ns_per_row: float = 0.0
    dist_ns_per_id: float = 0.0
    dist_ns_per_bag: float = 0.0
    dist_ns_per_byte: float = 0.0
    sequence_dist_ns_per_id: float = 0.0
    dp_fwd_ns_per_id: float = 0.0
    dp_bwd_ns_per_id_byte: float = 0.0
    dp_bwd_ns_per_row: float = 0.0
    host_reduce_fwd_ns_per_byte: float = 0.0
    host_reduce_bwd_ns_per_byte: float = 0.0
    host_reduce_call_ms: float = 0.0
    dp_hier_ns_per_byte: float = 0.0
    dp_hier_call_ms: float = 0.0
    input_dist_factor: float = 1.0
    lookup_fwd_factor: float = 1.0
    output_dist_factor: float = 1.0
    lookup_bwd_factor: float = 1.0
    dp_allreduce_factor: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.comms, CommsPrecision):  # a mapping, as to_dict() writes it
            object.__setattr__(self, "comms", CommsPrecision.from_dict(self.comms, "topology.comms"))
        for key in ("hbm_gib", "reserved_fraction", "hbm_gb_per_s", "intra_host_gb_per_s", "inter_host_gb_per_s",
                    "ddr_gib", "ddr_gb_per_s", "dp_dense_gb_per_s", *CALIBRATED_TERMS, *PHASE_FACTORS):
            object.__setattr__(self, key, float(getattr(self, key)))
        for key, value in DEVICE_DEFAULTS.get(self.device, {}).items():
            if getattr(self, key) == 0.0:
                object.__setattr__(self, key, value)

    @property
    def data_parallel_mode(self) -> str:
        """How the runtime trains data-parallel tables whose placement records no mode."""
        return "replicated_lookup" if self.replicated_dp_lookup else "allreduce"

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def reduces_in_host(self) -> bool:
        """Whether collectives run inside each host first: ranks on two or more hosts and ``reduce_in_host`` on
        (the runtime's in-host reduction and the cost and byte models that price it all ask this)."""
        return self.reduce_in_host and self.num_hosts > 1

    def host_of(self, rank: int) -> int:
        return rank // self.local_world_size

    def host_ranks(self, host: int) -> range:
        return range(host * self.local_world_size, (host + 1) * self.local_world_size)

    @property
    def rank_memory_bytes(self) -> int:
        return int(self.hbm_gib * GIB)

    @property
    def reserved_bytes(self) -> int:
        return int(self.rank_memory_bytes * self.reserved_fraction)

    @property
    def shard_memory_cap_bytes(self) -> int:
        """Bytes per rank available to embedding shards and their buffers."""
        return self.rank_memory_bytes - self.reserved_bytes

    @property
    def host_memory_cap_bytes(self) -> int:
        """Bytes of host memory per rank available to tables (shards kept in host memory)."""
        return int(self.ddr_gib * GIB)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size_per_rank * self.world_size

    def to_dict(self) -> dict[str, Any]:
        """All fields, but those added since plan schema 2 only where they are in use (``comms`` not all fp32,
        host memory for tables, an inter-host latency, the in-host reduction's and the hierarchical all-reduce's terms, flat collectives, a dense data-parallel rate other than the device default,
        shared tables' backward terms other than what `from_dict` reads without them), so topologies without them hash and serialise as before."""
        out = asdict(self)
        if self.comms == CommsPrecision():
            del out["comms"]
        if self.ddr_gib == 0.0:
            del out["ddr_gib"], out["ddr_gb_per_s"]  # no host tier: its bandwidth (a device default) is unused
        if self.dp_dense_gb_per_s == DEVICE_DEFAULTS.get(self.device, {}).get("dp_dense_gb_per_s"):
            del out["dp_dense_gb_per_s"]
        for key in ("inter_host_collective_ms", *HOST_REDUCE_TERMS, *DP_HIER_TERMS):
            if out[key] == 0.0:
                del out[key]
        if (self.lookup_bwd_shared_ns_per_row, self.lookup_bwd_shared_ns_per_row_byte) == (self.lookup_bwd_ns_per_row, 0.0):
            del out["lookup_bwd_shared_ns_per_row"], out["lookup_bwd_shared_ns_per_row_byte"]  # as files before them read
        if self.reduce_in_host:
            del out["reduce_in_host"]
        if not self.sharded_dp_update:
            del out["sharded_dp_update"]
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "topology") -> "Topology":
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; allowed keys are {sorted(known)}")
        if "world_size" not in raw:
            raise ValueError(f"{where}.world_size: missing; set the number of ranks, e.g. topology.world_size=8")
        ints = ("world_size", "local_world_size", "batch_size_per_rank")
        for key in ints:
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                    raise ValueError(f"{where}.{key}: must be a positive integer, got {v!r}")
        for key in ("hbm_gib", "hbm_gb_per_s", "intra_host_gb_per_s", "inter_host_gb_per_s", "ddr_gib", "ddr_gb_per_s",
                    "dp_dense_gb_per_s"):
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (key == "hbm_gib" and v == 0):
                    raise ValueError(f"{where}.{key}: must be a {'positive number' if key == 'hbm_gib' else 'number >= 0'}"
                                     f"{' (0 = no host memory for tables)' if key == 'ddr_gib' else ''}, got {v!r}")
        for key in CALIBRATED_TERMS:
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise ValueError(f"{where}.{key}: must be a number >= 0 (0 = not modelled), got {v!r}")
        for key in PHASE_FACTORS:
            if key in raw:
                v = raw[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                    raise ValueError(f"{where}.{key}: must be a positive factor (1 = as measured alone), got {v!r}")
        for key in ("full_duplex", "replicated_dp_lookup", "sharded_dp_update", "reduce_in_host"):
            if key in raw and not isinstance(raw[key], bool):
                raise ValueError(f"{where}.{key}: must be true or false, got {raw[key]!r}")
        frac = raw.get("reserved_fraction", 0.1)
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac < 1:
            raise ValueError(f"{where}.reserved_fraction: must be in [0, 1), got {frac!r}")
        device = raw.get("device", "cuda")
        if device not in DEVICE_DEFAULTS:
            raise ValueError(f"{where}.device: must be one of {sorted(DEVICE_DEFAULTS)}, got {device!r}")
        world, local = raw["world_size"], raw.get("local_world_size", min(8, raw["world_size"]))
        if world % local:
            raise ValueError(
                f"{where}.world_size: {world} is not a multiple of local_world_size {local}; "
                f"use a whole number of hosts, e.g. world_size={max(local, world - world % local)}"
            )
        comms = CommsPrecision.from_dict(raw.get("comms", {}), f"{where}.comms")
        shared = {"lookup_bwd_shared_ns_per_row": raw.get("lookup_bwd_ns_per_row", 0.0), "lookup_bwd_shared_ns_per_row_byte": 0.0}
        return cls(**{**shared, **raw, "local_world_size": local, "comms": comms})
