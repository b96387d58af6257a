"""Sharded embedding collections: `ShardedEmbeddingBagCollection` (pooled, returns a
`KeyedTensor` like TorchRec's `EmbeddingBagCollection`) and `ShardedEmbeddingCollection`
(sequence, returns ``{feature: JaggedTensor}`` like `EmbeddingCollection`).

Each rank passes its own slice of the batch. Forward: validate locally, agree on batch
sizes (and on failure: every rank raises the same ValueError), input dist, rank-local
fused lookups, output dist. Backward: gradients go back the same way and the fused
optimizer updates every shard inside backward; nothing to call afterwards.

Gradient semantics: each rank's loss covers its slice; shards are updated with the
gradient of the *mean* of the ranks' losses, i.e. the unsharded collection fed the
concatenated global batch with gradients averaged over ranks -- what DDP does for dense
parameters. Data-parallel tables get the same update on every replica in one of two ways
(``data_parallel_mode``, by default the plan topology's): "allreduce" (dense_replicas.py): each rank looks up its
own samples, and the weight gradients of all replicated blocks are all-reduced in one flat
buffer and averaged before each table's optimizer runs (TorchRec's way; whole-table
gradients travel). "replicated_lookup": every replica looks up the global batch (ids
all-gathered in forward), keeps its own rows, and in backward gathers every rank's gradient
of its rows, divides by the world size and applies the table's fused optimizer (ids and
pooled gradients travel; it costs world_size x the local lookups). The cost model prices
the second when ``topology.replicated_dp_lookup`` is set, else the first.

Kernels are not registered submodules: their weights are no nn.Parameters, so neither a
dense optimizer nor DDP touches them. `state_dict()` returns one `TableShard` per table
this rank holds.

Serving: with ``optimizer=None`` a collection is forward-only. The same routing, input and
output dist run around FBGEMM's inference kernel (`embshard.runtime.quantized.QuantKernel`),
one per weight dtype (fp32, fp16, row-wise int8: each table's spec dtype); the blocks start
empty and load with `load_quantized`. Data-parallel replicas look up only this rank's own
samples (no gradient to agree on: nothing travels). Such a collection has no training state.

Hot rows: a table whose placement has ``hot_rows`` runs as the table plus a data-parallel
replica of its hottest rows, trained in "allreduce" mode (see hot_rows.py); ``hot_ids``
gives the rankings (table -> ids hottest first), by default read from the plan's hot_ids_file.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from contextlib import nullcontext
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from embshard.planner.plan import ShardingPlan
from embshard.runtime.comm import gather_header, local_part
from embshard.runtime.dense_replicas import DATA_PARALLEL_MODES, DenseReplicas
from embshard.runtime.features import Batch, check_batch
from embshard.runtime.hot_rows import HOT, HotRows, SplitBatch, hot_id_sets, hot_ids_digest, inner_plan
from embshard.runtime.input_dist import InputDist, Received
from embshard.runtime.lookup import FbgemmKernel, TorchKernel, fbgemm_optimizers, init_block
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.output_dist import PooledOutputDist, SequenceOutputDist, by_source
from embshard.runtime.quantized import QuantKernel
from embshard.runtime.routing import POOLING_MODES, KernelSpec, Routing, build_routing, check_plan
from embshard.runtime.state import TableShard, block_of
from embshard.runtime.timing import PhaseTimer
from embshard.specs import TableSpec


class _ShardedCollection(nn.Module):
    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool,
                 pooling: Mapping[str, str], weighted: bool, optimizer: OptimizerConfig | None,
                 device: torch.device | None, seed: int, data_parallel_mode: str | None,
                 hot_ids: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        data_parallel_mode = data_parallel_mode or plan.topology.data_parallel_mode
        self.pg, self.pooled, self.weighted, self.optimizer_config = pg, pooled, weighted, optimizer
        self.inference = optimizer is None
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.where = type(self).__name__
        self.rank, self.world_size = dist.get_rank(pg), dist.get_world_size(pg)
        self.specs = self.table_specs = tuple(tables)  # specs: what runs (hot replicas too); table_specs: the caller's
        error, hot_sets = None, {}
        try:
            check_plan(self.specs, plan, self.world_size, pooled, self.where, self.inference)
            bad = {n: m for n, m in pooling.items() if m not in POOLING_MODES or n not in {s.name for s in self.specs}}
            if bad:
                raise ValueError(f"{self.where}: pooling {bad}: give known table names and modes from {POOLING_MODES}")
            if data_parallel_mode not in DATA_PARALLEL_MODES:
                raise ValueError(f"{self.where}: data_parallel_mode {data_parallel_mode!r}: give one of {DATA_PARALLEL_MODES}")
            hot_sets = hot_id_sets(self.specs, plan, hot_ids, self.where)
            if hot_sets and data_parallel_mode != "allreduce" and not self.inference:
                raise ValueError(f"{self.where}: tables {sorted(hot_sets)} replicate hot rows, which train in "
                                 f"data_parallel_mode 'allreduce' (as the planner priced them), not {data_parallel_mode!r}")
        except ValueError as e:
            error = str(e)
        fingerprint = _fingerprint(self.specs, plan, data_parallel_mode, hot_ids_digest(hot_sets)) if error is None else 0
        header = gather_header([fingerprint], error, pg, self.device)
        if len(set(header[:, 0].tolist())) != 1:
            raise ValueError(f"{self.where}: ranks were given different plans, tables or data_parallel_mode (fingerprints "
                             f"{header[:, 0].tolist()}); load the same plan file and settings on every rank")
        self.hot = HotRows(self.specs, hot_sets, pooled, pooling, self.device) if hot_sets else None
        if self.hot is not None:
            self.specs, plan = inner_plan(self.specs, plan, hot_sets)
            pooling = self.hot.inner_pooling
        self.routing: Routing = build_routing(self.specs, plan, self.rank, self.world_size, pooled, pooling,
                                              fbgemm_optimizers(self.device), self.inference)
        replicas = self.routing.replicas
        self.kernels = [self._kernel(k) for k in self.routing.kernels]
        self.replica_kernels = [self._kernel(k) for k in replicas.kernels] if replicas else []
        self.input_dist = InputDist(self.routing, pg, self.device)
        self.replica_dist = InputDist(replicas, pg, self.device) if replicas else None
        self.sharded = bool(self.routing.send_slots)
        self.timer: PhaseTimer | None = None
        # replicas that look up this rank's samples alone (serving, or trained with an all-reduce)
        self.dense_replicas = DenseReplicas(self.replica_kernels, replicas.kernels, pooled, optimizer, pg) \
            if replicas and not self.inference and data_parallel_mode == "allreduce" else None
        self.local_replicas = self.inference or self.dense_replicas is not None
        if self.inference:
            return
        for table, (kernel, i, slot) in self._blocks().items():
            spec = self._spec(table)
            kernel.block_weights()[i].copy_(init_block(table, spec.num_embeddings, slot.num_rows, slot.num_cols,
                                                       slot.row_offset, slot.col_offset, seed))

    def _kernel(self, spec: KernelSpec) -> nn.Module:
        if self.inference:
            return QuantKernel(spec, self.pooled, spec.dtype, self.device)
        dtypes = [self._spec(b.table).dtype for b in spec.blocks]
        if spec.impl == "fbgemm":
            return FbgemmKernel(spec, self.pooled, dtypes, self.optimizer_config, self.device)
        return TorchKernel(spec, self.pooled, dtypes, self.optimizer_config, self.device)

    def _spec(self, table: str) -> TableSpec:
        return next(s for s in self.specs if s.name == table)

    def _blocks(self) -> dict[str, tuple[nn.Module, int, Any]]:
        """table -> (kernel, block index in the kernel, slot) for every block this rank holds."""
        out = {}
        replica_specs = self.routing.replicas.kernels if self.routing.replicas else ()
        for kernels, specs in ((self.kernels, self.routing.kernels), (self.replica_kernels, replica_specs)):
            for kernel, spec in zip(kernels, specs):
                for i, block in enumerate(spec.blocks):
                    out[block.table] = (kernel, i, block)
        return out

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else nullcontext()

    def _prepare(self, features: KeyedJaggedTensor) -> tuple[Batch, tuple[int, ...], SplitBatch | None]:
        """Validate the local batch, then agree with every rank on batch sizes (or raise everywhere);
        with hot rows, the batch the inner tables see (hot ids moved to their replicas) and the split."""
        batch, error = check_batch(features, self.hot or self.routing, self.weighted, self.where)
        header = gather_header([batch.batch_size if batch else 0], error, self.pg, self.device)
        assert batch is not None
        split = self.hot.split(batch) if self.hot is not None else None
        return (split.inner if split else batch), tuple(header[:, 0].tolist()), split

    def _distribute(self, features: KeyedJaggedTensor):
        """Validate, agree on batch sizes, then ship ids to shards and to every replica."""
        batch, batch_sizes, split = self._prepare(features)
        received = self.input_dist(batch, batch_sizes) if self.sharded else None
        replicated = None
        if self.replica_dist:
            replicated = self.replica_dist.local(batch) if self.local_replicas else self.replica_dist(batch, batch_sizes)
        return batch, batch_sizes, received, replicated, split

    def _distribute_and_look_up(self, features: KeyedJaggedTensor):
        """Input dist and rank-local lookups: (batch, batch sizes, received, replicated, outputs of the
        sharded kernels, outputs of the replica kernels, hot split or None)."""
        with self._phase("input_dist"):
            batch, batch_sizes, received, replicated, split = self._distribute(features)
        with self._phase("lookup"):
            outs = self._look_up(self.kernels, received)
            replica_outs = self.dense_replicas(replicated) if self.dense_replicas else self._look_up(self.replica_kernels, replicated)
        return batch, batch_sizes, received, replicated, outs, replica_outs, split

    @staticmethod
    def _look_up(kernels: list[nn.Module], received: Received | None) -> list[Tensor]:
        if received is None:
            return []
        return [k(x.indices, x.offsets, x.per_sample_weights, x.ids_per_feature_rank) for k, x in zip(kernels, received.inputs)]

    # ---- serving (forward-only collections) ---------------------------------------------
    def load_quantized(self, blocks: Mapping[str, tuple[Tensor, Tensor | None]]) -> None:
        """Fill this rank's blocks: table -> (weight [rows, cols] in the table's dtype, uint8 for int8;
        int8: fp16 (scale, bias) per row [rows, 2], else None), as the plan cuts them."""
        assert self.inference, "load_quantized fills forward-only collections (optimizer=None)"
        missing = sorted(set(self._blocks()) - set(blocks))
        if missing:
            raise ValueError(f"{self.where}.load_quantized: no weights for this rank's block(s) of {missing}")
        for table, (kernel, i, _) in self._blocks().items():
            kernel.load_block(i, *blocks[table])

    def memory_bytes(self) -> int:
        """Bytes of this rank's weight buffers (forward-only collections)."""
        assert self.inference, "memory_bytes counts the buffers of forward-only collections"
        return sum(k.memory_bytes() for k in [*self.kernels, *self.replica_kernels])

    # ---- optimizer and state ------------------------------------------------------------
    def set_learning_rate(self, learning_rate: float) -> None:
        """Learning rate of every fused optimizer of this collection, from the next backward on."""
        for kernel in [*self.kernels, *self.replica_kernels]:
            kernel.set_learning_rate(learning_rate)
        if self.dense_replicas:
            self.dense_replicas.learning_rate = learning_rate

    def _shards(self, copy: bool) -> dict[str, TableShard]:
        """This rank's blocks; ``copy=False`` gives views of the live weights and state."""
        if self.inference:
            raise ValueError(f"{self.where}: a forward-only (serving) collection has no training state to save or "
                             "load; its weights load with load_quantized")
        out = {}
        for table, (kernel, i, slot) in self._blocks().items():
            spec = self._spec(table)
            weight, state = kernel.block_weights()[i].detach(), kernel.block_states()[i]
            out[table] = TableShard(
                table, weight.clone() if copy else weight, slot.row_offset, slot.col_offset,
                (spec.num_embeddings, spec.embedding_dim), spec.optimizer,
                {k: v.detach().clone() if copy else v for k, v in state.items()}, replicated=kernel in self.replica_kernels)
        return out

    def state_dict(self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict:
        """table name -> `TableShard` (a copy of this rank's block, its place, its optimizer state)."""
        out = destination if destination is not None else OrderedDict()
        shards = self._shards(copy=True)
        if self.hot is not None:  # each table once: the replicas' rows go into its shards
            shards = self.hot.merge_shards(shards)
        out.update((prefix + name, shard) for name, shard in shards.items())
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
        """Accepts a `TableShard` of the same block (weights and optimizer state) or a full table tensor (weights)."""
        with torch.no_grad():
            for table, live in self._shards(copy=False).items():
                if table.endswith(HOT):  # every rank, in the same order: a collective
                    outer = table[:-len(HOT)]
                    found = {outer: state_dict[prefix + outer]} if prefix + outer in state_dict else {}
                    weight, state = self.hot.replica_from_shards(outer, found, live, self.pg)
                    live.weight.copy_(weight)
                    for name, tensor in state.items():
                        live.optimizer_state[name].copy_(tensor)
                    continue
                key = prefix + table
                if key not in state_dict:
                    missing_keys.append(key)
                    continue
                value = state_dict[key]
                live.weight.copy_(block_of(value, live, f"{self.where}.load_state_dict[{key!r}]"))
                if isinstance(value, TableShard):
                    for name, tensor in live.optimizer_state.items():
                        tensor.copy_(value.optimizer_state[name])
        known = {prefix + s.name for s in self.table_specs}
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):] and k not in known)

    def load_tables(self, tables: Mapping[str, Tensor]) -> None:
        """Copy this rank's blocks out of full (unsharded) tables; optimizer state is left as is."""
        missing = sorted({s.name for s in self.table_specs} - set(tables))
        if missing:
            raise ValueError(f"{self.where}.load_tables: no weights for table(s) {missing}")
        with torch.no_grad():
            for table, live in self._shards(copy=False).items():
                if table.endswith(HOT):
                    live.weight.copy_(self.hot.replica_from_shards(table[:-len(HOT)], tables, live, self.pg)[0])
                    continue
                live.weight.copy_(block_of(tables[table].to(self.device), live, f"{self.where}.load_tables[{table!r}]"))


