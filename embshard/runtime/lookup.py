"""Rank-local embedding kernels with the optimizer fused into backward.

`FbgemmKernel` wraps FBGEMM's table-batched kernel (one call looks up every block it
holds). `TorchKernel` does the same in torch ops for what FBGEMM cannot run on this
device (adam on CPU) and for data-parallel replicas, whose gradients are summed over
ranks with one all-reduce and divided by the world size before the update.

Both take FBGEMM's input layout: ``indices`` of T features x B bags, ``offsets`` [T*B+1];
pooled kernels return [B, sum of widths], sequence kernels [num ids, width].
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import Tensor, nn

from embshard.runtime.optim import OptimizerConfig, apply_update, new_state, state_shapes
from embshard.runtime.routing import KernelSpec

FBGEMM_OPTIM = {
    "sgd": EmbOptimType.EXACT_SGD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adam": EmbOptimType.ADAM,
}
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16}


def fbgemm_optimizers(device: torch.device) -> frozenset[str]:
    """Optimizers FBGEMM's training kernel runs on this device (its CPU build has no adam)."""
    return frozenset(FBGEMM_OPTIM) if device.type == "cuda" else frozenset({"sgd", "adagrad", "rowwise_adagrad"})


def init_block(table: str, num_embeddings: int, num_rows: int, num_cols: int, row_offset: int, col_offset: int, seed: int) -> Tensor:
    """Uniform(+-1/sqrt(num_embeddings)) init of one block, seeded by table and offsets.

    Every rank draws the same values for the same block, so data-parallel replicas agree.
    """
    key = f"{table}:{row_offset}:{col_offset}".encode()
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key))
    return (torch.rand((num_rows, num_cols), generator=gen) * 2 - 1) * num_embeddings ** -0.5


class FbgemmKernel(nn.Module):
    """FBGEMM `SplitTableBatchedEmbeddingBagsCodegen` over a rank's blocks of one kind."""

    def __init__(self, spec: KernelSpec, pooled: bool, feature_copies: int, dtypes: Sequence[str],
                 config: OptimizerConfig, device: torch.device) -> None:
        super().__init__()
        assert len(set(dtypes)) == 1, "one kernel holds one weight dtype"
        location, compute = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if device.type == "cuda" else (EmbeddingLocation.HOST, ComputeDevice.CPU)
        self.optimizer = spec.optimizer
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(b.num_rows, b.num_cols, location, compute) for b in spec.blocks],
            feature_table_map=list(spec.slot_block) * feature_copies,
            optimizer=FBGEMM_OPTIM[spec.optimizer],
            pooling_mode=PoolingMode.SUM if pooled else PoolingMode.NONE,
            weights_precision=SparseType.FP16 if dtypes[0] == "fp16" else SparseType.FP32,
            output_dtype=SparseType.FP32,
            learning_rate=config.learning_rate,
            eps=config.eps,
            beta1=config.beta1,
            beta2=config.beta2,
            bounds_check_mode=BoundsCheckMode.NONE,  # ids are validated before the input dist
            device=device,
        )

    def forward(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None = None) -> Tensor:
        return self.tbe(indices, offsets, per_sample_weights=per_sample_weights)

    def block_weights(self) -> list[Tensor]:
        return list(self.tbe.split_embedding_weights())

    def block_states(self) -> list[dict[str, Tensor]]:
        """Per block: its optimizer state tensors, and for adam the kernel's step counter (shared)."""
        names = list(state_shapes(self.optimizer, 1, 1))
        step = {"step": self.tbe.iter.view(())} if self.optimizer == "adam" else {}
        if not names:
            return [{} for _ in self.block_weights()]
        return [{**dict(zip(names, states)), **step} for states in self.tbe.split_optimizer_states()]

    def set_learning_rate(self, learning_rate: float) -> None:
        self.tbe.set_learning_rate(learning_rate)


