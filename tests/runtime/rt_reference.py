"""Test oracle: unsharded TorchRec collections on the global batch, and a plain-torch
version of the sparse fused optimizers (FBGEMM's formulas, applied to rows in the batch).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embshard.specs import TableSpec

# One rank's batch: feature -> (lengths [B], ids, weights or None)
RankBatch = dict[str, tuple[Tensor, Tensor, Tensor | None]]


def full_tables(specs: list[TableSpec], seed: int) -> dict[str, Tensor]:
    """Random tables; fp16 tables hold values fp16 represents exactly (what the sharded copy holds)."""
    gen = torch.Generator().manual_seed(seed)
    tables = {s.name: torch.randn(s.num_embeddings, s.embedding_dim, generator=gen) * 0.3 for s in specs}
    return {name: t.half().float() if s.dtype == "fp16" else t for (name, t), s in zip(tables.items(), specs)}


def reference_ebc(specs: list[TableSpec], tables: dict[str, Tensor], pooling: dict[str, str], weighted: bool):
    """TorchRec's EmbeddingBagCollection holding ``tables`` (a `WeightedMean` one for weighted mean pooling)."""
    weighted_mean = weighted and "mean" in pooling.values()
    configs = [EmbeddingBagConfig(name=s.name, embedding_dim=s.embedding_dim, num_embeddings=s.num_embeddings,
                                  feature_names=list(s.feature_names),
                                  pooling=PoolingType.MEAN if pooling.get(s.name) == "mean" and not weighted_mean else PoolingType.SUM)
               for s in specs]
    ebc = EmbeddingBagCollection(tables=configs, is_weighted=weighted, device=torch.device("cpu"))
    with torch.no_grad():
        for s in specs:
            ebc.embedding_bags[s.name].weight.copy_(tables[s.name])
    if weighted_mean:
        return WeightedMean(ebc, {f for s in specs if pooling.get(s.name) == "mean" for f in s.feature_names})
    return ebc


class WeightedMean(torch.nn.Module):
    """Weighted mean pooling as FBGEMM (and sharded TorchRec) compute it: the weighted sum over the
    bag's length (empty bags give 0). TorchRec's unsharded collection refuses weights with mean."""

    def __init__(self, summing: EmbeddingBagCollection, mean_features: set[str]) -> None:
        super().__init__()
        self.summing, self.mean_features = summing, mean_features
        self.embedding_bags = summing.embedding_bags

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        out = self.summing(features)
        per_feature = features.to_dict()
        parts = [values / per_feature[key].lengths().clamp(min=1).unsqueeze(1) if key in self.mean_features else values
                 for key, values in zip(out.keys(), out.values().split(out.length_per_key(), dim=1))]
        return KeyedTensor(keys=out.keys(), length_per_key=out.length_per_key(), values=torch.cat(parts, dim=1))


def reference_ec(specs: list[TableSpec], tables: dict[str, Tensor]) -> EmbeddingCollection:
    configs = [EmbeddingConfig(name=s.name, embedding_dim=s.embedding_dim, num_embeddings=s.num_embeddings,
                               feature_names=list(s.feature_names)) for s in specs]
    ec = EmbeddingCollection(tables=configs, device=torch.device("cpu"))
    with torch.no_grad():
        for s in specs:
            ec.embeddings[s.name].weight.copy_(tables[s.name])
    return ec


def kjt(batch: RankBatch, features: list[str], weighted: bool) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=features,
        values=torch.cat([batch[f][1] for f in features]),
        lengths=torch.cat([batch[f][0] for f in features]),
        weights=torch.cat([batch[f][2] for f in features]) if weighted else None,
    )


def global_batch(batches: list[RankBatch]) -> RankBatch:
    """Concatenate every rank's bags, rank after rank (what the sharded run sees in total)."""
    out = {}
    for f in batches[0]:
        weights = [b[f][2] for b in batches]
        out[f] = (torch.cat([b[f][0] for b in batches]), torch.cat([b[f][1] for b in batches]),
                  None if weights[0] is None else torch.cat(weights))
    return out


class ReferenceOptimizer:
    """Sparse fused optimizer semantics: rows in the batch are updated with the summed gradient.

    column_blocks: table -> [(col_offset, num_cols)]. rowwise_adagrad keeps one accumulator
    per row and column block (the mean of squared gradients over the block's columns), as
    FBGEMM does on each column shard; an unsplit table has one block.
    """

    def __init__(self, specs: list[TableSpec], lr: float, eps: float = 1e-8, beta1: float = 0.9, beta2: float = 0.999,
                 column_blocks: dict[str, list[tuple[int, int]]] | None = None) -> None:
        self.specs = {s.name: s for s in specs}
        self.lr, self.eps, self.beta1, self.beta2 = lr, eps, beta1, beta2
        self.blocks = {s.name: (column_blocks or {}).get(s.name, [(0, s.embedding_dim)]) for s in specs}
        self.state: dict[str, dict[str, Tensor]] = {}
        self.steps = 0
        for s in specs:
            n, d = s.num_embeddings, s.embedding_dim
            self.state[s.name] = {"sgd": {}, "adagrad": {"momentum1": torch.zeros(n, d)},
                                  "rowwise_adagrad": {"momentum1": torch.zeros(n, len(self.blocks[s.name]))},
                                  "adam": {"momentum1": torch.zeros(n, d), "momentum2": torch.zeros(n, d)}}[s.optimizer]

    def block_state(self, table: str, key: str, rows: slice, cols: slice, dim: int) -> Tensor:
        """The reference state of one shard's block (per row for rowwise_adagrad; adam's step count)."""
        if key == "step":
            return torch.tensor(self.steps)
        state = self.state[table][key]
        if dim == 1:
            return state[rows, [c for c, _ in self.blocks[table]].index(cols.start)]
        return state[rows, cols]

    def step(self, weights: dict[str, Tensor], touched: dict[str, Tensor]) -> None:
        """weights: table -> parameter with .grad (dense); touched: table -> ids seen in the global batch."""
        self.steps += 1
        with torch.no_grad():
            for name, w in weights.items():
                rows = torch.unique(touched[name])
                if rows.numel() == 0:
                    continue
                g = w.grad[rows]
                st = self.state[name]
                opt = self.specs[name].optimizer
                if opt == "sgd":
                    w[rows] -= self.lr * g
                elif opt == "adagrad":
                    st["momentum1"][rows] += g * g
                    w[rows] -= self.lr * g / (st["momentum1"][rows].sqrt() + self.eps)
                elif opt == "rowwise_adagrad":
                    for j, (c, n) in enumerate(self.blocks[name]):
                        gb = g[:, c:c + n]
                        st["momentum1"][rows, j] += (gb * gb).mean(1)
                        w[rows, c:c + n] -= (self.lr / (st["momentum1"][rows, j].sqrt() + self.eps))[:, None] * gb
                else:
                    st["momentum1"][rows] = self.beta1 * st["momentum1"][rows] + (1 - self.beta1) * g
                    st["momentum2"][rows] = self.beta2 * st["momentum2"][rows] + (1 - self.beta2) * g * g
                    m_hat = st["momentum1"][rows] / (1 - self.beta1 ** self.steps)
                    v_hat = st["momentum2"][rows] / (1 - self.beta2 ** self.steps)
                    w[rows] -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
                w.grad = None
