"""The ranks' side of serving: rank 0 sends each batch to every rank with tensor collectives.

Every exchange starts with a broadcast of an int64 header from rank 0,
``[op, num_samples, num_ids, feature_index, delay_ms]``, followed by one broadcast of the
batch (predict: the bytes of lengths [B, K], ids feature after feature and dense [B, F],
packed; lookup: the ids).
Each rank takes its share of the samples (``share``: as even as possible, maybe empty), runs
the collective `Predictor.predict` / `lookup` on it, and rank 0 gathers the results (padded
to the largest share). A ValueError of the predictor (raised on every rank alike) skips the
batch on every rank. Ranks other than 0 run `follow` until rank 0 sends STOP; rank 0 sends
a HEARTBEAT when idle so that the others' waits never reach the collective timeout. Nothing
is pickled. ``delay_ms`` (debug) makes the last rank sleep before its part of the batch.
"""

from __future__ import annotations

import math
import os
import resource
import time
from enum import IntEnum

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.serving.batching import BatchKey
from embshard.serving.predictor import Predictor
from embshard.serving.requests import LookupRequest, PredictRequest, merge_predicts


class Op(IntEnum):
    HEARTBEAT = 0
    PREDICT = 1
    LOOKUP = 2
    STOP = 3


HEADER_LEN = 5
MEMORY_KEYS = ("embedding_weights", "dense_weights", "rss")  # reported per rank, in bytes


