"""Predicted time per shard and phase of one training step, in ms.

Notation: B batch per rank, W ranks, L ranks per host, G = B*W global batch; a table has N
rows, D columns stored in `TableSpec.row_bytes` bytes per row (fp32, fp16, or int8 with its
scale and bias), F features each with P ids per sample (pooling factor), so one step looks
up I = G*P*F ids of it. A shard holds n rows and d columns. Embeddings leave the kernels as
fp32 (OUTPUT_BYTES) whatever the weights' dtype; on the wire they, their gradients and
data-parallel gradients take the plan's `topology.comms` dtypes (`wire_bytes`: fp32, fp16, bf16).

Who pays what:
- The shard's *holder* receives the ids routed to it, runs the lookup forward and backward
  (with the fused optimizer), and sends its outputs (pooled sums, row-wise partial sums,
  or one row per id for sequence tables) back; in backward it receives their gradients.
  Row-wise partial sums are reduced among the k_h row shards of a host first (k_h = k for
  table_row_wise, k spread evenly over the hosts for row_wise), so only 1/k_h of them
  crosses hosts.
- Every rank, as the *requester* of its own B samples, sends its ids to each shard and
  receives its outputs (and sends their gradients): a pooled row_wise table's once per host
  holding its row shards. This does not depend on placement.
- Data-parallel tables cost *every rank* a local lookup, a dense update and a gradient
  all-reduce.

A rank's all-to-all phase takes max(bytes it sends, bytes it receives) / bandwidth on
full-duplex links; `rank_perf` combines holder and requester sides that way (their sum on
half-duplex ones). Traffic between a rank and the other ranks is spread uniformly: (L-1)/W of it stays in
the host (intra-host bandwidth), (W-L)/W crosses hosts (one NIC per rank). Lookups are
memory-bound (`embshard.planner.cost.lookup`): bytes moved / HBM bandwidth, with rows rounded up to 32-byte sectors. Ids are
assumed spread uniformly over rows (a row shard with n of N rows gets n/N of the ids).
Shards kept in host memory (``host``) or cached (``uvm_cache``) move their rows' bytes at
``ddr_gb_per_s`` instead, a cache's misses by the hit rate of its table's ``hot_rows``
curve, with the fetches and evictions stated in embshard.planner.cost.tiers.

Calibrated terms (Topology.CALIBRATED_TERMS, all 0 in the datasheet model; fitted by
embshard-calibrate) add the work a machine was measured to spend beyond moving bytes:
- lookups: per id (forward, backward), per distinct row updated, per byte of each distinct
  row fetched (U = n (1 - exp(-I/n)) distinct rows for I uniform ids), per output byte
  written (and its gradient read), and for sequence lookups an extra cost per distinct row
  in backward; a pooled table looked up by several features is updated on another kernel path
  (FBGEMM's CPU backward takes its rowwise_adagrad fast path only for a table of one feature, a
  generic loop over the row's columns otherwise): its distinct rows cost terms of their own, per row and per byte of
  the row and its optimizer state, instead of lookup_bwd_ns_per_row; data-parallel replicas run another kernel, with terms of their own (per id
  forward; per byte of per-id gradients and per distinct row backward; their dense full-table work at
  ``dp_dense_gb_per_s``, a rate of its own), or, with
  a placement's ``data_parallel_mode`` "replicated_lookup" (the planner picks the cheaper mode per
  table, `cheaper_data_parallel_mode`), cost what a table-wise holder of the global batch costs, on
  every rank (`replicated_lookup_perf`); each mode present adds its group's fixed costs once (`mode_group_perf`;
  `embshard.planner.dp_modes` weighs them at plan level);
- routing, paid by the sender and by the receiver: per id and per bag length in input dist,
  per embedding byte (copy and assembly) in output dist, and for sequence tables an extra
  cost per id in both;
- fixed costs of a rank's step (`fixed_perf`): per collection's input and output dist, per
  lookup kernel call, and collective_ms per collective step and peer rank (plus
  inter_host_collective_ms per step and peer rank on another host);
- the in-host reduction of row-wise partial sums (`host_reduce_work_ms`): per byte of a row shard's partial
  sums, forward and backward apart, and a fixed cost per sub-group all-to-all; fitted on layouts run
  with and without the reduction, so that where it costs more CPU than its inter-host bytes save, the
  model says so (and `embshard.planner.api` keeps collectives flat for that plan);
- per-phase efficiency factors (1 in the datasheet model) scale each phase: the terms above
  come from one kernel or collective at a time, the factors from whole steps on all ranks of one
  host. They leave the time on inter-host links unscaled (`_factored`): inter_host_gb_per_s is the
  wall time of collectives between hosts as measured, not a rank's work.
The bytes these terms price per shard and on average are counted exactly per rank and link
class for a placement in `embshard.planner.cost.traffic` (what the runtime counts; plan.json's
``ranks[i].traffic_bytes``). `rank_perf` combines a rank's holder, requester, every-rank and fixed costs; with
``topology.full_duplex`` false (gloo on CPU) an all-to-all phase costs holder + requester
side instead of their max. `rank_perfs` applies all of it to a placement: it is the one
model behind `embshard.planner.evaluate`, the search's objective and the calibration fit.
"""

