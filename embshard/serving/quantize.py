"""Weights of a table block in a serving dtype: fp32, fp16, or row-wise int8 (FBGEMM's format).

    block = quantize(weight_fp32, "int8")     # QuantizedBlock: uint8 [n, d] + fp16 (scale, bias) [n, 2]
    rows = block.dequantize()                 # fp32 [n, d], what the serving kernel computes with

Row-wise int8 is FBGEMM's ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` at 8 bits: per row,
scale = (max - min) / 255 and bias = min, both fp16, q = round((x - bias) / scale); a row
dequantizes to q * scale + bias, within scale / 2 of the fp32 row (plus fp16 rounding of
scale and bias). Each block is quantized on its own rows and columns, so a column shard
carries its own scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from embshard.runtime.quantized import STORED_DTYPE

SCALE_BIAS_BYTES = 4  # fp16 scale + fp16 bias per int8 row


@dataclass(frozen=True)
class QuantizedBlock:
    dtype: str  # "fp32" | "fp16" | "int8"
    weight: Tensor  # [rows, cols]: float32, float16, or uint8 (int8 codes)
    scale_bias: Tensor | None = None  # int8: float16 [rows, 2] (scale, bias); else None

    def dequantize(self) -> Tensor:
        if self.scale_bias is None:
            return self.weight.float()
        scale_bias = self.scale_bias.float()
        return self.weight.float() * scale_bias[:, :1] + scale_bias[:, 1:]

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scale_bias is None else self.scale_bias.numel() * self.scale_bias.element_size()
        return self.weight.numel() * self.weight.element_size() + extra


def quantize(weight: Tensor, dtype: str) -> QuantizedBlock:
    """A float block [rows, cols] in ``dtype`` (ValueError for an unknown dtype)."""
    if dtype not in STORED_DTYPE:
        raise ValueError(f"quantize: dtype must be one of {sorted(STORED_DTYPE)}, got {dtype!r}")
    weight = weight.detach().float().contiguous()
    if dtype != "int8":
        return QuantizedBlock(dtype, weight.to(STORED_DTYPE[dtype]))
    if weight.shape[0] == 0:
        return QuantizedBlock(dtype, torch.zeros(weight.shape, dtype=torch.uint8), torch.zeros(0, 2, dtype=torch.float16))
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(weight, 8)  # [rows, cols + 4] uint8
    codes, scale_bias = fused[:, :-SCALE_BIAS_BYTES], fused[:, -SCALE_BIAS_BYTES:]
    return QuantizedBlock(dtype, codes.contiguous(), scale_bias.contiguous().view(torch.float16))
