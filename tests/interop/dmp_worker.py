"""One gloo rank of the DistributedModelParallel check of `to_torchrec_plan` (started by the test).

Run: python tests/interop/dmp_worker.py RANK WORLD_SIZE PORT PLAN_JSON OUT_JSON

Loads an embshard plan, exports it with `to_torchrec_plan`, shards an EmbeddingBagCollection
(and EmbeddingCollection, if the plan has sequence tables) with TorchRec's DMP, copies the
reference weights into the shards, runs one forward on this rank's slice of a global batch
and writes, per table, the max abs difference to the unsharded modules on the whole batch,
and the shard metadata each rank received.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.interop.torchrec import to_embedding_configs, to_torchrec_plan
from embshard.planner.plan import ShardingPlan

BATCH_SIZE_PER_RANK = 3
MAX_IDS_PER_SAMPLE = 4


def global_batch(specs, world_size: int, pooled: bool) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Keys, lengths_FB (feature-major) and values of the global batch, the same on every rank."""
    gen = torch.Generator().manual_seed(1234 + pooled)
    keys, lengths, values = [], [], []
    batch = BATCH_SIZE_PER_RANK * world_size
    for spec in specs:
        if spec.pooled != pooled:
            continue
        for feature in spec.feature_names:
            n = torch.randint(0, MAX_IDS_PER_SAMPLE + 1, (batch,), generator=gen)
            keys.append(feature)
            lengths.append(n)
            values.append(torch.randint(0, spec.num_embeddings, (int(n.sum()),), generator=gen))
    return keys, torch.stack(lengths), torch.cat(values)


def kjt_slice(keys, lengths_FB, values, start: int, stop: int) -> KeyedJaggedTensor:
    """The samples [start, stop) of every feature, as a KJT."""
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths_FB.flatten().cumsum(0)])
    batch = lengths_FB.shape[1]
    parts = [values[offsets[f * batch + start]:offsets[f * batch + stop]] for f in range(len(keys))]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(parts), lengths=lengths_FB[:, start:stop].flatten())


def copy_into_shards(sharded_state: dict, reference_state: dict) -> None:
    for name, local in sharded_state.items():
        full = reference_state[name]
        if hasattr(local, "local_shards"):
            for shard in local.local_shards():
                (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.detach().copy_(full[r0:r0 + nr, c0:c0 + nc])
        else:
            local.detach().copy_(full)


def main() -> None:
    rank, world_size, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    plan = ShardingPlan.load(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_WORLD_SIZE=str(plan.topology.local_world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    bags, sequences = to_embedding_configs(plan.specs)
    reference = nn.Module()
    if bags:
        reference.ebc = EmbeddingBagCollection(tables=bags, device=torch.device("cpu"))
    if sequences:
        reference.ec = EmbeddingCollection(tables=sequences, device=torch.device("cpu"))
    for p in reference.parameters():
        nn.init.uniform_(p, -1.0, 1.0)
    reference_state = {k: v.clone() for k, v in reference.state_dict().items()}

    tr_plan = to_torchrec_plan(plan, "ebc", sequence_module_path="ec")
    model = DistributedModelParallel(
        reference, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"), plan=tr_plan,
        sharders=[EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()])
    copy_into_shards(model.state_dict(), reference_state)

    unsharded = nn.Module()
    if bags:
        unsharded.ebc = EmbeddingBagCollection(tables=bags, device=torch.device("cpu"))
    if sequences:
        unsharded.ec = EmbeddingCollection(tables=sequences, device=torch.device("cpu"))
    unsharded.load_state_dict(reference_state)

    start, stop = rank * BATCH_SIZE_PER_RANK, (rank + 1) * BATCH_SIZE_PER_RANK
    feature_table = {f: s.name for s in plan.specs for f in s.feature_names}
    max_abs_diff: dict[str, float] = {}
    if bags:
        batch = global_batch(plan.specs, world_size, pooled=True)
        got = model.module.ebc(kjt_slice(*batch, start, stop)).to_dict()
        want = unsharded.ebc(kjt_slice(*batch, 0, BATCH_SIZE_PER_RANK * world_size)).to_dict()
        for f, out in got.items():
            diff = (out.wait() if hasattr(out, "wait") else out) - want[f][start:stop]
            max_abs_diff[feature_table[f]] = max(max_abs_diff.get(feature_table[f], 0.0), float(diff.abs().max()))
    if sequences:
        batch = global_batch(plan.specs, world_size, pooled=False)
        got = model.module.ec(kjt_slice(*batch, start, stop))
        want = unsharded.ec(kjt_slice(*batch, 0, BATCH_SIZE_PER_RANK * world_size))
        for f, jt in got.items():
            offsets = want[f].offsets()
            expected = want[f].values()[offsets[start]:offsets[stop]]
            diff = jt.values() - expected if jt.values().numel() else torch.zeros(1)
            max_abs_diff[feature_table[f]] = max(max_abs_diff.get(feature_table[f], 0.0), float(diff.abs().max()))

    local_shards = {}
    for name, t in model.state_dict().items():
        if hasattr(t, "local_shards"):
            table = name.split(".")[-2]
            local_shards[table] = [[*s.metadata.shard_offsets, *s.metadata.shard_sizes] for s in t.local_shards()]
    with open(sys.argv[5], "w") as f:
        json.dump({"max_abs_diff": max_abs_diff, "local_shards": local_shards}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a gloo worker thread still holding a finished work's tensors can abort
    # it ("terminate called without an active exception", SIGABRT) after the rank has done and said all
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