class ShardedEmbeddingBagCollection(_ShardedCollection):
    """Pooled tables (``pooled: true``) sharded by ``plan`` over ``pg``.

    pooling: table name -> "sum" (default) or "mean". weighted: use the batch's per-id
    weights (TorchRec's ``is_weighted``). optimizer: fused optimizer settings; each
    table's optimizer kind comes from its spec; None: forward-only serving kernels (see the
    module docstring). seed: initial weights (`load_tables` or `load_state_dict` replace them).
    data_parallel_mode: how data-parallel tables train, "allreduce" or "replicated_lookup" (module docstring);
    None: as the plan's topology says (`Topology.data_parallel_mode`, the mode the cost model priced).
    """

    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *,
                 pooling: Mapping[str, str] | None = None, weighted: bool = False,
                 optimizer: OptimizerConfig | None = OptimizerConfig(), device: torch.device | None = None,
                 seed: int = 0, data_parallel_mode: str | None = None, hot_ids: Mapping[str, Any] | None = None) -> None:
        super().__init__(tables, plan, pg, pooled=True, pooling=pooling or {}, weighted=weighted, optimizer=optimizer,
                         device=device, seed=seed, data_parallel_mode=data_parallel_mode, hot_ids=hot_ids)
        self.output_dist = PooledOutputDist(self.routing, pg, self.device)
        features = self.hot.features if self.hot is not None else self.routing.features
        self._keys = [f.name for f in features]
        self._dims = [f.dim for f in features]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        batch, batch_sizes, received, replicated, outs, replica_outs, split = self._distribute_and_look_up(features)
        with self._phase("output_dist"):
            replica_rows = None
            if replica_outs:  # replicated look-up: every replica computed every rank's rows; keep this rank's
                full = replica_outs[0] if len(replica_outs) == 1 else torch.cat(replica_outs, dim=1)
                replica_rows = full if self.local_replicas else local_part(full, batch_sizes, self.pg)
            values = self.output_dist(outs, replica_rows, batch, batch_sizes)
            if split is not None:
                values = self.hot.join_pooled(values, split)
        return KeyedTensor(keys=self._keys, length_per_key=self._dims, values=values)


