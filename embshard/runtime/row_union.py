"""The rows of a collection's all-reduce replicas that some rank looked up this step (dense_replicas.py).

A row no rank looked up has a zero gradient, which sgd, adagrad and rowwise_adagrad leave as it was (and adam does
not update: FBGEMM's update is sparse), so only the rows looked up anywhere need their gradient summed and their
update. Each rank marks the rows its ids hit in a mask of one fp16 per row of every stack (an id's row: its slot's
block start plus the id), the ranks sum the masks (counts up to 2,048 are exact in fp16) and every rank reads the
same rows from the sum: per block, the rows marked, or the whole block where ``DP_SPARSE_MAX_FRACTION`` of it or
more is marked (the index work of a sparse update then costs more than the rows it saves) or it is small
(`embshard.specs.sparse_dp_table`; never for ``ZERO_GRADIENT_MOVES`` optimizers, whose unmarked rows must not move). The mask's all-reduce starts in forward,
once every rank's batch is known to be good (`Pending`), and is read in backward, so on gloo it travels meanwhile
(started in backward it held backward up: DLRM batch 512's training on 2 emulated hosts ran at 0.71x TorchRec, 1.14x
before the mask). Priced by
`embshard.planner.cost.perf.allreduce_perf` (uniform ids: the expected distinct rows of the global batch).
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.runtime.routing import KernelSpec
from embshard.runtime.wire import wire_all_reduce_pieces_
from embshard.specs import DP_SPARSE_MAX_FRACTION, ZERO_GRADIENT_MOVES, sparse_dp_table


class StackLike(Protocol):
    kernel: int
    blocks: tuple[int, ...]
    block_rows: tuple[int, ...]

    @property
    def num_rows(self) -> int: ...


class RowUnion:
    """The mask layout of one replica group: every stack's rows, in stack order."""

    def __init__(self, stacks: Sequence[StackLike], specs: Sequence[KernelSpec], pooled: bool, device: torch.device) -> None:
        self.pooled, self.device = pooled, device
        self.stack_start = [0]
        for st in stacks:
            self.stack_start.append(self.stack_start[-1] + st.num_rows)
        self.total_rows = self.stack_start[-1]
        block_row: dict[tuple[int, int], int] = {}  # (kernel, block) -> its first row in the mask
        for s, st in enumerate(stacks):
            for j, b in enumerate(st.blocks):
                block_row[(st.kernel, b)] = self.stack_start[s] + sum(st.block_rows[:j])
        self.slot_row = [torch.tensor([block_row[(k, b)] for b in spec.slot_block], dtype=torch.int64, device=device)
                         for k, spec in enumerate(specs)]
        self.block_rows = [torch.tensor(st.block_rows, dtype=torch.int64, device=device) for st in stacks]
        self.block_ends = [torch.tensor(st.block_rows, dtype=torch.int64).cumsum(0).to(device) for st in stacks]
        self.sparse_only = [specs[st.kernel].optimizer in ZERO_GRADIENT_MOVES for st in stacks]
        self.small = [torch.tensor([not sparse_dp_table(n, st.width, specs[st.kernel].optimizer) for n in st.block_rows],
                                   device=device) for st in stacks]

    def start(self, inputs, pg: dist.ProcessGroup) -> Callable[[], Tensor]:
        """Mark this rank's rows and start summing the mask over ``pg``; returns the wait that gives the sum."""
        mask = torch.zeros(self.total_rows, dtype=torch.float16, device=self.device)
        for k, x in enumerate(inputs):
            if x.indices.numel():
                mask[self._rows_of(k, x)] = 1
        wait = wire_all_reduce_pieces_(mask, [], pg, "fp16")[0]
        return lambda: (wait(), mask)[1]

    def _rows_of(self, k: int, x) -> Tensor:
        """Every id's row in the mask."""
        slot_row = self.slot_row[k]
        if self.pooled:  # offsets [T * B + 1], slot-major
            T = slot_row.numel()
            per_slot = x.offsets[::(x.offsets.numel() - 1) // T].diff()
        else:
            per_slot = torch.tensor([sum(c) for c in x.ids_per_feature_rank], dtype=torch.int64, device=x.indices.device)
        return x.indices.long() + torch.repeat_interleave(slot_row, per_slot.long(), output_size=x.indices.numel())

    def rows(self, mask: Tensor) -> list[Tensor | None]:
        """Per stack, the rows (ascending) to exchange and update, or None for all of them."""
        out: list[Tensor | None] = []
        for s, (lo, hi) in enumerate(zip(self.stack_start, self.stack_start[1:])):
            marked = mask[lo:hi] > 0
            if not self.sparse_only[s]:
                counts = marked.cumsum(0)[self.block_ends[s] - 1]
                marked_per_block = counts.diff(prepend=counts.new_zeros(1))
                whole = (marked_per_block >= DP_SPARSE_MAX_FRACTION * self.block_rows[s]) | self.small[s]
                if bool(whole.all()):
                    out.append(None)
                    continue
                marked |= torch.repeat_interleave(whole, self.block_rows[s], output_size=hi - lo)
            out.append(marked.nonzero().squeeze(1))
        return out


class Pending:
    """One forward's mask: its all-reduce starts once every rank's batch is known to be good (`start`, which the
    collection calls after reading the header: a rank that raised there must not be waited for), at the latest when
    backward reads the sum (call)."""

    def __init__(self, union: RowUnion, inputs, pg: dist.ProcessGroup) -> None:
        self.union, self.inputs, self.pg = union, inputs, pg
        self._wait: Callable[[], Tensor] | None = None

    def start(self) -> None:
        if self._wait is None:
            self._wait = self.union.start(self.inputs, self.pg)

    def __call__(self) -> Tensor:
        self.start()
        return self._wait()
