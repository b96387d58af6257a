"""Rank-local embedding kernels with the optimizer fused into backward.

`FbgemmKernel` wraps FBGEMM's table-batched kernel (one call looks up every block it
holds). `TorchKernel` does the same in torch ops for what FBGEMM cannot run on this
device (adam on CPU, widths that are not multiples of 4), with the same update formulas.

Pooled kernels take FBGEMM's input layout, ``indices`` of T features x B bags and
``offsets`` [T*B+1], and return [B, sum of widths]. Sequence kernels (one width each) take
the ids of each feature grouped by source rank, with ``ids_per_feature_rank[f][r]``, and
return the rows flat, ordered [rank][feature][id] x width: the order they travel back in.
FBGEMM runs them with its summing kernel over one-id bags (each feature padded with empty
bags to the largest feature's id count): on CPU its unpooled PoolingMode.NONE kernel is
~10x slower in backward, and its variable-batch (VBE) forward grows faster than linearly
with the number of ids.

Memory tiers: on CUDA each block of an FBGEMM kernel is built at its shard's planned location
(`fbgemm_locations`): DEVICE for hbm, MANAGED_CACHING for uvm_cache (the kernel's one cache
sized to the sum of its blocks' planned cache rows, in sets of FBGEMM's associativity), MANAGED
(host memory, UVM) for host. This path has not run here (no GPU). On CPU every block is HOST:
all memory is host memory, so a tiered plan runs unchanged (`embshard.runtime.collection` says
so once). Reading or writing a cached kernel's weights (checkpoints) first flushes the cache's
updated rows to host memory and empties it, so the weights seen are the rows' latest values.

Both kernels count updates, not forwards (`UpdateCounting`): ``step`` is the number of updates
applied, and adam's bias correction for the next one uses t = step + 1. Eval and no-grad
forwards (the kernels are no submodules: ``model.eval()`` does not reach them) change nothing.
"""

from __future__ import annotations

import zlib
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    ComputeDevice,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import Tensor, nn

from embshard.planner.types import Location
from embshard.runtime.optim import OptimizerConfig, apply_update, new_state, state_shapes
from embshard.runtime.routing import KernelSpec, Slot

FBGEMM_OPTIM = {
    "sgd": EmbOptimType.EXACT_SGD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adam": EmbOptimType.ADAM,
}
TORCH_DTYPE = {"fp32": torch.float32, "fp16": torch.float16}
CUDA_LOCATION = {Location.HBM: EmbeddingLocation.DEVICE, Location.UVM_CACHE: EmbeddingLocation.MANAGED_CACHING,
                 Location.HOST: EmbeddingLocation.MANAGED}
CACHE_ASSOC = 32  # FBGEMM's cache associativity on CUDA (rows per cache set; 64 on ROCm)


