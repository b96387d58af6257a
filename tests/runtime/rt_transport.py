"""The collectives' transport: where the plan puts every rank of the group on one host, a collection's all-to-alls
and data-parallel all-reduce run through shared memory (embshard.runtime.shared_group), not gloo; where the plan
spreads the ranks over hosts (or ``EMBSHARD_SHARED_MEMORY=0``), through gloo; the outputs and the tables after a
step are the same bit for bit. The header's small all-reduce stays on gloo (in flight while the local look-ups run).
That the shared-memory path trains exactly as the unsharded reference: every rt_training case on one host runs on it.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import torch
import torch.distributed as dist

from embshard.planner.types import ShardingType
from embshard.runtime.comm import shared_memory
from rt_local_only import recording_calls
from rt_reference import kjt
from rt_training import POOLED, SEQUENCE, features_of, make_batches, make_collection, make_plan, topology

ST = ShardingType


def _step(specs, pg: dist.ProcessGroup, local_world_size: int, pooled: bool) -> tuple[Counter, list[torch.Tensor], bool]:
    """(collectives called in one training step, the outputs and the tables after it, whether the group runs on
    shared memory) of a collection of table-wise and data-parallel (all-reduce) tables."""
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    types = [ST.DATA_PARALLEL if i % 2 else ST.TABLE_WISE for i in range(len(specs))]
    plan = make_plan(specs, dataclasses.replace(topology(W), local_world_size=local_world_size), types)
    torch.manual_seed(0)
    collection = make_collection(specs, plan, pg, pooled, data_parallel_mode="allreduce")
    batch = kjt(make_batches(specs, W, False, seed=57)[0][rank], features_of(specs), False)
    with recording_calls(shared_as_gloo=False) as names:
        out = collection(batch)
        values = out.values() if pooled else torch.cat([jt.values() for jt in out.values()])
        values.square().sum().backward()
    tables = [t for shard in collection.state_dict().values() for t in (shard.weight, *shard.optimizer_state.values())]
    return Counter(names), [values.detach()] + tables, shared_memory(pg) is not None


def transport(pg: dist.ProcessGroup, pooled: bool) -> dict:
    specs = [dataclasses.replace(s, optimizer="rowwise_adagrad") for s in (POOLED if pooled else SEQUENCE)]
    W = dist.get_world_size(pg)
    one_host = dist.new_group(list(range(W)))
    shared_calls, shared_out, on_shared = _step(specs, one_host, W, pooled)
    hosts = dist.new_group(list(range(W)))
    gloo_calls, gloo_out, hosts_shared = _step(specs, hosts, 1, pooled)  # one rank per host: nothing shares memory
    os.environ["EMBSHARD_SHARED_MEMORY"] = "0"
    try:
        off = dist.new_group(list(range(W)))
        off_calls, off_out, off_shared = _step(specs, off, W, pooled)
    finally:
        del os.environ["EMBSHARD_SHARED_MEMORY"]
    same = all(len(o) == len(shared_out) and all(torch.equal(a, b) for a, b in zip(o, shared_out))
               for o in (gloo_out, off_out))
    return {"err_not_on_shared_memory": float(not on_shared),
            # on shared memory: gloo only for the header (the ranks' batch sizes differ: an all-reduce, an all-gather);
            # ids, lengths and embeddings both ways, and the DP gradients' sum, in shared memory
            "err_gloo_calls_on_one_host": float({n: k for n, k in shared_calls.items() if not n.startswith("shared.")}
                                                != {"all_reduce": 1, "all_gather_into_tensor": 1}),
            "err_shared_all_to_alls": abs(shared_calls["shared.all_to_all"] - 4),
            "err_shared_sums": abs(shared_calls["shared.sum_"] - 1),
            "err_shared_across_hosts": float(hosts_shared) + float(off_shared),
            "err_gloo_calls_across_hosts": float(gloo_calls != off_calls or gloo_calls != Counter(
                {"all_reduce": 2, "all_gather_into_tensor": 1, "all_to_all_single": 4})),
            "err_not_bitwise_equal": float(not same)}


def cases(world_size: int) -> dict:
    if world_size != 2:
        return {}
    return {"transport-pooled": lambda pg: transport(pg, True), "transport-sequence": lambda pg: transport(pg, False)}
