"""Feature interactions of DLRM: pairwise dot products, or DCNv2's low-rank cross network.

`DotInteraction` is DLRM's (and TorchRec's InteractionArch): the dense vector and the F
embeddings, all of width D, interact by dot products of every pair; the output is the dense
vector followed by the F+1 choose 2 products. `CrossInteraction` is DLRM-v2's (MLPerf
DLRM-DCNv2): the dense vector and the embeddings are concatenated and go through
TorchRec's `LowRankCrossNet`; the output keeps the concatenated width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchrec.modules.crossnet import LowRankCrossNet


class DotInteraction(nn.Module):
    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
        # Flat positions of the pairs in [V*V]: index_select's backward (index_add) is about 2x faster on
        # CPU than that of products[:, rows, cols] (an accumulating index_put), which TorchRec uses.
        self.register_buffer("pairs", rows * num_vectors + cols, persistent=False)

    @staticmethod
    def output_dim(num_vectors: int, dim: int) -> int:
        return dim + num_vectors * (num_vectors - 1) // 2

    def forward(self, dense_BD: Tensor, embeddings_BFD: Tensor) -> Tensor:
        vectors_BVD = torch.cat([dense_BD.unsqueeze(1), embeddings_BFD], dim=1)
        products_BVV = torch.bmm(vectors_BVD, vectors_BVD.transpose(1, 2))
        return torch.cat([dense_BD, products_BVV.flatten(1).index_select(1, self.pairs)], dim=1)


class CrossInteraction(nn.Module):
    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        self.crossnet = LowRankCrossNet(in_features=in_features, num_layers=num_layers, low_rank=low_rank)

    def forward(self, dense_BD: Tensor, embeddings_BE: Tensor) -> Tensor:
        return self.crossnet(torch.cat([dense_BD, embeddings_BE], dim=1))