def fbgemm_locations(blocks: Sequence[Slot], device: torch.device) -> tuple[list[EmbeddingLocation], ComputeDevice, int]:
    """Each block's EmbeddingLocation, the compute device, and the cache sets its cached blocks'
    planned rows take (0 without caching). On CPU every block is HOST (no cache)."""
    if device.type != "cuda":
        return [EmbeddingLocation.HOST] * len(blocks), ComputeDevice.CPU, 0
    cached = sum(b.cache_rows for b in blocks if b.location is Location.UVM_CACHE)
    return [CUDA_LOCATION[b.location] for b in blocks], ComputeDevice.CUDA, -(-cached // CACHE_ASSOC)


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


class UpdateCounting(nn.Module):
    """``step``: updates applied so far (adam's t of the last one), counted by `count_update` when an
    update is applied (in backward, or by `DenseReplicas` after its all-reduce), never in forward.
    Kept on the CPU: reading it never waits for a GPU."""

    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    def count_update(self) -> int:
        """Count one update; returns the updates so far, this one included (its adam t)."""
        self.step += 1
        return int(self.step)

    def step_state(self) -> dict[str, Tensor]:
        """The counter as optimizer state (adam's only: the other optimizers do not use it)."""
        return {"step": self.step} if self.optimizer == "adam" else {}


class _CountUpdate(torch.autograd.Function):
    """Identity on a kernel's output whose backward counts the update the kernel's backward applies."""

    @staticmethod
    def forward(ctx, out: Tensor, kernel: UpdateCounting) -> Tensor:
        ctx.kernel = kernel
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.kernel.count_update()
        return grad, None


class FbgemmKernel(UpdateCounting):
    """FBGEMM `SplitTableBatchedEmbeddingBagsCodegen` over a rank's blocks of one kind.

    FBGEMM's TBE adds 1 to its own counters (``iter_cpu``, ``iter``) in every forward of adam
    (and, on CPU, rowwise adagrad), eval forwards included, and passes the result to that
    forward's backward as adam's t. Each forward here first sets them to ``step``, so the
    update a forward leads to uses t = step + 1 whatever forwards ran before; its backward
    counts the update (`_CountUpdate`).
    """

    def __init__(self, spec: KernelSpec, pooled: bool, dtypes: Sequence[str], config: OptimizerConfig,
                 device: torch.device) -> None:
        super().__init__(spec.optimizer)
        assert len(set(dtypes)) == 1, "one kernel holds one weight dtype"
        locations, compute, cache_sets = fbgemm_locations(spec.blocks, device)
        self.cached = cache_sets > 0
        self.pooled = pooled
        assert pooled or len({b.num_cols for b in spec.blocks}) == 1, "a sequence kernel holds blocks of one width"
        self.dim = spec.blocks[0].num_cols
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(b.num_rows, b.num_cols, loc, compute) for b, loc in zip(spec.blocks, locations)],
            cache_sets=cache_sets,
            feature_table_map=list(spec.slot_block),
            optimizer=FBGEMM_OPTIM[spec.optimizer],
            pooling_mode=PoolingMode.SUM,
            weights_precision=SparseType.FP16 if dtypes[0] == "fp16" else SparseType.FP32,
            output_dtype=SparseType.FP32,
            learning_rate=config.learning_rate,
            eps=config.eps,
            beta1=config.beta1,
            beta2=config.beta2,
            bounds_check_mode=BoundsCheckMode.NONE,  # ids are validated before the input dist
            device=device,
        )

    def forward(self, indices: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None,
                ids_per_feature_rank: list[list[int]] | None = None) -> Tensor:
        updates = int(self.step)
        self.tbe.iter_cpu.fill_(updates)  # the TBE adds 1: this forward's update uses t = updates + 1
        self.tbe.iter.fill_(updates)  # (the TBE reloads iter_cpu from iter when it reads 0)
        if self.pooled:
            out = self.tbe(indices, offsets, per_sample_weights=per_sample_weights)
        else:
            out = one_id_bag_rows(self.tbe, self.dim, indices, ids_per_feature_rank)
        return _CountUpdate.apply(out, self) if out.requires_grad else out

    @property
    def has_dense_lookup(self) -> bool:
        """Whether `dense_lookup` runs: pooled, fp32 weights all in host memory."""
        weights = self.tbe.weights_host
        return self.pooled and not self.cached and weights.numel() > 0 and weights.dtype == torch.float32

    def dense_lookup(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None) -> tuple[Tensor, Tensor] | None:
        """Pooled lookups by FBGEMM's dense kernel over a leaf that shares this kernel's host weights: (output, leaf),
        whose backward gives the dense gradient of the flat weights (blocks one after another) and updates nothing
        (what `embshard.runtime.dense_replicas` all-reduces); None where the weights are not fp32 host memory."""
        if not self.has_dense_lookup:
            return None
        leaf = self.tbe.weights_host.detach().requires_grad_()
        with torch.enable_grad():
            out = torch.ops.fbgemm.dense_embedding_codegen_lookup_function(
                dev_weights=leaf, weights_offsets=self.tbe.weights_offsets, D_offsets=self.tbe.D_offsets,
                total_D=self.tbe.total_D, max_D=self.tbe.max_D, hash_size_cumsum=self.tbe.hash_size_cumsum,
                total_hash_size_bits=self.tbe.total_hash_size_bits, indices=indices, offsets=offsets,
                pooling_mode=int(PoolingMode.SUM), indice_weights=per_sample_weights, feature_requires_grad=None,
                output_dtype=SparseType.FP32.as_int())
        return out, leaf

    def block_weights(self) -> list[Tensor]:
        if self.cached:  # updated rows back to host memory, the cache emptied: the weights are current, writes are seen
            self.tbe.flush()
            self.tbe.reset_cache_states()
        return list(self.tbe.split_embedding_weights())

    def block_states(self) -> list[dict[str, Tensor]]:
        """Per block: its optimizer state tensors, and for adam the kernel's step counter (shared)."""
        names = list(state_shapes(self.optimizer, 1, 1))
        if not names:
            return [{} for _ in self.block_weights()]
        return [{**dict(zip(names, states)), **self.step_state()} for states in self.tbe.split_optimizer_states()]

    def set_learning_rate(self, learning_rate: float) -> None:
        self.tbe.set_learning_rate(learning_rate)


