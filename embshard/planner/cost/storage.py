"""Bytes per shard: weights, optimizer state and the step's input/output buffers.

Weights take n rows x `TableSpec.row_bytes` (d elements of the dtype, plus an fp16 scale and
bias per row for int8); optimizer state is fp32 (sgd none, adagrad one float per element,
rowwise_adagrad one float per row, adam two floats per element). I/O buffers hold the ids
(and lengths) a shard receives, its output and the output's gradient. A data-parallel
table costs every rank a full replica, its optimizer state and a dense fp32 gradient. Each
rank also holds its own samples' outputs and their gradients for every table (requester
side). A per-rank reservation for dense parameters and activations is set by
`Topology.reserved_fraction`.

Tiers (embshard.planner.cost.tiers): a ``uvm_cache`` shard holds in HBM its cache (cache_rows
rows of weights and CACHE_SLOT_BYTES of cache state per row) and its I/O buffers; its weights
and optimizer state are in host memory (`Storage.host_bytes`; FBGEMM keeps the optimizer state
of managed tables there, uncached). A ``host`` shard holds only its I/O buffers in HBM.

Outputs (and their gradients) are fp32 whatever the weights' dtype (perf.OUTPUT_BYTES).
``inference`` (serving, forward only): no optimizer state, no gradients.
"""

from __future__ import annotations

from embshard.planner.cost.perf import GRAD_BYTES, ID_BYTES, LENGTH_BYTES, OUTPUT_BYTES
from embshard.planner.cost.tiers import CACHE_SLOT_BYTES
from embshard.planner.types import Location, ShardingType, Storage
from embshard.specs import TableSpec, piece_rows
from embshard.topology import Topology


def _output_copies(inference: bool) -> int:
    """Training keeps each output and its gradient; serving the output only."""
    return 1 if inference else 2


def holder_storage(spec: TableSpec, topo: Topology, stype: ShardingType, num_rows: int, num_cols: int,
                   inference: bool = False, location: Location = Location.HBM, num_cache_rows: int = 0) -> Storage:
    assert stype is not ShardingType.DATA_PARALLEL
    G, F = topo.global_batch_size, spec.num_features
    ids = G * spec.pooling_factor * F * num_rows / spec.num_embeddings
    out_rows = G * F if spec.pooled else ids
    io = ids * ID_BYTES + G * F * LENGTH_BYTES + _output_copies(inference) * out_rows * num_cols * OUTPUT_BYTES
    weights = num_rows * spec.row_bytes(num_cols)
    optimizer = 0 if inference else num_rows * spec.optimizer_state_bytes_per_row(num_cols)
    if location is Location.HBM:
        return Storage(weights_bytes=weights, optimizer_bytes=optimizer, io_bytes=int(io))
    cache = num_cache_rows * (spec.row_bytes(num_cols) + CACHE_SLOT_BYTES) if location is Location.UVM_CACHE else 0
    return Storage(weights_bytes=cache, io_bytes=int(io), host_bytes=weights + optimizer)


def requester_storage(spec: TableSpec, topo: Topology, inference: bool = False) -> Storage:
    B, F = topo.batch_size_per_rank, spec.num_features
    out_rows = B * F if spec.pooled else B * F * spec.pooling_factor
    return Storage(io_bytes=int(_output_copies(inference) * out_rows * spec.embedding_dim * OUTPUT_BYTES))


def data_parallel_storage(spec: TableSpec, topo: Topology, inference: bool = False, mode: str | None = None) -> Storage:
    """A replica on every rank. Trained by all-reduce (``mode``; None: the topology's) with
    ``topology.sharded_dp_update``: each rank keeps the optimizer state of its piece of the rows (rank
    0's is the largest, `embshard.specs.piece_rows`) and a second gradient buffer (the reduce-scatter's)."""
    N, D = spec.num_embeddings, spec.embedding_dim
    B, F = topo.batch_size_per_rank, spec.num_features
    ids = B * spec.pooling_factor * F
    sharded = topo.sharded_dp_update and (mode or topo.data_parallel_mode) == "allreduce" and not inference
    state_rows = piece_rows(N, topo.world_size)[0] if sharded else N
    return Storage(
        weights_bytes=N * spec.row_bytes(D),
        optimizer_bytes=0 if inference else state_rows * spec.optimizer_state_bytes_per_row(D),
        io_bytes=int((0 if inference else (1 + sharded) * N * D * GRAD_BYTES) + ids * ID_BYTES + B * F * LENGTH_BYTES),
    ) + requester_storage(spec, topo, inference)
