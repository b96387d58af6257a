"""Sharded embedding collections: `ShardedEmbeddingBagCollection` (pooled, returns a
`KeyedTensor` like TorchRec's `EmbeddingBagCollection`) and `ShardedEmbeddingCollection`
(sequence, returns ``{feature: JaggedTensor}`` like `EmbeddingCollection`).

Each rank passes its own slice of the batch. Forward: validate locally, agree on batch
sizes (and on failure: every rank raises the same ValueError), input dist, rank-local
fused lookups, output dist (a collection whose look-ups are all local, data-parallel tables
trained by an all-reduce, has neither: it agrees on failure alone, a header in flight during its
look-ups). Backward: gradients go back the same way and the fused optimizer updates every shard
inside backward; nothing to call afterwards.

Gradient semantics: each rank's loss covers its slice; shards are updated with the
gradient of the *mean* of the ranks' losses, i.e. the unsharded collection fed the
concatenated global batch with gradients averaged over ranks -- what DDP does for dense
parameters. Data-parallel tables get the same update on every replica in one of two ways, per
table (the mode its plan placement records, the cheaper one the planner priced; else the plan
topology's; the ``data_parallel_mode`` argument forces one for all), both in one collection: "allreduce" (dense_replicas.py): each rank looks up its
own samples, and the weight gradients of all replicated blocks are all-reduced in one flat
buffer and averaged before each table's optimizer runs (TorchRec's way; whole-table
gradients travel). "replicated_lookup": every replica looks up the global batch (ids
all-gathered in forward), keeps its own rows, and in backward gathers every rank's gradient
of its rows, divides by the world size and applies the table's fused optimizer (ids and
pooled gradients travel; it costs world_size x the local lookups). The cost model prices
both (`embshard.planner.cost.perf.data_parallel_perf`). With the plan topology's ``sharded_dp_update`` the
"allreduce" tables' update is sharded across the ranks (dense_replicas.py): their kernels only look up, each
rank keeps its pieces' optimizer state, and `state_dict` gathers each table's whole (a collective).

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
import warnings
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from embshard.planner.plan import ShardingPlan
from embshard.planner.types import Location
from embshard.runtime.comm import Header, gather_header, local_part, start_header, use_hosts, use_shared_memory
from embshard.planner.types import ShardingType
from embshard.runtime.dense_replicas import DenseReplicas
from embshard.runtime.features import Batch, check_batch
from embshard.runtime.hot_rows import HOT, HotRows, SplitBatch, hot_id_sets, hot_ids_digest, inner_plan
from embshard.runtime.input_dist import Distributed, InputDist, Received
from embshard.runtime.lookup import FbgemmKernel, TorchKernel, fbgemm_optimizers, init_block
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.output_dist import PooledOutputDist, SequenceOutputDist, by_source
from embshard.runtime.quantized import QuantKernel
from embshard.runtime.routing import POOLING_MODES, KernelSpec, Routing, build_routing, check_plan
from embshard.runtime.state import TableShard, block_of
from embshard.runtime.timing import PhaseTimer
from embshard.runtime.wire import TORCH_DTYPES
from embshard.specs import TableSpec, sparse_dp_allreduce
from embshard.topology import DATA_PARALLEL_MODES


_noted_tiers_on_cpu = False


def note_tiers_on_cpu(plan: ShardingPlan, device: torch.device) -> bool:
    """Warn, once per process, that a plan's uvm_cache/host shards run in host memory like the rest
    on CPU (there all memory is host memory); True if this call warned."""
    global _noted_tiers_on_cpu
    if _noted_tiers_on_cpu or device.type == "cuda":
        return False
    tiered = sorted({t.name for t in plan.tables for s in t.shards if s.location is not Location.HBM})
    if not tiered:
        return False
    _noted_tiers_on_cpu = True
    warnings.warn(f"the plan keeps {len(tiered)} table(s) in host memory or a UVM cache ({', '.join(tiered[:5])}"
                  f"{' ...' if len(tiered) > 5 else ''}); on CPU all memory is host memory, so they run like the others "
                  f"(the plan's HBM/host split and hit rates apply on CUDA)", RuntimeWarning, stacklevel=3)
    return True


class _ShardedCollection(nn.Module):
    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool,
                 pooling: Mapping[str, str], weighted: bool, optimizer: OptimizerConfig | None,
                 device: torch.device | None, seed: int, data_parallel_mode: str | None,
                 hot_ids: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.pg, self.pooled, self.weighted, self.optimizer_config = pg, pooled, weighted, optimizer
        self.inference = optimizer is None
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.where = type(self).__name__
        self.rank, self.world_size = dist.get_rank(pg), dist.get_world_size(pg)
        self.specs = self.table_specs = tuple(tables)  # specs: what runs (hot replicas too); table_specs: the caller's
        error, modes, hot_sets = None, {}, {}
        try:
            check_plan(self.specs, plan, self.world_size, pooled, self.where, self.inference)
            bad = {n: m for n, m in pooling.items() if m not in POOLING_MODES or n not in {s.name for s in self.specs}}
            if bad:
                raise ValueError(f"{self.where}: pooling {bad}: give known table names and modes from {POOLING_MODES}")
            if data_parallel_mode not in (None, *DATA_PARALLEL_MODES):
                raise ValueError(f"{self.where}: data_parallel_mode {data_parallel_mode!r}: give one of {DATA_PARALLEL_MODES}")
            modes = {s.name: data_parallel_mode or plan.placement(s.name).data_parallel_mode or plan.topology.data_parallel_mode
                     for s in self.specs if plan.placement(s.name).sharding_type is ShardingType.DATA_PARALLEL}
            hot_sets = hot_id_sets(self.specs, plan, hot_ids, self.where)
            if hot_sets and data_parallel_mode == "replicated_lookup" and not self.inference:
                raise ValueError(f"{self.where}: tables {sorted(hot_sets)} replicate hot rows, which train in "
                                 f"data_parallel_mode 'allreduce' (as the planner priced them), not {data_parallel_mode!r}")
            modes.update({name + HOT: "allreduce" for name in hot_sets})  # hot replicas train by all-reduce
        except ValueError as e:
            error = str(e)
        fingerprint = _fingerprint(self.specs, plan, modes, hot_ids_digest(hot_sets)) if error is None else 0
        header = gather_header([fingerprint], error, pg, self.device)
        if len(set(header[:, 0].tolist())) != 1:
            raise ValueError(f"{self.where}: ranks were given different plans, tables or data_parallel_mode (fingerprints "
                             f"{header[:, 0].tolist()}); load the same plan file and settings on every rank")
        note_tiers_on_cpu(plan, self.device)
        hosts = use_hosts(pg, plan.topology)  # host sub-groups (in-host reduction, hierarchical all-reduce), once per group
        use_shared_memory(pg, plan.topology.local_world_size >= self.world_size)  # one host: no gloo TCP between ranks
        if hosts is not None:
            use_shared_memory(hosts.local, True)
        self.hot = HotRows(self.specs, hot_sets, pooled, pooling, self.device) if hot_sets else None
        if self.hot is not None:
            self.specs, plan = inner_plan(self.specs, plan, hot_sets)
            pooling = self.hot.inner_pooling
        self.routing: Routing = build_routing(self.specs, plan, self.rank, self.world_size, pooled, pooling,
                                              fbgemm_optimizers(self.device), self.inference, modes)
        self.kernels = [self._kernel(k) for k in self.routing.kernels]
        # sharded weight updates (the plan topology's sharded_dp_update): the all-reduce group's kernels only look up
        sharded = plan.topology.sharded_dp_update and not self.inference
        # across hosts the all-reduce exchanges only the rows looked up of tables that are not small (dense_replicas.py)
        sparse = sparse_dp_allreduce(plan.topology.num_hosts, plan.topology.sharded_dp_update)
        self.replica_kernels = [self._kernel(replace(k, optimizer="sgd") if sharded and mode == "allreduce" else k)
                                for mode, group in self.routing.replica_groups for k in group.kernels]
        self.input_dist = InputDist(self.routing, pg, self.device)
        self.sharded = bool(self.routing.send_slots)
        self.timer: PhaseTimer | None = None
        self.comms = plan.topology.comms
        self.replica_groups: list[_ReplicaGroup] = []  # one per data-parallel mode, in the order of replicas' slots
        start = 0
        for mode, group in self.routing.replica_groups:
            kernels = self.replica_kernels[start:start + len(group.kernels)]
            start += len(kernels)
            # replicas that look up this rank's samples alone (serving, or trained with an all-reduce)
            local = self.inference or mode == "allreduce"
            dense = DenseReplicas(kernels, group.kernels, pooled, optimizer, pg, self.comms, sharded, sparse) \
                if local and not self.inference else None
            self.replica_groups.append(_ReplicaGroup(local, InputDist(group, pg, self.device), kernels, dense))
        self.dense_replicas = next((g.dense for g in self.replica_groups if g.dense), None)
        self.all_local = not self.sharded and all(g.local for g in self.replica_groups)
        # kernel -> (its DenseReplicas, index) where the optimizer state lives there, in pieces (sharded updates)
        self._state_owner = {id(k): (g.dense, i) for g in self.replica_groups if g.dense and g.dense.sharded
                             for i, k in enumerate(g.kernels)}
        self._staged: tuple[KeyedJaggedTensor, Distributed] | None = None
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

    @property
    def _grad_dtype(self) -> torch.dtype:
        """Wire dtype of output gradients (replicated look-ups send them back in it)."""
        return TORCH_DTYPES[self.comms.backward]

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

    def _prepare(self, features: KeyedJaggedTensor, pg: dist.ProcessGroup) -> tuple[Batch, Header, SplitBatch | None]:
        """Validate the local batch and start agreeing with every rank on batch sizes (a rank with a bad batch
        waits for it and raises, as every rank does on reading the header); with hot rows, the batch the inner
        tables see (hot ids moved to their replicas) and the split."""
        batch, error = check_batch(features, self.hot or self.routing, self.weighted, self.where)
        # all look-ups local: no rank needs another's batch size, only to know that none failed
        header = start_header(None if self.all_local else batch.batch_size if batch else 0, error, pg, self.device)
        if batch is None:
            header.result()  # raises
        assert batch is not None
        split = self.hot.split(batch) if self.hot is not None else None
        return (split.inner if split else batch), header, split

    def distribute(self, features: KeyedJaggedTensor, pg: dist.ProcessGroup | None = None) -> Distributed:
        """Validate, agree on batch sizes, then ship ids to shards and to every replica (per replica group), over
        ``pg`` (by default the collection's). A pipeline (pipeline.py) runs it for the next batch on a group and
        thread of its own, then `stage`s the result."""
        distributed = self._distribute(features, pg or self.pg)
        distributed.batch_sizes  # the header read here: raises here, on every rank, if a rank's batch is bad
        return distributed

    def _distribute(self, features: KeyedJaggedTensor, pg: dist.ProcessGroup) -> Distributed:
        """`distribute`, except that a collection whose look-ups are all local (data-parallel tables trained by an
        all-reduce, or forward-only replicas) leaves the header in flight: the forward reads it after its look-ups,
        which issue no collective, so its latency hides behind them."""
        batch, header, split = self._prepare(features, pg)
        received = self.input_dist(batch, header, pg) if self.sharded else None
        replicated = [g.dist.local(batch) if g.local else g.dist(batch, header, pg) for g in self.replica_groups]
        return Distributed(batch, header, received, replicated, split)

    def stage(self, features: KeyedJaggedTensor, distributed: Distributed) -> None:
        """The next forward, which must be of this very ``features`` object, uses ``distributed`` as its input dist."""
        self._staged = (features, distributed)

    def _distribute_and_look_up(self, features: KeyedJaggedTensor) -> tuple[Distributed, list[Tensor]]:
        """Input dist (unless staged) and the sharded kernels' look-ups: (the distributed batch, their outputs)."""
        staged, self._staged = self._staged, None
        assert staged is None or staged[0] is features, f"{self.where}: forward of another batch than the one staged"
        if staged is not None:
            d = staged[1]
        else:
            with self._phase("input_dist"):
                d = self._distribute(features, self.pg)
        with self._phase("lookup"):
            outs = self._look_up(self.kernels, d.received)
        return d, outs

    def _exchange_and_look_up_replicas(self, d: Distributed, exchange: Callable[[tuple[int, ...]], Tensor]):
        """(what ``exchange(batch sizes)``, the output dist's all-to-all, returns (None without sharded tables), the
        data-parallel kernels' look-ups per replica group, the batch sizes). The look-ups run after the all-to-all, so
        that backward reaches them before its backward (autograd runs the later of two ready nodes first): their
        gradient all-reduce starts before it and overlaps it and the sharded tables' backward. Without sharded
        tables they run before the header is read, in flight meanwhile."""
        if self.sharded:
            batch_sizes = self._batch_sizes(d)
            with self._phase("output_dist"):
                received = exchange(batch_sizes)
            replica_outs = self._look_up_replicas(d)
        else:
            replica_outs = self._look_up_replicas(d)
            received, batch_sizes = None, self._batch_sizes(d)
        for g in self.replica_groups:  # every rank's batch is good: the masks of the rows looked up may travel
            if g.dense:
                g.dense.start_mask()
        return received, replica_outs, batch_sizes

    def _look_up_replicas(self, d: Distributed) -> list[list[Tensor]]:
        with self._phase("lookup"):
            return [g.dense(x) if g.dense else self._look_up(g.kernels, x) for g, x in zip(self.replica_groups, d.replicated)]

    def _batch_sizes(self, d: Distributed) -> tuple[int, ...] | None:
        with self._phase("input_dist"):
            return d.batch_sizes  # raises on a bad batch (every rank does)

    def _replica_rows(self, replicated: list[Received], replica_outs: list[list[Tensor]],
                      batch_sizes: tuple[int, ...] | None) -> Tensor | None:
        """This rank's rows of the data-parallel features, replica groups side by side (pooled: [B, width],
        columns; sequence: flat). Replicated look-ups computed every rank's rows: keep this rank's (``batch_sizes``:
        None where all look-ups are local)."""
        parts = []
        for group, x, outs in zip(self.replica_groups, replicated, replica_outs):
            if self.pooled:
                rows, splits = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), batch_sizes
            else:
                rows, splits = by_source(outs, x.floats_per_source_kernel), [sum(c) for c in x.floats_per_source_kernel]
            parts.append(rows if group.local else local_part(rows, splits, self.pg, self._grad_dtype))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1 if self.pooled else 0)

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
            if id(kernel) in self._state_owner:  # gathered whole (a collective), or whole-table buffers to load
                owner, k = self._state_owner[id(kernel)]  # into (`_load_from_state_dict` hands them over)
                state = owner.table_state(k, i) if copy else owner.table_state_buffers(k, i)
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
                    self._hand_over_state(table, live, {})
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
                    self._hand_over_state(table, live, value.optimizer_state)
        known = {prefix + s.name for s in self.table_specs}
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and "." not in k[len(prefix):] and k not in known)

    def _hand_over_state(self, table: str, live: TableShard, loaded: Mapping[str, Tensor]) -> None:
        """Sharded updates: this rank's pieces of a table's loaded state go to its DenseReplicas (and adam's step)."""
        kernel, i, _ = self._blocks()[table]
        if id(kernel) in self._state_owner:
            owner, k = self._state_owner[id(kernel)]
            owner.load_table_state(k, i, live.optimizer_state)
            if "step" in loaded:
                kernel.step.copy_(loaded["step"])

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
        self.output_dist = PooledOutputDist(self.routing, pg, self.device, self.comms,
                                            plan.topology.local_world_size if plan.topology.reduces_in_host else None)
        features = self.hot.features if self.hot is not None else self.routing.features
        self._keys = [f.name for f in features]
        self._dims = [f.dim for f in features]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        d, outs = self._distribute_and_look_up(features)
        received, replica_outs, batch_sizes = self._exchange_and_look_up_replicas(
            d, lambda batch_sizes: self.output_dist.exchange(outs, d.batch, batch_sizes))
        with self._phase("output_dist"):
            replica_rows = self._replica_rows(d.replicated, replica_outs, batch_sizes)
            values = self.output_dist.assemble(received, replica_rows, d.batch)
            if d.split is not None:
                values = self.hot.join_pooled(values, d.split)
        return KeyedTensor(keys=self._keys, length_per_key=self._dims, values=values)


