"""Per-table access counters of embshard-stats: exact counts for small tables, a sketch for big ones.

    counter = new_counter(num_rows, exact_max_rows=1 << 22, sketch_rows=1 << 20)
    counter.add(ids)                                  # any number of times
    counter.curve((0.001, 0.01, 0.1, 0.5))            # fraction of lookups to the hottest rows
    counter.distinct_rows()                           # rows seen at least once
    counter.hottest(k)                                # ids of the k hottest rows, hottest first

Memory depends on the table's rows and the options, never on the number of lookups: ids are
buffered up to a fixed size and then folded into the counts.

Both hand their counts to `embshard.stats.tail.estimated_curve`: rows seen often are taken as
measured, the lookups to the others spread over the rest of the table by a power law fitted to
how many distinct rows they touched (a sample with fewer lookups than the table has rows cannot
show its tail; its own curve would reach 1 at the share of rows it touched).

`ExactCounter` (num_rows <= exact_max_rows) keeps an int64 count per row (8 B x num_rows).

`SketchCounter` (bigger tables) keeps about 3 x sketch_rows counters (int64 key and count each):
- heavy hitters: a Misra-Gries summary of k = sketch_rows rows (the mergeable form of Agarwal
  et al., 2012: add a buffer's exact counts, keep the k largest, subtract the (k+1)-th largest
  from all, D = the sum of what was subtracted). A kept row's count c satisfies
  f - D <= c <= f for its true count f, D <= n / (k + 1) for n lookups, and every row with
  f > D is kept.
- a uniform sample of the rows: a row is sampled when a hash of its index falls below the rate
  p = sketch_rows / num_rows (independent of its popularity); sampled rows are counted exactly.
The curve's head is the kept rows with c >= D, counted c + D (within D of f, at most 2 f; exact
where the row is also sampled); every sampled row outside the head stands for 1 / p rows like
it. Error of a curve point: the head's counts are off by at most D each (D is shown in the
summary, "sketch (D=...)"), the tail's distinct rows (what its fit uses) have a relative sampling
error of about 1 / sqrt(sampled rows seen). tests/stats asserts 0.01 against exact counts of
the same Zipf streams (s 0.8, 1.1, 1.3; 1 M lookups) at sketch_rows = rows / 10.
Distinct rows are estimated the same way (head rows plus sampled rows outside it / p).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from embshard.data.synthetic import mix64
from embshard.stats.tail import MIN_COUNT, estimated_curve

_HASH_SALT = np.uint64(0x5DEECE66D)


def new_counter(num_rows: int, exact_max_rows: int, sketch_rows: int) -> "ExactCounter | SketchCounter":
    if num_rows <= exact_max_rows:
        return ExactCounter(num_rows)
    return SketchCounter(num_rows, sketch_rows)


class _Buffer:
    """Ids collected until ``limit`` of them are waiting; `take` hands them over as one array."""

    def __init__(self, limit: int) -> None:
        self.limit, self.parts, self.size = limit, [], 0

    def add(self, ids: np.ndarray) -> bool:
        """Buffer ``ids``; True when the buffer is full and should be taken."""
        self.parts.append(ids)
        self.size += len(ids)
        return self.size >= self.limit

    def take(self) -> np.ndarray:
        ids = np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)
        self.parts, self.size = [], 0
        return ids


class ExactCounter:
    method = "exact"

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self.counts = np.zeros(num_rows, np.int64)
        self.buffer = _Buffer(max(num_rows // 4, 1 << 16))  # a bincount costs O(num_rows): amortise it

    def add(self, ids: np.ndarray) -> None:
        if self.buffer.add(ids):
            self._flush()

    def _flush(self) -> None:
        ids = self.buffer.take()
        if len(ids):
            self.counts += np.bincount(ids, minlength=self.num_rows)

    def distinct_rows(self) -> float:
        self._flush()
        return float(np.count_nonzero(self.counts))

    def hottest(self, k: int) -> np.ndarray:
        """The ids of the k most looked-up rows, hottest first (ties: lower id first; rows never seen last)."""
        self._flush()
        return np.argsort(-self.counts, kind="stable")[:k].astype(np.int64)

    def curve(self, fractions: Sequence[float]) -> tuple[float, ...]:
        self._flush()
        seen = self.counts[self.counts > 0]
        return estimated_curve(seen, np.ones(len(seen)), float(seen.sum()), self.num_rows, fractions)


class SketchCounter:
    def __init__(self, num_rows: int, sketch_rows: int) -> None:
        assert sketch_rows < num_rows
        self.num_rows, self.k = num_rows, sketch_rows
        self.rate = sketch_rows / num_rows
        self._threshold = np.uint64(min(int(self.rate * 2.0**64), 2**64 - 1))
        self.n = 0
        self.decrement = 0  # D: the sum of the cuts, what each heavy count may undercount
        self.heavy_keys, self.heavy_counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.sample_keys, self.sample_counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.buffer = _Buffer(sketch_rows)

    def add(self, ids: np.ndarray) -> None:
        self.n += len(ids)
        if self.buffer.add(ids):
            self._flush()

    def _flush(self) -> None:
        keys, counts = np.unique(self.buffer.take(), return_counts=True)
        if not len(keys):
            return
        self.heavy_keys, self.heavy_counts = _merge(self.heavy_keys, self.heavy_counts, keys, counts)
        if len(self.heavy_keys) > self.k:  # Misra-Gries: keep the k largest, less the (k+1)-th largest
            cut = np.partition(self.heavy_counts, len(self.heavy_counts) - self.k - 1)[len(self.heavy_counts) - self.k - 1]
            keep = self.heavy_counts > cut
            self.heavy_keys, self.heavy_counts = self.heavy_keys[keep], self.heavy_counts[keep] - cut
            self.decrement += int(cut)
        sampled = self.sampled(keys)
        self.sample_keys, self.sample_counts = _merge(self.sample_keys, self.sample_counts, keys[sampled], counts[sampled])

    def sampled(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row is in the uniform row sample (a fixed hash of the row index)."""
        return mix64(rows.astype(np.uint64) ^ _HASH_SALT) < self._threshold

    @property
    def method(self) -> str:
        self._flush()
        return f"sketch (D={self.decrement})"

    def _head_and_tail(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Heavy rows' counts (exact where sampled), and the sampled rows outside them with their counts."""
        self._flush()
        trusted = self.heavy_counts >= self.decrement  # true count in [c, c + D], c + D at most twice it
        keys = self.heavy_keys[trusted]
        head = self.heavy_counts[trusted] + self.decrement
        in_sample = np.isin(keys, self.sample_keys, assume_unique=True)
        where = np.searchsorted(self.sample_keys, keys[in_sample])
        head[in_sample] = self.sample_counts[where]
        tail = self.sample_counts[~np.isin(self.sample_keys, keys, assume_unique=True)]
        return keys, head, tail

    def hottest(self, k: int) -> np.ndarray:
        """Up to k ids of the heavy hitters, hottest first (the sketch knows at most sketch_rows of them)."""
        keys, head, _ = self._head_and_tail()
        order = np.lexsort((keys, -head))  # by count, ties by id
        return keys[order][:k].astype(np.int64)

    def distinct_rows(self) -> float:
        keys, _, tail = self._head_and_tail()
        return float(min(len(keys) + len(tail) / self.rate, self.num_rows))

    def curve(self, fractions: Sequence[float]) -> tuple[float, ...]:
        keys, head, _ = self._head_and_tail()
        # D = 0: every row seen is kept, counted exactly. Else rows with f <= D may be missing: the head is
        # the rows seen often, the row sample stands for every row outside it.
        keep = head >= MIN_COUNT if self.decrement else np.ones(len(head), bool)
        keys, head = keys[keep], head[keep]
        tail = self.sample_counts[~np.isin(self.sample_keys, keys, assume_unique=True)]
        rest_lookups = max(self.n - float(head.sum()), 0.0)  # the head's c + D may overcount
        # each sampled row stands for 1/p rows like it and for its lookups, scaled so that all add up to n
        scale = rest_lookups / tail.sum() if tail.sum() > 0 else 0.0
        weights = np.concatenate([np.ones(len(head)), np.full(len(tail), 1 / self.rate)])
        lookups = np.concatenate([head, tail * scale]).astype(np.float64)
        return estimated_curve(np.concatenate([head, tail]), weights, float(self.n), self.num_rows, fractions, lookups)

    def memory_entries(self) -> int:
        """Keys and counts held now (each int64): bounded by about 3 x sketch_rows, whatever the stream's length."""
        return len(self.heavy_keys) + len(self.sample_keys) + self.buffer.size


def _merge(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys of both and their summed counts."""
    merged, inverse = np.unique(np.concatenate([keys, new_keys]), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate([counts, new_counts]), minlength=len(merged)).astype(np.int64)
