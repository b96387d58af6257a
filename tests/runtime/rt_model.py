"""shard_model on a small model (pooled + sequence embeddings, dense layers below and on top):
outputs, dense-layer gradients after DDP, and all weights after 3 steps equal the unsharded
model trained on the global batch with gradients averaged over ranks."""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embshard.planner import manual_plan
from embshard.planner.types import ShardingType
from embshard.runtime import OptimizerConfig, ShardedEmbeddingBagCollection, ShardedEmbeddingCollection, shard_model
from embshard.runtime.comm import shared_memory
from rt_reference import ReferenceOptimizer, global_batch, kjt
from rt_training import POOLED, SEQUENCE, features_of, make_batches, topology

ST = ShardingType
LR_EMB, LR_DENSE, STEPS = 0.05, 0.1, 3
NUM_DENSE = 3


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = nn.Module()
        self.sparse.bags = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=s.name, embedding_dim=s.embedding_dim, num_embeddings=s.num_embeddings,
                               feature_names=list(s.feature_names), pooling=PoolingType.MEAN if s.name == "ta" else PoolingType.SUM)
            for s in POOLED])
        self.sequences = EmbeddingCollection(tables=[
            EmbeddingConfig(name=s.name, embedding_dim=s.embedding_dim, num_embeddings=s.num_embeddings,
                            feature_names=list(s.feature_names)) for s in SEQUENCE])
        pooled_dim = sum(s.embedding_dim * s.num_features for s in POOLED)
        sequence_dim = sum(s.embedding_dim * s.num_features for s in SEQUENCE)
        self.bottom = nn.Linear(NUM_DENSE, 8)
        self.top = nn.Sequential(nn.Linear(pooled_dim + sequence_dim + 8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, pooled, sequences, dense: Tensor) -> Tensor:
        bags = self.sparse.bags(pooled).values()
        per_feature = self.sequences(sequences)
        B = dense.shape[0]
        sums = []
        for f in features_of(SEQUENCE):
            jt = per_feature[f]
            bag = torch.repeat_interleave(torch.arange(B), jt.lengths())
            sums.append(torch.zeros(B, jt.values().shape[1]).index_add(0, bag, jt.values()))
        return self.top(torch.cat([bags, *sums, torch.relu(self.bottom(dense))], dim=1)).squeeze(1)


def run_model(world_size: int, pg: dist.ProcessGroup) -> dict[str, float]:
    rank = dist.get_rank(pg)
    torch.manual_seed(0)
    model = TinyModel()
    ref = copy.deepcopy(model)
    layout = {"ta": (ST.ROW_WISE, list(range(world_size))), "tb": (ST.COLUMN_WISE, [world_size - 1, 0]),
              "tc": (ST.TABLE_WISE, [1 % world_size]), "td": (ST.DATA_PARALLEL, []),
              "sa": (ST.TABLE_ROW_WISE, list(topology(world_size).host_ranks(0))), "sb": (ST.TABLE_WISE, [0]),
              "sc": (ST.DATA_PARALLEL, []), "sd": (ST.COLUMN_WISE, list(range(world_size)))}
    plan = manual_plan(POOLED + SEQUENCE, topology(world_size), layout)
    sharded = shard_model(model, plan, pg, optimizer=OptimizerConfig(learning_rate=LR_EMB))
    errors = {"replaced": float(isinstance(sharded.module.sparse.bags, ShardedEmbeddingBagCollection)
                                and isinstance(sharded.module.sequences, ShardedEmbeddingCollection)),
              # one host: DDP's buckets are summed through the group's shared memory (its hook), as the tables' are
              "err_ddp_transport": float([state for _, state in sharded._comm_hooks]
                                         != ([shared_memory(pg)] if world_size < 4 else []))}
    dense_opt = torch.optim.SGD(sharded.parameters(), lr=LR_DENSE)
    ref_dense = [p for n, p in ref.named_parameters() if not n.startswith(("sparse.", "sequences."))]
    ref_dense_opt = torch.optim.SGD(ref_dense, lr=LR_DENSE)
    ref_tables = {**{s.name: ref.sparse.bags.embedding_bags[s.name].weight for s in POOLED},
                  **{s.name: ref.sequences.embeddings[s.name].weight for s in SEQUENCE}}
    ref_emb_opt = ReferenceOptimizer(POOLED + SEQUENCE, LR_EMB,
                                     column_blocks={t.name: sorted({(s.col_offset, s.num_cols) for s in t.shards}) for t in plan.tables})
    gen = torch.Generator().manual_seed(1)
    pooled_steps = make_batches(POOLED, world_size, False, seed=31)
    sequence_steps = make_batches(SEQUENCE, world_size, False, seed=32)
    errors.update(err_forward=0.0, err_dense_grad=0.0, moved=0.0)
    for step in range(STEPS):
        pb, sb = pooled_steps[step], sequence_steps[step]
        sizes = [len(b["a1"][0]) for b in pb]
        dense = [torch.randn(n, NUM_DENSE, generator=gen) for n in sizes]
        labels = [torch.randn(n, generator=gen) for n in sizes]
        out = sharded(kjt(pb[rank], features_of(POOLED), False), kjt(sb[rank], features_of(SEQUENCE), False), dense[rank])
        loss = ((out - labels[rank]) ** 2).mean()
        ref_out = ref(kjt(global_batch(pb), features_of(POOLED), False), kjt(global_batch(sb), features_of(SEQUENCE), False),
                      torch.cat(dense))
        first = sum(sizes[:rank])
        errors["err_forward"] = max(errors["err_forward"], float((out.detach() - ref_out[first:first + sizes[rank]].detach()).abs().max()))
        ref_loss = sum(((o - y) ** 2).mean() for o, y in zip(ref_out.split(sizes), labels)) / world_size
        dense_opt.zero_grad()
        ref_dense_opt.zero_grad()
        loss.backward()
        ref_loss.backward()
        for p, q in zip(sharded.parameters(), ref_dense):
            errors["err_dense_grad"] = max(errors["err_dense_grad"], float((p.grad - q.grad).abs().max()))
        errors["moved"] = max(errors["moved"], float(sharded.module.bottom.weight.grad.abs().max()))
        dense_opt.step()
        ref_dense_opt.step()
        touched = {s.name: torch.cat([global_batch(pb if s.pooled else sb)[f][1] for f in s.feature_names]) for s in POOLED + SEQUENCE}
        ref_emb_opt.step(ref_tables, touched)
    errors["err_dense_weights"] = max(float((p - q).abs().max()) for p, q in zip(sharded.parameters(), ref_dense))
    errors["err_tables"] = 0.0
    for collection in (sharded.module.sparse.bags, sharded.module.sequences):
        for name, shard in collection.state_dict().items():
            errors["err_tables"] = max(errors["err_tables"], float((shard.weight - ref_tables[name][shard.rows, shard.cols]).abs().max()))
    return errors


def cases(world_size: int) -> dict[str, Callable[[dist.ProcessGroup], dict]]:
    return {"shard-model": lambda pg: run_model(world_size, pg)}
