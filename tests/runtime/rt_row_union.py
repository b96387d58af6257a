"""Data-parallel tables trained by all-reduce across hosts exchange only the rows some rank looked up
(embshard.runtime.row_union): 4 ranks as 2 hosts x 2, five steps against the unsharded reference (weights and
optimizer state), and every step's two all-reduces recorded: the mask of one fp16 per row of every table, then the
gradient of the rows looked up anywhere (an 8,192 x 8 table, 256 KiB of gradient: ~1% of its rows), of every row of
a small table (6 rows, `embshard.specs.sparse_dp_table`), and of adam's rows looked up only (300 rows). On one host
(2 ranks) the same tables all-reduce every row's gradient (and adam's id counts), no mask; across hosts, tables
that are all small send no mask either.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from embshard.planner.types import ShardingType
from embshard.specs import TableSpec
from rt_training import make_batches, make_plan, topology, train

SPECS = {True: [TableSpec("big", 8192, 8, feature_names=("g1", "g2"), optimizer="rowwise_adagrad"),
                TableSpec("small", 6, 8, feature_names=("s",), optimizer="rowwise_adagrad"),
                TableSpec("moving", 300, 8, feature_names=("m",), optimizer="adam")]}
SPECS[False] = [dataclasses.replace(s, pooled=False) for s in SPECS[True]]
SEED = 61


@contextmanager
def recording_all_reduces() -> Iterator[list[tuple[str, int, torch.dtype]]]:
    """(caller, elements, dtype) of every data-parallel all-reduce while the block runs."""
    import embshard.runtime.dense_replicas as dense_replicas
    import embshard.runtime.row_union as row_union

    calls: list[tuple[str, int, torch.dtype]] = []
    originals = {m: m.wire_all_reduce_pieces_ for m in (dense_replicas, row_union)}

    def recorder(module, name):
        def record(flat, cuts, pg, dtype):
            calls.append((name, flat.numel(), flat.dtype))
            return originals[module](flat, cuts, pg, dtype)
        return record

    dense_replicas.wire_all_reduce_pieces_ = recorder(dense_replicas, "gradient")
    row_union.wire_all_reduce_pieces_ = recorder(row_union, "mask")
    try:
        yield calls
    finally:
        for module, fn in originals.items():
            module.wire_all_reduce_pieces_ = fn


def expected_calls(specs: list[TableSpec], world_size: int, across_hosts: bool) -> list[tuple[str, int, torch.dtype]]:
    """Per step what the runtime must all-reduce for these batches (those `train` draws)."""
    out = []
    for batches in make_batches(specs, world_size, False, SEED):
        if not across_hosts:
            out.append(("gradient", sum(s.num_embeddings * (s.embedding_dim + (s.optimizer == "adam")) for s in specs),
                        torch.float32))
            continue
        out.append(("mask", sum(s.num_embeddings for s in specs), torch.float16))
        floats = 0
        for s in specs:
            hit = torch.cat([b[f][1] for b in batches for f in s.feature_names]).unique().numel()
            small = s.num_embeddings * s.embedding_dim * 4 < 1 << 18 and s.optimizer != "adam"
            whole = small or (hit >= 0.5 * s.num_embeddings and s.optimizer != "adam")
            floats += (s.num_embeddings if whole else hit) * s.embedding_dim
        out.append(("gradient", floats, torch.float32))
    return out


def row_union(pg: dist.ProcessGroup, pooled: bool, small_only: bool = False) -> dict:
    """small_only: the 6-row table alone (across hosts: its whole gradient, no mask)."""
    specs, W = SPECS[pooled][1:2] if small_only else SPECS[pooled], dist.get_world_size(pg)
    topo = topology(W)
    across_hosts = topo.num_hosts > 1
    plan = make_plan(specs, topo, [ShardingType.DATA_PARALLEL] * len(specs))
    with recording_all_reduces() as calls:
        errors = train(specs, plan, pg, pooled=pooled, seed=SEED, data_parallel_mode="allreduce")[3]
    expected = expected_calls(specs, W, across_hosts and not small_only)
    big_hit = max(n for name, n, _ in expected if name == "gradient") / (sum(s.num_embeddings for s in specs) * 8)
    return {**errors, "err_calls": float(calls != expected),
            # across hosts the exchange is a fraction of every row's gradient
            "err_not_sparse": float(across_hosts and not small_only and big_hit > 0.5)}


def cases(world_size: int) -> dict:
    if world_size not in (2, 4):  # 4: 2 hosts x 2 ranks (rt_training.topology); 2: one host
        return {}
    return {"row-union-pooled": lambda pg: row_union(pg, True), "row-union-sequence": lambda pg: row_union(pg, False),
            "row-union-small-tables": lambda pg: row_union(pg, True, small_only=True)}
