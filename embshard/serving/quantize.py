"""Weights of a table block in a serving dtype: fp32, fp16, or row-wise int8 (FBGEMM's format).

    block = quantize(weight_fp32, "int8")     # QuantizedBlock: uint8 [n, d] + fp16 (scale, bias) [n, 2]
    rows = block.dequantize()                 # fp32 [n, d], what the serving kernel computes with

Row-wise int8 is FBGEMM's ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` at 8 bits: per row,
scale = (max - min) / 255 and bias = min, both fp16, q = round((x - bias) / scale); a row
dequantizes to q * scale + bias, within scale / 2 of the fp32 row (plus fp16 rounding of
scale and bias). Each block is quantized on its own rows and columns, so a column shard
carries its own scales. FBGEMM's op refuses an odd number of columns; those blocks get the
same bytes from torch (`rowwise_int8`, FBGEMM's reference formula, checked bit for bit
against the op in tests/serving/test_quantize.py).
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
    if weight.shape[1] % 2:  # FBGEMM's op needs the fp16 scale 2-byte aligned in its fused row
        return QuantizedBlock(dtype, *rowwise_int8(weight))
    fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(weight, 8)  # [rows, cols + 4] uint8
    codes, scale_bias = fused[:, :-SCALE_BIAS_BYTES], fused[:, -SCALE_BIAS_BYTES:]
    return QuantizedBlock(dtype, codes.contiguous(), scale_bias.contiguous().view(torch.float16))


def rowwise_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(uint8 codes [rows, cols], fp16 (scale, bias) [rows, 2]) of an fp32 block [rows >= 1, cols >= 1],
    as FBGEMM's FloatOrHalfToFusedNBitRowwiseQuantizedSBHalfRef computes them at 8 bits: the bias is
    the row's min rounded to fp16, scale = fp16((max - bias) / 255) (1 where that is 0 or its
    reciprocal overflows), q = clamp(round_half_even((x - bias) * (1 / scale)), 0, 255)."""
    bias_fp16 = weight.min(1, keepdim=True).values.half()
    bias = bias_fp16.float()
    span = weight.max(1, keepdim=True).values - bias
    scale = torch.where(span == 0, 1.0, span / 255).half().float()
    scale = torch.where(scale == 0, 1.0, scale)
    inverse = 1.0 / scale
    overflow = torch.isinf(inverse)
    scale, inverse = torch.where(overflow, 1.0, scale), torch.where(overflow, 1.0, inverse)
    codes = torch.round((weight - bias) * inverse).clamp(0, 255).to(torch.uint8)
    return codes, torch.cat([scale.half(), bias_fp16], dim=1)
