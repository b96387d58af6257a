"""Target attention (DIN-style) over a jagged user history.

Each sample has a history of item embeddings h_1..h_L (L varies, may be 0) and one target
item embedding t. Scores are scaled bilinear products s_i = h_i . (W t) / sqrt(D); the
history pools to sum_i softmax(s)_i h_i within each sample (zeros for an empty history).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class TargetAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim, bias=False)
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, history_ND: Tensor, lengths_B: Tensor, target_BD: Tensor) -> Tensor:
        B, D = target_BD.shape
        sample_N = torch.repeat_interleave(torch.arange(B, device=lengths_B.device), lengths_B,
                                           output_size=history_ND.shape[0])
        query_BD = self.query(target_BD)
        scores_N = (history_ND * query_BD[sample_N]).sum(1) * self.scale
        # Softmax within each sample: subtract the sample's max (detached) for stability.
        max_B = torch.full((B,), -math.inf, device=scores_N.device).scatter_reduce(0, sample_N, scores_N.detach(), "amax")
        weights_N = torch.exp(scores_N - max_B[sample_N])
        total_B = torch.zeros(B, device=scores_N.device).index_add(0, sample_N, weights_N)
        weights_N = weights_N / total_B[sample_N]
        return torch.zeros(B, D, device=history_ND.device, dtype=history_ND.dtype).index_add(
            0, sample_N, history_ND * weights_N.unsqueeze(1))
