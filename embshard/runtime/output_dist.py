"""Output dist: embeddings back to the ranks that own the samples, assembled into what
the unsharded collection returns.

Pooled: every kernel's output [B_global, width] is already grouped by source rank, so it
travels as is (one all-to-all; row-wise partial sums are first reduced inside each host,
host_reduce.py); the owner puts each received column block in its place
in [B, sum of dims] (a permutation of runs of columns; row-wise partial sums are added
with index_add) and divides mean-pooled features by the true bag length. Sequence: rows
go back in the order they came and a permutation puts them at their id's position in the
batch (column blocks side by side). Backward runs the same all-to-all the other way and
divides gradients by the world size (DDP's average; see collection.py). Both directions
travel in the plan's wire dtypes (`embshard.runtime.wire`); the sums are added in fp32.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.comms import CommsPrecision
from embshard.runtime.features import Batch
from embshard.runtime.host_reduce import HostReduction, reduced_groups
from embshard.runtime.input_dist import Received
from embshard.runtime.permute import Permute, inverse_permutation, run_unit
from embshard.runtime.routing import Routing
from embshard.runtime.wire import wire_all_to_all


def by_source(kernel_outputs: list[Tensor], floats_per_source_kernel: tuple[tuple[int, ...], ...]) -> Tensor:
    """Sequence kernels' flat outputs, each [source][slot], interleaved into one [source][kernel][slot]."""
    if len(kernel_outputs) == 1:
        return kernel_outputs[0]
    # split (not slices): its backward is one concatenation per kernel, not a zero-filled copy of the
    # kernel's whole output per (source, kernel) piece
    pieces = [out.split([counts[k] for counts in floats_per_source_kernel]) for k, out in enumerate(kernel_outputs)]
    return torch.cat([pieces[k][src] for src in range(len(floats_per_source_kernel)) for k in range(len(kernel_outputs))])


