"""shard_model: a model with TorchRec embedding modules -> the same model, sharded.

    model = shard_model(model, plan, process_group)   # on every rank, with the same plan

Read like torchtitan's parallelize: each step is one function. Embedding modules
(`EmbeddingBagCollection`, `EmbeddingCollection`) become sharded collections holding a
copy of their weights; the remaining dense parameters are wrapped in
DistributedDataParallel. Table optimizers come from the plan's specs; their learning
rate and hyper-parameters from ``optimizer``.

Serving: ``apply_embedding_sharding(model, plan, pg, None, device)`` swaps in forward-only
collections (weight dtypes from the plan's specs) without reading the modules' weights, so
they may live on the meta device; the blocks load with ``load_quantized``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from embshard.planner.plan import ShardingPlan
from embshard.runtime.collection import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.comm import shared_memory
from embshard.runtime.shared_group import SharedGroup
from embshard.runtime.optim import OptimizerConfig
from embshard.specs import TableSpec

POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


def shard_model(model: nn.Module, plan: ShardingPlan, pg: dist.ProcessGroup, *,
                optimizer: OptimizerConfig = OptimizerConfig(), device: torch.device | None = None) -> nn.Module:
    device = torch.device(device) if device is not None else torch.device("cpu")
    model = apply_embedding_sharding(model, plan, pg, optimizer, device)
    model = apply_ddp(model, pg, device)
    return model


def apply_embedding_sharding(model: nn.Module, plan: ShardingPlan, pg: dist.ProcessGroup,
                             optimizer: OptimizerConfig | None, device: torch.device,
                             hot_ids: Mapping[str, Any] | None = None) -> nn.Module:
    """Replace every EmbeddingBagCollection / EmbeddingCollection by its sharded version, weights copied
    (``optimizer=None``: forward-only collections, weights not copied). hot_ids: the hot tables' rankings
    (table -> ids hottest first; None: the plan's hot_ids_file)."""
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]
    for name, module in targets:
        sharded = shard_embedding_bags(module, plan, pg, optimizer, device, hot_ids) \
            if isinstance(module, EmbeddingBagCollection) else shard_embeddings(module, plan, pg, optimizer, device, hot_ids)
        if not name:
            return sharded
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, sharded)
    return model


def shard_embedding_bags(ebc: EmbeddingBagCollection, plan: ShardingPlan, pg: dist.ProcessGroup,
                         optimizer: OptimizerConfig | None, device: torch.device,
                         hot_ids: Mapping[str, Any] | None = None) -> ShardedEmbeddingBagCollection:
    configs = ebc.embedding_bag_configs()
    bad = [c.name for c in configs if c.pooling not in POOLING]
    if bad:
        raise ValueError(f"shard_model: table(s) {bad} use a pooling other than {[p.name for p in POOLING]}; "
                         "embshard pools by sum or mean")
    sharded = ShardedEmbeddingBagCollection(_specs(configs, plan, pooled=True), plan, pg,
                                            pooling={c.name: POOLING[c.pooling] for c in configs},
                                            weighted=ebc.is_weighted(), optimizer=optimizer, device=device,
                                            hot_ids=hot_ids)
    if optimizer is not None:
        sharded.load_tables({c.name: ebc.embedding_bags[c.name].weight.detach() for c in configs})
    return sharded


def shard_embeddings(ec: EmbeddingCollection, plan: ShardingPlan, pg: dist.ProcessGroup,
                     optimizer: OptimizerConfig | None, device: torch.device,
                     hot_ids: Mapping[str, Any] | None = None) -> ShardedEmbeddingCollection:
    configs = ec.embedding_configs()
    sharded = ShardedEmbeddingCollection(_specs(configs, plan, pooled=False), plan, pg, optimizer=optimizer, device=device,
                                         hot_ids=hot_ids)
    if optimizer is not None:
        sharded.load_tables({c.name: ec.embeddings[c.name].weight.detach() for c in configs})
    return sharded


def apply_ddp(model: nn.Module, pg: dist.ProcessGroup, device: torch.device) -> nn.Module:
    """DDP over the dense parameters (sharded collections register none); a model without any stays as is.

    Buffers are synced once at wrapping, not broadcast before every forward (as TorchRec's DMP does):
    a per-step broadcast is a sync point that costs ~5% of a CPU DLRM step for constant index buffers.
    Gradients are views of DDP's all-reduce buckets (as in TorchRec's DMP): no copy back after each all-reduce.
    Where the sharded collections run the group's collectives through shared memory (every rank on one host,
    `embshard.runtime.comm.use_shared_memory`), the buckets' all-reduce runs there too (`_shared_memory_hook`)."""
    if not any(p.requires_grad for p in model.parameters()):
        return model
    ddp = DistributedDataParallel(model, process_group=pg, device_ids=[device] if device.type == "cuda" else None,
                                  forward_sync_buffers=False, gradient_as_bucket_view=True)
    shared = shared_memory(pg)
    if shared is not None:
        ddp.register_comm_hook(shared, _shared_memory_hook)
    return ddp


def _shared_memory_hook(shared: SharedGroup, bucket):  # DDP refuses string annotations (this module's) of the bucket
    """DDP's all-reduce of one bucket (dist.GradBucket) through the group's shared memory: the gradients divided by
    the world size, then summed (as DDP's own all-reduce does), before the hook returns (a done Future). Not counted
    as traffic (DDP's own is not)."""
    flat = bucket.buffer()
    flat.div_(shared.world)
    shared.sum_(flat)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(flat)
    return done


def _specs(configs: list[BaseEmbeddingConfig], plan: ShardingPlan, pooled: bool) -> list[TableSpec]:
    """The module's tables as specs; optimizer and dtype come from the plan when it has the table."""
    planned = {s.name: s for s in plan.specs}
    specs = []
    for c in configs:
        base = planned.get(c.name)
        specs.append(TableSpec(name=c.name, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim,
                               pooled=pooled, feature_names=tuple(c.feature_names),
                               dtype=base.dtype if base else "fp32",
                               optimizer=base.optimizer if base else "rowwise_adagrad"))
    return specs
