"""Sharded embedding runtime: a ShardingPlan -> embedding collections that train across ranks.

    from embshard.runtime import ShardedEmbeddingBagCollection, shard_model
    ebc = ShardedEmbeddingBagCollection(pooled_specs, plan, process_group)
    pooled = ebc(local_kjt)          # KeyedTensor, same as torchrec's EmbeddingBagCollection
    pooled.values().sum().backward() # fused optimizer updates the shards in backward
"""

from embshard.extras import require

require("embshard.runtime", "torch")

from embshard.runtime.apply import shard_model
from embshard.runtime.collection import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.state import TableShard, assemble

__all__ = ["OptimizerConfig", "ShardedEmbeddingBagCollection", "ShardedEmbeddingCollection", "TableShard", "assemble",
           "shard_model"]
