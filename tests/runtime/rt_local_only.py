"""Collections whose look-ups are all local (data-parallel tables trained by an all-reduce) issue no
input or output dist: one training step counts the collectives each phase calls. Forward: the
header alone (a 1-element all-reduce of the failure flag: no rank needs another's batch size), no all-to-all,
no bytes counted; backward: one all-reduce (every table's gradient in one flat buffer; on one host, where no in-host
reduction comes first). A table-wise
plan of the same tables, for contrast, sends its ids and embeddings (two all-to-alls in, one out).
That such collections train exactly as the unsharded reference: rt_training's data_parallel cases, and
here with the all-reduce in pieces (dense_replicas.ALLREDUCE_PIECES; these tables are under its floor).
Beside table-wise tables, backward all-reduces them before the sharded tables' all-to-all (`backward_order`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from embshard.planner.types import ShardingType
from embshard.runtime.comm import counting_traffic
from embshard.runtime.shared_group import SharedGroup
from rt_reference import kjt
from rt_training import POOLED, SEQUENCE, features_of, make_batches, make_collection, make_plan, topology

ST = ShardingType
COLLECTIVES = ("all_to_all_single", "all_reduce", "all_gather_into_tensor", "all_gather", "reduce_scatter_tensor",
               "all_gather_object", "broadcast")


SHARED = {"all_to_all": "all_to_all_single", "sum_": "all_reduce", "reduce_scatter": "reduce_scatter_tensor",
          "all_gather": "all_gather_into_tensor"}  # SharedGroup's methods (one host), named as the gloo calls they replace


@contextmanager
def recording_calls(shared_as_gloo: bool = True) -> Iterator[list[str]]:
    """Names of the collectives called while the block runs, in call order: torch.distributed's, and SharedGroup's
    under the names of the gloo calls they stand for (once each, even where one runs on gloo), or, unless
    ``shared_as_gloo``, as "shared." + the method."""
    names: list[str] = []
    inside: list[bool] = []
    originals = {(dist, name): getattr(dist, name) for name in COLLECTIVES}
    originals.update({(SharedGroup, method): getattr(SharedGroup, method) for method in SHARED})

    def recorded(owner, name):
        def call(*args, **kwargs):
            if not inside:
                names.append(name if owner is dist else SHARED[name] if shared_as_gloo else "shared." + name)
            inside.append(True)
            try:
                return originals[owner, name](*args, **kwargs)
            finally:
                inside.pop()
        return call
    try:
        for owner, name in originals:
            setattr(owner, name, recorded(owner, name))
        yield names
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)


@contextmanager
def counting_calls() -> Iterator[Counter]:
    """Calls of torch.distributed's collectives while the block runs, by name (filled when it ends)."""
    calls: Counter = Counter()
    with recording_calls() as names:
        try:
            yield calls
        finally:
            calls.update(names)


def run_step(specs, types: list[ShardingType], pg: dist.ProcessGroup, pooled: bool) -> tuple[Counter, Counter, int]:
    """(forward calls, backward calls, bytes counted in forward) of one training step on this rank."""
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    plan = make_plan(specs, dataclasses.replace(topology(W), local_world_size=W), types)  # one host: a flat all-reduce
    collection = make_collection(specs, plan, pg, pooled, data_parallel_mode="allreduce")
    batch = kjt(make_batches(specs, W, False, seed=51)[0][rank], features_of(specs), False)
    with counting_traffic(pg, W) as counter, counting_calls() as forward:
        out = collection(batch)
    forward_bytes = counter.bytes.intra_host_sent + counter.bytes.inter_host_sent
    values = out.values() if pooled else torch.cat([jt.values() for jt in out.values()])
    with counting_calls() as backward:
        values.square().sum().backward()
    return forward, backward, forward_bytes


