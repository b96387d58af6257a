"""What the data sources produce on the host (numpy, no torch): `Samples` of a `FeatureLayout`.

`FeatureLayout` says which categorical features the model reads, in order, and how many
rows each one's table has (ids are row indices). `embshard.data.batch` turns samples into
model-ready batches (torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from embshard.specs import TableSpec

NUM_DENSE = 13  # Criteo's integer features


@dataclass(frozen=True)
class Feature:
    name: str
    table: str
    num_embeddings: int
    pooling_factor: float


@dataclass(frozen=True)
class FeatureLayout:
    pooled: tuple[Feature, ...]
    sequence: tuple[Feature, ...]  # (history, target) of the sequence table, or ()
    num_dense: int = NUM_DENSE
    max_history_length: int = 0  # history lengths are 1..max_history_length

    @classmethod
    def from_specs(cls, specs: Sequence[TableSpec], num_dense: int = NUM_DENSE,
                   max_history_length: int = 0) -> "FeatureLayout":
        def features(pooled: bool) -> tuple[Feature, ...]:
            return tuple(Feature(f, s.name, s.num_embeddings, s.pooling_factor)
                         for s in specs if s.pooled == pooled for f in s.feature_names)
        return cls(features(True), features(False), num_dense, max_history_length)

    @property
    def features(self) -> tuple[Feature, ...]:
        return self.pooled + self.sequence


@dataclass(frozen=True)
class Samples:
    """n samples on the host: ids of each feature (pooled, then sequence) as jagged arrays."""

    dense: np.ndarray  # float32 [n, num_dense], already transformed (log)
    labels: np.ndarray  # float32 [n], 0 or 1
    lengths: np.ndarray  # int64 [num_features, n]
    values: tuple[np.ndarray, ...]  # per feature: int64 ids of its n bags, concatenated

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def empty(layout: FeatureLayout) -> "Samples":
        """No samples (a rank's share of the last eval batches may be empty)."""
        features = layout.features
        return Samples(np.zeros((0, layout.num_dense), np.float32), np.zeros(0, np.float32),
                       np.zeros((len(features), 0), np.int64), tuple(np.zeros(0, np.int64) for _ in features))

    def slice(self, start: int, stop: int) -> "Samples":
        offsets = np.concatenate([np.zeros((len(self.values), 1), np.int64), np.cumsum(self.lengths, axis=1)], axis=1)
        values = tuple(v[offsets[f, start]:offsets[f, stop]] for f, v in enumerate(self.values))
        return Samples(self.dense[start:stop], self.labels[start:stop], self.lengths[:, start:stop], values)

    def select(self, keep: np.ndarray) -> "Samples":
        """The samples where the boolean mask ``keep`` [n] is true."""
        values = tuple(v[np.repeat(keep, lengths)] for v, lengths in zip(self.values, self.lengths))
        return Samples(self.dense[keep], self.labels[keep], self.lengths[:, keep], values)

    @staticmethod
    def concat(parts: Sequence["Samples"]) -> "Samples":
        if len(parts) == 1:
            return parts[0]
        return Samples(np.concatenate([p.dense for p in parts]), np.concatenate([p.labels for p in parts]),
                       np.concatenate([p.lengths for p in parts], axis=1),
                       tuple(np.concatenate(vs) for vs in zip(*(p.values for p in parts))))
