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
parameters. Data-parallel tables get the same: gradients summed over ranks by one
all-reduce, divided by the world size, then the table's optimizer.

Kernels are not registered submodules: their weights are no nn.Parameters, so neither a
dense optimizer nor DDP touches them. `state_dict()` returns one `TableShard` per table
this rank holds.
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
from embshard.runtime.comm import gather_header
from embshard.runtime.features import Batch, check_batch
from embshard.runtime.input_dist import InputDist
from embshard.runtime.lookup import FbgemmKernel, TorchKernel, fbgemm_optimizers, init_block
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.output_dist import PooledOutputDist, SequenceOutputDist
from embshard.runtime.routing import POOLING_MODES, KernelSpec, Routing, build_routing, check_plan
from embshard.runtime.state import TableShard, block_of
from embshard.runtime.timing import PhaseTimer
from embshard.specs import TableSpec


class _ShardedCollection(nn.Module):
    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool,
                 pooling: Mapping[str, str], weighted: bool, optimizer: OptimizerConfig, device: torch.device | None,
                 seed: int) -> None:
        super().__init__()
        self.pg, self.pooled, self.weighted, self.optimizer_config = pg, pooled, weighted, optimizer
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.where = type(self).__name__
        self.rank, self.world_size = dist.get_rank(pg), dist.get_world_size(pg)
        self.specs = tuple(tables)
        error = None
        try:
            check_plan(self.specs, plan, self.world_size, pooled, self.where)
            bad = {n: m for n, m in pooling.items() if m not in POOLING_MODES or n not in {s.name for s in self.specs}}
            if bad:
                raise ValueError(f"{self.where}: pooling {bad}: give known table names and modes from {POOLING_MODES}")
        except ValueError as e:
            error = str(e)
        fingerprint = _fingerprint(self.specs, plan) if error is None else 0
        header = gather_header([fingerprint], error, pg, self.device)
        if len(set(header[:, 0].tolist())) != 1:
            raise ValueError(f"{self.where}: ranks were given different plans or tables (fingerprints {header[:, 0].tolist()}); "
                             "load the same plan file on every rank")
        self.routing: Routing = build_routing(self.specs, plan, self.rank, self.world_size, pooled, pooling,
                                              fbgemm_optimizers(self.device))
        self.kernels = [self._kernel(k) for k in self.routing.kernels]
        self.dp_kernels = [self._kernel(k, reduce_pg=pg) for k in self.routing.dp_kernels]
        self.dp_permutes = [torch.tensor([s.feature for s in k.slots], dtype=torch.int32, device=self.device)
                            for k in self.routing.dp_kernels]
        self.input_dist = InputDist(self.routing, pg, self.device)
        self.sharded = bool(self.routing.send_slots)
        self.timer: PhaseTimer | None = None
        for table, (kernel, i, slot) in self._blocks().items():
            spec = self._spec(table)
            kernel.block_weights()[i].copy_(init_block(table, spec.num_embeddings, slot.num_rows, slot.num_cols,
                                                       slot.row_offset, slot.col_offset, seed))

    def _kernel(self, spec: KernelSpec, reduce_pg: dist.ProcessGroup | None = None) -> nn.Module:
        dtypes = [self._spec(b.table).dtype for b in spec.blocks]
        if spec.impl == "fbgemm":
            return FbgemmKernel(spec, self.pooled, dtypes, self.optimizer_config, self.device)
        return TorchKernel(spec, self.pooled, dtypes, self.optimizer_config, self.device, reduce_pg)

    def _spec(self, table: str) -> TableSpec:
        return next(s for s in self.specs if s.name == table)

    def _blocks(self) -> dict[str, tuple[nn.Module, int, Any]]:
        """table -> (kernel, block index in the kernel, slot) for every block this rank holds."""
        out = {}
        for kernels, specs in ((self.kernels, self.routing.kernels), (self.dp_kernels, self.routing.dp_kernels)):
            for kernel, spec in zip(kernels, specs):
                for i, block in enumerate(spec.blocks):
                    out[block.table] = (kernel, i, block)
        return out

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else nullcontext()

    def _prepare(self, features: KeyedJaggedTensor) -> tuple[Batch, tuple[int, ...]]:
        """Validate the local batch, then agree with every rank on batch sizes (or raise everywhere)."""
        batch, error = check_batch(features, self.routing, self.weighted, self.where)
        header = gather_header([batch.batch_size if batch else 0], error, self.pg, self.device)
        assert batch is not None
        return batch, tuple(header[:, 0].tolist())

    def _dp_lookups(self, batch: Batch) -> list[Tensor]:
        """Local lookups of the data-parallel replicas (sequence: rows of each feature in batch order)."""
        outs = []
        for kernel, permute in zip(self.dp_kernels, self.dp_permutes):
            lengths, values, weights = torch.ops.fbgemm.permute_2D_sparse_data(
                permute, batch.lengths_FB.view(len(self.routing.features), -1), batch.values_N, batch.weights_N)
            if self.pooled:
                outs.append(kernel(values, torch.ops.fbgemm.asynchronous_complete_cumsum(lengths.reshape(-1)), weights))
            else:
                outs.append(kernel(values, None, None, [[n] for n in lengths.sum(1).tolist()]))
        return outs

    # ---- optimizer and state ------------------------------------------------------------
    def set_learning_rate(self, learning_rate: float) -> None:
        """Learning rate of every fused optimizer of this collection, from the next backward on."""
        for kernel in [*self.kernels, *self.dp_kernels]:
            kernel.set_learning_rate(learning_rate)

    def state_dict(self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict:
        out = destination if destination is not None else OrderedDict()
        for table, (kernel, i, slot) in self._blocks().items():
            spec = self._spec(table)
            out[prefix + table] = TableShard(
                table, kernel.block_weights()[i].detach().clone(), slot.row_offset, slot.col_offset,
                (spec.num_embeddings, spec.embedding_dim), spec.optimizer,
                {k: v.detach().clone() for k, v in kernel.block_states()[i].items()},
                replicated=kernel in self.dp_kernels)
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs) -> None:
        """Accepts a `TableShard` of the same block (weights and optimizer state) or a full table tensor (weights)."""
        current = self.state_dict()
        for table, shard in current.items():
            key = prefix + table
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value = state_dict[key]
            kernel, i, _ = self._blocks()[table]
            with torch.no_grad():
                kernel.block_weights()[i].copy_(block_of(value, shard, f"{self.where}.load_state_dict[{key!r}]"))
                if isinstance(value, TableShard):
                    for name, tensor in kernel.block_states()[i].items():
                        tensor.copy_(value.optimizer_state[name])
        known = {prefix + s.name for s in self.specs}
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):] and k not in known)

    def load_tables(self, tables: Mapping[str, Tensor]) -> None:
        """Copy this rank's blocks out of full (unsharded) tables; optimizer state is left as is."""
        missing = sorted({s.name for s in self.specs} - set(tables))
        if missing:
            raise ValueError(f"{self.where}.load_tables: no weights for table(s) {missing}")
        with torch.no_grad():
            for table, (kernel, i, _) in self._blocks().items():
                shard = self.state_dict()[table]
                kernel.block_weights()[i].copy_(block_of(tables[table].to(self.device), shard, f"{self.where}.load_tables[{table!r}]"))


