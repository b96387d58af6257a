"""Sharded weight updates of data-parallel tables (``topology.sharded_dp_update``): 10 steps against the
unsharded reference (data-parallel tables, hot-row replicas), each rank holding only its pieces' optimizer state, and a checkpoint that stores
every table whole and restores into the same sharding."""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from embshard.planner.types import ShardingType
from embshard.specs import piece_rows
from rt_hot_rows import with_hot_rows
from rt_training import (MIXED_POOLED, MIXED_SEQUENCE, ODD_POOLED, POOLED, SEQUENCE, compare_shards, make_collection,
                         make_plan, topology, train)

ST = ShardingType
STEPS = 10


def run_sharded(specs, plan, pg: dist.ProcessGroup, *, pooled: bool, **kwargs) -> dict[str, float]:
    sharded, ref, ref_opt, errors = train(specs, plan, pg, pooled=pooled, steps=STEPS,
                                          data_parallel_mode=None if plan.hot_ids_file else "allreduce", **kwargs)
    dense, W = sharded.dense_replicas, dist.get_world_size(pg)
    # each rank keeps the state of its pieces only: rank r's rows of every table, optimizer state per row or element
    held = sum(t.shape[0] for state in dense.piece_state.values() for t in state.values())
    states = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2}
    replicated = [(s.num_embeddings if plan.placement(s.name).sharding_type is ST.DATA_PARALLEL
                   else plan.placement(s.name).hot_rows, s.optimizer) for s in specs]  # whole tables, hot rows
    expected = sum(piece_rows(n, W)[dense.rank] * states[opt] for n, opt in replicated)
    errors["err_state_rows"] = float(held != expected or not dense.sharded)
    # checkpoint: whole tables (state gathered); restored into a fresh collection of the same plan, it saves the same
    restored = make_collection(specs, plan, pg, pooled, kwargs.get("weighted", False), kwargs.get("mean", False),
                               None if plan.hot_ids_file else "allreduce")
    restored.load_state_dict(sharded.state_dict())
    errors["err_restored"] = compare_shards(restored, ref, ref_opt, specs)["err_optimizer_state"]
    return errors


def cases(world_size: int) -> dict:
    topo = dataclasses.replace(topology(world_size), sharded_dp_update=True)
    dp_pooled = make_plan(POOLED, topo, [ST.DATA_PARALLEL] * len(POOLED))  # one table per optimizer, fbgemm and torch kernels
    odd_pooled = make_plan(ODD_POOLED, topo, [ST.DATA_PARALLEL] * len(ODD_POOLED))  # torch kernels (odd widths)
    mixed_sequence = make_plan(SEQUENCE, topo, MIXED_SEQUENCE)  # beside sharded tables
    hot = with_hot_rows(make_plan(POOLED, topo, MIXED_POOLED), {"ta": 12, "tb": 9, "tc": 6}, seed=1)  # hot replicas too
    return {
        "sharded-update-pooled-weighted": lambda pg: run_sharded(POOLED, dp_pooled, pg, pooled=True, weighted=True, seed=61),
        "sharded-update-odd-pooled-mean": lambda pg: run_sharded(ODD_POOLED, odd_pooled, pg, pooled=True, mean=True, seed=62,
                                                                 empty_ranks=True),
        "sharded-update-mixed-sequence": lambda pg: run_sharded(SEQUENCE, mixed_sequence, pg, pooled=False, seed=63),
        "sharded-update-hot-rows-pooled": lambda pg: run_sharded(POOLED, hot, pg, pooled=True, seed=64),
    }
