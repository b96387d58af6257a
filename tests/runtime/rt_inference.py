"""Forward-only (serving) collections, run by every rank of one spawned group.

Each case quantizes every block of a plan (tables in fp32, fp16 and int8 side by side),
loads this rank's blocks with `load_quantized`, and compares the forward output on its
slice with TorchRec's unsharded collection holding the dequantized blocks, fed the global
batch: every sharding type, pooled (sum, mean, weighted) and sequence, and collections of
data-parallel tables only (looked up locally: no all-to-all at all).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.runtime import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.serving.quantize import quantize
from embshard.specs import TableSpec
from rt_reference import full_tables, global_batch, kjt
from rt_training import (MEAN_TABLES, MIXED_POOLED, MIXED_SEQUENCE, ODD_POOLED, ODD_SEQUENCE, POOLED, SEQUENCE, _max_diff, _rank_slice, features_of, make_batches, make_plan,
                         make_reference, topology)

ST = ShardingType
DTYPES = ("fp32", "int8", "fp16", "int8")  # per table, in spec order


def quantized_blocks(specs: list[TableSpec], plan: ShardingPlan, rank: int, seed: int):
    """(this rank's blocks for load_quantized, full tables holding every block's dequantized values)."""
    tables = full_tables(specs, seed)
    mine, served = {}, {}
    for spec in specs:
        placement = plan.placement(spec.name)
        full = torch.empty_like(tables[spec.name])
        for shard in placement.shards:
            rows = slice(shard.row_offset, shard.row_offset + shard.num_rows)
            cols = slice(shard.col_offset, shard.col_offset + shard.num_cols)
            block = quantize(tables[spec.name][rows, cols], spec.dtype)
            full[rows, cols] = block.dequantize()
            if shard.rank == rank:
                mine[spec.name] = (block.weight, block.scale_bias)
        served[spec.name] = full
    return mine, served


def run_serving(specs: list[TableSpec], plan: ShardingPlan, pg: dist.ProcessGroup, *, pooled: bool,
                weighted: bool = False, mean: bool = False, seed: int = 0, empty_ranks: bool = False) -> dict[str, float]:
    rank, W = dist.get_rank(pg), dist.get_world_size(pg)
    blocks, served = quantized_blocks(specs, plan, rank, seed)
    pooling = {t: "mean" for t in MEAN_TABLES} if mean else {}
    if pooled:
        collection = ShardedEmbeddingBagCollection(specs, plan, pg, pooling=pooling, weighted=weighted, optimizer=None)
    else:
        collection = ShardedEmbeddingCollection(specs, plan, pg, optimizer=None)
    collection.load_quantized(blocks)
    ref = make_reference(specs, served, pooled, weighted, mean)
    feats = features_of(specs)
    worst = 0.0
    with torch.inference_mode():
        for batches in make_batches(specs, W, weighted, seed, empty_ranks)[:2]:
            out = collection(kjt(batches[rank], feats, weighted))
            expected = _rank_slice(ref(kjt(global_batch(batches), feats, weighted)), batches, rank, feats, pooled)
            worst = max(worst, _max_diff(out, expected, pooled))
    return {"err_serving_forward": worst, "held_bytes": float(collection.memory_bytes())}


def cases(world_size: int) -> dict:
    topo = topology(world_size)
    pooled = [dataclasses.replace(s, dtype=d) for s, d in zip(POOLED, DTYPES)]
    sequence = [dataclasses.replace(s, dtype=d) for s, d in zip(SEQUENCE, DTYPES)]
    plans = {
        "pooled-a": (pooled, make_plan(pooled, topo, [ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE, ST.DATA_PARALLEL])),
        "pooled-b": (pooled, make_plan(pooled, topo, [ST.TABLE_ROW_WISE, ST.TABLE_COLUMN_WISE, ST.DATA_PARALLEL,
                                                      ST.TABLE_WISE])),
        "sequence-a": (sequence, make_plan(sequence, topo, [ST.TABLE_ROW_WISE, ST.DATA_PARALLEL, ST.TABLE_COLUMN_WISE,
                                                            ST.TABLE_WISE])),
        "sequence-b": (sequence, make_plan(sequence, topo, [ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE,
                                                            ST.DATA_PARALLEL])),
        "pooled-replicas": (pooled, make_plan(pooled, topo, [ST.DATA_PARALLEL] * len(pooled))),
        "sequence-replicas": (sequence, make_plan(sequence, topo, [ST.DATA_PARALLEL] * len(sequence))),
    }
    out = {}
    for name, (specs, plan) in plans.items():
        is_pooled = name.startswith("pooled")
        out[f"serving-{name}"] = lambda pg, s=specs, p=plan, ip=is_pooled: run_serving(s, p, pg, pooled=ip, mean=ip, seed=21)
        if is_pooled:
            out[f"serving-{name}-weighted"] = lambda pg, s=specs, p=plan: run_serving(s, p, pg, pooled=True,
                                                                                       weighted=True, seed=22)
    # A serving share may be empty (at step s rank s % W gets no samples); widths need not be multiples of 4.
    pooled_a, sequence_a = plans["pooled-a"], plans["sequence-a"]
    out["serving-empty-rank-pooled"] = lambda pg: run_serving(*pooled_a, pg, pooled=True, mean=True, seed=23, empty_ranks=True)
    out["serving-empty-rank-pooled-weighted"] = lambda pg: run_serving(*pooled_a, pg, pooled=True, weighted=True, mean=True,
                                                                       seed=24, empty_ranks=True)
    out["serving-empty-rank-sequence"] = lambda pg: run_serving(*sequence_a, pg, pooled=False, seed=25, empty_ranks=True)
    odd_pooled = [dataclasses.replace(s, dtype=d) for s, d in zip(ODD_POOLED, ("fp32", "fp16", "fp16", "fp32"))]
    odd_sequence = [dataclasses.replace(s, dtype=d) for s, d in zip(ODD_SEQUENCE, DTYPES)]
    out["serving-odd-dims-pooled"] = lambda pg: run_serving(odd_pooled, make_plan(odd_pooled, topo, MIXED_POOLED), pg,
                                                            pooled=True, mean=True, seed=26)
    odd_int8 = [dataclasses.replace(s, dtype="int8") for s in ODD_POOLED]  # blocks 3, 4 + 2, 5, 3 wide
    out["serving-odd-dims-pooled-int8"] = lambda pg: run_serving(odd_int8, make_plan(odd_int8, topo, MIXED_POOLED), pg,
                                                                 pooled=True, weighted=True, seed=28)
    out["serving-odd-dims-sequence"] = lambda pg: run_serving(odd_sequence, make_plan(odd_sequence, topo, MIXED_SEQUENCE), pg,
                                                              pooled=False, seed=27)
    return out
