"""Data-parallel tables trained DDP-style (``data_parallel_mode="allreduce"``).

Each rank looks up only its own samples in its replica (`InputDist.local`, nothing travels
in forward). Backward turns the output gradients into every replica block's dense weight
gradient and a count of ids per row, all-reduces them for all such blocks of the
collection in ONE flat buffer, divides the gradient by the world size (DDP's average) and
applies each table's optimizer to the rows some rank looked up (the all-reduce in the plan's
``comms.dp_allreduce`` dtype, embshard.runtime.wire): the same update, on every
replica, as the replicated look-up (``"replicated_lookup"``, see collection.py), which
instead ships ids and pooled gradients and looks up the global batch on every rank.
Cheaper for small tables; priced by `embshard.planner.cost.perf.data_parallel_perf`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from embshard.comms import CommsPrecision
from embshard.runtime.input_dist import Received
from embshard.runtime.optim import OptimizerConfig, apply_update
from embshard.runtime.routing import KernelSpec
from embshard.runtime.wire import wire_all_reduce_


class DenseReplicas:
    """The replica kernels of one collection, looked up locally and updated after one all-reduce."""

    def __init__(self, kernels: Sequence[nn.Module], specs: Sequence[KernelSpec], pooled: bool,
                 config: OptimizerConfig, pg: dist.ProcessGroup, comms: CommsPrecision = CommsPrecision()) -> None:
        self.kernels, self.specs, self.pooled, self.config, self.pg = list(kernels), list(specs), pooled, config, pg
        self.comms = comms
        self.learning_rate = config.learning_rate
        # Not an nn.Parameter of any module (DDP must not wait for it): it only makes backward run.
        self.placeholder = torch.zeros(0, requires_grad=True, device=_device(self.kernels))

    def __call__(self, received: Received) -> list[Tensor]:
        return list(_LocalLookup.apply(self.placeholder, self, received))

    def per_id_grads(self, spec: KernelSpec, x, grad: Tensor) -> dict[int, tuple[Tensor, Tensor]]:
        """width -> (row of each id in the kernel's blocks of that width, stacked [N], its gradient [N, width])."""
        widths = [b.num_cols for b in spec.blocks]
        base = {}  # block -> first row in its width's stack
        for b, w in enumerate(widths):
            base[b] = sum(spec.blocks[c].num_rows for c in range(b) if widths[c] == w)
        T, device = len(spec.slots), x.indices.device
        slot_base = torch.tensor([base[b] for b in spec.slot_block], dtype=torch.int64, device=device)
        slot_width = torch.tensor([s.num_cols for s in spec.slots], dtype=torch.int64, device=device)
        if not self.pooled:  # one width; rows flat in [slot][id] order
            counts = torch.tensor([sum(c) for c in x.ids_per_feature_rank], dtype=torch.int64, device=device)
            slot_N = torch.repeat_interleave(torch.arange(T, device=device), counts, output_size=x.indices.numel())
            return {spec.dim: (x.indices + slot_base.index_select(0, slot_N), grad.view(-1, spec.dim))}
        B = grad.shape[0]
        lengths = x.offsets[1:] - x.offsets[:-1]
        bag_N = torch.repeat_interleave(torch.arange(T * B, device=device), lengths, output_size=x.indices.numel())
        slot_N, sample_N = bag_N // B, bag_N % B
        out = {}
        for w in sorted(set(widths)):
            slots = [t for t, s in enumerate(spec.slots) if s.num_cols == w]
            position = torch.full((T,), -1, dtype=torch.int64, device=device)
            position[slots] = torch.arange(len(slots), device=device)
            if len(slots) == T:  # one width: every column, every id
                grad_w, pick = grad, None
            else:
                starts = torch.cumsum(slot_width, 0) - slot_width
                cols = torch.cat([torch.arange(int(starts[t]), int(starts[t]) + w, device=device) for t in slots])
                grad_w, pick = grad.index_select(1, cols), (slot_width.index_select(0, slot_N) == w).nonzero().squeeze(1)
            ids, slot_w, sample_w = (x.indices, slot_N, sample_N) if pick is None else \
                (x.indices.index_select(0, pick), slot_N.index_select(0, pick), sample_N.index_select(0, pick))
            g = grad_w.reshape(-1, w).index_select(0, sample_w * len(slots) + position.index_select(0, slot_w))
            if x.per_sample_weights is not None:
                psw = x.per_sample_weights if pick is None else x.per_sample_weights.index_select(0, pick)
                g = g * psw.unsqueeze(1)
            out[w] = (ids + slot_base.index_select(0, slot_w), g)
        return out

    def update(self, inputs, grads: Sequence[Tensor]) -> None:
        """Dense gradients and id counts of every block -> one all-reduce -> each table's optimizer."""
        parts: list[tuple[Tensor, Tensor]] = []  # (gradient [rows, width], ids per row [rows]) per (kernel, width)
        for kernel, spec, x, grad in zip(self.kernels, self.specs, inputs, grads):
            per_width = self.per_id_grads(spec, x, grad)
            for w, (rows, g) in sorted(per_width.items()):
                num_rows = sum(b.num_rows for b in spec.blocks if b.num_cols == w)
                parts.append((g.new_zeros(num_rows, w).index_add_(0, rows, g.float()),
                              torch.bincount(rows, minlength=num_rows).to(g.dtype)))
        flat = torch.cat([t.reshape(-1) for part in parts for t in part])
        wire_all_reduce_(flat, self.pg, self.comms.dp_allreduce)
        reduced = iter(flat.split([t.numel() for part in parts for t in part]))
        world = dist.get_world_size(self.pg)
        with torch.no_grad():
            for kernel, spec in zip(self.kernels, self.specs):
                step = kernel.count_update()
                weights, states = kernel.block_weights(), kernel.block_states()
                for w in sorted({b.num_cols for b in spec.blocks}):
                    blocks = [i for i, b in enumerate(spec.blocks) if b.num_cols == w]
                    sizes = [spec.blocks[i].num_rows for i in blocks]
                    grad, count = next(reduced).view(-1, w), next(reduced)
                    # blocks are views of the kernel's weights and state: updated in place, looked-up rows only
                    for i, grad_block, count_block in zip(blocks, grad.split(sizes), count.split(sizes)):
                        rows = count_block.nonzero().squeeze(1)
                        if rows.numel():
                            apply_update(spec.optimizer, weights[i], states[i], rows,
                                         grad_block.index_select(0, rows) / world, self.config, self.learning_rate, step)


class _LocalLookup(torch.autograd.Function):
    """Forward: every replica kernel on this rank's ids (no fused update). Backward: `DenseReplicas.update`."""

    @staticmethod
    def forward(ctx, placeholder: Tensor, owner: DenseReplicas, received: Received):
        ctx.owner, ctx.inputs = owner, received.inputs
        return tuple(k(x.indices, x.offsets, x.per_sample_weights, x.ids_per_feature_rank)
                     for k, x in zip(owner.kernels, received.inputs))

    @staticmethod
    def backward(ctx, *grads: Tensor):
        ctx.owner.update(ctx.inputs, grads)
        return None, None, None


def _device(kernels: Sequence[nn.Module]) -> torch.device:
    return kernels[0].block_weights()[0].device
