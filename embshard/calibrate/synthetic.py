"""Synthetic inputs for measurement: batches drawn from table specs, and random layouts.

Batches follow what the cost model assumes: every feature of a table has on average
``pooling_factor`` ids per sample (bag lengths floor(2 P u + v), u, v uniform, so the mean is
exactly P) and ids are uniform over the table's rows.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Sequence

from embshard.planner.api import evaluate, manual_plan
from embshard.planner.plan import ShardingPlan
from embshard.planner.splits import col_splits, row_splits
from embshard.planner.types import ShardingType
from embshard.specs import TableSpec, dp_allreduce_floats_per_row
from embshard.topology import Topology

if TYPE_CHECKING:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def synthetic_batch(specs: Sequence[TableSpec], batch_size: int, generator: "torch.Generator") -> "KeyedJaggedTensor":
    """One local batch for the features of ``specs`` (in spec order)."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys, lengths, values = [], [], []
    for s in specs:
        for f in s.feature_names:
            u, v = torch.rand(batch_size, generator=generator), torch.rand(batch_size, generator=generator)
            n = torch.floor(2 * s.pooling_factor * u + v).to(torch.int64)
            keys.append(f)
            lengths.append(n)
            values.append(torch.randint(0, s.num_embeddings, (int(n.sum()),), generator=generator))
    return KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


def allowed_types(spec: TableSpec, world_size: int, max_dp_rows: int) -> list[ShardingType]:
    """Layouts the runtime can run for this table on one host of ``world_size`` ranks."""
    types = [ShardingType.TABLE_WISE]
    if row_splits(spec.num_embeddings, world_size) is not None and spec.num_embeddings >= 4 * world_size:
        types.append(ShardingType.ROW_WISE)
    if spec.embedding_dim % 4 == 0 and col_splits(spec.embedding_dim, 2) is not None:
        types.append(ShardingType.COLUMN_WISE)
    if spec.num_embeddings <= max_dp_rows:
        types.append(ShardingType.DATA_PARALLEL)
    return types


def random_plan(specs: Sequence[TableSpec], topology: Topology, seed: int, max_dp_rows: int = 20_000) -> ShardingPlan:
    """A random runnable layout: each table gets a random type and random ranks (a single host).

    Row- and column-wise tables use a random number of shards (2..world size); data_parallel
    is offered only to tables of at most ``max_dp_rows`` rows (a replica is all-reduced whole).
    """
    rng = random.Random(seed)
    W = topology.world_size
    layout = {}
    for spec in specs:
        stype = rng.choice(allowed_types(spec, W, max_dp_rows))
        if stype is ShardingType.TABLE_WISE:
            ranks = [rng.randrange(W)]
        elif stype is ShardingType.DATA_PARALLEL:
            ranks = []
        else:
            limit = W if stype is ShardingType.ROW_WISE else min(W, spec.embedding_dim // 4)
            k = rng.randint(2, limit)
            ranks = rng.sample(range(W), k)
            if stype is ShardingType.ROW_WISE:
                ranks.sort()
        layout[spec.name] = (stype, ranks)
    return manual_plan(specs, topology, layout)


def bench_tables(num_tables: int, seed: int, max_rows: int = 200_000, max_pooling: float = 40.0,
                 sequence_fraction: float = 0.0) -> tuple[TableSpec, ...]:
    """generate_tables(num_tables, seed) scaled to fit a CPU machine: rows capped at max_rows
    and pooling factors at max_pooling (the generator's tails reach 4e7 rows and 500 ids)."""
    import dataclasses

    from embshard.workloads import generate_tables

    return tuple(dataclasses.replace(s, num_embeddings=min(s.num_embeddings, max_rows), pooling_factor=min(s.pooling_factor, max_pooling))
                 for s in generate_tables(num_tables, seed=seed, sequence_fraction=sequence_fraction))


def host_reduce_plan(specs: Sequence[TableSpec], topology: Topology, seed: int) -> ShardingPlan:
    """A random layout of pooled tables where the in-host reduction has work: each table row_wise over all
    ranks or table_row_wise over one host's ranks (where its rows allow), else table_wise on a random rank.
    ``topology`` has two or more hosts (run on local ranks for the CPU work, embshard.calibrate.calibrate)."""
    rng = random.Random(seed)
    W, L = topology.world_size, topology.local_world_size
    layout = {}
    for spec in specs:
        if spec.num_embeddings < 4 * W or row_splits(spec.num_embeddings, W) is None:
            layout[spec.name] = (ShardingType.TABLE_WISE, [rng.randrange(W)])
        elif rng.random() < 0.5:
            layout[spec.name] = (ShardingType.ROW_WISE, list(range(W)))
        else:
            host = rng.randrange(W // L)
            layout[spec.name] = (ShardingType.TABLE_ROW_WISE, list(range(host * L, (host + 1) * L)))
    return manual_plan(specs, topology, layout)


def dp_hier_plan(specs: Sequence[TableSpec], topology: Topology, seed: int, max_buffer_bytes: float = 16e6) -> ShardingPlan:
    """A random data-parallel layout for the hierarchical all-reduce: 1..all of the pooled ``specs``, every one
    data-parallel and trained by all-reduce (whichever mode is cheaper), rows scaled so that their
    gradient buffer is a random size up to max_buffer_bytes (fp32). ``topology`` has two or more hosts."""
    import dataclasses

    rng = random.Random(seed)
    pooled = [s for s in specs if s.pooled]
    chosen = pooled[:rng.randint(1, len(pooled))]
    per_table = rng.uniform(0.05, 1.0) * max_buffer_bytes / len(chosen)
    scaled = [dataclasses.replace(s, num_embeddings=max(64, int(per_table / (4 * dp_allreduce_floats_per_row(s.optimizer, s.embedding_dim)))))
              for s in chosen]
    p = manual_plan(scaled, topology, {s.name: (ShardingType.DATA_PARALLEL, range(topology.world_size)) for s in scaled})
    return evaluate(p.specs, topology, [dataclasses.replace(t, data_parallel_mode="allreduce") for t in p.tables])
