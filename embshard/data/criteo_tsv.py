"""Reader of the raw Criteo click logs (Kaggle train.txt, 1TB day_0..day_23): tab-separated
lines ``label, 13 integers, 26 hex strings`` with empty fields for missing values.

    stream = TsvStream(CriteoTsvConfig(train_files=("day_0",)), layout, rank, world_size, batch_size)

Rank r of W reads only its byte range [r/W, (r+1)/W) of every file (a line belongs to the
range its first byte falls in) and wraps around to its first file at the end (``once``: stops
there instead, after a last short batch: an eval pass). Dense values
become log1p(max(x, 0)); a categorical value becomes int(hex, 16) % the table's rows (an
empty one is 0). Malformed lines (field count, a label other than 0/1, a non-integer or
non-hex field) are counted and skipped, or stop the run with ``strict``.
The position (file, byte offset, epoch) resumes exactly on the same world size; on another
world size each rank skips its share of the samples consumed from the start of its range.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

import numpy as np

from embshard.data.config import check_files
from embshard.data.malformed import MalformedLog
from embshard.data.samples import NUM_DENSE, FeatureLayout, Samples

if TYPE_CHECKING:
    from embshard.data.batch import Batch

NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL


def check_layout(layout: FeatureLayout, where: str) -> None:
    if len(layout.pooled) != NUM_CATEGORICAL or layout.sequence or layout.num_dense != NUM_DENSE:
        raise ValueError(f"{where}: Criteo has {NUM_DENSE} dense and {NUM_CATEGORICAL} categorical features, one per "
                         f"pooled table, and no sequence features; the tables give {len(layout.pooled)} pooled and "
                         f"{len(layout.sequence)} sequence features (use tables=criteo_small/criteo_kaggle, "
                         "model.sequence.enabled=false)")


def parse_line(line: bytes, rows: list[int]) -> tuple[float, list[float], list[int]] | str:
    """(label, dense, ids) of one line, or what is wrong with it."""
    fields = line.rstrip(b"\r\n").split(b"\t")
    if len(fields) != NUM_FIELDS:
        return f"expected {NUM_FIELDS} tab-separated fields, got {len(fields)}"
    if fields[0] not in (b"0", b"1"):
        return f"label must be 0 or 1, got {fields[0][:20]!r}"
    try:
        dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1:1 + NUM_DENSE]]
    except ValueError:
        return "a dense field is not an integer"
    try:
        ids = [int(v, 16) % n if v else 0 for v, n in zip(fields[1 + NUM_DENSE:], rows)]
    except ValueError:
        return "a categorical field is not hexadecimal"
    return float(fields[0] == b"1"), dense, ids


class TsvStream:
    def __init__(self, files: tuple[str, ...], layout: FeatureLayout, rank: int, world_size: int, batch_size: int,
                 strict: bool = False, position: dict[str, Any] | None = None, skip_samples: int = 0,
                 key: str = "data.train_files", once: bool = False) -> None:
        check_layout(layout, "data=criteo_tsv")
        if not files:
            raise ValueError("data.train_files / data.eval_files: no files given; list the Criteo .tsv/.txt day files")
        self.layout, self.rank, self.world_size, self.batch_size = layout, rank, world_size, batch_size
        self.once = once
        self.rows = [f.num_embeddings for f in layout.pooled]
        check_files(files, key)
        self.ranges = []
        for path in files:
            size = os.path.getsize(path)
            self.ranges.append((path, size * rank // world_size, size * (rank + 1) // world_size))
        self.malformed = MalformedLog(strict)
        self.samples_consumed = 0  # by all ranks, as counted by the trainer
        pos = position or {"file": 0, "offset": None, "epoch": 0}
        self.file, self.epoch, self.offset = pos["file"], pos["epoch"], pos["offset"]
        self.last_valid_epoch = self.epoch
        self.lines = self._lines(pos["offset"])
        for _ in range(skip_samples):
            self._next_sample()

    def position(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "epoch": self.epoch}

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        from embshard.data.batch import to_batch  # torch; next_samples (embshard-stats) needs none

        return to_batch(self.next_samples(), self.layout)

    def next_samples(self) -> Samples:
        """The next batch's samples on the host (StopIteration at the end of a single pass)."""
        parsed = []
        try:
            while len(parsed) < self.batch_size:
                parsed.append(self._next_sample())
        except StopIteration:  # the end of a single pass (once)
            if not parsed:
                raise
        self.samples_consumed += self.world_size * self.batch_size
        ids = np.array([p[2] for p in parsed], dtype=np.int64).reshape(-1, NUM_CATEGORICAL)  # [B, 26]
        return Samples(np.array([p[1] for p in parsed], dtype=np.float32).reshape(-1, NUM_DENSE),
                       np.array([p[0] for p in parsed], np.float32),
                       np.ones((NUM_CATEGORICAL, len(parsed)), np.int64), tuple(ids.T.copy()))

    def _next_sample(self) -> tuple[float, list[float], list[int]]:
        while True:
            where, line = next(self.lines)
            parsed = parse_line(line, self.rows)
            if not isinstance(parsed, str):
                self.last_valid_epoch = self.epoch
                return parsed
            self.malformed.record(where, parsed)
            if self.epoch > self.last_valid_epoch + 1:
                raise ValueError(f"data: every line of rank {self.rank}'s share of {[r[0] for r in self.ranges]} is "
                                 f"malformed ({self.malformed.examples[0]}); check the files' format")

    def _lines(self, offset: int | None) -> Iterator[tuple[str, bytes]]:
        """(where, line) of this rank's ranges, forever (once: one pass); sets self.offset to the next line's start."""
        empty_passes = 0
        while True:
            found = False
            path, start, end = self.ranges[self.file]
            with open(path, "rb") as f:
                self.offset = offset if offset is not None else _first_line_at(f, start)
                f.seek(self.offset)
                while self.offset < end:
                    line = f.readline()
                    if not line:
                        break
                    where = f"{path} byte {self.offset}"
                    self.offset += len(line)
                    found = True
                    yield where, line
            offset = None
            self.file += 1
            if self.file == len(self.ranges):
                if self.once:
                    return
                self.file, self.epoch = 0, self.epoch + 1
                empty_passes = 0 if found else empty_passes + 1
                if empty_passes:
                    raise ValueError(f"data: rank {self.rank}'s share of {[r[0] for r in self.ranges]} holds no lines "
                                     f"(files too small for {self.world_size} ranks); use more data or fewer ranks")


def _first_line_at(f: BinaryIO, start: int) -> int:
    """Offset of the first line that starts at or after ``start``."""
    if start == 0:
        return 0
    f.seek(start - 1)
    f.readline()  # the rest of the line that began before start (or just its newline)
    return f.tell()
