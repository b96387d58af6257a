"""Model-ready `Batch`es of host `Samples` (embshard.data.samples, re-exported here).

A `Batch` holds TorchRec KeyedJaggedTensors: ``sparse`` for the pooled features and, with
sequence features, ``sequence`` for the user history and the target item.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.data.samples import NUM_DENSE, Feature, FeatureLayout, Samples

__all__ = ["NUM_DENSE", "Batch", "Feature", "FeatureLayout", "Samples", "to_batch"]


@dataclass(frozen=True)
class Batch:
    dense: Tensor  # float32 [B, num_dense]
    sparse: KeyedJaggedTensor  # pooled features
    labels: Tensor  # float32 [B]
    sequence: KeyedJaggedTensor | None  # history and target, when the model has sequence features

    @property
    def size(self) -> int:
        return self.labels.shape[0]

    def to(self, device: torch.device) -> "Batch":
        if device.type == "cpu":
            return self
        return Batch(self.dense.to(device, non_blocking=True), self.sparse.to(device, non_blocking=True),
                     self.labels.to(device, non_blocking=True),
                     self.sequence.to(device, non_blocking=True) if self.sequence is not None else None)


def to_batch(samples: Samples, layout: FeatureLayout) -> Batch:
    P = len(layout.pooled)

    def kjt(features: tuple[Feature, ...], first: int) -> KeyedJaggedTensor:
        index = range(first, first + len(features))
        return KeyedJaggedTensor(keys=[f.name for f in features],
                                 values=torch.from_numpy(np.concatenate([samples.values[i] for i in index])),
                                 lengths=torch.from_numpy(np.ascontiguousarray(samples.lengths[first:first + len(features)]).reshape(-1)))

    return Batch(torch.from_numpy(np.ascontiguousarray(samples.dense)), kjt(layout.pooled, 0),
                 torch.from_numpy(np.ascontiguousarray(samples.labels)),
                 kjt(layout.sequence, P) if layout.sequence else None)
