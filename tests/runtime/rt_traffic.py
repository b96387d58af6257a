"""Byte-exactness cases: one training step of a sharded collection under the runtime's
traffic counter (embshard.runtime.comm.counting_traffic) against the cost model's bytes
(embshard.planner.cost.traffic.rank_traffic_bytes), per rank and link class.

Random plans over every sharding type, pooled and sequence, both data-parallel modes (and sharded
weight updates). The
batches are what the model assumes, exactly: B bags per rank, every bag pooling_factor ids
long, and each rank's ids of a feature hit every row equally often (B * P is a multiple
of N: a shuffled copy of all rows), so a row shard with n of N rows gets n/N of them.
"""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.planner.cost.traffic import rank_traffic_bytes
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.comm import counting_traffic
from embshard.specs import TableSpec
from embshard.topology import Topology
from rt_training import make_plan

B, P, N = 4, 4, 16  # B * P = N: each rank's ids of a feature are every row once
SEEDS = (0, 1, 2, 3)
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


def run_traffic(specs: list[TableSpec], types: list[ShardingType], pg: dist.ProcessGroup, seed: int) -> dict:
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    topo = traffic_topology(W)
    if seed % 2:
        topo = dataclasses.replace(topo, replicated_dp_lookup=True)
    elif seed == 2:  # sharded weight updates: a reduce-scatter and an all-gather instead of the all-reduce
        topo = dataclasses.replace(topo, sharded_dp_update=True)
    plan = make_plan(specs, topo, types)
    cls = ShardedEmbeddingBagCollection if specs[0].pooled else ShardedEmbeddingCollection
    collection = cls(specs, plan, pg, optimizer=OptimizerConfig(learning_rate=0.01))
    with counting_traffic(pg, topo.local_world_size) as counter:
        out = collection(batch(specs, rank, seed))
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
    return out
