"""A table's access-frequency curve from a sample of its lookups, the unseen tail extrapolated.

    curve = estimated_curve(counts, weights, num_lookups, num_rows, (0.001, 0.01, 0.1, 0.5))

The curve's point at f is the share of the *stream's* lookups that go to the table's hottest
f x num_rows rows: what a cache holding those rows would hit. The sample's own curve (its rows
sorted by count) overstates it wherever the sample has fewer lookups than the table has rows:
n lookups touch at most n rows, so that curve reaches 1 at n / num_rows (Zipf 1.1 over 45.8M
rows, a million lookups: 100% at 1% of the rows, where the stream gives 88%).

Estimator (``counts``: lookups seen per observed row, ``weights``: the rows each stands for, 1
for exact counts, 1 / p for a sketch's row sample):
- head: the rows seen at least `MIN_COUNT` times, hottest first, are taken as measured (a count
  of 10 or more is within about a third of its mean; sums over many such rows much closer);
  they are R rows with H of the n lookups.
- tail: the other n - H lookups go to ranks R + 1 .. num_rows with a power law, lookups at rank
  r proportional to r^-s. The exponent s is the one under which the tail's expected number of
  distinct rows seen in n lookups (each rank's 1 - exp(-lookups x share), the lookups Poisson)
  equals the number seen: a flat tail spreads its lookups over many rows, a steep one over few.
  s is searched in [0, `MAX_EXPONENT`] (0: uniform over the tail's rows).
Where every row is in the head (or the sample saw all lookups there), the curve is the sample's.

Checked against Zipf streams with exact counts (s 0.8 to 1.3, 10^3 to 4.6 x 10^7 rows, 3 x 10^4 to
10^6 lookups; tests/stats): within 0.005 of the stream's curve, where the sample's own curve was off
by up to 0.39 (1.0 at 1% of the rows for Zipf 1.1 over 10^7 rows and 2 x 10^5 lookups, the stream
0.854). Limits:
- the tail's shape is assumed a power law in rank; a tail that is not (a plateau of equally
  popular rows, a second regime below the sample's reach) gets the power law with the same number
  of distinct rows seen, which can be off either way;
- the exponent is pinned down by how often the tail's lookups repeat a row: where they rarely do
  (uniform ids, 5 x 10^4 lookups over 10^6 rows: about 1,200 repeats), the distinct count's noise
  allows s from 0 to 0.2 and the 10% point comes out 0.10 to 0.16; with 3 x 10^5 lookups, within 0.02;
- the head's sorted counts overstate its share a little (the rows that came out on top include
  lucky ones) and the tail's share is understated as much;
- with a sketch (embshard.stats.counters) the tail is seen through the row sample: 4 x 10^7 rows,
  3 x 10^5 lookups and 16,384 sketch rows (about 30 sampled rows seen) give errors to 0.03;
  10^7 rows with 10^4 sketch rows at Zipf 0.8, to 0.07. More sketch rows, or more samples, tighten it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

MIN_COUNT = 10  # a row seen this often is in the measured head
MAX_EXPONENT = 4.0  # steepest tail searched (rank r gets r^-4: nearly all the tail's lookups in its first rows)
_BINS = 512  # geometric bins of tail ranks for the expected distinct rows (a bin's rank range within 4% at 10^9 rows)


def estimated_curve(counts: np.ndarray, weights: np.ndarray, num_lookups: float, num_rows: int,
                    fractions: Sequence[float], lookups: np.ndarray | None = None) -> tuple[float, ...]:
    """The share of lookups to the hottest f x num_rows rows for each f, the unseen tail extrapolated.

    ``counts``: lookups seen per observed row; ``weights``: the rows each entry stands for;
    ``lookups``: the lookups each entry stands for (default counts x weights; a row sample's are
    scaled so that all add up to num_lookups)."""
    if num_lookups <= 0:
        return tuple(float(f) for f in fractions)  # nothing seen: no skew measured
    counts, weights = np.asarray(counts, np.float64), np.asarray(weights, np.float64)
    lookups = counts * weights if lookups is None else np.asarray(lookups, np.float64)
    seen = counts > 0
    order = np.argsort(-counts[seen], kind="stable")
    counts, weights, lookups = counts[seen][order], weights[seen][order], lookups[seen][order]
    in_head = counts >= MIN_COUNT
    head_rows = np.concatenate([[0.0], np.cumsum(weights[in_head])])
    head_lookups = np.concatenate([[0.0], np.cumsum(lookups[in_head])])
    rows, measured = float(head_rows[-1]), float(head_lookups[-1])
    rest = num_lookups - measured
    if rest <= 0 or rows >= num_rows:  # the head is all there is
        total = measured if rows >= num_rows else num_lookups
        points = [np.interp(f * num_rows, head_rows, head_lookups) / total for f in fractions]
    else:
        tail_counts = float((counts[~in_head] * weights[~in_head]).sum())
        # rows seen per lookup among the tail's entries, times the tail's lookups (a ratio estimate: for a row
        # sample, whatever share of the tail's lookups it drew)
        seen_rows = float(weights[~in_head].sum()) * rest / tail_counts if tail_counts > 0 else math.inf
        s = tail_exponent(rows, num_rows, rest, seen_rows)
        tail_sum = _power_sum(rows + 1, num_rows, s)
        points = [(np.interp(x, head_rows, head_lookups) if x <= rows
                   else measured + rest * _power_sum(rows + 1, x, s) / tail_sum) / num_lookups
                  for x in (f * num_rows for f in fractions)]
    # A hot set gets at least its uniform share (rounding aside).
    return tuple(float(max(min(p, 1.0), f)) for p, f in zip(points, fractions))


def tail_exponent(head_rows: float, num_rows: int, tail_lookups: float, tail_seen_rows: float) -> float:
    """The power-law exponent s under which ``tail_lookups`` over ranks head_rows + 1 .. num_rows are
    expected to touch ``tail_seen_rows`` distinct rows (bisection: the count falls as s rises)."""
    edges = np.unique(np.round(np.geomspace(head_rows + 1, num_rows + 1, _BINS)))
    lo, hi = edges[:-1], edges[1:] - 1
    width = hi - lo + 1

    def expected_seen(s: float) -> float:
        mass = _power_sum(lo, hi, s)
        return float((width * -np.expm1(-tail_lookups * mass / mass.sum() / width)).sum())

    if expected_seen(0.0) <= tail_seen_rows:
        return 0.0
    if expected_seen(MAX_EXPONENT) >= tail_seen_rows:
        return MAX_EXPONENT
    low, high = 0.0, MAX_EXPONENT
    for _ in range(40):  # to 4 / 2^40
        mid = (low + high) / 2
        low, high = (mid, high) if expected_seen(mid) > tail_seen_rows else (low, mid)
    return (low + high) / 2


def _power_sum(first, last, s: float):
    """sum of r^-s over ranks first .. last (the midpoint integral: within 1% of the sum from rank 2 on)."""
    a, b = np.asarray(first, np.float64) - 0.5, np.asarray(last, np.float64) + 0.5
    if abs(s - 1.0) < 1e-9:
        return np.log(b / a)
    return (b ** (1 - s) - a ** (1 - s)) / (1 - s)