def share(num_samples: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of ``rank``'s samples: the first ``num_samples % world_size`` ranks take one more."""
    base, extra = divmod(num_samples, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def rank_kjt(features: tuple[str, ...], lengths_BK: torch.Tensor, ids: torch.Tensor, start: int,
             end: int) -> KeyedJaggedTensor:
    """The KJT of samples [start, end) of a batch whose ``ids`` are grouped by feature, sample after sample."""
    totals_K = lengths_BK.sum(0)
    feature_starts_K = torch.cumsum(totals_K, 0) - totals_K
    sample_ends_BK = torch.cumsum(lengths_BK, 0)
    zero_K = torch.zeros_like(totals_K)
    lo_K = feature_starts_K + (sample_ends_BK[start - 1] if start > 0 else zero_K)
    hi_K = feature_starts_K + (sample_ends_BK[end - 1] if end > 0 else zero_K)
    values = torch.cat([ids[lo:hi] for lo, hi in zip(lo_K.tolist(), hi_K.tolist())])
    return KeyedJaggedTensor(keys=list(features), values=values, lengths=lengths_BK[start:end].T.reshape(-1),
                             stride=end - start)


class RankWorker:
    """One rank's end of the exchange; `run_predict`, `run_lookup`, `heartbeat` and `stop` are rank 0's."""

    def __init__(self, predictor: Predictor, pg: dist.ProcessGroup):
        self.predictor = predictor
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.world_size = dist.get_world_size(pg)
        self.features = tuple(predictor.schema.sparse_features)

    def gather_memory(self) -> list[dict[str, int]]:
        """Collective: every rank's resident bytes (weights as the predictor reports them, process RSS)."""
        mine = {**self.predictor.memory_bytes(), "rss": _rss_bytes()}
        local = torch.tensor([mine.get(k, 0) for k in MEMORY_KEYS], dtype=torch.int64)
        everyone = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(everyone, local, group=self.pg)
        return [dict(zip((f"{k}_bytes" for k in MEMORY_KEYS), t.tolist())) for t in everyone]

    # rank 0
    def run_batch(self, key: BatchKey, requests: list) -> list[torch.Tensor]:
        """The results of a batch's requests (scores [B_i] or rows [N_i, dim]), one per request."""
        if key.kind == "predict":
            results = self.run_predict(merge_predicts(requests), key.delay_ms)
        else:
            assert key.kind == "lookup", key
            ids_N = torch.cat([r.ids_N for r in requests])
            results = self.run_lookup(LookupRequest(key.feature, ids_N), key.delay_ms)
        return list(torch.split(results, [r.num_samples for r in requests]))

    def run_predict(self, request: PredictRequest, delay_ms: int = 0) -> torch.Tensor:
        """Scores float32 [B] of the batch's samples."""
        ids = torch.cat(request.ids_by_feature)
        self._send_header(Op.PREDICT, request.num_samples, ids.numel(), 0, delay_ms)
        self._broadcast(_pack(request.lengths_BF, ids, request.dense_BF))
        return self._predict(request.dense_BF, request.lengths_BF, ids, delay_ms)

    def run_lookup(self, request: LookupRequest, delay_ms: int = 0) -> torch.Tensor:
        """Rows float32 [N, dim] of ``request.feature``'s table."""
        self._send_header(Op.LOOKUP, request.num_samples, request.num_samples, self.features.index(request.feature),
                          delay_ms)
        self._broadcast(request.ids_N)
        return self._lookup(request.feature, request.ids_N, delay_ms)

    def heartbeat(self) -> None:
        self._send_header(Op.HEARTBEAT, 0, 0, 0, 0)

    def stop(self) -> None:
        self._send_header(Op.STOP, 0, 0, 0, 0)

    # ranks 1..W-1
    def follow(self) -> None:
        """Serve rank 0's exchanges until it sends STOP."""
        schema = self.predictor.schema
        while True:
            header = torch.empty(HEADER_LEN, dtype=torch.int64)
            dist.broadcast(header, src=0, group=self.pg)
            op, num_samples, num_ids, feature_index, delay_ms = header.tolist()
            if op == Op.STOP:
                return
            try:
                if op == Op.PREDICT:
                    parts = ((num_samples, len(self.features), torch.int64), (num_ids, torch.int64),
                             (num_samples, schema.num_dense, torch.float32))
                    payload = self._broadcast(torch.empty(_packed_bytes(parts), dtype=torch.uint8))
                    lengths_BK, ids, dense_BF = _unpack(payload, parts)
                    self._predict(dense_BF, lengths_BK, ids, delay_ms)
                elif op == Op.LOOKUP:
                    ids = self._broadcast(torch.empty(num_ids, dtype=torch.int64))
                    self._lookup(self.features[feature_index], ids, delay_ms)
                else:
                    assert op == Op.HEARTBEAT, f"unknown op {op} in the header from rank 0"
            except ValueError:  # the predictor refused the batch on every rank (rank 0 reports it): next one
                continue

    # every rank
    def _send_header(self, op: Op, num_samples: int, num_ids: int, feature_index: int, delay_ms: int) -> None:
        assert self.rank == 0, "only rank 0 starts exchanges"
        header = torch.tensor([op, num_samples, num_ids, feature_index, delay_ms], dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.pg)

    def _broadcast(self, buffer: torch.Tensor) -> torch.Tensor:
        """Broadcast from rank 0 (rank 0 passes its tensor, the others an empty buffer of the same shape)."""
        if buffer.numel():
            dist.broadcast(buffer, src=0, group=self.pg)
        return buffer

    def _predict(self, dense_BF: torch.Tensor, lengths_BK: torch.Tensor, ids: torch.Tensor,
                 delay_ms: int) -> torch.Tensor:
        start, end = share(dense_BF.shape[0], self.world_size, self.rank)
        self._maybe_delay(delay_ms)
        scores_B = self.predictor.predict(dense_BF[start:end], rank_kjt(self.features, lengths_BK, ids, start, end))
        return self._gather(scores_B.float(), dense_BF.shape[0])

    def _lookup(self, feature: str, ids_N: torch.Tensor, delay_ms: int) -> torch.Tensor:
        start, end = share(ids_N.numel(), self.world_size, self.rank)
        self._maybe_delay(delay_ms)
        rows_ND = self.predictor.lookup(feature, ids_N[start:end])
        return self._gather(rows_ND.float(), ids_N.numel())

    def _maybe_delay(self, delay_ms: int) -> None:
        if delay_ms and self.rank == self.world_size - 1:
            time.sleep(delay_ms / 1000)

    def _gather(self, mine: torch.Tensor, total: int) -> torch.Tensor:
        """Rank 0: the ranks' results in rank order ([total, ...]); the others: their own."""
        largest = share(total, self.world_size, 0)[1]
        padded = torch.zeros(largest, *mine.shape[1:], dtype=mine.dtype)
        padded[: mine.shape[0]] = mine
        parts = [torch.empty_like(padded) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(padded, parts, dst=0, group=self.pg)
        if self.rank != 0:
            return mine
        sizes = [end - start for start, end in (share(total, self.world_size, r) for r in range(self.world_size))]
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])


def _pack(*tensors: torch.Tensor) -> torch.Tensor:
    """The tensors' bytes, one after the other (one broadcast instead of one per tensor)."""
    return torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def _packed_bytes(parts: tuple[tuple, ...]) -> int:
    return sum(math.prod(p[:-1]) * p[-1].itemsize for p in parts)


def _unpack(payload: torch.Tensor, parts: tuple[tuple, ...]) -> list[torch.Tensor]:
    """The tensors ``_pack`` packed, from their (*shape, dtype); int64 parts first keeps every view aligned."""
    out, offset = [], 0
    for *shape, dtype in parts:
        size = math.prod(shape) * dtype.itemsize
        out.append(payload[offset:offset + size].view(dtype).reshape(shape))
        offset += size
    return out


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak instead
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