class ShardedEmbeddingBagCollection(_ShardedCollection):
    """Pooled tables (``pooled: true``) sharded by ``plan`` over ``pg``.

    pooling: table name -> "sum" (default) or "mean". weighted: use the batch's per-id
    weights (TorchRec's ``is_weighted``). optimizer: fused optimizer settings; each
    table's optimizer kind comes from its spec. seed: initial weights (`load_tables` or
    `load_state_dict` replace them).
    """

    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *,
                 pooling: Mapping[str, str] | None = None, weighted: bool = False,
                 optimizer: OptimizerConfig = OptimizerConfig(), device: torch.device | None = None, seed: int = 0) -> None:
        super().__init__(tables, plan, pg, pooled=True, pooling=pooling or {}, weighted=weighted, optimizer=optimizer,
                         device=device, seed=seed)
        self.output_dist = PooledOutputDist(self.routing, pg, self.device)
        self._keys = list(self.routing.feature_names)
        self._dims = [f.dim for f in self.routing.features]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        with self._phase("input_dist"):
            batch, batch_sizes = self._prepare(features)
            received = self.input_dist(batch, batch_sizes) if self.sharded else None
        with self._phase("lookup"):
            outs = [k(x.indices, x.offsets, x.per_sample_weights) for k, x in zip(self.kernels, received.inputs)] if received else []
            dp_outs = self._dp_lookups(batch)
        with self._phase("output_dist"):
            values = self.output_dist(outs, dp_outs, batch, batch_sizes)
        return KeyedTensor(keys=self._keys, length_per_key=self._dims, values=values)


class ShardedEmbeddingCollection(_ShardedCollection):
    """Sequence tables (``pooled: false``) sharded by ``plan`` over ``pg``: one embedding per id."""

    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *,
                 optimizer: OptimizerConfig = OptimizerConfig(), device: torch.device | None = None, seed: int = 0) -> None:
        super().__init__(tables, plan, pg, pooled=False, pooling={}, weighted=False, optimizer=optimizer,
                         device=device, seed=seed)
        self.output_dist = SequenceOutputDist(self.routing, pg, self.device)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        with self._phase("input_dist"):
            batch, batch_sizes = self._prepare(features)
            received = self.input_dist(batch, batch_sizes) if self.sharded else None
        with self._phase("lookup"):
            outs = [k(x.indices, None, None, x.ids_per_feature_rank) for k, x in zip(self.kernels, received.inputs)] \
                if received else []
            dp_outs = self._dp_lookups(batch)
        with self._phase("output_dist"):
            flat = self.output_dist(outs, received, batch) if received else None
            return self._per_feature(flat, dp_outs, batch)

    def _per_feature(self, flat: Tensor | None, dp_outs: list[Tensor], batch: Batch) -> dict[str, JaggedTensor]:
        r, B = self.routing, batch.batch_size
        counts = batch.lengths_FB.view(len(r.features), -1).sum(1).tolist()
        dp_rows: dict[int, Tensor] = {}
        for kernel, out in zip(r.dp_kernels, dp_outs):
            for slot, rows in zip(kernel.slots, out.view(-1, kernel.dim).split([counts[s.feature] for s in kernel.slots])):
                dp_rows[slot.feature] = rows
        result, start = {}, 0
        for i, f in enumerate(r.features):
            if f.data_parallel:
                values = dp_rows[i]
            else:
                values = flat[start:start + counts[i] * f.dim].view(counts[i], f.dim)
                start += counts[i] * f.dim
            result[f.name] = JaggedTensor(values=values, lengths=batch.lengths_FB[i * B:(i + 1) * B])
        return result


def _fingerprint(specs: Sequence[TableSpec], plan: ShardingPlan) -> int:
    """63-bit hash of the tables and their placements: ranks compare it before the first step."""
    text = repr([(s, plan.placement(s.name)) for s in specs])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
