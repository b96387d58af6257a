"""Predicted time per shard and phase of one training step, in ms.

Notation: B batch per rank, W ranks, L ranks per host, G = B*W global batch; a table has N
rows, D columns, e bytes per element, F features each with P ids per sample (pooling
factor), so one step looks up I = G*P*F ids of it. A shard holds n rows and d columns.

Who pays what:
- The shard's *holder* receives the ids routed to it, runs the lookup forward and backward
  (with the fused optimizer), and sends its outputs (pooled sums, row-wise partial sums,
  or one row per id for sequence tables) back; in backward it receives their gradients.
  Row-wise partial sums are reduced among the k_h row shards of a host first (k_h = k for
  table_row_wise, k spread evenly over the hosts for row_wise), so only 1/k_h of them
  crosses hosts.
- Every rank, as the *requester* of its own B samples, sends its ids to each shard and
  receives its outputs (and sends their gradients). This does not depend on placement.
- Data-parallel tables cost *every rank* a local lookup, a dense update and a gradient
  all-reduce.

A rank's all-to-all phase takes max(bytes it sends, bytes it receives) / bandwidth, since
links are full duplex; `rank_perf` in the search combines holder and requester sides that
way. Traffic between a rank and the other ranks is spread uniformly: (L-1)/W of it stays in
the host (intra-host bandwidth), (W-L)/W crosses hosts (one NIC per rank). Lookups are
memory-bound: bytes moved / HBM bandwidth, with rows rounded up to 32-byte sectors. Ids are
assumed spread uniformly over rows (a row shard with n of N rows gets n/N of the ids).
"""

from __future__ import annotations

import math

from embshard.planner.types import Perf, ShardingType
from embshard.specs import TableSpec
from embshard.topology import Topology

ID_BYTES = 8
LENGTH_BYTES = 4
SECTOR_BYTES = 32
GRAD_BYTES = 4  # dense gradients and optimizer state are fp32


def _ms(num_bytes: float, gb_per_s: float) -> float:
    return num_bytes / (gb_per_s * 1e6)


def row_bytes(num_cols: int, element_bytes: int) -> int:
    return math.ceil(num_cols * element_bytes / SECTOR_BYTES) * SECTOR_BYTES


def spread_comm_ms(num_bytes: float, topo: Topology) -> float:
    """Time to move bytes to/from all ranks uniformly (the 1/W to itself is free)."""
    W, L = topo.world_size, topo.local_world_size
    return _ms(num_bytes * (L - 1) / W, topo.intra_host_gb_per_s) + _ms(num_bytes * (W - L) / W, topo.inter_host_gb_per_s)


def host_comm_ms(num_bytes: float, num_peers: int, topo: Topology) -> float:
    """Time to exchange bytes with num_peers ranks of the same host ((k-1)/k leaves the rank)."""
    return _ms(num_bytes * (num_peers - 1) / num_peers, topo.intra_host_gb_per_s) if num_peers > 1 else 0.0


def allreduce_ms(num_bytes: float, topo: Topology) -> float:
    """Hierarchical ring all-reduce: reduce-scatter/all-gather in the host, ring across hosts."""
    L, H = topo.local_world_size, topo.num_hosts
    intra = _ms(2 * num_bytes * (L - 1) / L, topo.intra_host_gb_per_s)
    inter = _ms(2 * num_bytes * (H - 1) / H / L, topo.inter_host_gb_per_s)
    return intra + inter


def _lookup_ms(spec: TableSpec, topo: Topology, num_ids: float, num_rows: int, num_cols: int, out_rows: float) -> tuple[float, float]:
    """(forward, backward) ms of a fused TBE lookup of num_ids ids into an n x d shard."""
    e = spec.element_bytes
    rb = row_bytes(num_cols, e)
    out_bytes = out_rows * num_cols * e
    fwd = _ms(num_ids * (ID_BYTES + rb) + out_bytes, topo.hbm_gb_per_s)
    unique_rows = min(num_ids, num_rows)
    opt = spec.optimizer_state_bytes_per_row(num_cols)
    # backward: read output grads, sort ids, accumulate per-id grads, then read+write each
    # touched row and its optimizer state.
    bwd_bytes = out_bytes + num_ids * (2 * ID_BYTES + rb) + unique_rows * 2 * (rb + opt)
    return fwd, _ms(bwd_bytes, topo.hbm_gb_per_s)