class TorchKernel(nn.Module):
    """Same contract as `FbgemmKernel`, in torch ops, for blocks of one width.

    reduce_pg: for data-parallel replicas, the group whose ranks hold the same replica;
    gradients are summed over it and divided by its size before the update.
    """

    def __init__(self, spec: KernelSpec, pooled: bool, feature_copies: int, dtypes: Sequence[str],
                 config: OptimizerConfig, device: torch.device, reduce_pg: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        assert len({b.num_cols for b in spec.blocks}) == 1, "the torch kernel holds blocks of one width"
        assert len(set(dtypes)) == 1, "one kernel holds one weight dtype"
        self.pooled, self.optimizer, self.config, self.reduce_pg = pooled, spec.optimizer, config, reduce_pg
        self.learning_rate = config.learning_rate
        self.dim = spec.blocks[0].num_cols
        self.num_rows = [b.num_rows for b in spec.blocks]
        row_base = torch.tensor([0, *self.num_rows], dtype=torch.int64).cumsum(0)
        total_rows = int(row_base[-1])
        self.register_buffer("weight", torch.zeros(total_rows, self.dim, dtype=TORCH_DTYPE[dtypes[0]], device=device))
        self.register_buffer("feature_row_base", row_base[torch.tensor(list(spec.slot_block) * feature_copies, dtype=torch.int64)].to(device))
        self.state = new_state(self.optimizer, total_rows, self.dim, device)
        for name, tensor in self.state.items():
            self.register_buffer(f"state_{name}", tensor)
        self.register_buffer("step", torch.zeros((), dtype=torch.int64, device=device))  # updates so far (adam's t)
        # Backward runs only for inputs that need a gradient; this one always does.
        self.placeholder = nn.Parameter(torch.zeros(0, device=device))

    def forward(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None = None) -> Tensor:
        return _TorchLookup.apply(self.placeholder, self, indices, offsets, per_sample_weights)

    def block_weights(self) -> list[Tensor]:
        return list(self.weight.split(self.num_rows))

    def block_states(self) -> list[dict[str, Tensor]]:
        per_name = {name: t.split(self.num_rows) for name, t in self.state.items()}
        step = {"step": self.step} if self.optimizer == "adam" else {}
        return [{**{name: parts[i] for name, parts in per_name.items()}, **step} for i in range(len(self.num_rows))]

    def set_learning_rate(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate

    def update(self, rows_N: Tensor, grad_ND: Tensor) -> None:
        """Sum the per-id gradients by row (over ranks for replicas) and apply the optimizer."""
        if self.reduce_pg is not None:
            total_rows = self.weight.shape[0]
            dense = grad_ND.new_zeros(total_rows, self.dim + 1)
            dense.index_add_(0, rows_N, torch.cat([grad_ND, grad_ND.new_ones(grad_ND.shape[0], 1)], dim=1))
            dist.all_reduce(dense, group=self.reduce_pg)
            rows = dense[:, self.dim].nonzero().squeeze(1)
            grad = dense[rows, : self.dim] / dist.get_world_size(self.reduce_pg)
        else:
            rows, inverse = torch.unique(rows_N, return_inverse=True)
            grad = grad_ND.new_zeros(rows.numel(), self.dim).index_add_(0, inverse, grad_ND)
        self.step += 1
        with torch.no_grad():
            apply_update(self.optimizer, self.weight, self.state, rows, grad, self.config, self.learning_rate, int(self.step))


class _TorchLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, placeholder: Tensor, kernel: TorchKernel, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None) -> Tensor:
        num_features = kernel.feature_row_base.numel()
        lengths = offsets[1:] - offsets[:-1]
        batch_size = lengths.numel() // num_features
        num_bags = num_features * batch_size
        bag_N = torch.repeat_interleave(torch.arange(num_bags, device=indices.device), lengths, output_size=indices.numel())
        rows_N = indices + kernel.feature_row_base.repeat_interleave(batch_size)[bag_N]
        emb_ND = kernel.weight[rows_N].float()
        ctx.kernel, ctx.batch_size = kernel, batch_size
        ctx.save_for_backward(rows_N, bag_N, per_sample_weights)
        if not kernel.pooled:
            return emb_ND
        if per_sample_weights is not None:
            emb_ND = emb_ND * per_sample_weights.unsqueeze(1)
        pooled = emb_ND.new_zeros(num_bags, kernel.dim).index_add_(0, bag_N, emb_ND)
        return pooled.view(num_features, batch_size, kernel.dim).transpose(0, 1).reshape(batch_size, num_features * kernel.dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        kernel: TorchKernel = ctx.kernel
        rows_N, bag_N, per_sample_weights = ctx.saved_tensors
        if kernel.pooled:
            grad_bags = grad.reshape(ctx.batch_size, -1, kernel.dim).transpose(0, 1).reshape(-1, kernel.dim)
            grad_ND = grad_bags[bag_N]
            if per_sample_weights is not None:
                grad_ND = grad_ND * per_sample_weights.unsqueeze(1)
        else:
            grad_ND = grad
        kernel.update(rows_N, grad_ND.float())
        return None, None, None, None, None
