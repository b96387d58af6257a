"""Checkpoint values of sharded tables: each rank's block with its place in the table.

`ShardedEmbeddingBagCollection.state_dict()` (and the sequence one) maps table name to a
`TableShard`: the rank's block of weights, where it sits in the full table, and the
block's optimizer state. Blocks from all ranks reassemble the table (`assemble`), and a
full table loads into any plan (``load_state_dict({name: full_tensor})``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from torch import Tensor


@dataclass(frozen=True)
class TableShard:
    table: str
    weight: Tensor  # [num_rows, num_cols], a copy of the rank's block
    row_offset: int
    col_offset: int
    table_shape: tuple[int, int]  # (num_embeddings, embedding_dim) of the full table
    optimizer: str
    # per row [num_rows], per element [num_rows, num_cols], or per kernel [] (adam's step)
    optimizer_state: Mapping[str, Tensor] = field(default_factory=dict)
    replicated: bool = False  # data-parallel: every rank holds this same full block

    @property
    def rows(self) -> slice:
        return slice(self.row_offset, self.row_offset + self.weight.shape[0])

    @property
    def cols(self) -> slice:
        return slice(self.col_offset, self.col_offset + self.weight.shape[1])


def assemble(shards: Sequence[TableShard], state: str | None = None) -> Tensor:
    """The full table (or one optimizer state of it) from the blocks of all ranks.

    Per-row states (rowwise_adagrad's momentum) of column-split tables are per block;
    they come back as [num_embeddings, number of column blocks], one column per block.
    A step counter comes back as the largest of the shards' counters.
    """
    if not shards:
        raise ValueError("assemble: no shards given; collect every rank's TableShard of the table")
    first = shards[0]
    if any(s.table != first.table or s.table_shape != first.table_shape for s in shards):
        raise ValueError(f"assemble: shards of different tables {sorted({s.table for s in shards})}; pass one table's shards")
    rows, dim = first.table_shape
    if state is not None and first.optimizer_state[state].dim() == 0:
        return max((s.optimizer_state[state] for s in shards), key=int).clone()
    if state is None:
        out = torch.full((rows, dim), float("nan"), dtype=first.weight.dtype)
        for s in shards:
            out[s.rows, s.cols] = s.weight.cpu()
    elif first.optimizer_state[state].dim() == 2:
        out = torch.full((rows, dim), float("nan"))
        for s in shards:
            out[s.rows, s.cols] = s.optimizer_state[state].cpu()
    else:
        col_blocks = sorted({s.col_offset for s in shards})
        out = torch.full((rows, len(col_blocks)), float("nan"))
        for s in shards:
            out[s.rows, col_blocks.index(s.col_offset)] = s.optimizer_state[state].cpu()
    if bool(out.isnan().any()):
        raise ValueError(f"assemble: the shards of table {first.table!r} do not cover the whole table; pass every rank's shard")
    return out


def block_of(full: Tensor | TableShard, shard: TableShard, where: str) -> Tensor:
    """The rows and columns of ``shard`` taken from a full table or from an identical block."""
    if isinstance(full, TableShard):
        if (full.row_offset, full.col_offset, tuple(full.weight.shape), full.table_shape) != \
                (shard.row_offset, shard.col_offset, tuple(shard.weight.shape), shard.table_shape):
            raise ValueError(f"{where}: the checkpoint holds rows {full.rows} cols {full.cols} but this rank holds rows "
                             f"{shard.rows} cols {shard.cols}; reassemble the table with embshard.runtime.state.assemble "
                             "and load the full tensor")
        return full.weight
    if tuple(full.shape) != shard.table_shape:
        raise ValueError(f"{where}: expected a {shard.table_shape[0]}x{shard.table_shape[1]} table, got {tuple(full.shape)}")
    return full[shard.rows, shard.cols]
