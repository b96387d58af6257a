"""Hot-row replication (FlexShard): a table's hottest rows replicated on every rank and looked
up locally, its other rows sharded as the plan says.

A placement with ``hot_rows = h`` names the table's h hottest ids (the first h of the plan's
``hot_ids_file`` ranking, written by ``embshard-stats hot_ids=``). The collection then runs
on an *inner* plan: the table as planned (its cold ids keep their row numbers, so its shards
and the plan's are the same; the hot rows' copies there are never looked up) plus a
data-parallel table ``NAME@hot`` of h rows, whose feature ``F@hot`` gets the hot ids remapped
to their rank in the sorted hot set. Data-parallel tables train in "allreduce" mode
(dense_replicas.py): every rank looks up its own hot ids, and the replicas' gradients are
all-reduced every step before their update, so every replica stays identical -- hot ids
never travel. Outputs are put back together per feature: pooled bags add the two partial
sums (then mean pooling divides by the whole bag's length); sequence rows go back to their
ids' positions.

Checkpoints hold each table once: `merge_shards` writes the replica's rows (and optimizer
state) into the table's shards, and `replica_from_shards` rebuilds the replica from any
rank's blocks (one all-reduce), so a checkpoint loads into any other hot/cold split.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torchrec.sparse.jagged_tensor import JaggedTensor

from embshard.planner.plan import Replicas, ShardingPlan, TablePlacement
from embshard.planner.types import COMPUTE_KERNEL, ShardingType
from embshard.runtime.features import Batch
from embshard.runtime.routing import FeatureInfo
from embshard.runtime.state import TableShard
from embshard.specs import TableSpec
from embshard.stats.hot_ids import read_hot_ids

HOT = "@hot"


def hot_tables(specs: Sequence[TableSpec], plan: ShardingPlan) -> dict[str, int]:
    """table -> its planned number of hot rows, for the tables of ``specs`` that have any."""
    return {s.name: plan.placement(s.name).hot_rows for s in specs if plan.placement(s.name).hot_rows}


def hot_id_sets(specs: Sequence[TableSpec], plan: ShardingPlan, ranking: Mapping[str, np.ndarray | Tensor] | None,
                where: str) -> dict[str, Tensor]:
    """table -> its hot ids, sorted (the first ``hot_rows`` of its ranking); ``ranking`` None: the plan's file."""
    wanted = hot_tables(specs, plan)
    if not wanted:
        return {}
    if ranking is None:
        if not plan.hot_ids_file:
            raise ValueError(f"{where}: tables {sorted(wanted)} have hot_rows but the plan names no hot_ids_file; "
                             "plan with hot_ids=PATH (from embshard-stats hot_ids=PATH) or pass hot_ids=")
        ranking = read_hot_ids(plan.hot_ids_file, where)
    out = {}
    for name, h in wanted.items():
        if name not in ranking:
            raise ValueError(f"{where}: table {name!r} has hot_rows={h} but the hot ids hold no ranking for it "
                             f"(they have {sorted(ranking)}); re-run embshard-stats hot_ids= on these tables")
        ids = torch.as_tensor(np.asarray(ranking[name]), dtype=torch.int64)[:h]
        rows = plan.spec(name).num_embeddings
        if ids.numel() < h or ids.unique().numel() != h or int(ids.min()) < 0 or int(ids.max()) >= rows:
            raise ValueError(f"{where}: table {name!r} needs {h} distinct hot ids in [0, {rows}), its ranking has "
                             f"{ids.unique().numel()} distinct of {ids.numel()}; re-run embshard-stats hot_ids= with "
                             "the plan's tables, or plan again")
        out[name] = ids.sort().values
    return out


def hot_ids_digest(hot_ids: Mapping[str, Tensor]) -> str:
    """A hash of the hot sets: ranks compare it (with the plan) before the first step."""
    h = hashlib.sha256()
    for name in sorted(hot_ids):
        h.update(name.encode())
        h.update(hot_ids[name].numpy().tobytes())
    return h.hexdigest()


