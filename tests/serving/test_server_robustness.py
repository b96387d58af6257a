"""The HTTP front end in this process (a real socket, the real batcher, fake ranks) against hostile input.

Deeply nested JSON is a 400 naming the problem and a bug a JSON 500, both counted in /metrics;
ids per bag / per request and the body size past their limits are 413 naming the key;
/healthz answers while a large body is parsed; a client that stalls in its headers or its
body is cut off at ``server.read_timeout_ms`` while the others are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp
import torch

from embshard.serving.batching import Batcher
from embshard.serving.client import get_json, post_json
from embshard.serving.config import BatchingConfig, ServerConfig
from embshard.serving.metrics import ServingMetrics
from embshard.serving.predictor import ServingSchema
from embshard.serving.server import build_app, start_site

SCHEMA = ServingSchema(num_dense=2, sparse_features={"a": 10, "b": 5}, sequence_features=(),
                       embedding_dims={"a": 4, "b": 4}, table_dtypes={"a": "fp32", "b": "fp32"}, world_size=1)
SAMPLE = {"dense": [1.0, 2.0], "sparse": {"a": [1, 2], "b": [3]}}


def zero_scores(key, requests):
    return [torch.zeros(r.num_samples) for r in requests]


@contextlib.asynccontextmanager
async def running(config: ServerConfig, run_batch=zero_scores):
    """The server on a free port with ``run_batch`` as the ranks; yields (url, port, session)."""
    metrics = ServingMetrics([], lambda: {})
    batcher = Batcher(run_batch, lambda: None, lambda: None, BatchingConfig(max_wait_ms=0), 1000.0, metrics)
    batcher.start()
    runner, port = await start_site(build_app(SCHEMA, batcher, metrics, config), config)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            yield f"http://127.0.0.1:{port}", port, session
    finally:
        await runner.cleanup()
        await batcher.close(1.0)


def test_deep_nesting_is_400_and_every_status_is_counted():
    def buggy(key, requests):  # ranks answering something the handler cannot serialise: a bug, a 500
        return [object() for _ in requests]

    async def go():
        async with running(ServerConfig(port=0), buggy) as (url, _, session):
            nested = await post_json(session, f"{url}/predict", b'{"samples": ' + b"[" * 5000 + b"]" * 5000 + b"}")
            bug = await post_json(session, f"{url}/predict", {"samples": [SAMPLE]})
            return nested, bug, await get_json(session, f"{url}/metrics")
    (status, answer), (bug_status, bug), (_, metrics) = asyncio.run(go())
    assert status == 400 and answer["error"].startswith("body: JSON nested too deeply"), (status, answer)
    assert bug_status == 500 and "internal error (AttributeError)" in bug["error"], (bug_status, bug)
    assert metrics["requests"]["/predict"] == {"400": 1, "500": 1}, metrics["requests"]


def test_limits_are_413_naming_the_key():
    config = ServerConfig(port=0, max_bag_ids=3, max_request_ids=5, max_body_bytes=4096)

    async def go():
        async with running(config) as (url, _, session):
            cases = [{"samples": [{**SAMPLE, "sparse": {"a": [1] * 4, "b": []}}]},
                     {"samples": [SAMPLE, SAMPLE]},  # 6 ids
                     b'{"samples": [' + b" " * 5000 + b"]}"]
            return [await post_json(session, f"{url}/predict", body) for body in cases], \
                await post_json(session, f"{url}/predict", {"samples": [SAMPLE]})
    answers, ok = asyncio.run(go())
    wanted = ["samples[0].sparse.a: 4 ids in one bag, more than server.max_bag_ids=3",
              "samples[1].sparse.b: the request holds more than server.max_request_ids=5",
              "body: larger than server.max_body_bytes=4096"]
    for (status, answer), words in zip(answers, wanted):
        assert status == 413 and words in answer["error"], (status, answer)
    assert ok[0] == 200 and ok[1] == {"scores": [0.0]}, ok


def test_healthz_answers_while_a_large_body_is_parsed():
    bag = list(range(10)) * 200  # 2,000 ids per bag, 1 M ids and about 3.5 MB in all
    body = json.dumps({"samples": [{"dense": [1.0, 2.0], "sparse": {"a": bag, "b": [0] * 2000}}] * 250}).encode()
    config = ServerConfig(port=0, max_request_ids=1 << 21)

    async def go():
        async with running(config) as (url, _, session):
            predict = asyncio.create_task(post_json(session, f"{url}/predict", body))
            start, latencies_s = time.monotonic(), []
            while not predict.done():
                asked = time.monotonic()
                assert (await get_json(session, f"{url}/healthz"))[0] == 200
                latencies_s.append(time.monotonic() - asked)
            return await predict, time.monotonic() - start, latencies_s
    (status, answer), predict_s, latencies_s = asyncio.run(go())
    assert status == 200 and len(answer["scores"]) == 250
    # parsed on the event loop, one /healthz waits for the whole parse (most of the /predict's time)
    assert len(latencies_s) >= 3 and max(latencies_s) < predict_s / 3, (predict_s, sorted(latencies_s)[-3:])


def test_a_stalled_client_is_cut_off_at_the_read_timeout():
    timeout_s = 0.5
    config = ServerConfig(port=0, read_timeout_ms=timeout_s * 1000)

    async def stalled(port: int, data: bytes) -> tuple[bytes, float, float]:
        """Send ``data`` and stop: what came back, when the first byte and the end came (s)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        writer.write(data)
        await writer.drain()
        first = await asyncio.wait_for(reader.read(1), 10)
        first_s = time.monotonic() - start
        rest = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return first + rest, first_s, time.monotonic() - start

    async def go():
        async with running(config) as (url, port, session):
            head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            headers = asyncio.create_task(stalled(port, head))
            body = asyncio.create_task(stalled(port, head + b"Content-Length: 1000\r\n\r\n" + b'{"samples": ['))
            await asyncio.sleep(0.1)
            health = await get_json(session, f"{url}/healthz")  # served meanwhile
            return await headers, await body, health
    (head_got, _, head_end_s), (body_got, body_first_s, body_end_s), health = asyncio.run(go())
    assert health[0] == 200
    assert head_got == b"" and timeout_s * 0.8 < head_end_s < timeout_s + 2, (head_got, head_end_s)
    assert body_got.startswith(b"HTTP/1.1 408") and b"server.read_timeout_ms=500" in body_got, body_got
    assert timeout_s * 0.8 < body_first_s < timeout_s + 2 and body_end_s < 2 * timeout_s + 2, (body_first_s, body_end_s)
