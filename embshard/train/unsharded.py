"""The unsharded reference: TorchRec's plain embedding modules trained in one process with
the same sparse updates as embshard's fused optimizers.

After backward, every row that appears in the batch is updated from its summed gradient by
the table's optimizer, with `embshard.runtime.optim.apply_update` (FBGEMM's formulas), so a
sharded run on W ranks and this run on their concatenated batches agree step by step.
One difference is by design: rowwise_adagrad keeps one accumulator per row here, per row
and column block on column-split tables.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from embshard.data.batch import Batch
from embshard.models.dlrm import DLRM
from embshard.runtime.optim import OptimizerConfig, apply_update, new_state
from embshard.runtime.state import TableShard
from embshard.specs import TableSpec


class UnshardedSparseOptimizer:
    def __init__(self, model: DLRM, specs: Sequence[TableSpec], config: OptimizerConfig) -> None:
        self.config = config
        self.specs = {s.name: s for s in specs}
        self.weights: dict[str, nn.Parameter] = {name: bag.weight for name, bag in model.sparse.embedding_bags.items()}
        if model.sequence is not None:
            self.weights.update({name: emb.weight for name, emb in model.sequence.embeddings.items()})
        self.state = {name: new_state(self.specs[name].optimizer, w.shape[0], w.shape[1], w.device)
                      for name, w in self.weights.items()}
        self.steps = {name: torch.zeros((), dtype=torch.int64) for name in self.weights}

    def parameters(self) -> list[nn.Parameter]:
        return list(self.weights.values())

    def step(self, batch: Batch) -> None:
        """Update the rows of ``batch`` from the gradients of the last backward, then drop the gradients."""
        ids = {**_ids_by_feature(batch.sparse), **(_ids_by_feature(batch.sequence) if batch.sequence is not None else {})}
        for name, weight in self.weights.items():
            spec = self.specs[name]
            rows = torch.unique(torch.cat([ids[f] for f in spec.feature_names]))
            self.steps[name] += 1
            if weight.grad is not None:
                with torch.no_grad():
                    apply_update(spec.optimizer, weight.data, self.state[name], rows, weight.grad[rows].float(),
                                 self.config, self.config.learning_rate, int(self.steps[name]))
            weight.grad = None

    def shards(self) -> dict[str, TableShard]:
        """Every table as one replicated block, with its optimizer state (TableShard, as the runtime's)."""
        out = {}
        for name, weight in self.weights.items():
            spec = self.specs[name]
            state = dict(self.state[name])
            if spec.optimizer == "adam":
                state["step"] = self.steps[name]
            out[name] = TableShard(name, weight.detach(), 0, 0, tuple(weight.shape), spec.optimizer, state, replicated=True)
        return out

    def load(self, shards: dict[str, TableShard]) -> None:
        with torch.no_grad():
            for name, shard in shards.items():
                self.weights[name].copy_(shard.weight)
                for key, tensor in shard.optimizer_state.items():
                    (self.steps[name] if key == "step" else self.state[name][key]).copy_(tensor)


def _ids_by_feature(kjt) -> dict[str, Tensor]:
    return {key: jt.values() for key, jt in kjt.to_dict().items()}
