"""KeyedJaggedTensor plumbing by routing: validate a batch, cut it into per-destination
slots (row-wise ids bucketized and re-based to their block), and regroup what arrives
feature-major for the kernels.

Layouts: a batch is F features x B bags (`lengths` [F*B], ids feature-major). What a rank
sends is Q slots x B bags in destination order; what it receives from rank r is S slots x
B_r bags. Everything here is vectorized over features (FBGEMM permute/bucketize ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.runtime.routing import Routing


@dataclass(frozen=True)
class Batch:
    """A validated local batch in the collection's feature order."""

    lengths_FB: Tensor  # int64 [F*B]
    values_N: Tensor  # int64 ids
    weights_N: Tensor | None  # fp32 per-id weights (pooled, weighted collections only)
    batch_size: int


def check_batch(kjt: KeyedJaggedTensor, routing: Routing, weighted: bool, where: str) -> tuple[Batch | None, str | None]:
    """Validate a local batch without collectives: (batch, None) or (None, what is wrong)."""
    expected = routing.feature_names
    keys = list(kjt.keys())
    missing = [k for k in expected if k not in keys]
    unknown = [k for k in keys if k not in expected]
    if missing or unknown:
        return None, (f"{where}: the batch is missing feature(s) {missing} and has unknown feature(s) {unknown}; "
                      f"expected exactly {list(expected)}")
    if len(set(keys)) != len(keys):
        return None, f"{where}: the batch lists a feature twice: {keys}"
    if kjt.variable_stride_per_key():
        return None, f"{where}: variable batch size per feature is not supported; give every feature the same number of bags"
    if keys != list(expected):
        kjt = kjt.permute([keys.index(k) for k in expected])
    num_features, batch_size = len(expected), kjt.stride()
    lengths = kjt.lengths().to(torch.int64)
    values = kjt.values().to(torch.int64)
    if lengths.numel() != num_features * batch_size:
        return None, f"{where}: lengths has {lengths.numel()} entries, expected {num_features} features x {batch_size} bags"
    if lengths.numel() and int(lengths.min()) < 0:
        f = int((lengths < 0).nonzero()[0]) // max(batch_size, 1)
        return None, f"{where}: feature {expected[f]!r} has a negative bag length"
    if int(lengths.sum()) != values.numel():
        return None, f"{where}: lengths sum to {int(lengths.sum())} but there are {values.numel()} ids"
    counts_F = lengths.view(num_features, batch_size).sum(1)
    bounds = torch.tensor([f.num_embeddings for f in routing.features], device=values.device)
    if not _in_bounds(values, counts_F, bounds):
        bad = (values < 0) | (values >= bounds.repeat_interleave(counts_F, output_size=values.numel()))
        i = int(bad.nonzero()[0])
        f = int(torch.searchsorted(counts_F.cumsum(0), torch.tensor(i, device=values.device), right=True))
        feat = routing.features[f]
        return None, (f"{where}: feature {feat.name!r} has id {int(values[i])}, outside table {feat.table!r}'s rows "
                      f"[0, {feat.num_embeddings}); ids must be row indices of the table")
    weights = None
    if weighted:
        weights = kjt.weights_or_none()
        if weights is None:
            return None, f"{where}: the collection is weighted but the batch has no per-id weights; pass KeyedJaggedTensor(weights=...)"
        if weights.numel() != values.numel():
            return None, f"{where}: {weights.numel()} weights for {values.numel()} ids; give one weight per id"
        weights = weights.to(torch.float32)
    return Batch(lengths, values, weights, batch_size), None


def _in_bounds(values: Tensor, counts_F: Tensor, bounds_F: Tensor) -> bool:
    """Every id of feature f (its ``counts_F[f]`` ids, features one after another) in [0, bounds_F[f]): one min-max
    pass per feature (about 10x fewer passes over the ids than comparing each with its feature's bound)."""
    counts = counts_F.tolist()
    nonempty = [f for f, n in enumerate(counts) if n]
    if not nonempty:
        return True
    parts = values.split(counts)
    lo_hi = torch.stack([torch.stack(torch.aminmax(parts[f])) for f in nonempty])
    return bool(((lo_hi[:, 0] >= 0) & (lo_hi[:, 1] < bounds_F[nonempty])).all())


@dataclass(frozen=True)
class SendBuffers:
    lengths_QB: Tensor  # [Q*B], slots in destination order
    values: Tensor
    weights: Tensor | None  # pooled: per-id weights
    positions: Tensor | None  # sequence: index of each sent id in the local batch


class SlotCutter:
    """Cuts a local batch into the slots of every destination (static tables built once)."""

    def __init__(self, routing: Routing, device: torch.device) -> None:
        self.routing = routing
        F = len(routing.features)
        self.permute = torch.tensor([s.bucket * F + s.feature for s in routing.send_slots], dtype=torch.int32, device=device)
        self.bucket_bounds = [torch.tensor(b, dtype=torch.int64, device=device) for b in routing.bucket_bounds]
        self.block_sizes = torch.tensor([f.num_embeddings for f in routing.features], dtype=torch.int64, device=device)

    def cut(self, batch: Batch) -> SendBuffers:
        r = self.routing
        lengths, values, weights = batch.lengths_FB, batch.values_N, batch.weights_N
        positions = None
        if r.has_row_wise:
            lengths, values, weights, _, unbucketize = torch.ops.fbgemm.block_bucketize_sparse_features(
                lengths, values, False, not r.pooled, self.block_sizes, r.num_buckets, weights,
                block_bucketize_pos=self.bucket_bounds)
            if not r.pooled:
                positions = torch.empty_like(unbucketize)
                positions[unbucketize] = torch.arange(unbucketize.numel(), device=unbucketize.device)
        if not r.pooled:
            positions = (positions if positions is not None else torch.arange(values.numel(), device=values.device)).double()
        rows = len(r.features) * (r.num_buckets if r.has_row_wise else 1)  # explicit: a rank's batch may be empty
        lengths_QB, values, extra = torch.ops.fbgemm.permute_2D_sparse_data(
            self.permute, lengths.view(rows, batch.batch_size), values, weights if r.pooled else positions)
        if r.pooled:
            return SendBuffers(lengths_QB.reshape(-1), values, extra, None)
        return SendBuffers(lengths_QB.reshape(-1), values, None, extra.long())


class Regrouper:
    """Reorders received bags [source rank][slot][bag] to [slot][source rank][bag] (pooled kernels); with one
    source (local look-ups) that is the order they are in.

    The permutation depends only on the batch size of every rank; it is cached per tuple.
    """

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.num_slots, self.device = num_slots, device
        self._cache: dict[tuple[int, ...], Tensor] = {}

    def bag_permutation(self, batch_sizes: tuple[int, ...]) -> Tensor:
        if batch_sizes not in self._cache:
            bases = torch.tensor([0, *batch_sizes]).cumsum(0)[:-1] * self.num_slots
            parts = [torch.arange(b) + base + s * b for s in range(self.num_slots) for b, base in zip(batch_sizes, bases.tolist())]
            self._cache[batch_sizes] = torch.cat(parts).to(torch.int32).to(self.device)
        return self._cache[batch_sizes]

    def regroup(self, lengths: Tensor, values: Tensor, weights: Tensor | None, batch_sizes: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor | None]:
        if len(batch_sizes) == 1:  # one source rank: already [slot][bag]
            return lengths, values, weights
        return torch.ops.fbgemm.permute_1D_sparse_data(self.bag_permutation(batch_sizes), lengths, values, weights)