class ShardedEmbeddingCollection(_ShardedCollection):
    """Sequence tables (``pooled: false``) sharded by ``plan`` over ``pg``: one embedding per id."""

    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *,
                 optimizer: OptimizerConfig | None = OptimizerConfig(), device: torch.device | None = None,
                 seed: int = 0, data_parallel_mode: str | None = None, hot_ids: Mapping[str, Any] | None = None) -> None:
        super().__init__(tables, plan, pg, pooled=False, pooling={}, weighted=False, optimizer=optimizer,
                         device=device, seed=seed, data_parallel_mode=data_parallel_mode, hot_ids=hot_ids)
        self.output_dist = SequenceOutputDist(self.routing, pg, self.device)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        batch, batch_sizes, received, replicated, outs, replica_outs, split = self._distribute_and_look_up(features)
        with self._phase("output_dist"):
            flat = self.output_dist(outs, received, batch) if received else None
            replica_rows = None
            if replica_outs:  # replicated look-up: every replica computed every rank's rows; keep this rank's
                per_source = replicated.floats_per_source_kernel
                rows = by_source(replica_outs, per_source)
                replica_rows = rows if self.local_replicas else local_part(rows, [sum(c) for c in per_source], self.pg)
            out = self._per_feature(flat, replica_rows, batch)
            return self.hot.join_sequence(out, split) if split is not None else out

    def _per_feature(self, flat: Tensor | None, replica_rows: Tensor | None, batch: Batch) -> dict[str, JaggedTensor]:
        """Cut the flat outputs (sharded features, then replicated ones) into one JaggedTensor per feature."""
        r, B = self.routing, batch.batch_size
        counts = batch.lengths_FB.view(len(r.features), B).sum(1).tolist()
        values: dict[int, Tensor] = {}
        parts = [(flat, [i for i, f in enumerate(r.features) if not f.data_parallel])]
        if r.replicas:
            parts.append((replica_rows, [s.feature for s in r.replicas.slots_by_rank[r.rank]]))
        for buffer, order in parts:
            if buffer is None:
                continue
            # split (not slice): its backward is one concatenation, not a zero-filled copy per feature
            for i, part in zip(order, buffer.split([counts[i] * r.features[i].dim for i in order])):
                values[i] = part.view(counts[i], r.features[i].dim)
        return {f.name: JaggedTensor(values=values[i], lengths=batch.lengths_FB[i * B:(i + 1) * B])
                for i, f in enumerate(r.features)}


def _fingerprint(specs: Sequence[TableSpec], plan: ShardingPlan, data_parallel_mode: str, hot_digest: str) -> int:
    """63-bit hash of the tables, their placements, the data-parallel mode and the hot sets: ranks compare it
    before the first step."""
    text = repr([data_parallel_mode, hot_digest, *((s, plan.placement(s.name)) for s in specs)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