def inner_plan(specs: Sequence[TableSpec], plan: ShardingPlan, hot_ids: Mapping[str, Tensor]) -> tuple[tuple[TableSpec, ...], ShardingPlan]:
    """The specs and plan the collection runs: every table as planned, plus NAME@hot (data-parallel) per hot table."""
    hot_specs = tuple(dataclasses.replace(s, name=s.name + HOT, num_embeddings=hot_ids[s.name].numel(),
                                          feature_names=tuple(f + HOT for f in s.feature_names), hot_rows=None)
                      for s in specs if s.name in hot_ids)
    dp = ShardingType.DATA_PARALLEL
    placements = tuple(dataclasses.replace(plan.placement(s.name), hot_rows=0) for s in specs) + tuple(
        TablePlacement(s.name, dp, COMPUTE_KERNEL[dp], Replicas(plan.topology.world_size, s.num_embeddings, s.embedding_dim),
                       data_parallel_mode="allreduce")
        for s in hot_specs)
    all_specs = tuple(specs) + hot_specs
    return all_specs, ShardingPlan(placements, all_specs, plan.topology, plan.ranks, plan.lower_bound_ms, plan.input_hash)


@dataclasses.dataclass(frozen=True)
class SplitBatch:
    """The inner batch, and how to put the outputs back: per hot feature, each output row's index in [cold; hot]."""

    inner: Batch
    outer: Batch
    positions: Mapping[int, Tensor]  # sequence: outer feature -> permutation of its rows


