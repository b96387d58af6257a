"""by_source interleaves sequence kernels' outputs by source rank with one split per kernel: its
backward concatenates gradients instead of zero-filling a copy of a whole output per piece."""

import torch

from embshard.runtime.output_dist import by_source


def _graph_names(t: torch.Tensor) -> set[str]:
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn.name() in seen:
            continue
        seen.add(fn.name())
        stack.extend(f for f, _ in fn.next_functions)
    return seen


def test_interleaves_by_source_with_split_not_slices():
    a = torch.arange(10.0, requires_grad=True)  # kernel 0: 4 floats from source 0, 6 from source 1
    b = torch.arange(100.0, 105.0, requires_grad=True)  # kernel 1: 2 and 3
    out = by_source([a, b], ((4, 2), (6, 3)))
    expected = torch.cat([a[:4], b[:2], a[4:], b[2:]])
    assert torch.equal(out, expected)
    names = _graph_names(out)
    assert any("Split" in n for n in names) and not any("Slice" in n for n in names), names
    out.backward(torch.arange(15.0))
    assert torch.equal(a.grad, torch.tensor([0.0, 1, 2, 3, 6, 7, 8, 9, 10, 11]))
    assert torch.equal(b.grad, torch.tensor([4.0, 5, 12, 13, 14]))
