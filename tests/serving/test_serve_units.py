"""The serving front end's pieces in one process: shares and KJT slicing, request parsing, the batcher."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import torch

from embshard.serving.batching import BatchKey, Batcher, BatchRefused, GroupBroken
from embshard.serving.config import BatchingConfig, ServerConfig
from embshard.serving.metrics import ServingMetrics, percentile
from embshard.serving.predictor import ServingSchema, merge_rank_errors
from embshard.serving.requests import RequestError, merge_predicts, parse_lookup, parse_predict
from embshard.serving.workers import rank_kjt, share

SCHEMA = ServingSchema(num_dense=2, sparse_features={"a": 10, "b": 5}, sequence_features=(),
                       embedding_dims={"a": 4, "b": 4}, table_dtypes={"a": "fp32", "b": "int8"}, world_size=2)


LIMITS = ServerConfig(max_request_samples=8, max_bag_ids=4, max_request_ids=6)


def body(samples) -> bytes:
    return json.dumps({"samples": samples}).encode()


@pytest.mark.parametrize("num, world", [(0, 2), (1, 2), (5, 2), (7, 3), (2, 4)])
def test_shares_cover_the_batch_evenly(num, world):
    shares = [share(num, world, r) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == num
    assert all(shares[r][1] == shares[r + 1][0] for r in range(world - 1))
    sizes = [e - s for s, e in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_rank_errors_are_merged_each_once():
    assert merge_rank_errors(["m.json: bad", "m.json: bad", "m.json: bad"]) == "m.json: bad"  # found by every rank
    assert merge_rank_errors([None, "r1: bad", None]) == "rank 1: r1: bad"
    assert merge_rank_errors(["d: bad", "r1: bad", "d: bad"]) == "ranks 0, 2: d: bad; rank 1: r1: bad"
    assert merge_rank_errors(["only: bad"]) == "only: bad"


def test_rank_kjt_slices_every_feature():
    samples = [{"dense": [0, 1], "sparse": {"a": [1, 2], "b": []}},
               {"dense": [2, 3], "sparse": {"a": [], "b": [4]}},
               {"dense": [4, 5], "sparse": {"a": [3], "b": [0, 1, 2]}}]
    merged = merge_predicts([parse_predict(body(samples[:1]), SCHEMA, LIMITS),
                             parse_predict(body(samples[1:]), SCHEMA, LIMITS)])
    ids = torch.cat(merged.ids_by_feature)
    assert ids.tolist() == [1, 2, 3, 4, 0, 1, 2]
    for start, end in ((0, 1), (1, 3), (0, 3)):
        kjt = rank_kjt(("a", "b"), merged.lengths_BF, ids, start, end).to_dict()
        for name in ("a", "b"):
            assert [x.tolist() for x in kjt[name].to_dense()] == [s["sparse"][name] for s in samples[start:end]]
    for start in (0, 2, 3):  # an empty share
        kjt = rank_kjt(("a", "b"), merged.lengths_BF, ids, start, start)
        assert kjt.stride() == 0 and kjt.lengths().numel() == 0 and kjt.values().numel() == 0


def test_parse_predict_and_lookup():
    request = parse_predict(body([{"dense": [1, 2.5], "sparse": {"a": [9], "b": [0, 4]}}]), SCHEMA, LIMITS)
    assert request.dense_BF.tolist() == [[1.0, 2.5]] and request.lengths_BF.tolist() == [[1, 2]]
    assert [t.tolist() for t in request.ids_by_feature] == [[9], [0, 4]]
    lookup = parse_lookup(b'{"feature": "b", "ids": [4, 0]}', SCHEMA, LIMITS)
    assert lookup.feature == "b" and lookup.ids_N.tolist() == [4, 0]
    slow = parse_predict(body([{"dense": [1, 2.5], "sparse": {"a": [9], "b": [0, 4]}}]), SCHEMA, LIMITS, yielding=True)
    assert torch.equal(slow.dense_BF, request.dense_BF) and torch.equal(slow.lengths_BF, request.lengths_BF)
    assert [t.tolist() for t in slow.ids_by_feature] == [[9], [0, 4]]


@pytest.mark.parametrize("raw, status, field", [
    (b"\xff", 400, "body: not valid JSON"),
    (b'{"samples": [], "x": 1}', 400, "x: unknown field"),
    (body([{"dense": [1, True], "sparse": {"a": [], "b": []}}]), 400, "samples[0].dense[1]: expected a finite number"),
    (body([{"dense": [1, 2], "sparse": {"a": [], "b": [5]}}]), 400, "samples[0].sparse.b[0]: id 5 out of range"),
    (body([{"dense": [1, 2], "sparse": {"a": [], "b": []}, "extra": 1}]), 400, "samples[0].extra: unknown field"),
    (body([{"dense": [1, 2], "sparse": []}]), 400, "samples[0].sparse: expected an object"),
    (body([{"dense": [1, 2], "sparse": {"a": [], "b": []}}] * 9), 413, "server.max_request_samples=8"),
    (body([{"dense": [1, 2], "sparse": {"a": [1] * 5, "b": []}}]), 413,
     "samples[0].sparse.a: 5 ids in one bag, more than server.max_bag_ids=4"),
    (body([{"dense": [1, 2], "sparse": {"a": [1] * 4, "b": []}}, {"dense": [1, 2], "sparse": {"a": [1], "b": [1, 2]}}]),
     413, "samples[1].sparse.b: the request holds more than server.max_request_ids=6"),
    (b'{"samples": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "body: JSON nested too deeply"),
])
def test_parse_predict_refuses_with_the_field(raw, status, field):
    for yielding in (False, True):
        with pytest.raises(RequestError) as e:
            parse_predict(raw, SCHEMA, LIMITS, yielding=yielding)
        assert e.value.status == status and field in str(e.value), str(e.value)


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert [percentile(range(1, 101), q) for q in (50, 90, 99, 100)] == [50, 90, 99, 100]


class FakeRanks:
    """run_batch doubling each request's values, optionally slow or failing; heartbeats and stops counted."""

    def __init__(self):
        self.batches, self.heartbeats, self.stops = [], 0, 0
        self.delay_s, self.error = 0.0, None

    def run_batch(self, key, requests):
        assert threading.current_thread() is not threading.main_thread(), "collectives must not run on the event loop"
        self.batches.append(len(requests))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return [2 * r for r in requests]

    def heartbeat(self):
        self.heartbeats += 1

    def stop(self):
        self.stops += 1


