"""How a table is cut into row blocks and column blocks (shared by planner, runtime, interop).

Row splits follow TorchRec's convention so plans export exactly: block = ceil(rows / k),
every shard but the last holds `block` rows. Column splits keep widths multiples of 4
(what FBGEMM's kernels accept), spreading the remainder over the first shards.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import repeat

COL_ALIGN = 4


def row_splits(num_rows: int, num_shards: int) -> list[tuple[int, int]] | None:
    """(row_offset, num_rows) per shard, or None when the split would leave a shard empty."""
    block = -(-num_rows // num_shards)
    if (num_shards - 1) * block >= num_rows:  # the last shard would be empty
        return None
    last = (num_shards - 1) * block
    return [*zip(range(0, last, block), repeat(block)), (last, num_rows - last)]


def col_splits(dim: int, num_shards: int) -> list[tuple[int, int]] | None:
    """(col_offset, num_cols) per shard with widths multiples of 4, or None if impossible."""
    spans = _col_spans(dim, num_shards)
    return None if spans is None else list(spans)


@lru_cache(maxsize=4096)
def _col_spans(dim: int, num_shards: int) -> tuple[tuple[int, int], ...] | None:
    """col_splits as a tuple, computed once per (dim, shards): enumeration asks for the same few thousands of times."""
    if dim % COL_ALIGN or dim // COL_ALIGN < num_shards:
        return None
    units, extra = divmod(dim // COL_ALIGN, num_shards)
    spans, pos = [], 0
    for i in range(num_shards):
        width = (units + (i < extra)) * COL_ALIGN
        spans.append((pos, width))
        pos += width
    return tuple(spans)
