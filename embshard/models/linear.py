"""`Linear`: nn.Linear (same parameters, same state-dict keys) whose input gradient pads the weight's input columns.

The input gradient grad_output @ weight ([B, out] x [out, in]) is an sgemm whose output width is ``in``; MKL runs it
~1.5x slower when ``in`` is not a multiple of 8: DLRM's top MLP takes 367 inputs (16 + 27 choose 2), at batch 2048
9.3 ms against 6.0 ms on the weight with zero columns appended to 368 (AMD EPYC, one thread; 351: 8.9 vs 5.6, 300:
7.1 vs 5.4, 500: 10.1 vs 7.6; multiples of 8 gain nothing). The product on the padded weight, cut back to ``in``
columns (a view), sums the same products: bitwise the same gradient in every shape measured. The weight and bias
gradients are autograd's (grad^T x, the sum over the batch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PAD_COLUMNS = 8


class Linear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        if self.in_features % PAD_COLUMNS == 0 or x.dim() != 2 or not x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        return _PaddedInputGrad.apply(x, self.weight, self.bias)


class _PaddedInputGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_BI: Tensor, weight_OI: Tensor, bias_O: Tensor | None) -> Tensor:
        ctx.save_for_backward(x_BI, weight_OI)
        ctx.has_bias = bias_O is not None
        return F.linear(x_BI, weight_OI, bias_O)

    @staticmethod
    def backward(ctx: Any, grad_BO: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x_BI, weight_OI = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            O, I = weight_OI.shape
            padded_OP = weight_OI.new_zeros(O, -(-I // PAD_COLUMNS) * PAD_COLUMNS)
            padded_OP[:, :I] = weight_OI
            grad_x = grad_BO.mm(padded_OP)[:, :I]
        if ctx.needs_input_grad[1]:
            grad_weight = grad_BO.t().mm(x_BI)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_BO.sum(0)
        return grad_x, grad_weight, grad_bias
