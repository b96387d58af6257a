"""Embeddings on the wire in the plan's precision (`embshard.comms.CommsPrecision`).

Output dist's all-to-all sends fp32 embeddings cast to ``comms.forward`` and casts them back
to fp32 on arrival; its backward sends the gradients in ``comms.backward`` (one autograd
function, so the two directions may differ: autograd would cast a gradient back to the
forward dtype between two separate functions). Data-parallel gradients are all-reduced in
``comms.dp_allreduce``: the sum runs in that dtype, as TorchRec's quantized comms do (hierarchically
across hosts where that pays).
Everything outside these collectives stays fp32; fp32 on the wire is the plain collective.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.comms import WIRE_BYTES, CommsPrecision
from embshard.planner.cost.allreduce import hierarchical_allreduce
from embshard.runtime.comm import all_reduce, all_reduce_pieces, all_to_all, all_to_all_autograd, hierarchical_all_reduce, host_groups, reduce_scatter

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class _WireAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int], pg: dist.ProcessGroup, grad_scale: float,
                forward_dtype: torch.dtype, backward_dtype: torch.dtype) -> Tensor:
        ctx.splits, ctx.pg, ctx.grad_scale, ctx.backward_dtype = (out_splits, in_splits), pg, grad_scale, backward_dtype
        return all_to_all(x.to(forward_dtype), out_splits, in_splits, pg).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        back = all_to_all(grad.to(ctx.backward_dtype), in_splits, out_splits, ctx.pg).to(grad.dtype)
        if ctx.grad_scale != 1.0:
            back.mul_(ctx.grad_scale)
        return back, None, None, None, None, None, None


def wire_all_to_all(x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int], pg: dist.ProcessGroup,
                    comms: CommsPrecision, grad_scale: float = 1.0) -> Tensor:
    """`embshard.runtime.comm.all_to_all_autograd` with ``comms.forward`` / ``comms.backward`` on the wire."""
    if comms.forward == comms.backward == "fp32":
        return all_to_all_autograd(x, out_splits, in_splits, pg, grad_scale)
    return _WireAllToAll.apply(x, list(out_splits), list(in_splits), pg, grad_scale,
                               TORCH_DTYPES[comms.forward], TORCH_DTYPES[comms.backward])


def wire_all_reduce_(flat: Tensor, pg: dist.ProcessGroup, dtype: str) -> Tensor:
    """Sum ``flat`` over the group in place, on the wire (and in the sum) as ``dtype``: hierarchically
    where ranks span hosts and the cost model says it pays (`embshard.planner.cost.allreduce`, for the
    topology of the group's last collection, `embshard.runtime.comm.use_hosts`), else one ring."""
    hosts = host_groups(pg)
    wire = flat if dtype == "fp32" else flat.to(TORCH_DTYPES[dtype])
    if hosts is not None and hierarchical_allreduce(flat.numel() * WIRE_BYTES[dtype], hosts.topology):
        hierarchical_all_reduce(wire, hosts)
    else:
        all_reduce(wire, pg)
    return flat if wire is flat else flat.copy_(wire)


def wire_all_reduce_pieces_(flat: Tensor, cuts: Sequence[int], pg: dist.ProcessGroup, dtype: str) -> list[Callable[[], None]]:
    """`wire_all_reduce_` in the pieces of ``flat`` between ``cuts`` (`embshard.runtime.comm.all_reduce_pieces`), all
    in flight at once; returns one wait per piece, in order: after it, that piece of ``flat`` holds the sum. Where
    the sum runs hierarchically, the whole of it runs here, and the waits have nothing left to wait for."""
    hosts = host_groups(pg)
    if hosts is not None and hierarchical_allreduce(flat.numel() * WIRE_BYTES[dtype], hosts.topology):
        wire_all_reduce_(flat, pg, dtype)
        return [lambda: None] * (len(cuts) + 1)
    wire = flat if dtype == "fp32" else flat.to(TORCH_DTYPES[dtype])
    waits = all_reduce_pieces(wire, cuts, pg)
    bounds = [0, *cuts, flat.numel()]

    def wait(i: int) -> None:
        waits[i]()
        if wire is not flat:
            flat[bounds[i]:bounds[i + 1]].copy_(wire[bounds[i]:bounds[i + 1]])
    return [lambda i=i: wait(i) for i in range(len(waits))]


def wire_reduce_scatter(flat: Tensor, pg: dist.ProcessGroup, dtype: str) -> Tensor:
    """`embshard.runtime.comm.reduce_scatter` of ``flat`` on the wire (and in the sum) as ``dtype``; fp32 back."""
    if dtype == "fp32":
        return reduce_scatter(flat, pg)
    return reduce_scatter(flat.to(TORCH_DTYPES[dtype]), pg).float()