class ShardedEmbeddingCollection(_ShardedCollection):
    """Sequence tables (``pooled: false``) sharded by ``plan`` over ``pg``: one embedding per id."""

    def __init__(self, tables: Sequence[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *,
                 optimizer: OptimizerConfig | None = OptimizerConfig(), device: torch.device | None = None,
                 seed: int = 0, data_parallel_mode: str | None = None, hot_ids: Mapping[str, Any] | None = None) -> None:
        super().__init__(tables, plan, pg, pooled=False, pooling={}, weighted=False, optimizer=optimizer,
                         device=device, seed=seed, data_parallel_mode=data_parallel_mode, hot_ids=hot_ids)
        self.output_dist = SequenceOutputDist(self.routing, pg, self.device, self.comms)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        d, outs = self._distribute_and_look_up(features)
        flat, replica_outs, batch_sizes = self._exchange_and_look_up_replicas(
            d, lambda _: self.output_dist(outs, d.received, d.batch))
        with self._phase("output_dist"):
            out = self._per_feature(flat, self._replica_rows(d.replicated, replica_outs, batch_sizes), d.batch)
            return self.hot.join_sequence(out, d.split) if d.split is not None else out

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


@dataclass(frozen=True)
class _ReplicaGroup:
    """The data-parallel tables of one mode: local look-ups (``local``) or of the global batch."""

    local: bool
    dist: InputDist
    kernels: list[nn.Module]
    dense: DenseReplicas | None  # trained with an all-reduce


def _fingerprint(specs: Sequence[TableSpec], plan: ShardingPlan, modes: Mapping[str, str], hot_digest: str) -> int:
    """63-bit hash of the tables, their placements, data-parallel modes, wire dtypes and hot sets: ranks compare
    it before the first step."""
    text = repr([sorted(modes.items()), plan.topology.comms, hot_digest, *((s, plan.placement(s.name)) for s in specs)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
