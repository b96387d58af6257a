"""Where the data-parallel replicas' gradients lie in the flat buffer that `embshard.runtime.dense_replicas`
all-reduces (or reduce-scatters): stacks of one kernel's blocks of one width, the pieces the all-reduce runs in and
the rows each piece's landing lets the optimizer update, and each rank's pieces of a sharded update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from embshard.runtime.routing import KernelSpec
from embshard.specs import ZERO_GRADIENT_MOVES, dp_allreduce_floats_per_row, piece_rows


@dataclass(frozen=True)
class Stack:
    """The blocks of one width of one kernel: their gradient rows stacked in the flat buffer."""

    kernel: int
    width: int
    blocks: tuple[int, ...]  # block indices in the kernel, in stack order
    block_rows: tuple[int, ...]
    grad_start: int  # first element of its gradient [rows, width] in the flat buffer
    count_start: int  # first element of its ids per row [rows], -1: not counted

    @property
    def num_rows(self) -> int:
        return sum(self.block_rows)


@dataclass(frozen=True)
class Unit:
    """Rows [row_lo, row_hi) of one stack, updated once pieces 0..piece of the all-reduce have landed."""

    stack: int
    row_lo: int
    row_hi: int
    piece: int


def update_plan(stacks: Sequence[Stack], grad_numel: int, flat_numel: int, pieces: int,
                 min_piece_floats: int) -> tuple[list[int], list[Unit]]:
    """Cuts of the flat buffer into ``pieces`` all-reduces of about equal gradient elements, each on a row of the
    stack it falls in (fewer pieces where the buffer is under ``min_piece_floats`` a piece), and the update units:
    each stack's rows between the cuts, with the last piece it needs (counted rows need the counts, at the end)."""
    pieces = max(1, min(pieces, flat_numel // min_piece_floats))
    cuts = []
    for j in range(1, pieces):
        target = j * grad_numel // pieces
        stack = next(st for st in stacks if st.grad_start + st.num_rows * st.width > target)
        cut = stack.grad_start + (target - stack.grad_start) // stack.width * stack.width
        if (cuts[-1] if cuts else 0) < cut:
            cuts.append(cut)
    units = []
    for k, st in enumerate(stacks):
        inside = [(c - st.grad_start) // st.width for c in cuts if st.grad_start < c < st.grad_start + st.num_rows * st.width]
        for lo, hi in zip([0, *inside], [*inside, st.num_rows]):
            piece = len(cuts) if st.count_start >= 0 else sum(c <= st.grad_start + lo * st.width for c in cuts)
            units.append(Unit(k, lo, hi, piece))
    return cuts, sorted(units, key=lambda u: u.piece)


def stack_layout(specs: Sequence[KernelSpec], in_runs: Sequence[bool], counted: bool) -> tuple[list[Stack], int, int]:
    """Stacks in kernel order, gradients first and then (``counted``: without a mask of the rows looked up) the id
    counts of `ZERO_GRADIENT_MOVES` optimizers' stacks; (stacks, gradient elements, all elements). A
    kernel's stacks: one per width (widths ascending), or with ``in_runs`` its runs of blocks of one width in kernel
    order (`width_runs`: the kernel's flat weights, as FBGEMM's dense backward gives their gradient)."""
    shapes = []
    for k, (spec, runs) in enumerate(zip(specs, in_runs)):
        groups = width_runs(spec) if runs else [tuple(i for i, b in enumerate(spec.blocks) if b.num_cols == w)
                                           for w in sorted({b.num_cols for b in spec.blocks})]
        for blocks in groups:
            w = spec.blocks[blocks[0]].num_cols
            shapes.append((k, w, blocks, tuple(spec.blocks[i].num_rows for i in blocks),
                           counted and spec.optimizer in ZERO_GRADIENT_MOVES))
    stacks, start = [], 0
    for k, w, blocks, rows, _ in shapes:
        stacks.append([k, w, blocks, rows, start, -1])
        start += sum(rows) * w
    grad_numel = start
    for stack, (_, _, _, rows, counted) in zip(stacks, shapes):
        if counted:
            stack[5] = start
            start += sum(rows)
    return [Stack(*s) for s in stacks], grad_numel, start


def width_runs(spec: KernelSpec) -> list[tuple[int, ...]]:
    """A kernel's blocks cut into runs of one width, in kernel order."""
    runs: list[list[int]] = []
    for i, b in enumerate(spec.blocks):
        if runs and spec.blocks[runs[-1][-1]].num_cols == b.num_cols:
            runs[-1].append(i)
        else:
            runs.append([i])
    return [tuple(r) for r in runs]


def slot_first_rows(spec: KernelSpec) -> list[int]:
    """Each slot's block's first row in the kernel's stack of that block's width."""
    widths = [b.num_cols for b in spec.blocks]
    base = [sum(spec.blocks[c].num_rows for c in range(b) if widths[c] == w) for b, w in enumerate(widths)]
    return [base[b] for b in spec.slot_block]


@dataclass(frozen=True)
class Piece:
    """Rank ``rank``'s rows of one block (sharded update): where they are in the stack and in its segment."""

    stack: int
    block: int  # index in the stack's blocks
    rank: int
    block_row: int  # the block's first row in the stack
    row_start: int  # the piece's first row in the stack
    num_rows: int
    start: int  # first float in the rank's segment
    floats_end: int  # end of its gradient (and counts) in the segment

    @property
    def floats(self) -> int:
        return self.floats_end - self.start


def row_pieces(stacks: Sequence[Stack], specs: Sequence[KernelSpec], world: int) -> list[Piece]:
    """Every block cut in ``world`` row pieces (as torch.tensor_split), laid out per rank in stack and block order."""
    out, used = [], [0] * world
    for k, stack in enumerate(stacks):
        per_row = dp_allreduce_floats_per_row(specs[stack.kernel].optimizer, stack.width)
        block_row = 0
        for b, rows in enumerate(stack.block_rows):
            for r, n in enumerate(piece_rows(rows, world)):
                first = block_row + r * (rows // world) + min(r, rows % world)
                out.append(Piece(k, b, r, block_row, first, n, used[r], used[r] + n * per_row))
                used[r] += n * per_row
            block_row += rows
    return out
