"""Input dist: ship each slot's ids to the rank holding its shard and hand every local
kernel its ids in FBGEMM's layout.

Per step and collection, after the header (batch sizes and a failure flag, see
comm.py): two all-to-alls, lengths of every slot, then ids (per-id weights travel in the
same message, bit-packed next to the ids). Pooled kernels see their slots
feature-major, each with the bags of all ranks in rank order (B_global = sum of batch
sizes). Sequence kernels see each slot's ids (one per bag) grouped by source rank, and
give their rows back grouped by source rank (see lookup.py), ready for the way back.

`InputDist.local` serves forward-only data-parallel replicas: each rank looks its own
samples up in its replica, so the kernels get this rank's ids alone and nothing travels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.runtime.comm import Header, all_to_all
from embshard.runtime.features import Batch, Regrouper, SendBuffers, SlotCutter
from embshard.runtime.hot_rows import SplitBatch
from embshard.runtime.routing import Routing


@dataclass(frozen=True)
class KernelInput:
    indices: Tensor
    offsets: Tensor | None = None  # pooled: bag offsets
    per_sample_weights: Tensor | None = None
    ids_per_feature_rank: list[list[int]] | None = None  # sequence: ids per (slot, source rank)


@dataclass(frozen=True)
class Received:
    inputs: tuple[KernelInput, ...]  # one per local sharded kernel
    send: SendBuffers | None  # None: local lookups (nothing sent)
    sent_ids_per_slot: Tensor | None  # [Q] ids this rank sent in each slot
    floats_per_source_kernel: tuple[tuple[int, ...], ...]  # sequence: [source rank][kernel] output floats


@dataclass(frozen=True)
class Distributed:
    """One collection's input dist of one batch: what its lookups and output dist start from."""
    batch: Batch
    header: Header  # every rank's batch size, or failure alone (read: `batch_sizes`)
    received: Received | None  # None: no sharded table
    replicated: list[Received]  # per replica group (one per data-parallel mode); [] without data-parallel tables
    split: SplitBatch | None = None  # with hot-row replication: how to join the outputs back

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """Every rank's batch size (None: a collection whose look-ups are all local agrees on failure alone): waits
        for the header if it is still in flight; ValueError on every rank if a rank's batch was bad."""
        return self.header.result()


def _cumsum0(x: Tensor) -> Tensor:
    return torch.ops.fbgemm.asynchronous_complete_cumsum(x)


def _split_sums(values: Tensor, splits: list[int]) -> list[int]:
    """Sums of consecutive chunks of ``values`` with the given sizes."""
    ends = torch.tensor([0, *splits], device=values.device).cumsum(0)
    return _cumsum0(values)[ends].diff().tolist()