from __future__ import annotations

from typing import Sequence

# bytes per element on the wire (fp32 embeddings and gradients, int64 ids and lengths), in one place:
from embshard.comms import WIRE_BYTES  # noqa: F401
from embshard.planner.cost.allreduce import collective_fixed_ms, flat_allreduce_link_ms, flat_allreduce_ms, runtime_allreduce_parts_ms
from embshard.planner.cost.allreduce import hierarchical_allreduce_ms as allreduce_ms  # noqa: F401 (calibrate's fit: bandwidth terms)
from embshard.planner.cost.hot_rows import hot_split
from embshard.planner.cost.lookup import expected_distinct_rows, located_lookup_ms, lookup_ms, lookup_terms, row_bytes
from embshard.planner.cost.traffic import GRAD_BYTES, ID_BYTES, LENGTH_BYTES, OUTPUT_BYTES, wire_bytes  # noqa: F401
from embshard.planner.cost.traffic import allreduce_exchange_floats, allreduce_rows, masked
from embshard.planner.cost.units import bytes_ms, work_ms
from embshard.planner.types import Location, Perf, ShardingType
from embshard.specs import DP_ROW_MASK_BYTES, TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology

_NO_LINK = Perf()


def _factored(p: Perf, topo: Topology, link: Perf = _NO_LINK) -> Perf:
    """Per-phase efficiency factors of a calibrated profile (all 1 in the datasheet model) on ``p``, plus ``link``:
    time on inter-host links, which the factors (a rank's work in whole steps on one host) do not scale --
    inter_host_gb_per_s is fitted as the wall time of collectives between hosts (embshard.calibrate.hosts)."""
    if link is _NO_LINK:
        return Perf(p.input_dist_ms * topo.input_dist_factor, p.lookup_fwd_ms * topo.lookup_fwd_factor,
                    p.output_dist_fwd_ms * topo.output_dist_factor, p.output_dist_bwd_ms * topo.output_dist_factor,
                    p.lookup_bwd_ms * topo.lookup_bwd_factor, p.dp_allreduce_ms * topo.dp_allreduce_factor)
    # the same sums as the factored Perf + link, without building the intermediate Perf (enumeration's hot path)
    return Perf(p.input_dist_ms * topo.input_dist_factor + link.input_dist_ms, p.lookup_fwd_ms * topo.lookup_fwd_factor + link.lookup_fwd_ms,
                p.output_dist_fwd_ms * topo.output_dist_factor + link.output_dist_fwd_ms,
                p.output_dist_bwd_ms * topo.output_dist_factor + link.output_dist_bwd_ms,
                p.lookup_bwd_ms * topo.lookup_bwd_factor + link.lookup_bwd_ms, p.dp_allreduce_ms * topo.dp_allreduce_factor + link.dp_allreduce_ms)