def local_only(pg: dist.ProcessGroup, pooled: bool) -> dict:
    specs = [dataclasses.replace(s, optimizer="rowwise_adagrad") for s in (POOLED if pooled else SEQUENCE)]
    forward, backward, forward_bytes = run_step(specs, [ST.DATA_PARALLEL] * len(specs), pg, pooled)
    sharded_forward, _, sharded_bytes = run_step(specs, [ST.TABLE_WISE] * len(specs), pg, pooled)
    return {"err_forward_collectives": abs(sum(forward.values()) - 1) + abs(forward["all_reduce"] - 1),
            "err_forward_bytes": forward_bytes,
            "err_backward_collectives": abs(sum(backward.values()) - 1) + abs(backward["all_reduce"] - 1),
            # the contrast: ids and lengths in, embeddings out; bytes counted
            "err_sharded_all_to_alls": abs(sharded_forward["all_to_all_single"] - 3), "err_sharded_bytes": float(sharded_bytes == 0)}




def backward_order(pg: dist.ProcessGroup, pooled: bool) -> dict:
    """Data-parallel tables (all-reduce) beside table-wise ones: backward all-reduces the data-parallel gradients
    before the all-to-all that takes the sharded tables' output gradients back (their look-ups run after the output
    all-to-all, and autograd runs the later of two ready nodes first), so the all-reduce overlaps it."""
    specs = [dataclasses.replace(s, optimizer="rowwise_adagrad") for s in (POOLED if pooled else SEQUENCE)]
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    types = [ST.DATA_PARALLEL if i % 2 else ST.TABLE_WISE for i in range(len(specs))]
    plan = make_plan(specs, dataclasses.replace(topology(W), local_world_size=W), types)
    collection = make_collection(specs, plan, pg, pooled, data_parallel_mode="allreduce")
    out = collection(kjt(make_batches(specs, W, False, seed=53)[0][rank], features_of(specs), False))
    values = out.values() if pooled else torch.cat([jt.values() for jt in out.values()])
    with recording_calls() as names:
        values.square().sum().backward()
    first = {name: names.index(name) if name in names else len(names) for name in ("all_reduce", "all_to_all_single")}
    return {"err_backward_calls": abs(names.count("all_reduce") - 1) + abs(names.count("all_to_all_single") - 1),
            "err_all_reduce_after_all_to_all": float(first["all_reduce"] > first["all_to_all_single"])}


def in_pieces(pg: dist.ProcessGroup, pooled: bool, pieces: int) -> dict:
    """The data-parallel all-reduce in ``pieces`` (its floor lowered so that these small tables are cut, inside
    stacks and between them; adam's counted rows wait for the last), trained against the unsharded reference."""
    import embshard.runtime.dense_replicas as dense_replicas
    from rt_training import train
    specs = POOLED if pooled else SEQUENCE
    floor, count = dense_replicas.PIECE_MIN_FLOATS, dense_replicas.ALLREDUCE_PIECES
    dense_replicas.PIECE_MIN_FLOATS, dense_replicas.ALLREDUCE_PIECES = 16, pieces
    try:
        plan = make_plan(specs, topology(dist.get_world_size(pg)), [ST.DATA_PARALLEL] * len(specs))
        sharded, _, _, errors = train(specs, plan, pg, pooled=pooled, weighted=pooled, seed=52, data_parallel_mode="allreduce")
    finally:
        dense_replicas.PIECE_MIN_FLOATS, dense_replicas.ALLREDUCE_PIECES = floor, count
    replicas = sharded.dense_replicas
    inside = sum(any(u.stack == v.stack and u.row_lo == v.row_hi for v in replicas.units) for u in replicas.units)
    return {**errors, "err_pieces": abs(len(replicas.cuts) + 1 - pieces), "err_no_cut_inside_a_stack": float(inside == 0)}


def cases(world_size: int) -> dict:
    order = {"backward-order-pooled": lambda pg: backward_order(pg, True),
             "backward-order-sequence": lambda pg: backward_order(pg, False)} if world_size == 2 else {}  # any W alike
    return {"local-only-collectives-pooled": lambda pg: local_only(pg, True),
            "local-only-collectives-sequence": lambda pg: local_only(pg, False), **order,
            "allreduce-in-pieces-pooled": lambda pg: in_pieces(pg, True, 3),
            "allreduce-in-pieces-sequence": lambda pg: in_pieces(pg, False, 5)}
