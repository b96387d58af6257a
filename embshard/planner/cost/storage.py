"""Bytes per shard: weights, optimizer state and the step's input/output buffers.

Weights take n*d*e bytes; optimizer state is fp32 (sgd none, adagrad one float per
element, rowwise_adagrad one float per row, adam two floats per element). I/O buffers hold
the ids (and lengths) a shard receives, its output and the output's gradient. A
data-parallel table costs every rank a full replica, its optimizer state and a dense fp32
gradient. Each rank also holds its own samples' outputs and their gradients for every
table (requester side). A per-rank reservation for dense parameters and activations is
set by `Topology.reserved_fraction`.
"""

from __future__ import annotations

from embshard.planner.cost.perf import GRAD_BYTES, ID_BYTES, LENGTH_BYTES
from embshard.planner.types import ShardingType, Storage
from embshard.specs import TableSpec
from embshard.topology import Topology


def holder_storage(spec: TableSpec, topo: Topology, stype: ShardingType, num_rows: int, num_cols: int) -> Storage:
    assert stype is not ShardingType.DATA_PARALLEL
    G, F, e = topo.global_batch_size, spec.num_features, spec.element_bytes
    ids = G * spec.pooling_factor * F * num_rows / spec.num_embeddings
    out_rows = G * F if spec.pooled else ids
    io = ids * ID_BYTES + G * F * LENGTH_BYTES + 2 * out_rows * num_cols * e
    return Storage(
        weights_bytes=num_rows * num_cols * e,
        optimizer_bytes=num_rows * spec.optimizer_state_bytes_per_row(num_cols),
        io_bytes=int(io),
    )


def requester_storage(spec: TableSpec, topo: Topology) -> Storage:
    B, F = topo.batch_size_per_rank, spec.num_features
    out_rows = B * F if spec.pooled else B * F * spec.pooling_factor
    return Storage(io_bytes=int(2 * out_rows * spec.embedding_dim * spec.element_bytes))


def data_parallel_storage(spec: TableSpec, topo: Topology) -> Storage:
    N, D, e = spec.num_embeddings, spec.embedding_dim, spec.element_bytes
    B, F = topo.batch_size_per_rank, spec.num_features
    ids = B * spec.pooling_factor * F
    return Storage(
        weights_bytes=N * D * e,
        optimizer_bytes=N * spec.optimizer_state_bytes_per_row(D),
        io_bytes=int(N * D * GRAD_BYTES + ids * ID_BYTES + B * F * LENGTH_BYTES),
    ) + requester_storage(spec, topo)