def spread_comm_ms(num_bytes: float, topo: Topology) -> float:
    """Time to move bytes to/from all ranks uniformly (the 1/W to itself is free)."""
    return sum(_spread_ms(num_bytes, topo))


def _spread_ms(num_bytes: float, topo: Topology) -> tuple[float, float]:
    """spread_comm_ms's (intra-host, inter-host) parts."""
    W, L = topo.world_size, topo.local_world_size
    return bytes_ms(num_bytes * (L - 1) / W, topo.intra_host_gb_per_s), bytes_ms(num_bytes * (W - L) / W, topo.inter_host_gb_per_s)


def host_comm_ms(num_bytes: float, num_peers: int, topo: Topology) -> float:
    """Time to exchange bytes with num_peers ranks of the same host ((k-1)/k leaves the rank)."""
    return bytes_ms(num_bytes * (num_peers - 1) / num_peers, topo.intra_host_gb_per_s) if num_peers > 1 else 0.0


def host_reduce_work_ms(out_bytes: float, members: int, direction: str, topo: Topology) -> float:
    """Calibrated CPU work of the in-host reduction (runtime/host_reduce.py) for a row shard of out_bytes fp32
    partial sums among ``members`` row shards of its host (0 in the datasheet model, and for a shard alone on its
    host): the permutation gathers, the sums and their backward, per byte; and the fixed cost of the sub-group
    all-to-all among the host's L ranks (host_reduce_call_ms, collective_ms per peer) -- charged per shard, an upper
    bound where a rank holds several (the runtime issues one per collection and direction)."""
    if members < 2:
        return 0.0
    per_byte = topo.host_reduce_fwd_ns_per_byte if direction == "forward" else topo.host_reduce_bwd_ns_per_byte
    return work_ms(out_bytes, per_byte) + topo.host_reduce_call_ms + topo.collective_ms * (topo.local_world_size - 1)


def _route_ms(spec: TableSpec, topo: Topology, num_ids: float, num_bags: float) -> float:
    """Calibrated routing work for ids and bag lengths (input dist), at one end."""
    extra = 0.0 if spec.pooled else work_ms(num_ids, topo.sequence_dist_ns_per_id)
    return work_ms(num_ids, topo.dist_ns_per_id) + work_ms(num_bags, topo.dist_ns_per_bag) + extra


def _assemble_ms(spec: TableSpec, topo: Topology, out_bytes: float, num_ids: float) -> float:
    """Calibrated local work on embeddings (or their gradients) in output dist, at one end."""
    return work_ms(out_bytes, topo.dist_ns_per_byte) + (0.0 if spec.pooled else work_ms(num_ids, topo.sequence_dist_ns_per_id))


