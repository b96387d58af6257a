"""Input dist: ship each slot's ids to the rank holding its shard and hand every local
kernel its ids in FBGEMM's layout.

Two all-to-alls per step and collection: lengths of every slot, then ids (per-id weights
travel in the same message, bit-packed next to the ids). Pooled kernels see their slots
feature-major, each with the bags of all ranks in rank order (B_global = sum of batch
sizes). Sequence kernels need no bag order: they see one "feature" per (source rank,
slot), one bag each, so their output rows come out in exactly the order they go back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.runtime.comm import all_to_all
from embshard.runtime.features import Batch, Regrouper, SendBuffers, SlotCutter
from embshard.runtime.routing import Routing


@dataclass(frozen=True)
class KernelInput:
    indices: Tensor
    offsets: Tensor
    per_sample_weights: Tensor | None


@dataclass(frozen=True)
class Received:
    inputs: tuple[KernelInput, ...]  # one per local sharded kernel
    send: SendBuffers
    sent_ids_per_slot: Tensor  # [Q] ids this rank sent in each slot
    ids_per_source_kernel: tuple[tuple[int, ...], ...]  # sequence: [source rank][kernel] ids received


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

    def __call__(self, batch: Batch, batch_sizes: tuple[int, ...]) -> Received:
        r, W = self.routing, self.routing.world_size
        send = self.cutter.cut(batch)
        B = batch.batch_size
        lengths = all_to_all(send.lengths_QB, [self.num_local_slots * b for b in batch_sizes],
                             [n * B for n in self.slots_per_rank], self.pg)
        sent_per_slot = send.lengths_QB.view(-1, B).sum(1) if B else send.lengths_QB.new_zeros(len(r.send_slots))
        in_splits = torch.zeros(W, dtype=torch.int64, device=self.device).index_add_(0, self.dest_of_slot, sent_per_slot).tolist()
        out_splits = _split_sums(lengths, [self.num_local_slots * b for b in batch_sizes])
        if send.weights is not None:
            packed = torch.stack([send.values, send.weights.view(torch.int32).to(torch.int64)], dim=1)
            received = all_to_all(packed, out_splits, in_splits, self.pg)
            values, weights = received[:, 0].contiguous(), received[:, 1].to(torch.int32).view(torch.float32)
        else:
            values, weights = all_to_all(send.values, out_splits, in_splits, self.pg), None
        if r.pooled:
            inputs = self._pooled_inputs(lengths, values, weights, batch_sizes)
            return Received(inputs, send, sent_per_slot, ())
        inputs, per_source_kernel = self._sequence_inputs(lengths, values, batch_sizes)
        return Received(inputs, send, sent_per_slot, per_source_kernel)

    def _pooled_inputs(self, lengths: Tensor, values: Tensor, weights: Tensor | None, batch_sizes: tuple[int, ...]) -> tuple[KernelInput, ...]:
        kernels = self.routing.kernels
        if not kernels:
            return ()
        lengths, values, weights = self.regrouper.regroup(lengths, values, weights, batch_sizes)
        offsets = _cumsum0(lengths)
        if len(kernels) == 1:
            return (KernelInput(values, offsets, weights),)
        bags = sum(batch_sizes)
        cuts = offsets[torch.tensor([k.slot_start * bags for k in kernels] + [kernels[-1].slot_end * bags])].tolist()
        return tuple(
            KernelInput(values[lo:hi], offsets[k.slot_start * bags: k.slot_end * bags + 1] - lo,
                        None if weights is None else weights[lo:hi])
            for k, lo, hi in zip(kernels, cuts[:-1], cuts[1:])
        )

    def _sequence_inputs(self, lengths: Tensor, values: Tensor, batch_sizes: tuple[int, ...]):
        kernels, S = self.routing.kernels, self.num_local_slots
        if not kernels:
            return (), tuple(() for _ in batch_sizes)
        # Bag index where each (source rank, slot) segment starts: source r's block holds S x B_r bags.
        starts = [sum(S * b for b in batch_sizes[:r]) + s * batch_sizes[r] for r in range(len(batch_sizes)) for s in range(S)]
        seg_offsets = _cumsum0(lengths)[torch.tensor(starts + [S * sum(batch_sizes)], device=self.device)]
        if len(kernels) == 1:
            per_source = seg_offsets[torch.arange(0, len(starts) + 1, S, device=self.device)].diff().tolist()
            return (KernelInput(values, seg_offsets, None),), tuple((n,) for n in per_source)
        cuts = seg_offsets.tolist()
        inputs, per_source_kernel = [], [[0] * len(kernels) for _ in batch_sizes]
        for j, k in enumerate(kernels):
            pieces, counts = [], []
            for src in range(len(batch_sizes)):
                lo, hi = cuts[src * S + k.slot_start], cuts[src * S + k.slot_end]
                pieces.append(values[lo:hi])
                counts.extend(b - a for a, b in zip(cuts[src * S + k.slot_start: src * S + k.slot_end],
                                                     cuts[src * S + k.slot_start + 1: src * S + k.slot_end + 1]))
                per_source_kernel[src][j] = hi - lo
            inputs.append(KernelInput(torch.cat(pieces), _cumsum0(torch.tensor(counts, dtype=torch.int64, device=self.device)), None))
        return tuple(inputs), tuple(tuple(p) for p in per_source_kernel)