class TorchKernel(UpdateCounting):
    """Same contract as `FbgemmKernel`, in torch ops, for blocks of one width (its backward counts its update)."""

    def __init__(self, spec: KernelSpec, pooled: bool, dtypes: Sequence[str], config: OptimizerConfig,
                 device: torch.device) -> None:
        super().__init__(spec.optimizer)
        assert len({b.num_cols for b in spec.blocks}) == 1, "the torch kernel holds blocks of one width"
        assert len(set(dtypes)) == 1, "one kernel holds one weight dtype"
        self.pooled, self.config = pooled, config
        self.learning_rate = config.learning_rate
        self.dim = spec.blocks[0].num_cols
        self.num_rows = [b.num_rows for b in spec.blocks]
        row_base = torch.tensor([0, *self.num_rows], dtype=torch.int64).cumsum(0)
        total_rows = int(row_base[-1])
        self.register_buffer("weight", torch.zeros(total_rows, self.dim, dtype=TORCH_DTYPE[dtypes[0]], device=device))
        self.register_buffer("feature_row_base", row_base[torch.tensor(spec.slot_block, dtype=torch.int64)].to(device))
        self.state = new_state(self.optimizer, total_rows, self.dim, device)
        for name, tensor in self.state.items():
            self.register_buffer(f"state_{name}", tensor)
        # Backward runs only for inputs that need a gradient; this one always does.
        self.placeholder = nn.Parameter(torch.zeros(0, device=device))

    def forward(self, indices: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None,
                ids_per_feature_rank: list[list[int]] | None = None) -> Tensor:
        if self.pooled:
            return _TorchLookup.apply(self.placeholder, self, indices, offsets, per_sample_weights, None)
        counts_FR = torch.tensor(ids_per_feature_rank, dtype=torch.int64, device=indices.device)
        rows = _TorchLookup.apply(self.placeholder, self, indices, offsets, None, counts_FR.sum(1))
        return rows.index_select(0, source_major_rows(counts_FR)).reshape(-1)

    def block_weights(self) -> list[Tensor]:
        return list(self.weight.split(self.num_rows))

    def block_states(self) -> list[dict[str, Tensor]]:
        per_name = {name: t.split(self.num_rows) for name, t in self.state.items()}
        return [{**{name: parts[i] for name, parts in per_name.items()}, **self.step_state()} for i in range(len(self.num_rows))]

    def set_learning_rate(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate

    def update(self, rows_N: Tensor, grad_ND: Tensor) -> None:
        """Sum the per-id gradients by row and apply the optimizer to those rows."""
        rows, inverse = torch.unique(rows_N, return_inverse=True)
        grad = grad_ND.new_zeros(rows.numel(), self.dim).index_add_(0, inverse, grad_ND)
        step = self.count_update()
        with torch.no_grad():
            apply_update(self.optimizer, self.weight, self.state, rows, grad, self.config, self.learning_rate, step)


class _TorchLookup(torch.autograd.Function):
    """Pooled: [B, T*dim] sums of bags. Sequence (one id per bag): [num ids, dim] rows in input order."""

    @staticmethod
    def forward(ctx, placeholder: Tensor, kernel: TorchKernel, indices: Tensor, offsets: Tensor | None,
                per_sample_weights: Tensor | None, ids_per_feature: Tensor | None) -> Tensor:
        num_features = kernel.feature_row_base.numel()
        ctx.kernel = kernel
        if not kernel.pooled:
            features = torch.arange(num_features, device=indices.device)
            feature_N = torch.repeat_interleave(features, ids_per_feature, output_size=indices.numel())
            rows_N = indices + kernel.feature_row_base.index_select(0, feature_N)
            ctx.save_for_backward(rows_N, None, None)
            return kernel.weight.index_select(0, rows_N).float()
        lengths = offsets[1:] - offsets[:-1]
        batch_size = lengths.numel() // num_features
        num_bags = num_features * batch_size
        bag_N = torch.repeat_interleave(torch.arange(num_bags, device=indices.device), lengths, output_size=indices.numel())
        rows_N = indices + kernel.feature_row_base.repeat_interleave(batch_size).index_select(0, bag_N)
        ctx.batch_size = batch_size
        ctx.save_for_backward(rows_N, bag_N, per_sample_weights)
        pooled = F.embedding_bag(rows_N, kernel.weight, offsets, mode="sum", per_sample_weights=per_sample_weights,
                                 include_last_offset=True).float()
        return pooled.view(num_features, batch_size, kernel.dim).transpose(0, 1).reshape(batch_size, num_features * kernel.dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        kernel: TorchKernel = ctx.kernel
        rows_N, bag_N, per_sample_weights = ctx.saved_tensors
        if kernel.pooled:
            grad_bags = grad.reshape(ctx.batch_size, -1, kernel.dim).transpose(0, 1).reshape(-1, kernel.dim)
            grad_ND = grad_bags.index_select(0, bag_N)
            if per_sample_weights is not None:
                grad_ND.mul_(per_sample_weights.unsqueeze(1))
        else:
            grad_ND = grad
        kernel.update(rows_N, grad_ND.float())
        return None, None, None, None, None, None


def one_id_bag_rows(summing_kernel: Callable[[Tensor, Tensor], Tensor], dim: int, indices: Tensor,
                    ids_per_feature_rank: list[list[int]]) -> Tensor:
    """Sequence lookups through a summing kernel (``kernel(indices, offsets)`` -> [bags, F * dim]) over
    one-id bags: the rows flat, ordered [rank][feature][id] x dim."""
    counts_FR = torch.tensor(ids_per_feature_rank, dtype=torch.int64, device=indices.device)
    ids_F = counts_FR.sum(1)
    F = ids_F.numel()
    bags = max(1, int(ids_F.max()))  # every feature gets this many bags: one id each, then empty ones
    lengths = (torch.arange(bags, device=indices.device).unsqueeze(0) < ids_F.unsqueeze(1)).to(torch.int64)
    pooled = summing_kernel(indices, torch.ops.fbgemm.asynchronous_complete_cumsum(lengths.reshape(-1)))  # [bags, F * dim]
    # Input position p (features one after another) -> output row: bag (p - first id of its feature) of its feature.
    order = source_major_rows(counts_FR)
    feature_P = torch.repeat_interleave(torch.arange(F, device=indices.device), ids_F, output_size=indices.numel())
    first_F = torch.cumsum(ids_F, 0) - ids_F
    feature_O = feature_P.index_select(0, order)
    rows = (order - first_F.index_select(0, feature_O)) * F + feature_O
    return pooled.view(-1, dim).index_select(0, rows).reshape(-1)


def source_major_rows(counts_FR: Tensor) -> Tensor:
    """Row permutation from [feature][rank] order to [rank][feature] order (segment sizes ``counts_FR``)."""
    flat = counts_FR.reshape(-1)
    src_start = (torch.cumsum(flat, 0) - flat).view_as(counts_FR)
    counts_RF, src_start_RF = counts_FR.t().reshape(-1), src_start.t().reshape(-1)
    dst_start_RF = torch.cumsum(counts_RF, 0) - counts_RF
    total = int(flat.sum())
    return torch.repeat_interleave(src_start_RF - dst_start_RF, counts_RF, output_size=total) + \
        torch.arange(total, device=counts_FR.device)
