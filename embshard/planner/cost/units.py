"""Units of the cost model: ms to move bytes at a bandwidth, ms of counted work at a cost per unit, distinct rows
of uniform ids."""

from __future__ import annotations

import math


def bytes_ms(num_bytes: float, gb_per_s: float) -> float:
    """ms to move ``num_bytes`` at ``gb_per_s`` GB/s."""
    return num_bytes / (gb_per_s * 1e6)


def work_ms(count: float, ns_each: float) -> float:
    """ms of ``count`` units of work at ``ns_each`` ns per unit."""
    return count * ns_each * 1e-6


def expected_distinct_rows(num_ids: float, num_rows: int) -> float:
    """Distinct rows hit by num_ids ids drawn uniformly from num_rows rows."""
    return num_rows * -math.expm1(-num_ids / num_rows) if num_rows > 0 else 0.0
