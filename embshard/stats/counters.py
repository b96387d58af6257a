"""Per-table access counters of embshard-stats: exact counts for small tables, a sketch for big ones.

    counter = new_counter(num_rows, exact_max_rows=1 << 22, sketch_rows=1 << 20)
    counter.add(ids)                                  # any number of times
    counter.curve((0.001, 0.01, 0.1, 0.5))            # fraction of lookups to the hottest rows
    counter.distinct_rows()                           # rows seen at least once
    counter.hottest(k)                                # ids of the k hottest rows, hottest first

Memory depends on the table's rows and the options, never on the number of lookups: ids are
buffered up to a fixed size and then folded into the counts.

`ExactCounter` (num_rows <= exact_max_rows) keeps an int64 count per row (8 B x num_rows);
its curve is exact for the lookups seen.

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
it, the tail's counts scaled so that all lookups add up to n. Error of a curve point: the head's
counts are off by at most D each (D is shown in the summary, "sketch (D=...)"), the tail's share
has a relative sampling error of about 1 / sqrt(sampled rows in the segment). Measured against
exact counts of the same Zipf streams (s 0.8, 1.1, 1.3; 1 M lookups; tests/stats): at most
0.0025 with sketch_rows = rows / 10; with rows / 50, below 0.02 where that is 200 counters or
more, but 0.14 for a flat table (s 0.8) with 20. tests/stats asserts 0.01 at rows / 10.
Distinct rows are estimated the same way (head rows plus sampled rows outside it / p).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from embshard.data.synthetic import mix64

_HASH_SALT = np.uint64(0x5DEECE66D)


def new_counter(num_rows: int, exact_max_rows: int, sketch_rows: int) -> "ExactCounter | SketchCounter":
    if num_rows <= exact_max_rows:
        return ExactCounter(num_rows)
    return SketchCounter(num_rows, sketch_rows)


def curve_points(cum_rows: np.ndarray, cum_lookups: np.ndarray, num_rows: int, fractions: Sequence[float]) -> tuple[float, ...]:
    """The fraction of lookups that go to the hottest ``f * num_rows`` rows, for each f.

    ``cum_rows``/``cum_lookups``: a piecewise-linear cumulative curve from (0, 0), hottest first
    (rows within a segment equally hot)."""
    total = cum_lookups[-1]
    if total == 0:
        return tuple(float(f) for f in fractions)  # nothing seen: no skew measured
    points = np.interp(np.asarray(fractions, np.float64) * num_rows, cum_rows, cum_lookups) / total
    # A hot set gets at least its uniform share (rounding in the interpolation aside).
    return tuple(float(max(p, f)) for p, f in zip(np.minimum(points, 1.0), fractions))


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
        hottest_first = np.sort(self.counts)[::-1]
        cum_lookups = np.concatenate([[0], np.cumsum(hottest_first)]).astype(np.float64)
        return curve_points(np.arange(self.num_rows + 1, dtype=np.float64), cum_lookups, self.num_rows, fractions)


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
        _, head, tail = self._head_and_tail()
        rest_lookups = max(self.n - float(head.sum()), 0.0)  # the head's c + D may overcount
        rest_rows = self.num_rows - len(head)
        if len(tail) and tail.sum() > 0:
            weights = np.full(len(tail), 1 / self.rate)
            tail_counts = tail * (rest_lookups / tail.sum())  # each sampled row stands for 1/p rows like it
        else:  # no sampled row outside the heavy ones: spread what is left evenly
            weights, tail_counts = np.array([float(rest_rows)]), np.array([rest_lookups])
        rows = np.concatenate([np.ones(len(head)), weights])
        lookups = np.concatenate([head.astype(np.float64), tail_counts])
        order = np.argsort(-(lookups / rows), kind="stable")  # hottest per row first
        cum_rows = np.concatenate([[0.0], np.cumsum(rows[order])])
        cum_lookups = np.concatenate([[0.0], np.cumsum(lookups[order])])
        if cum_rows[-1] < self.num_rows:  # rows never seen
            cum_rows, cum_lookups = np.append(cum_rows, self.num_rows), np.append(cum_lookups, cum_lookups[-1])
        return curve_points(cum_rows, cum_lookups, self.num_rows, fractions)

    def memory_entries(self) -> int:
        """Keys and counts held now (each int64): bounded by about 3 x sketch_rows, whatever the stream's length."""
        return len(self.heavy_keys) + len(self.sample_keys) + self.buffer.size


def _merge(keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique keys of both and their summed counts."""
    merged, inverse = np.unique(np.concatenate([keys, new_keys]), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate([counts, new_counts]), minlength=len(merged)).astype(np.int64)
