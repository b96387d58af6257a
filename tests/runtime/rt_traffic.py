"""Byte-exactness cases: one training step of a sharded collection under the runtime's
traffic counter (embshard.runtime.comm.counting_traffic) against the cost model's bytes
(embshard.planner.cost.traffic.rank_traffic_bytes), per rank and link class.

Random plans over every sharding type, pooled and sequence, both data-parallel modes (and sharded
weight updates). The
batches are what the model assumes, exactly: B bags per rank, every bag pooling_factor ids
long, and each rank's ids of a feature hit every row equally often (B * P is a multiple
of N: a shuffled copy of all rows), so a row shard with n of N rows gets n/N of them.

Hot rows (``traffic-hot-*``): the same plans with HOT_ROWS hot rows in every sharded table
(the replica's all-reduce, the cold part's all-to-alls). The batches are again what the model
assumes: the table's measured curve sends HOT_SHARE of its lookups to the hot rows (each
rank's ids of a feature: every row once, a hot row's lookup moved to a cold row of its
shard, then HOT_SHARE x B x HOT_P ids spread evenly over the hot rows), so the cold part is
the table at pooling factor HOT_P (1 - HOT_SHARE) and a row shard with n of N rows gets
n/N of its ids.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.planner.cost.traffic import rank_traffic_bytes
from embshard.planner.plan import ShardingPlan, TablePlacement
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.comm import counting_traffic
from embshard.specs import TableSpec
from embshard.topology import Topology
from rt_training import make_plan

B, P, N = 4, 4, 16  # B * P = N: each rank's ids of a feature are every row once
SEEDS = (0, 1, 2, 3)
HOT_ROWS, HOT_P, HOT_SHARE = 4, 8, 0.5  # B * HOT_P = 2 N: every row once, plus N lookups of the hot rows
FIELDS = ("intra_host_sent", "intra_host_received", "inter_host_sent", "inter_host_received")


HOSTS_OF = {4: 2, 6: 2}  # 2 hosts x 2 ranks, 2 hosts x 3 ranks; other world sizes: one host


def traffic_topology(world_size: int) -> Topology:
    return Topology(world_size=world_size, local_world_size=world_size // HOSTS_OF.get(world_size, 1), device="cpu",
                    batch_size_per_rank=B)


def random_specs(seed: int, pooled: bool) -> tuple[list[TableSpec], list[ShardingType]]:
    rng = random.Random(seed * 2 + pooled)
    types = list(ShardingType)
    rng.shuffle(types)  # every sharding type once, in a random order, plus one more at random
    types.append(rng.choice(list(ShardingType)))
    specs = [TableSpec(f"t{i}", N, rng.choice((4, 8)) if pooled else 8, pooling_factor=P, pooled=pooled,
                       feature_names=tuple(f"t{i}f{j}" for j in range(rng.choice((1, 2)))), optimizer="sgd")
             for i in range(len(types))]
    return specs, types


def batch(specs: list[TableSpec], rank: int, seed: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    features = [f for s in specs for f in s.feature_names]
    return KeyedJaggedTensor(keys=features, values=torch.cat([torch.randperm(N, generator=gen) for _ in features]),
                             lengths=torch.full((B * len(features),), P, dtype=torch.int64))


def hot_ids_of(placement: TablePlacement) -> list[int]:
    """HOT_ROWS hot rows, none first in its row shard, no two adjacent: row r - 1 is a cold row of r's shard."""
    starts = {s.row_offset for s in placement.shards}
    hot: list[int] = []
    for r in range(1, N):
        if len(hot) < HOT_ROWS and r not in starts and r - 1 not in hot:
            hot.append(r)
    assert len(hot) == HOT_ROWS, (placement, hot)
    return hot


def with_hot_rows(specs: list[TableSpec], plan: ShardingPlan) -> tuple[list[TableSpec], ShardingPlan, dict[str, list[int]]]:
    """Every sharded table with HOT_ROWS hot rows taking HOT_SHARE of its lookups (its measured curve), at HOT_P."""
    sharded = {t.name for t in plan.tables if t.sharding_type is not ShardingType.DATA_PARALLEL}
    specs = [dataclasses.replace(s, pooling_factor=HOT_P, hot_rows=((HOT_ROWS / N, HOT_SHARE),) if s.name in sharded else None)
             for s in specs]
    tables = tuple(dataclasses.replace(t, hot_rows=HOT_ROWS if t.name in sharded else 0) for t in plan.tables)
    hot = {t.name: hot_ids_of(t) for t in plan.tables if t.name in sharded}
    return specs, dataclasses.replace(plan, tables=tables, specs=tuple(specs)), hot


