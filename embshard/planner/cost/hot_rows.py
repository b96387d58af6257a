"""Pricing hot-row replication (embshard/runtime/hot_rows.py): a table with h hot rows costs as
two tables, its *cold* part (the planned shards, all N rows stored, looked up by the ids
outside the hot set) and a data-parallel replica of the h hot rows (looked up locally by the
hot ids, its gradient all-reduced every step).

With q = the share of the table's lookups that go to its h hottest rows (`lookup_share`, from
the spec's measured ``hot_rows`` curve), the cold part is the table with pooling factor
P (1 - q) and the replica an h-row table with pooling factor P q. What that removes is the cold
part's traffic: its ids (pooled and sequence) and, for sequence tables, one row per id in both
output-dist directions; pooled outputs stay one per bag. What it adds: the replica's memory and
optimizer state on every rank and its all-reduce (`embshard.planner.cost.perf.allreduce_perf`: a fp32
gradient per hot row looked up, and the mask of those rows).
"""

from __future__ import annotations

import dataclasses

from embshard.specs import TableSpec

HOT_FRACTIONS = (0.001, 0.01, 0.05)  # shares of a table's rows offered as hot sets (besides none)
HOT = "@hot"


def lookup_share(spec: TableSpec, num_hot_rows: int) -> float:
    """Share of the table's lookups that hit its ``num_hot_rows`` hottest rows: the measured curve,
    linear between its points (from (0, 0) to (1, 1)); a table without one is taken as uniform."""
    f = num_hot_rows / spec.num_embeddings
    points = [(0.0, 0.0), *(spec.hot_rows or ()), (1.0, 1.0)]
    for (r0, l0), (r1, l1) in zip(points, points[1:]):
        if f <= r1:
            return l0 + (l1 - l0) * (f - r0) / (r1 - r0) if r1 > r0 else l1
    return 1.0


def hot_split(spec: TableSpec, num_hot_rows: int) -> tuple[TableSpec, TableSpec]:
    """(cold part, hot replica) of ``spec`` with ``num_hot_rows`` replicated rows, as the cost model sees them."""
    q = lookup_share(spec, num_hot_rows)
    cold = dataclasses.replace(spec, pooling_factor=spec.pooling_factor * (1 - q))
    hot = dataclasses.replace(spec, name=spec.name + HOT, num_embeddings=num_hot_rows,
                              pooling_factor=spec.pooling_factor * q, hot_rows=None)
    return cold, hot


def hot_row_counts(spec: TableSpec) -> list[int]:
    """Hot-set sizes offered for ``spec``, 0 (none) first; tables without a measured curve get none
    (the search prices the others and keeps 0 where replication does not pay)."""
    counts = [0]
    if spec.hot_rows is None:
        return counts
    for f in HOT_FRACTIONS:
        h = max(1, round(f * spec.num_embeddings))
        if h < spec.num_embeddings and h not in counts:
            counts.append(h)
    return counts
