"""Rows gathered by a permutation, with a backward that gathers by its inverse: no zero-filled
scatter (what `index_select`'s backward does) where every row is used exactly once; and the run of
floats (`run_unit`) that such a gather moves as one row."""

from __future__ import annotations

import math

import torch
from torch import Tensor


class Permute(torch.autograd.Function):
    """``x[perm]`` for a permutation of rows; backward gathers with the inverse."""

    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(inverse)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def inverse_permutation(perm: Tensor) -> Tensor:
    return torch.empty_like(perm).index_copy_(0, perm, torch.arange(perm.numel(), device=perm.device))


def run_unit(*sizes: int) -> int:
    """Largest block of floats that every moved piece is made of (widths and offsets are multiples of it): gathers
    move runs of this many floats, one index per run."""
    return math.gcd(*sizes) or 1
