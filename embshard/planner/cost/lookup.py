"""The lookup model: predicted ms of a fused TBE lookup, forward and backward, of a shard's ids into its rows,
wherever the rows live (HBM, host memory, or host memory behind an HBM cache); `embshard.planner.cost.perf` puts it
in a shard's phases (its module docstring states the whole model: bytes moved at the location's bandwidth, rows
rounded up to 32-byte sectors, and the calibrated work per id, distinct row and byte).
"""

from __future__ import annotations

import math

from embshard.planner.cost.tiers import hit_rate
from embshard.planner.cost.traffic import ID_BYTES, OUTPUT_BYTES
from embshard.planner.cost.units import bytes_ms, expected_distinct_rows, work_ms
from embshard.planner.types import Location
from embshard.specs import TableSpec
from embshard.topology import Topology

SECTOR_BYTES = 32


def row_bytes(spec: TableSpec, num_cols: int) -> int:
    """Bytes fetched per row: the stored row (elements, and int8's scale and bias) in whole sectors."""
    return math.ceil(spec.row_bytes(num_cols) / SECTOR_BYTES) * SECTOR_BYTES


def lookup_ms(spec: TableSpec, topo: Topology, num_ids: float, num_rows: int, num_cols: int, out_rows: float,
              location: Location = Location.HBM, num_cache_rows: int = 0) -> tuple[float, float]:
    """(forward, backward) ms of a fused TBE lookup of num_ids ids into an n x d shard at `location`
    (embshard.planner.cost.tiers: rows in host memory move at ddr_gb_per_s)."""
    return located_lookup_ms(lookup_terms(spec, topo, num_ids, num_rows, num_cols, out_rows), spec, topo, location, num_cache_rows)


def lookup_terms(spec: TableSpec, topo: Topology, num_ids: float, num_rows: int, num_cols: int, out_rows: float) -> tuple:
    """What `lookup_ms` weighs wherever the shard's rows live: (ids, rows, row bytes, output bytes, rows touched at
    most, optimizer bytes per row, distinct rows touched, calibrated forward and backward work, output ms)."""
    rb = row_bytes(spec, num_cols)
    out_bytes = out_rows * num_cols * OUTPUT_BYTES
    opt = spec.optimizer_state_bytes_per_row(num_cols)
    distinct = expected_distinct_rows(num_ids, num_rows)
    fwd_extra, bwd_extra = lookup_work_ms(spec, topo, num_ids, distinct, rb, opt)
    return (num_ids, num_rows, rb, out_bytes, min(num_ids, num_rows), opt, distinct, fwd_extra, bwd_extra,
            work_ms(out_bytes, topo.lookup_ns_per_out_byte))


def located_lookup_ms(terms: tuple, spec: TableSpec, topo: Topology, location: Location, num_cache_rows: int) -> tuple[float, float]:
    """`lookup_ms` from its `lookup_terms`, at `location`."""
    num_ids, num_rows, rb, out_bytes, unique_rows, opt, distinct, fwd_extra, bwd_extra, out_ms = terms
    if location is Location.HBM:
        fwd = bytes_ms(num_ids * (ID_BYTES + rb) + out_bytes, topo.hbm_gb_per_s)
        # backward: read output grads, sort ids, accumulate per-id grads, then read+write each
        # touched row and its optimizer state.
        bwd_bytes = out_bytes + num_ids * (2 * ID_BYTES + rb) + unique_rows * 2 * (rb + opt)
        return fwd + fwd_extra + out_ms, bytes_ms(bwd_bytes, topo.hbm_gb_per_s) + bwd_extra + out_ms
    if location is Location.HOST:  # every row read, and updated with its optimizer state, across the host link
        fwd = bytes_ms(num_ids * ID_BYTES + out_bytes, topo.hbm_gb_per_s) + bytes_ms(num_ids * rb, topo.ddr_gb_per_s)
        bwd = (bytes_ms(out_bytes + num_ids * (2 * ID_BYTES + rb), topo.hbm_gb_per_s)
               + bytes_ms(unique_rows * 2 * (rb + opt), topo.ddr_gb_per_s))
        return fwd + fwd_extra + out_ms, bwd + bwd_extra + out_ms
    # uvm_cache: misses fetched from host memory into the cache, lookups then read the cache;
    # backward updates cached rows in HBM, their optimizer state in host memory, and writes
    # back the rows the fetches evicted
    misses = (1.0 - hit_rate(spec, num_cache_rows, num_rows)) * distinct
    fwd = (bytes_ms(num_ids * (ID_BYTES + rb) + out_bytes + misses * rb, topo.hbm_gb_per_s)
           + bytes_ms(misses * rb, topo.ddr_gb_per_s))
    bwd = (bytes_ms(out_bytes + num_ids * (2 * ID_BYTES + rb) + unique_rows * 2 * rb + misses * rb, topo.hbm_gb_per_s)
           + bytes_ms(unique_rows * 2 * opt + misses * rb, topo.ddr_gb_per_s))
    return fwd + fwd_extra + out_ms, bwd + bwd_extra + out_ms


def lookup_work_ms(spec: TableSpec, topo: Topology, num_ids: float, distinct: float, rb: int, opt: int) -> tuple[float, float]:
    """Calibrated lookup work beyond moving bytes (0 in the datasheet model): (forward, backward) ms of num_ids
    ids hitting `distinct` rows of rb bytes (`row_bytes`) and opt bytes of optimizer state each."""
    fwd = work_ms(num_ids, topo.lookup_fwd_ns_per_id) + work_ms(distinct * rb, topo.lookup_ns_per_row_byte)
    if spec.pooled and spec.num_features > 1:  # a table shared by features: FBGEMM's generic update loop
        update = work_ms(distinct, topo.lookup_bwd_shared_ns_per_row) + work_ms(distinct * (rb + opt), topo.lookup_bwd_shared_ns_per_row_byte)
    else:
        update = work_ms(distinct, topo.lookup_bwd_ns_per_row)
    bwd = work_ms(num_ids, topo.lookup_bwd_ns_per_id) + update + work_ms(distinct * (rb + opt), topo.lookup_ns_per_row_byte)
    if not spec.pooled:
        bwd += work_ms(distinct, topo.sequence_bwd_ns_per_row)
    return fwd, bwd
