"""Per-rank batch streams: `open_stream` picks the reader of the data config; `IndexedStream`
serves random-access sample sources (synthetic, numpy files).

Global batch s holds samples [s*G, (s+1)*G) of the source, G = world_size * batch_size;
rank r reads only its part [s*G + r*B, s*G + (r+1)*B). For training the source wraps
around at its end (epochs), so every rank always gets a batch and the ranks never disagree
on the number of steps. The position is the count of samples consumed by all ranks
together, which resumes exactly, on any world size. `open_eval_pass` reads a fixed eval set
once instead: each sample on one rank, none twice, whatever the world size; the last
batches are short, and a rank's may be empty or end early (TSV: its byte ranges run out).
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, Union

from embshard.data.batch import Batch, FeatureLayout, Samples, to_batch
from embshard.data.config import CriteoNpyConfig, DataConfig, SyntheticConfig
from embshard.data.criteo_npy import NpySource
from embshard.data.criteo_tsv import TsvStream
from embshard.data.malformed import MalformedLog
from embshard.data.synthetic import SyntheticSource


class SampleSource(Protocol):
    num_samples: int | None  # None: endless
    malformed: MalformedLog

    def read(self, start: int, count: int) -> Samples:
        """Samples [start, start + count), start + count <= num_samples; malformed ones dropped."""


class IndexedStream:
    """``stop``: end after samples [0, stop) of the source, each read once (an eval pass); None: wrap around forever."""

    def __init__(self, source: SampleSource, layout: FeatureLayout, rank: int, world_size: int, batch_size: int,
                 samples_consumed: int = 0, stop: int | None = None) -> None:
        assert stop is None or source.num_samples is None or stop <= source.num_samples
        self.source, self.layout = source, layout
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.samples_consumed, self.stop = samples_consumed, stop

    @property
    def malformed(self) -> MalformedLog:
        return self.source.malformed

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        start = self.samples_consumed + self.rank * self.batch_size
        count = self.batch_size
        if self.stop is not None:
            if self.samples_consumed >= self.stop:
                raise StopIteration
            start = min(start, self.stop)
            count = min(count, self.stop - start)
        self.samples_consumed += self.world_size * self.batch_size
        return to_batch(self._read(start, count), self.layout)

    def _read(self, start: int, count: int) -> Samples:
        if count == 0:
            return Samples.empty(self.layout)
        total = self.source.num_samples
        if total is None:
            return self.source.read(start, count)
        parts = []
        start %= total
        while count > 0:
            n = min(count, total - start)
            parts.append(self.source.read(start, n))
            start, count = 0, count - n
        return Samples.concat(parts)


Stream = Union[IndexedStream, TsvStream]


def open_stream(config: DataConfig, layout: FeatureLayout, rank: int, world_size: int, batch_size: int, split: str, *,
                samples_consumed: int = 0, position: dict[str, Any] | None = None) -> Stream:
    """This rank's endless stream of batches of ``split`` ("train" or "eval"), from ``samples_consumed``
    (all ranks together) on; ``position`` is a TSV reader's exact place from a checkpoint of the same world size."""
    if isinstance(config, SyntheticConfig):
        stream: Stream = IndexedStream(SyntheticSource(config, layout, split), layout, rank, world_size, batch_size,
                                       samples_consumed)
    elif isinstance(config, CriteoNpyConfig):
        stream = IndexedStream(NpySource(config, layout, split), layout, rank, world_size, batch_size, samples_consumed)
    else:
        files = config.train_files if split == "train" else config.eval_files
        skip = 0 if position is not None else samples_consumed // world_size
        stream = TsvStream(files, layout, rank, world_size, batch_size, config.strict, position, skip, f"data.{split}_files")
        stream.samples_consumed = samples_consumed
    return stream


def open_eval_pass(config: DataConfig, layout: FeatureLayout, rank: int, world_size: int, batch_size: int,
                   num_samples: int) -> Stream:
    """This rank's share of the eval set, in batches of at most ``batch_size``, each sample once: synthetic data,
    its eval split's samples [0, num_samples); Criteo files, every sample of the eval files or days."""
    if isinstance(config, SyntheticConfig):
        return IndexedStream(SyntheticSource(config, layout, "eval"), layout, rank, world_size, batch_size, stop=num_samples)
    if isinstance(config, CriteoNpyConfig):
        source = NpySource(config, layout, "eval")
        return IndexedStream(source, layout, rank, world_size, batch_size, stop=source.num_samples)
    return TsvStream(config.eval_files, layout, rank, world_size, batch_size, config.strict, key="data.eval_files",
                     once=True)