def hot_batch(specs: list[TableSpec], hot: dict[str, list[int]], rank: int, seed: int) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    values = []
    for s in specs:
        rows = torch.arange(N)
        if s.name in hot:
            ids = torch.tensor(hot[s.name])
            rows[ids] = ids - 1  # the cold part: every row once, hot rows' lookups on their cold neighbour
            extra = ids.repeat(N // HOT_ROWS)  # the hot part: HOT_SHARE of B * HOT_P
        else:
            extra = torch.arange(N)  # data-parallel: every row twice
        for _ in s.feature_names:
            both = torch.cat([rows, extra])
            values.append(both[torch.randperm(both.numel(), generator=gen)])
    features = [f for s in specs for f in s.feature_names]
    return KeyedJaggedTensor(keys=features, values=torch.cat(values), lengths=torch.full((B * len(features),), HOT_P, dtype=torch.int64))


def run_traffic(specs: list[TableSpec], types: list[ShardingType], pg: dist.ProcessGroup, seed: int,
                hot_rows: bool = False, flat: bool = False) -> dict:
    """flat: topology.reduce_in_host off (no in-host reduction, a ring all-reduce)."""
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    topo = dataclasses.replace(traffic_topology(W), reduce_in_host=not flat)
    if seed % 2:
        topo = dataclasses.replace(topo, replicated_dp_lookup=True)
    elif seed == 2:  # sharded weight updates: a reduce-scatter and an all-gather instead of the all-reduce
        topo = dataclasses.replace(topo, sharded_dp_update=True)
    plan = make_plan(specs, topo, types)
    hot: dict[str, list[int]] = {}
    if hot_rows:
        specs, plan, hot = with_hot_rows(specs, plan)
    cls = ShardedEmbeddingBagCollection if specs[0].pooled else ShardedEmbeddingCollection
    collection = cls(specs, plan, pg, optimizer=OptimizerConfig(learning_rate=0.01),
                     hot_ids={t: np.array(ids + [r for r in range(N) if r not in ids]) for t, ids in hot.items()})
    assert (collection.hot is not None) == hot_rows
    with counting_traffic(pg, topo.local_world_size) as counter:
        out = collection(hot_batch(specs, hot, rank, seed) if hot_rows else batch(specs, rank, seed))
        values = out.values() if specs[0].pooled else torch.cat([jt.values() for jt in out.values()])
        (values * values).sum().backward()
    predicted = rank_traffic_bytes(specs, topo, plan.tables)[rank]
    counted = counter.bytes
    result = {f"err_{f}": abs(getattr(counted, f) - getattr(predicted, f)) for f in FIELDS}
    result.update({f"counted_{f}": getattr(counted, f) for f in FIELDS})
    result.update({f"predicted_{f}": getattr(predicted, f) for f in FIELDS})
    return result


def cases(world_size: int) -> dict:
    out = {}
    for seed in SEEDS if world_size <= 4 else SEEDS[:2]:  # 2 hosts x 3 ranks: one seed per data-parallel mode
        for pooled in (True, False):
            specs, types = random_specs(seed, pooled)
            out[f"traffic-{'pooled' if pooled else 'sequence'}-{seed}"] = (
                lambda pg, s=specs, t=types, seed=seed: run_traffic(s, t, pg, seed))
    for seed, pooled in ((0, True), (1, False)):  # hot rows beside either data-parallel mode
        specs, types = random_specs(seed, pooled)
        out[f"traffic-hot-{'pooled' if pooled else 'sequence'}-{seed}"] = (
            lambda pg, s=specs, t=types, seed=seed: run_traffic(s, t, pg, seed, hot_rows=True))
    if world_size in HOSTS_OF:  # ranks on two hosts: the flat collectives are counted as the model prices them too
        specs, types = random_specs(0, True)
        out["traffic-pooled-flat-0"] = lambda pg: run_traffic(specs, types, pg, 0, flat=True)
    return out