class HotRows:
    """Splits a collection's batches between its tables and their hot replicas, and joins the outputs."""

    def __init__(self, specs: Sequence[TableSpec], hot_ids: Mapping[str, Tensor], pooled: bool,
                 pooling: Mapping[str, str], device: torch.device) -> None:
        self.pooled, self.device = pooled, device
        self.hot_ids = {t: ids.to(device) for t, ids in hot_ids.items()}
        col = 0
        features = []
        for s in specs:
            for f in s.feature_names:
                features.append(FeatureInfo(f, s.name, s.num_embeddings, s.embedding_dim, col, False,
                                            pooling.get(s.name, "sum") == "mean"))
                col += s.embedding_dim
        self.features = tuple(features)  # the outer features, what the caller's batch holds (check_batch)
        self.hot_features = [i for i, f in enumerate(features) if f.table in hot_ids]
        # hot tables pool by sum on both sides; their mean is taken here, over the whole bag
        self.inner_pooling = {t: m for t, m in pooling.items() if t not in hot_ids}
        self.mean_after = [i for i in self.hot_features if features[i].mean]

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    def split(self, batch: Batch) -> SplitBatch:
        """Hot ids of each hot feature move to its F@hot feature, remapped to rows of the replica."""
        F, B = len(self.features), batch.batch_size
        lengths_FB, values = batch.lengths_FB, batch.values_N
        counts_F = lengths_FB.view(F, B).sum(1)
        starts_F = (torch.cumsum(counts_F, 0) - counts_F).tolist()
        counts = counts_F.tolist()
        hot_N = torch.zeros(values.numel(), dtype=torch.bool, device=values.device)
        rows_N = values.clone()
        for i in self.hot_features:
            ids = self.hot_ids[self.features[i].table]
            seg = values[starts_F[i]:starts_F[i] + counts[i]]
            where = torch.searchsorted(ids, seg).clamp(max=ids.numel() - 1)
            hit = ids.index_select(0, where) == seg
            hot_N[starts_F[i]:starts_F[i] + counts[i]] = hit
            rows_N[starts_F[i]:starts_F[i] + counts[i]] = torch.where(hit, where, seg)
        bag_N = torch.repeat_interleave(torch.arange(F * B, device=values.device), lengths_FB, output_size=values.numel())
        cold_lengths = torch.bincount(bag_N[~hot_N], minlength=F * B)
        hot_lengths = torch.bincount(bag_N[hot_N], minlength=F * B).view(F, B)[self.hot_features].reshape(-1)
        weights = batch.weights_N
        inner = Batch(torch.cat([cold_lengths, hot_lengths]), torch.cat([rows_N[~hot_N], rows_N[hot_N]]),
                      None if weights is None else torch.cat([weights[~hot_N], weights[hot_N]]), B)
        positions = {}
        if not self.pooled:
            for i in self.hot_features:
                hit = hot_N[starts_F[i]:starts_F[i] + counts[i]]
                num_cold = counts[i] - int(hit.sum())
                positions[i] = torch.where(hit, num_cold + torch.cumsum(hit, 0) - 1, torch.cumsum(~hit, 0) - 1)
        return SplitBatch(inner, batch, positions)

    def join_pooled(self, values_BD: Tensor, split: SplitBatch) -> Tensor:
        """[B, inner widths] (outer features, then F@hot ones) -> [B, outer widths]."""
        dims = [f.dim for f in self.features]
        parts = list(values_BD.split(dims + [dims[i] for i in self.hot_features], dim=1))
        F, B = len(self.features), split.outer.batch_size
        lengths_FB = split.outer.lengths_FB.view(F, B)
        for j, i in enumerate(self.hot_features):
            parts[i] = parts[i] + parts[F + j]
            if i in self.mean_after:
                parts[i] = parts[i] / lengths_FB[i].clamp(min=1).to(parts[i].dtype).unsqueeze(1)
        return torch.cat(parts[:F], dim=1)

    def join_sequence(self, out: Mapping[str, JaggedTensor], split: SplitBatch) -> dict[str, JaggedTensor]:
        B = split.outer.batch_size
        joined = {}
        for i, f in enumerate(self.features):
            lengths = split.outer.lengths_FB[i * B:(i + 1) * B]
            if i not in split.positions:
                joined[f.name] = out[f.name]
                continue
            rows = torch.cat([out[f.name].values(), out[f.name + HOT].values()]).index_select(0, split.positions[i])
            joined[f.name] = JaggedTensor(values=rows, lengths=lengths)
        return joined

    # ---- checkpoints: each table once ----------------------------------------------------
    def merge_shards(self, shards: Mapping[str, TableShard]) -> dict[str, TableShard]:
        """This rank's shards with the replica's rows (and state) written into the hot rows they hold; no NAME@hot."""
        out = {}
        for name, shard in shards.items():
            if name.endswith(HOT):
                continue
            replica = shards.get(name + HOT)
            if replica is not None:
                ids = self.hot_ids[name].to(shard.weight.device)
                mine = ids[(ids >= shard.row_offset) & (ids < shard.row_offset + shard.weight.shape[0])]
                local = mine - shard.row_offset
                index = torch.searchsorted(ids, mine)
                cols = shard.cols
                shard.weight[local] = replica.weight[index][:, cols]
                for key, value in shard.optimizer_state.items():
                    if value.dim() == 2:
                        value[local] = replica.optimizer_state[key][index][:, cols]
                    elif value.dim() == 1:
                        value[local] = replica.optimizer_state[key][index]
            out[name] = shard
        return out

    def replica_from_shards(self, name: str, shards: Mapping[str, TableShard | Tensor], live: TableShard,
                            pg: dist.ProcessGroup) -> tuple[Tensor, dict[str, Tensor]]:
        """The replica's weights and state from the table's blocks on every rank (collective: one all-reduce),
        or from a full table (weights only). Per-row state of column blocks: their mean, weighted by width."""
        ids = self.hot_ids[name]
        value = shards.get(name)
        if isinstance(value, Tensor):
            return value.to(self.device).index_select(0, ids), {}
        h, D = live.weight.shape
        parts = {"weight": torch.zeros(h, D, device=self.device)}
        for key, tensor in live.optimizer_state.items():
            if tensor.dim():
                parts[key] = torch.zeros(tuple(tensor.shape), device=self.device)
        if isinstance(value, TableShard):
            hit = (ids >= value.row_offset) & (ids < value.row_offset + value.weight.shape[0])
            index, local = hit.nonzero().squeeze(1), ids[hit] - value.row_offset
            parts["weight"][index, value.col_offset:value.col_offset + value.weight.shape[1]] = \
                value.weight.to(self.device).float().index_select(0, local)
            for key, tensor in value.optimizer_state.items():
                if key not in parts:
                    continue
                block = tensor.to(self.device).float().index_select(0, local)
                if tensor.dim() == 2:
                    parts[key][index, value.col_offset:value.col_offset + value.weight.shape[1]] = block
                else:
                    parts[key][index] = block * (value.weight.shape[1] / D)
        flat = torch.cat([t.reshape(-1) for t in parts.values()])
        dist.all_reduce(flat, group=pg)
        reduced = dict(zip(parts, flat.split([t.numel() for t in parts.values()])))
        weight = reduced.pop("weight").view(h, D)
        state = {k: v.view_as(parts[k]) for k, v in reduced.items()}
        if "step" in live.optimizer_state:  # adam's update count: the same on every block that has one
            step = value.optimizer_state["step"] if isinstance(value, TableShard) else torch.zeros((), dtype=torch.int64)
            step = step.to(self.device, copy=True)  # (nccl reduces device tensors only)
            dist.all_reduce(step, op=dist.ReduceOp.MAX, group=pg)
            state["step"] = step.cpu()
        return weight, state
