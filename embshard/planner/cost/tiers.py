"""Memory tiers: a shard's cache size, the hit rate it predicts, and the rows a step moves
between HBM and host memory.

A ``uvm_cache`` shard keeps its rows (and their optimizer state) in host memory and the
hottest `cache_rows` of them in an HBM cache. The hit rate at a cache of c of a shard's n
rows is its table's ``hot_rows`` curve at c/n, linearly interpolated between the measured
points and (0, 0), (1, 1): the cache is taken to hold the hottest rows (an ideal LFU cache;
LRU gets somewhat less), and every row shard of a table to see the table's skew (ids spread
over its shards). Without a curve, ids are uniform over rows: the hit rate is c/n.

Per step, the distinct rows a lookup touches that miss the cache (`miss_rows`: the miss rate
times the distinct rows touched, as for uniform ids, an upper bound under skew) are fetched:
read from host memory at ``topology.ddr_gb_per_s`` and written into the cache in HBM; each
evicts a row, which training has updated and writes back to host memory (forward only when
serving: nothing to write back). Lookups then read the cache at HBM bandwidth; backward
updates the cached rows in HBM and their optimizer state in host memory. A ``host`` shard
(no cache) reads every row it looks up, and updates every row it touches with its optimizer
state, across ``ddr_gb_per_s``.
"""

from __future__ import annotations

import bisect
import math

from embshard.planner.types import Location
from embshard.specs import TableSpec

CACHE_FRACTIONS = (0.01, 0.05, 0.2, 0.5)  # cache sizes offered, as shares of a shard's rows (cf. TorchRec's cache load factors)
CACHE_SLOT_BYTES = 16  # FBGEMM's per-slot cache state (row index and LRU/LFU counter, int64 each), in HBM


def cache_rows(num_rows: int, fraction: float) -> int:
    """Cache slots for a shard of num_rows rows holding `fraction` of them (at least one)."""
    return min(num_rows, max(1, math.ceil(fraction * num_rows)))


def hit_rate(spec: TableSpec, num_cache_rows: int, num_rows: int) -> float:
    """Share of a shard's lookups its cache of num_cache_rows rows serves (1 when all rows fit)."""
    if num_cache_rows >= num_rows:
        return 1.0
    share = num_cache_rows / num_rows
    if not spec.hot_rows:
        return share
    xs = [0.0] + [r for r, _ in spec.hot_rows] + [1.0]
    ys = [0.0] + [lk for _, lk in spec.hot_rows] + [1.0]
    i = bisect.bisect_right(xs, share)
    if i >= len(xs):
        return 1.0
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (share - x0) / (x1 - x0) if x1 > x0 else y1


def shard_hit_rate(spec: TableSpec, location: Location, num_cache_rows: int, num_rows: int) -> float:
    """The hit rate a shard at `location` predicts: 1 in HBM, 0 in host memory, the cache's otherwise."""
    if location is Location.HBM:
        return 1.0
    return 0.0 if location is Location.HOST else hit_rate(spec, num_cache_rows, num_rows)


def check_cache_rows(spec: TableSpec, location: Location, num_cache_rows: int, num_rows: int, where: str) -> None:
    """A ValueError naming the table and field unless the cache size suits the location and shard."""
    if location is Location.UVM_CACHE:
        if not 1 <= num_cache_rows <= num_rows:
            raise ValueError(f"{where}.cache_rows: {num_cache_rows} for a uvm_cache shard of {num_rows} rows of table "
                             f"{spec.name!r}; a cache holds 1 to {num_rows} rows (all of them: use location hbm)")
    elif num_cache_rows:
        raise ValueError(f"{where}.cache_rows: {num_cache_rows} for a {location.value} shard of table {spec.name!r}; "
                         f"only uvm_cache shards have a cache (drop cache_rows or use location uvm_cache)")
