"""DLRM: bottom MLP over dense features, pooled embeddings, an interaction, top MLP.

    model = DLRM(DLRMConfig(), tables, num_dense=13)   # unsharded TorchRec modules inside
    model = shard_model(model, plan, pg)               # the same model, tables sharded
    logits_B = model(dense_BD, sparse_kjt)             # sequence_kjt too if sequence.enabled

Interactions: ``dot`` (DLRM, TorchRec's `torchrec.models.dlrm.DLRM`: every embedding and the
bottom MLP's output have one width, their pairwise dot products feed the top MLP) or ``dcn``
(DLRM-v2 as in MLPerf: a low-rank DCNv2 cross network over the concatenation).
With ``sequence.enabled`` a user-history feature is looked up in an `EmbeddingCollection`
(a sequence table, sharded like any other) and pooled by attention against a target item
embedding from the same table; both vectors join the interaction.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.interop.torchrec import to_embedding_configs
from embshard.models.attention import TargetAttention
from embshard.models.config import HISTORY_FEATURE, TARGET_FEATURE, DLRMConfig
from embshard.models.interaction import CrossInteraction, DotInteraction
from embshard.models.linear import Linear
from embshard.specs import TableSpec


def mlp(in_features: int, sizes: Sequence[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, size in enumerate(sizes):
        layers.append(Linear(in_features, size))
        if last_activation or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        in_features = size
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """tables: the pooled tables, plus the sequence table when ``config.sequence.enabled``.
    embedding_device: where the unsharded tables are allocated ("meta" when they are swapped for
    sharded ones that load their own weights, as serving does)."""

    def __init__(self, config: DLRMConfig, tables: Sequence[TableSpec], num_dense: int,
                 embedding_device: torch.device | str = "cpu") -> None:
        super().__init__()
        pooled = [t for t in tables if t.pooled]
        sequence = [t for t in tables if not t.pooled]
        check_tables(config, pooled, sequence)
        bag_configs, sequence_configs = to_embedding_configs(tables)
        D = config.dense_dim
        self.config = config
        self.num_features = sum(t.num_features for t in pooled)
        self.bottom = mlp(num_dense, config.bottom_mlp, last_activation=True)
        self.sparse = EmbeddingBagCollection(tables=bag_configs, device=torch.device(embedding_device))
        self.sequence = EmbeddingCollection(tables=sequence_configs, device=torch.device(embedding_device)) if sequence else None
        self.attention = TargetAttention(D) if sequence else None
        num_vectors = self.num_features + (2 if sequence else 0)  # + pooled history and target
        if config.interaction == "dot":
            self.interaction: nn.Module = DotInteraction(num_vectors + 1)
            top_in = DotInteraction.output_dim(num_vectors + 1, D)
        else:
            width = D + sum(t.embedding_dim * t.num_features for t in pooled) + (2 * D if sequence else 0)
            self.interaction = CrossInteraction(width, config.dcn_num_layers, config.dcn_low_rank)
            top_in = width
        self.top = mlp(top_in, config.top_mlp, last_activation=False)

    def forward(self, dense_BD: Tensor, sparse: KeyedJaggedTensor, sequence: KeyedJaggedTensor | None = None) -> Tensor:
        embeddings_BE = self.sparse(sparse).values()
        extra = []
        if self.sequence is not None:
            assert sequence is not None, "the model has sequence features; pass the sequence KeyedJaggedTensor"
            per_feature = self.sequence(sequence)
            target_BD = per_feature[TARGET_FEATURE].values()  # one target item per sample
            history = per_feature[HISTORY_FEATURE]
            extra = [self.attention(history.values(), history.lengths(), target_BD), target_BD]
        if extra:
            embeddings_BE = torch.cat([embeddings_BE, *extra], dim=1)
        # After the look-ups: backward runs the later of two ready nodes first, so the bottom MLP's gradients (the
        # last DDP bucket) are ready before the embeddings' backward, whose all-to-all and kernels their all-reduce
        # then overlaps.
        dense_BD = self.bottom(dense_BD)
        if self.config.interaction == "dot":
            B, D = dense_BD.shape  # explicit vector count: B may be 0 (a serving rank without samples)
            out = self.interaction(dense_BD, embeddings_BE.view(B, embeddings_BE.shape[1] // D, D))
        else:
            out = self.interaction(dense_BD, embeddings_BE)
        return self.top(out).squeeze(1)

    def embedding_modules(self) -> list[nn.Module]:
        return [m for m in (self.sparse, self.sequence) if m is not None]


def check_tables(config: DLRMConfig, pooled: Sequence[TableSpec], sequence: Sequence[TableSpec]) -> None:
    if not pooled:
        raise ValueError("tables: DLRM needs at least one pooled table (pooled: true)")
    D = config.dense_dim
    if config.interaction == "dot":
        other = sorted({t.name for t in pooled if t.embedding_dim != D})
        if other:
            raise ValueError(f"tables: dot interaction needs every embedding_dim = model.bottom_mlp[-1] = {D}, but "
                             f"{other[:5]}{' ...' if len(other) > 5 else ''} differ; set the tables' dims or the bottom "
                             "MLP's last width, or use model=dcnv2")
    want = (HISTORY_FEATURE, TARGET_FEATURE)
    if config.sequence.enabled:
        if len(sequence) != 1 or sequence[0].feature_names != want or sequence[0].embedding_dim != D:
            raise ValueError(f"tables: model.sequence needs exactly one sequence table with features {list(want)} and "
                             f"dim {D}, got {[(t.name, t.feature_names, t.embedding_dim) for t in sequence]}")
    elif sequence:
        raise ValueError(f"tables: sequence table(s) {[t.name for t in sequence]} given but model.sequence.enabled is false; "
                         "DLRM reads sequence features only through model.sequence")
