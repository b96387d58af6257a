"""Hot-row replication cases, run by every rank of one spawned group (see rt_training.py).

Tables with ``hot_rows`` train as the unsharded reference does (forward, weights and optimizer
state after 5 steps), pooled and sequence, over row-, column- and table-wise shards; their
checkpoints (`state_dict`) hold each table once and load into another hot/cold split; forward-only
(serving) collections look hot ids up in their NAME@hot blocks (fp32, fp16, int8).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist

from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.runtime import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.hot_rows import HOT, hot_id_sets
from embshard.serving.quantize import quantize
from rt_inference import DTYPES, quantized_blocks
from rt_reference import global_batch, kjt
from rt_training import (MEAN_TABLES, MIXED_POOLED, MIXED_SEQUENCE, POOLED, SEQUENCE, _max_diff, _rank_slice, features_of,
                         make_batches, make_plan, make_reference, roundtrip_errors, topology, train)

ST = ShardingType


def with_hot_rows(plan: ShardingPlan, hot_rows: dict[str, int], seed: int) -> ShardingPlan:
    """``plan`` with these tables' hot rows, ranked by a seeded permutation written to this rank's own hot-ids file."""
    gen = torch.Generator().manual_seed(seed)
    ranking = {s.name: torch.randperm(s.num_embeddings, generator=gen).numpy() for s in plan.specs}
    fd, path = tempfile.mkstemp(suffix=".npz")
    os.close(fd)
    np.savez(path, **ranking)
    tables = tuple(dataclasses.replace(t, hot_rows=hot_rows.get(t.name, 0)) for t in plan.tables)
    return dataclasses.replace(plan, tables=tables, hot_ids_file=path)


def run_hot(specs, plan: ShardingPlan, pg: dist.ProcessGroup, **kwargs) -> dict[str, float]:
    sharded, _, _, errors = train(specs, plan, pg, **kwargs)
    errors["err_hot_split"] = float(sharded.hot is None or sharded.dense_replicas is None)
    errors["err_each_table_once"] = float(not set(sharded.state_dict()) <= {s.name for s in specs})
    return errors


def run_hot_checkpoint(plan: ShardingPlan, other_split: ShardingPlan, other_plan: ShardingPlan,
                       pg: dist.ProcessGroup) -> dict[str, float]:
    """Train with hot rows; the shards reassemble the reference's tables; they load into another split of
    the same shards (blocks and optimizer state) and into another plan (full tables), and step on as the
    reference does."""
    return roundtrip_errors(plan, other_plan, other_split, pg, seed=41)


def run_hot_serving(specs, plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool, weighted: bool = False) -> dict[str, float]:
    """Serving blocks: the plan's, plus NAME@hot = the quantized hot rows; the reference serves the hot rows' values."""
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    blocks, served = quantized_blocks(specs, plan, rank, seed=61)
    for name, ids in hot_id_sets(specs, plan, None, "test").items():
        block = quantize(served[name][ids], plan.spec(name).dtype)
        blocks[name + HOT] = (block.weight, block.scale_bias)
        served[name][ids] = block.dequantize()
    mean = pooled and not weighted
    pooling = {t: "mean" for t in MEAN_TABLES} if mean else {}
    collection = ShardedEmbeddingBagCollection(specs, plan, pg, pooling=pooling, weighted=weighted, optimizer=None) if pooled \
        else ShardedEmbeddingCollection(specs, plan, pg, optimizer=None)
    collection.load_quantized(blocks)
    ref = make_reference(specs, served, pooled, weighted, mean)
    feats = features_of(specs)
    worst = 0.0
    with torch.inference_mode():
        for batches in make_batches(specs, W, weighted, 62)[:2]:
            out = collection(kjt(batches[rank], feats, weighted))
            expected = _rank_slice(ref(kjt(global_batch(batches), feats, weighted)), batches, rank, feats, pooled)
            worst = max(worst, _max_diff(out, expected, pooled))
    return {"err_serving_forward": worst}


def cases(world_size: int) -> dict:
    topo = topology(world_size)
    pooled = with_hot_rows(make_plan(POOLED, topo, MIXED_POOLED), {"ta": 12, "tb": 9, "tc": 6}, seed=1)
    sequence = with_hot_rows(make_plan(SEQUENCE, topo, MIXED_SEQUENCE), {"sa": 11, "sc": 8, "sd": 13}, seed=2)
    row_wise = with_hot_rows(make_plan(SEQUENCE, topo, [ST.ROW_WISE] * len(SEQUENCE)),
                             {"sa": 5, "sb": 7, "sc": 3, "sd": 20}, seed=3)
    other_split = with_hot_rows(make_plan(POOLED, topo, MIXED_POOLED), {"ta": 3, "tc": 15}, seed=4)
    other_plan = with_hot_rows(make_plan(POOLED, topo, [ST.TABLE_WISE, ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE]),
                               {"tb": 20, "td": 30}, seed=5)
    served_pooled = [dataclasses.replace(s, dtype=d) for s, d in zip(POOLED, DTYPES)]
    served_sequence = [dataclasses.replace(s, dtype=d) for s, d in zip(SEQUENCE, DTYPES)]
    serving_pooled = with_hot_rows(make_plan(served_pooled, topo, MIXED_POOLED), {"ta": 12, "tb": 9, "tc": 6}, seed=6)
    serving_sequence = with_hot_rows(make_plan(served_sequence, topo, [ST.ROW_WISE] * 4), {"sa": 5, "sb": 7, "sd": 20}, seed=7)
    return {
        "hot-rows-serving-pooled-mean": lambda pg: run_hot_serving(served_pooled, serving_pooled, pg, pooled=True),
        "hot-rows-serving-pooled-weighted": lambda pg: run_hot_serving(served_pooled, serving_pooled, pg, pooled=True,
                                                                       weighted=True),
        "hot-rows-serving-sequence": lambda pg: run_hot_serving(served_sequence, serving_sequence, pg, pooled=False),
        "hot-rows-pooled-mean": lambda pg: run_hot(POOLED, pooled, pg, pooled=True, mean=True, seed=51),
        "hot-rows-pooled-weighted-mean": lambda pg: run_hot(POOLED, pooled, pg, pooled=True, weighted=True, mean=True,
                                                            seed=52),
        "hot-rows-sequence": lambda pg: run_hot(SEQUENCE, sequence, pg, pooled=False, seed=53),
        "hot-rows-sequence-row_wise": lambda pg: run_hot(SEQUENCE, row_wise, pg, pooled=False, seed=54, empty_ranks=True),
        "hot-rows-checkpoint": lambda pg: run_hot_checkpoint(pooled, other_split, other_plan, pg),
    }