def holder_perf(spec: TableSpec, topo: Topology, stype: ShardingType, num_rows: int, num_cols: int, num_shards: int) -> Perf:
    """Time the rank holding one shard spends on it."""
    assert stype is not ShardingType.DATA_PARALLEL
    G, F, e = topo.global_batch_size, spec.num_features, spec.element_bytes
    ids_total = G * spec.pooling_factor * F
    share = num_rows / spec.num_embeddings
    ids = ids_total * share  # ids routed to this shard (all of them unless rows are split)
    if spec.pooled:
        out_rows = G * F  # row shards emit a partial sum for every bag
    else:
        out_rows = ids
    out_bytes = out_rows * num_cols * e
    fwd, bwd = _lookup_ms(spec, topo, ids, num_rows, num_cols, out_rows)
    in_bytes = ids * ID_BYTES + G * F * LENGTH_BYTES
    if stype.splits_rows and spec.pooled:
        # partial sums are first reduce-scattered among the row shards that share a host,
        # then each sends its 1/k_h of the host's sums to the sample owners
        per_host = num_shards if stype is ShardingType.TABLE_ROW_WISE else max(1, num_shards // topo.num_hosts)
        out_ms = host_comm_ms(out_bytes, per_host, topo) + spread_comm_ms(out_bytes / per_host, topo)
    else:
        out_ms = spread_comm_ms(out_bytes, topo)
    return Perf(
        input_dist_ms=spread_comm_ms(in_bytes, topo),
        lookup_fwd_ms=fwd,
        output_dist_fwd_ms=out_ms,
        output_dist_bwd_ms=out_ms,
        lookup_bwd_ms=bwd,
    )


def requester_perf(spec: TableSpec, topo: Topology, stype: ShardingType, num_shards: int) -> Perf:
    """Time each rank spends sending its own samples' ids to the shards and taking outputs back."""
    if stype is ShardingType.DATA_PARALLEL:
        return Perf()
    B, F, e, D = topo.batch_size_per_rank, spec.num_features, spec.element_bytes, spec.embedding_dim
    ids = B * spec.pooling_factor * F
    copies = num_shards if stype.splits_cols else 1  # column shards each need every id
    in_bytes = copies * ids * ID_BYTES + (num_shards if stype.splits_rows or stype.splits_cols else 1) * B * F * LENGTH_BYTES
    out_bytes = (B * F if spec.pooled else ids) * D * e
    out_ms = spread_comm_ms(out_bytes, topo)
    return Perf(input_dist_ms=spread_comm_ms(in_bytes, topo), output_dist_fwd_ms=out_ms, output_dist_bwd_ms=out_ms)


def data_parallel_perf(spec: TableSpec, topo: Topology) -> Perf:
    """Time every rank spends on a replicated table: local lookup, dense update, all-reduce."""
    B, F, N, D, e = topo.batch_size_per_rank, spec.num_features, spec.num_embeddings, spec.embedding_dim, spec.element_bytes
    ids = B * spec.pooling_factor * F
    out_rows = B * F if spec.pooled else ids
    fwd, _ = _lookup_ms(spec, topo, ids, N, D, out_rows)
    grad_bytes = N * D * GRAD_BYTES
    # dense backward: zero + scatter-add the full gradient, then update every row and its state
    bwd_bytes = out_rows * D * e + ids * row_bytes(D, e) + 2 * grad_bytes + N * 2 * (row_bytes(D, e) + spec.optimizer_state_bytes_per_row(D))
    return Perf(lookup_fwd_ms=fwd, lookup_bwd_ms=_ms(bwd_bytes, topo.hbm_gb_per_s), dp_allreduce_ms=allreduce_ms(grad_bytes, topo))