def holder_perf(spec: TableSpec, topo: Topology, stype: ShardingType, num_rows: int, num_cols: int, num_shards: int,
                location: Location = Location.HBM, num_cache_rows: int = 0) -> Perf:
    """Time the rank holding one shard (at `location`, with a cache of num_cache_rows rows) spends on it."""
    assert stype is not ShardingType.DATA_PARALLEL
    G, F = topo.global_batch_size, spec.num_features
    ids, out_rows = _shard_ids(spec, topo, num_rows)
    out_bytes = out_rows * num_cols * OUTPUT_BYTES
    fwd, bwd = lookup_ms(spec, topo, ids, num_rows, num_cols, out_rows, location, num_cache_rows)
    in_bytes = ids * ID_BYTES + G * F * LENGTH_BYTES
    out_ms, out_link_ms = [], []
    for direction in ("forward", "backward"):
        sent = out_rows * num_cols * wire_bytes(topo, direction)
        if stype.splits_rows and spec.pooled and topo.reduces_in_host:
            # partial sums are first reduced among the row shards that share a host (in fp32),
            # then each sends its 1/k_h of the host's sums to the sample owners (on the wire);
            # on one host (or with reduce_in_host off) every row shard sends its own partial sums (runtime/output_dist.py)
            per_host = num_shards if stype is ShardingType.TABLE_ROW_WISE else max(1, num_shards // topo.num_hosts)
            intra, inter = _spread_ms(sent / per_host, topo)
            out_ms.append(host_comm_ms(out_bytes, per_host, topo) + intra + host_reduce_work_ms(out_bytes, per_host, direction, topo))
        else:
            intra, inter = _spread_ms(sent, topo)
            out_ms.append(intra)
        out_link_ms.append(inter)
    assemble_ms = _assemble_ms(spec, topo, out_bytes, ids)
    in_intra, in_inter = _spread_ms(in_bytes, topo)
    return _factored(Perf(
        input_dist_ms=in_intra + _route_ms(spec, topo, ids, G * F),
        lookup_fwd_ms=fwd,
        output_dist_fwd_ms=out_ms[0] + assemble_ms,
        output_dist_bwd_ms=out_ms[1] + assemble_ms,
        lookup_bwd_ms=bwd,
    ), topo, Perf(input_dist_ms=in_inter, output_dist_fwd_ms=out_link_ms[0], output_dist_bwd_ms=out_link_ms[1]))


def _shard_ids(spec: TableSpec, topo: Topology, num_rows: int) -> tuple[float, float]:
    """(ids routed to a shard of num_rows rows: all of them unless rows are split, the rows of its output)."""
    G, F = topo.global_batch_size, spec.num_features
    ids = G * spec.pooling_factor * F * (num_rows / spec.num_embeddings)
    return ids, (G * F if spec.pooled else ids)  # pooled row shards emit a partial sum for every bag


def relocated_perfs(perf: Perf, spec: TableSpec, topo: Topology, num_rows: int, num_cols: int,
                    locations: Sequence[tuple[Location, int]]) -> list[Perf]:
    """`holder_perf` of the same shard at each (location, cache rows) of `locations` from its holder_perf anywhere
    else: only the lookup depends on where the rows live (the same float operations; what the lookup weighs
    wherever they live is computed once)."""
    ids, out_rows = _shard_ids(spec, topo, num_rows)
    terms = lookup_terms(spec, topo, ids, num_rows, num_cols, out_rows)
    out = []
    for location, num_cache_rows in locations:
        fwd, bwd = located_lookup_ms(terms, spec, topo, location, num_cache_rows)
        out.append(Perf(perf.input_dist_ms, fwd * topo.lookup_fwd_factor, perf.output_dist_fwd_ms, perf.output_dist_bwd_ms,
                        bwd * topo.lookup_bwd_factor, perf.dp_allreduce_ms))
    return out


def requester_perf(spec: TableSpec, topo: Topology, stype: ShardingType, num_shards: int) -> Perf:
    """Time each rank spends sending its own samples' ids to the shards and taking outputs back."""
    if stype is ShardingType.DATA_PARALLEL:
        return Perf()
    B, F, D = topo.batch_size_per_rank, spec.num_features, spec.embedding_dim
    ids = B * spec.pooling_factor * F
    copies = num_shards if stype.splits_cols else 1  # column shards each need every id
    length_copies = num_shards if stype.splits_rows or stype.splits_cols else 1
    in_bytes = copies * ids * ID_BYTES + length_copies * B * F * LENGTH_BYTES
    # pooled row-wise: one reduced copy from every host holding row shards (row_wise spreads them over the
    # hosts; table_row_wise keeps them in one); on one host (or flat), one copy from every row shard
    out_copies = 1
    if stype.splits_rows and spec.pooled:
        if not topo.reduces_in_host:
            out_copies = num_shards
        else:
            out_copies = min(num_shards, topo.num_hosts) if stype is ShardingType.ROW_WISE else 1
    out_elements = out_copies * (B * F if spec.pooled else ids) * D
    assemble_ms = _assemble_ms(spec, topo, out_elements * OUTPUT_BYTES, ids)
    (fwd_intra, fwd_inter), (bwd_intra, bwd_inter), (in_intra, in_inter) = (
        _spread_ms(out_elements * wire_bytes(topo, "forward"), topo), _spread_ms(out_elements * wire_bytes(topo, "backward"), topo),
        _spread_ms(in_bytes, topo))
    input_ms = in_intra + _route_ms(spec, topo, copies * ids, length_copies * B * F)
    return _factored(Perf(input_dist_ms=input_ms, output_dist_fwd_ms=fwd_intra + assemble_ms, output_dist_bwd_ms=bwd_intra + assemble_ms),
                     topo, Perf(input_dist_ms=in_inter, output_dist_fwd_ms=fwd_inter, output_dist_bwd_ms=bwd_inter))


def data_parallel_perf(spec: TableSpec, topo: Topology, inference: bool = False, mode: str | None = None) -> Perf:
    """Time every rank spends on a replicated table trained in ``mode`` (None: the topology's,
    `Topology.data_parallel_mode`): "allreduce" (`allreduce_perf`) or "replicated_lookup"
    (`replicated_lookup_perf`) -- in training only: serving collections always look replicas up locally."""
    if (mode or topo.data_parallel_mode) == "replicated_lookup" and not inference:
        return replicated_lookup_perf(spec, topo)
    return allreduce_perf(spec, topo, inference)


def cheaper_data_parallel_mode(spec: TableSpec, topo: Topology, inference: bool = False, with_perf: bool = False):
    """The data-parallel mode of lower predicted step time for this table (ties: "allreduce");
    with ``with_perf``, (mode, its Perf). Serving looks replicas up locally in either mode: "allreduce" there."""
    modes = DATA_PARALLEL_MODES[:1] if inference else DATA_PARALLEL_MODES
    perfs = [data_parallel_perf(spec, topo, inference, m) for m in modes]
    best = min(range(len(modes)), key=lambda i: perfs[i].total_ms)
    return (modes[best], perfs[best]) if with_perf else modes[best]


def allreduce_perf(spec: TableSpec, topo: Topology, inference: bool = False) -> Perf:
    """A replicated table looked up locally, its dense gradient all-reduced (the runtime's "allreduce" mode,
    embshard.runtime.dense_replicas; across hosts only the rows looked up anywhere, after a mask of those rows:
    `allreduce_rows`). The runtime all-reduces the mode's tables of a collection
    in one buffer: a table pays its bytes, the call's fixed cost is the mode group's (`mode_group_perf`)."""
    B, F, N, D = topo.batch_size_per_rank, spec.num_features, spec.num_embeddings, spec.embedding_dim
    ids = B * spec.pooling_factor * F
    out_rows = B * F if spec.pooled else ids
    rb = row_bytes(spec, D)
    fwd = bytes_ms(ids * (ID_BYTES + rb) + out_rows * D * OUTPUT_BYTES, topo.hbm_gb_per_s)
    grad_bytes = N * D * GRAD_BYTES
    # dense backward: zero + scatter-add the full gradient, then update the rows some rank looked up and their state
    # (`allreduce_rows`; fewer than all: their gradient first gathered into the exchange's buffer; sharded updates: 1/W
    # of the rows, whose gradient is first copied into the reduce-scatter's buffer): streaming work at
    # dp_dense_gb_per_s, beside the per-id gradient at the lookups' bandwidth
    W = topo.world_size if topo.sharded_dp_update else 1
    updated = allreduce_rows(spec, topo)
    gathered = (W > 1 or updated < N) * updated * D * GRAD_BYTES
    dense_bytes = 2 * grad_bytes + gathered + updated / W * 2 * (rb + spec.optimizer_state_bytes_per_row(D))
    # calibrated: the replica kernel's work, local routing and assembly, one collective
    out_bytes = out_rows * D * OUTPUT_BYTES
    fwd += work_ms(ids, topo.dp_fwd_ns_per_id)
    bwd = (bytes_ms(out_bytes + ids * rb, topo.hbm_gb_per_s) + bytes_ms(dense_bytes, topo.dp_dense_gb_per_s)
           + work_ms(ids * D * GRAD_BYTES, topo.dp_bwd_ns_per_id_byte)
           + work_ms(expected_distinct_rows(ids, N), topo.dp_bwd_ns_per_row))
    exchange_ms, link_ms = _dp_exchange_ms(allreduce_exchange_floats(spec, topo), topo)
    if masked(spec, topo):  # the mask of the rows looked up: its bytes and (per such table: a collection with several
        # runs one mask, so this overprices it by their number less one) its call
        mask_ms, mask_link_ms = runtime_allreduce_parts_ms(N * DP_ROW_MASK_BYTES, topo)
        exchange_ms, link_ms = exchange_ms + mask_ms, link_ms + mask_link_ms
    return _factored(Perf(
        input_dist_ms=_route_ms(spec, topo, ids, B * F),
        lookup_fwd_ms=fwd,
        output_dist_fwd_ms=_assemble_ms(spec, topo, out_bytes, ids),
        output_dist_bwd_ms=_assemble_ms(spec, topo, out_bytes, ids),
        lookup_bwd_ms=bwd,
        dp_allreduce_ms=exchange_ms - link_ms - _dp_exchange_ms(0, topo)[0],
    ), topo, Perf(dp_allreduce_ms=link_ms))


def _dp_exchange_ms(num_floats: int, topo: Topology) -> tuple[float, float]:
    """(time, of it on inter-host links) of the exchange of an all-reduce buffer of num_floats as the runtime runs
    it: the all-reduce in its wire dtype (hierarchical where it pays, `embshard.planner.cost.allreduce`), or with
    sharded updates a reduce-scatter on the wire and an all-gather in fp32 over all ranks, each half of a ring
    all-reduce's traffic. The link time is apart because the per-phase factors do not scale it (`_factored`)."""
    wire = wire_bytes(topo, "dp_allreduce")
    if topo.sharded_dp_update:
        num_bytes = num_floats * (wire + GRAD_BYTES) / 2
        return flat_allreduce_ms(num_bytes, topo) + collective_fixed_ms(topo, 2), flat_allreduce_link_ms(num_bytes, topo)
    return runtime_allreduce_parts_ms(num_floats * wire, topo)


def replicated_lookup_perf(spec: TableSpec, topo: Topology) -> Perf:
    """A data-parallel table looked up for the global batch on every replica (the runtime's
    "replicated_lookup" mode).

    Each rank sends its ids to every replica and receives everyone's; looks up and updates
    (fused) all G bags like a table-wise holder; keeps its own rows (no output all-to-all);
    in backward sends its own output gradients to every other replica and receives every rank's,
    as a holder receives its outputs' (embshard.planner.cost.traffic counts the same bytes).
    """
    B, F, D = topo.batch_size_per_rank, spec.num_features, spec.embedding_dim
    W = topo.world_size
    held = holder_perf(spec, topo, ShardingType.TABLE_WISE, spec.num_embeddings, D, 1)  # factors applied
    ids = B * spec.pooling_factor * F
    own_rows = B * F if spec.pooled else ids
    send_intra, send_inter = _spread_ms(W * (ids * ID_BYTES + B * F * LENGTH_BYTES), topo)
    grad_intra, grad_inter = _spread_ms(W * own_rows * D * wire_bytes(topo, "backward"), topo)
    extra = _factored(Perf(input_dist_ms=send_intra + _route_ms(spec, topo, W * ids, W * B * F),
                           output_dist_fwd_ms=_assemble_ms(spec, topo, own_rows * D * OUTPUT_BYTES, ids),
                           output_dist_bwd_ms=grad_intra), topo, Perf(input_dist_ms=send_inter, output_dist_bwd_ms=grad_inter))
    return Perf(input_dist_ms=held.input_dist_ms + extra.input_dist_ms, lookup_fwd_ms=held.lookup_fwd_ms,
                output_dist_fwd_ms=extra.output_dist_fwd_ms, output_dist_bwd_ms=held.output_dist_bwd_ms + extra.output_dist_bwd_ms,
                lookup_bwd_ms=held.lookup_bwd_ms)


def kernel_group(spec: TableSpec, stype: ShardingType, num_cols: int, mode: str = "") -> tuple:
    """The lookup kernel a block of ``spec`` runs in, as the runtime groups them (embshard.runtime.routing):
    pooled blocks by optimizer, sequence blocks by (optimizer, width); data-parallel replicas (on every
    rank) likewise, apart per data-parallel ``mode`` (each mode group has kernels of its own)."""
    width = 0 if spec.pooled else num_cols
    if stype is ShardingType.DATA_PARALLEL:
        return ("dp", mode, spec.pooled, spec.optimizer, width)
    return ("sharded", spec.pooled, spec.optimizer, width)


def dp_mode_of(t) -> str | None:
    """The data-parallel mode group a placement (TablePlacement-like) runs a replica in: its mode, "allreduce"
    for hot rows' replicas, None for none."""
    if t.sharding_type is ShardingType.DATA_PARALLEL:
        return t.data_parallel_mode or "allreduce"
    return "allreduce" if getattr(t, "hot_rows", 0) else None


def mode_group_perf(topo: Topology, mode: str, inference: bool = False) -> Perf:
    """What a collection pays once per data-parallel mode group present (embshard.runtime.collection, beside
    each table's share and each kernel's call): "allreduce", the fixed cost of its one all-reduce (or
    reduce-scatter and all-gather) of the group's buffer (the mask's across hosts: `allreduce_perf`); "replicated_lookup", the fixed cost of its own input
    dist (three collectives: batch sizes, lengths, ids). Serving looks replicas up locally: nothing."""
    if inference:
        return Perf()
    if mode == "allreduce":
        return _factored(Perf(dp_allreduce_ms=_dp_exchange_ms(0, topo)[0]), topo)
    return _factored(Perf(input_dist_ms=topo.input_dist_call_ms + 3 * collective_fixed_ms(topo)), topo)


def kernel_calls_per_rank(specs: Sequence[TableSpec], placements: Sequence, world_size: int) -> list[int]:
    """Lookup kernels each rank runs per step (placements: TablePlacement-like)."""
    by_name = {s.name: s for s in specs}
    every, held = set(), [set() for _ in range(world_size)]
    for t in placements:
        spec = by_name[t.name]
        if dp_mode_of(t):  # hot rows: a replica kernel too
            every.add(kernel_group(spec, ShardingType.DATA_PARALLEL, spec.embedding_dim, dp_mode_of(t)))
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            continue
        for s in t.shards:
            held[s.rank].add(kernel_group(spec, t.sharding_type, s.num_cols))
    return [len(every) + len(h) for h in held]


def num_collections(specs: Sequence[TableSpec]) -> int:
    """Sharded collections a step runs: one for pooled tables, one for sequence tables."""
    return len({s.pooled for s in specs})


def kernel_call_ms(topo: Topology) -> float:
    """Fixed cost of one more lookup kernel on a rank (forward and backward; 0 in the datasheet model)."""
    return fixed_perf(topo, 0, 1).total_ms


def fixed_perf(topo: Topology, num_collections: int, num_kernel_calls: int) -> Perf:
    """A rank's fixed cost per step (calibrated; zero in the datasheet model).

    num_collections: sharded collections the step runs (pooled and/or sequence), each with
    its input dist (three collectives: batch sizes, lengths, ids) and one all-to-all in each
    output dist direction; num_kernel_calls: lookup kernels the rank runs.
    """
    c = collective_fixed_ms(topo)
    k = num_kernel_calls
    return _factored(Perf(input_dist_ms=(topo.input_dist_call_ms + 3 * c) * num_collections,
                          lookup_fwd_ms=topo.lookup_fwd_call_ms * k,
                          output_dist_fwd_ms=(topo.output_dist_call_ms + c) * num_collections,
                          output_dist_bwd_ms=(topo.output_dist_call_ms + c) * num_collections,
                          lookup_bwd_ms=topo.lookup_bwd_call_ms * k), topo)


def rank_perf(held: Perf, requester: Perf, every: Perf, fixed: Perf, topo: Topology) -> Perf:
    """A rank's time by phase: the shards it holds, its requester side, every-rank (data-parallel)
    and fixed costs. An all-to-all phase takes max(holder, requester) on full-duplex links and
    their sum otherwise (``topology.full_duplex``)."""
    both = max if topo.full_duplex else (lambda a, b: a + b)
    return Perf(
        input_dist_ms=both(held.input_dist_ms, requester.input_dist_ms) + every.input_dist_ms + fixed.input_dist_ms,
        lookup_fwd_ms=held.lookup_fwd_ms + every.lookup_fwd_ms + fixed.lookup_fwd_ms,
        output_dist_fwd_ms=both(held.output_dist_fwd_ms, requester.output_dist_fwd_ms) + every.output_dist_fwd_ms + fixed.output_dist_fwd_ms,
        output_dist_bwd_ms=both(held.output_dist_bwd_ms, requester.output_dist_bwd_ms) + every.output_dist_bwd_ms + fixed.output_dist_bwd_ms,
        lookup_bwd_ms=held.lookup_bwd_ms + every.lookup_bwd_ms + fixed.lookup_bwd_ms,
        dp_allreduce_ms=held.dp_allreduce_ms + every.dp_allreduce_ms + fixed.dp_allreduce_ms,
    )


def rank_perfs(specs: Sequence[TableSpec], topo: Topology, placements: Sequence, inference: bool = False) -> list[Perf]:
    """Every rank's predicted Perf (index = rank) for placements (TablePlacement-like): the one
    cost model that `embshard.planner.evaluate` reports, the search minimises (its flattened
    form, embshard.planner.search.problem) and the calibration fits."""
    by_name = {s.name: s for s in specs}
    W = topo.world_size
    held, requester, every = [Perf()] * W, Perf(), Perf()
    for t in placements:
        spec = by_name[t.name]
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            every = every + data_parallel_perf(spec, topo, inference, t.data_parallel_mode)
            continue
        if getattr(t, "hot_rows", 0):  # the cold part as sharded, the hot rows' replica on every rank
            spec, hot = hot_split(spec, t.hot_rows)
            every = every + data_parallel_perf(hot, topo, inference, "allreduce")  # hot replicas train by all-reduce
        k = len(t.shards)
        requester = requester + requester_perf(spec, topo, t.sharding_type, k)
        for s in t.shards:
            held[s.rank] = held[s.rank] + holder_perf(spec, topo, t.sharding_type, s.num_rows, s.num_cols, k,
                                                      s.location, s.cache_rows)
    for mode in {dp_mode_of(t) for t in placements} - {None}:
        every = every + mode_group_perf(topo, mode, inference)
    collections = num_collections(specs)
    return [rank_perf(held[r], requester, every, fixed_perf(topo, collections, calls), topo)
            for r, calls in enumerate(kernel_calls_per_rank(specs, placements, W))]
