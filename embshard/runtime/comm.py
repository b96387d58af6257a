"""Collectives of the runtime: all-to-all with split sizes, and a header gather that
makes every rank raise when one rank rejects its input.

All tensors are split along dim 0; split sizes count rows. Works on gloo (CPU) and nccl
(GPU: tensors must live on the rank's device).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def all_to_all(x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int], pg: dist.ProcessGroup) -> Tensor:
    """Send rows ``x[sum(in_splits[:r]) : +in_splits[r]]`` to rank r; receive ``out_splits[r]`` rows from rank r."""
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=pg)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int], pg: dist.ProcessGroup, grad_scale: float) -> Tensor:
        ctx.splits, ctx.pg, ctx.grad_scale = (out_splits, in_splits), pg, grad_scale
        return all_to_all(x, out_splits, in_splits, pg)

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        back = all_to_all(grad, in_splits, out_splits, ctx.pg)
        if ctx.grad_scale != 1.0:
            back.mul_(ctx.grad_scale)
        return back, None, None, None, None


def all_to_all_autograd(
    x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int], pg: dist.ProcessGroup, grad_scale: float = 1.0
) -> Tensor:
    """`all_to_all` whose backward sends gradients back the same way, multiplied by ``grad_scale``."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), pg, grad_scale)


class _LocalPart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, splits: list[int], pg: dist.ProcessGroup, grad_dtype: torch.dtype) -> Tensor:
        ctx.splits, ctx.pg, ctx.grad_dtype = splits, pg, grad_dtype
        rank = dist.get_rank(pg)
        start = sum(splits[:rank])
        return x[start:start + splits[rank]]

    @staticmethod
    def backward(ctx, grad: Tensor):
        world = dist.get_world_size(ctx.pg)
        mine = ctx.splits[dist.get_rank(ctx.pg)]
        sent = grad.to(ctx.grad_dtype).contiguous().repeat(world, *([1] * (grad.dim() - 1)))
        full = all_to_all(sent, ctx.splits, [mine] * world, ctx.pg).to(grad.dtype)
        return full.div_(world), None, None, None


def local_part(x: Tensor, splits: Sequence[int], pg: dist.ProcessGroup, grad_dtype: torch.dtype = torch.float32) -> Tensor:
    """This rank's rows of ``x``, which every rank computed in full (rows grouped by rank, ``splits``).

    Backward gathers every rank's gradient of its part (sent as ``grad_dtype``: the plan's
    backward wire dtype) and divides by the world size, so every replica receives the same
    gradient: the rank average, as DDP gives dense parameters.
    """
    return _LocalPart.apply(x, list(splits), pg, grad_dtype)


def gather_header(values: Sequence[int], error: str | None, pg: dist.ProcessGroup, device: torch.device) -> Tensor:
    """All-gather a few ints per rank; raise ValueError on every rank if any rank passed an error.

    Returns [world_size, len(values)] int64. Each rank validates its own input before calling
    this (the first collective of a step), so a bad batch never leaves a rank inside a
    collective its peers skipped.
    """
    local = torch.tensor([int(error is not None), *values], dtype=torch.int64, device=device)
    gathered = local.new_empty(dist.get_world_size(pg) * local.numel())
    dist.all_gather_into_tensor(gathered, local, group=pg)
    gathered = gathered.view(-1, local.numel())
    if bool(gathered[:, 0].any()):
        messages: list[str | None] = [None] * dist.get_world_size(pg)
        dist.all_gather_object(messages, error, group=pg)
        raise ValueError("; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None))
    return gathered[:, 1:]