class InputDist:
    def __init__(self, routing: Routing, pg: dist.ProcessGroup, device: torch.device) -> None:
        self.routing, self.pg, self.device = routing, pg, device
        self.cutter = SlotCutter(routing, device)
        self.slots_per_rank = [len(s) for s in routing.slots_by_rank]
        self.num_local_slots = self.slots_per_rank[routing.rank]
        self.regrouper = Regrouper(self.num_local_slots, device)
        self.dest_of_slot = torch.tensor([s.rank for s in routing.send_slots], dtype=torch.int64, device=device)
        S, W = self.num_local_slots, routing.world_size
        # (source rank, slot) segments in (slot, source rank) order, for sequence kernels
        self.slot_major = torch.tensor([r * S + s for s in range(S) for r in range(W)], dtype=torch.int32, device=device)
        # local lookups: this rank's features in the order of its own slots (None: the batch's order already)
        local = [s.feature for s in routing.slots_by_rank[routing.rank]]
        self.local_features = None if local == list(range(len(routing.features))) else \
            torch.tensor(local, dtype=torch.int32, device=device)

    def __call__(self, batch: Batch, header: Header, pg: dist.ProcessGroup | None = None) -> Received:
        """Over ``pg`` (the same ranks as the routing's group; by default that group); cuts the batch while
        ``header`` (every rank's batch size) is in flight."""
        r, W, pg = self.routing, self.routing.world_size, pg or self.pg
        send = self.cutter.cut(batch)
        B, batch_sizes = batch.batch_size, header.result()
        assert batch_sizes is not None, "input dist needs every rank's batch size"
        lengths = all_to_all(send.lengths_QB, [self.num_local_slots * b for b in batch_sizes],
                             [n * B for n in self.slots_per_rank], pg)
        sent_per_slot = send.lengths_QB.view(-1, B).sum(1) if B else send.lengths_QB.new_zeros(len(r.send_slots))
        in_splits = torch.zeros(W, dtype=torch.int64, device=self.device).index_add_(0, self.dest_of_slot, sent_per_slot).tolist()
        out_splits = _split_sums(lengths, [self.num_local_slots * b for b in batch_sizes])
        if send.weights is not None:
            packed = torch.stack([send.values, send.weights.view(torch.int32).to(torch.int64)], dim=1)
            received = all_to_all(packed, out_splits, in_splits, pg)
            values, weights = received[:, 0].contiguous(), received[:, 1].to(torch.int32).view(torch.float32)
        else:
            values, weights = all_to_all(send.values, out_splits, in_splits, pg), None
        if r.pooled:
            inputs = self._pooled_inputs(lengths, values, weights, batch_sizes)
            return Received(inputs, send, sent_per_slot, ())
        inputs, per_source_kernel = self._sequence_inputs(lengths, values, batch_sizes)
        return Received(inputs, send, sent_per_slot, per_source_kernel)

    def local(self, batch: Batch) -> Received:
        """This rank's own ids for its kernels (as if it were the only rank): no collective."""
        B = batch.batch_size
        if self.local_features is None:  # every feature, in the batch's order: the batch as it is
            lengths, values, weights = batch.lengths_FB, batch.values_N, batch.weights_N
        else:
            lengths, values, weights = torch.ops.fbgemm.permute_2D_sparse_data(
                self.local_features, batch.lengths_FB.view(len(self.routing.features), B), batch.values_N, batch.weights_N)
            lengths = lengths.reshape(-1)
        if self.routing.pooled:
            return Received(self._pooled_inputs(lengths, values, weights, (B,)), None, None, ())
        inputs, per_source_kernel = self._sequence_inputs(lengths, values, (B,))
        return Received(inputs, None, None, per_source_kernel)

    def _pooled_inputs(self, lengths: Tensor, values: Tensor, weights: Tensor | None, batch_sizes: tuple[int, ...]) -> tuple[KernelInput, ...]:
        kernels = self.routing.kernels
        if not kernels:
            return ()
        lengths, values, weights = self.regrouper.regroup(lengths, values, weights, batch_sizes)
        offsets = _cumsum0(lengths)
        if len(kernels) == 1:
            return (KernelInput(values, offsets, weights),)
        bags = sum(batch_sizes)
        cuts = offsets[torch.tensor([k.slot_start * bags for k in kernels] + [kernels[-1].slot_end * bags], device=self.device)].tolist()
        return tuple(
            KernelInput(values[lo:hi], offsets[k.slot_start * bags: k.slot_end * bags + 1] - lo,
                        None if weights is None else weights[lo:hi])
            for k, lo, hi in zip(kernels, cuts[:-1], cuts[1:])
        )

    def _sequence_inputs(self, lengths: Tensor, values: Tensor, batch_sizes: tuple[int, ...]):
        """Kernel inputs slot-major, one id per bag, with the ids of every (slot, source rank)."""
        kernels, S, W = self.routing.kernels, self.num_local_slots, len(batch_sizes)
        if not kernels:
            return (), tuple(() for _ in batch_sizes)
        # Ids per (source rank, slot) segment: source r's block holds S x B_r bags.
        starts = [sum(S * b for b in batch_sizes[:r]) + s * batch_sizes[r] for r in range(W) for s in range(S)]
        counts_RS = _cumsum0(lengths)[torch.tensor(starts + [S * sum(batch_sizes)], device=self.device)].diff()
        if W == 1:  # one source: already slot-major
            counts_SR, values_SR = counts_RS, values
        else:
            counts_SR, values_SR, _ = torch.ops.fbgemm.permute_1D_sparse_data(self.slot_major, counts_RS, values, None)
        counts = counts_SR.view(S, W).tolist()
        inputs, floats_RK, start = [], [[0] * len(kernels) for _ in range(W)], 0
        for j, k in enumerate(kernels):
            per_slot = counts[k.slot_start:k.slot_end]
            n = sum(map(sum, per_slot))
            inputs.append(KernelInput(values_SR[start:start + n], ids_per_feature_rank=per_slot))
            start += n
            for r in range(W):
                floats_RK[r][j] = sum(c[r] * slot.num_cols for c, slot in zip(per_slot, k.slots))
        return tuple(inputs), tuple(tuple(f) for f in floats_RK)
