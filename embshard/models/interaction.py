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

# The cross network's block of samples (`_LowRankCross`): about this many bytes of x_0.
CHUNK_BYTES = 1 << 20


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
    x_{l+1} = x_0 * (W (V x_l) + b) + x_l, as TorchRec's, forward and backward by hand (`_LowRankCross`), a block of
    about ``chunk_bytes`` of samples at a time."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        super().__init__()
        self.crossnet = LowRankCrossNet(in_features=in_features, num_layers=num_layers, low_rank=low_rank)
        self.chunk_bytes = chunk_bytes

    def forward(self, dense_BD: Tensor, embeddings_BE: Tensor) -> Tensor:
        net = self.crossnet
        params = [p for layer in zip(net.V_kernels, net.W_kernels, net.bias) for p in layer]
        x0_BN = torch.cat([dense_BD, embeddings_BE], dim=1)
        chunk_rows = self.chunk_bytes // (x0_BN.shape[1] * x0_BN.element_size())  # clamped to [1, B] by _LowRankCross
        return _LowRankCross.apply(chunk_rows, x0_BN, *params)


class _LowRankCross(torch.autograd.Function):
    """The cross network on x_0 [B, N], params (V_l [R, N], W_l [N, R], b_l [N]) per layer, ``chunk_rows`` samples
    at a time through every layer (forward and backward), so that a block's elementwise passes find it in cache
    rather than stream [B, N] arrays through memory; the weight gradients accumulate over the blocks. Forward: the
    bias in the second matmul (addmm) and x_0 * u + x_l as one addcmul. Backward, with g the gradient of x_{l+1}
    and u = W (V x_l) + b: du = g * x_0, x_0's own gradient accumulates g * u in place (one addcmul_ a layer), and
    x_l's is g + (du W) V in one addmm, in place after the first layer: two elementwise passes a layer where
    autograd's addcmul and accumulation take five (two of them the product by addcmul's value 1). At batch 2048,
    3 layers, rank 64, one thread, forward and backward (interleaved, medians of 15, a loaded 2-core machine):
    42.3 / 41.0 ms against 47.8 / 44.3 by autograd on the same forward, 46.2 / 47.4 for TorchRec's module. By blocks
    of 512 samples (N = 432: 0.9 MB), medians of 15 interleaved: 37.7 ms against 40.2 whole (256: 38.5, 1024: 38.1).
    In DLRM-v2's training step (benchmarks/train_throughput.py's model, 2 ranks on 2 cores, 16 rounds of 8 steps,
    blocks of 1 MiB against one block, interleaved): 117.3 against 123.3 ms a step (pipelined: 120.4 / 123.9), the
    CPU time of both ranks 210.7 against 220.9 ms."""

    @staticmethod
    def forward(ctx: Any, chunk_rows: int, x0_BN: Tensor, *params: Tensor) -> Tensor:
        x0_BN = x0_BN.contiguous()
        (B, N), L, R = x0_BN.shape, len(params) // 3, params[0].shape[0]
        assert L > 0, "the cross network has at least one layer"
        chunk_rows = max(1, min(chunk_rows, B))  # at least one sample; backward's block buffers no larger than the batch
        xs = [x0_BN, *(torch.empty_like(x0_BN) for _ in range(L))]  # x_0 .. x_L (the output)
        zs = [x0_BN.new_empty(B, R) for _ in range(L)]
        us = [torch.empty_like(x0_BN) for _ in range(L)]
        for r0 in range(0, B, chunk_rows):
            rows = slice(r0, r0 + chunk_rows)
            for layer, (V_RN, W_NR, b_N) in enumerate(zip(params[0::3], params[1::3], params[2::3])):
                torch.mm(xs[layer][rows], V_RN.t(), out=zs[layer][rows])
                torch.addmm(b_N, zs[layer][rows], W_NR.t(), out=us[layer][rows])
                torch.addcmul(xs[layer][rows], x0_BN[rows], us[layer][rows], out=xs[layer + 1][rows])
        ctx.save_for_backward(*params, *xs[:L], *zs, *us)
        ctx.num_layers, ctx.chunk_rows = L, chunk_rows
        return xs[L]

    @staticmethod
    def backward(ctx: Any, grad_BN: Tensor) -> tuple[Tensor | None, ...]:
        L, C = ctx.num_layers, ctx.chunk_rows
        saved = ctx.saved_tensors
        params, xs, zs, us = saved[:3 * L], saved[3 * L:4 * L], saved[4 * L:5 * L], saved[5 * L:]
        grad_BN = grad_BN.contiguous()
        x0_BN = xs[0]
        grads = [torch.zeros_like(p) for p in params]  # accumulated over the blocks
        g0_BN = torch.empty_like(x0_BN)
        du_CN, g_CN = x0_BN.new_empty(C, x0_BN.shape[1]), x0_BN.new_empty(C, x0_BN.shape[1])
        for r0 in range(0, x0_BN.shape[0], C):
            rows = slice(r0, r0 + C)
            g, g0, x0 = grad_BN[rows], g0_BN[rows], x0_BN[rows]
            du, g_buffer = du_CN[:g.shape[0]], g_CN[:g.shape[0]]
            for layer in reversed(range(L)):
                V_RN, W_NR, _ = params[3 * layer:3 * layer + 3]
                dV_RN, dW_NR, db_N = grads[3 * layer:3 * layer + 3]
                torch.mul(g, x0, out=du)
                if layer == L - 1:
                    torch.mul(g, us[layer][rows], out=g0)
                else:
                    g0.addcmul_(g, us[layer][rows])
                dz = du.mm(W_NR)
                dV_RN.addmm_(dz.t(), xs[layer][rows])
                dW_NR.addmm_(du.t(), zs[layer][rows])
                db_N.add_(du.sum(0))
                g = torch.addmm(g, dz, V_RN, out=g_buffer) if layer == L - 1 else g.addmm_(dz, V_RN)
            g0.add_(g)
        return (None, g0_BN, *grads)