class PooledOutputDist:
    def __init__(self, routing: Routing, pg: dist.ProcessGroup, device: torch.device, comms: CommsPrecision,
                 local_world_size: int | None = None) -> None:
        self.routing, self.pg, self.device, self.comms = routing, pg, device, comms
        feats = routing.features
        local_world_size = local_world_size or routing.world_size  # None: one host, or flat (topology.reduce_in_host off)
        # on one host nothing crosses hosts: summing in the host first would add an all-to-all and save no bytes
        groups = reduced_groups(routing, local_world_size) if local_world_size < routing.world_size else ()
        # row-wise partial sums reduced in each host first (host_reduce.py); else every slot travels as is
        self.host_reduction = HostReduction(routing, groups, local_world_size, pg, device) if groups else None
        source_slots = [self.host_reduction.blocks_from(r) if self.host_reduction else routing.slots_by_rank[r]
                        for r in range(routing.world_size)]
        cols = [torch.arange(feats[s.feature].col_offset + s.col_offset, feats[s.feature].col_offset + s.col_offset + s.num_cols)
                for slots in source_slots for s in slots]
        replica_slots = routing.replicas.slots_by_rank[routing.rank] if routing.replicas else ()
        cols += [torch.arange(feats[s.feature].col_offset, feats[s.feature].col_offset + s.num_cols) for s in replica_slots]
        self.target_cols = (torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)).to(device)
        self.sharded = bool(routing.send_slots)
        self.widths = [sum(s.num_cols for s in slots) for slots in source_slots]  # columns each rank sends here
        self.replica_widths = [sum(s.num_cols for s in replica_slots)] if replica_slots else []
        self.mean_cols = torch.tensor([f.mean for f in feats for _ in range(f.dim)], device=device)
        self.any_mean = any(f.mean for f in feats)
        self.col_feature = torch.tensor([i for i, f in enumerate(feats) for _ in range(f.dim)], device=device)
        # Without row-wise partial sums every output column comes from exactly one source column,
        # and runs of `unit` columns move together.
        self.one_to_one = torch.equal(self.target_cols.sort().values, torch.arange(routing.output_dim, device=device))
        slots = [*routing.send_slots, *replica_slots]
        self.unit = run_unit(routing.output_dim, *self.widths, *self.replica_widths,
                          *(s.num_cols for s in slots), *(feats[s.feature].col_offset + s.col_offset for s in slots))
        self._index_cache: dict[int, tuple[Tensor, Tensor] | None] = {}

    def _scatter_index(self, batch_size: int) -> tuple[Tensor, Tensor] | None:
        """Target in [B, D] of every source run of `unit` floats (blocks [B, width] by sending rank, then
        the replicas' block), and its inverse when the map is one-to-one; None where every run is in its place
        already (the source is the output: data-parallel tables alone, all looked up here)."""
        if batch_size not in self._index_cache:
            u = self.unit
            rows = torch.arange(batch_size, device=self.device).unsqueeze(1) * (self.routing.output_dim // u)
            cols = self.target_cols[::u] // u
            parts, start = [], 0
            for width in [*self.widths, *self.replica_widths]:
                parts.append((rows + cols[start:start + width // u].unsqueeze(0)).flatten())
                start += width // u
            index = torch.cat(parts)
            in_place = self.one_to_one and torch.equal(index, torch.arange(index.numel(), device=self.device))
            self._index_cache[batch_size] = None if in_place else (index, inverse_permutation(index) if self.one_to_one else index)
        return self._index_cache[batch_size]

    def exchange(self, kernel_outputs: list[Tensor], batch: Batch, batch_sizes: tuple[int, ...]) -> Tensor:
        """The all-to-all: this rank's kernels' rows of every rank's samples go to their ranks; what comes back
        (flat, blocks [B, width] by sending rank) goes to `assemble`. Only for a collection with sharded tables."""
        assert self.sharded, "exchange: nothing is sharded, there is nothing to send"
        r, B = self.routing, batch.batch_size
        # A rank without shards still joins the backward all-to-all: its empty input needs a gradient.
        local = kernel_outputs[0] if len(kernel_outputs) == 1 else torch.cat(kernel_outputs, dim=1) if kernel_outputs \
            else torch.zeros(sum(batch_sizes), 0, device=self.device, requires_grad=True)
        if self.host_reduction:
            message, in_splits = self.host_reduction(local, batch_sizes)
        else:
            message, in_splits = local.reshape(-1), [b * local.shape[1] for b in batch_sizes]
        return wire_all_to_all(message, [B * w for w in self.widths], in_splits, self.pg, self.comms,
                               grad_scale=1.0 / r.world_size)

    def assemble(self, received: Tensor | None, replica_rows: Tensor | None, batch: Batch) -> Tensor:
        """[B, D]: the rows `exchange` received and replica_rows ([B, width], this rank's rows of the data-parallel
        features, see comm.local_part) put in their columns."""
        r, B, D = self.routing, batch.batch_size, self.routing.output_dim
        pieces = [p.reshape(-1) for p in (received, replica_rows) if p is not None]
        source = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        scatter = self._scatter_index(B)
        if scatter is None:
            out = source.view(B, D)
        elif self.one_to_one:
            index, inverse = scatter
            out = Permute.apply(source.view(-1, self.unit), inverse, index).view(B, D)
        else:  # row-wise partial sums add up
            out = torch.zeros(B * D // self.unit, self.unit, device=self.device).index_add(
                0, scatter[0], source.view(-1, self.unit)).view(B, D)
        if self.any_mean:
            lengths_BF = batch.lengths_FB.view(len(r.features), B).t().clamp(min=1).to(out.dtype)
            scale = torch.where(self.mean_cols, 1.0 / lengths_BF[:, self.col_feature], torch.ones((), device=self.device))
            out = out * scale
        return out


class SequenceOutputDist:
    def __init__(self, routing: Routing, pg: dist.ProcessGroup, device: torch.device, comms: CommsPrecision) -> None:
        self.routing, self.pg, self.device, self.comms = routing, pg, device, comms
        feats = routing.features
        send = routing.send_slots
        # Rows move in runs of `unit` floats: a whole row unless column shards cut it.
        self.unit = u = run_unit(*(s.num_cols for s in send), *(s.col_offset for s in send),
                              *(f.dim for f in feats if not f.data_parallel))
        self.slot_width_u = torch.tensor([s.num_cols // u for s in send], dtype=torch.int64, device=device)
        self.slot_col_u = torch.tensor([s.col_offset // u for s in send], dtype=torch.int64, device=device)
        self.slot_width = torch.tensor([s.num_cols for s in send], dtype=torch.int64, device=device)
        self.dest_of_slot = torch.tensor([s.rank for s in send], dtype=torch.int64, device=device)
        self.uniform_width = len({s.num_cols for s in send}) == 1
        self.feature_dim_u = torch.tensor([0 if f.data_parallel else f.dim // u for f in feats], dtype=torch.int64, device=device)

    def __call__(self, kernel_outputs: list[Tensor], received: Received, batch: Batch) -> Tensor:
        """Returns the sharded features' embeddings, flat: feature f's rows [N_f, dim_f] one after another."""
        W = self.routing.world_size
        per_source = received.floats_per_source_kernel
        if kernel_outputs:
            local = by_source(kernel_outputs, per_source)
        else:  # no shards here; still join the backward all-to-all
            local = torch.zeros(0, device=self.device, requires_grad=True)
        in_splits = [sum(counts) for counts in per_source] if kernel_outputs else [0] * W
        sent = received.sent_ids_per_slot
        out_splits = torch.zeros(W, dtype=torch.int64, device=self.device).index_add_(0, self.dest_of_slot, sent * self.slot_width).tolist()
        rows = wire_all_to_all(local, out_splits, in_splits, self.pg, self.comms, grad_scale=1.0 / W).view(-1, self.unit)
        # Every piece of the sharded features' rows arrives exactly once: a permutation puts them in place.
        index = self._target_index(received, batch)
        return Permute.apply(rows, inverse_permutation(index), index).view(-1)

    def _target_index(self, received: Received, batch: Batch) -> Tensor:
        """Target piece of every received piece: rows in send order, each at its id's place."""
        F = len(self.routing.features)
        counts_F = batch.lengths_FB.view(F, batch.batch_size).sum(1)
        first_id_F = torch.cumsum(counts_F, 0) - counts_F
        pieces_F = counts_F * self.feature_dim_u
        first_piece_F = torch.cumsum(pieces_F, 0) - pieces_F
        feature_N = torch.repeat_interleave(torch.arange(F, device=self.device), counts_F, output_size=batch.values_N.numel())
        # Piece where id i's row starts: its feature's block, then i's position within the feature.
        ids_N = torch.arange(batch.values_N.numel(), device=self.device)
        row_start_N = first_piece_F[feature_N] + (ids_N - first_id_F[feature_N]) * self.feature_dim_u[feature_N]
        slot_R = torch.repeat_interleave(torch.arange(len(self.routing.send_slots), device=self.device), received.sent_ids_per_slot,
                                         output_size=received.send.positions.numel())
        start_R = row_start_N[received.send.positions] + self.slot_col_u[slot_R]
        if self.uniform_width:
            width_u = int(self.slot_width_u[0]) if self.slot_width_u.numel() else 0
            return (start_R.unsqueeze(1) + torch.arange(width_u, device=self.device)).reshape(-1)
        width_R = self.slot_width_u[slot_R]
        first_R = torch.cumsum(width_R, 0) - width_R
        total = int(width_R.sum())
        return torch.repeat_interleave(start_R - first_R, width_R, output_size=total) + torch.arange(total, device=self.device)

