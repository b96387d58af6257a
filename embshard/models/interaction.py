"""Feature interactions of DLRM: pairwise dot products, or DCNv2's low-rank cross network.

`DotInteraction` is DLRM's (and TorchRec's InteractionArch): the dense vector and the F
embeddings, all of width D, interact by dot products of every pair; the output is the dense
vector followed by the F+1 choose 2 products. `CrossInteraction` is DLRM-v2's (MLPerf
DLRM-DCNv2): the dense vector and the embeddings are concatenated and go through
TorchRec's `LowRankCrossNet`; the output keeps the concatenated width.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchrec.modules.crossnet import LowRankCrossNet


class DotInteraction(nn.Module):
    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
        # Flat positions of the pairs (i < j) in [V*V]; of each of the V*V positions, 1 + the pair at it or at its
        # mirror (j, i), 0 on the diagonal.
        pairs, mirrors = rows * num_vectors + cols, cols * num_vectors + rows
        symmetric = torch.zeros(num_vectors * num_vectors, dtype=torch.long)
        symmetric[pairs] = symmetric[mirrors] = torch.arange(1, len(pairs) + 1)
        self.register_buffer("pairs", pairs, persistent=False)
        self.register_buffer("symmetric", symmetric, persistent=False)

    @staticmethod
    def output_dim(num_vectors: int, dim: int) -> int:
        return dim + num_vectors * (num_vectors - 1) // 2

    def forward(self, dense_BD: Tensor, embeddings_BFD: Tensor) -> Tensor:
        vectors_BVD = torch.cat([dense_BD.unsqueeze(1), embeddings_BFD], dim=1)
        return torch.cat([dense_BD, _PairProducts.apply(vectors_BVD, self.pairs, self.symmetric)], dim=1)


class _PairProducts(torch.autograd.Function):
    """[B, V, D] -> [B, P]: the dot products of each sample's vector pairs (i < j), from one bmm.

    Backward: the products' gradient G (at the pairs, zero elsewhere) gives dV = G V + G^T V. G + G^T
    is gathered exactly (each pair's gradient at (i, j) and at (j, i), zero on the diagonal), so dV is
    one bmm, where autograd's bmm backward takes two, a scatter of the pairs and a sum (as TorchRec's
    InteractionArch, which also gathers the pairs by an index_put, whose backward is ~2x slower on CPU
    than index_select's)."""

    @staticmethod
    def forward(ctx: Any, vectors_BVD: Tensor, pairs: Tensor, symmetric: Tensor) -> Tensor:
        ctx.save_for_backward(vectors_BVD, symmetric)
        return torch.bmm(vectors_BVD, vectors_BVD.transpose(1, 2)).flatten(1).index_select(1, pairs)

    @staticmethod
    def backward(ctx: Any, grad_BP: Tensor) -> tuple[Tensor, None, None]:
        vectors_BVD, symmetric = ctx.saved_tensors
        B, V, _ = vectors_BVD.shape
        grad_BVV = F.pad(grad_BP, (1, 0)).index_select(1, symmetric).view(B, V, V)
        return torch.bmm(grad_BVV, vectors_BVD), None, None


class CrossInteraction(nn.Module):
    """TorchRec's `LowRankCrossNet` (its parameters, so its state-dict keys): layer l is
    x_{l+1} = x_0 * (W (V x_l) + b) + x_l, as TorchRec's, forward and backward by hand (`_LowRankCross`)."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        self.crossnet = LowRankCrossNet(in_features=in_features, num_layers=num_layers, low_rank=low_rank)

    def forward(self, dense_BD: Tensor, embeddings_BE: Tensor) -> Tensor:
        net = self.crossnet
        params = [p for layer in zip(net.V_kernels, net.W_kernels, net.bias) for p in layer]
        return _LowRankCross.apply(torch.cat([dense_BD, embeddings_BE], dim=1), *params)


class _LowRankCross(torch.autograd.Function):
    """The cross network on x_0 [B, N], params (V_l [R, N], W_l [N, R], b_l [N]) per layer. Forward: the bias in the
    second matmul (addmm) and x_0 * u + x_l as one addcmul. Backward, with g the gradient of x_{l+1} and
    u = W (V x_l) + b: du = g * x_0, x_0's own gradient accumulates g * u in place (one addcmul_ a layer), and
    x_l's is g + (du W) V in one addmm, in place after the first layer: two elementwise passes a layer where
    autograd's addcmul and accumulation take five (two of them the product by addcmul's value 1). At batch 2048,
    3 layers, rank 64, one thread, forward and backward (interleaved, medians of 15, a loaded 2-core machine):
    42.3 / 41.0 ms against 47.8 / 44.3 by autograd on the same forward, 46.2 / 47.4 for TorchRec's module."""

    @staticmethod
    def forward(ctx: Any, x0_BN: Tensor, *params: Tensor) -> Tensor:
        x_BN, saved = x0_BN, []
        for V_RN, W_NR, b_N in zip(params[0::3], params[1::3], params[2::3]):
            z_BR = F.linear(x_BN, V_RN)
            u_BN = torch.addmm(b_N, z_BR, W_NR.t())
            saved += [x_BN, z_BR, u_BN]
            x_BN = torch.addcmul(x_BN, x0_BN, u_BN)
        ctx.save_for_backward(x0_BN, *params, *saved)
        ctx.num_layers = len(params) // 3
        return x_BN

    @staticmethod
    def backward(ctx: Any, grad_BN: Tensor) -> tuple[Tensor | None, ...]:
        x0_BN, *rest = ctx.saved_tensors
        L = ctx.num_layers
        params, saved = rest[:3 * L], rest[3 * L:]
        grads: list[Tensor | None] = [None] * (3 * L)
        g_BN, g0_BN = grad_BN, None
        du_BN = torch.empty_like(x0_BN)  # each layer's, in one buffer: its products are taken before the next layer's
        for layer in reversed(range(L)):
            V_RN, W_NR, _ = params[3 * layer:3 * layer + 3]
            x_BN, z_BR, u_BN = saved[3 * layer:3 * layer + 3]
            torch.mul(g_BN, x0_BN, out=du_BN)
            g0_BN = g_BN * u_BN if g0_BN is None else g0_BN.addcmul_(g_BN, u_BN)
            dz_BR = du_BN.mm(W_NR)
            grads[3 * layer:3 * layer + 3] = [dz_BR.t().mm(x_BN), du_BN.t().mm(z_BR), du_BN.sum(0)]
            g_BN = torch.addmm(g_BN, dz_BR, V_RN) if g_BN is grad_BN else g_BN.addmm_(dz_BR, V_RN)
        assert g0_BN is not None, "the cross network has at least one layer"
        return (g0_BN.add_(g_BN), *grads)
