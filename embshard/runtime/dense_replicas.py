"""Data-parallel tables trained DDP-style (``data_parallel_mode="allreduce"``).

Each rank looks up only its own samples in its replica (`InputDist.local`, nothing travels
in forward). Backward turns the output gradients into every replica block's dense weight
gradient and a count of ids per row, all-reduces them for all such blocks of the
collection in ONE flat buffer, divides the gradient by the world size (DDP's average) and
applies each table's optimizer to the rows some rank looked up: the same update, on every
replica, as the replicated look-up (``"replicated_lookup"``, see collection.py), which
instead ships ids and pooled gradients and looks up the global batch on every rank.
Cheaper for small tables; priced by `embshard.planner.cost.perf.data_parallel_perf`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from embshard.runtime.input_dist import Received
from embshard.runtime.optim import OptimizerConfig, apply_update
from embshard.runtime.routing import KernelSpec

DATA_PARALLEL_MODES = ("allreduce", "replicated_lookup")


class DenseReplicas:
    """The replica kernels of one collection, looked up locally and updated after one all-reduce."""

    def __init__(self, kernels: Sequence[nn.Module], specs: Sequence[KernelSpec], pooled: bool,
                 config: OptimizerConfig, pg: dist.ProcessGroup) -> None:
        self.kernels, self.specs, self.pooled, self.config, self.pg = list(kernels), list(specs), pooled, config, pg
        self.learning_rate = config.learning_rate
        # Not an nn.Parameter of any module (DDP must not wait for it): it only makes backward run.
        self.placeholder = torch.zeros(0, requires_grad=True, device=_device(self.kernels))

    def __call__(self, received: Received) -> list[Tensor]:
        return list(_LocalLookup.apply(self.placeholder, self, received))

    def per_id_rows_and_grads(self, spec: KernelSpec, x, grad: Tensor) -> list[tuple[int, Tensor, Tensor]]:
        """(block index, row ids, per-id gradient [ids, width]) for each slot of one kernel."""
        out = []
        if self.pooled:
            bags = grad.shape[0]
            cuts = x.offsets[torch.arange(0, len(spec.slots) + 1, device=x.offsets.device) * bags].tolist()
            col = 0
            for t, slot in enumerate(spec.slots):
                lengths = x.offsets[t * bags + 1:(t + 1) * bags + 1] - x.offsets[t * bags:(t + 1) * bags]
                g = torch.repeat_interleave(grad[:, col:col + slot.num_cols], lengths, dim=0,
                                            output_size=cuts[t + 1] - cuts[t])
                if x.per_sample_weights is not None:
                    g = g * x.per_sample_weights[cuts[t]:cuts[t + 1]].unsqueeze(1)
                out.append((spec.slot_block[t], x.indices[cuts[t]:cuts[t + 1]], g))
                col += slot.num_cols
            return out
        counts = [sum(c) for c in x.ids_per_feature_rank]
        rows = grad.view(-1, spec.dim).split(counts)
        return [(spec.slot_block[t], ids, g) for t, (ids, g) in enumerate(zip(x.indices.split(counts), rows))]

    def update(self, inputs, grads: Sequence[Tensor]) -> None:
        """Dense gradients and id counts of every block -> one all-reduce -> each table's optimizer."""
        parts: list[tuple[Tensor, Tensor]] = []  # (gradient [rows, width], ids per row [rows]) per block, kernel order
        for kernel, spec, x, grad in zip(self.kernels, self.specs, inputs, grads):
            weights = kernel.block_weights()
            blocks = [(torch.zeros(w.shape, device=w.device), torch.zeros(w.shape[0], device=w.device)) for w in weights]
            for b, ids, g in self.per_id_rows_and_grads(spec, x, grad):
                blocks[b][0].index_add_(0, ids, g.float())
                blocks[b][1].index_add_(0, ids, torch.ones(ids.numel(), device=ids.device))
            parts.extend(blocks)
        flat = torch.cat([t.reshape(-1) for part in parts for t in part])
        dist.all_reduce(flat, group=self.pg)
        sizes = [t.numel() for part in parts for t in part]
        reduced = iter(flat.split(sizes))
        world = dist.get_world_size(self.pg)
        with torch.no_grad():
            for kernel, spec in zip(self.kernels, self.specs):
                step = kernel.count_update()
                for weight, state in zip(kernel.block_weights(), kernel.block_states()):
                    grad, count = next(reduced).view(weight.shape), next(reduced)
                    rows = count.nonzero().squeeze(1)
                    state = {k: v for k, v in state.items() if k != "step"}
                    apply_update(spec.optimizer, weight, state, rows, grad.index_select(0, rows) / world, self.config,
                                 self.learning_rate, step)


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
