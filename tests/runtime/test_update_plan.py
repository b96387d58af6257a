"""The data-parallel all-reduce in pieces (replica_layout.update_plan): cuts on rows, every row updated once,
after the pieces it reads."""

from __future__ import annotations

from embshard.runtime.replica_layout import Stack as _Stack, update_plan as _update_plan


def stacks_of(shapes: list[tuple[int, int, bool]]) -> tuple[list[_Stack], int, int]:
    """(rows, width, counted) per stack, laid out as _layout does: gradients, then the counts."""
    stacks, start = [], 0
    for k, (rows, width, _) in enumerate(shapes):
        stacks.append([k, width, (0,), (rows,), start, -1])
        start += rows * width
    grad_numel = start
    for stack, (rows, _, counted) in zip(stacks, shapes):
        if counted:
            stack[5], start = start, start + rows
    return [_Stack(*s) for s in stacks], grad_numel, start


def test_pieces_cut_on_rows_and_cover_every_row_once() -> None:
    stacks, grad_numel, flat_numel = stacks_of([(1001, 16, False), (300, 8, True), (5000, 4, False)])
    cuts, units = _update_plan(stacks, grad_numel, flat_numel, 3, 16)
    assert cuts == [12800, 25608]  # 1/3 and 2/3 of 38,416 floats, down to a row: 800 of stack 0, 1,798 of stack 2
    for k, st in enumerate(stacks):
        rows = sorted((u.row_lo, u.row_hi) for u in units if u.stack == k)
        assert rows[0][0] == 0 and rows[-1][1] == st.num_rows and all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
    for u in units:  # a unit's gradient rows lie in its piece; counted rows wait for the counts, in the last
        st = stacks[u.stack]
        first, last = st.grad_start + u.row_lo * st.width, st.grad_start + u.row_hi * st.width
        bounds = [0, *cuts, grad_numel]
        if st.count_start >= 0:
            assert u.piece == len(cuts)
        else:
            assert bounds[u.piece] <= first and last <= bounds[u.piece + 1]
    assert [u.piece for u in units] == sorted(u.piece for u in units)


def test_small_buffers_go_in_one_piece() -> None:
    stacks, grad_numel, flat_numel = stacks_of([(100, 16, False)])
    cuts, units = _update_plan(stacks, grad_numel, flat_numel, 2, 1000)  # 1,600 floats: one piece of at least 1,000
    assert cuts == [] and [(u.row_lo, u.row_hi, u.piece) for u in units] == [(0, 100, 0)]
    assert len(_update_plan(stacks, grad_numel, flat_numel, 2, 800)[0]) == 1
