"""Output dist: embeddings back to the ranks that own the samples, assembled into what
the unsharded collection returns.

Pooled: every kernel's output [B_global, width] is already grouped by source rank, so it
travels as is (one all-to-all); the owner adds each received column block into its place
in [B, sum of dims] (row-wise partial sums add up; column-wise blocks sit side by side)
and divides mean-pooled features by the true bag length. Sequence: rows go back in the
order they came and land at their id's position in the batch (column blocks side by
side). Backward runs the same all-to-all the other way and divides gradients by the
world size (DDP's average; see collection.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.runtime.comm import all_to_all_autograd
from embshard.runtime.features import Batch
from embshard.runtime.input_dist import Received
from embshard.runtime.routing import Routing

QUAD = 4  # every width and column offset is a multiple of 4: place 4-float units


class PooledOutputDist:
    def __init__(self, routing: Routing, pg: dist.ProcessGroup, device: torch.device) -> None:
        self.routing, self.pg, self.device = routing, pg, device
        feats = routing.features
        cols = [torch.arange(feats[s.feature].col_offset + s.col_offset, feats[s.feature].col_offset + s.col_offset + s.num_cols)
                for slots in routing.slots_by_rank for s in slots]
        cols += [torch.arange(feats[s.feature].col_offset, feats[s.feature].col_offset + s.num_cols) for s in routing.dp_slots]
        self.target_cols = (torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)).to(device)
        self.sharded = bool(routing.send_slots)
        self.widths = [routing.slot_width(r) for r in range(routing.world_size)]
        self.dp_widths = [sum(s.num_cols for s in k.slots) for k in routing.dp_kernels]
        self.mean_cols = torch.tensor([f.mean for f in feats for _ in range(f.dim)], device=device)
        self.col_feature = torch.tensor([i for i, f in enumerate(feats) for _ in range(f.dim)], device=device)
        self._index_cache: dict[int, Tensor] = {}

    def _scatter_index(self, batch_size: int) -> Tensor:
        """Flat target in [B, D] of every source element: blocks [B, width] by sending rank, then by replica kernel."""
        if batch_size not in self._index_cache:
            D = self.routing.output_dim
            rows = torch.arange(batch_size, device=self.device).unsqueeze(1) * D
            parts, start = [], 0
            for width in [*self.widths, *self.dp_widths]:
                parts.append((rows + self.target_cols[start:start + width].unsqueeze(0)).flatten())
                start += width
            self._index_cache[batch_size] = torch.cat(parts)
        return self._index_cache[batch_size]

    def __call__(self, kernel_outputs: list[Tensor], dp_outputs: list[Tensor], batch: Batch, batch_sizes: tuple[int, ...]) -> Tensor:
        r, B, D = self.routing, batch.batch_size, self.routing.output_dim
        pieces = [o.reshape(-1) for o in dp_outputs]
        if self.sharded:
            # A rank without shards still joins the backward all-to-all: its empty input needs a gradient.
            local = kernel_outputs[0] if len(kernel_outputs) == 1 else torch.cat(kernel_outputs, dim=1) if kernel_outputs \
                else torch.zeros(sum(batch_sizes), 0, device=self.device, requires_grad=True)
            my_width = local.shape[1]
            pieces.insert(0, all_to_all_autograd(local.reshape(-1), [B * w for w in self.widths],
                                                 [b * my_width for b in batch_sizes], self.pg, grad_scale=1.0 / r.world_size))
        source = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        out = torch.zeros(B * D, device=self.device).index_add(0, self._scatter_index(B), source).view(B, D)
        if bool(self.mean_cols.any()):
            lengths_BF = batch.lengths_FB.view(-1, B).t().clamp(min=1).to(out.dtype)
            scale = torch.where(self.mean_cols, 1.0 / lengths_BF[:, self.col_feature], torch.ones((), device=self.device))
            out = out * scale
        return out


class SequenceOutputDist:
    def __init__(self, routing: Routing, pg: dist.ProcessGroup, device: torch.device) -> None:
        self.routing, self.pg, self.device = routing, pg, device
        feats = routing.features
        send = routing.send_slots
        self.slot_width_q = torch.tensor([s.num_cols // QUAD for s in send], dtype=torch.int64, device=device)
        self.slot_col_q = torch.tensor([s.col_offset // QUAD for s in send], dtype=torch.int64, device=device)
        self.slot_width = torch.tensor([s.num_cols for s in send], dtype=torch.int64, device=device)
        self.dest_of_slot = torch.tensor([s.rank for s in send], dtype=torch.int64, device=device)
        self.uniform_width_q = len({s.num_cols for s in send}) == 1
        self.feature_dim_q = torch.tensor([0 if f.data_parallel else f.dim // QUAD for f in feats], dtype=torch.int64, device=device)

    def __call__(self, kernel_outputs: list[Tensor], received: Received, batch: Batch) -> Tensor:
        """Returns the sharded features' embeddings, flat: feature f's rows [N_f, dim_f] one after another."""
        r, W = self.routing, self.routing.world_size
        per_source = received.floats_per_source_kernel
        if len(kernel_outputs) == 1:
            local = kernel_outputs[0]
        elif kernel_outputs:  # each kernel's output is [source][slot]: interleave the kernels by source
            starts = [[0] * len(kernel_outputs)]
            for counts in per_source:
                starts.append([a + c for a, c in zip(starts[-1], counts)])
            local = torch.cat([kernel_outputs[k][starts[src][k]:starts[src + 1][k]]
                               for src in range(W) for k in range(len(kernel_outputs))])
        else:  # no shards here; still join the backward all-to-all
            local = torch.zeros(0, device=self.device, requires_grad=True)
        in_splits = [sum(counts) for counts in per_source] if kernel_outputs else [0] * W
        sent = received.sent_ids_per_slot
        out_splits = torch.zeros(W, dtype=torch.int64, device=self.device).index_add_(0, self.dest_of_slot, sent * self.slot_width).tolist()
        rows = all_to_all_autograd(local, out_splits, in_splits, self.pg, grad_scale=1.0 / W).view(-1, QUAD)
        index = self._quad_index(received, batch)
        total_q = int((batch.lengths_FB.view(len(r.features), -1).sum(1) * self.feature_dim_q).sum())
        return torch.zeros(total_q, QUAD, device=self.device).index_copy(0, index, rows).view(-1)

    def _quad_index(self, received: Received, batch: Batch) -> Tensor:
        """Target quad of every received quad: rows in send order, each at its id's place."""
        F = len(self.routing.features)
        counts_F = batch.lengths_FB.view(F, -1).sum(1)
        first_id_F = torch.cumsum(counts_F, 0) - counts_F
        quads_F = counts_F * self.feature_dim_q
        first_quad_F = torch.cumsum(quads_F, 0) - quads_F
        feature_N = torch.repeat_interleave(torch.arange(F, device=self.device), counts_F, output_size=batch.values_N.numel())
        # Quad where id i's row starts: its feature's block, then i's position within the feature.
        ids_N = torch.arange(batch.values_N.numel(), device=self.device)
        row_start_N = first_quad_F[feature_N] + (ids_N - first_id_F[feature_N]) * self.feature_dim_q[feature_N]
        slot_R = torch.repeat_interleave(torch.arange(len(self.routing.send_slots), device=self.device), received.sent_ids_per_slot,
                                         output_size=received.send.positions.numel())
        start_R = row_start_N[received.send.positions] + self.slot_col_q[slot_R]
        if self.uniform_width_q:
            width_q = int(self.slot_width_q[0]) if self.slot_width_q.numel() else 0
            return (start_R.unsqueeze(1) + torch.arange(width_q, device=self.device)).reshape(-1)
        width_R = self.slot_width_q[slot_R]
        first_R = torch.cumsum(width_R, 0) - width_R
        total = int(width_R.sum())
        return torch.repeat_interleave(start_R - first_R, width_R, output_size=total) + torch.arange(total, device=self.device)