def batcher_run(fake: FakeRanks, scenario, **config):
    async def main():
        metrics = ServingMetrics([], lambda: {})
        batcher = Batcher(fake.run_batch, fake.heartbeat, fake.stop, BatchingConfig(**config), 50.0, metrics)
        batcher.start()
        try:
            return await scenario(batcher), metrics
        finally:
            await batcher.close(5.0)
    return asyncio.run(main())


def test_batcher_merges_requests_arriving_together():
    fake = FakeRanks()

    async def scenario(batcher):
        return await asyncio.gather(*(batcher.submit(BatchKey("predict"), torch.tensor([i]), 1, 5.0) for i in range(6)))
    results, metrics = batcher_run(fake, scenario, max_batch_size=4, max_wait_ms=50)
    assert [int(r) for r in results] == [0, 2, 4, 6, 8, 10]
    assert fake.batches == [4, 2] and fake.stops == 1
    assert metrics.snapshot()["batches"]["predict"]["samples"] == 6


def test_batcher_times_out_refuses_and_breaks():
    fake = FakeRanks()

    async def scenario(batcher):
        fake.delay_s = 0.5
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit(BatchKey("predict"), torch.tensor([1]), 1, 0.1)
        await asyncio.sleep(0.6)
        fake.delay_s, fake.error = 0.0, ValueError("refused on every rank")
        with pytest.raises(BatchRefused):
            await batcher.submit(BatchKey("predict"), torch.tensor([1]), 1, 5.0)
        assert batcher.broken is None
        await asyncio.sleep(0.2)  # idle: heartbeats
        fake.error = RuntimeError("Connection closed by peer")
        with pytest.raises(GroupBroken):
            await batcher.submit(BatchKey("lookup", "a"), torch.tensor([1]), 1, 5.0)
        with pytest.raises(GroupBroken, match="Connection closed"):
            await batcher.submit(BatchKey("predict"), torch.tensor([1]), 1, 5.0)
        return batcher.broken
    broken, _ = batcher_run(fake, scenario, max_wait_ms=0)
    assert "Connection closed" in broken and fake.heartbeats >= 1 and fake.stops == 0
