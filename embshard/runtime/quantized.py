"""Forward-only rank-local kernel for serving: FBGEMM's `IntNBitTableBatchedEmbeddingBagsCodegen`
over a rank's blocks of one weight dtype (fp32, fp16 or row-wise int8).

Same call contract as the training kernels (embshard.runtime.lookup): pooled kernels take
FBGEMM's ``indices``/``offsets`` over T features x B bags and return [B, sum of widths];
sequence kernels run the summing kernel over one-id bags (`one_id_bag_rows`). Outputs are
fp32 (int8 rows are dequantized inside the kernel: q * scale + bias). No optimizer, no
backward: the weights are plain buffers loaded once with `load_block`.

Row layout (FBGEMM's): fp32/fp16 rows are the elements' bytes; an int8 row is one uint8 per
element plus an fp16 scale and an fp16 bias (``scale_bias`` [rows, 2]).
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
from torch import Tensor, nn

from embshard.runtime.lookup import fbgemm_locations, one_id_bag_rows
from embshard.runtime.routing import KernelSpec

SPARSE_TYPE = {"fp32": SparseType.FP32, "fp16": SparseType.FP16, "int8": SparseType.INT8}
STORED_DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "int8": torch.uint8}


class QuantKernel(nn.Module):
    """Forward-only FBGEMM kernel over the blocks of ``spec`` (one dtype; sequence kernels one width)."""

    def __init__(self, spec: KernelSpec, pooled: bool, dtype: str, device: torch.device) -> None:
        super().__init__()
        assert dtype in SPARSE_TYPE, f"unknown serving dtype {dtype!r}"
        assert pooled or len({b.num_cols for b in spec.blocks}) == 1, "a sequence kernel holds blocks of one width"
        locations, _, cache_sets = fbgemm_locations(spec.blocks, device)  # per block, as planned (on CUDA; HOST on CPU)
        self.pooled, self.dtype, self.dim = pooled, dtype, spec.blocks[0].num_cols
        self.blocks = spec.blocks
        self.tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(b.table, b.num_rows, b.num_cols, SPARSE_TYPE[dtype], loc) for b, loc in zip(spec.blocks, locations)],
            cache_sets=cache_sets,
            feature_table_map=list(spec.slot_block),
            pooling_mode=PoolingMode.SUM,
            device=device,
            bounds_check_mode=BoundsCheckMode.NONE,  # ids are validated before the input dist
            output_dtype=SparseType.FP32,
        )
        self.tbe.initialize_weights()

    def forward(self, indices: Tensor, offsets: Tensor | None = None, per_sample_weights: Tensor | None = None,
                ids_per_feature_rank: list[list[int]] | None = None) -> Tensor:
        if self.pooled:
            return self.tbe(indices, offsets, per_sample_weights)
        return one_id_bag_rows(self.tbe, self.dim, indices, ids_per_feature_rank)

    def load_block(self, index: int, weight: Tensor, scale_bias: Tensor | None) -> None:
        """Copy block ``index``: weight [rows, cols] in the kernel's dtype (uint8 for int8), and for int8
        its per-row fp16 (scale, bias) [rows, 2]."""
        block = self.blocks[index]
        where = f"QuantKernel.load_block({block.table!r})"
        if tuple(weight.shape) != (block.num_rows, block.num_cols) or weight.dtype != STORED_DTYPE[self.dtype]:
            raise ValueError(f"{where}: expected {STORED_DTYPE[self.dtype]} [{block.num_rows}, {block.num_cols}], got "
                             f"{weight.dtype} {list(weight.shape)}; export the artifact again for this plan")
        if (scale_bias is not None) != (self.dtype == "int8"):
            raise ValueError(f"{where}: int8 blocks (only) need a scale_bias tensor")
        data, qparams = self.tbe.split_embedding_weights()[index]
        data.copy_(weight.contiguous().view(torch.uint8))
        if scale_bias is not None:
            if tuple(scale_bias.shape) != (block.num_rows, 2) or scale_bias.dtype != torch.float16:
                raise ValueError(f"{where}: expected scale_bias float16 [{block.num_rows}, 2], got "
                                 f"{scale_bias.dtype} {list(scale_bias.shape)}")
            qparams.copy_(scale_bias.contiguous().view(torch.uint8))

    def memory_bytes(self) -> int:
        """Bytes of the kernel's weight buffers (rows, int8 scales and biases, alignment padding)."""
        return sum(t.numel() * t.element_size() for t in (self.tbe.weights_dev, self.tbe.weights_host, self.tbe.weights_uvm))
