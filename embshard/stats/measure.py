"""Access statistics of the training data, per table: what embshard-stats measures (numpy, no torch).

    stats = measure(specs, data_config, num_samples=100_000, batch_size=4096)
    new_specs = [measured_spec(s, stats[s.name]) for s in specs]   # pooling_factor, hot_rows

`sample_batches` reads the training reader of ``data=`` (synthetic, criteo_tsv, criteo_npy;
the train split, from its first sample) with the training feature -> table mapping.
`TableAccumulator` folds batches into bag-length moments and a `counters` counter over all of
a table's features: its memory depends on the table's rows, not on the number of samples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from embshard.data.config import CriteoNpyConfig, CriteoTsvConfig, DataConfig, SyntheticConfig
from embshard.data.criteo_npy import NpySource
from embshard.data.criteo_tsv import TsvStream
from embshard.data.samples import FeatureLayout, Samples
from embshard.data.synthetic import SyntheticSource
from embshard.planner.cost.hot_rows import HOT_FRACTIONS as HOT_ROW_FRACTIONS
from embshard.specs import TableSpec
from embshard.stats.counters import new_counter

# the 0.1%, 1%, 10%, 50%, and the shares the planner prices between them: its cache sizes (5%, 20%;
# embshard.planner.cost.tiers.CACHE_FRACTIONS) and hot sets (5%), measured rather than interpolated linearly
HOT_FRACTIONS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5)


@dataclass(frozen=True)
class TableStats:
    name: str
    num_rows: int
    num_features: int
    num_samples: int
    num_lookups: int
    pooling_factor: float  # mean ids per sample and feature
    pooling_std: float  # std of a bag's length (over all the table's bags)
    empty_bag_share: float
    distinct_rows: float  # rows looked up at least once (estimated where sketched)
    hot_rows: tuple[tuple[float, float], ...]  # (fraction of rows, fraction of lookups), hottest rows first
    method: str  # "exact", or "sketch (D=...)" (embshard.stats.counters)
    # ids of the hottest rows, hottest first: as many as the planner may replicate (embshard-stats hot_ids=)
    hottest_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False)


class TableAccumulator:
    def __init__(self, spec: TableSpec, exact_max_rows: int, sketch_rows: int) -> None:
        self.spec = spec
        self.counter = new_counter(spec.num_embeddings, exact_max_rows, sketch_rows)
        self.bags = self.ids = self.ids_squared = self.empty = 0

    def add(self, lengths: np.ndarray, ids: np.ndarray) -> None:
        """One feature's bags of a batch: their lengths and their ids, concatenated."""
        self.bags += len(lengths)
        self.ids += int(lengths.sum())
        self.ids_squared += int(np.square(lengths).sum())
        self.empty += int(np.count_nonzero(lengths == 0))
        self.counter.add(ids)

    def result(self, num_samples: int, fractions: Sequence[float]) -> TableStats:
        mean = self.ids / self.bags if self.bags else 0.0
        variance = max(self.ids_squared / self.bags - mean * mean, 0.0) if self.bags else 0.0
        curve = self.counter.curve(fractions)
        return TableStats(self.spec.name, self.spec.num_embeddings, self.spec.num_features, num_samples, self.ids,
                          mean, math.sqrt(variance), self.empty / self.bags if self.bags else 0.0,
                          self.counter.distinct_rows(), tuple(zip(map(float, fractions), curve)), self.counter.method,
                          self.counter.hottest(max_hot_rows(self.spec.num_embeddings)))


def max_hot_rows(num_rows: int) -> int:
    """The most hot rows the planner offers to replicate for a table of num_rows (embshard.planner.cost.hot_rows)."""
    return max(1, round(max(HOT_ROW_FRACTIONS) * num_rows))


def sample_batches(specs: Sequence[TableSpec], data: DataConfig, num_samples: int, batch_size: int) -> Iterator[Samples]:
    """The first ``num_samples`` training samples of ``data`` (fewer where the files hold fewer), in batches."""
    layout = FeatureLayout.from_specs(specs)
    if isinstance(data, CriteoTsvConfig):
        stream = TsvStream(data.train_files, layout, 0, 1, batch_size, data.strict, key="data.train_files", once=True)
        read = 0
        while read < num_samples:
            try:
                samples = stream.next_samples()
            except StopIteration:
                return
            samples = samples.slice(0, min(len(samples), num_samples - read))
            read += len(samples)
            yield samples
        return
    source = SyntheticSource(data, layout, "train") if isinstance(data, SyntheticConfig) else NpySource(data, layout, "train")
    total = num_samples if source.num_samples is None else min(num_samples, source.num_samples)
    for start in range(0, total, batch_size):
        yield source.read(start, min(batch_size, total - start))


def measure(specs: Sequence[TableSpec], data: DataConfig, num_samples: int, batch_size: int, *,
            exact_max_rows: int, sketch_rows: int, fractions: Sequence[float] = HOT_FRACTIONS,
            progress: Callable[[int], None] = lambda n: None) -> dict[str, TableStats]:
    """Statistics of each pooled table over the first ``num_samples`` training samples; ``progress(n)`` after each batch."""
    sequence = [s.name for s in specs if not s.pooled]
    if sequence:
        raise ValueError(f"tables: {sequence} are sequence tables (pooled: false); embshard-stats measures pooled "
                         "tables (bags of ids), as the Criteo readers and the synthetic stream give them")
    if isinstance(data, (CriteoTsvConfig, CriteoNpyConfig)):
        _check_sources(data)
    accumulators = {s.name: TableAccumulator(s, exact_max_rows, sketch_rows) for s in specs}
    owners = [accumulators[s.name] for s in specs for _ in s.feature_names]  # FeatureLayout's order
    seen = 0
    for samples in sample_batches(specs, data, num_samples, batch_size):
        for acc, lengths, ids in zip(owners, samples.lengths, samples.values):
            acc.add(lengths, ids)
        seen += len(samples)
        progress(len(samples))
    return {name: acc.result(seen, fractions) for name, acc in accumulators.items()}


def _check_sources(data: CriteoTsvConfig | CriteoNpyConfig) -> None:
    if isinstance(data, CriteoTsvConfig) and not data.train_files:
        raise ValueError("data.train_files: empty; list the Criteo day files to measure, e.g. data.train_files=[day_0]")
    if isinstance(data, CriteoNpyConfig) and not data.dir:
        raise ValueError("data.dir: empty; give the folder of day_{d}_dense/sparse/labels.npy, e.g. data.dir=/data/criteo_npy")


def measured_spec(spec: TableSpec, stats: TableStats) -> TableSpec:
    """``spec`` with the measured pooling factor and hot_rows curve."""
    if stats.num_lookups == 0:
        raise ValueError(f"tables ({spec.name}): no ids in {stats.num_samples} samples (every bag empty), so no pooling "
                         "factor to write; read more samples (num_samples=) or drop the table")
    return dataclasses.replace(spec, pooling_factor=stats.pooling_factor, hot_rows=stats.hot_rows)
